//! What a process may ask of its kernel.
//!
//! The kernel implements [`Syscalls`] once per process, bound to that
//! process's PID: every call acts as that process, under the same checks a
//! gRPC client with that process's identity would meet.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::artifact::{Artifact, ArtifactId, ArtifactInfo, NewArtifact};
use crate::cron::{CronInfo, CronSpec};
use crate::llm::{ChatRequest, ChatResponse, LlmError};
use crate::mcp::{McpOutput, McpTools};
use crate::memory::{MemoryEntry, MemoryHit, NewMemory};
use crate::message::{MessageId, Priority, RequestId, TaskReply};
use crate::process::{ExitRecord, Pid, ProcessInfo, SpawnRequest};
use crate::transcript::TurnRecord;

/// The turn a call that may wait for a person belongs to, for the kernel
/// to keep while it waits: called only when the call does wait, it answers
/// the runtime's checkpoint of the turn, which the kernel keeps with the
/// request and hands back to [`crate::Runtime::resume`] after a kernel
/// restart. `None`: the turn cannot be resumed (a restart withdraws the
/// request).
pub type Checkpoint<'a> = Option<&'a (dyn Fn() -> String + Sync)>;

/// The class of a refused or failed syscall; maps one-to-one onto gRPC codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The target does not exist (or no longer does).
    NotFound,
    /// The request itself is malformed.
    InvalidArgument,
    /// The caller may not do this.
    PermissionDenied,
    /// A limit or a full mailbox stands in the way.
    ResourceExhausted,
    /// The target is not in a state that allows this.
    FailedPrecondition,
    /// No answer in time.
    DeadlineExceeded,
    /// The kernel is shutting down.
    Unavailable,
    /// A bug in the kernel.
    Internal,
}

/// A question for a person ([`Syscalls::ask_human`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HumanQuestion {
    /// What is asked.
    pub question: String,
    /// The answers offered; empty: any answer.
    pub choices: Vec<String>,
    /// How long to wait.
    pub timeout: std::time::Duration,
}

/// How a question was settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HumanAnswer {
    /// The answer.
    Answered(String),
    /// The person declined to answer, with the reason given (may be empty).
    Declined(String),
    /// Nobody answered in time.
    TimedOut,
}

/// A refused or failed syscall, with a message naming what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[error("{message}")]
pub struct SyscallError {
    /// Its class.
    pub kind: ErrorKind,
    /// Human-readable reason.
    pub message: String,
}

impl SyscallError {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        SyscallError {
            kind,
            message: message.into(),
        }
    }
}

/// What a kill ended: the PIDs that exited, leaves first, and the parts of
/// the subtree that could not be reached (on a node that did not answer),
/// which may still run. Travels as the bare list of PIDs when every part
/// was reached.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "KilledForm", into = "KilledForm")]
pub struct Killed {
    /// The PIDs that exited, leaves first.
    pub exited: Vec<Pid>,
    /// What could not be reached.
    pub unreached: Vec<Unreached>,
}

/// A process of a killed subtree that could not be reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unreached {
    /// The process.
    pub pid: Pid,
    /// The node holding it.
    pub node: String,
    /// Why it could not be reached.
    pub error: String,
}

/// How [`Killed`] travels.
#[derive(Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum KilledForm {
    Exited(Vec<Pid>),
    Partly {
        exited: Vec<Pid>,
        unreached: Vec<Unreached>,
    },
}

impl From<KilledForm> for Killed {
    fn from(form: KilledForm) -> Killed {
        match form {
            KilledForm::Exited(exited) => Killed {
                exited,
                unreached: Vec::new(),
            },
            KilledForm::Partly { exited, unreached } => Killed { exited, unreached },
        }
    }
}

impl From<Killed> for KilledForm {
    fn from(killed: Killed) -> KilledForm {
        if killed.unreached.is_empty() {
            KilledForm::Exited(killed.exited)
        } else {
            KilledForm::Partly {
                exited: killed.exited,
                unreached: killed.unreached,
            }
        }
    }
}

impl Killed {
    /// All of these exited, and nothing was out of reach.
    pub fn all(exited: Vec<Pid>) -> Killed {
        Killed {
            exited,
            unreached: Vec::new(),
        }
    }

    /// Adds what `other` ended and could not reach.
    pub fn extend(&mut self, other: Killed) {
        self.exited.extend(other.exited);
        self.unreached.extend(other.unreached);
    }
}

/// A message to send; `kind` defaults to `message` and priority to normal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outgoing {
    /// Receiver.
    pub to: Pid,
    /// Kind, e.g. `message`.
    pub kind: String,
    /// Body.
    pub payload: String,
    /// Priority.
    pub priority: Priority,
    /// Dropped (and reported as an event) if still undelivered after this long.
    pub ttl: Option<Duration>,
    /// The approval rules it is sent under: set by the kernel (whatever
    /// the sender puts here is replaced), see [`crate::Message::approvals`].
    #[serde(default, skip_serializing_if = "crate::approval::Carried::is_empty")]
    pub approvals: crate::approval::Carried,
}

impl Outgoing {
    /// A normal-priority `message` to `to`.
    pub fn new(to: Pid, payload: impl Into<String>) -> Self {
        Outgoing {
            to,
            kind: crate::message::kinds::MESSAGE.to_owned(),
            payload: payload.into(),
            priority: Priority::Normal,
            ttl: None,
            approvals: crate::approval::Carried::NONE,
        }
    }
}

/// A task to run on another process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSpec {
    /// Target process.
    pub to: Pid,
    /// What to do.
    pub description: String,
    /// Structured parameters.
    pub params: BTreeMap<String, String>,
    /// Reply deadline; `None` takes the target's `timeout_seconds`.
    pub timeout: Option<Duration>,
    /// The approval rules it is asked under: set by the kernel (whatever
    /// the requester puts here is replaced), see [`crate::Task::approvals`].
    #[serde(default, skip_serializing_if = "crate::approval::Carried::is_empty")]
    pub approvals: crate::approval::Carried,
}

impl TaskSpec {
    /// A task with no parameters and the target's default timeout.
    pub fn new(to: Pid, description: impl Into<String>) -> Self {
        TaskSpec {
            to,
            description: description.into(),
            params: BTreeMap::new(),
            timeout: None,
            approvals: crate::approval::Carried::NONE,
        }
    }
}

/// A tool call a runtime made, reported to the kernel for its event log
/// and the process's transcript.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallReport {
    /// The tool it asked for (as the model named it).
    pub tool: String,
    /// The id the model gave the call.
    pub call_id: String,
    /// What went back to the model: the result, or `error: ...`.
    pub output: String,
    /// How long the call took.
    pub duration: std::time::Duration,
    /// Why it failed; `None` when the tool returned a result.
    pub error: Option<String>,
}

/// The kernel operations available to a running process, acting as that process.
#[async_trait]
pub trait Syscalls: Send + Sync + fmt::Debug {
    /// The PID every call acts as.
    fn pid(&self) -> Pid;

    /// Spawn a child of this process (`request.parent` is ignored).
    async fn spawn_child(&self, request: SpawnRequest) -> Result<Pid, SyscallError>;

    /// Kill a descendant and its subtree; returns the PIDs that exited,
    /// leaves first, and the parts of the subtree on a node that did not
    /// answer.
    async fn kill(&self, pid: Pid, reason: &str) -> Result<Killed, SyscallError>;

    /// Kill a descendant and collect its exit record, in the background:
    /// for cleanup on paths that cannot wait (a dropped future). Failures
    /// (already gone, not a descendant) are ignored.
    fn dismiss(&self, pid: Pid, reason: &str);

    /// Fire-and-forget message.
    async fn send_message(&self, message: Outgoing) -> Result<MessageId, SyscallError>;

    /// Run a task and wait for its reply (request/reply with a deadline).
    async fn execute_task(&self, task: TaskSpec) -> Result<TaskReply, SyscallError>;

    /// Send a task and return at once; the reply arrives later as a
    /// `task_response` message naming the returned request id.
    async fn delegate_async(&self, task: TaskSpec) -> Result<RequestId, SyscallError>;

    /// Wait for a child to exit and collect its exit record.
    async fn wait_child(
        &self,
        pid: Pid,
        timeout: Option<Duration>,
    ) -> Result<ExitRecord, SyscallError>;

    /// A snapshot of any process.
    async fn get_process(&self, pid: Pid) -> Result<ProcessInfo, SyscallError>;

    /// Snapshots of this process's children.
    async fn list_children(&self) -> Result<Vec<ProcessInfo>, SyscallError>;

    /// Snapshots of `root` and its subtree, parents first, at most `max_depth` levels below it.
    async fn list_processes(
        &self,
        root: Pid,
        max_depth: Option<u32>,
    ) -> Result<Vec<ProcessInfo>, SyscallError>;

    /// This process's durable value under `key`: kept across kernel restarts
    /// when the kernel has a store. `None` when unset; the default keeps nothing.
    async fn load_state(&self, key: &str) -> Result<Option<String>, SyscallError> {
        let _ = key;
        Ok(None)
    }

    /// Sets (or with `None` removes) this process's durable value under
    /// `key`; returns once it is committed. The default keeps nothing.
    async fn save_state(&self, key: &str, value: Option<String>) -> Result<(), SyscallError> {
        let _ = (key, value);
        Ok(())
    }

    /// Ends this process and its subtree with `code` (0: a normal exit;
    /// anything else is abnormal, which a transient restart policy restarts).
    /// Called from the process's own handler it does not return: the handler
    /// stops with the process. The default refuses.
    async fn exit(&self, code: i32, reason: &str) -> Result<(), SyscallError> {
        let _ = (code, reason);
        Err(SyscallError::new(
            ErrorKind::FailedPrecondition,
            "this kernel does not let processes exit on their own",
        ))
    }

    /// Adds a cron entry owned by this process, aimed at itself or a
    /// descendant; answers the entry as the kernel shows it.
    async fn schedule_cron(&self, spec: CronSpec) -> Result<CronInfo, SyscallError> {
        let _ = spec;
        Err(SyscallError::new(
            ErrorKind::FailedPrecondition,
            "this kernel has no cron",
        ))
    }

    /// This process's cron entries, by name.
    async fn list_cron(&self) -> Result<Vec<CronInfo>, SyscallError> {
        Err(SyscallError::new(
            ErrorKind::FailedPrecondition,
            "this kernel has no cron",
        ))
    }

    /// Removes one of this process's cron entries.
    async fn remove_cron(&self, name: &str) -> Result<(), SyscallError> {
        let _ = name;
        Err(SyscallError::new(
            ErrorKind::FailedPrecondition,
            "this kernel has no cron",
        ))
    }

    /// Puts `question` to a person (the kernel's inbox) and waits for the
    /// answer, the refusal or the timeout. The default refuses: a kernel
    /// without an inbox.
    async fn ask_human(
        &self,
        question: HumanQuestion,
        checkpoint: Checkpoint<'_>,
    ) -> Result<HumanAnswer, SyscallError> {
        let _ = (question, checkpoint);
        Err(SyscallError::new(
            ErrorKind::FailedPrecondition,
            "this kernel has no inbox",
        ))
    }

    /// Whether a call of `tool` (a built-in name or `mcp:<server>/<tool>`)
    /// with `arguments` may run: at once when no approval rule of this
    /// process covers it, else once a person approves (waiting meanwhile).
    /// A refusal (denied, timed out) is an error saying so, which the model
    /// sees as the tool's result. The default allows every call.
    async fn approve_tool(
        &self,
        tool: &str,
        arguments: &serde_json::Value,
        checkpoint: Checkpoint<'_>,
    ) -> Result<(), SyscallError> {
        let _ = (tool, arguments, checkpoint);
        Ok(())
    }

    /// Reports a finished tool call; the kernel records it as a `tool_call`
    /// event of this process and in its transcript. The default drops it.
    fn tool_called(&self, report: ToolCallReport) {
        let _ = report;
    }

    /// Adds to this process's transcript, in the turn being handled. Never
    /// waits: the kernel writes it in the background. The default drops it.
    fn record(&self, record: TurnRecord) {
        let _ = record;
    }

    /// Server tokens per estimated token for this process's model, as the
    /// kernel has learned from the usage its provider reports: a runtime
    /// fitting a conversation to the context window divides its budget by
    /// it. The default is 1 (the estimate as it is).
    fn token_ratio(&self) -> f64 {
        1.0
    }

    /// One model call through the kernel's provider. The kernel records the
    /// usage the provider reports against this process, so a runtime cannot
    /// under-report it. The default refuses: a kernel without a model provider.
    async fn chat(&self, request: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let _ = request;
        Err(LlmError::Refused(
            "this kernel has no model provider configured".into(),
        ))
    }

    /// The tools MCP server `server` offers now, for a process whose tool
    /// list selects it (`mcp:<server>` or `mcp:<server>/<tool>`; the
    /// runtime narrows a one-tool entry itself). A server still starting is
    /// waited for, up to its startup timeout. The default refuses.
    async fn mcp_tools(&self, server: &str) -> Result<McpTools, SyscallError> {
        let _ = server;
        Err(no_mcp())
    }

    /// Calls `tool` of MCP server `server` with `arguments`, within the
    /// server's per-call deadline; the process's tool list must select it.
    /// A tool that reports a failure answers `is_error`; a server that
    /// cannot be reached or does not answer in time is an error. The default refuses.
    async fn mcp_call(
        &self,
        server: &str,
        tool: &str,
        arguments: serde_json::Map<String, serde_json::Value>,
    ) -> Result<McpOutput, SyscallError> {
        let _ = (server, tool, arguments);
        Err(no_mcp())
    }

    /// The skills this process may see and its tool list selects (`skills`,
    /// or `skill:<name>` entries), sorted by name. The default: none.
    async fn skills(&self) -> Result<crate::skill::Catalogue, SyscallError> {
        Ok(std::sync::Arc::from([]))
    }

    /// Creates, edits or deletes a skill in the kernel's store (the
    /// `manage_skills` capability); returns the version written once
    /// committed. A write that leaves a skill `global` may wait for a
    /// person's approval (without `publish_skills`); `checkpoint` is the
    /// waiting turn's, as for [`Syscalls::approve_tool`]. The default
    /// refuses.
    async fn manage_skill(
        &self,
        write: crate::skill::SkillWrite,
        checkpoint: Checkpoint<'_>,
    ) -> Result<crate::skill::SkillVersion, SyscallError> {
        let _ = (write, checkpoint);
        Err(no_store("skills"))
    }

    /// Stores an artifact owned by this process, replacing its artifact of
    /// the same name; returns once committed. The default refuses.
    async fn store_artifact(&self, artifact: NewArtifact) -> Result<ArtifactInfo, SyscallError> {
        let _ = artifact;
        Err(no_store("artifacts"))
    }

    /// An artifact this process may read, with its content. The default refuses.
    async fn get_artifact(&self, id: ArtifactId) -> Result<Artifact, SyscallError> {
        let _ = id;
        Err(no_store("artifacts"))
    }

    /// The artifacts this process may read, newest first, optionally only
    /// `owner`'s. The default refuses.
    async fn list_artifacts(&self, owner: Option<Pid>) -> Result<Vec<ArtifactInfo>, SyscallError> {
        let _ = owner;
        Err(no_store("artifacts"))
    }

    /// Deletes an artifact this process or one of its descendants owns. The default refuses.
    async fn delete_artifact(&self, id: ArtifactId) -> Result<(), SyscallError> {
        let _ = id;
        Err(no_store("artifacts"))
    }

    /// Remembers `entry` in this process's own memory; returns once
    /// committed. The default refuses.
    async fn memory_store(&self, entry: NewMemory) -> Result<MemoryEntry, SyscallError> {
        let _ = entry;
        Err(no_store("memory"))
    }

    /// Deletes this process's memory entry under `key`; returns once
    /// committed. The default refuses.
    async fn memory_forget(&self, key: &str) -> Result<(), SyscallError> {
        let _ = key;
        Err(no_store("memory"))
    }

    /// The entries of this process's memory that best match `query`, best
    /// first, at most `limit` (the kernel's default when `None`). The default refuses.
    async fn memory_recall(
        &self,
        query: &str,
        limit: Option<usize>,
    ) -> Result<Vec<MemoryHit>, SyscallError> {
        let _ = (query, limit);
        Err(no_store("memory"))
    }
}

/// The refusal of a kernel that runs no MCP servers.
fn no_mcp() -> SyscallError {
    SyscallError::new(
        ErrorKind::FailedPrecondition,
        "this kernel runs no MCP servers",
    )
}

/// The refusal of a kernel that keeps nothing on disk.
fn no_store(what: &str) -> SyscallError {
    SyscallError::new(
        ErrorKind::FailedPrecondition,
        format!("this kernel has no store, so it keeps no {what}"),
    )
}
