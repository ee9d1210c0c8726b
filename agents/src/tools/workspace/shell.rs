//! `shell_exec`: a shell command in the workspace, bounded in time and output.
//!
//! The command runs as `sh -c COMMAND` in the workspace, with stdin closed,
//! in a process group of its own. Nothing it starts outlives the call: on
//! timeout the whole group gets SIGKILL (a process that ignores SIGTERM goes
//! too), and after the shell exits normally the group is killed as well, so
//! a backgrounded child (`cmd &`) cannot keep running, keep the output pipes
//! open, or act later. The same happens if the call itself is cancelled.
//!
//! The environment is rebuilt rather than inherited, so the kernel's secrets
//! (LLM API keys, tokens) are not handed to a command an LLM wrote: `PATH`
//! (the kernel's, or a standard one), `HOME` and `PWD` set to the workspace,
//! and `LANG` when the kernel has one (so tools print text in the same
//! encoding). Nothing else.
//!
//! Output (stdout and stderr, in arrival order) is kept up to
//! [`SHELL_OUTPUT_LIMIT`](super::SHELL_OUTPUT_LIMIT) bytes; the rest is read
//! and dropped, so a flood neither fills memory nor blocks the writer.

use crate::capability::Capability;
use std::path::Path;
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

/// Runs a shell command in the workspace.
#[derive(Debug, Clone, Copy, Default)]
pub struct ShellExec;

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
        run(&args.command, &workspace, Duration::from_secs(seconds)).await
    }
}

/// Runs `command` and reports how it ended.
async fn run(command: &str, workspace: &Path, timeout: Duration) -> Result<String, ToolError> {
    let mut child = shell(command, workspace)
        .spawn()
        .map_err(|err| ToolError::new(format!("cannot start sh: {err}")))?;
    let mut group = ProcessGroup::of(&child);
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
            "\n[stopped reading: the output pipes are held open by a process outside the command's process group]",
        );
    }
    Ok(text)
}

/// `sh -c command` in `workspace`, in its own process group, with a rebuilt environment.
fn shell(command: &str, workspace: &Path) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(command)
        .current_dir(workspace)
        .env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into()),
        )
        .env("HOME", workspace)
        .env("PWD", workspace)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(lang) = std::env::var_os("LANG") {
        cmd.env("LANG", lang);
    }
    cmd
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
