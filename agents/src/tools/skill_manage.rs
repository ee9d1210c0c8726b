//! `skill_manage`: create, edit and delete the caller's skills in the
//! kernel's store (the `manage_skills` capability). A write is checked by
//! every rule of the Agent Skills format and refused with every problem
//! found; only skills processes saved may be changed, never the config's.

use async_trait::async_trait;
use serde_json::{Value, json};

use super::args::invalid;
use super::{Tool, ToolContext, ToolError, decode, refused};
use crate::capability::Capability;
use crate::skill::{SkillAction, SkillRequest, SkillVisibility};

/// The `skill_manage` tool.
#[derive(Debug, Clone, Copy, Default)]
pub struct SkillManage;

#[async_trait]
impl Tool for SkillManage {
    fn name(&self) -> &'static str {
        "skill_manage"
    }

    fn description(&self) -> &'static str {
        "Save a procedure as a skill (a SKILL.md: YAML frontmatter with name and description, then \
         Markdown steps), or edit or delete one you saved. Checked against the Agent Skills format; \
         a refusal lists every problem. Skills from the config cannot be changed. A global skill \
         (seen by every agent) may wait for a person's approval."
    }

    fn capability(&self) -> Option<Capability> {
        Some(Capability::ManageSkills)
    }

    fn parameters(&self) -> Value {
        let visibilities: Vec<&str> = SkillVisibility::ALL.iter().map(|v| v.as_str()).collect();
        let actions: Vec<&str> = SkillAction::ALL.iter().map(|a| a.as_str()).collect();
        json!({
            "type": "object",
            "properties": {
                "action": { "type": "string", "enum": actions },
                "name": {
                    "type": "string",
                    "description": "The skill's name: 1-64 of a-z, 0-9 and single hyphens, as in its frontmatter."
                },
                "owner": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "edit or delete: the PID whose skill it is, when you and a descendant of yours both saved one of this name."
                },
                "content": {
                    "type": "string",
                    "description": "create, or edit replacing it whole: the SKILL.md, starting with ---\\nname: ...\\ndescription: ...\\n---"
                },
                "old": { "type": "string", "description": "edit: text that occurs exactly once in the SKILL.md" },
                "new": { "type": "string", "description": "edit: what replaces `old`" },
                "visibility": {
                    "type": "string",
                    "enum": visibilities,
                    "description": "Who sees it: private (you), subtree (you, your ancestors and descendants; default), global (every agent)."
                },
                "reason": { "type": "string", "description": "Why, kept in the skill's history." }
            },
            "required": ["action", "name"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let request: SkillRequest = decode(self, args)?;
        let write = request.into_write().map_err(|why| invalid(self, why))?;
        let version = ctx
            .process
            .syscalls
            .manage_skill(write, ctx.checkpoint)
            .await
            .map_err(refused)?;
        Ok(match version.action {
            SkillAction::Delete => format!(
                "deleted skill {} (version {} in its history)",
                version.name, version.version
            ),
            action => format!(
                "{} skill {}: version {}, visible to {}",
                match action {
                    SkillAction::Create => "created",
                    _ => "edited",
                },
                version.name,
                version.version,
                match version.visibility {
                    SkillVisibility::Private => "you only",
                    SkillVisibility::Subtree => "you, your ancestors and your descendants",
                    SkillVisibility::Global => "every agent",
                }
            ),
        })
    }
}
