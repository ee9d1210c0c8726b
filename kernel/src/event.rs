//! What happened: the kernel's event values, as the bus numbers them, the
//! store keeps them and subscribers receive them.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use hivekernel_agents::{MessageId, Pid, RequestId, Role, Tier, TraceId};
use serde::{Deserialize, Serialize};

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    /// A process was created.
    Spawned {
        /// Its parent.
        ppid: Pid,
        /// Its name.
        name: Arc<str>,
        /// Its role.
        role: Role,
        /// Its tier.
        tier: Tier,
        /// Its runtime.
        runtime: Arc<str>,
        /// It came back after a kernel restart as the PID it had.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        restored: bool,
    },
    /// A process exited and is a zombie until collected (or was reaped with its parent).
    Exited {
        /// Its parent.
        ppid: Pid,
        /// Its name.
        name: Arc<str>,
        /// Exit code.
        exit_code: i32,
        /// Why; shared by every process one exit takes with it.
        reason: Arc<str>,
    },
    /// A zombie was removed from the table.
    Reaped {
        /// Who removed it.
        by: ReapCause,
    },
    /// A message passed its TTL before delivery and was dropped.
    MessageExpired {
        /// Its id.
        message_id: MessageId,
        /// Sender.
        from: Pid,
        /// Its kind.
        kind: String,
    },
    /// A message the kernel produced itself could not be delivered.
    MessageDropped {
        /// Its id.
        message_id: MessageId,
        /// Sender.
        from: Pid,
        /// Its kind.
        kind: String,
        /// Why.
        reason: String,
    },
    /// A message addressed to the kernel (PID 1), which keeps no mailbox.
    KernelMessage {
        /// Its id.
        message_id: MessageId,
        /// Sender.
        from: Pid,
        /// Its kind.
        kind: String,
        /// Body.
        payload: String,
    },
    /// A send or task was refused by the routing rules.
    RouteDenied {
        /// Would-be receiver.
        to: Pid,
        /// Why.
        reason: String,
    },
    /// The kernel refused this process something by policy (a capability,
    /// its parent's tools or limits, a budget, a rate limit).
    Denied {
        /// What it asked to do (`spawn`, `kill`, `send_message`, ...).
        action: String,
        /// Why it was refused.
        reason: String,
    },
    /// A task finished on this process.
    TaskFinished {
        /// Its request id.
        request_id: RequestId,
        /// Who asked.
        from: Pid,
        /// Whether it succeeded.
        success: bool,
        /// Time from pop to reply.
        duration_ms: u64,
        /// Why it failed, when the kernel failed it (a kernel restart).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<Arc<str>>,
    },
    /// The kernel restarted this process (same PID, fresh mailbox and runtime)
    /// after it exited, or because an operator asked (`manual`).
    Restarted {
        /// Times it has been restarted, this one included.
        attempt: u32,
        /// How long it waited after its exit (its backoff delay; 0 for a manual restart).
        delay_ms: u64,
        /// Asked for with `RestartProcess`: not counted against its restart
        /// intensity. Left out of the JSON when false, as before the field existed.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        manual: bool,
    },
    /// A child of this process exceeded its restart intensity: the child
    /// stays dead and this process fails in turn (PID 1 only reports it).
    Escalated {
        /// The child that failed too often.
        child: Pid,
        /// Its name.
        name: Arc<str>,
        /// Restarts it had within the window.
        restarts: u32,
        /// The window.
        within_seconds: u64,
    },
    /// A cron entry ran (or skipped a slot); the event concerns its target.
    CronRun {
        /// The entry.
        name: Arc<str>,
        /// `ok`, `failed`, `skipped` or `missed`.
        status: String,
        /// How long the action took.
        duration_ms: u64,
    },
    /// This process made a model call through the kernel (refusals by
    /// policy are `denied` events instead: no call was made).
    LlmCall {
        /// The model it named.
        model: Arc<str>,
        /// Prompt tokens the provider reported (0 when the call failed).
        prompt_tokens: u64,
        /// Completion tokens the provider reported.
        completion_tokens: u64,
        /// What it cost, in billionths of a US dollar, from `llm.prices`.
        cost_nano_usd: u64,
        /// From the request to the answer (retries included).
        duration_ms: u64,
        /// Why it failed; absent when it answered.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// Which attempt: on an attempt that failed and is tried again
        /// (or was cancelled), and on the outcome of a call that took more
        /// than one; absent for a call answered at the first attempt.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attempt: Option<u32>,
    },
    /// This process's runtime ran one of its tools.
    ToolCall {
        /// The tool it asked for.
        tool: String,
        /// Whether the tool returned a result (not an error).
        ok: bool,
        /// How long the tool ran.
        duration_ms: u64,
        /// Why it failed (cut to 512 bytes); absent when it did not.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// An MCP server changed state (on PID 1): `ready`, `tools_changed`,
    /// `restarting` (with the delay), `failed` (for good).
    McpServer {
        /// Its name in `mcp_servers`.
        server: String,
        /// What it is now.
        state: String,
        /// Why it failed, when it did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// Its restarts so far (this one included, when restarting).
        attempt: u32,
        /// The backoff before the next start, when restarting.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        delay_ms: Option<u64>,
    },
    /// This process asks a person (the inbox): a tool call's approval or a
    /// question; it waits until the request is resolved.
    ApprovalRequested {
        /// The request's id (`hivekernel approve ID`).
        id: u64,
        /// `approval` or `question`.
        kind: String,
        /// The tool, for an approval.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool: Option<String>,
        /// Its arguments (cut), for an approval; the question, for a question.
        text: String,
        /// When the timeout resolves it (Unix ms).
        deadline_ms: u64,
    },
    /// A request of this process was resolved: `approved`, `denied`,
    /// `answered`, `timed_out` or `withdrawn`, and by whom.
    ApprovalResolved {
        /// The request's id.
        id: u64,
        /// What was decided.
        decision: String,
        /// Who decided: `admin`, `token 3`, `process 7`, `timeout`, `kernel`.
        by: String,
        /// The note, reason or answer (cut), when one was given.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        text: String,
    },
    /// The inbox webhook could not be told of a request of this process.
    NotifyFailed {
        /// The request's id.
        id: u64,
        /// Why, naming the last attempt's problem.
        error: String,
        /// Attempts made (0: dropped before any, the queue being full).
        attempts: u32,
    },
    /// A saved skill was created, edited or deleted (on the process that
    /// changed it; PID 1 for an operator).
    SkillChanged {
        /// The skill's name.
        name: String,
        /// `create`, `edit` or `delete`.
        action: String,
        /// The version the change wrote.
        version: u64,
        /// The process the skill belongs to.
        owner: Pid,
        /// Its visibility from this version on.
        visibility: String,
        /// Who changed it: `process 7`, `admin`, `token 3`.
        by: String,
        /// Why, when given.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// An operator token was created or revoked (on PID 1), and by whom.
    Token {
        /// `created` or `revoked`.
        action: String,
        /// The token's id.
        id: u64,
        /// Its name.
        name: String,
        /// Its scope.
        scope: String,
        /// Who did it: `admin`, `token 3`.
        by: String,
    },
    /// Stream marker (seq 0): a subscriber fell behind and missed this many events.
    Lagged {
        /// Events skipped.
        missed: u64,
    },
    /// Stream marker (seq 0), first in a replay: this many events after the
    /// requested start had already left the log (`kernel.event_log_limit`).
    Pruned {
        /// Events that cannot be replayed.
        missed: u64,
    },
    /// Stream marker (seq 0): the replay requested is complete; live events follow.
    ReplayDone {
        /// Sequence number of the last replayed event (the requested start when none were).
        last_seq: u64,
    },
}

/// Longest text an event keeps in any one field; longer is cut, with the
/// marker, before the event enters the ring, the store or a stream.
pub const MAX_EVENT_TEXT: usize = 4096;

impl EventKind {
    /// Cuts every text field to at most [`MAX_EVENT_TEXT`] bytes, in place
    /// (every spawn and exit passes here: nothing is moved or allocated
    /// unless a text is too long).
    #[inline]
    pub(crate) fn bound(&mut self) {
        use EventKind::*;
        fn cut(text: &mut String) {
            if text.len() > MAX_EVENT_TEXT {
                *text = hivekernel_agents::text::cut(std::mem::take(text), MAX_EVENT_TEXT);
            }
        }
        match self {
            Exited { reason, .. } if reason.len() > MAX_EVENT_TEXT => {
                *reason = Arc::from(hivekernel_agents::text::cut_str(reason, MAX_EVENT_TEXT));
            }
            MessageExpired { kind, .. } => cut(kind),
            MessageDropped { kind, reason, .. } => {
                cut(kind);
                cut(reason);
            }
            KernelMessage { kind, payload, .. } => {
                cut(kind);
                cut(payload);
            }
            RouteDenied { reason, .. } => cut(reason),
            Denied { action, reason } => {
                cut(action);
                cut(reason);
            }
            CronRun { status, .. } => cut(status),
            LlmCall { error, .. } => error.iter_mut().for_each(cut),
            ToolCall { tool, error, .. } => {
                cut(tool);
                error.iter_mut().for_each(cut);
            }
            McpServer { reason, .. } => reason.iter_mut().for_each(cut),
            _ => {}
        }
    }

    /// The names of the events a subscriber may ask for by type (the
    /// stream markers aside).
    pub const TYPES: [&'static str; 20] = [
        "spawned",
        "exited",
        "reaped",
        "message_expired",
        "message_dropped",
        "kernel_message",
        "route_denied",
        "denied",
        "task_finished",
        "restarted",
        "escalated",
        "cron_run",
        "llm_call",
        "tool_call",
        "mcp_server",
        "token",
        "approval_requested",
        "approval_resolved",
        "notify_failed",
        "skill_changed",
    ];

    /// The snake_case name, as in the `type` field of the JSON form.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::Spawned { .. } => "spawned",
            EventKind::Exited { .. } => "exited",
            EventKind::Reaped { .. } => "reaped",
            EventKind::MessageExpired { .. } => "message_expired",
            EventKind::MessageDropped { .. } => "message_dropped",
            EventKind::KernelMessage { .. } => "kernel_message",
            EventKind::RouteDenied { .. } => "route_denied",
            EventKind::Denied { .. } => "denied",
            EventKind::TaskFinished { .. } => "task_finished",
            EventKind::Restarted { .. } => "restarted",
            EventKind::Escalated { .. } => "escalated",
            EventKind::CronRun { .. } => "cron_run",
            EventKind::LlmCall { .. } => "llm_call",
            EventKind::ToolCall { .. } => "tool_call",
            EventKind::McpServer { .. } => "mcp_server",
            EventKind::Token { .. } => "token",
            EventKind::ApprovalRequested { .. } => "approval_requested",
            EventKind::ApprovalResolved { .. } => "approval_resolved",
            EventKind::NotifyFailed { .. } => "notify_failed",
            EventKind::SkillChanged { .. } => "skill_changed",
            EventKind::Lagged { .. } => "lagged",
            EventKind::Pruned { .. } => "pruned",
            EventKind::ReplayDone { .. } => "replay_done",
        }
    }
}

/// Why a zombie left the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReapCause {
    /// Its parent collected it.
    WaitChild,
    /// Nobody collected it within `zombie_timeout_seconds`.
    Timeout,
    /// Its parent exited too.
    ParentExited,
    /// The kernel restarted while it was alive (it was not in the config).
    KernelRestart,
}

/// One kernel event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Position in the kernel's event sequence, starting at 1.
    pub seq: u64,
    /// Wall-clock time.
    pub at_unix_ms: u64,
    /// The process it concerns.
    pub pid: Pid,
    /// The trace of the work that caused it, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceId>,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// Milliseconds since the Unix epoch.
pub(crate) fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
