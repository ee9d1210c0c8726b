//! What runs inside a HiveKernel process.
//!
//! A process is driven by a [`Runtime`]; the runtime asks its kernel for
//! things only through [`Syscalls`]. This crate does not depend on the
//! kernel: the kernel implements `Syscalls` and registers runtimes by name.
//!
//! # Layout
//! - [`process`]: PIDs, roles, tiers, states, limits, spawn requests, exit records.
//! - [`message`]: priorities, message and task envelopes as a runtime sees them.
//! - [`capability`]: capabilities a role grants, and sets of them.
//! - [`cron`]: cron actions and policies, entries as declared and as they ran.
//! - [`supervision`]: restart policies and specs, supervision strategies.
//! - [`artifact`]: artifacts (named blobs with an owner and a visibility) as processes see them.
//! - [`memory`]: agent memory entries and recall hits.
//! - [`syscalls`]: the [`Syscalls`] trait and its error type.
//! - [`runtime`]: the [`Runtime`] and [`RuntimeFactory`] traits and the per-process context.
//! - [`echo`]: the `echo` runtime, which answers every task with its description.
//! - [`http`]: the HTTP client builder (rustls with ring) every outbound call uses.
//! - [`text`]: cutting text to a size, with one marker.
//! - [`transcript`]: what a runtime records in its process's transcript.
//! - [`trace`]: trace context (W3C shape) carried by tasks and messages.
//! - `named`: the macro behind every lowercase string enum.
//! - [`tools`]: the [`Tool`](tools::Tool) trait, tool arguments, the tool registry and the built-in tools.
//! - [`tool_agent`]: the universal `tool_agent` runtime (prompt + tools + model loop).
//! - [`mcp`]: MCP tool-list entries, tools and results as a process sees them.
//! - [`skill`]: skills in the Agent Skills format: reading and checking them, tool-list entries.
//! - [`llm`]: model providers (OpenAI-compatible HTTP, scripted offline) and the chat types.

pub mod approval;
pub mod artifact;
pub mod capability;
pub mod cron;
pub mod echo;
pub mod http;
pub mod json;
pub mod llm;
pub mod mcp;
pub mod memory;
pub mod message;
mod named;
pub mod process;
pub mod runtime;
pub mod sandbox;
pub mod skill;
pub mod supervision;
pub mod syscalls;
pub mod text;
pub mod tool_agent;
pub mod tools;
pub mod trace;
pub mod transcript;

pub use approval::{ApprovalRule, OnTimeout};
pub use artifact::{Artifact, ArtifactId, ArtifactInfo, NewArtifact, Visibility};
pub use capability::{Capabilities, Capability};
pub use cron::{CronAction, CronInfo, CronRun, CronSource, CronSpec, Missed, Overlap};
pub use mcp::{McpOutput, McpSelector, McpTool, McpTools};
pub use memory::{MemoryEntry, MemoryHit, NewMemory};
pub use message::{Message, MessageId, Priority, RequestId, Task, TaskReply};
pub use process::{
    BudgetInfo, ExecCommand, ExitRecord, LimitOverrides, Limits, LlmUsage, MAX_NAME_BYTES, Pid,
    ProcessInfo, ProcessState, Role, SpawnRequest, Tier, check_name,
};
pub use runtime::{ProcessContext, Runtime, RuntimeError, RuntimeFactory, Workspace};
pub use skill::{Skill, SkillEntry, SkillSelector};
pub use supervision::{RestartPolicy, RestartSpec, Strategy};
pub use syscalls::{
    ErrorKind, Killed, Outgoing, SyscallError, Syscalls, TaskSpec, ToolCallReport, Unreached,
};
pub use trace::{SpanId, TraceContext, TraceId};
pub use transcript::{InputSource, TurnRecord};
