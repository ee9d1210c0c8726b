//! The OS process behind an `exec` process: start it in its own process
//! group with its log file and credentials, watch it, and stop it.
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

use hivekernel_agents::ExecCommand;
use hivekernel_agents::sandbox::Policy;
use rustix::process::Signal;
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;

use super::ExecRuntime;
use super::agent::ExecProc;
use crate::command::TLS_CA_ENV;

/// Where the OS process of an `exec` process is in its life.
#[derive(Debug)]
pub(crate) enum OsState {
    /// Not started yet.
    NotStarted,
    /// Running, watched by this task.
    Running(JoinHandle<()>),
    /// Being stopped or gone: never start it (again).
    Done,
}

/// Everything needed to start the OS process once the spawn is in the table.
#[derive(Debug)]
pub(crate) struct Launch {
    pub(crate) runtime: Arc<ExecRuntime>,
    pub(crate) proc: Arc<ExecProc>,
    pub(crate) program: PathBuf,
    pub(crate) command: ExecCommand,
    pub(crate) log_path: PathBuf,
    /// Working directory when the command names none.
    pub(crate) workspace: Option<PathBuf>,
}

/// What the watcher does when the OS process ends on its own: end the
/// kernel process with this exit code and reason.
pub(crate) type OnExit =
    Box<dyn FnOnce(i32, String) -> futures::future::BoxFuture<'static, ()> + Send>;

impl Launch {
    /// Starts the OS process and its watcher (owned by `tracker`); `grace`
    /// is its SIGTERM-to-SIGKILL time. `Err` says why it could not start.
    pub(crate) fn start(
        self,
        tracker: &TaskTracker,
        grace: Duration,
        on_exit: OnExit,
    ) -> Result<(), String> {
        let Launch {
            runtime,
            proc,
            program,
            command,
            log_path,
            workspace,
        } = self;
        let pid = proc.pid;
        let token = runtime
            .auth
            .issue(pid)
            .map_err(|err| format!("cannot issue its token: {err}"))?;
        let log = open_log(&log_path)
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
                let mut cmd = Command::new(&program);
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
            .env("HIVEKERNEL_TOKEN", token)
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
        let mut os = proc.os.lock();
        // A kill that came first wins: nothing is started for a process that has ended.
        if !matches!(*os, OsState::NotStarted) {
            return Ok(());
        }
        let child = cmd
            .spawn()
            .map_err(|err| format!("cannot start {}: {err}", program.display()))?;
        let watcher = watch(on_exit, runtime.clone(), proc.clone(), child, grace);
        *os = OsState::Running(tracker.spawn(watcher));
        Ok(())
    }
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

/// Waits for the OS process to exit on its own, or stops it when the kernel
/// process ends; an exit on its own ends the kernel process with its status.
async fn watch(
    on_exit: OnExit,
    runtime: Arc<ExecRuntime>,
    proc: Arc<ExecProc>,
    mut child: Child,
    grace: Duration,
) {
    let group = child
        .id()
        .and_then(|id| rustix::process::Pid::from_raw(id as i32));
    let signal = |sig: Signal| {
        if let Some(group) = group {
            // ESRCH: the group is already gone, which is the goal.
            let _ = rustix::process::kill_process_group(group, sig);
        }
    };
    let own = tokio::select! {
        status = child.wait() => Some(status),
        () = proc.stop.cancelled() => None,
    };
    let Some(status) = own else {
        signal(Signal::TERM);
        if tokio::time::timeout(grace, child.wait()).await.is_err() {
            tracing::warn!(pid = %proc.pid, grace_ms = grace.as_millis() as u64, "exec process ignored SIGTERM; sending SIGKILL");
            signal(Signal::KILL);
            let _ = child.wait().await;
        }
        signal(Signal::KILL);
        settle(group).await;
        return;
    };
    signal(Signal::KILL);
    settle(group).await;
    *proc.os.lock() = OsState::Done;
    // Whoever takes the process out of the table of exec processes ends it;
    // if a kill did already, there is nothing left to report.
    if !runtime.forget(proc.pid) {
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
