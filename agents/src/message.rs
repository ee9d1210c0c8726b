//! Messages and tasks as a runtime receives them.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::approval::Carried;
use crate::process::Pid;
use crate::trace::TraceContext;

/// Kernel-wide unique message id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MessageId(pub u64);

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Kernel-wide unique id correlating a task request with its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Well-known message kinds the kernel itself produces.
pub mod kinds {
    /// A plain message (the default kind).
    pub const MESSAGE: &str = "message";
    /// The answer to a `delegate_async` request; `request_id` names it.
    pub const TASK_RESPONSE: &str = "task_response";
    /// A child of the receiver exited; the payload is its exit record as JSON.
    pub const CHILD_EXITED: &str = "child_exited";
    /// A low-priority copy of a message between two of the receiver's children.
    pub const SIBLING_COPY: &str = "sibling_copy";
}

/// A message delivered to a process's mailbox (anything but a task request).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Its id.
    pub id: MessageId,
    /// Sender.
    pub from: Pid,
    /// Receiver this message was addressed to.
    pub to: Pid,
    /// Kind, e.g. `message`, `task_response`, `child_exited`.
    pub kind: String,
    /// Body.
    pub payload: String,
    /// Priority it was sent with.
    pub priority: Priority,
    /// For `task_response`: the request it answers.
    pub request_id: Option<RequestId>,
    /// For cross-branch messages: the nearest common ancestor it was routed through.
    pub via: Option<Pid>,
    /// The work it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceContext>,
    /// The approval rules of whoever asked for it, along the chain of
    /// requests that led to it: the sender's own, and those the sender's
    /// work was asked under. While the receiver handles it, its tool calls
    /// need the approvals these rules ask for as well as its own, so no
    /// process causes, through another, a call it could not make itself.
    #[serde(default, skip_serializing_if = "Carried::is_empty")]
    pub approvals: Carried,
}

/// A unit of work sent with `execute_task` or `delegate_async`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// Correlates the reply.
    pub request_id: RequestId,
    /// Who asked.
    pub from: Pid,
    /// What to do.
    pub description: String,
    /// Structured parameters.
    pub params: BTreeMap<String, String>,
    /// The work it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceContext>,
    /// The approval rules of whoever asked for it, along the chain of
    /// requests that led to it: the sender's own, and those the sender's
    /// work was asked under. While the receiver handles it, its tool calls
    /// need the approvals these rules ask for as well as its own, so no
    /// process causes, through another, a call it could not make itself.
    #[serde(default, skip_serializing_if = "Carried::is_empty")]
    pub approvals: Carried,
}

/// The answer to a task: its output, or why it failed.
pub type TaskReply = Result<String, String>;

/// Delivery priority. Lower levels are served first; aging lifts waiting messages.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// Control traffic; served before anything else.
    Critical,
    /// Urgent work.
    High,
    /// The default.
    #[default]
    Normal,
    /// Background traffic (e.g. sibling copies).
    Low,
}

impl Priority {
    /// Every priority, most urgent first.
    pub const ALL: [Priority; 4] = [
        Priority::Critical,
        Priority::High,
        Priority::Normal,
        Priority::Low,
    ];

    /// 0 for critical up to 3 for low.
    pub fn level(self) -> usize {
        self as usize
    }

    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Priority {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Priority::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                format!("unknown priority {s:?} (expected one of: critical, high, normal, low)")
            })
    }
}
