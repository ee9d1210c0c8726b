//! The kernel's part of a config reload: stopping a config agent that left
//! the config, and spawning one again with a new spec as the same PID. The
//! daemon decides what changed (daemon/reload.rs); new agents start as at
//! start, with [`Kernel::spawn_declared`]; cron entries follow in
//! kernel/cron/schedule.rs.

use std::time::Duration;

use std::collections::HashMap;

use hivekernel_agents::{Pid, Role, SpawnRequest};

use crate::budget::Pool;
use crate::config::RoleSettings;
use crate::error::{KernelError, Result};
use crate::kernel::restore::carry_usage;
use crate::kernel::spawn::Birth;
use crate::kernel::{Caller, Kernel};
use crate::reload::{Change, Outcome};
use crate::store::{StoredUsage, Write};

/// How long a stopped config agent's exit record is waited for.
const COLLECT_WITHIN: Duration = Duration::from_secs(5);

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
            if let Some(entry) = self.inner.table().read().get(pid) {
                carry_usage(entry, &carried, None);
            }
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

    /// What live process `pid` has used, to carry over to its next
    /// incarnation as a kernel restart carries what the store kept.
    fn carried(&self, pid: Pid) -> StoredUsage {
        let table = self.inner.table().read();
        let Some(entry) = table.get(pid) else {
            return StoredUsage::default();
        };
        let proc = &entry.proc;
        StoredUsage {
            own: proc.usage.snapshot(),
            subtree: proc.usage.subtree(),
            budget_spent: proc.own_budget().map(Pool::spent),
        }
    }
}
