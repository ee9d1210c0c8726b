//! The kernel's part of a config reload: stopping a config agent that left
//! the config, and spawning one again with a new spec as the same PID. The
//! daemon decides what changed (daemon/reload.rs); new agents start as at
//! start, with [`Kernel::spawn_declared`]; cron entries follow in
//! kernel/cron/schedule.rs.

use std::time::Duration;

use std::collections::HashMap;

use hivekernel_agents::{LlmUsage, Pid, Role, SpawnRequest};

use crate::config::RoleSettings;
use crate::error::{KernelError, Result};
use crate::kernel::spawn::Birth;
use crate::kernel::{Caller, Kernel};
use crate::reload::{Change, Outcome};
use crate::store::Write;

/// How long a stopped config agent's exit record is waited for.
const COLLECT_WITHIN: Duration = Duration::from_secs(5);

/// What a config agent had used when it was stopped, carried to its next incarnation.
#[derive(Debug, Default)]
struct Carried {
    own: LlmUsage,
    subtree: LlmUsage,
    /// What its own budget had spent, when it had one.
    budget_spent: Option<u64>,
}

impl Kernel {
    /// Replaces the `roles` section: processes spawned from now on (config
    /// agents a reload restarts included) get the new defaults and
    /// capabilities; running ones keep what they were spawned with. Reports
    /// each role either section lists, in the order of [`Role::ALL`].
    pub(crate) fn reload_roles(&self, new: HashMap<Role, RoleSettings>) -> Vec<Change> {
        let old = self.inner.roles();
        let changes = Role::ALL
            .iter()
            .filter_map(|role| {
                let change = |outcome| Change::new(role.as_str(), None, outcome);
                Some(match (old.get(role), new.get(role)) {
                    (None, None) => return None,
                    (None, Some(_)) => change(Outcome::Added),
                    (Some(_), None) => change(Outcome::Removed),
                    (Some(was), Some(now)) if was == now => change(Outcome::Unchanged),
                    (Some(was), Some(now)) => {
                        let fields = [
                            ("restart", was.restart != now.restart),
                            ("strategy", was.strategy != now.strategy),
                            ("capabilities", was.capabilities != now.capabilities),
                        ];
                        let changed: Vec<&str> = fields
                            .iter()
                            .filter(|(_, differs)| *differs)
                            .map(|(field, _)| *field)
                            .collect();
                        change(Outcome::Updated).detail(format!("changed: {}", changed.join(", ")))
                    }
                })
            })
            .collect();
        self.inner.set_roles(new);
        changes
    }

    /// Kills config agent `pid` with its subtree and collects it, so its
    /// PID is free. One that has already exited is collected; one that is
    /// gone already is fine.
    pub(crate) async fn stop_declared(&self, pid: Pid, reason: &str) -> Result<()> {
        match self.kill(Caller::Admin, pid, reason).await {
            Ok(_) | Err(KernelError::FailedPrecondition(_)) => {}
            Err(KernelError::NotFound(_)) => return Ok(()),
            Err(err) => return Err(err),
        }
        match self
            .wait_child(Caller::Admin, pid, Some(COLLECT_WITHIN))
            .await
        {
            Ok(_) | Err(KernelError::NotFound(_)) => Ok(()),
            Err(err) => Err(err),
        }
    }

    /// Replaces config agent `pid`, spawned from `old`, by one spawned from
    /// `new` as the same PID, carrying its model usage and what its budget
    /// spent (so a reload never hands out tokens twice). When `new` is
    /// refused, `old` is spawned again as that PID, and the refusal is the
    /// error. Either way the process's subtree is gone.
    pub(crate) async fn respawn_declared(
        &self,
        pid: Pid,
        old: SpawnRequest,
        new: SpawnRequest,
    ) -> std::result::Result<(), String> {
        let carried = self.carried(pid);
        self.stop_declared(pid, "config reload: its spec changed")
            .await
            .map_err(|err| format!("could not be stopped: {err}"))?;
        let name = new.name.clone();
        let refused = match self
            .spawn_as(Caller::Admin, new, Birth::Replaced(pid))
            .await
        {
            Ok(_) => None,
            Err(err) => {
                let again = self
                    .spawn_as(Caller::Admin, old, Birth::Replaced(pid))
                    .await;
                Some(match again {
                    Ok(_) => {
                        format!("new spec refused: {err}; running again with the previous one")
                    }
                    Err(again) => format!(
                        "new spec refused: {err}; the previous one was refused too ({again}): \
                         the agent is stopped"
                    ),
                })
            }
        };
        if self.inner.table().read().get(pid).is_some() {
            self.carry(pid, &carried);
            if let Err(err) = self
                .inner
                .store()
                .commit(Write::Declared { name, pid })
                .await
            {
                tracing::error!(%pid, error = %err, "store: config agent's PID not recorded");
            }
        }
        refused.map_or(Ok(()), Err)
    }

    /// What live process `pid` has used, to carry over to its next incarnation.
    fn carried(&self, pid: Pid) -> Carried {
        let Some(proc) = self.inner.table().read().get(pid).map(|e| e.proc.clone()) else {
            return Carried::default();
        };
        Carried {
            own: proc.usage.snapshot(),
            subtree: proc.usage.subtree(),
            budget_spent: proc
                .budget
                .as_ref()
                .filter(|pool| pool.owner() == pid)
                .map(|pool| pool.spent()),
        }
    }

    /// Adds what an earlier incarnation of `pid` used to what it counts now.
    fn carry(&self, pid: Pid, carried: &Carried) {
        let Some(proc) = self.inner.table().read().get(pid).map(|e| e.proc.clone()) else {
            return;
        };
        proc.usage.add_kept(carried.own, carried.subtree);
        if let Some(pool) = &proc.budget
            && pool.owner() == pid
            && let Some(spent) = carried.budget_spent
        {
            pool.charge(spent);
        }
    }
}
