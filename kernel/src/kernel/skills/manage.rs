//! `skill_manage` through the kernel's checks: a process holding
//! `manage_skills` creates skills of its own and edits or deletes those it
//! or a descendant of it saved; an operator edits or deletes any saved
//! skill. A process without `publish_skills` that would leave a skill
//! `global` waits for a person's approval first (skills/publish.rs). Every write is checked by every rule of the Agent Skills format
//! and refused with every problem found; it lands in the store with a new
//! version (`skills history`) and a `skill_changed` event. Skills from the
//! config's directories are never changed here.

use std::path::Path;
use std::time::SystemTime;

use hivekernel_agents::skill::{
    self, MAX_FILE_BYTES, Rewrite, Saved, Severity, SkillAction, SkillChange, SkillVersion,
    SkillVisibility, SkillWrite, Strictness,
};
use hivekernel_agents::syscalls::Checkpoint;
use hivekernel_agents::{Capability, Pid};

use super::SkillsHandle;
use crate::error::{KernelError, Result, shown};
use crate::events::{EventKind, unix_ms};
use crate::kernel::Caller;
use crate::skills::SavedSkill;
use crate::store::{Applied, SkillPut, Write, lineage};

use super::check_name;

/// Most skills one process may have saved at once.
pub(crate) const MAX_SAVED_PER_OWNER: u64 = 100;
/// Longest `reason` kept with a version, in bytes (cut at a character).
const MAX_REASON_BYTES: usize = 500;

impl SkillsHandle<'_> {
    /// Creates, edits or deletes a saved skill for `caller` (see the module
    /// docs). Returns the version written, once committed; the commit, the
    /// kernel's view of the skill and the event land together even when
    /// the caller stops waiting. A refused write changes nothing.
    /// `checkpoint` is the calling turn's, kept with an approval request
    /// the write waits for (see `InboxHandle::ask`).
    pub async fn manage(
        self,
        caller: Caller,
        write: SkillWrite,
        checkpoint: Checkpoint<'_>,
    ) -> Result<SkillVersion> {
        let result = async {
            self.kernel
                .require(caller, Capability::ManageSkills, "manage skills")?;
            self.manage_checked(caller, write, checkpoint).await
        };
        self.kernel
            .report_denial(caller, "skill_manage", result.await)
    }

    async fn manage_checked(
        self,
        caller: Caller,
        write: SkillWrite,
        checkpoint: Checkpoint<'_>,
    ) -> Result<SkillVersion> {
        let SkillWrite {
            name,
            owner,
            change,
            reason,
        } = write;
        check_name(&name)?;
        self.kernel.durable_store("saved skills")?;
        let reason = reason.map(|r| hivekernel_agents::text::cut(r, MAX_REASON_BYTES));
        let (me, my_name, line) = self.who_changes(caller)?;
        // The skill changed (none for a create), the action, the new text
        // (none for a delete) and the visibility from this version on.
        let (held, action, content, visibility) = match change {
            SkillChange::Create {
                content,
                visibility,
            } => {
                if !matches!(caller, Caller::Process(_)) {
                    return Err(KernelError::PermissionDenied(
                        "an operator's skills live in the config's skills directories; \
                         skill_manage creates skills for processes"
                            .to_owned(),
                    ));
                }
                self.refuse_config_name(&name)?;
                // One the caller could change already holds the name (its
                // own, or a descendant's it sees): edit that instead. A
                // skill it only sees (an ancestor's, a global one) it may
                // override with its own, which is nearer.
                if let Some(seen) = self
                    .kernel
                    .inner
                    .skills()
                    .saved()
                    .read()
                    .find(&name, me, &line)
                    && seen.changeable_by(me)
                {
                    let saved = seen.saved();
                    return Err(KernelError::InvalidArgument(format!(
                        "a skill {name:?} already exists (saved by process {} ({}), version {}); \
                         edit it, or pick another name",
                        saved.owner, saved.owner_name, saved.version
                    )));
                }
                (None, SkillAction::Create, Some(content), visibility)
            }
            SkillChange::Edit {
                rewrite,
                visibility,
            } => {
                let held = self.changeable(caller, owner, &name, me, &line)?;
                let content = match rewrite {
                    Rewrite::Keep => held.content.to_string(),
                    Rewrite::Whole(content) => content,
                    Rewrite::Replace { old, new } => replaced(&name, &held.content, &old, &new)?,
                };
                let visibility = visibility.unwrap_or(held.saved().visibility);
                (Some(held), SkillAction::Edit, Some(content), visibility)
            }
            SkillChange::Delete => {
                let held = self.changeable(caller, owner, &name, me, &line)?;
                let visibility = held.saved().visibility;
                (Some(held), SkillAction::Delete, None, visibility)
            }
        };
        let skill = content.as_deref().map(|c| checked(&name, c)).transpose()?;
        if let (Caller::Process(pid), Some(content)) = (caller, content.as_deref())
            && visibility == SkillVisibility::Global
        {
            self.approve_publish(pid, &name, action, content, checkpoint)
                .await?;
        }
        let (owner, owner_name, lineage, base) = match &held {
            Some(held) => {
                let saved = held.saved();
                let (owner, owner_name) = (saved.owner, saved.owner_name.clone());
                (owner, owner_name, held.lineage.clone(), Some(saved.version))
            }
            None => (me, my_name.clone(), lineage(&line), None),
        };
        let put = SkillPut {
            owner,
            owner_name,
            quota: self.kernel.storage_quota(&lineage),
            lineage,
            name,
            visibility,
            action,
            content,
            by: me,
            by_name: my_name,
            reason,
            at_ms: unix_ms(SystemTime::now()),
            base,
            max_per_owner: MAX_SAVED_PER_OWNER,
        };
        // Owned by the kernel's tracker, so a caller that stops waiting (a
        // client gone, a process killed mid-call) cannot leave a committed
        // change out of the kernel's view or without its event.
        let kernel = self.kernel.clone();
        let landed = self
            .kernel
            .inner
            .tracker()
            .spawn(async move { kernel.skills().land(caller, me, put, skill).await });
        landed.await.map_err(|err| {
            if err.is_cancelled() {
                KernelError::ShuttingDown
            } else {
                KernelError::FailedPrecondition(format!("the skill change did not finish: {err}"))
            }
        })?
    }

    /// Commits `put`, then puts what it wrote in the kernel's view (`skill`,
    /// the parsed new text; `None` for a delete) and emits the event.
    async fn land(
        self,
        caller: Caller,
        me: Pid,
        put: SkillPut,
        skill: Option<hivekernel_agents::Skill>,
    ) -> Result<SkillVersion> {
        let store = self.kernel.durable_store("saved skills")?;
        let version = match store
            .commit_applied(Write::Skill(Box::new(put.clone())))
            .await?
        {
            Applied::Stored { id, .. } => id,
            Applied::Refused(why) => return Err(KernelError::FailedPrecondition(why)),
            Applied::Done | Applied::Absent => {
                // An in-memory store writes nothing; `durable_store` keeps
                // that from reaching here.
                return Err(KernelError::NoStore("saved skills"));
            }
        };
        {
            let mut saved = self.kernel.inner.skills().saved().write();
            match skill {
                Some(skill) => saved.put(SavedSkill::new(
                    skill,
                    put.content.as_deref().unwrap_or_default().into(),
                    Saved {
                        owner: put.owner,
                        owner_name: put.owner_name.clone(),
                        visibility: put.visibility,
                        version,
                        updated_at_unix_ms: put.at_ms,
                    },
                    put.lineage.clone(),
                )),
                None => saved.remove(&put.name, put.owner, version),
            }
        }
        self.kernel.inner.events().emit(
            me,
            EventKind::SkillChanged {
                name: put.name.clone(),
                action: put.action.to_string(),
                version,
                owner: put.owner,
                visibility: put.visibility.to_string(),
                by: caller.who(),
                reason: put.reason.clone(),
            },
        );
        tracing::info!(skill = %put.name, owner = %put.owner, version, by = %caller.who(), "skill {}", put.action);
        Ok(SkillVersion {
            name: put.name,
            owner: put.owner,
            owner_name: put.owner_name,
            version,
            action: put.action,
            by: put.by,
            by_name: put.by_name,
            visibility: put.visibility,
            at_unix_ms: put.at_ms,
            reason: put.reason,
            content: None,
        })
    }

    /// The kept versions of saved skill `name` (only `owner`'s when given),
    /// oldest first, with their text when `content`. Operators only.
    pub async fn history(
        self,
        caller: Caller,
        name: &str,
        owner: Option<Pid>,
        content: bool,
    ) -> Result<Vec<SkillVersion>> {
        if !caller.sees_all() {
            return Err(KernelError::PermissionDenied(
                "only an operator may read a skill's history".to_owned(),
            ));
        }
        check_name(name)?;
        let store = self.kernel.durable_store("saved skills")?;
        let versions = store.skill_history(name.to_owned(), owner, content).await?;
        if versions.is_empty() {
            if let Some(entry) = self.kernel.inner.skills().config_skill(name) {
                return Err(KernelError::NoSuchSkill(format!(
                    "skill {name:?} comes from the config ({}) and has no history here; \
                     only skills saved with skill_manage are versioned",
                    entry.source
                )));
            }
            return Err(KernelError::NoSuchSkill(format!(
                "no process saved a skill called {}{}",
                shown(name),
                owner
                    .map(|o| format!(" as process {o}"))
                    .unwrap_or_default()
            )));
        }
        Ok(versions)
    }

    /// Who is making a change: the process, or PID 1 for an operator; its
    /// name and its line from PID 1.
    fn who_changes(self, caller: Caller) -> Result<(Pid, String, Vec<Pid>)> {
        let me = caller.pid();
        if me == Pid::KERNEL {
            return Ok((me, caller.who(), vec![me]));
        }
        let table = self.kernel.inner.table().read();
        let entry = table.get(me).ok_or(KernelError::NotFound(me))?;
        let line = table.lineage(me).ok_or(KernelError::NotFound(me))?;
        Ok((me, entry.proc.ctx.name.to_string(), line))
    }

    /// Refuses a new saved skill named like a config skill: the config's
    /// would hide it wherever both are seen.
    fn refuse_config_name(self, name: &str) -> Result<()> {
        match self.kernel.inner.skills().config_skill(name) {
            Some(entry) => Err(KernelError::InvalidArgument(format!(
                "skill {name:?} comes from the config ({}); a saved skill of that name would be \
                 hidden by it, so pick another name",
                entry.source
            ))),
            None => Ok(()),
        }
    }

    /// The saved skill `name` that `caller` changes (see
    /// [`SavedSkills::changeable`](crate::skills::SavedSkills::changeable)),
    /// or why there is none: a config skill is never changed; a skill the
    /// caller sees but may not change names its owner; one it neither sees
    /// nor may change does not exist for it.
    fn changeable(
        self,
        caller: Caller,
        owner: Option<Pid>,
        name: &str,
        me: Pid,
        line: &[Pid],
    ) -> Result<SavedSkill> {
        // What the caller sees of the name, when it may change none of them.
        let seen = {
            let saved = self.kernel.inner.skills().saved().read();
            match saved.changeable(name, owner, me, line) {
                Ok(Some(held)) => return Ok(held.clone()),
                Ok(None) => saved.find(name, me, line).map(|s| s.saved().clone()),
                Err(owners) => {
                    let owners: Vec<String> = owners.iter().map(ToString::to_string).collect();
                    return Err(KernelError::InvalidArgument(format!(
                        "processes {} each saved a skill {name:?} you may change; name the one \
                         you mean with `owner`",
                        owners.join(", ")
                    )));
                }
            }
        };
        if let Some(saved) = seen {
            return Err(KernelError::PermissionDenied(format!(
                "skill {name:?} belongs to process {} ({}); only it, its ancestors and the \
                 operator may change it",
                saved.owner, saved.owner_name
            )));
        }
        if owner.is_none()
            && let Some(entry) = self.kernel.inner.skills().config_skill(name)
        {
            return Err(KernelError::PermissionDenied(format!(
                "skill {name:?} comes from the config ({}); only skills saved with \
                 skill_manage may be changed",
                entry.source
            )));
        }
        let whose = owner
            .map(|o| format!(" of process {o}"))
            .unwrap_or_default();
        Err(KernelError::NoSuchSkill(match caller {
            Caller::Process(pid) => format!(
                "process {pid} may change no saved skill called {}{whose}",
                shown(name)
            ),
            _ => format!("no saved skill is called {}{whose}", shown(name)),
        }))
    }
}

/// `content` with its one `old` replaced by `new`.
fn replaced(name: &str, content: &str, old: &str, new: &str) -> Result<String> {
    if old.is_empty() {
        return Err(KernelError::InvalidArgument(format!(
            "edit of skill {name:?}: `old` is empty; give text of its SKILL.md to replace"
        )));
    }
    match content.matches(old).count() {
        1 => Ok(content.replacen(old, new, 1)),
        0 => Err(KernelError::InvalidArgument(format!(
            "edit of skill {name:?}: `old` does not occur in its SKILL.md; view it and copy \
             the text exactly"
        ))),
        n => Err(KernelError::InvalidArgument(format!(
            "edit of skill {name:?}: `old` occurs {n} times in its SKILL.md; give a longer \
             piece that occurs once"
        ))),
    }
}

/// `content` as the `SKILL.md` of a skill called `name`, checked by every
/// rule of the format; refused with every error found.
fn checked(name: &str, content: &str) -> Result<hivekernel_agents::Skill> {
    if content.len() as u64 > MAX_FILE_BYTES {
        return Err(KernelError::InvalidArgument(format!(
            "skill {name:?}: content is {} bytes, more than the {MAX_FILE_BYTES} a SKILL.md may have",
            content.len()
        )));
    }
    let read = skill::parse(Path::new(name), content, Strictness::Strict);
    // The format allows any lowercase letter; a saved skill's name is
    // ASCII, so no look-alike of another skill's name joins a catalogue.
    let ascii = (!name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'))
    .then(|| "- name: a saved skill's name is ASCII: a-z, 0-9 and hyphens".to_owned());
    let errors: Vec<String> = ascii
        .into_iter()
        .chain(
            read.findings
                .iter()
                .filter(|f| f.severity == Severity::Error)
                .map(|f| match &f.field {
                    Some(field) => format!("- {field}: {}", f.message),
                    None => format!("- {}", f.message),
                }),
        )
        .collect();
    match read.skill {
        Some(skill) if errors.is_empty() => Ok(skill),
        _ => Err(KernelError::InvalidArgument(format!(
            "skill {name:?} is not saved; its SKILL.md breaks the Agent Skills format:\n{}",
            if errors.is_empty() {
                "- it cannot be read as a skill".to_owned()
            } else {
                errors.join("\n")
            }
        ))),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_write_is_checked_strictly_with_every_problem_named() {
        let good = "---\nname: deploy\ndescription: Deploy the service.\n---\nSteps.\n";
        assert!(checked("deploy", good).is_ok());
        let bad = format!(
            "---\nname: Deploy_It\ndescription: {}\ncolour: red\n---\nSteps.\n",
            "x".repeat(1025)
        );
        let err = checked("deploy", &bad).unwrap_err().to_string();
        for says in ["name", "description", "colour"] {
            assert!(err.contains(says), "{says} missing from {err}");
        }
        assert!(err.lines().count() >= 4, "{err}");
        let huge = format!("{good}{}", "y".repeat(MAX_FILE_BYTES as usize));
        assert!(
            checked("deploy", &huge)
                .unwrap_err()
                .to_string()
                .contains("bytes")
        );
    }

    #[test]
    fn a_patch_replaces_exactly_one_occurrence() {
        assert_eq!(replaced("s", "a b c", "b", "B").unwrap(), "a B c");
        assert!(
            replaced("s", "a b b", "b", "B")
                .unwrap_err()
                .to_string()
                .contains("2 times")
        );
        assert!(
            replaced("s", "a", "z", "B")
                .unwrap_err()
                .to_string()
                .contains("does not occur")
        );
        assert!(replaced("s", "a", "", "B").is_err());
    }
}
