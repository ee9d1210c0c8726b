//! The contract between the kernel and what runs inside a process.

use std::fmt;
use std::path::{Path, PathBuf};
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
    /// Where its workspace tools work, when it has a workspace (the
    /// directory is created on first use); see [`ProcessContext::workspace_dir`].
    pub workspace: Option<Workspace>,
    /// Kernel operations, acting as this process.
    pub syscalls: Arc<dyn Syscalls>,
}

/// Where a process's workspace is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Workspace {
    /// `<root>/<name>`, or `<root>/pid-<pid>` when the name is not one plain
    /// path component. The root is shared by every such process, so it costs
    /// nothing per process.
    Under(Arc<Path>),
    /// Exactly this directory.
    At(Arc<Path>),
}

impl ProcessContext {
    /// The process's own workspace directory, if it has one.
    pub fn workspace_dir(&self) -> Option<PathBuf> {
        match self.workspace.as_ref()? {
            Workspace::At(dir) => Some(dir.to_path_buf()),
            Workspace::Under(root) => {
                let name: &str = &self.name;
                let plain = !name.is_empty() && !name.contains('/') && name != "." && name != "..";
                Some(if plain {
                    root.join(name)
                } else {
                    root.join(format!("pid-{}", self.pid))
                })
            }
        }
    }
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

    /// Whether messages are done with only when the runtime says so (an
    /// external agent acknowledged them): the kernel then hands them over
    /// with [`Runtime::on_acknowledged_message`], and a message kept in the
    /// store leaves it only once acknowledged. The default: handed over is
    /// done with.
    fn acknowledges_messages(&self) -> bool {
        false
    }

    /// Whether a message's turn acts (beyond reading and recording) only
    /// after a model call or an MCP tool call made through the kernel, as
    /// a `tool_agent`'s does. A node of a cluster then hands a message kept
    /// in its mail stream over at that first call rather than as the turn
    /// starts, so a node lost before the turn acts leaves the message to
    /// the node that starts the process again. The default: no.
    fn hands_over_at_first_call(&self) -> bool {
        false
    }

    /// Hands over a message and waits until it is done with: `Ok(true)`
    /// once acknowledged, `Ok(false)` when it never will be (the agent's
    /// process is ending), so it stays where it is kept. Called only when
    /// [`Runtime::acknowledges_messages`]; the default is [`Runtime::on_message`].
    async fn on_acknowledged_message(
        &self,
        ctx: &ProcessContext,
        message: Message,
    ) -> Result<bool, RuntimeError> {
        self.on_message(ctx, message).await.map(|()| true)
    }

    /// Carries on with a turn that was waiting for a person when the kernel
    /// stopped, from the checkpoint it gave then (see
    /// [`crate::syscalls::Checkpoint`]); the inbox request it waited for is
    /// pending again, and the turn's first wait for a person takes it up.
    /// Answers the turn's outcome, as [`Runtime::execute`] would. The
    /// default cannot: the kernel withdraws the request.
    async fn resume(&self, ctx: &ProcessContext, checkpoint: &str) -> TaskReply {
        let _ = (ctx, checkpoint);
        Err("this runtime cannot resume a turn".into())
    }
}

/// Creates the runtime for a newly spawned process.
pub trait RuntimeFactory: Send + Sync + fmt::Debug {
    /// The runtime for a process; an error refuses the spawn with that reason.
    fn create(&self, ctx: &ProcessContext) -> Result<Arc<dyn Runtime>, RuntimeError>;
}
