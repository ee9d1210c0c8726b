//! The `Syscalls` a process gets: the kernel API, acting as that process.

use std::sync::Weak;
use std::time::Duration;

use async_trait::async_trait;
use hivekernel_agents::llm::{ChatRequest, ChatResponse, LlmError};
use hivekernel_agents::{
    Artifact, ArtifactId, ArtifactInfo, CronInfo, CronSpec, ExitRecord, McpOutput, McpTools,
    MemoryEntry, MemoryHit, MessageId, NewArtifact, NewMemory, Outgoing, Pid, ProcessInfo,
    RequestId, SpawnRequest, SyscallError, Syscalls, TaskReply, TaskSpec, ToolCallReport,
    TurnRecord,
};

use crate::error::KernelError;
use crate::kernel::{Caller, Inner, Kernel};

/// Syscalls bound to one PID. Holds the kernel weakly so a process never keeps it alive.
#[derive(Debug)]
pub(crate) struct KernelSyscalls {
    kernel: Weak<Inner>,
    pid: Pid,
}

impl KernelSyscalls {
    pub(super) fn new(kernel: Weak<Inner>, pid: Pid) -> Self {
        KernelSyscalls { kernel, pid }
    }

    fn kernel(&self) -> Result<Kernel, SyscallError> {
        self.kernel
            .upgrade()
            .map(|inner| Kernel { inner })
            .ok_or_else(|| KernelError::ShuttingDown.into())
    }

    fn caller(&self) -> Caller {
        Caller::Process(self.pid)
    }
}

#[async_trait]
impl Syscalls for KernelSyscalls {
    fn pid(&self) -> Pid {
        self.pid
    }

    async fn spawn_child(&self, mut request: SpawnRequest) -> Result<Pid, SyscallError> {
        request.parent = self.pid;
        Ok(self.kernel()?.spawn_queued(self.caller(), request).await?)
    }

    async fn kill(
        &self,
        pid: Pid,
        reason: &str,
    ) -> Result<hivekernel_agents::Killed, SyscallError> {
        Ok(self.kernel()?.kill(self.caller(), pid, reason).await?)
    }

    fn dismiss(&self, pid: Pid, reason: &str) {
        let Ok(kernel) = self.kernel() else {
            return;
        };
        let (caller, reason) = (self.caller(), reason.to_owned());
        let owner = kernel.clone();
        // Owned by the kernel's tracker, which shutdown waits for.
        owner
            .inner
            .tracker()
            .spawn(async move { kernel.dismiss(caller, pid, &reason).await });
    }

    async fn load_state(&self, key: &str) -> Result<Option<String>, SyscallError> {
        Ok(self.kernel()?.load_state(self.pid, key).await?)
    }

    async fn save_state(&self, key: &str, value: Option<String>) -> Result<(), SyscallError> {
        Ok(self.kernel()?.save_state(self.pid, key, value).await?)
    }

    async fn exit(&self, code: i32, reason: &str) -> Result<(), SyscallError> {
        Ok(self.kernel()?.exit_process(self.pid, code, reason).await?)
    }

    async fn schedule_cron(&self, spec: CronSpec) -> Result<CronInfo, SyscallError> {
        Ok(self.kernel()?.cron().add(self.caller(), spec).await?)
    }

    async fn list_cron(&self) -> Result<Vec<CronInfo>, SyscallError> {
        Ok(self.kernel()?.cron().list(self.caller()))
    }

    async fn remove_cron(&self, name: &str) -> Result<(), SyscallError> {
        Ok(self.kernel()?.cron().remove(self.caller(), name).await?)
    }

    fn tool_called(&self, report: ToolCallReport) {
        if let Ok(kernel) = self.kernel() {
            // A resumed turn past its waiting call without taking its
            // request up (no rule covers the call now): nobody waits for
            // it, and another restart must not run the call again.
            if let Some(id) = crate::trace::take_resume() {
                kernel.inbox().withdraw(id, "kernel");
            }
            kernel.llm().tool_called(self.pid, report);
        }
    }

    fn record(&self, record: TurnRecord) {
        if let Ok(kernel) = self.kernel() {
            kernel.llm().record(self.pid, record);
        }
    }

    fn token_ratio(&self) -> f64 {
        self.kernel()
            .map_or(1.0, |kernel| kernel.llm().token_ratio(self.pid))
    }

    async fn chat(&self, request: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let kernel = self
            .kernel()
            .map_err(|_| LlmError::Refused("the kernel is shutting down".into()))?;
        kernel.llm().chat(self.pid, request).await
    }

    async fn send_message(&self, message: Outgoing) -> Result<MessageId, SyscallError> {
        Ok(self.kernel()?.send_message(self.caller(), message).await?)
    }

    async fn execute_task(&self, task: TaskSpec) -> Result<TaskReply, SyscallError> {
        let (_, reply) = self.kernel()?.execute_task(self.caller(), task).await?;
        Ok(reply)
    }

    async fn delegate_async(&self, task: TaskSpec) -> Result<RequestId, SyscallError> {
        Ok(self.kernel()?.delegate_async(self.caller(), task).await?)
    }

    async fn wait_child(
        &self,
        pid: Pid,
        timeout: Option<Duration>,
    ) -> Result<ExitRecord, SyscallError> {
        Ok(self
            .kernel()?
            .wait_child(self.caller(), pid, timeout)
            .await?)
    }

    async fn ask_human(
        &self,
        question: hivekernel_agents::syscalls::HumanQuestion,
        checkpoint: hivekernel_agents::syscalls::Checkpoint<'_>,
    ) -> Result<hivekernel_agents::syscalls::HumanAnswer, SyscallError> {
        use crate::inbox::{Ask, Decision};
        use hivekernel_agents::syscalls::HumanAnswer;
        let ask = Ask::Question {
            question: question.question,
            choices: question.choices,
        };
        let resolution = self
            .kernel()?
            .inbox()
            .ask(
                self.pid,
                ask,
                question.timeout,
                Default::default(),
                checkpoint.map(|turn| turn()),
            )
            .await?;
        Ok(match resolution.decision {
            Decision::Answered { answer } => HumanAnswer::Answered(answer),
            Decision::Denied { reason } => HumanAnswer::Declined(reason),
            Decision::Approved { note } => HumanAnswer::Answered(note),
            Decision::TimedOut | Decision::Withdrawn => HumanAnswer::TimedOut,
        })
    }

    async fn approve_tool(
        &self,
        tool: &str,
        arguments: &serde_json::Value,
        checkpoint: hivekernel_agents::syscalls::Checkpoint<'_>,
    ) -> Result<(), SyscallError> {
        use crate::inbox::{Ask, Decision};
        use hivekernel_agents::{ErrorKind, OnTimeout, approval};
        let kernel = self.kernel()?;
        let rules = {
            let table = kernel.inner.table().read();
            table
                .get(self.pid)
                .and_then(|entry| entry.proc.approvals.clone())
        };
        // Its own rules, then those of whoever asked for the work it does
        // (kernel/asked.rs).
        let Some(rule) = rules
            .as_deref()
            .and_then(|rules| approval::first_covering(rules, tool, arguments))
            .cloned()
            .or_else(|| {
                approval::first_covering(&crate::trace::approvals(), tool, arguments).cloned()
            })
        else {
            return Ok(());
        };
        let ask = Ask::Approval {
            tool: tool.to_owned(),
            arguments: hivekernel_agents::text::cut_str(
                &arguments.to_string(),
                super::MAX_SHOWN_ARGUMENTS,
            ),
        };
        let timeout = Duration::from_secs(rule.timeout_seconds);
        let resolution = kernel
            .inbox()
            .ask(
                self.pid,
                ask,
                timeout,
                rule.on_timeout,
                checkpoint.map(|turn| turn()),
            )
            .await?;
        let refused = |why: String| Err(SyscallError::new(ErrorKind::PermissionDenied, why));
        match resolution.decision {
            Decision::Approved { .. } => Ok(()),
            Decision::TimedOut if rule.on_timeout == OnTimeout::Approve => Ok(()),
            Decision::Denied { reason } if reason.is_empty() => {
                refused(format!("{tool} was denied by {}", resolution.by))
            }
            Decision::Denied { reason } => {
                refused(format!("{tool} was denied by {}: {reason}", resolution.by))
            }
            Decision::TimedOut => refused(format!(
                "{tool} needs a person's approval, and nobody gave it within {} seconds; \
                 it did not run",
                rule.timeout_seconds
            )),
            Decision::Answered { .. } | Decision::Withdrawn => {
                refused(format!("{tool} was not approved; it did not run"))
            }
        }
    }

    async fn get_process(&self, pid: Pid) -> Result<ProcessInfo, SyscallError> {
        Ok(self.kernel()?.get_process(self.caller(), pid).await?)
    }

    async fn list_children(&self) -> Result<Vec<ProcessInfo>, SyscallError> {
        let mut children = self.list_processes(self.pid, Some(1)).await?;
        children.retain(|p| p.pid != self.pid);
        Ok(children)
    }

    async fn list_processes(
        &self,
        root: Pid,
        max_depth: Option<u32>,
    ) -> Result<Vec<ProcessInfo>, SyscallError> {
        Ok(self
            .kernel()?
            .list_processes(self.caller(), root, max_depth)
            .await?)
    }

    async fn store_artifact(&self, artifact: NewArtifact) -> Result<ArtifactInfo, SyscallError> {
        Ok(self
            .kernel()?
            .artifacts()
            .store(self.caller(), None, artifact)
            .await?)
    }

    async fn get_artifact(&self, id: ArtifactId) -> Result<Artifact, SyscallError> {
        Ok(self.kernel()?.artifacts().get(self.caller(), id).await?)
    }

    async fn list_artifacts(&self, owner: Option<Pid>) -> Result<Vec<ArtifactInfo>, SyscallError> {
        Ok(self
            .kernel()?
            .artifacts()
            .list(self.caller(), owner, None)
            .await?)
    }

    async fn delete_artifact(&self, id: ArtifactId) -> Result<(), SyscallError> {
        Ok(self.kernel()?.artifacts().delete(self.caller(), id).await?)
    }

    async fn memory_store(&self, entry: NewMemory) -> Result<MemoryEntry, SyscallError> {
        Ok(self.kernel()?.memory().store(self.caller(), entry).await?)
    }

    async fn memory_forget(&self, key: &str) -> Result<(), SyscallError> {
        Ok(self.kernel()?.memory().forget(self.caller(), key).await?)
    }

    async fn memory_recall(
        &self,
        query: &str,
        limit: Option<usize>,
    ) -> Result<Vec<MemoryHit>, SyscallError> {
        Ok(self
            .kernel()?
            .memory()
            .recall(self.caller(), query, limit)
            .await?)
    }

    async fn skills(&self) -> Result<hivekernel_agents::skill::Catalogue, SyscallError> {
        Ok(self.kernel()?.skills().for_caller(self.caller())?)
    }

    async fn manage_skill(
        &self,
        write: hivekernel_agents::skill::SkillWrite,
        checkpoint: hivekernel_agents::syscalls::Checkpoint<'_>,
    ) -> Result<hivekernel_agents::skill::SkillVersion, SyscallError> {
        Ok(self
            .kernel()?
            .skills()
            .manage(self.caller(), write, checkpoint)
            .await?)
    }

    async fn mcp_tools(&self, server: &str) -> Result<McpTools, SyscallError> {
        Ok(self.kernel()?.mcp().tools(self.caller(), server).await?)
    }

    async fn mcp_call(
        &self,
        server: &str,
        tool: &str,
        arguments: serde_json::Map<String, serde_json::Value>,
    ) -> Result<McpOutput, SyscallError> {
        Ok(self
            .kernel()?
            .mcp()
            .call(self.caller(), server, tool, arguments)
            .await?)
    }
}
