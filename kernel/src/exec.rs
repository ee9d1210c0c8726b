//! The `exec` runtime: a process whose agent is an OS process in any
//! language, talking to the kernel over gRPC.
//!
//! At spawn the kernel starts the command in its own process group, with
//! stdout and stderr going to `<data_dir>/logs/<pid>-<name>.log`, and with
//! `HIVEKERNEL_ADDR`, `HIVEKERNEL_PID` and `HIVEKERNEL_TOKEN` in its
//! environment, and `HIVEKERNEL_TLS_CA` (the PEM to trust for the server)
//! when the control plane serves TLS. The token is issued for that PID only
//! and revoked when the process ends. The agent attaches (`Attach`) to receive its mailbox and
//! answers tasks with `CompleteTask`; every other RPC it makes acts as its
//! process, under the same checks as an in-process agent.
//!
//! With `kernel.exec.sandbox`, the command starts through the sandbox helper
//! (`hivekernel_agents::sandbox`): Landlock lets it read the system paths,
//! its program, its working directory and what `kernel.exec.read_only`
//! grants, and write only its workspace and `kernel.exec.read_write`; the
//! data directory stays out of reach; it has no capabilities; and what it
//! starts ends with it (a PID namespace).
//!
//! An OS exit is the kernel process's exit with the OS status (its code, or
//! 128 plus the signal), and its restart policy decides what follows; any end of the
//! kernel process (kill, an ancestor's exit, shutdown) stops the OS process
//! group before the exit is complete. A restart stops and starts only the
//! OS process: the mailbox, the runner and what the agent was handed and
//! did not answer stay, and go to the next OS process once it attaches.
//!
//! Layout: `command` (checks before anything starts), `agent` (the attach
//! stream, pending tasks and the `Runtime` the runner drives), `os` (start,
//! watch and stop the OS process).

mod agent;
pub use crate::command;
mod os;
mod rotate;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hivekernel_agents::sandbox::{Grants, KeepOut, Sandbox};
use hivekernel_agents::{ExecCommand, Pid, ProcessContext};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use tokio_util::sync::CancellationToken;

pub(crate) use agent::ExecAgent;
pub(crate) use agent::ExecProc;
pub use agent::{Attached, Delivery};
use os::LaunchSpec;
pub(crate) use os::{Gone, Launch, OnExit, describe, reclaim_orphans};
pub use rotate::LogRotation;

use crate::auth::Authenticator;
use crate::error::{KernelError, Result};

pub use crate::command::EXEC_RUNTIME;

pub use hivekernel_agents::process::EXIT_CANNOT_START;

/// The `exec` runtime of one kernel: what it hands its OS processes, and
/// the kernel side of every live `exec` process.
#[derive(Debug)]
pub struct ExecRuntime {
    auth: Authenticator,
    /// `HIVEKERNEL_ADDR`: where the agents reach the control plane (`host:port`).
    addr: String,
    /// `HIVEKERNEL_TLS_CA`: what the agents trust for the server, when it serves TLS.
    tls_ca: Option<PathBuf>,
    /// How the OS processes are confined; `None`: they are not.
    sandbox: Option<ExecSandbox>,
    /// When their logs are rotated (`kernel.exec.log`).
    rotation: LogRotation,
    procs: Mutex<FxHashMap<Pid, Arc<ExecProc>>>,
    /// Cancelled once the node is fenced ([`ExecRuntime::halt`]): every OS
    /// process is killed at once, and nothing starts again.
    halt: CancellationToken,
}

/// How `exec` processes are confined (`kernel.exec` with `sandbox: true`).
#[derive(Debug, Clone)]
pub struct ExecSandbox {
    /// Starts the commands.
    pub sandbox: Sandbox,
    /// Granted on top of the system paths, the workspace, the program and
    /// the working directory.
    pub grants: Grants,
    /// Out of reach even inside a grant (the data directory, the workspaces' root).
    pub keep_out: KeepOut,
}

impl ExecRuntime {
    /// The SHA-256 (hex) of the token its OS process of now was given.
    pub(crate) fn token_digest(&self, pid: Pid) -> Option<String> {
        self.auth.digest(pid)
    }

    /// A runtime whose processes get tokens from `auth` (the one the gRPC
    /// server checks) and reach the server at `listen` (an unspecified
    /// address becomes loopback).
    pub fn new(auth: Authenticator, listen: SocketAddr) -> Self {
        let mut addr = listen;
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        ExecRuntime {
            auth,
            addr: addr.to_string(),
            tls_ca: None,
            sandbox: None,
            rotation: LogRotation::DEFAULT,
            procs: Mutex::default(),
            halt: CancellationToken::new(),
        }
    }

    /// The server serves TLS: agents get `HIVEKERNEL_TLS_CA`, the PEM file
    /// to trust for it (`None`: plain text, as by default).
    pub fn with_tls_ca(mut self, ca: Option<PathBuf>) -> Self {
        self.tls_ca = ca;
        self
    }

    /// Rotates every OS process's log as `rotation` says.
    pub fn with_log_rotation(mut self, rotation: LogRotation) -> Self {
        self.rotation = rotation;
        self
    }

    /// Confines every OS process by `sandbox` (`None`: none is).
    pub fn with_sandbox(mut self, sandbox: Option<ExecSandbox>) -> Self {
        self.sandbox = sandbox;
        self
    }

    /// The kernel side of a new process; the OS process starts with [`Launch::start`].
    /// Called under the table lock, so it only allocates.
    pub(crate) fn prepare(
        self: &Arc<Self>,
        ctx: &ProcessContext,
        checked: Checked,
        timeout: Duration,
        data_dir: &Path,
    ) -> (ExecAgent, Launch) {
        let spec = LaunchSpec {
            program: checked.program,
            command: checked.command,
            log_path: log_path(data_dir, ctx.pid, &ctx.name),
            workspace: ctx.workspace_dir(),
        };
        let proc = Arc::new(ExecProc::new(ctx.pid, ctx.name.clone(), timeout, spec));
        self.procs.lock().insert(ctx.pid, proc.clone());
        let launch = Launch {
            runtime: self.clone(),
            proc: proc.clone(),
            generation: 0,
        };
        (ExecAgent(proc), launch)
    }

    /// The next start of the OS process of `pid`, an exec process waiting
    /// to be restarted ([`ExecRuntime::pause`]); `None` when it is not an
    /// exec process. Called under the table lock, so it only allocates.
    pub(crate) fn relaunch(self: &Arc<Self>, pid: Pid) -> Option<Launch> {
        let proc = self.procs.lock().get(&pid).cloned()?;
        let generation = proc.os.lock().generation();
        Some(Launch {
            runtime: self.clone(),
            proc,
            generation,
        })
    }

    /// The OS process of `pid` has ended: its token stops working and its
    /// stream ends, and what it was handed stays pending; `false` when `pid`
    /// is not a live exec process (a kill took it out first).
    pub(crate) fn suspend(&self, pid: Pid) -> bool {
        let Some(proc) = self.procs.lock().get(&pid).cloned() else {
            return false;
        };
        self.auth.revoke(pid);
        proc.end_stream();
        true
    }

    /// Whether the current OS process of `pid` is of `generation` and has
    /// ended on its own: its exit is the one to act on.
    pub(crate) fn exited_as(&self, pid: Pid, generation: u64) -> bool {
        let proc = self.procs.lock().get(&pid).cloned();
        proc.is_some_and(|proc| proc.os.lock().exited_as(generation))
    }

    pub(crate) fn get(&self, pid: Pid) -> Option<Arc<ExecProc>> {
        self.procs.lock().get(&pid).cloned()
    }

    /// Ends the OS processes of the `exec` processes among `pids`: their
    /// tokens stop working and their streams end at once, then every group
    /// gets SIGTERM, the grace period and SIGKILL, in parallel. Returns when
    /// all of them are gone.
    pub(crate) async fn stop(&self, pids: impl Iterator<Item = Pid>) {
        let procs: Vec<Arc<ExecProc>> = {
            let mut live = self.procs.lock();
            if live.is_empty() {
                return;
            }
            pids.filter_map(|pid| live.remove(&pid)).collect()
        };
        let mut watchers = Vec::new();
        for proc in &procs {
            self.auth.revoke(proc.pid);
            proc.detach();
            watchers.extend(proc.os.lock().end());
        }
        // Each watcher ends once its group is gone.
        for watcher in watchers {
            watcher.await;
        }
    }

    /// Kills every OS process at once, for a node fenced out of its
    /// cluster (docs/CLUSTER.md, "Losing a node"): their processes run on
    /// another node now, and each moment more here is work done twice.
    /// Each group gets SIGKILL without a grace period (one under way is cut
    /// short), its watcher reports no exit, and nothing starts again: the
    /// stop that follows finds them gone. Returns how many were running.
    pub(crate) fn halt(&self) -> usize {
        self.halt.cancel();
        let procs = self.procs.lock();
        for pid in procs.keys() {
            self.auth.revoke(*pid);
        }
        procs.len()
    }

    /// Stops the OS process of `pid`, an exec process about to be
    /// restarted, and makes way for the next one at once (under the table
    /// lock, with the decision, so a revive that follows always finds the
    /// new generation): its token stops working and its stream ends, and
    /// its group gets SIGTERM, the grace period and SIGKILL. The kernel side
    /// stays (mailbox, runner, what was handed to the agent and not
    /// answered), for the next OS process, which [`ExecRuntime::relaunch`]
    /// starts. Resolves once the old OS process is gone, when one ran.
    pub(crate) fn pause(&self, pid: Pid) -> Option<Gone> {
        let proc = self.procs.lock().get(&pid).cloned()?;
        self.auth.revoke(pid);
        proc.end_stream();
        proc.os.lock().next_generation()
    }
}

/// A command that passed [`command::check`], with its program resolved.
#[derive(Debug)]
pub(crate) struct Checked {
    program: PathBuf,
    command: ExecCommand,
}

/// Checks an `exec` spawn's command before the spawn takes the table lock.
pub(crate) fn check(command: Option<ExecCommand>) -> Result<Checked> {
    let command = command.ok_or_else(|| {
        KernelError::InvalidArgument(
            "runtime exec needs a command: the program and its arguments".into(),
        )
    })?;
    let program = command::check(&command).map_err(KernelError::InvalidArgument)?;
    Ok(Checked { program, command })
}

/// `<data_dir>/logs/<pid>-<name>.log`, the name reduced to characters safe in a file name.
pub fn log_path(data_dir: &Path, pid: Pid, name: &str) -> PathBuf {
    let safe: String = name
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    data_dir.join("logs").join(format!("{pid}-{safe}.log"))
}
