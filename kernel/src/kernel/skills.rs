//! Skills through the kernel's checks: a process sees the kernel's skill
//! directories and its own and its ancestors' (a config agent's `skills`),
//! narrowed to what its tool list selects (`skills`, or `skill:<name>`
//! entries); an operator sees every loaded skill. The library itself is
//! the `skills` subsystem's (crate::skills).

use hivekernel_agents::skill::{Catalogue, SkillSelector};
use hivekernel_agents::{Pid, SkillEntry};

use crate::error::{KernelError, Result};
use crate::kernel::{Caller, Kernel};
use crate::reload::{Change, Outcome};
use crate::skills::{Listed, Problem, Sources};

mod manage;
mod publish;

/// Skills through the kernel ([`Kernel::skills`]): what a caller sees, one
/// skill, its history, and the writes of `skill_manage`.
#[derive(Debug, Clone, Copy)]
pub struct SkillsHandle<'k> {
    kernel: &'k Kernel,
}

impl Kernel {
    /// The kernel's skills.
    pub fn skills(&self) -> SkillsHandle<'_> {
        SkillsHandle { kernel: self }
    }
}

impl SkillsHandle<'_> {
    /// The skills `caller` may use, sorted by name: for a process, what it
    /// sees and its tool list selects; for an operator, what a process
    /// with `skills` and no directories of its own would see.
    pub fn for_caller(self, caller: Caller) -> Result<Catalogue> {
        let Caller::Process(pid) = caller else {
            return Ok(self.kernel.inner.skills().catalogue(None));
        };
        let (dirs, tools, line) = {
            let table = self.kernel.inner.table().read();
            let entry = table.get(pid).ok_or(KernelError::NotFound(pid))?;
            let line = table.lineage(pid).unwrap_or_else(|| vec![pid]);
            (
                entry.proc.skill_dirs.clone(),
                entry.proc.ctx.tools.clone(),
                line,
            )
        };
        let selectors: Vec<SkillSelector> = tools
            .iter()
            .filter_map(|entry| SkillSelector::parse(entry)?.ok())
            .collect();
        if selectors.is_empty() {
            return Ok(std::sync::Arc::from([]));
        }
        let seen = self
            .kernel
            .inner
            .skills()
            .seen_by(dirs.as_ref(), pid, &line);
        if selectors.contains(&SkillSelector::All) {
            return Ok(seen);
        }
        Ok(seen
            .iter()
            .filter(|entry| selectors.iter().any(|s| s.selects(&entry.skill.name)))
            .cloned()
            .collect())
    }

    /// Every loaded skill (shadowed ones too, marked), and what was wrong
    /// with the skills directories when they were loaded. Operators only.
    pub fn listing(self, caller: Caller) -> Result<(Vec<Listed>, Vec<Problem>)> {
        self.require_operator(caller, "list every skill")?;
        Ok(self.kernel.inner.skills().listing())
    }

    /// Skill `name` as `caller` would use it: for a process, the one it
    /// sees; for an operator, `owner`'s saved skill when `owner` is given,
    /// else the config skill no other shadows (the kernel directories'
    /// winner, or when only agents' directories hold it, the first of them
    /// in config order), else the newest saved one.
    pub fn get(self, caller: Caller, name: &str, owner: Option<Pid>) -> Result<SkillEntry> {
        check_name(name)?;
        if let Caller::Process(_) = caller {
            let seen = self.for_caller(caller)?;
            return seen
                .iter()
                .find(|entry| entry.skill.name == name)
                .cloned()
                .ok_or_else(|| unknown_skill(name, caller.pid()));
        }
        let skills = self.kernel.inner.skills();
        let config = owner.is_none().then(|| skills.config_skill(name)).flatten();
        if let Some(entry) = config {
            return Ok(entry);
        }
        let saved = skills.saved().read();
        saved
            .named(name)
            .filter(|s| owner.is_none_or(|o| s.saved().owner == o))
            .max_by_key(|s| s.saved().updated_at_unix_ms)
            .map(|s| s.entry.clone())
            .ok_or_else(|| unknown_skill(name, Pid::KERNEL))
    }

    /// Loads the skills directories again (a config reload), off the async
    /// threads; reports the count and each problem.
    pub(crate) async fn reload(self, sources: Sources) -> Change {
        let loaded =
            tokio::task::spawn_blocking(move || crate::skills::Loaded::read(sources)).await;
        let loaded = match loaded {
            Ok(loaded) => loaded,
            Err(err) => {
                return Change::new("skills", None, Outcome::Failed)
                    .detail(format!("the skills directories were not read: {err}"));
            }
        };
        let (count, problems) = self.kernel.inner.skills().replace(loaded);
        let skipped = problems.iter().filter(|p| p.skipped).count();
        let mut change = Change::new("skills", None, Outcome::Updated);
        change = change.detail(format!(
            "{count} loaded, {skipped} skipped, {} warnings",
            problems.len() - skipped
        ));
        change
    }

    fn require_operator(self, caller: Caller, action: &str) -> Result<()> {
        if caller.sees_all() {
            return Ok(());
        }
        Err(KernelError::PermissionDenied(format!(
            "only an operator may {action}; a process sees the skills its tool list selects"
        )))
    }
}

/// Refuses a name that cannot address a skill, naming what is wrong.
fn check_name(name: &str) -> Result<()> {
    match hivekernel_agents::skill::name_problem(name) {
        Some(why) => Err(KernelError::InvalidArgument(format!(
            "skill name {}: {why}",
            crate::error::shown(name)
        ))),
        None => Ok(()),
    }
}

fn unknown_skill(name: &str, pid: Pid) -> KernelError {
    let whose = if pid == Pid::KERNEL {
        "no loaded skill".to_owned()
    } else {
        format!("no skill process {pid} may see")
    };
    KernelError::NoSuchSkill(format!("{whose} is named {}", crate::error::shown(name)))
}
