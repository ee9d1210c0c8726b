//! Process tools: the agent's view of its own part of the process tree.
//!
//! Every tool acts through `ctx.process.syscalls`, so it meets exactly the
//! checks a gRPC client with the caller's identity would: a `task` may not
//! spawn, only descendants may be killed, only a parent may wait. A kernel
//! refusal comes back as a [`ToolError`] carrying the kernel's own message.
//! Answers are short text for the model; structured answers are compact JSON.
//!
//! # Layout
//! - `tree`: `spawn_child`, `kill_child`, `wait_child`.
//! - `tasks`: `execute_task`, `delegate_async`, `send_message`.
//! - `inspect`: `list_children`, `list_siblings`, `get_process_info`.
//! - this file: registration, argument decoding and checks, shared answers.

mod inspect;
mod tasks;
mod tree;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::args::invalid;
use super::{Tool, ToolError, ToolRegistry, decode, refused, to_json};
use crate::process::ProcessInfo;

pub use inspect::{GetProcessInfo, ListChildren, ListSiblings};
pub use tasks::{DelegateAsync, ExecuteTask, SendMessage};
pub use tree::{KillChild, SpawnChild, WaitChild};

/// Longest timeout any process tool accepts, in seconds.
pub const MAX_TIMEOUT_SECONDS: u64 = 3600;
/// How long `wait_child` waits when no timeout is given, in seconds.
pub const WAIT_DEFAULT_TIMEOUT_SECONDS: u64 = 300;

/// Adds the nine process tools.
pub fn register(registry: &mut ToolRegistry) {
    registry.register(Arc::new(SpawnChild));
    registry.register(Arc::new(KillChild));
    registry.register(Arc::new(ExecuteTask));
    registry.register(Arc::new(DelegateAsync));
    registry.register(Arc::new(WaitChild));
    registry.register(Arc::new(ListChildren));
    registry.register(Arc::new(ListSiblings));
    registry.register(Arc::new(GetProcessInfo));
    registry.register(Arc::new(SendMessage));
}

/// A `timeout_seconds` argument as a duration, checked against 1..=3600.
fn timeout(
    tool: &dyn Tool,
    field: &str,
    seconds: Option<u64>,
) -> Result<Option<Duration>, ToolError> {
    match seconds {
        None => Ok(None),
        Some(s) if (1..=MAX_TIMEOUT_SECONDS).contains(&s) => Ok(Some(Duration::from_secs(s))),
        Some(s) => Err(invalid(
            tool,
            format!("field `{field}` must be between 1 and {MAX_TIMEOUT_SECONDS} seconds, got {s}"),
        )),
    }
}

/// The one-line view of a process that listings show.
fn summary(info: &ProcessInfo) -> Value {
    json!({
        "pid": info.pid,
        "name": info.name,
        "role": info.role,
        "tier": info.tier,
        "state": info.state,
    })
}
