//! The HiveKernel process kernel: everything around processes.
//!
//! Agents are processes with a PID in a parent/child tree. The [`Kernel`]
//! handle is the one API: the gRPC control plane and the `Syscalls` handed
//! to in-process runtimes are both thin adapters over it, so every check
//! runs the same way whichever door a call comes through.
//!
//! # Layout
//! - [`config`]: the JSON startup config, validated in two phases.
//! - [`kernel`]: the `Kernel` handle, shared state, queries, shutdown.
//! - [`caller`]: who is asking (`Caller`).
//! - `process`: the process table and tree queries; a row's supervision part.
//! - `spawn`: spawn validation and creation.
//! - `acl`: role capabilities, the tools a child may get, `denied` events.
//! - `budget`: token budgets that flow down the tree; model prices.
//! - `usage`: model usage per process and subtree; per-process rate limits.
//! - `supervisor`: kill of subtrees, exit records, `wait_child`, the zombie reaper.
//! - `mailbox`: bounded priority mailboxes with aging and TTL.
//! - `router`: routing rules, messages, `execute_task`, `delegate_async`, replies.
//! - `restore`: coming back after a restart: config agents keep their PIDs.
//! - `state`: per-process durable values (a daemon's conversation).
//! - [`cron`]: schedules that run tasks, spawn agents from templates or send messages.
//! - `crontab`: cron expressions: parsing and the next slot.
//! - `artifacts`: named blobs with an owner, a content type and a visibility.
//! - `memory`: agent memory, a namespace per process with full-text recall.
//! - `counter`: PIDs and ids that are never handed out twice, across restarts too.
//! - [`event`]: the event values.
//! - [`events`]: the event bus: sequencing, retention, replay.
//! - [`store`]: the SQLite store: events, processes, pending messages, counters,
//!   artifacts, agent memory.
//! - [`runtime`]: the runtime registry and the per-process runner.
//! - [`exec`]: the `exec` runtime: agents as OS processes talking gRPC.
//! - [`command`]: the checks on an `exec` command before anything starts.
//! - `syscalls`: the `Syscalls` implementation bound to one process.
//! - [`auth`]: the admin token file and bearer-token authentication.
//! - [`tls`]: TLS and mutual TLS on the control plane: the PEM files, server and client settings.
//! - [`grpc`]: the tonic server: the Kernel service, health, reflection, auth layer.
//! - [`daemon`]: `hivekernel start`: config, agents, server, graceful shutdown.
//! - [`cli`]: the `hivekernel` command line.
//! - [`error`]: the [`KernelError`] type.

mod acl;
mod artifacts;
pub mod auth;
mod budget;
pub mod caller;
pub mod cli;
pub mod command;
pub mod config;
mod counter;
pub mod cron;
mod crontab;
pub mod daemon;
pub mod error;
pub mod event;
pub mod events;
pub mod exec;
pub mod grpc;
pub mod kernel;
pub mod llm;
mod mailbox;
mod memory;
mod process;
mod restore;
mod router;
pub mod runtime;
mod spawn;
mod state;
pub mod store;
mod supervisor;
mod syscalls;
pub mod tls;
mod usage;

/// The global allocator the `hivekernel` binary runs with (mimalloc); the
/// benchmark binary uses it too, so it measures what ships.
pub use mimalloc::MiMalloc as Allocator;

pub use artifacts::{
    ArtifactSettings, DEFAULT_CONTENT_TYPE, MAX_ARTIFACT_NAME_BYTES, MAX_CONTENT_TYPE_BYTES,
    MAX_LISTED_ARTIFACTS,
};
pub use budget::{Price, Prices};
pub use error::KernelError;
pub use exec::EXIT_CANNOT_START;
pub use hivekernel_agents::MAX_NAME_BYTES;
pub use kernel::{AgentRefused, Caller, Declared, Kernel, KernelBuilder, Started};
pub use memory::{
    DEFAULT_RECALL_LIMIT, MAX_MEMORY_KEY_BYTES, MAX_MEMORY_TAG_BYTES, MAX_MEMORY_TAGS,
    MAX_QUERY_WORDS, MemorySettings,
};
pub use restore::{KERNEL_RESTART, Restored};
pub use router::{KERNEL_MESSAGE_PREVIEW, MAX_DURATION, MAX_PAYLOAD_BYTES};
pub use runtime::RuntimeRegistry;
pub use state::{MAX_STATE_KEY_BYTES, MAX_STATE_VALUE_BYTES};
pub use supervisor::{EXIT_FAILED, EXIT_KILLED, EXIT_PANICKED};
