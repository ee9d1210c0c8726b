//! Transcript entries: what one step of an agent's turn recorded, and
//! what a read of a process's transcript asks for and gets. The values
//! only; `transcripts` records them and the store keeps them.

use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use hivekernel_agents::InputSource;
use hivekernel_agents::llm::{ChatMessage, ChatRole, ToolCall};
use hivekernel_agents::text::cut;
use hivekernel_agents::{Pid, TraceId};
use serde::{Deserialize, Serialize};

/// One transcript entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Unique across the kernel's life, increasing in the order entries are recorded.
    pub id: u64,
    /// The process it belongs to.
    pub pid: Pid,
    /// The turn it belongs to: the id handed to the turn's first entry's turn.
    pub turn: u64,
    /// Wall-clock time it was recorded.
    pub at_unix_ms: u64,
    /// The trace of the work it was part of, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceId>,
    /// What it records.
    #[serde(flatten)]
    pub kind: EntryKind,
}

/// What an entry records. Every text is cut to `max_text_bytes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EntryKind {
    /// The turn's input as the model is given it.
    Input {
        /// Where it came from.
        source: InputSource,
        /// The text.
        text: String,
    },
    /// A message a request sent that no earlier entry holds: the system
    /// prompt, a context note, a text shortened to fit, history from before
    /// a kernel restart.
    Message {
        /// Its role.
        role: ChatRole,
        /// Its text.
        content: String,
        /// The tool calls of an assistant message.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
        /// The call a tool message answers.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool_call_id: Option<String>,
    },
    /// A model request: the messages it sent, in order, as entry ids.
    Request {
        /// The model it named.
        model: Arc<str>,
        /// Entry ids of the messages sent.
        messages: Vec<u64>,
        /// Cap on the answer's tokens.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_tokens: Option<u32>,
        /// Its prompt tokens as estimated before sending, calibrated by
        /// what the server counted of earlier requests on the model.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        estimated_tokens: Option<u64>,
    },
    /// The model's answer to the request before it.
    Response {
        /// Its text.
        content: String,
        /// The tools it asked to run, with their arguments.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
        /// Why it stopped, when it said.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        finish_reason: Option<String>,
        /// What a reasoning model thought first (`reasoning_content`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reasoning: Option<String>,
        /// Prompt tokens the provider reported.
        prompt_tokens: u64,
        /// Completion tokens the provider reported.
        completion_tokens: u64,
        /// From the request to the answer.
        duration_ms: u64,
    },
    /// The request before it failed, or one attempt at it that is tried
    /// again (its error says so).
    ModelError {
        /// Why.
        error: String,
        /// From the request (or the attempt) to the failure.
        duration_ms: u64,
        /// The answer text that had streamed in when it failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        partial: Option<String>,
    },
    /// Answer text as it streams in, for live watchers only: never kept,
    /// since the `response` after it holds the whole answer.
    Partial {
        /// The text since the last partial entry.
        text: String,
        /// The model's thinking rather than its answer.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        reasoning: bool,
    },
    /// A tool call's result, as handed back to the model.
    ToolResult {
        /// The call it answers (in the response before it).
        call_id: String,
        /// The tool.
        tool: String,
        /// Whether the tool returned a result (not an error).
        ok: bool,
        /// The text the model got.
        output: String,
        /// How long the tool ran.
        duration_ms: u64,
    },
    /// The turn's final answer.
    Answer {
        /// The text.
        text: String,
    },
    /// Why the turn failed.
    Failed {
        /// The reason.
        error: String,
    },
}

impl EntryKind {
    /// The snake_case name, as in the `type` field of the JSON form.
    pub fn name(&self) -> &'static str {
        match self {
            EntryKind::Input { .. } => "input",
            EntryKind::Message { .. } => "message",
            EntryKind::Request { .. } => "request",
            EntryKind::Response { .. } => "response",
            EntryKind::ModelError { .. } => "model_error",
            EntryKind::Partial { .. } => "partial",
            EntryKind::ToolResult { .. } => "tool_result",
            EntryKind::Answer { .. } => "answer",
            EntryKind::Failed { .. } => "failed",
        }
    }

    /// Cuts every text to `max` bytes, in place.
    pub(crate) fn bound(&mut self, max: usize) {
        let fit = |text: &mut String| {
            if text.len() > max {
                *text = cut(std::mem::take(text), max);
            }
        };
        let calls = |calls: &mut Vec<ToolCall>| {
            for call in calls {
                fit(&mut call.arguments);
            }
        };
        match self {
            EntryKind::Input { text, .. }
            | EntryKind::Answer { text }
            | EntryKind::Failed { error: text }
            | EntryKind::Partial { text, .. } => fit(text),
            EntryKind::ModelError { error, partial, .. } => {
                fit(error);
                partial.iter_mut().for_each(fit);
            }
            EntryKind::Message {
                content,
                tool_calls,
                ..
            } => {
                fit(content);
                calls(tool_calls);
            }
            EntryKind::Response {
                content,
                tool_calls,
                reasoning,
                ..
            } => {
                fit(content);
                reasoning.iter_mut().for_each(fit);
                calls(tool_calls);
            }
            EntryKind::ToolResult { output, .. } => fit(output),
            EntryKind::Request { .. } => {}
        }
    }

    /// The fingerprint of the message a model is sent for this entry, if
    /// it stands for one: an input is the `user` message, a response the
    /// `assistant` one, a tool result the `tool` one.
    pub(crate) fn fingerprint(&self) -> Option<u64> {
        Some(match self {
            EntryKind::Input { text, .. } => fingerprint(ChatRole::User, text, &[], None),
            EntryKind::Message {
                role,
                content,
                tool_calls,
                tool_call_id,
            } => fingerprint(*role, content, tool_calls, tool_call_id.as_deref()),
            EntryKind::Response {
                content,
                tool_calls,
                ..
            } => fingerprint(ChatRole::Assistant, content, tool_calls, None),
            EntryKind::ToolResult {
                call_id, output, ..
            } => fingerprint(ChatRole::Tool, output, &[], Some(call_id)),
            _ => return None,
        })
    }

    /// Bytes it takes, roughly as stored: what retention counts.
    pub(crate) fn weight(&self) -> u64 {
        let calls = |calls: &[ToolCall]| -> usize {
            calls
                .iter()
                .map(|c| c.id.len() + c.name.len() + c.arguments.len() + 32)
                .sum()
        };
        let texts = match self {
            EntryKind::Input { text, .. }
            | EntryKind::Answer { text }
            | EntryKind::Failed { error: text }
            | EntryKind::Partial { text, .. } => text.len(),
            EntryKind::ModelError { error, partial, .. } => {
                error.len() + partial.as_ref().map_or(0, String::len)
            }
            EntryKind::Message {
                content,
                tool_calls,
                ..
            } => content.len() + calls(tool_calls),
            EntryKind::Response {
                content,
                tool_calls,
                reasoning,
                ..
            } => content.len() + reasoning.as_ref().map_or(0, String::len) + calls(tool_calls),
            EntryKind::ToolResult {
                output,
                tool,
                call_id,
                ..
            } => output.len() + tool.len() + call_id.len(),
            EntryKind::Request {
                model, messages, ..
            } => model.len() + 12 * messages.len(),
        };
        texts as u64 + 96
    }
}

/// Which entries of one process a read wants, oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Query {
    /// Only entries with a larger id (the paging cursor).
    pub after_id: u64,
    /// Only turns with an id at least this (the first of a tail, once found).
    pub min_turn: u64,
    /// Only turns with a larger id.
    pub after_turn: u64,
    /// Only entries recorded at or after this time.
    pub since_unix_ms: u64,
    /// Only the newest this many turns (after the filters above); resolved
    /// into `min_turn` by the read.
    pub tail_turns: Option<u32>,
    /// At most this many entries.
    pub limit: usize,
    /// At most about this many bytes of entries (at least one entry).
    pub max_bytes: usize,
}

impl Query {
    /// Whether `entry` passes the filters other than `tail_turns`.
    pub(crate) fn matches(&self, entry: &Entry) -> bool {
        entry.id > self.after_id
            && entry.turn > self.after_turn
            && entry.turn >= self.min_turn
            && entry.at_unix_ms >= self.since_unix_ms
    }
}

/// One read's entries.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Page {
    /// Oldest first.
    pub entries: Vec<Entry>,
    /// More entries match after the last one.
    pub more: bool,
    /// The first turn the read included (what `tail_turns` resolved to).
    pub min_turn: u64,
}

/// Fills a [`Page`] from matching entries, oldest first, up to the
/// query's count and (about) its bytes.
#[derive(Debug)]
pub(crate) struct PageBuilder {
    page: Page,
    bytes: usize,
    limit: usize,
    max_bytes: usize,
}

impl PageBuilder {
    /// A page for `query`, whose tail (if it asked for one) begins at `min_turn`.
    pub(crate) fn new(query: &Query, min_turn: u64) -> Self {
        PageBuilder {
            page: Page {
                min_turn,
                ..Page::default()
            },
            bytes: 0,
            limit: query.limit.max(1),
            max_bytes: query.max_bytes,
        }
    }

    /// Adds the next matching entry; false once the page is full, which
    /// `entry` then only marks as having more.
    pub(crate) fn push(&mut self, entry: Entry) -> bool {
        let page = &mut self.page;
        if page.entries.len() >= self.limit
            || (!page.entries.is_empty() && self.bytes >= self.max_bytes)
        {
            page.more = true;
            return false;
        }
        self.bytes += entry.kind.weight() as usize;
        page.entries.push(entry);
        true
    }

    pub(crate) fn finish(self) -> Page {
        self.page
    }
}

/// The newest `n` distinct turns seen so far, for `tail_turns`.
#[derive(Debug)]
pub(crate) struct TailTurns {
    n: usize,
    turns: BTreeSet<u64>,
}

impl TailTurns {
    pub(crate) fn new(n: u32) -> Self {
        TailTurns {
            n: n as usize,
            turns: BTreeSet::new(),
        }
    }

    pub(crate) fn see(&mut self, turn: u64) {
        if self.turns.insert(turn) && self.turns.len() > self.n {
            self.turns.pop_first();
        }
    }

    /// Whether no entry with an id at most `id` can change the answer: `n`
    /// turns are found, all newer than it (an entry's turn is never
    /// larger than its id).
    pub(crate) fn settled_before(&self, id: u64) -> bool {
        self.turns.len() >= self.n && self.turns.first().is_some_and(|&first| first > id)
    }

    /// The first turn of the tail; `u64::MAX` (nothing) when no turn matched.
    pub(crate) fn first(&self) -> u64 {
        self.turns.first().copied().unwrap_or(u64::MAX)
    }
}

/// [`fingerprint`] of a message as sent.
pub(crate) fn message_fingerprint(message: &ChatMessage) -> u64 {
    let call_id = message.tool_call_id.as_deref();
    fingerprint(message.role, &message.content, &message.tool_calls, call_id)
}

/// Identifies a message by what a model sees of it.
fn fingerprint(role: ChatRole, content: &str, calls: &[ToolCall], call_id: Option<&str>) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    role.hash(&mut hasher);
    content.hash(&mut hasher);
    for call in calls {
        (&call.id, &call.name, &call.arguments).hash(&mut hasher);
    }
    call_id.hash(&mut hasher);
    hasher.finish()
}
