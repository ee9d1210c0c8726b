//! Publishing a skill: a `global` skill is seen by every agent with the
//! `skills` tool, its description in their system prompts. A process that
//! does not hold `publish_skills` (no role has it unless the config grants
//! it) may still create one, or edit one that stays `global`, but the
//! write waits in the inbox for a person's approval (or an ancestor's
//! holding `approve_requests`), as an approval of its `skill_manage` call
//! with the whole new text to read; nobody answering within ten minutes is
//! a refusal. Deleting, or narrowing a skill to `subtree` or `private`,
//! never waits.

use std::time::Duration;

use hivekernel_agents::skill::SkillAction;
use hivekernel_agents::syscalls::Checkpoint;
use hivekernel_agents::text::cut_str;
use hivekernel_agents::{Capability, OnTimeout, Pid};

use super::SkillsHandle;
use crate::error::{KernelError, Result, shown};
use crate::inbox::{Ask, Decision};
use crate::kernel::{Caller, MAX_SHOWN_ARGUMENTS};

/// How long a write that publishes a skill waits for a person.
pub(crate) const PUBLISH_TIMEOUT: Duration = Duration::from_secs(600);

impl SkillsHandle<'_> {
    /// Returns once `pid` may leave skill `name` `global` with `content`
    /// (its `action`): at once when it holds `publish_skills`, else once a
    /// person approves; a denial or the timeout is PERMISSION_DENIED,
    /// saying so.
    pub(super) async fn approve_publish(
        self,
        pid: Pid,
        name: &str,
        action: SkillAction,
        content: &str,
        checkpoint: Checkpoint<'_>,
    ) -> Result<()> {
        let caller = Caller::Process(pid);
        if self
            .kernel
            .require(caller, Capability::PublishSkills, "publish skills")
            .is_ok()
        {
            return Ok(());
        }
        let arguments = serde_json::json!({
            "action": action.as_str(),
            "name": name,
            "visibility": "global",
            "content": content,
        });
        let ask = Ask::Approval {
            tool: "skill_manage".to_owned(),
            arguments: cut_str(&arguments.to_string(), MAX_SHOWN_ARGUMENTS),
        };
        tracing::info!(%pid, skill = %name, "a global skill waits for a person's approval");
        let resolution = self
            .kernel
            .inbox()
            .ask(
                pid,
                ask,
                PUBLISH_TIMEOUT,
                OnTimeout::Deny,
                checkpoint.map(|turn| turn()),
            )
            .await?;
        let name = shown(name);
        let refused = |why: String| Err(KernelError::PermissionDenied(why));
        match resolution.decision {
            Decision::Approved { .. } => Ok(()),
            Decision::Denied { reason } if reason.is_empty() => refused(format!(
                "publishing skill {name} to every agent was denied by {}; it is not saved",
                resolution.by
            )),
            Decision::Denied { reason } => refused(format!(
                "publishing skill {name} to every agent was denied by {}: {reason}; it is not \
                 saved",
                resolution.by
            )),
            Decision::TimedOut => refused(format!(
                "a global skill is seen by every agent, so saving {name} needs a person's \
                 approval (or the publish_skills capability), and nobody gave it within {} \
                 seconds; it is not saved (save it as subtree instead)",
                PUBLISH_TIMEOUT.as_secs()
            )),
            Decision::Answered { .. } | Decision::Withdrawn => refused(format!(
                "publishing skill {name} to every agent was not approved; it is not saved"
            )),
        }
    }
}
