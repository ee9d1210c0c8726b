//! `execute_task`, `delegate_async` and `send_message`.

use crate::capability::Capability;
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{MAX_TIMEOUT_SECONDS, decode, invalid, refused, timeout};
use crate::message::{Priority, kinds};
use crate::process::Pid;
use crate::syscalls::{Outgoing, TaskSpec};
use crate::tools::{Tool, ToolContext, ToolError};

/// Runs a task on another process and waits for its output.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExecuteTask;

/// Sends a task and returns at once; the answer arrives as a message.
#[derive(Debug, Clone, Copy, Default)]
pub struct DelegateAsync;

/// Sends a fire-and-forget message.
#[derive(Debug, Clone, Copy, Default)]
pub struct SendMessage;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecuteArgs {
    pid: u64,
    task: String,
    timeout_seconds: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DelegateArgs {
    pid: u64,
    task: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SendArgs {
    pid: u64,
    message: String,
    #[serde(rename = "type")]
    kind: Option<String>,
    priority: Option<String>,
}

#[async_trait]
impl Tool for ExecuteTask {
    fn name(&self) -> &'static str {
        "execute_task"
    }

    fn capability(&self) -> Option<Capability> {
        None
    }

    fn description(&self) -> &'static str {
        "Run a task on another process and wait for its output (default timeout: the target's)."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "pid": { "type": "integer", "minimum": 1, "description": "The process to run it on." },
                "task": { "type": "string", "description": "What to do." },
                "timeout_seconds": { "type": "integer", "minimum": 1, "maximum": MAX_TIMEOUT_SECONDS, "description": "Longest wait for the answer." }
            },
            "required": ["pid", "task"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let args: ExecuteArgs = decode(self, args)?;
        let mut task = TaskSpec::new(Pid(args.pid), args.task);
        task.timeout = timeout(self, "timeout_seconds", args.timeout_seconds)?;
        ctx.process
            .syscalls
            .execute_task(task)
            .await
            .map_err(refused)?
            .map_err(|why| ToolError::new(format!("task failed: {why}")))
    }
}

#[async_trait]
impl Tool for DelegateAsync {
    fn name(&self) -> &'static str {
        "delegate_async"
    }

    fn capability(&self) -> Option<Capability> {
        None
    }

    fn description(&self) -> &'static str {
        "Send a task to another process without waiting; its answer arrives later as a task_response message."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "pid": { "type": "integer", "minimum": 1, "description": "The process to run it on." },
                "task": { "type": "string", "description": "What to do." }
            },
            "required": ["pid", "task"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let args: DelegateArgs = decode(self, args)?;
        let request = ctx
            .process
            .syscalls
            .delegate_async(TaskSpec::new(Pid(args.pid), args.task))
            .await
            .map_err(refused)?;
        Ok(format!(
            "delegated as request {request}; the answer will arrive as a {} message naming it",
            kinds::TASK_RESPONSE
        ))
    }
}

#[async_trait]
impl Tool for SendMessage {
    fn name(&self) -> &'static str {
        "send_message"
    }

    fn capability(&self) -> Option<Capability> {
        Some(Capability::SendMessage)
    }

    fn description(&self) -> &'static str {
        "Send a message to another process without waiting for an answer."
    }

    fn parameters(&self) -> Value {
        let priorities: Vec<&str> = Priority::ALL.iter().map(|p| p.as_str()).collect();
        json!({
            "type": "object",
            "properties": {
                "pid": { "type": "integer", "minimum": 1, "description": "The receiver." },
                "message": { "type": "string", "description": "The body." },
                "type": { "type": "string", "description": "Message kind (default \"message\")." },
                "priority": { "type": "string", "enum": priorities, "description": "Delivery priority (default normal)." }
            },
            "required": ["pid", "message"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let args: SendArgs = decode(self, args)?;
        let mut message = Outgoing::new(Pid(args.pid), args.message);
        if let Some(kind) = args.kind {
            message.kind = kind;
        }
        if let Some(priority) = args.priority {
            message.priority = priority
                .parse()
                .map_err(|why: String| invalid(self, format!("field `priority`: {why}")))?;
        }
        let id = ctx
            .process
            .syscalls
            .send_message(message)
            .await
            .map_err(refused)?;
        Ok(format!("sent as message {id}"))
    }
}
