//! What a runtime tells its kernel for the process's transcript.
//!
//! The kernel records model requests and answers itself (they pass through
//! [`Syscalls::chat`](crate::Syscalls::chat)) and tool results from
//! [`ToolCallReport`](crate::ToolCallReport); a runtime adds what only it
//! knows with [`Syscalls::record`](crate::Syscalls::record): the input of a
//! turn as its model sees it, and how the turn ended.

use serde::{Deserialize, Serialize};

use crate::message::{Message, MessageId, RequestId, Task};
use crate::process::Pid;

/// Where the input of a turn came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum InputSource {
    /// A task (`execute_task`, `delegate_async`, a cron run).
    Task {
        /// Its request id.
        request_id: RequestId,
        /// Who asked.
        from: Pid,
    },
    /// A message; `task_response` is the answer to a `delegate_async`.
    Message {
        /// Its id.
        message_id: MessageId,
        /// Sender.
        from: Pid,
        /// Its type (`message`, `task_response`, ...).
        #[serde(rename = "type")]
        kind: String,
    },
}

impl InputSource {
    /// The source of `task`.
    pub fn task(task: &Task) -> Self {
        InputSource::Task {
            request_id: task.request_id,
            from: task.from,
        }
    }

    /// The source of `message`.
    pub fn message(message: &Message) -> Self {
        InputSource::Message {
            message_id: message.id,
            from: message.from,
            kind: message.kind.clone(),
        }
    }
}

/// One thing a runtime records in its process's transcript.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnRecord {
    /// The turn's input, as the model is given it (its `user` message).
    Input {
        /// Where it came from.
        source: InputSource,
        /// The text.
        text: String,
    },
    /// The turn's final answer (a task's reply; a message turn's answer,
    /// which has nobody to go to).
    Answer(String),
    /// Why the turn failed.
    Failed(String),
}
