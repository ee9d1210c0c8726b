//! The inbox: what agents ask people. An approval a tool call needs before
//! it runs (an `approval` rule in the config), or a question an agent puts
//! with `ask_human`. The asking process waits (state `waiting`) until a
//! person resolves the request or its timeout does; a process that goes
//! away withdraws its requests. Resolved requests are remembered for a
//! while, so resolving one twice is told apart from an unknown id.
//!
//! A request filed again after a kernel restart waits for its resumed turn
//! to take it up ([`Inbox::take_up`]); a person may resolve it before that,
//! and the turn then finds the resolution.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

pub use hivekernel_agents::OnTimeout;
use hivekernel_agents::{Pid, TraceId};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, oneshot};

/// Resolved requests remembered, newest kept.
const REMEMBERED: usize = 4096;
/// Changes buffered for each watcher before it lags.
const WATCH_BUFFER: usize = 256;

/// What a request asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Ask {
    /// May this tool call run?
    Approval {
        /// The tool (`shell_exec`, `mcp:fs/write_file`).
        tool: String,
        /// Its arguments as JSON, cut.
        arguments: String,
    },
    /// A question, with the answers offered (none: free text).
    Question {
        /// What the agent asks.
        question: String,
        /// The answers it offers; an answer must be one of them when given.
        choices: Vec<String>,
    },
}

impl Ask {
    /// `approval` or `question`.
    pub fn kind(&self) -> &'static str {
        match self {
            Ask::Approval { .. } => "approval",
            Ask::Question { .. } => "question",
        }
    }
}

/// One request in the inbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboxRequest {
    /// Its id (`hivekernel approve ID`).
    pub id: u64,
    /// The process that asks.
    pub pid: Pid,
    /// Its name.
    pub name: String,
    /// What it asks.
    #[serde(flatten)]
    pub ask: Ask,
    /// When it asked (Unix ms).
    pub created_ms: u64,
    /// When its timeout resolves it (Unix ms).
    pub deadline_ms: u64,
    /// What the timeout decides for an approval: `deny` unless its rule
    /// says `approve`.
    pub on_timeout: OnTimeout,
    /// The trace of the work that asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceId>,
    /// The approval rules the asking turn was asked under, kept so that
    /// the turn, resumed after a restart, still obeys them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub asked_under: Vec<hivekernel_agents::approval::ApprovalRule>,
}

/// How a request was resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum Decision {
    /// The tool call may run.
    Approved {
        /// The approver's note, if any.
        note: String,
    },
    /// The tool call is refused, or the question declined.
    Denied {
        /// Why, if said.
        reason: String,
    },
    /// The question's answer.
    Answered {
        /// The answer.
        answer: String,
    },
    /// Nobody decided in time; `on_timeout` applies.
    TimedOut,
    /// The process went away (killed, exited) before anyone decided.
    Withdrawn,
}

impl Decision {
    /// The note, reason or answer a person gave; empty for a timeout or a
    /// withdrawal.
    pub fn text(&self) -> &str {
        match self {
            Decision::Approved { note } => note,
            Decision::Denied { reason } => reason,
            Decision::Answered { answer } => answer,
            Decision::TimedOut | Decision::Withdrawn => "",
        }
    }

    /// Its name in events and the CLI.
    pub fn as_str(&self) -> &'static str {
        match self {
            Decision::Approved { .. } => "approved",
            Decision::Denied { .. } => "denied",
            Decision::Answered { .. } => "answered",
            Decision::TimedOut => "timed_out",
            Decision::Withdrawn => "withdrawn",
        }
    }
}

/// A decision, who made it and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Resolution {
    /// What was decided.
    #[serde(flatten)]
    pub decision: Decision,
    /// Who: `admin`, `token 3`, `process 7`, `timeout`, `kernel`.
    pub by: String,
    /// When (Unix ms).
    pub at_ms: u64,
}

/// A change to the inbox, for watchers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A new request.
    Asked(Arc<InboxRequest>),
    /// A request left the inbox.
    Resolved(Arc<InboxRequest>, Arc<Resolution>),
}

struct Pending {
    request: Arc<InboxRequest>,
    /// The waiting turn; `None` for a request filed again after a restart
    /// until its resumed turn takes it up.
    reply: Option<oneshot::Sender<Resolution>>,
}

#[derive(Default)]
struct State {
    pending: BTreeMap<u64, Pending>,
    /// Recently resolved, oldest first.
    resolved: VecDeque<(Arc<InboxRequest>, Arc<Resolution>)>,
}

/// The kernel's inbox.
pub struct Inbox {
    state: Mutex<State>,
    changes: broadcast::Sender<Change>,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("pending", &self.state.lock().pending.len())
            .finish()
    }
}

impl Default for Inbox {
    fn default() -> Self {
        Inbox {
            state: Mutex::new(State::default()),
            changes: broadcast::channel(WATCH_BUFFER).0,
        }
    }
}

/// Why a resolution was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotPending {
    /// No request had this id.
    Unknown,
    /// It was resolved already, like this.
    Resolved(Arc<Resolution>),
}

impl Inbox {
    /// Files a request (its id never used before) and answers the receiver
    /// its resolution arrives on.
    pub fn ask(&self, request: InboxRequest) -> (Arc<InboxRequest>, oneshot::Receiver<Resolution>) {
        let (reply, answer) = oneshot::channel();
        (self.file(request, Some(reply)), answer)
    }

    /// Files again a request that was pending when the kernel stopped; it
    /// waits for its resumed turn to [take it up](Inbox::take_up).
    pub fn refile(&self, request: InboxRequest) -> Arc<InboxRequest> {
        self.file(request, None)
    }

    fn file(
        &self,
        request: InboxRequest,
        reply: Option<oneshot::Sender<Resolution>>,
    ) -> Arc<InboxRequest> {
        let mut state = self.state.lock();
        let request = Arc::new(request);
        state.pending.insert(
            request.id,
            Pending {
                request: request.clone(),
                reply,
            },
        );
        // Under the lock, so a watcher sees a request once: in its
        // first list or as a change after it.
        let _ = self.changes.send(Change::Asked(request.clone()));
        request
    }

    /// A resumed turn takes up request `id` again: the request, and the
    /// receiver its resolution arrives on or how it was resolved meanwhile;
    /// `None` when it is neither pending nor remembered.
    #[allow(clippy::type_complexity)]
    pub fn take_up(
        &self,
        id: u64,
    ) -> Option<(
        Arc<InboxRequest>,
        Result<oneshot::Receiver<Resolution>, Arc<Resolution>>,
    )> {
        let mut state = self.state.lock();
        if let Some(pending) = state.pending.get_mut(&id) {
            let (reply, answer) = oneshot::channel();
            pending.reply = Some(reply);
            return Some((pending.request.clone(), Ok(answer)));
        }
        state
            .resolved
            .iter()
            .find(|(request, _)| request.id == id)
            .map(|(request, how)| (request.clone(), Err(how.clone())))
    }

    /// The pending request `id`, if it is.
    pub fn get(&self, id: u64) -> Result<Arc<InboxRequest>, NotPending> {
        let state = self.state.lock();
        if let Some(pending) = state.pending.get(&id) {
            return Ok(pending.request.clone());
        }
        Err(Self::not_pending(&state, id))
    }

    fn not_pending(state: &State, id: u64) -> NotPending {
        state
            .resolved
            .iter()
            .find(|(request, _)| request.id == id)
            .map_or(NotPending::Unknown, |(_, how)| {
                NotPending::Resolved(how.clone())
            })
    }

    /// Resolves request `id`: its process gets `resolution`. Refused when
    /// it is not pending.
    pub fn resolve(
        &self,
        id: u64,
        resolution: Resolution,
    ) -> Result<Arc<InboxRequest>, NotPending> {
        let resolution = Arc::new(resolution);
        let pending = {
            let mut state = self.state.lock();
            let Some(pending) = state.pending.remove(&id) else {
                return Err(Self::not_pending(&state, id));
            };
            if state.resolved.len() == REMEMBERED {
                state.resolved.pop_front();
            }
            state
                .resolved
                .push_back((pending.request.clone(), resolution.clone()));
            let _ = self.changes.send(Change::Resolved(
                pending.request.clone(),
                resolution.clone(),
            ));
            pending
        };
        // The process may be gone already: then nobody waits for this.
        if let Some(reply) = pending.reply {
            let _ = reply.send((*resolution).clone());
        }
        Ok(pending.request)
    }

    /// Every pending request, oldest first.
    pub fn pending(&self) -> Vec<Arc<InboxRequest>> {
        let state = self.state.lock();
        state.pending.values().map(|p| p.request.clone()).collect()
    }

    /// The pending requests and every change after them, without a gap.
    pub fn watch(&self) -> (Vec<Arc<InboxRequest>>, broadcast::Receiver<Change>) {
        let state = self.state.lock();
        let changes = self.changes.subscribe();
        let pending = state.pending.values().map(|p| p.request.clone()).collect();
        (pending, changes)
    }
}
