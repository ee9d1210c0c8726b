//! `exec` operations: attaching an external agent's stream, its task
//! answers and message acknowledgements, and starting and stopping its OS
//! process.

use std::sync::Arc;
use std::time::Duration;

use hivekernel_agents::{MessageId, Pid, RequestId, TaskReply};

use super::cluster::FORWARDED_SEND;
use super::{Caller, Kernel};
use crate::cluster::rpc::Op;
use crate::error::{KernelError, Result};
use crate::exec::{
    Attached, EXEC_RUNTIME, EXIT_CANNOT_START, ExecProc, ExecRuntime, Launch, OnExit, log_path,
};

/// Most message ids one acknowledgement may carry.
pub(crate) const MAX_ACKS: usize = 10_000;
/// Bytes of an `exec` agent's log one read returns when not told.
pub(crate) const DEFAULT_LOG_READ: u64 = 64 << 10;
/// Bytes of an `exec` agent's log one read returns at most.
pub(crate) const MAX_LOG_READ: u64 = 1 << 20;
/// Bytes one read of another node's `exec` log returns at most: its
/// answer is one NATS message (1 MiB by default), and escaping in JSON
/// makes a control byte six.
const REMOTE_LOG_READ: u64 = 128 << 10;

/// A piece of an `exec` agent's log file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LogChunk {
    /// The bytes read, as text (invalid UTF-8 replaced).
    pub text: String,
    /// Where in the file they start.
    pub offset: u64,
    /// The file's size when read: where the next read starts.
    pub size: u64,
}

/// `exec` agents through the kernel ([`Kernel::exec`]): attaching,
/// acknowledging, answering tasks, their logs, and launching and stopping their
/// OS processes.
#[derive(Debug, Clone, Copy)]
pub struct ExecHandle<'k> {
    kernel: &'k Kernel,
}

impl Kernel {
    /// The kernel's `exec` agents.
    pub fn exec(&self) -> ExecHandle<'_> {
        ExecHandle { kernel: self }
    }
}

impl<'k> ExecHandle<'k> {
    fn runtime(self) -> Result<&'k Arc<ExecRuntime>> {
        self.kernel.inner.runtimes().exec().ok_or_else(|| {
            KernelError::FailedPrecondition("this kernel has no exec runtime".into())
        })
    }

    /// The exec process `caller` is, refusing anyone else.
    fn caller(self, caller: Caller, what: &str) -> Result<Arc<ExecProc>> {
        let Caller::Process(pid) = caller else {
            return Err(KernelError::PermissionDenied(format!(
                "only an exec process's own token may {what}; the admin token acts as the kernel"
            )));
        };
        self.runtime()?.get(pid).ok_or_else(|| {
            KernelError::FailedPrecondition(format!("process {pid} is not a running exec process"))
        })
    }

    /// Opens the attach stream of `pid` for `caller`, which must be that
    /// process. A newer stream replaces an older one. With `auto_ack`, a
    /// message is done with once it is on the stream; without, once
    /// [`ExecHandle::ack_messages`] says so.
    pub fn attach(self, caller: Caller, pid: Pid, auto_ack: bool) -> Result<Attached> {
        if let Caller::Process(me) = caller
            && me != pid
        {
            return Err(KernelError::PermissionDenied(format!(
                "process {me} may only attach to itself, not to {pid}"
            )));
        }
        let proc = self.caller(caller, "attach")?;
        Ok(proc.attach(auto_ack))
    }

    /// Acknowledges messages delivered to `caller`, an exec process: each
    /// is done with, and leaves the store. Returns how many were waiting for
    /// an acknowledgement; the others (acknowledged already, not the
    /// caller's) are ignored.
    pub fn ack_messages(self, caller: Caller, ids: &[MessageId]) -> Result<u32> {
        if ids.len() > MAX_ACKS {
            return Err(KernelError::InvalidArgument(format!(
                "message_ids has {} entries, at most {MAX_ACKS}",
                ids.len()
            )));
        }
        let proc = self.caller(caller, "acknowledge messages")?;
        let acknowledged = ids.iter().filter(|id| proc.acknowledge(**id)).count();
        Ok(acknowledged as u32)
    }

    /// Answers task `request_id` of `caller`, an exec process.
    pub fn complete_task(
        self,
        caller: Caller,
        request_id: RequestId,
        reply: TaskReply,
    ) -> Result<()> {
        let (field, text) = match &reply {
            Ok(output) => ("output", output),
            Err(error) => ("error", error),
        };
        self.kernel
            .inner
            .settings()
            .limits
            .check_payload(field, text)?;
        let proc = self.caller(caller, "answer its tasks")?;
        if proc.complete(request_id, reply) {
            Ok(())
        } else {
            Err(KernelError::TaskNotPending {
                pid: proc.pid,
                request_id,
            })
        }
    }

    /// Fills in the log path of an `exec` process.
    pub(crate) fn with_log_path(
        self,
        mut info: hivekernel_agents::ProcessInfo,
    ) -> hivekernel_agents::ProcessInfo {
        if info.runtime == EXEC_RUNTIME {
            let path = log_path(&self.kernel.inner.settings().data_dir, info.pid, &info.name);
            // Absolute, so it means the same to a client in any directory.
            let path = std::path::absolute(&path).unwrap_or(path);
            info.log_path = Some(path.display().to_string());
        }
        info
    }

    /// Part of `pid`'s log file (an `exec` agent's stdout and stderr): at
    /// most `max_bytes` (0: [`DEFAULT_LOG_READ`]; at most
    /// [`MAX_LOG_READ`]) from `from`, or the last `max_bytes` when `from`
    /// is `None`. A read past the end (the log was rotated meanwhile)
    /// starts at the beginning again. The same readers as the transcript:
    /// a process reads its own and its descendants'. The log of a process
    /// another node of a cluster holds is read there (`exec_log`).
    pub async fn log(
        self,
        caller: Caller,
        pid: Pid,
        from: Option<u64>,
        max_bytes: u64,
    ) -> Result<LogChunk> {
        if self.kernel.inner.table().read().get(pid).is_none()
            && let Some(node) = self
                .kernel
                .node()
                .holding(caller, pid, "read the log of")
                .await?
        {
            let max_bytes = match max_bytes {
                0 => DEFAULT_LOG_READ,
                n => n,
            }
            .min(REMOTE_LOG_READ);
            let op = Op::ExecLog {
                pid,
                from,
                max_bytes,
            };
            return self.kernel.node().forward(&node, op, FORWARDED_SEND).await;
        }
        self.log_here(caller, pid, from, max_bytes).await
    }

    /// [`ExecHandle::log`] of a process this node holds, never asking
    /// another (what a node answers another's `exec_log` with).
    pub(super) async fn log_here(
        self,
        caller: Caller,
        pid: Pid,
        from: Option<u64>,
        max_bytes: u64,
    ) -> Result<LogChunk> {
        // Its log file is on the disk of the node holding it.
        if !self
            .kernel
            .transcripts()
            .may_read_own(caller, pid, super::transcript::Record::Log)?
        {
            return Err(KernelError::NotFound(pid));
        }
        let info = self.kernel.get_process(caller, pid).await?;
        let Some(path) = info.log_path else {
            return Err(KernelError::InvalidArgument(format!(
                "process {pid} runs {} rather than exec: it has no log file (its transcript \
                 is what it did)",
                info.runtime
            )));
        };
        let max = match max_bytes {
            0 => DEFAULT_LOG_READ,
            n => n.min(MAX_LOG_READ),
        };
        tokio::task::spawn_blocking(move || read_log(std::path::Path::new(&path), from, max))
            .await
            .map_err(|err| KernelError::FailedPrecondition(format!("reading the log: {err}")))?
    }

    /// Ends the OS processes a kernel before this one on the same data
    /// directory left running when it was killed (see
    /// [`crate::exec::reclaim_orphans`]); before any exec process starts.
    pub(crate) fn reclaim_orphans(self) {
        if self.kernel.inner.runtimes().exec().is_none() {
            return;
        }
        let logs = self.kernel.inner.settings().data_dir.join("logs");
        let groups = crate::exec::reclaim_orphans(&logs);
        if groups > 0 {
            tracing::warn!(
                groups,
                "ended exec agents a killed kernel left running (SIGKILL to their process groups)"
            );
        }
    }

    /// Ends the OS processes of the exec processes among `pids` (see [`ExecRuntime::stop`]).
    pub(crate) async fn stop(self, pids: impl Iterator<Item = Pid>) {
        if let Some(exec) = self.kernel.inner.runtimes().exec() {
            exec.stop(pids).await;
        }
    }

    /// The next start of exec process `pid`'s OS process, at its restart;
    /// `None` when it is not an exec process.
    pub(crate) fn relaunch(self, pid: Pid) -> Option<Launch> {
        self.kernel.inner.runtimes().exec()?.relaunch(pid)
    }

    /// Starts the OS process of a process just spawned or restarted; if it
    /// cannot start, the process exits with [`EXIT_CANNOT_START`] and the
    /// reason, and its restart policy decides what follows.
    pub(crate) async fn launch(self, launch: Launch) {
        let (pid, generation) = (launch.proc.pid, launch.generation);
        let grace = Duration::from_millis(self.kernel.settings().shutdown_grace_ms);
        // Holds the kernel weakly, like a runner: a process never keeps it alive.
        let kernel = self.kernel.downgrade();
        let on_exit: OnExit = Box::new(move |code, reason| {
            Box::pin(async move {
                if let Some(inner) = kernel.upgrade() {
                    Kernel { inner }
                        .exit_exec(pid, generation, code, reason)
                        .await;
                }
            })
        });
        if let Err(why) = launch.start(self.kernel.tracker(), grace, on_exit) {
            tracing::warn!(%pid, reason = %why, "exec process did not start");
            if launch.failed() {
                self.kernel
                    .exit_exec(pid, generation, EXIT_CANNOT_START, why)
                    .await;
            }
            return;
        }
        // Its new token's digest, in its listing, so every node honours it.
        if let Some(cluster) = self.kernel.inner.cluster() {
            drop(cluster.publish(pid));
        }
    }
}

/// What [`ExecHandle::log`] reads; a log not written yet is empty.
fn read_log(path: &std::path::Path, from: Option<u64>, max: u64) -> Result<LogChunk> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Ok(LogChunk {
                text: String::new(),
                offset: 0,
                size: 0,
            });
        }
        Err(err) => {
            return Err(KernelError::FailedPrecondition(format!(
                "cannot read the log {}: {err}",
                path.display()
            )));
        }
    };
    let failed = |err: std::io::Error| {
        KernelError::FailedPrecondition(format!("cannot read the log {}: {err}", path.display()))
    };
    let size = file.metadata().map_err(failed)?.len();
    let offset = match from {
        Some(from) if from <= size => from,
        Some(_) => 0,
        None => size.saturating_sub(max),
    };
    file.seek(SeekFrom::Start(offset)).map_err(failed)?;
    let mut bytes = Vec::new();
    file.take(max).read_to_end(&mut bytes).map_err(failed)?;
    Ok(LogChunk {
        text: String::from_utf8_lossy(&bytes).into_owned(),
        offset,
        size: offset + bytes.len() as u64,
    })
}
