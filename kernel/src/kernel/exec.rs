//! `exec` operations: attaching an external agent's stream, its task
//! answers, and starting and stopping its OS process.

use std::sync::Arc;
use std::time::Duration;

use hivekernel_agents::{Pid, RequestId, TaskReply};

use super::{Caller, Kernel};
use crate::error::{KernelError, Result};
use crate::exec::{
    Attached, EXEC_RUNTIME, EXIT_CANNOT_START, ExecProc, ExecRuntime, Launch, OnExit, log_path,
};

impl Kernel {
    fn exec_runtime(&self) -> Result<&Arc<ExecRuntime>> {
        self.inner.runtimes().exec().ok_or_else(|| {
            KernelError::FailedPrecondition("this kernel has no exec runtime".into())
        })
    }

    /// The exec process `caller` is, refusing anyone else.
    fn exec_caller(&self, caller: Caller, what: &str) -> Result<Arc<ExecProc>> {
        let Caller::Process(pid) = caller else {
            return Err(KernelError::PermissionDenied(format!(
                "only an exec process's own token may {what}; the admin token acts as the kernel"
            )));
        };
        self.exec_runtime()?.get(pid).ok_or_else(|| {
            KernelError::FailedPrecondition(format!("process {pid} is not a running exec process"))
        })
    }

    /// Opens the attach stream of `pid` for `caller`, which must be that
    /// process. A newer stream replaces an older one.
    pub fn attach(&self, caller: Caller, pid: Pid) -> Result<Attached> {
        if let Caller::Process(me) = caller
            && me != pid
        {
            return Err(KernelError::PermissionDenied(format!(
                "process {me} may only attach to itself, not to {pid}"
            )));
        }
        let proc = self.exec_caller(caller, "attach")?;
        Ok(proc.attach())
    }

    /// Answers task `request_id` of `caller`, an exec process.
    pub fn complete_task(
        &self,
        caller: Caller,
        request_id: RequestId,
        reply: TaskReply,
    ) -> Result<()> {
        let (field, text) = match &reply {
            Ok(output) => ("output", output),
            Err(error) => ("error", error),
        };
        self.inner.settings().limits.check_payload(field, text)?;
        let proc = self.exec_caller(caller, "answer its tasks")?;
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
        &self,
        mut info: hivekernel_agents::ProcessInfo,
    ) -> hivekernel_agents::ProcessInfo {
        if info.runtime == EXEC_RUNTIME {
            let path = log_path(&self.inner.settings().data_dir, info.pid, &info.name);
            // Absolute, so it means the same to a client in any directory.
            let path = std::path::absolute(&path).unwrap_or(path);
            info.log_path = Some(path.display().to_string());
        }
        info
    }

    /// Ends the OS processes of the exec processes among `pids` (see [`ExecRuntime::stop`]).
    pub(crate) async fn stop_exec(&self, pids: impl Iterator<Item = Pid>) {
        if let Some(exec) = self.inner.runtimes().exec() {
            exec.stop(pids).await;
        }
    }

    /// Starts the OS process of a process just spawned; if it cannot start,
    /// the process exits with [`EXIT_CANNOT_START`] and the reason.
    pub(crate) async fn launch_exec(&self, launch: Launch) {
        let pid = launch.proc.pid;
        let runtime = launch.runtime.clone();
        let grace = Duration::from_millis(self.settings().shutdown_grace_ms);
        // Holds the kernel weakly, like a runner: a process never keeps it alive.
        let kernel = self.downgrade();
        let on_exit: OnExit = Box::new(move |code, reason| {
            Box::pin(async move {
                if let Some(inner) = kernel.upgrade() {
                    Kernel { inner }.exit_external(pid, code, reason).await;
                }
            })
        });
        if let Err(why) = launch.start(self.tracker(), grace, on_exit) {
            tracing::warn!(%pid, reason = %why, "exec process did not start");
            if runtime.forget(pid) {
                self.exit_external(pid, EXIT_CANNOT_START, why).await;
            }
        }
    }
}
