//! Supervision across nodes (docs/CLUSTER.md, "Subtrees across nodes"): a
//! child's restart policy runs on its own node; its parent's strategy and
//! a failure past its restart intensity reach the nodes holding its parent
//! and its siblings.

use std::time::Duration;

use hivekernel_agents::Pid;

use super::restart::stop_for_restart;
use super::{EXIT_FAILED, EXIT_KILLED, Stop, strategy, terminate};
use crate::cluster::rpc::Op;
use crate::error::{KernelError, Result};
use crate::kernel::cluster::FORWARDED_KILL;
use crate::kernel::cluster::NodeHandle;
use crate::kernel::llm::millis;
use crate::process::Entry;

/// Whether a request about `parent`'s child `child` is about this run of
/// `parent`: `child` is still its child (a restart of `parent` ended its
/// children, and its new run has others). Said in the log when not.
fn same_run(entry: &Entry, parent: Pid, child: Pid) -> bool {
    let current = entry.children.contains(child);
    if !current {
        tracing::info!(%parent, %child, "cluster: a supervision request about an earlier run of a parent came late; ignored");
    }
    current
}

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
    /// it stops there and restarts after `delay` (or, temporary, ends).
    Sibling {
        pid: Pid,
        reason: String,
        delay: Duration,
    },
    /// A child here passed its restart intensity: its parent on another
    /// node fails.
    Fail { parent: Pid, reason: String },
}

impl NodeHandle<'_> {
    /// Asks the nodes concerned to do what `elsewhere` says, each once;
    /// what a node cannot be reached for is logged (a node lost meanwhile
    /// has its processes restarted by the loss).
    pub(super) async fn supervise_elsewhere(self, elsewhere: Vec<Elsewhere>) {
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
                        delay_ms: millis(delay),
                    },
                ),
                Elsewhere::Sibling { pid, reason, delay } => (
                    pid,
                    Op::Restart {
                        pid,
                        reason,
                        sibling: true,
                        delay_ms: millis(delay),
                    },
                ),
                Elsewhere::Fail { parent, reason } => {
                    // The parent's run as this node lists it.
                    let started_ms = self.kernel
                        .inner
                        .cluster()
                        .and_then(|cluster| {
                            let listings = cluster.listings();
                            listings.get(parent).map(|listing| listing.started_unix_ms)
                        })
                        .unwrap_or(0);
                    (
                        parent,
                        Op::Fail {
                            pid: parent,
                            reason,
                            started_ms,
                        },
                    )
                }
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
    /// those on other nodes restart there). Nothing when `failed` is no
    /// longer its child (a request that came after `parent` restarted).
    pub(in crate::kernel) async fn siblings_failed(
        self,
        parent: Pid,
        failed: Pid,
        delay: Duration,
    ) -> Result<()> {
        let mut exits = self.kernel.exits(Stop::Abort);
        {
            let mut table = self.kernel.inner.table().write();
            let entry = table.get(parent).ok_or(KernelError::NotFound(parent))?;
            if !entry.is_alive() || entry.is_restarting() || !same_run(entry, parent, failed) {
                return Ok(());
            }
            let group = self.kernel.next_id();
            let pids =
                strategy::stop_siblings(&mut table, parent, failed, group, delay, &mut exits);
            if !pids.is_empty() {
                exits.follow.restart(group, pids, delay);
            }
        }
        self.kernel.finish_exits(exits).await;
        Ok(())
    }

    /// On the node holding `pid`: its sibling on another node restarts,
    /// and its parent's strategy takes it down too. It stops, and restarts
    /// after the sibling's `delay` when its policy restarts after a
    /// failure, as a sibling on the same node does; a temporary one ends.
    pub(in crate::kernel) async fn restart_sibling(
        self,
        pid: Pid,
        reason: &str,
        delay: Duration,
    ) -> Result<()> {
        self.kernel.check_running()?;
        self.kernel.inner.settings().limits.check_reason(reason)?;
        let mut exits = self.kernel.exits(Stop::Abort);
        {
            let mut table = self.kernel.inner.table().write();
            let entry = table.get_mut(pid).ok_or(KernelError::NotFound(pid))?;
            if !entry.is_alive() {
                return Ok(());
            }
            let group = self.kernel.next_id();
            if entry.is_restarting() {
                // Already down: it now comes back with the failed child.
                entry.wait_in_group(group);
                exits.follow.restart(group, vec![pid], delay);
            } else if entry.restart_spec().policy.restarts_after(true) {
                stop_for_restart(&mut table, pid, EXIT_KILLED, reason, group, &mut exits);
                exits.follow.restart(group, vec![pid], delay);
            } else {
                terminate(&mut table, pid, EXIT_KILLED, reason, &mut exits);
            }
        }
        self.kernel.finish_exits(exits).await;
        Ok(())
    }

    /// On the node holding `pid`: a child of it on another node passed its
    /// restart intensity, so `pid` fails, and its own restart policy
    /// applies. Nothing when `pid` is no longer the run that started at
    /// `started_ms` (0: unknown), as the asking node listed it (a request
    /// that came after `pid` restarted).
    pub(in crate::kernel) async fn fail_here(
        self,
        pid: Pid,
        started_ms: u64,
        reason: String,
    ) -> Result<()> {
        let mut exits = self.kernel.exits(Stop::Abort);
        {
            let mut table = self.kernel.inner.table().write();
            let entry = table.get(pid).ok_or(KernelError::NotFound(pid))?;
            if !entry.is_alive() || entry.is_restarting() {
                return Ok(());
            }
            let run = entry.proc.started_at_unix_ms;
            if started_ms != 0 && started_ms != run {
                tracing::info!(%pid, asked = started_ms, run, "cluster: a child's failure about an earlier run of its parent came late; ignored");
                return Ok(());
            }
            self.kernel
                .end_supervised(&mut table, pid, EXIT_FAILED, reason, &mut exits);
        }
        self.kernel.finish_exits(exits).await;
        Ok(())
    }
}
