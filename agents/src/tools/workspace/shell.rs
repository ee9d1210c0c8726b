//! `shell_exec`: a shell command in the workspace, confined, bounded in time
//! and output.
//!
//! The command runs as `sh -c COMMAND` in the workspace through the sandbox
//! helper ([`crate::sandbox`]): Landlock lets it read the system paths and
//! the paths config grants, and read and write only its own workspace (the
//! data directory and the other workspaces stay out of reach even inside a
//! broader grant); it has no capabilities; and it runs in a PID namespace of
//! its own, with a `/proc` of its own, so nothing it starts, `setsid` and
//! daemons included, outlives the command, and it sees no other process or
//! its command line. A host that cannot give all of that (no Landlock, no
//! namespaces) refuses the tool unless config says
//! `tool_agent.shell.unsandboxed: true` (then the command gets what the host
//! can give).
//!
//! stdin is closed. The kernel holds the helper's stdin as a lifeline: on
//! timeout, or when the call is cancelled, it is closed and the helper
//! kills everything; the helpers' process group gets SIGKILL as well.
//!
//! The environment is rebuilt rather than inherited, so the kernel's secrets
//! (LLM API keys, tokens) are not handed to a command an LLM wrote: `PATH`
//! (the kernel's, or a standard one), `HOME`, `PWD` and `TMPDIR` set to the
//! workspace, and `LANG` when the kernel has one (so tools print text in the
//! same encoding). Nothing else.
//!
//! Output (stdout and stderr, in arrival order) is kept up to
//! [`SHELL_OUTPUT_LIMIT`](super::SHELL_OUTPUT_LIMIT) bytes; the rest is read
//! and dropped, so a flood neither fills memory nor blocks the writer.

use crate::capability::Capability;
use crate::sandbox::{Grants, KeepOut, Policy, Sandbox, Support};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::{
    SHELL_DEFAULT_TIMEOUT_SECONDS, SHELL_MAX_TIMEOUT_SECONDS, SHELL_OUTPUT_LIMIT, blocking, decode,
};
use crate::tools::{Tool, ToolContext, ToolError};

/// Longest command accepted, in bytes.
const MAX_COMMAND_BYTES: usize = 64 * 1024;
/// How long to keep reading after the shell exited and its group was killed:
/// only a process that left the group can still hold the pipes open.
const DRAIN_GRACE: Duration = Duration::from_secs(1);
/// `PATH` when the kernel has none.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// How long the helper gets to end everything once its lifeline is cut,
/// before its process group gets SIGKILL.
const LIFELINE_GRACE: Duration = Duration::from_secs(2);

/// How `shell_exec` confines its commands (`tool_agent.shell`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShellSettings {
    /// Run commands where the host cannot confine them fully (no Landlock,
    /// no `/proc` of their own), with what it does give; without it such a
    /// host refuses the tool.
    pub unsandboxed: bool,
    /// Paths granted on top of the system ones and the workspace.
    pub grants: Grants,
    /// Out of reach even inside a grant: the kernel's data directory and
    /// the root of the workspaces.
    pub keep_out: KeepOut,
    /// The sandbox helper; `None`: the running executable (the `hivekernel` binary).
    pub helper: Option<PathBuf>,
}

/// Runs a shell command in the workspace.
#[derive(Debug, Default)]
pub struct ShellExec {
    settings: ShellSettings,
    /// What the host supports, probed at the first call.
    support: tokio::sync::OnceCell<Result<Support, String>>,
}

impl ShellExec {
    /// A `shell_exec` confined by `settings`.
    pub fn new(settings: ShellSettings) -> ShellExec {
        ShellExec {
            settings,
            support: tokio::sync::OnceCell::new(),
        }
    }

    fn sandbox(&self) -> Sandbox {
        match &self.settings.helper {
            Some(helper) => Sandbox::new(helper),
            None => Sandbox::this_executable(),
        }
    }

    /// The policy for a command in `workspace`, or why none may run.
    async fn policy(&self, sandbox: &Sandbox, workspace: &Path) -> Result<Policy, ToolError> {
        let support = self
            .support
            .get_or_init(|| probe(sandbox, self.settings.unsandboxed))
            .await
            .as_ref()
            .map_err(|problem| ToolError::new(format!("shell_exec cannot run: {problem}")))?;
        let confined =
            Policy::confined(&[workspace], &self.settings.grants, &self.settings.keep_out);
        let mut policy = match (support.shortfall(), self.settings.unsandboxed) {
            (None, _) => confined,
            // What the host does give, it still gets.
            (Some(_), true) => Policy {
                landlock: support.landlock.is_some(),
                own_proc: support.own_proc,
                ..confined
            },
            (Some(why), false) => {
                return Err(ToolError::new(format!(
                    "shell_exec is refused: {why}; an operator who accepts that sets \
                     tool_agent.shell.unsandboxed: true"
                )));
            }
        };
        policy.lifeline = true;
        Ok(policy)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    command: String,
    timeout_seconds: Option<u64>,
}

#[async_trait]
impl Tool for ShellExec {
    fn name(&self) -> &'static str {
        "shell_exec"
    }

    fn capability(&self) -> Option<Capability> {
        Some(Capability::ShellExec)
    }

    fn description(&self) -> &'static str {
        "Run a shell command (sh -c) in your workspace; answers exit code and output (capped at 64 KiB)."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "command": { "type": "string", "description": "The command line, run by sh -c in the workspace." },
                "timeout_seconds": {
                    "type": "integer", "minimum": 1, "maximum": SHELL_MAX_TIMEOUT_SECONDS,
                    "description": "Kill the command after this many seconds (default 30)."
                }
            },
            "required": ["command"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let args: Args = decode(self, args)?;
        if args.command.trim().is_empty() {
            return Err(ToolError::new("`command` is empty"));
        }
        if args.command.contains('\0') {
            return Err(ToolError::new("`command` contains a NUL byte"));
        }
        if args.command.len() > MAX_COMMAND_BYTES {
            return Err(ToolError::new(format!(
                "`command` is {} bytes; at most {MAX_COMMAND_BYTES}",
                args.command.len()
            )));
        }
        let seconds = match args.timeout_seconds {
            None => SHELL_DEFAULT_TIMEOUT_SECONDS,
            Some(s @ 1..=SHELL_MAX_TIMEOUT_SECONDS) => s,
            Some(s) => {
                return Err(ToolError::new(format!(
                    "`timeout_seconds` is {s}; it must be between 1 and {SHELL_MAX_TIMEOUT_SECONDS}"
                )));
            }
        };
        let workspace = ctx.workspace()?.to_path_buf();
        let sandbox = self.sandbox();
        let cwd = workspace.clone();
        blocking(move || {
            std::fs::create_dir_all(&cwd).map_err(|err| {
                ToolError::new(format!(
                    "cannot create the workspace {}: {err}",
                    cwd.display()
                ))
            })
        })
        .await?;
        let policy = self.policy(&sandbox, &workspace).await?;
        let command = shell(&sandbox, &policy, &args.command, &workspace)?;
        run(command, Duration::from_secs(seconds)).await
    }
}

/// What the host gives, said once in the log (the first call asks).
async fn probe(sandbox: &Sandbox, unsandboxed: bool) -> Result<Support, String> {
    let support = sandbox.probe().await;
    match &support {
        Ok(support) => match (support.shortfall(), unsandboxed) {
            (None, _) => {
                tracing::info!(sandbox = %support, "shell_exec runs commands in the sandbox")
            }
            (Some(why), true) => {
                tracing::warn!(sandbox = %support, why, "shell_exec runs commands with what this host gives (tool_agent.shell.unsandboxed)")
            }
            (Some(why), false) => {
                tracing::warn!(sandbox = %support, why, "shell_exec refuses to run; tool_agent.shell.unsandboxed: true would run commands with what this host gives")
            }
        },
        Err(problem) => tracing::warn!(%problem, "shell_exec cannot probe its sandbox"),
    }
    support
}

/// Runs `command` and reports how it ended.
async fn run(mut command: Command, timeout: Duration) -> Result<String, ToolError> {
    let mut child = command
        .spawn()
        .map_err(|err| ToolError::new(format!("cannot start sh: {err}")))?;
    let mut group = ProcessGroup::of(&child);
    let lifeline = child.stdin.take();
    let (Some(mut stdout), Some(mut stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(ToolError::new("sh started without output pipes"));
    };
    let mut output = Output::default();
    let (mut out_buf, mut err_buf) = (vec![0; 8192], vec![0; 8192]);
    let (mut out_open, mut err_open) = (true, true);
    let mut status: Option<ExitStatus> = None;
    let mut stop_at = Instant::now() + timeout;
    loop {
        if status.is_some() && !out_open && !err_open {
            break;
        }
        tokio::select! {
            waited = child.wait(), if status.is_none() => {
                status = Some(waited.map_err(|err| ToolError::new(format!("waiting for sh: {err}")))?);
                group.kill();
                stop_at = stop_at.min(Instant::now() + DRAIN_GRACE);
            }
            read = stdout.read(&mut out_buf), if out_open => match read {
                Ok(n) if n > 0 => output.push(&out_buf[..n]),
                _ => out_open = false,
            },
            read = stderr.read(&mut err_buf), if err_open => match read {
                Ok(n) if n > 0 => output.push(&err_buf[..n]),
                _ => err_open = false,
            },
            () = tokio::time::sleep_until(stop_at) => break,
        }
    }
    let Some(status) = status else {
        // The helper ends everything once its lifeline is cut; the group's
        // SIGKILL is for a helper that cannot.
        drop(lifeline);
        let _ = tokio::time::timeout(LIFELINE_GRACE, child.wait()).await;
        group.kill();
        // SIGKILL cannot be ignored; reap the shell so it is not left a zombie.
        let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
        return Err(ToolError::new(format!(
            "command timed out after {}s; its whole process group was killed\n{}",
            timeout.as_secs(),
            output.render()
        )));
    };
    let mut text = match (status.code(), signal(&status)) {
        (Some(code), _) => format!("exit code: {code}\n"),
        (None, Some(sig)) => format!("killed by signal {sig}\n"),
        (None, None) => "exit status unknown\n".to_owned(),
    };
    text.push_str(&output.render());
    if out_open || err_open {
        text.push_str(
            "\n[stopped reading: the output pipes are still held open by a process the command started]",
        );
    }
    Ok(text)
}

/// `sh -c command` in `workspace` through the sandbox helper, in a process
/// group of its own, with a rebuilt environment and a lifeline on stdin.
fn shell(
    sandbox: &Sandbox,
    policy: &Policy,
    command: &str,
    workspace: &Path,
) -> Result<Command, ToolError> {
    let mut cmd = sandbox
        .command(policy, "sh".as_ref(), "sh".as_ref(), ["-c", command])
        .map_err(ToolError::new)?;
    cmd.current_dir(workspace)
        .env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into()),
        )
        .env("HOME", workspace)
        .env("PWD", workspace)
        .env("TMPDIR", workspace)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(lang) = std::env::var_os("LANG") {
        cmd.env("LANG", lang);
    }
    Ok(cmd)
}

/// The signal that ended the process, if one did.
fn signal(status: &ExitStatus) -> Option<i32> {
    std::os::unix::process::ExitStatusExt::signal(status)
}

/// The command's process group; killed once, at the latest when dropped
/// (which covers a cancelled call).
#[derive(Debug)]
struct ProcessGroup(Option<rustix::process::Pid>);

impl ProcessGroup {
    /// The group `child` leads (`process_group(0)` made its PID the group id).
    fn of(child: &Child) -> Self {
        let pid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(rustix::process::Pid::from_raw);
        ProcessGroup(pid)
    }

    /// SIGKILL to every process still in the group; later calls do nothing,
    /// so a group id freed and reused by someone else is never signalled.
    fn kill(&mut self) {
        if let Some(pgid) = self.0.take() {
            // ESRCH: the group is already empty.
            let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The first bytes of the output, and how many there were in all.
#[derive(Debug, Default)]
struct Output {
    kept: Vec<u8>,
    total: u64,
}

impl Output {
    fn push(&mut self, bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let room = SHELL_OUTPUT_LIMIT.saturating_sub(self.kept.len());
        self.kept.extend_from_slice(&bytes[..room.min(bytes.len())]);
    }

    fn render(&self) -> String {
        let mut text = String::from_utf8_lossy(&self.kept).into_owned();
        if self.total > self.kept.len() as u64 {
            text.push_str(&format!(
                "\n[output truncated: first {} of {} bytes shown]",
                self.kept.len(),
                self.total
            ));
        }
        text
    }
}
