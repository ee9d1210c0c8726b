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

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hivekernel_agents::{Pid, RestartSpec, SpawnRequest, Strategy};
use tokio::time::Instant;

use super::{EXIT_FAILED, Exits, Stop, strategy, terminate, terminate_below};
use crate::error::{KernelError, Result};
use crate::events::{EventKind, unix_ms};
use crate::kernel::Kernel;
use crate::mailbox::Mailbox;
use crate::process::{Entry, ProcShared, ProcessTable};

/// A process's restart policy, its strategy for its children, and its restart history.
#[derive(Debug)]
pub(crate) struct Supervision {
    restart: RestartSpec,
    strategy: Strategy,
    /// Restarts so far.
    restarts: u32,
    /// When the restarts still in the window were decided, oldest first;
    /// never longer than `restart.max_restarts`.
    recent: VecDeque<Instant>,
    /// The restart group it waits in, while it waits to be restarted.
    pending: Option<u64>,
}

impl Supervision {
    /// What a new process carries; `None` for the defaults, which cost nothing.
    pub(crate) fn for_spawn(restart: RestartSpec, strategy: Strategy) -> Option<Box<Supervision>> {
        let default = !restart.policy.restarts_after(true) && strategy == Strategy::OneForOne;
        (!default).then(|| Box::new(Supervision::new(restart, strategy)))
    }

    fn new(restart: RestartSpec, strategy: Strategy) -> Self {
        Supervision {
            restart,
            strategy,
            restarts: 0,
            recent: VecDeque::new(),
            pending: None,
        }
    }

    /// Admits one more restart at `now` and returns its delay, or refuses
    /// it with the number of restarts already in the window.
    fn admit(&mut self, now: Instant) -> Result<Duration, u32> {
        let window = Duration::from_secs(self.restart.within_seconds);
        while self
            .recent
            .front()
            .is_some_and(|&at| now.saturating_duration_since(at) >= window)
        {
            self.recent.pop_front();
        }
        let recent = u32::try_from(self.recent.len()).unwrap_or(u32::MAX);
        if recent >= self.restart.max_restarts {
            return Err(recent);
        }
        self.recent.push_back(now);
        Ok(self.restart.delay(recent))
    }
}

impl Entry {
    /// Its restart policy and intensity.
    pub(crate) fn restart_spec(&self) -> RestartSpec {
        self.sup
            .as_ref()
            .map_or_else(RestartSpec::default, |s| s.restart)
    }

    /// How its children are restarted when one fails.
    pub(crate) fn strategy(&self) -> Strategy {
        self.sup
            .as_ref()
            .map_or(Strategy::OneForOne, |s| s.strategy)
    }

    /// Times it has been restarted.
    pub(crate) fn restarts(&self) -> u32 {
        self.sup.as_ref().map_or(0, |s| s.restarts)
    }

    /// Whether it has exited and waits to be restarted.
    pub(crate) fn is_restarting(&self) -> bool {
        self.pending_group().is_some()
    }

    /// Whether `proc` is its live, running incarnation.
    pub(crate) fn is_running(&self, proc: &Arc<ProcShared>) -> bool {
        self.is_alive() && !self.is_restarting() && Arc::ptr_eq(&self.proc, proc)
    }

    pub(super) fn pending_group(&self) -> Option<u64> {
        self.sup.as_ref().and_then(|s| s.pending)
    }

    pub(super) fn wait_in_group(&mut self, group: u64) {
        self.sup
            .get_or_insert_with(|| {
                Box::new(Supervision::new(
                    RestartSpec::default(),
                    Strategy::OneForOne,
                ))
            })
            .pending = Some(group);
    }
}

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
        exits.stop(entry, pid, code, &Arc::from(reason), now);
        entry.wait_in_group(group);
    }
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
        let role = self.inner.settings.roles.get(&request.role);
        let restart = request
            .restart
            .or_else(|| role.and_then(|r| r.restart))
            .unwrap_or_default();
        let strategy = request
            .strategy
            .or_else(|| role.and_then(|r| r.strategy))
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
                    pids.extend(strategy::stop_siblings(table, ppid, pid, id, exits));
                    pids.sort_unstable();
                    exits.follow.restarts.push(RestartGroup { id, pids, delay });
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
                    // The zombie leaves with its parent: there is nobody left to tell.
                    exits
                        .tops
                        .retain(|top| top.record.pid != pid || top.collected);
                    reason = format!(
                        "restart intensity exceeded: child {pid} ({name}) restarted {recent} times in {within_seconds}s"
                    );
                    (pid, code) = (ppid, EXIT_FAILED);
                }
            }
        }
    }

    /// Ends live process `pid` on its own request (the `exit` syscall), with
    /// its restart policy applied. Called from its own handler, this never
    /// returns: the runner it runs in is stopped with the process.
    pub(crate) async fn exit_process(&self, pid: Pid, code: i32, reason: &str) -> Result<()> {
        let mut exits = Exits::new(Stop::Abort);
        {
            let mut table = self.inner.table.write();
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
        } = follow;
        if !escalations.is_empty() {
            self.inner.events.emit_all(escalations);
        }
        for group in restarts {
            self.schedule_restart(group);
        }
    }

    /// Restarts `group` after its delay, on a kernel-owned task that shutdown ends.
    fn schedule_restart(&self, group: RestartGroup) {
        let weak = self.downgrade();
        let shutdown = self.inner.shutdown.clone();
        self.inner.tracker.spawn(async move {
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
        let mut exits = Exits::new(Stop::Abort);
        let mut restarted = Vec::new();
        {
            let mut table = self.inner.table.write();
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
                    Ok(attempt) => {
                        let delay_ms = u64::try_from(group.delay.as_millis()).unwrap_or(u64::MAX);
                        restarted.push((pid, EventKind::Restarted { attempt, delay_ms }));
                    }
                    Err(why) => {
                        let reason = format!("restart failed: {why}");
                        self.end_supervised(&mut table, pid, EXIT_FAILED, reason, &mut exits);
                    }
                }
            }
            // Under the lock, so no later exit of the new runner can be reported first.
            self.inner.events.emit_all(restarted);
        }
        self.finish_exits(exits).await;
    }

    /// Gives a waiting process a fresh mailbox, runtime instance and runner;
    /// returns how many times it has now been restarted.
    fn revive(&self, entry: &mut Entry) -> std::result::Result<u32, String> {
        let old = &entry.proc;
        let factory = self
            .inner
            .runtimes
            .get(&old.runtime_name)
            .ok_or_else(|| format!("runtime {} is not registered", old.runtime_name))?;
        let runtime = factory
            .create(&old.ctx)
            .map_err(|e| format!("runtime {}: {e}", old.runtime_name))?;
        let settings = &self.inner.settings;
        let proc = Arc::new(ProcShared {
            ctx: old.ctx.clone(),
            runtime_name: old.runtime_name.clone(),
            runtime: Some(runtime),
            limits: old.limits,
            metadata: old.metadata.clone(),
            started_at_unix_ms: unix_ms(SystemTime::now()),
            mailbox: Mailbox::new(
                settings.mailbox_capacity,
                Duration::from_millis(settings.mailbox_aging_ms),
            ),
            running: Default::default(),
            blocked: Default::default(),
            usage: old.usage.carried(),
            budget: old.budget.clone(),
            caps: old.caps,
        });
        // Its runner starts with the first item in its new mailbox.
        entry.proc = proc;
        let Some(sup) = entry.sup.as_mut() else {
            return Ok(0);
        };
        sup.pending = None;
        sup.restarts = sup.restarts.saturating_add(1);
        Ok(sup.restarts)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use hivekernel_agents::RestartPolicy;

    use super::*;

    fn supervision(max_restarts: u32, within_seconds: u64) -> Supervision {
        let mut spec = RestartSpec::new(RestartPolicy::Permanent);
        spec.max_restarts = max_restarts;
        spec.within_seconds = within_seconds;
        spec.backoff_ms = [100, 1000];
        Supervision::new(spec, Strategy::OneForOne)
    }

    #[test]
    fn intensity_admits_max_restarts_per_window_then_refuses() {
        let start = Instant::now();
        let mut sup = supervision(3, 5);
        let delays: Vec<u128> = (0..3)
            .map(|i| {
                sup.admit(start + Duration::from_millis(i))
                    .unwrap()
                    .as_millis()
            })
            .collect();
        assert_eq!(delays, [100, 200, 400]);
        assert_eq!(sup.admit(start + Duration::from_secs(1)), Err(3));
        // Once the window has moved past the first restart, one more is allowed.
        assert_eq!(
            sup.admit(start + Duration::from_secs(5))
                .map(|d| d.as_millis()),
            Ok(400)
        );
    }

    #[test]
    fn an_empty_window_resets_the_backoff() {
        let start = Instant::now();
        let mut sup = supervision(3, 5);
        sup.admit(start).unwrap();
        sup.admit(start).unwrap();
        let later = start + Duration::from_secs(60);
        assert_eq!(sup.admit(later), Ok(Duration::from_millis(100)));
    }

    #[test]
    fn max_restarts_zero_refuses_the_first_restart() {
        let mut sup = supervision(0, 5);
        assert_eq!(sup.admit(Instant::now()), Err(0));
    }

    #[test]
    fn defaults_cost_nothing() {
        let temporary = RestartSpec::default();
        assert!(Supervision::for_spawn(temporary, Strategy::OneForOne).is_none());
        assert!(Supervision::for_spawn(temporary, Strategy::OneForAll).is_some());
        let permanent = RestartSpec::new(RestartPolicy::Permanent);
        assert!(Supervision::for_spawn(permanent, Strategy::OneForOne).is_some());
    }
}
