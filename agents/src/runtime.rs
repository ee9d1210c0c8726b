//! The contract between the kernel and what runs inside a process.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;

use crate::message::{Message, Task, TaskReply};
use crate::process::{Pid, Role, Tier};
use crate::syscalls::Syscalls;

/// Who a process is, and its door to the kernel; handed to every runtime call.
#[derive(Debug, Clone)]
pub struct ProcessContext {
    /// Its PID.
    pub pid: Pid,
    /// Its name.
    pub name: Arc<str>,
    /// Its role.
    pub role: Role,
    /// Its tier.
    pub tier: Tier,
    /// Logical model name.
    pub model: Arc<str>,
    /// System prompt text.
    pub system_prompt: Arc<str>,
    /// Tool names it may use.
    pub tools: Arc<[String]>,
    /// Its own working directory for the workspace tools, when it has one
    /// (created on first use).
    pub workspace: Option<Arc<Path>>,
    /// Kernel operations, acting as this process.
    pub syscalls: Arc<dyn Syscalls>,
}

/// A runtime failure that ends the process (as opposed to a failed task).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RuntimeError(pub String);

/// What runs inside a process. One instance serves one process (or is shared
/// by many, when stateless); calls may run concurrently up to the process's
/// `max_concurrent_tasks`.
#[async_trait]
pub trait Runtime: Send + Sync + fmt::Debug {
    /// Work on a task and return its reply.
    async fn execute(&self, ctx: &ProcessContext, task: Task) -> TaskReply;

    /// React to a non-task message; the default ignores it.
    async fn on_message(&self, ctx: &ProcessContext, message: Message) -> Result<(), RuntimeError> {
        let _ = (ctx, message);
        Ok(())
    }
}

/// Creates the runtime for a newly spawned process.
pub trait RuntimeFactory: Send + Sync + fmt::Debug {
    /// The runtime for a process; an error refuses the spawn with that reason.
    fn create(&self, ctx: &ProcessContext) -> Result<Arc<dyn Runtime>, RuntimeError>;
}
