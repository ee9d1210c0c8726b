//! The `echo` runtime: answers every task with its own description.
//!
//! Useful for smoke tests, demos and benchmarks of the kernel alone.

use std::sync::Arc;

use async_trait::async_trait;

use crate::message::{Task, TaskReply};
use crate::runtime::{ProcessContext, Runtime, RuntimeError, RuntimeFactory};

/// Answers every task with its description; ignores messages.
#[derive(Debug, Default, Clone, Copy)]
pub struct Echo;

#[async_trait]
impl Runtime for Echo {
    async fn execute(&self, _ctx: &ProcessContext, task: Task) -> TaskReply {
        Ok(task.description)
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
