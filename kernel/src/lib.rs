//! The HiveKernel process kernel: everything around processes.
//!
//! Agents are processes with a PID in a parent/child tree. The [`Kernel`]
//! handle is the one API: the gRPC control plane and the `Syscalls` handed
//! to in-process runtimes are both thin adapters over it, so every check
//! runs the same way whichever door a call comes through.
//!
//! # Layout
//! In layers; a module imports only from the layers below it (no import
//! cycles), and docs/ARCHITECTURE.md names the file behind each behaviour.
//!
//! Leaves: plain values and rules.
//! - [`error`]: the [`KernelError`] type.
//! - [`caller`]: who is asking (`Caller`) and the scope of what it may ask (`Scope`).
//! - [`event`]: the event values.
//! - [`transcript`]: transcript entries and reads of them (the values).
//! - `crontab`: cron expressions: parsing and the next slot.
//! - [`command`]: the `exec` runtime's name and the checks on a command.
//! - [`files`]: reading a file the config names: only a regular file, at most a limit.
//! - [`config`]: the JSON startup config, read into plain data and validated in two phases.
//! - [`reload`]: what a config reload did (the values), and the seam the daemon reloads through.
//!
//! Foundation: state with a small API, knowing nothing of the kernel.
//! - `process`: the process table and tree queries; a row's supervision part.
//! - `mailbox`: bounded priority mailboxes with aging and TTL.
//! - [`events`]: the event bus: sequencing, retention, replay.
//! - `counter`: PIDs and ids that are never handed out twice, across restarts too.
//! - [`store`]: the SQLite store: events, processes, pending messages, counters,
//!   artifacts, agent memory, usage, transcripts.
//! - `trace`: the trace of the work running now (a task-local).
//! - [`transcripts`]: what every agent did, turn by turn: recording, the
//!   in-memory tail, reads (the store keeps and prunes them).
//! - `budget`, `usage`: token budgets down the tree, model prices; usage and rate limits.
//! - `router`: the routing rules (who may address whom) and the message limits.
//! - [`runtime`]: the runtime registry.
//! - [`exec`]: the `exec` runtime's processes: commands, OS processes, attach streams.
//! - [`mcp`]: MCP servers the kernel starts and supervises; their tools and calls.
//! - [`skills`]: the skill library: skills loaded from the config's directories.
//! - `gate`: the door before every listener: connection caps, admission and idle timeouts.
//! - [`auth`], [`tokens`], [`tls`]: tokens (the admin's, processes', operators' with
//!   scopes) and TLS for the control plane.
//! - [`nats`]: reaching NATS as a client: credentials in server URLs and
//!   files, TLS, and server URLs shown without their secrets.
//!
//! Facade: [`kernel`], the `Kernel` handle; its parts in `kernel/inner.rs`
//! (private to that file); its operations, one file per concern under
//! kernel/: `builder` (the one way to start a kernel), `spawn`, `acl`,
//! `supervisor` (kill, exits, `wait_child`, the reaper, restarts), `router`
//! (send, `execute_task`, `delegate_async`, replies), `runner`, `cron` (the
//! schedules and their runs; [`cron`] re-exports its vocabulary), `exec`,
//! `restore`, `llm` (model calls; [`llm`] chooses the provider),
//! `artifacts`, `memory`, `skills`, `state`, `syscalls` (the `Syscalls`
//! bound to one process).
//!
//! Doors: [`grpc`] (the tonic server: service, health, reflection, auth
//! layer), [`daemon`] (`hivekernel start`) and [`cli`] (the command line).

pub mod auth;
mod budget;
pub mod caller;
pub mod cli;
pub mod cluster;
pub mod command;
pub mod config;
mod counter;
pub mod cron;
mod crontab;
pub mod daemon;
pub mod dashboard;
pub mod error;
pub mod event;
pub mod events;
pub mod exec;
pub mod files;
mod gate;
pub mod grpc;
pub mod http;
pub mod inbox;
pub mod kernel;
pub mod limits;
pub mod llm;
pub mod logging;
mod mailbox;
pub mod mcp;
pub mod metrics;
pub mod nats;
pub mod notify;
pub mod otel;
mod process;
pub mod reload;
mod router;
pub mod runtime;
pub mod skills;
pub mod store;
pub mod tls;
pub mod tokens;
mod trace;
pub mod transcript;
pub mod transcripts;
mod usage;

/// The global allocator the `hivekernel` binary runs with (mimalloc); the
/// benchmark binary uses it too, so it measures what ships.
pub use mimalloc::MiMalloc as Allocator;

pub use budget::{Price, Prices};
pub use error::KernelError;
pub use exec::EXIT_CANNOT_START;
pub use hivekernel_agents::MAX_NAME_BYTES;
pub use hivekernel_agents::process::{EXIT_FAILED, EXIT_KILLED, EXIT_PANICKED};
pub use kernel::artifacts::{
    ArtifactSettings, DEFAULT_CONTENT_TYPE, MAX_ARTIFACT_NAME_BYTES, MAX_CONTENT_TYPE_BYTES,
    MAX_LISTED_ARTIFACTS,
};
pub use kernel::memory::{
    DEFAULT_RECALL_LIMIT, MAX_MEMORY_KEY_BYTES, MAX_MEMORY_TAG_BYTES, MAX_MEMORY_TAGS,
    MAX_QUERY_WORDS, MemorySettings,
};
pub use kernel::state::{MAX_STATE_KEY_BYTES, MAX_STATE_VALUE_BYTES};
pub use kernel::{AgentRefused, Caller, Declared, Kernel, KernelBuilder, Started};
pub use kernel::{KERNEL_RESTART, Restored};
pub use limits::InputLimits;
pub use router::{KERNEL_MESSAGE_PREVIEW, MAX_DURATION};
pub use runtime::RuntimeRegistry;
