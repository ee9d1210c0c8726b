//! The `echo` runtime: answers every task with its own description.
//!
//! Useful for smoke tests, demos and benchmarks of the kernel alone:
//! - a task is answered with its description; a task parameter `delay_ms`
//!   makes it wait that long first, standing in for slow work;
//! - a message of kind `ping` is answered with a `pong` message carrying the
//!   same payload, sent back to its sender (PID 1's `pong`s become
//!   `kernel_message` events); other messages are ignored.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::message::{Message, Task, TaskReply};
use crate::runtime::{ProcessContext, Runtime, RuntimeError, RuntimeFactory};
use crate::syscalls::Outgoing;

/// The message kind echo answers.
pub const PING: &str = "ping";
/// The kind of its answer.
pub const PONG: &str = "pong";

/// Answers every task with its description and every `ping` with a `pong`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Echo;

#[async_trait]
impl Runtime for Echo {
    async fn execute(&self, _ctx: &ProcessContext, task: Task) -> TaskReply {
        if let Some(delay) = task.params.get("delay_ms") {
            let ms: u64 = delay.trim().parse().map_err(|_| {
                format!("delay_ms must be a whole number of milliseconds, got {delay:?}")
            })?;
            // The process's task timeout bounds the wait.
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        Ok(task.description)
    }

    async fn on_message(&self, ctx: &ProcessContext, message: Message) -> Result<(), RuntimeError> {
        if message.kind == PING {
            let mut pong = Outgoing::new(message.from, message.payload);
            pong.kind = PONG.to_owned();
            if let Err(err) = ctx.syscalls.send_message(pong).await {
                tracing::debug!(pid = %ctx.pid, to = %message.from, error = %err, "pong not sent");
            }
        }
        Ok(())
    }
}

/// Hands every process the same stateless [`Echo`].
#[derive(Debug, Clone)]
pub struct EchoFactory(Arc<Echo>);

impl Default for EchoFactory {
    fn default() -> Self {
        EchoFactory(Arc::new(Echo))
    }
}

impl RuntimeFactory for EchoFactory {
    fn create(&self, _ctx: &ProcessContext) -> Result<Arc<dyn Runtime>, RuntimeError> {
        Ok(self.0.clone())
    }
}
