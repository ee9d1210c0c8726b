//! Ending processes: kill of whole subtrees, exit records, `wait_child` and
//! the zombie reaper.
//!
//! An exiting process takes its subtree with it, leaves first. The process
//! at the top of the exit becomes a zombie until its parent collects it with
//! `wait_child` (or the reaper removes it after `zombie_timeout_seconds`);
//! processes below it are reaped at once, since their parents are gone too.
//!
//! A process that fails or exits on its own may instead be restarted, as its
//! restart policy and its parent's strategy say (`restart`, `strategy`).

mod remote;
mod restart;
mod strategy;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use hivekernel_agents::Capability;
use hivekernel_agents::message::kinds;
use hivekernel_agents::{ExitRecord, Killed, Message, Pid, Priority};
use parking_lot::Mutex;
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::cluster::rpc::Op;
use crate::error::{KernelError, Result};
use crate::events::{EventKind, ReapCause, unix_ms};
use crate::exec::{ExecRuntime, Gone};
use crate::kernel::cluster::FORWARDED_KILL;
use crate::kernel::{Caller, Kernel};
use crate::mailbox::{Envelope, Item, ReplyTo};
use crate::process::{Entry, ProcShared, ProcessTable};

pub(crate) use hivekernel_agents::process::{EXIT_FAILED, EXIT_KILLED, EXIT_PANICKED};

/// Everything exits produced, to act on once the table lock is released.
#[derive(Debug)]
struct Exits {
    /// How the runners stop.
    stop: Stop,
    /// Every process that exited, leaves first.
    exited: Vec<Exited>,
    /// Processes removed from the table with their parent.
    reaped: Vec<Pid>,
    /// Runners to stop, by PID.
    runners: Vec<(Pid, JoinHandle<()>)>,
    /// Children on other nodes of processes that exited here, with the
    /// reason their ancestor's exit gives them: killed there, with their
    /// subtrees, once the exits here are done.
    elsewhere: Vec<(Pid, Arc<str>)>,
    /// Budgets lent by parents on other nodes, closed, by child: what
    /// each used is reported to the node that lent it.
    repays: Vec<(Pid, Arc<crate::budget::Pool>)>,
    /// Items still queued in closed mailboxes, by receiver.
    undelivered: Vec<(Pid, Envelope)>,
    /// Exec processes waiting to be restarted: only their OS processes stop.
    paused: Vec<Pid>,
    /// Their OS processes, stopping: waited for before the exits are done.
    retiring: Vec<Gone>,
    /// The kernel's exec runtime, which pauses them.
    exec: Option<Arc<ExecRuntime>>,
    /// The top process of each exit: its parent is told.
    tops: Vec<Top>,
    /// Restarts to schedule and escalations to report.
    follow: restart::FollowUps,
}

/// A process that exited: what its `exited` event says.
#[derive(Debug)]
struct Exited {
    pid: Pid,
    ppid: Pid,
    /// Shared with the process's context, not copied.
    name: Arc<str>,
    exit_code: i32,
    /// Shared by every process one exit takes with it.
    reason: Arc<str>,
    at_unix_ms: u64,
}

impl Exited {
    /// Its exit record, built only for those who collect one (the top
    /// process's parent, a waiter in `wait_child`).
    fn record(&self) -> ExitRecord {
        ExitRecord {
            pid: self.pid,
            ppid: self.ppid,
            name: self.name.to_string(),
            exit_code: self.exit_code,
            output: String::new(),
            reason: self.reason.to_string(),
            exited_at_unix_ms: self.at_unix_ms,
        }
    }
}

/// The process at the top of an exit.
#[derive(Debug)]
struct Top {
    record: ExitRecord,
    /// Collected at once by a parent already blocked in `wait_child`.
    collected: bool,
}

/// Whether runners are aborted at once or allowed to finish in-flight work
/// (only at a clean stop of the kernel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Abort,
    Drain,
}

impl Exits {
    fn new(stop: Stop, exec: Option<Arc<ExecRuntime>>) -> Self {
        Exits {
            stop,
            retiring: Vec::new(),
            exec,
            exited: Vec::new(),
            reaped: Vec::new(),
            elsewhere: Vec::new(),
            repays: Vec::new(),
            runners: Vec::new(),
            undelivered: Vec::new(),
            paused: Vec::new(),
            tops: Vec::new(),
            follow: restart::FollowUps::default(),
        }
    }

    /// Ends one live process: closes its mailbox, takes its runner, and hands
    /// its exit record to a waiter blocked in `wait_child`. Returns what
    /// exited, and whether a waiter took the record.
    ///
    /// A runner that will be aborted is not woken: the abort schedules it
    /// once, and a wake-up here would schedule it again, under the table lock.
    fn exit(
        &mut self,
        entry: &mut Entry,
        pid: Pid,
        code: i32,
        reason: &Arc<str>,
        now: u64,
    ) -> (&Exited, bool) {
        self.stop(entry, pid, code, reason, now);
        // For good: what its budget did not use goes back to the lender
        // (on another node: told once the exits are done).
        if let Some(pool) = entry.proc.own_budget() {
            pool.close();
            if pool.loaned_by().is_some()
                && let Some(own) = entry.proc.budget.clone()
            {
                self.repays.push((pid, own));
            }
        }
        let exited = &self.exited[self.exited.len() - 1];
        let waiters = entry.exit_waiters.take().map(|w| *w).unwrap_or_default();
        let collected = !waiters.is_empty() && {
            let record = exited.record();
            waiters
                .into_iter()
                .any(|tx| tx.send(record.clone()).is_ok())
        };
        (exited, collected)
    }

    /// Stops one live process's runner and mailbox and records its exit,
    /// without telling anyone waiting for it: a process about to be
    /// restarted keeps its waiters.
    fn stop(&mut self, entry: &mut Entry, pid: Pid, code: i32, reason: &Arc<str>, now: u64) {
        let (pending, runner) = match self.stop {
            Stop::Abort => entry.proc.mailbox.close_without_wake(),
            Stop::Drain => entry.proc.mailbox.close(),
        };
        self.undelivered
            .extend(pending.into_iter().map(|env| (pid, env)));
        // None when it was never sent anything: no task ever ran for it.
        if let Some(runner) = runner {
            self.runners.push((pid, runner));
        }
        self.record(entry, pid, code, reason, now);
    }

    /// Stops the OS process of exec process `pid`, about to be restarted,
    /// and records its exit. Its mailbox and runner go on: what is queued
    /// and what its agent was handed and did not answer wait for the next
    /// OS process.
    fn pause(&mut self, entry: &Entry, pid: Pid, code: i32, reason: &Arc<str>, now: u64) {
        self.paused.push(pid);
        if let Some(exec) = &self.exec {
            self.retiring.extend(exec.pause(pid));
        }
        self.record(entry, pid, code, reason, now);
    }

    fn record(&mut self, entry: &Entry, pid: Pid, code: i32, reason: &Arc<str>, now: u64) {
        let exited = Exited {
            pid,
            ppid: entry.ppid,
            name: entry.proc.ctx.name.clone(),
            exit_code: code,
            reason: reason.clone(),
            at_unix_ms: now,
        };
        self.exited.push(exited);
    }
}

impl Kernel {
    /// What exits produce, to act on once the table lock is released.
    fn exits(&self, stop: Stop) -> Exits {
        Exits::new(stop, self.inner.runtimes().exec().cloned())
    }
    /// Kills `pid` and its subtree, leaves first, and waits until none of them runs.
    /// Returns the PIDs that exited, leaves first.
    pub async fn kill(&self, caller: Caller, pid: Pid, reason: &str) -> Result<Killed> {
        let result = async {
            self.require(caller, Capability::KillProcesses, "kill processes")?;
            if let Some(node) = self.node().holding(caller, pid, "kill").await? {
                let op = Op::Kill {
                    pid,
                    reason: reason.to_owned(),
                    orphaned: false,
                };
                return self.node().forward(&node, op, FORWARDED_KILL).await;
            }
            self.kill_checked(caller, pid, reason).await
        };
        self.report_denial(caller, "kill", result.await)
    }

    /// Kills `pid` and collects it (waiting up to 5 s for its exit record),
    /// so a process started for one job leaves no zombie: orchestrate's
    /// abandoned workers and cron's template agents end this way.
    pub(crate) async fn dismiss(&self, caller: Caller, pid: Pid, reason: &str) {
        if self.kill(caller, pid, reason).await.is_ok() {
            let _ = self
                .wait_child(caller, pid, Some(Duration::from_secs(5)))
                .await;
        }
    }

    /// [`Kernel::kill`], once the caller holds the capability, of a
    /// process of this node (never forwarded).
    pub(super) async fn kill_checked(
        &self,
        caller: Caller,
        pid: Pid,
        reason: &str,
    ) -> Result<Killed> {
        self.kill_here(caller, pid, reason, false).await
    }

    /// [`Kernel::kill_checked`]; `orphaned`: its parent, on another node,
    /// exited, so the process leaves no zombie and its parent is not told.
    /// Its subtree's parts on other nodes are killed first, leaves first.
    pub(super) async fn kill_here(
        &self,
        caller: Caller,
        pid: Pid,
        reason: &str,
        orphaned: bool,
    ) -> Result<Killed> {
        // An orphan's reason grew on the way: its ancestor's node checked it.
        if !orphaned {
            self.inner.settings().limits.check_reason(reason)?;
        }
        if pid == Pid::KERNEL {
            return Err(KernelError::PermissionDenied(
                "PID 1 is the kernel; stop it with SIGTERM or SIGINT".into(),
            ));
        }
        let reason = if reason.is_empty() {
            format!("killed by {}", caller.pid())
        } else {
            reason.to_owned()
        };
        // Leaves first: the parts of its subtree on other nodes end before
        // anything here does.
        let mut killed_elsewhere = Killed::default();
        if self.inner.cluster().is_some() {
            let elsewhere = {
                let table = self.inner.table().read();
                may_kill(&table, caller, pid)?;
                children_elsewhere(&table, pid)
            };
            if !elsewhere.is_empty() {
                // Kernel-owned: a caller that gives up does not leave the
                // slots held.
                let kernel = self.clone();
                let inherited: Arc<str> = Arc::from(format!("ancestor {pid} exited: {reason}"));
                let done = self.inner.tracker().spawn(async move {
                    let orphans = elsewhere
                        .iter()
                        .map(|(_, child)| (*child, inherited.clone()))
                        .collect();
                    let killed = kernel.node().kill_elsewhere(orphans).await;
                    for (parent, child) in elsewhere {
                        kernel.node().release_child(parent, child);
                    }
                    killed
                });
                killed_elsewhere = done.await.unwrap_or_default();
            }
        }
        let exits = {
            let mut table = self.inner.table().write();
            may_kill(&table, caller, pid)?;
            let mut exits = self.exits(Stop::Abort);
            terminate(&mut table, pid, EXIT_KILLED, &reason, &mut exits);
            if orphaned {
                for top in exits.tops.drain(..) {
                    reap(&mut table, top.record.pid);
                    if !top.collected {
                        exits.reaped.push(top.record.pid);
                    }
                }
            }
            exits
        };
        // Leaves first: those elsewhere ended before any here.
        let mut killed = killed_elsewhere;
        killed.exited.extend(exits.exited.iter().map(|e| e.pid));
        self.finish_exits(exits).await;
        Ok(killed)
    }

    /// Called by a process's own runner when its runtime failed: the process
    /// and its subtree exit with `exit_code`, and its restart policy applies.
    pub(crate) async fn exit_self(&self, proc: &Arc<ProcShared>, exit_code: i32, reason: String) {
        self.exit_with(proc, exit_code, reason, None).await;
    }

    /// Ends exec process `pid` and its subtree with `exit_code`, from
    /// outside its runner: its OS process of `generation` ended (or could
    /// not start). Checked under the table lock with the generation, so a
    /// late report of an OS process a restart replaced ends nothing.
    pub(crate) async fn exit_exec(
        &self,
        pid: Pid,
        generation: u64,
        exit_code: i32,
        reason: String,
    ) {
        let proc = self.inner.table().read().get(pid).map(|e| e.proc.clone());
        if let Some(proc) = proc {
            self.exit_with(&proc, exit_code, reason, Some(generation))
                .await;
        }
    }

    /// `generation`: an exec process's OS process reports the exit, else
    /// the process's own runner does.
    async fn exit_with(
        &self,
        proc: &Arc<ProcShared>,
        exit_code: i32,
        reason: String,
        generation: Option<u64>,
    ) {
        let pid = proc.ctx.pid;
        let mut exits = self.exits(Stop::Abort);
        {
            let mut table = self.inner.table().write();
            let current = |generation: u64| {
                let exec = self.inner.runtimes().exec();
                exec.is_some_and(|exec| exec.exited_as(pid, generation))
            };
            match table.get(pid) {
                // Only the current incarnation (and OS process) may end it.
                Some(entry) if entry.is_running(proc) && generation.is_none_or(current) => {
                    self.end_supervised(&mut table, pid, exit_code, reason, &mut exits)
                }
                _ => return,
            }
        }
        if generation.is_none() {
            // The caller is the exiting runner: it must not wait for itself.
            exits.runners.retain(|(runner, _)| *runner != pid);
        }
        self.finish_exits(exits).await;
    }

    /// Waits for child `pid` to exit, collects its exit record and reaps it.
    pub async fn wait_child(
        &self,
        caller: Caller,
        pid: Pid,
        timeout: Option<Duration>,
    ) -> Result<ExitRecord> {
        if pid == Pid::KERNEL {
            return Err(KernelError::InvalidArgument(
                "PID 1 is the kernel and does not exit while it serves".into(),
            ));
        }
        if let Some(limit) = timeout {
            crate::router::check_duration("timeout", limit)?;
        }
        if let Some(node) = self.node().parent_elsewhere(caller, pid).await? {
            let _blocked = self.blocked_guard(caller);
            return self.node().wait_elsewhere(&node, pid, timeout).await;
        }
        let rx = {
            let mut table = self.inner.table().write();
            let entry = table.get_mut(pid).ok_or(KernelError::NotFound(pid))?;
            if let Caller::Process(me) = caller
                && me != entry.ppid
            {
                return Err(KernelError::PermissionDenied(format!(
                    "process {me} is not the parent of {pid}"
                )));
            }
            if let Some(record) = entry.exit.as_deref().cloned() {
                reap(&mut table, pid);
                drop(table);
                self.inner.events().emit(
                    pid,
                    EventKind::Reaped {
                        by: ReapCause::WaitChild,
                    },
                );
                return Ok(record);
            }
            let (tx, rx) = oneshot::channel();
            // Waiters that timed out are gone; don't let them pile up.
            let waiters = entry.exit_waiters.get_or_insert_default();
            waiters.retain(|waiter| !waiter.is_closed());
            waiters.push(tx);
            rx
        };
        let _blocked = self.blocked_guard(caller);
        let outcome = match timeout {
            Some(limit) => tokio::time::timeout(limit, rx).await.map_err(|_| {
                KernelError::DeadlineExceeded(format!(
                    "process {pid} still running after {} ms",
                    limit.as_millis()
                ))
            })?,
            None => rx.await,
        };
        outcome.map_err(|_| {
            KernelError::FailedPrecondition(format!("process {pid} was reaped by another waiter"))
        })
    }

    /// Ends every process below PID 1, leaves first: in-flight tasks get up
    /// to `grace` to finish, then everything left is forced.
    pub(crate) async fn stop_all(&self, grace: Duration) {
        let mut exits = self.exits(Stop::Drain);
        {
            // Spawn checks `stopping` under this lock, so no child of PID 1
            // can appear after this pass.
            let mut table = self.inner.table().write();
            // Under PID 1, and under parents on other nodes.
            let foreign: Vec<Pid> = table
                .foreign()
                .flat_map(|(_, children)| children.iter().copied())
                .collect();
            let roots: Vec<Pid> = table
                .get(Pid::KERNEL)
                .map(|k| k.children.iter().collect::<Vec<_>>())
                .unwrap_or_default()
                .into_iter()
                .chain(foreign)
                .collect();
            for root in roots {
                if table.get(root).is_some_and(|e| e.is_alive()) {
                    terminate(&mut table, root, 0, "kernel shutdown", &mut exits);
                }
            }
        }
        // Closed mailboxes let runners finish in-flight work and return.
        if !self.drain_runners(&mut exits.runners, grace).await {
            tracing::warn!(
                grace_ms = grace.as_millis() as u64,
                "forcing processes still running after the grace period"
            );
            exits.runners.iter().for_each(|(_, runner)| runner.abort());
        }
        // Whatever is left was forced: finish_exits waits until it has stopped.
        self.finish_exits(exits).await;
    }

    /// Waits up to `grace` for `runners` to finish their in-flight work;
    /// `false` when some are still running after it. A turn waiting for a
    /// person is not waited for: the store keeps it, and the next start
    /// resumes it, so a runner all of whose turns wait is aborted at once.
    async fn drain_runners(
        &self,
        runners: &mut Vec<(Pid, JoinHandle<()>)>,
        grace: Duration,
    ) -> bool {
        let waits = |pid: Pid| {
            let table = self.inner.table().read();
            table.get(pid).map(|entry| {
                let waiting = entry.proc.waiting.load(Ordering::SeqCst);
                (waiting, entry.proc.running.load(Ordering::SeqCst))
            })
        };
        let someone_waits = runners
            .iter()
            .any(|(pid, _)| waits(*pid).is_some_and(|(waiting, _)| waiting > 0));
        if !someone_waits {
            return tokio::time::timeout(grace, join_runners(runners))
                .await
                .is_ok();
        }
        let deadline = Instant::now() + grace;
        // Parked at two polls in a row: a turn whose request was just
        // resolved gets its chance to go on.
        let mut parked_before = false;
        loop {
            runners.retain(|(_, runner)| !runner.is_finished());
            let parked = runners.iter().all(|(pid, _)| {
                waits(*pid).is_some_and(|(waiting, running)| waiting > 0 && waiting >= running)
            });
            if parked && parked_before {
                runners.iter().for_each(|(_, runner)| runner.abort());
                return true;
            }
            parked_before = parked;
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Acts on exits once the table lock is released: stop the runners, fail
    /// undelivered tasks, emit events, tell parents, schedule reaping.
    ///
    /// Runs as a kernel-owned task, so a caller that gives up (a cancelled
    /// gRPC Kill, an abandoned task) cannot leave the bookkeeping half done.
    async fn finish_exits(&self, exits: Exits) {
        let kernel = self.clone();
        // The exits belong to the work that caused them.
        let trace = crate::trace::current();
        let finish = self
            .inner
            .tracker()
            .spawn(crate::trace::scope(trace, async move {
                let Exits {
                    stop,
                    exited,
                    reaped,
                    mut runners,
                    undelivered,
                    paused,
                    retiring,
                    exec: _,
                    tops,
                    follow,
                    elsewhere,
                    repays,
                } = exits;
                let mut follow = follow;
                let supervise = std::mem::take(&mut follow.elsewhere);
                if stop == Stop::Abort {
                    runners.iter().for_each(|(_, runner)| runner.abort());
                }
                // Quiescence: once this is done, none of the subtree's tasks runs.
                join_runners(&mut runners).await;
                // Nor any OS process of an exec process among them (one
                // waiting to be restarted keeps the rest for the next).
                let ended = exited
                    .iter()
                    .map(|e| e.pid)
                    .filter(|pid| !paused.contains(pid));
                kernel.exec().stop(ended).await;
                for gone in retiring {
                    gone.await;
                }
                kernel
                    .inner
                    .transcripts()
                    .forget(exited.iter().map(|e| e.pid));
                for (pid, env) in undelivered {
                    kernel.fail_undelivered(pid, env);
                }
                // A clean stop is not an exit: every process stays alive in
                // the store and comes back with the kernel, as after a crash.
                if stop == Stop::Drain {
                    return;
                }
                let events = exited
                    .into_iter()
                    .map(|exited| {
                        let kind = EventKind::Exited {
                            ppid: exited.ppid,
                            name: exited.name,
                            exit_code: exited.exit_code,
                            reason: exited.reason,
                        };
                        (exited.pid, kind)
                    })
                    .chain(reaped.into_iter().map(|pid| {
                        let kind = EventKind::Reaped {
                            by: ReapCause::ParentExited,
                        };
                        (pid, kind)
                    }))
                    .collect();
                kernel.inner.events().emit_all(events);
                if !repays.is_empty() {
                    kernel.node().repay_loans(repays);
                }
                for top in tops {
                    kernel.finish_top(top);
                }
                kernel.follow_up(follow);
                if !elsewhere.is_empty() {
                    let _ = kernel.node().kill_elsewhere(elsewhere).await;
                }
                if !supervise.is_empty() {
                    kernel.node().supervise_elsewhere(supervise).await;
                }
            }));
        // Only a panic could fail the join; the kernel's state is already consistent.
        let _ = finish.await;
    }

    /// Tells the parent of an exit's top process, and schedules its reaping.
    fn finish_top(&self, Top { record, collected }: Top) {
        if collected {
            self.inner.events().emit(
                record.pid,
                EventKind::Reaped {
                    by: ReapCause::WaitChild,
                },
            );
        } else {
            let timeout = Duration::from_secs(self.inner.settings().zombie_timeout_seconds);
            // A timeout too far away to represent means: never reap.
            if let Some(at) = Instant::now().checked_add(timeout) {
                self.inner.reaper().schedule(at, record.pid);
            }
        }
        if record.ppid == Pid::KERNEL {
            return;
        }
        self.tell_child_exited(&record, crate::trace::current());
    }

    /// Sends `record`'s parent its `child_exited` notice.
    pub(super) fn tell_child_exited(
        &self,
        record: &hivekernel_agents::ExitRecord,
        trace: Option<hivekernel_agents::TraceContext>,
    ) {
        let message = Message {
            id: hivekernel_agents::MessageId(self.next_id()),
            from: Pid::KERNEL,
            to: record.ppid,
            kind: kinds::CHILD_EXITED.to_owned(),
            payload: serde_json::to_string(record).unwrap_or_default(),
            priority: Priority::High,
            request_id: None,
            via: None,
            trace,
            approvals: hivekernel_agents::approval::Carried::NONE,
        };
        self.deliver_system(message);
    }

    /// Removes a zombie that nobody collected in time.
    pub(crate) fn reap_if_zombie(&self, pid: Pid) {
        let reaped = {
            let mut table = self.inner.table().write();
            match table.get(pid) {
                Some(entry) if !entry.is_alive() => {
                    reap(&mut table, pid);
                    true
                }
                _ => false,
            }
        };
        if reaped {
            self.inner.events().emit(
                pid,
                EventKind::Reaped {
                    by: ReapCause::Timeout,
                },
            );
        }
    }

    /// Marks `caller` (when a process) blocked until the guard drops.
    pub(crate) fn blocked_guard(&self, caller: Caller) -> Option<BlockedGuard> {
        let Caller::Process(pid) = caller else {
            return None;
        };
        let proc = self.inner.table().read().get(pid)?.proc.clone();
        proc.blocked.fetch_add(1, Ordering::Relaxed);
        Some(BlockedGuard(proc))
    }

    pub(crate) fn start_reaper(&self) {
        let weak = self.downgrade();
        let shutdown = self.inner.shutdown().clone();
        self.inner.tracker().spawn(async move {
            loop {
                let (wake, next) = match weak.upgrade() {
                    Some(inner) => (inner.reaper().wake.clone(), inner.reaper().next_deadline()),
                    None => return,
                };
                let sleep = async {
                    match next {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = wake.notified() => continue,
                    _ = sleep => {}
                }
                let Some(inner) = weak.upgrade() else { return };
                let kernel = Kernel { inner };
                for pid in kernel.inner.reaper().due(Instant::now()) {
                    kernel.reap_if_zombie(pid);
                }
            }
        });
    }
}

/// Keeps a process counted as blocked while alive.
#[derive(Debug)]
pub(crate) struct BlockedGuard(Arc<ProcShared>);

impl Drop for BlockedGuard {
    fn drop(&mut self) {
        self.0.blocked.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Waits for every runner to end, removing each from `runners` once it has,
/// so a caller that stops waiting early keeps the ones still running.
///
/// One at a time, not `join_all`: that registers a waker in every unfinished
/// handle, so each runner that ends wakes the joining task again, and once
/// tokio's cooperative budget is spent every handle it polls answers `Pending`
/// and wakes itself. For 10,000 runners that churn cost far more than the
/// runners' own ending; awaited in turn, a finished handle is one poll.
async fn join_runners(runners: &mut Vec<(Pid, JoinHandle<()>)>) {
    while let Some((_, runner)) = runners.last_mut() {
        // A runner ends by returning or by being aborted; neither is an error here.
        let _ = runner.await;
        runners.pop();
    }
}

/// Whether `caller` may kill `pid`, alive in the table: an operator, or
/// one of its ancestors.
fn may_kill(table: &ProcessTable, caller: Caller, pid: Pid) -> Result<()> {
    let entry = table.get(pid).ok_or(KernelError::NotFound(pid))?;
    if !entry.is_alive() {
        return Err(KernelError::FailedPrecondition(format!(
            "process {pid} has already exited; collect it with wait"
        )));
    }
    if let Caller::Process(me) = caller
        && !table.is_ancestor(me, pid)
    {
        return Err(KernelError::PermissionDenied(format!(
            "process {me} may only kill its descendants, and {pid} is not one"
        )));
    }
    Ok(())
}

/// The children on other nodes of `root`'s subtree here, each with its
/// parent: every child not in the table.
fn children_elsewhere(table: &ProcessTable, root: Pid) -> Vec<(Pid, Pid)> {
    let mut found = Vec::new();
    for pid in table.subtree_preorder(root, None) {
        if let Some(entry) = table.get(pid) {
            found.extend(
                entry
                    .children
                    .iter()
                    .filter(|child| table.get(*child).is_none())
                    .map(|child| (pid, child)),
            );
        }
    }
    found
}

/// Marks the subtree under `top` exited, leaves first, and unlinks it.
fn terminate(table: &mut ProcessTable, top: Pid, exit_code: i32, reason: &str, exits: &mut Exits) {
    let now = unix_ms(SystemTime::now());
    terminate_below(table, top, exit_code, reason, now, exits);
    let Some(entry) = table.get_mut(top) else {
        return;
    };
    if !entry.is_alive() {
        return;
    }
    let ppid = entry.ppid;
    let (exited, collected) = exits.exit(entry, top, exit_code, &Arc::from(reason), now);
    let record = exited.record();
    entry.exit = Some(Box::new(record.clone()));
    if let Some(parent) = table.get_mut(ppid) {
        parent.live_children = parent.live_children.saturating_sub(1);
    }
    if collected {
        reap(table, top);
    }
    exits.tops.push(Top { record, collected });
}

/// Ends everything below `top`, leaves first: it all leaves the table.
fn terminate_below(
    table: &mut ProcessTable,
    top: Pid,
    exit_code: i32,
    reason: &str,
    now: u64,
    exits: &mut Exits,
) {
    let mut below = table.subtree_leaves_first(top);
    // Leaves first, so `top` comes last.
    below.pop();
    exits.exited.reserve(below.len() + 1);
    exits.runners.reserve(below.len() + 1);
    exits.reaped.reserve(below.len());
    let inherited: Arc<str> = Arc::from(format!("ancestor {top} exited: {reason}"));
    // Everything below `top` leaves the table with it: one removal each, and
    // no parent to unlink from, since every parent but `top` goes too.
    for pid in below {
        let Some(mut entry) = table.remove(pid) else {
            // A child on another node: only children of processes here are
            // missing from the table.
            if exits.stop == Stop::Abort {
                exits.elsewhere.push((pid, inherited.clone()));
            }
            continue;
        };
        if entry.is_alive() {
            exits.exit(&mut entry, pid, exit_code, &inherited, now);
        }
        exits.reaped.push(pid);
    }
    if let Some(entry) = table.get_mut(top) {
        entry.children.clear();
        entry.live_children = 0;
    }
}

/// Removes an exited process from the table and from its parent's children.
fn reap(table: &mut ProcessTable, pid: Pid) {
    let Some(entry) = table.remove(pid) else {
        return;
    };
    if let Some(parent) = table.get_mut(entry.ppid) {
        parent.children.remove(pid);
    }
}

/// Zombies waiting for their reaping deadline.
#[derive(Debug, Default)]
pub(crate) struct Reaper {
    due: Mutex<BTreeSet<(Instant, Pid)>>,
    wake: Arc<Notify>,
}

impl Reaper {
    fn schedule(&self, at: Instant, pid: Pid) {
        let earliest = {
            let mut due = self.due.lock();
            due.insert((at, pid));
            due.first().is_some_and(|(first, _)| *first == at)
        };
        if earliest {
            self.wake.notify_one();
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.due.lock().first().map(|(at, _)| *at)
    }

    fn due(&self, now: Instant) -> Vec<Pid> {
        let mut due = self.due.lock();
        let mut out = Vec::new();
        while let Some((at, pid)) = due.first().copied() {
            if at > now {
                break;
            }
            due.pop_first();
            out.push(pid);
        }
        out
    }
}

impl Kernel {
    /// Fails a task (or reports a message) that was still queued when its receiver exited.
    fn fail_undelivered(&self, pid: Pid, env: Envelope) {
        let id = env.id;
        if (env.durable || matches!(env.item, Item::Resume(_))) && self.is_stopping() {
            // Still in the store: delivered (resumed) after the restart.
            return;
        }
        self.message_done(id, env.durable);
        match env.item {
            // A blocked requester learns of the exit from its dropped reply port.
            Item::Task {
                reply: ReplyTo::Waiter(_),
                ..
            } => {}
            Item::Task { task, reply, .. } => {
                self.deliver_reply(
                    pid,
                    task.request_id,
                    reply,
                    Err(format!("process {pid} exited before handling the task")),
                );
            }
            Item::Resume(resume) => {
                self.inbox().withdraw(resume.request, "kernel");
                if let Some(origin) = resume.origin {
                    self.deliver_reply(
                        pid,
                        origin.request_id,
                        ReplyTo::Mailbox(origin.from),
                        Err(format!("process {pid} exited before handling the task")),
                    );
                }
            }
            Item::Message(message) => {
                self.inner.events().emit(
                    pid,
                    EventKind::MessageDropped {
                        message_id: id,
                        from: message.from,
                        kind: message.kind,
                        reason: format!("process {pid} exited before reading it"),
                    },
                );
            }
        }
    }
}
