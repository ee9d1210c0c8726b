//! Transcripts: what every agent did, turn by turn.
//!
//! A *turn* is one mailbox item a process handles (a task or a message):
//! the runner runs its handler as one piece of work (`trace::scope`), and
//! every entry recorded while it runs carries the turn's id, allocated at
//! its first entry. The
//! entries of a `tool_agent` turn, in order: its `input`; for each model
//! call a `request` and a `response` (or `model_error`); a `tool_result`
//! per tool call; and its `answer` or `failed`.
//!
//! A request lists the messages it sent as entry ids: each message already
//! recorded (the input, an earlier response or tool result, a system prompt
//! sent before) is named by its entry, and only a message never sent before
//! becomes a `message` entry of its own. So a long conversation is stored
//! once, not once per request.
//!
//! Entries go to live watchers at once, and into the store through its
//! batched writer, written together at most 100 ms later in a transaction
//! after the batch being committed, so recording adds no transaction to a
//! turn and no wait to any commit; a process that lives less than that
//! and whose transcript leaves with it never has its entries written.
//! The writer prunes them by age and size and deletes a process's
//! transcript when it is reaped, unless told to keep it. A kernel without a
//! store keeps a bounded in-memory tail instead.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::SystemTime;

use hivekernel_agents::Pid;
use hivekernel_agents::llm::ChatMessage;
use parking_lot::Mutex;
use tokio::sync::broadcast;
use tokio_util::task::TaskTracker;

use crate::config::TranscriptSettings;
use crate::counter::Counter;
use crate::event::unix_ms;
use crate::store::{self, Store, StoreError, Write};
pub use crate::transcript::{Entry, EntryKind, Page, Query};
use crate::transcript::{PageBuilder, TailTurns, message_fingerprint};

/// Messages a process has sent before, by fingerprint, at most this many.
const SEEN_PER_PROCESS: usize = 4096;

/// What is kept, how long, and where.
#[derive(Debug)]
pub struct Transcripts {
    settings: TranscriptSettings,
    store: Store,
    ids: Counter,
    tracker: TaskTracker,
    state: Mutex<State>,
    live: broadcast::Sender<Arc<Entry>>,
}

#[derive(Debug, Default)]
struct State {
    /// The in-memory tail, for a kernel without a store.
    tail: VecDeque<Arc<Entry>>,
    /// Per process: the entry that holds each message it has sent, by fingerprint.
    seen: HashMap<Pid, HashMap<u64, u64>>,
}

impl Transcripts {
    /// Transcripts kept as `settings` say, in `store`, with entry and turn
    /// ids continuing from `next_id`.
    pub(crate) fn new(
        settings: TranscriptSettings,
        store: Store,
        next_id: u64,
        tracker: TaskTracker,
    ) -> Self {
        store.set_transcript_retention(store::Retention {
            keep_after_exit: settings.keep_after_exit,
            max_age_hours: settings.max_age_hours,
            max_bytes_per_process: settings.max_bytes_per_process,
            max_bytes_total: settings.max_bytes_total,
        });
        let (live, _) = broadcast::channel(1024);
        Transcripts {
            settings,
            store,
            ids: Counter::new(store::Counter::Transcript, next_id.max(1), 1 << 16),
            tracker,
            state: Mutex::new(State::default()),
            live,
        }
    }

    /// Whether anything is recorded.
    pub fn enabled(&self) -> bool {
        self.settings.enabled
    }

    /// The next id to hand out, for a clean stop to settle the counter at.
    pub(crate) fn peek_id(&self) -> u64 {
        self.ids.peek()
    }

    /// Records `kind` for `pid` in the current turn.
    pub(crate) fn record(&self, pid: Pid, kind: EntryKind) {
        if self.enabled() {
            self.push(pid, kind);
        }
    }

    /// Sends `kind` (a partial answer) to live watchers, when there are
    /// any, without keeping it.
    pub(crate) fn stream(&self, pid: Pid, kind: EntryKind) {
        if self.watched() {
            self.number(pid, kind, None, false);
        }
    }

    /// Whether anyone watches entries live.
    pub(crate) fn watched(&self) -> bool {
        self.enabled() && self.live.receiver_count() > 0
    }

    /// Records a model request of `pid`: each message as the entry that
    /// already holds it, or as a new `message` entry.
    pub(crate) fn record_request(
        &self,
        pid: Pid,
        model: Arc<str>,
        max_tokens: Option<u32>,
        estimated_tokens: u64,
        messages: &[ChatMessage],
    ) {
        if !self.enabled() {
            return;
        }
        let prints: Vec<u64> = messages.iter().map(message_fingerprint).collect();
        let known: Vec<Option<u64>> = {
            let state = self.state.lock();
            let seen = state.seen.get(&pid);
            prints
                .iter()
                .map(|print| seen.and_then(|seen| seen.get(print).copied()))
                .collect()
        };
        let mut ids = Vec::with_capacity(messages.len());
        for ((message, known), print) in messages.iter().zip(known).zip(prints) {
            let id = match known {
                Some(id) => id,
                None => self.keep(
                    pid,
                    EntryKind::Message {
                        role: message.role,
                        content: message.content.clone(),
                        tool_calls: message.tool_calls.clone(),
                        tool_call_id: message.tool_call_id.clone(),
                    },
                    Some(print),
                ),
            };
            ids.push(id);
        }
        let request = EntryKind::Request {
            model,
            messages: ids,
            max_tokens,
            estimated_tokens: Some(estimated_tokens),
        };
        self.keep(pid, request, None);
    }

    /// Numbers, stamps and keeps one entry; answers its id.
    fn push(&self, pid: Pid, kind: EntryKind) -> u64 {
        // Taken before the cut: a later request sends the message whole.
        let print = kind.fingerprint();
        self.keep(pid, kind, print)
    }

    /// [`Transcripts::push`] with the fingerprint of the message `kind`
    /// stands for already taken.
    fn keep(&self, pid: Pid, kind: EntryKind, print: Option<u64>) -> u64 {
        self.number(pid, kind, print, true)
    }

    /// Numbers and stamps one entry, sends it to live watchers and, when
    /// `kept`, keeps it; answers its id.
    fn number(&self, pid: Pid, mut kind: EntryKind, print: Option<u64>, kept: bool) -> u64 {
        kind.bound(self.settings.max_text_bytes);
        let at_unix_ms = unix_ms(SystemTime::now());
        let turn = crate::trace::turn(|| self.ids.take(&self.store, &self.tracker));
        let mut state = self.state.lock();
        // Taken under the lock, so ids increase in the order entries are kept.
        let id = self.ids.take(&self.store, &self.tracker);
        let entry = Arc::new(Entry {
            id,
            pid,
            turn: turn.unwrap_or(id),
            at_unix_ms,
            trace: crate::trace::current_id(),
            kind,
        });
        if let Some(print) = print {
            let seen = state.seen.entry(pid).or_default();
            if seen.len() >= SEEN_PER_PROCESS {
                // Forgotten messages are recorded again: correct, only larger.
                seen.clear();
            }
            seen.insert(print, id);
        }
        match (kept, self.store.is_durable()) {
            (false, _) => {}
            (true, true) => self.store.submit_lazy(Write::Transcript(entry.clone())),
            (true, false) => {
                if state.tail.len() >= self.settings.memory_entries {
                    state.tail.pop_front();
                }
                state.tail.push_back(entry.clone());
            }
        }
        if self.live.receiver_count() > 0 {
            let _ = self.live.send(entry);
        }
        id
    }

    /// Forgets what the processes sent (they have exited; their entries stay).
    pub(crate) fn forget(&self, pids: impl IntoIterator<Item = Pid>) {
        let mut state = self.state.lock();
        if state.seen.is_empty() {
            return;
        }
        for pid in pids {
            state.seen.remove(&pid);
        }
    }

    /// Entries recorded from now on, of every process.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Entry>> {
        self.live.subscribe()
    }

    /// `pid`'s entries matching `query`, oldest first.
    pub async fn read(&self, pid: Pid, query: Query) -> Result<Page, StoreError> {
        if self.store.is_durable() {
            // What was recorded before the read is in what it reads.
            self.store.flush().await?;
            return self.store.transcript(pid, query).await;
        }
        let state = self.state.lock();
        let matching = state
            .tail
            .iter()
            .filter(|entry| entry.pid == pid && query.matches(entry));
        let min_turn = match query.tail_turns {
            Some(n) => {
                let mut tail = TailTurns::new(n);
                matching.clone().for_each(|entry| tail.see(entry.turn));
                tail.first()
            }
            None => query.min_turn,
        };
        let mut page = PageBuilder::new(&query, min_turn);
        for entry in matching.filter(|entry| entry.turn >= min_turn) {
            if !page.push(Entry::clone(entry)) {
                break;
            }
        }
        Ok(page.finish())
    }
}
