//! Restarts: what a process's restart policy and intensity decide when it
//! fails, the backoff timer, and the restart itself.
//!
//! A restarted process keeps its PID, name, role, tier, runtime, prompt,
//! tools, limits, metadata and model usage; it gets a fresh mailbox and a
//! fresh runtime instance from its factory. Its former subtree died with it
//! and is not restarted. While it waits out its backoff delay it stays in
//! the table, alive (it holds its parent's child slot, waiters in
//! `wait_child` keep waiting, a kill ends it for good) in state `restarting`.
//!
//! Past its restart intensity a process stays dead and its parent fails
//! upward: the parent exits (taking its other children with it) and its own
//! restart policy applies in turn. PID 1 never exits; it reports the
//! escalation and leaves the child dead.
//!
//! A manual restart ([`Kernel::restart`], the operator's `restart` command)
//! is the same stop and revive, at once: no backoff, no strategy (only the
//! process and its subtree), and not counted against its restart intensity.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hivekernel_agents::{Capability, Pid, RestartSpec, SpawnRequest, Strategy};
use tokio::time::Instant;

use super::{EXIT_FAILED, EXIT_KILLED, Exits, Stop, strategy, terminate, terminate_below};
use crate::cluster::rpc::Op;
use crate::error::{KernelError, Result};
use crate::events::{EventKind, unix_ms};
use crate::exec::Launch;
use crate::kernel::cluster::FORWARDED_KILL;
use crate::kernel::{Caller, Kernel};
use crate::process::{Entry, ProcessTable};

/// Processes restarted together after one delay: a failed child and the
/// siblings its parent's strategy stopped, in spawn (PID) order.
#[derive(Debug)]
pub(super) struct RestartGroup {
    id: u64,
    pids: Vec<Pid>,
    delay: Duration,
}

/// What an exit leaves to do once its bookkeeping is done.
#[derive(Debug, Default)]
pub(super) struct FollowUps {
    restarts: Vec<RestartGroup>,
    escalations: Vec<(Pid, EventKind)>,
    /// What other nodes do about it (their processes' parents, siblings).
    pub(super) elsewhere: Vec<super::remote::Elsewhere>,
}

impl FollowUps {
    /// Restarts `pids` together after `delay`, as restart group `id`.
    pub(super) fn restart(&mut self, id: u64, mut pids: Vec<Pid>, delay: Duration) {
        pids.sort_unstable();
        self.restarts.push(RestartGroup { id, pids, delay });
    }
}

/// Ends `pid` and its subtree but keeps `pid` in the table, alive, waiting in restart `group`.
pub(super) fn stop_for_restart(
    table: &mut ProcessTable,
    pid: Pid,
    code: i32,
    reason: &str,
    group: u64,
    exits: &mut Exits,
) {
    let now = unix_ms(SystemTime::now());
    terminate_below(table, pid, code, reason, now, exits);
    if let Some(entry) = table.get_mut(pid) {
        let reason = Arc::from(reason);
        if &*entry.proc.runtime_name == crate::exec::EXEC_RUNTIME {
            exits.pause(entry, pid, code, &reason, now);
        } else {
            exits.stop(entry, pid, code, &reason, now);
        }
        if let Some(exited) = exits.exited.last() {
            entry.exited_for_restart(exited.record());
        }
        entry.wait_in_group(group);
    }
}

/// Counts a restart of `entry`, no longer waiting; how many it has had.
fn restarted(entry: &mut Entry) -> u32 {
    entry.sup.as_mut().map_or(0, |sup| sup.restarted())
}

impl Kernel {
    /// The restart spec and strategy of a process about to be spawned: its
    /// request's, else its role's defaults from config, else temporary and
    /// one_for_one. A requested spec must be sound.
    pub(crate) fn supervision_for(
        &self,
        request: &SpawnRequest,
    ) -> Result<(RestartSpec, Strategy)> {
        if let Some(spec) = &request.restart
            && let Some((field, problem)) = spec.problems().into_iter().next()
        {
            return Err(KernelError::InvalidArgument(format!(
                "restart.{field}: {problem}"
            )));
        }
        let role = self.inner.role(request.role);
        let restart = request
            .restart
            .or_else(|| role.as_ref().and_then(|r| r.restart))
            .unwrap_or_default();
        let strategy = request
            .strategy
            .or_else(|| role.as_ref().and_then(|r| r.strategy))
            .unwrap_or(Strategy::OneForOne);
        Ok((restart, strategy))
    }

    /// Ends live process `pid` (and its subtree), which failed (`code` != 0)
    /// or exited normally, and applies its restart policy: a restart
    /// together with whatever its parent's strategy stops, or, past its
    /// restart intensity, its parent's failure, and so on up the tree.
    pub(super) fn end_supervised(
        &self,
        table: &mut ProcessTable,
        pid: Pid,
        code: i32,
        reason: String,
        exits: &mut Exits,
    ) {
        let now = Instant::now();
        let (mut pid, mut code, mut reason) = (pid, code, reason);
        loop {
            let Some(entry) = table.get_mut(pid) else {
                return;
            };
            let ppid = entry.ppid;
            let restarts =
                !self.is_stopping() && entry.restart_spec().policy.restarts_after(code != 0);
            let admitted = match entry.sup.as_mut() {
                Some(sup) if restarts => sup.admit(now),
                _ => {
                    terminate(table, pid, code, &reason, exits);
                    return;
                }
            };
            match admitted {
                Ok(delay) => {
                    let id = self.next_id();
                    stop_for_restart(table, pid, code, &reason, id, exits);
                    let mut pids = vec![pid];
                    pids.extend(strategy::stop_siblings(table, ppid, pid, id, delay, exits));
                    exits.follow.restart(id, pids, delay);
                    // A parent on another node applies its strategy there.
                    if ppid != Pid::KERNEL && table.get(ppid).is_none() {
                        exits
                            .follow
                            .elsewhere
                            .push(super::remote::Elsewhere::Siblings {
                                parent: ppid,
                                failed: pid,
                                delay,
                            });
                    }
                    return;
                }
                Err(recent) => {
                    let name = entry.proc.ctx.name.clone();
                    let within_seconds = entry.restart_spec().within_seconds;
                    terminate(table, pid, code, &reason, exits);
                    let escalated = EventKind::Escalated {
                        child: pid,
                        name: name.clone(),
                        restarts: recent,
                        within_seconds,
                    };
                    exits.follow.escalations.push((ppid, escalated));
                    if ppid == Pid::KERNEL {
                        return;
                    }
                    let failed = format!(
                        "restart intensity exceeded: child {pid} ({name}) restarted {recent} times in {within_seconds}s"
                    );
                    // A parent on another node is told the child exited,
                    // and fails there.
                    if table.get(ppid).is_none() {
                        exits.follow.elsewhere.push(super::remote::Elsewhere::Fail {
                            parent: ppid,
                            reason: failed,
                        });
                        return;
                    }
                    // The zombie leaves with its parent: there is nobody left to tell.
                    exits
                        .tops
                        .retain(|top| top.record.pid != pid || top.collected);
                    reason = failed;
                    (pid, code) = (ppid, EXIT_FAILED);
                }
            }
        }
    }

    /// Restarts live process `pid` now, as its supervisor would (same PID
    /// and spec, its subtree killed, a fresh mailbox and runtime), whatever
    /// its restart policy; not counted against its restart intensity and
    /// never delayed. Returns how many times it has now been restarted.
    /// Needs `kill_processes` over a descendant, like [`Kernel::kill`].
    pub async fn restart(&self, caller: Caller, pid: Pid, reason: &str) -> Result<u32> {
        let result = async {
            self.require(caller, Capability::KillProcesses, "restart processes")?;
            if let Some(node) = self.node().holding(caller, pid, "restart").await? {
                let op = Op::Restart {
                    pid,
                    reason: reason.to_owned(),
                    sibling: false,
                    delay_ms: 0,
                };
                return self.node().forward(&node, op, FORWARDED_KILL).await;
            }
            self.restart_checked(caller, pid, reason).await
        };
        self.report_denial(caller, "restart", result.await)
    }

    /// [`Kernel::restart`], once the caller holds the capability.
    pub(in crate::kernel) async fn restart_checked(
        &self,
        caller: Caller,
        pid: Pid,
        reason: &str,
    ) -> Result<u32> {
        self.check_running()?;
        self.inner.settings().limits.check_reason(reason)?;
        if pid == Pid::KERNEL {
            return Err(KernelError::InvalidArgument(
                "PID 1 is the kernel and cannot be restarted from inside; stop it with SIGTERM \
                 and start it again"
                    .into(),
            ));
        }
        let reason = if reason.is_empty() {
            format!("restart requested by {}", caller.pid())
        } else {
            reason.to_owned()
        };
        let mut exits = self.exits(Stop::Abort);
        let group = self.next_id();
        let waited = {
            let mut table = self.inner.table().write();
            let entry = table.get(pid).ok_or(KernelError::NotFound(pid))?;
            if !entry.is_alive() {
                return Err(KernelError::FailedPrecondition(format!(
                    "process {pid} has already exited; collect it with wait and spawn it again"
                )));
            }
            if let Caller::Process(me) = caller
                && !table.is_ancestor(me, pid)
            {
                return Err(KernelError::PermissionDenied(format!(
                    "process {me} may only restart its descendants, and {pid} is not one"
                )));
            }
            match entry.pending_group() {
                // Already stopped and waiting out a backoff: this restart comes
                // first, and its supervised one finds it no longer waiting.
                Some(waiting) => Some(self.revive_now(&mut table, pid, waiting)?),
                None => {
                    stop_for_restart(&mut table, pid, EXIT_KILLED, &reason, group, &mut exits);
                    None
                }
            }
        };
        if let Some(launch) = waited {
            return Ok(self.revived(pid, launch).await);
        }
        // Every runner of the subtree stopped (an exec process's OS
        // process) and the `exited` events out before the new incarnation
        // starts, as for a supervised restart.
        self.finish_exits(exits).await;
        let launch = self.revive_now(&mut self.inner.table().write(), pid, group)?;
        Ok(self.revived(pid, launch).await)
    }

    /// After a manual restart of `pid`: keeps its history, starts its OS
    /// process (an exec process) and returns its restart count.
    async fn revived(&self, pid: Pid, launch: Option<Launch>) -> u32 {
        self.keep_history(std::iter::once(pid), false);
        if let Some(launch) = launch {
            self.exec().launch(launch).await;
        }
        let table = self.inner.table().read();
        table.get(pid).map_or(0, |e| e.restarts())
    }

    /// Revives `pid`, still waiting in restart `group`, and reports a manual
    /// `restarted` event (under the table lock, so no exit of the new
    /// runner can be reported before it); an exec process's OS process is
    /// the caller's to start, once the lock is released.
    fn revive_now(&self, table: &mut ProcessTable, pid: Pid, group: u64) -> Result<Option<Launch>> {
        if self.is_stopping() {
            return Err(KernelError::ShuttingDown);
        }
        let entry = table
            .get_mut(pid)
            .filter(|e| e.is_alive() && e.pending_group() == Some(group))
            .ok_or_else(|| {
                KernelError::FailedPrecondition(format!(
                    "process {pid} was ended while it was being restarted"
                ))
            })?;
        match self.revive(entry) {
            Ok((attempt, launch)) => {
                let kind = EventKind::Restarted {
                    attempt,
                    delay_ms: 0,
                    manual: true,
                };
                self.inner.events().emit(pid, kind);
                Ok(launch)
            }
            Err(why) => {
                // As a supervised restart would: a failed restart is a failure.
                let mut exits = self.exits(Stop::Abort);
                let message = format!("restart failed: {why}");
                self.end_supervised(table, pid, EXIT_FAILED, message.clone(), &mut exits);
                let kernel = self.clone();
                self.inner.tracker().spawn(async move {
                    kernel.finish_exits(exits).await;
                });
                Err(KernelError::FailedPrecondition(format!(
                    "process {pid}: {message}"
                )))
            }
        }
    }

    /// Ends live process `pid` on its own request (the `exit` syscall), with
    /// its restart policy applied. Called from its own handler, this never
    /// returns: the runner it runs in is stopped with the process.
    pub(crate) async fn exit_process(&self, pid: Pid, code: i32, reason: &str) -> Result<()> {
        let mut exits = self.exits(Stop::Abort);
        {
            let mut table = self.inner.table().write();
            let entry = table.get(pid).ok_or(KernelError::NotFound(pid))?;
            if !entry.is_alive() || entry.is_restarting() {
                return Err(KernelError::FailedPrecondition(format!(
                    "process {pid} is not running"
                )));
            }
            let reason = if reason.is_empty() {
                format!("exited with code {code}")
            } else {
                reason.to_owned()
            };
            self.end_supervised(&mut table, pid, code, reason, &mut exits);
        }
        self.finish_exits(exits).await;
        Ok(())
    }

    /// Reports escalations and starts the restart timers, once the exits
    /// that caused them are complete (every runner stopped, events out).
    pub(super) fn follow_up(&self, follow: FollowUps) {
        let FollowUps {
            restarts,
            escalations,
            // Taken by the caller, which waits for the other nodes.
            elsewhere: _,
        } = follow;
        if !escalations.is_empty() {
            self.inner.events().emit_all(escalations);
        }
        // After the exits' events: a crash from here on brings them back.
        self.keep_history(restarts.iter().flat_map(|g| g.pids.iter().copied()), true);
        for group in restarts {
            self.schedule_restart(group);
        }
    }

    /// Restarts `group` after its delay, on a kernel-owned task that shutdown ends.
    fn schedule_restart(&self, group: RestartGroup) {
        let weak = self.downgrade();
        let shutdown = self.inner.shutdown().clone();
        self.inner.tracker().spawn(async move {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(group.delay) => {}
            }
            if let Some(inner) = weak.upgrade() {
                Kernel { inner }.restart_group(group).await;
            }
        });
    }

    /// Restarts the members of `group` that still wait in it, in PID order.
    async fn restart_group(&self, group: RestartGroup) {
        let mut exits = self.exits(Stop::Abort);
        let mut restarted = Vec::new();
        let mut launches = Vec::new();
        {
            let mut table = self.inner.table().write();
            // Checked under the lock: shutdown's pass holds it too.
            if self.is_stopping() {
                return;
            }
            for &pid in &group.pids {
                let Some(entry) = table.get_mut(pid) else {
                    continue;
                };
                if !entry.is_alive() || entry.pending_group() != Some(group.id) {
                    continue;
                }
                match self.revive(entry) {
                    Ok((attempt, launch)) => {
                        launches.extend(launch);
                        let delay_ms = u64::try_from(group.delay.as_millis()).unwrap_or(u64::MAX);
                        let kind = EventKind::Restarted {
                            attempt,
                            delay_ms,
                            manual: false,
                        };
                        restarted.push((pid, kind));
                    }
                    Err(why) => {
                        let reason = format!("restart failed: {why}");
                        self.end_supervised(&mut table, pid, EXIT_FAILED, reason, &mut exits);
                    }
                }
            }
            // Under the lock, so no later exit of the new runner can be reported first.
            self.inner.events().emit_all(restarted);
        }
        self.keep_history(group.pids.iter().copied(), false);
        for launch in launches {
            self.exec().launch(launch).await;
        }
        self.finish_exits(exits).await;
    }

    /// Keeps the restart history of those of `pids` still in the table
    /// (`pending`: restarts decided and not yet done), with a store.
    fn keep_history(&self, pids: impl Iterator<Item = Pid>, pending: bool) {
        if !self.inner.store().is_durable() {
            return;
        }
        let writes: Vec<_> = {
            let table = self.inner.table().read();
            pids.filter_map(|pid| {
                let entry = table.get(pid)?;
                let waiting = entry.is_alive() && entry.is_restarting();
                Some(entry.history_write(pid, pending && waiting))
            })
            .collect()
        };
        self.inner.store().submit_all(writes);
    }

    /// Gives a waiting process a fresh mailbox, runtime instance and runner,
    /// or, an exec process, the next start of its OS process (to start once
    /// the table lock is released); returns how many times it has now been
    /// restarted.
    fn revive(&self, entry: &mut Entry) -> std::result::Result<(u32, Option<Launch>), String> {
        let old = &entry.proc;
        if let Some(launch) = self.exec().relaunch(old.ctx.pid) {
            return Ok((restarted(entry), Some(launch)));
        }
        let factory = self
            .inner
            .runtimes()
            .get(&old.runtime_name)
            .ok_or_else(|| format!("runtime {} is not registered", old.runtime_name))?;
        let runtime = factory
            .create(&old.ctx)
            .map_err(|e| format!("runtime {}: {e}", old.runtime_name))?;
        let mailbox = crate::kernel::spawn::new_mailbox(self.inner.settings());
        let proc = Arc::new(old.reincarnated(runtime, mailbox, unix_ms(SystemTime::now())));
        // Its runner starts with the first item in its new mailbox.
        entry.proc = proc;
        Ok((restarted(entry), None))
    }
}
