//! The OS process behind an `exec` process: start it in its own process
//! group with its log file and credentials, watch it, and stop it.
//!
//! A restart replaces the OS process and keeps the rest: each OS process is
//! one generation of its exec process, and a watcher or a launch of an
//! older generation changes nothing.
//!
//! Stopping sends SIGTERM to the whole group, gives it the kernel's
//! `shutdown_grace_ms`, then sends SIGKILL; whichever way the leader ends,
//! the group is sent SIGKILL afterwards so no helper it forked lives on.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use hivekernel_agents::ExecCommand;
use hivekernel_agents::sandbox::Policy;
use rustix::process::Signal;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::ExecRuntime;
use super::agent::ExecProc;
use crate::command::TLS_CA_ENV;

/// Resolves once a watcher has ended (its OS process group is gone); any
/// number of waiters may hold it.
pub(crate) type Gone = Shared<BoxFuture<'static, ()>>;

/// Where the current OS process of an `exec` process is in its life.
#[derive(Debug)]
enum OsState {
    /// Not started yet.
    NotStarted,
    /// Running, watched by the task this resolves with.
    Running(Gone),
    /// Ended on its own (or could not start): its supervisor decides what follows.
    Exited,
    /// The exec process is being stopped or is gone: never start it (again).
    Done,
}

/// The OS side of one `exec` process: its current OS process.
#[derive(Debug)]
pub(crate) struct Os {
    state: OsState,
    /// Cancelled to stop the current OS process.
    stop: CancellationToken,
    /// Which OS process of the exec process is current; a restart starts the next.
    generation: u64,
    /// Watchers of earlier generations still stopping their OS processes.
    retiring: Vec<Gone>,
}

impl Os {
    pub(crate) fn new() -> Self {
        Os {
            state: OsState::NotStarted,
            stop: CancellationToken::new(),
            generation: 0,
            retiring: Vec::new(),
        }
    }

    /// Stops the current OS process for a restart and makes way for the
    /// next at once (called under the table lock, with the restart
    /// decision); resolves once the old one is gone, when it was running.
    /// After [`Os::end`] nothing starts again.
    pub(crate) fn next_generation(&mut self) -> Option<Gone> {
        if matches!(self.state, OsState::Done) {
            return None;
        }
        self.stop.cancel();
        self.stop = CancellationToken::new();
        self.generation += 1;
        match std::mem::replace(&mut self.state, OsState::NotStarted) {
            OsState::Running(watcher) => {
                self.retiring.retain(|gone| gone.peek().is_none());
                self.retiring.push(watcher.clone());
                Some(watcher)
            }
            _ => None,
        }
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether `generation` is current and not started yet.
    fn startable(&self, generation: u64) -> bool {
        self.generation == generation && matches!(self.state, OsState::NotStarted)
    }

    /// Whether the OS process of `generation` is current and has ended on
    /// its own: its exit is the one to act on.
    pub(crate) fn exited_as(&self, generation: u64) -> bool {
        self.generation == generation && matches!(self.state, OsState::Exited)
    }

    /// Stops the current OS process for good; resolves once it and any
    /// earlier one still stopping are gone.
    pub(crate) fn end(&mut self) -> Vec<Gone> {
        self.stop.cancel();
        let mut gone = std::mem::take(&mut self.retiring);
        if let OsState::Running(watcher) = std::mem::replace(&mut self.state, OsState::Done) {
            gone.push(watcher);
        }
        gone
    }

    /// The current OS process of `generation` has ended (or did not
    /// start); `false` when it is not current (a restart or a kill came
    /// first), and then nothing is reported.
    fn exited(&mut self, generation: u64) -> bool {
        let current = self.generation == generation
            && matches!(self.state, OsState::Running(_) | OsState::NotStarted);
        if current {
            self.state = OsState::Exited;
        }
        current
    }
}

/// How to start the OS process, kept for every restart.
#[derive(Debug)]
pub(crate) struct LaunchSpec {
    pub(crate) program: PathBuf,
    pub(crate) command: ExecCommand,
    pub(crate) log_path: PathBuf,
    /// Working directory when the command names none.
    pub(crate) workspace: Option<PathBuf>,
}

/// One start of the OS process, once the spawn (or restart) is in the table.
#[derive(Debug)]
pub(crate) struct Launch {
    pub(crate) runtime: Arc<ExecRuntime>,
    pub(crate) proc: Arc<ExecProc>,
    /// The generation it starts; stale once a restart or kill came first.
    pub(crate) generation: u64,
}

/// What the watcher does when the OS process ends on its own: end the
/// kernel process with this exit code and reason.
pub(crate) type OnExit =
    Box<dyn FnOnce(i32, String) -> futures::future::BoxFuture<'static, ()> + Send>;

impl Launch {
    /// Starts the OS process and its watcher (owned by `tracker`); `grace`
    /// is its SIGTERM-to-SIGKILL time. `Err` says why it could not start.
    pub(crate) fn start(
        &self,
        tracker: &TaskTracker,
        grace: Duration,
        on_exit: OnExit,
    ) -> Result<(), String> {
        let Launch {
            runtime,
            proc,
            generation,
        } = self;
        let LaunchSpec {
            program,
            command,
            log_path,
            workspace,
        } = &proc.spec;
        let pid = proc.pid;
        // A kill or restart that came first wins: nothing is started for a
        // process that has ended, nor twice (checked again below, with the
        // token issued under the same lock, so a stale launch never
        // replaces the token of a newer OS process).
        if !proc.os.lock().startable(*generation) {
            return Ok(());
        }
        let log = open_log(log_path)
            .map_err(|err| format!("cannot open its log {}: {err}", log_path.display()))?;
        let stderr = log
            .try_clone()
            .map_err(|err| format!("cannot open its log {}: {err}", log_path.display()))?;
        let cwd = command.cwd.clone().or_else(|| workspace.clone());
        // Its workspace exists before a sandbox grants it (a grant needs
        // something to hold on to).
        let sandboxed_workspace = workspace.as_ref().filter(|_| runtime.sandbox.is_some());
        for dir in cwd.iter().chain(sandboxed_workspace) {
            std::fs::create_dir_all(dir)
                .map_err(|err| format!("cannot create its directory {}: {err}", dir.display()))?;
        }
        let mut cmd = match &runtime.sandbox {
            None => {
                let mut cmd = Command::new(program);
                cmd.arg0(&command.argv[0]).args(&command.argv[1..]);
                cmd
            }
            Some(confined) => {
                let own: Vec<&Path> = workspace.as_deref().into_iter().collect();
                let mut grants = confined.grants.clone();
                grants.read_only.push(program.clone());
                grants.read_only.extend(cwd.iter().cloned());
                let policy = Policy::confined(&own, &grants, &confined.keep_out);
                confined
                    .sandbox
                    .command(
                        &policy,
                        program.as_os_str(),
                        command.argv[0].as_ref(),
                        &command.argv[1..],
                    )
                    .map_err(|err| format!("cannot confine it: {err}"))?
            }
        };
        cmd.envs(&command.env)
            .env("HIVEKERNEL_ADDR", &runtime.addr)
            .env("HIVEKERNEL_PID", pid.to_string())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr)
            .process_group(0)
            .kill_on_drop(true);
        if let Some(dir) = &cwd {
            cmd.current_dir(dir);
        }
        // Agents choose TLS by this variable: one inherited from the kernel's
        // environment must not make them try TLS against a plain-text server.
        match &runtime.tls_ca {
            Some(ca) => cmd.env(TLS_CA_ENV, ca),
            None => cmd.env_remove(TLS_CA_ENV),
        };
        // systemd's notification socket is the kernel's: an agent that
        // wrote READY=1 or STOPPING=1 to it would speak for the kernel.
        cmd.env_remove(crate::command::NOTIFY_SOCKET_ENV);
        let mut os = proc.os.lock();
        if !os.startable(*generation) || runtime.halt.is_cancelled() {
            return Ok(());
        }
        let token = runtime
            .auth
            .issue(pid)
            .map_err(|err| format!("cannot issue its token: {err}"))?;
        cmd.env("HIVEKERNEL_TOKEN", token);
        let child = cmd
            .spawn()
            .map_err(|err| format!("cannot start {}: {err}", program.display()))?;
        let watched = Watched {
            runtime: runtime.clone(),
            proc: proc.clone(),
            stop: os.stop.clone(),
            generation: *generation,
        };
        let watcher = tracker.spawn(watch(on_exit, watched, child, grace));
        os.state = OsState::Running(
            async move {
                // A panic in the watcher changes nothing for those waiting.
                let _ = watcher.await;
            }
            .boxed()
            .shared(),
        );
        Ok(())
    }

    /// After [`Launch::start`] failed: whether that is the exit to report
    /// (the launch is still current; its token and stream are ended).
    pub(crate) fn failed(&self) -> bool {
        self.proc.os.lock().exited(self.generation) && self.runtime.suspend(self.proc.pid)
    }
}

/// What a watcher watches: one generation of one exec process.
struct Watched {
    runtime: Arc<ExecRuntime>,
    proc: Arc<ExecProc>,
    stop: CancellationToken,
    generation: u64,
}

/// The log file, appended to, readable by the kernel's user only.
fn open_log(path: &Path) -> io::Result<File> {
    if let Some(dir) = path.parent() {
        DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    }
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

/// How often a running process's log size is looked at.
const ROTATION_CHECK: Duration = Duration::from_secs(5);

/// Waits for the OS process to exit on its own, or stops it when the kernel
/// process ends or restarts; an exit on its own is the kernel process's
/// exit with its status, for its supervisor to act on.
async fn watch(on_exit: OnExit, watched: Watched, mut child: Child, grace: Duration) {
    let Watched {
        runtime,
        proc,
        stop,
        generation,
    } = watched;
    let group = child
        .id()
        .and_then(|id| rustix::process::Pid::from_raw(id as i32));
    let signal = |sig: Signal| {
        if let Some(group) = group {
            // ESRCH: the group is already gone, which is the goal.
            let _ = rustix::process::kill_process_group(group, sig);
        }
    };
    // Its log is looked at every few seconds while it runs, and rotated
    // once it grows past its limit (off the async threads: a copy).
    let mut rotation =
        tokio::time::interval_at(tokio::time::Instant::now() + ROTATION_CHECK, ROTATION_CHECK);
    rotation.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let own = loop {
        tokio::select! {
            status = child.wait() => break Some(status),
            () = stop.cancelled() => break None,
            () = runtime.halt.cancelled() => break None,
            _ = rotation.tick(), if runtime.rotation.max_bytes > 0 => {
                let (log, limits) = (proc.spec.log_path.clone(), runtime.rotation);
                let rotated =
                    tokio::task::spawn_blocking(move || super::rotate::rotate_if_over(&log, limits))
                        .await;
                match rotated {
                    Ok(Ok(true)) => tracing::debug!(pid = %proc.pid, "exec log rotated"),
                    Ok(Ok(false)) | Err(_) => {}
                    Ok(Err(err)) => tracing::warn!(
                        pid = %proc.pid,
                        log = %proc.spec.log_path.display(),
                        error = %err,
                        "cannot rotate the exec log"
                    ),
                }
            }
        }
    };
    let Some(status) = own else {
        // Halted (its node fenced): its process runs elsewhere now, and
        // gets no grace, even when the halt comes during one.
        if !runtime.halt.is_cancelled() {
            signal(Signal::TERM);
            tokio::select! {
                ended = tokio::time::timeout(grace, child.wait()) => if ended.is_err() {
                    tracing::warn!(pid = %proc.pid, grace_ms = grace.as_millis() as u64, "exec process ignored SIGTERM; sending SIGKILL");
                },
                () = runtime.halt.cancelled() => {}
            }
        }
        signal(Signal::KILL);
        let _ = child.wait().await;
        signal(Signal::KILL);
        settle(group).await;
        return;
    };
    signal(Signal::KILL);
    settle(group).await;
    // A kill or a restart that came first has already dealt with it.
    if !proc.os.lock().exited(generation) || !runtime.suspend(proc.pid) {
        return;
    }
    let (code, reason) = match status {
        Ok(status) => describe(status),
        Err(err) => (
            crate::EXIT_FAILED,
            format!("cannot wait for the OS process: {err}"),
        ),
    };
    tracing::info!(pid = %proc.pid, name = %proc.name, code, %reason, "exec process ended");
    on_exit(code, reason).await;
}

/// Helpers the leader left behind die of SIGKILL asynchronously: give them
/// a moment, so the group is usually gone when the exit completes. Bounded,
/// because a helper whose zombie nobody reaps still counts as a member.
async fn settle(group: Option<rustix::process::Pid>) {
    let Some(group) = group else { return };
    for _ in 0..40 {
        if rustix::process::test_kill_process_group(group).is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Sends SIGKILL to the process group of every OS process whose output goes
/// to a file directly in `logs` (`<data_dir>/logs`): exec agents a kernel
/// on this data directory started and could not stop, because it was
/// killed with SIGKILL (they run in their own groups and are never told).
/// Only one kernel runs on a data directory at a time (`kernel.lock`), so
/// every such process is a leftover. Never the caller's own group. Returns
/// how many groups were sent the signal.
pub(crate) fn reclaim_orphans(logs: &Path) -> usize {
    let (Ok(logs), Ok(entries)) = (std::fs::canonicalize(logs), std::fs::read_dir("/proc")) else {
        return 0;
    };
    let own = rustix::process::getpgrp();
    let mut groups = std::collections::BTreeSet::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<i32>().ok())
            .and_then(rustix::process::Pid::from_raw)
        else {
            continue;
        };
        // Another user's process, or one that is gone: not readable, not ours.
        let Ok(output) = std::fs::read_link(entry.path().join("fd/1")) else {
            continue;
        };
        if output.parent() != Some(logs.as_path()) {
            continue;
        }
        if let Ok(group) = rustix::process::getpgid(Some(pid))
            && group != own
        {
            groups.insert(group.as_raw_nonzero());
        }
    }
    for group in &groups {
        if let Some(group) = rustix::process::Pid::from_raw(group.get()) {
            let _ = rustix::process::kill_process_group(group, Signal::KILL);
        }
    }
    groups.len()
}

/// The kernel exit code and reason for an OS exit status: its code, or 128
/// plus the signal that ended it, as shells report it.
pub(crate) fn describe(status: ExitStatus) -> (i32, String) {
    match (status.code(), status.signal()) {
        (Some(code), _) => (code, format!("OS process exited with status {code}")),
        (None, Some(sig)) => (
            128 + sig,
            format!("OS process killed by signal {sig}{}", signal_name(sig)),
        ),
        (None, None) => (crate::EXIT_FAILED, format!("OS process ended: {status}")),
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        1 => " (SIGHUP)",
        2 => " (SIGINT)",
        6 => " (SIGABRT)",
        9 => " (SIGKILL)",
        11 => " (SIGSEGV)",
        15 => " (SIGTERM)",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_become_codes_and_reasons() {
        let (code, reason) = describe(ExitStatus::from_raw(3 << 8));
        assert_eq!(
            (code, reason.as_str()),
            (3, "OS process exited with status 3")
        );
        let (code, reason) = describe(ExitStatus::from_raw(9));
        assert_eq!(code, 137);
        assert!(reason.contains("signal 9 (SIGKILL)"), "{reason}");
    }
}
