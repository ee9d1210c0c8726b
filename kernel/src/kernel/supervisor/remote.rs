//! Supervision across nodes (docs/CLUSTER.md, "Subtrees across nodes"): a
//! child's restart policy runs on its own node; its parent's strategy and
//! a failure past its restart intensity reach the nodes holding its parent
//! and its siblings.

use std::time::Duration;

use hivekernel_agents::Pid;

use super::{EXIT_FAILED, Stop, strategy};
use crate::cluster::rpc::Op;
use crate::error::{KernelError, Result};
use crate::kernel::cluster::FORWARDED_KILL;
use crate::kernel::{Caller, Kernel};

/// What another node does about an exit here.
#[derive(Debug)]
pub(crate) enum Elsewhere {
    /// Child `failed`, here, stopped to restart after `delay`: its parent's
    /// node stops the siblings its strategy takes down with it.
    Siblings {
        parent: Pid,
        failed: Pid,
        delay: Duration,
    },
    /// A sibling on another node that a child's restart here takes down:
    /// it restarts there (or, temporary, ends).
    Sibling { pid: Pid, reason: String },
    /// A child here passed its restart intensity: its parent on another
    /// node fails.
    Fail { parent: Pid, reason: String },
}

impl Kernel {
    /// Asks the nodes concerned to do what `elsewhere` says, each once;
    /// what a node cannot be reached for is logged (a node lost meanwhile
    /// has its processes restarted by the loss).
    pub(super) async fn supervise_elsewhere(&self, elsewhere: Vec<Elsewhere>) {
        let asks = elsewhere.into_iter().map(|what| async move {
            let (pid, op) = match what {
                Elsewhere::Siblings {
                    parent,
                    failed,
                    delay,
                } => (
                    parent,
                    Op::Siblings {
                        parent,
                        failed,
                        delay_ms: u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    },
                ),
                Elsewhere::Sibling { pid, reason } => (
                    pid,
                    Op::Restart {
                        pid,
                        reason,
                        sibling: true,
                    },
                ),
                Elsewhere::Fail { parent, reason } => (parent, Op::Fail { pid: parent, reason }),
            };
            let Some(node) = self.held_elsewhere(pid) else {
                return;
            };
            if let Err(err) = self.forward::<()>(&node, op, FORWARDED_KILL).await {
                tracing::warn!(%pid, %node, error = %err, "cluster: supervision across nodes not done");
            }
        });
        futures::future::join_all(asks).await;
    }

    /// On the node holding `parent`: its child `failed`, on another node,
    /// stopped to restart after `delay`; the siblings here that its
    /// strategy takes down stop and restart with it after that delay (and
    /// those on other nodes restart there).
    pub(in crate::kernel) async fn siblings_failed(
        &self,
        parent: Pid,
        failed: Pid,
        delay: Duration,
    ) -> Result<()> {
        let mut exits = self.exits(Stop::Abort);
        {
            let mut table = self.inner.table().write();
            let entry = table.get(parent).ok_or(KernelError::NotFound(parent))?;
            if !entry.is_alive() || entry.is_restarting() {
                return Ok(());
            }
            let group = self.next_id();
            let pids = strategy::stop_siblings(&mut table, parent, failed, group, &mut exits);
            if !pids.is_empty() {
                exits.follow.restart(group, pids, delay);
            }
        }
        self.finish_exits(exits).await;
        Ok(())
    }

    /// On the node holding `pid`: its sibling on another node restarts,
    /// and its parent's strategy takes it down too. It restarts at once
    /// when its policy restarts after a failure; a temporary one ends.
    pub(in crate::kernel) async fn restart_sibling(&self, pid: Pid, reason: &str) -> Result<()> {
        let restarts = {
            let table = self.inner.table().read();
            let entry = table.get(pid).ok_or(KernelError::NotFound(pid))?;
            if !entry.is_alive() || entry.is_restarting() {
                return Ok(());
            }
            entry.restart_spec().policy.restarts_after(true)
        };
        if restarts {
            self.restart_checked(Caller::Admin, pid, reason).await?;
        } else {
            self.kill_checked(Caller::Admin, pid, reason).await?;
        }
        Ok(())
    }

    /// On the node holding `pid`: a child of it on another node passed its
    /// restart intensity, so `pid` fails, and its own restart policy
    /// applies.
    pub(in crate::kernel) async fn fail_here(&self, pid: Pid, reason: String) -> Result<()> {
        let mut exits = self.exits(Stop::Abort);
        {
            let mut table = self.inner.table().write();
            let entry = table.get(pid).ok_or(KernelError::NotFound(pid))?;
            if !entry.is_alive() || entry.is_restarting() {
                return Ok(());
            }
            self.end_supervised(&mut table, pid, EXIT_FAILED, reason, &mut exits);
        }
        self.finish_exits(exits).await;
        Ok(())
    }
}
