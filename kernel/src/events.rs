//! Typed kernel events with a monotonically increasing sequence number.
//!
//! Every event goes to live subscribers (a broadcast channel), into a
//! bounded in-memory ring and, when the kernel has a store, into the
//! persisted event log, so a subscriber can replay from a sequence number
//! (from memory, or from the store for older events) and then go live
//! without a gap.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::SystemTime;

use hivekernel_agents::{Pid, TraceId};
use parking_lot::Mutex;
use tokio::sync::broadcast;

pub(crate) use crate::event::unix_ms;
pub use crate::event::{Event, EventKind, ReapCause};
use crate::metrics::Metrics;
use crate::store::{Counter, Store, Write};

/// Retained events plus a live feed that continues exactly after them.
#[derive(Debug)]
pub struct Subscription {
    /// Events after `since` that had left the log already: they cannot be replayed.
    pub pruned: u64,
    /// Events with `after < seq < before` that are only in the store: read
    /// them (in chunks) before `replay`.
    pub backlog: Option<Backlog>,
    /// Retained events with `seq > since`, oldest first.
    pub replay: Vec<Arc<Event>>,
    /// Events emitted after the replay.
    pub live: broadcast::Receiver<Arc<Event>>,
}

/// A stretch of the event log that has left memory but is in the store.
#[derive(Debug, Clone)]
pub struct Backlog {
    /// The store holding it.
    pub store: Store,
    /// Exclusive lower bound.
    pub after: u64,
    /// Exclusive upper bound: the first event retained in memory.
    pub before: u64,
}

#[derive(Debug)]
struct Ring {
    next_seq: u64,
    /// Sequence numbers below this are reserved in the store (durable buses only).
    reserved_seq: u64,
    events: VecDeque<Arc<Event>>,
}

/// Sequence numbers reserved in the store at a time.
const SEQ_BLOCK: u64 = 1 << 16;

/// Sequences, retains, persists and broadcasts events.
#[derive(Debug)]
pub struct EventBus {
    ring: Mutex<Ring>,
    retain: usize,
    live: broadcast::Sender<Arc<Event>>,
    /// Where events are persisted (nowhere, in memory).
    store: Store,
    /// Counts every event, when the kernel keeps metrics.
    metrics: Option<Arc<Metrics>>,
}

impl EventBus {
    /// A bus retaining the last `retain` events in memory, and no store.
    pub fn new(retain: usize) -> Self {
        Self::with_store(retain, Store::in_memory(), 1)
    }

    /// A bus that also persists every event to `store`, numbering from `next_seq`.
    pub fn with_store(retain: usize, store: Store, next_seq: u64) -> Self {
        let (live, _) = broadcast::channel(4096);
        EventBus {
            ring: Mutex::new(Ring {
                next_seq: next_seq.max(1),
                reserved_seq: next_seq.max(1),
                events: VecDeque::new(),
            }),
            retain: retain.max(1),
            live,
            store,
            metrics: None,
        }
    }

    /// This bus, counting every event it emits in `metrics`.
    pub fn with_metrics(mut self, metrics: Option<Arc<Metrics>>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Live subscribers now.
    pub fn subscribers(&self) -> usize {
        self.live.receiver_count()
    }

    /// Records an event about `pid` and returns its sequence number.
    pub fn emit(&self, pid: Pid, kind: EventKind) -> u64 {
        self.emit_at(pid, kind, unix_ms(SystemTime::now()))
    }

    /// [`EventBus::emit`] with a timestamp the caller already read.
    pub(crate) fn emit_at(&self, pid: Pid, mut kind: EventKind, at_unix_ms: u64) -> u64 {
        // Cut outside the lock: a long text costs only its sender.
        kind.bound();
        if let Some(metrics) = &self.metrics {
            metrics.event(&kind);
        }
        let trace = crate::trace::current_id();
        let mut ring = self.ring.lock();
        let event = self.retained(&mut ring, pid, kind, at_unix_ms, trace);
        let seq = event.seq;
        if self.store.is_durable() {
            self.store.submit(Write::Event(event.clone()));
        }
        // Sent under the ring lock so live order matches sequence order.
        let _ = self.live.send(event);
        seq
    }

    /// Records events in order with consecutive sequence numbers and one
    /// timestamp, taking the lock once: an exit of 10,000 processes emits
    /// 20,000 events.
    pub fn emit_all(&self, mut events: Vec<(Pid, EventKind)>) {
        for (_, kind) in &mut events {
            kind.bound();
            if let Some(metrics) = &self.metrics {
                metrics.event(kind);
            }
        }
        let at_unix_ms = unix_ms(SystemTime::now());
        let trace = crate::trace::current_id();
        let mut ring = self.ring.lock();
        let live = self.live.receiver_count() > 0;
        let durable = self.store.is_durable();
        let mut writes = Vec::with_capacity(if durable { events.len() } else { 0 });
        for (pid, kind) in events {
            let event = self.retained(&mut ring, pid, kind, at_unix_ms, trace);
            if durable {
                writes.push(Write::Event(event.clone()));
            }
            if live {
                let _ = self.live.send(event);
            }
        }
        self.store.submit_all(writes);
    }

    /// Numbers the event and keeps it in the ring.
    fn retained(
        &self,
        ring: &mut Ring,
        pid: Pid,
        kind: EventKind,
        at_unix_ms: u64,
        trace: Option<TraceId>,
    ) -> Arc<Event> {
        let seq = ring.next_seq;
        ring.next_seq += 1;
        let event = Arc::new(Event {
            seq,
            at_unix_ms,
            pid,
            trace,
            kind,
        });
        if self.store.is_durable() {
            // Reserve ahead, so a crash never lets a sequence number be reused.
            if seq + SEQ_BLOCK / 2 >= ring.reserved_seq {
                ring.reserved_seq = seq + SEQ_BLOCK;
                self.store.submit(Write::Reserve {
                    counter: Counter::EventSeq,
                    until: ring.reserved_seq,
                });
            }
            // Only what is persisted may leave memory: the store must be able to replay it.
            let persisted = self.store.persisted_event_seq();
            while ring.events.len() >= self.retain
                && ring.events.front().is_some_and(|e| e.seq <= persisted)
            {
                ring.events.pop_front();
            }
        } else if ring.events.len() == self.retain {
            // In memory (every spawn and exit passes here) the ring just rolls over.
            ring.events.pop_front();
        }
        ring.events.push_back(event.clone());
        event
    }

    /// Retained events after `since` (when given), then everything emitted later.
    pub fn subscribe(&self, since: Option<u64>) -> Subscription {
        let ring = self.ring.lock();
        let (pruned, backlog, replay) = match since {
            Some(since) => {
                let first = ring.events.front().map_or(ring.next_seq, |e| e.seq);
                // Gone: pruned from the store, or (in memory) dropped from the ring.
                let gone_through = self.store.events_pruned_through().min(first - 1);
                let after = since.max(gone_through);
                let backlog = (after.saturating_add(1) < first).then(|| Backlog {
                    store: self.store.clone(),
                    after,
                    before: first,
                });
                let replay = ring
                    .events
                    .iter()
                    .skip_while(|e| e.seq <= since)
                    .cloned()
                    .collect();
                (gone_through.saturating_sub(since), backlog, replay)
            }
            None => (0, None, Vec::new()),
        };
        Subscription {
            pruned,
            backlog,
            replay,
            live: self.live.subscribe(),
        }
    }

    /// Sequence number of the newest event (0 when none yet).
    pub fn last_seq(&self) -> u64 {
        self.ring.lock().next_seq - 1
    }

    /// The next sequence number, exactly: what a clean stop writes back.
    pub(crate) fn next_seq(&self) -> u64 {
        self.ring.lock().next_seq
    }
}

/// What one subscriber asked to see, within what its [`EventView`] lets it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFilter {
    /// Only these processes' events.
    processes: Option<Processes>,
    /// Only events of these types (empty: every type).
    types: HashSet<&'static str>,
    /// Only the events of this trace.
    trace: Option<TraceId>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Processes {
    members: HashSet<Pid>,
    /// Take in the children the members spawn, as an [`EventView`] does.
    subtree: bool,
}

impl EventFilter {
    /// Every event.
    pub fn any() -> Self {
        EventFilter::default()
    }

    /// Only the events of `members` (and, with `subtree`, of the children
    /// they spawn from now on).
    pub fn processes(mut self, members: HashSet<Pid>, subtree: bool) -> Self {
        self.processes = Some(Processes { members, subtree });
        self
    }

    /// Only events of `types`; an unknown name is refused, naming the known ones.
    pub fn types(mut self, types: &[String]) -> Result<Self, String> {
        for name in types {
            let name = name.trim();
            let known = EventKind::TYPES.iter().find(|known| **known == name);
            let Some(known) = known else {
                return Err(format!(
                    "unknown event type {} (known: {})",
                    crate::error::shown(name),
                    EventKind::TYPES.join(", ")
                ));
            };
            self.types.insert(known);
        }
        Ok(self)
    }

    /// Only the events of `trace`.
    pub fn trace(mut self, trace: TraceId) -> Self {
        self.trace = Some(trace);
        self
    }

    /// Whether it lets every event through.
    pub fn is_any(&self) -> bool {
        *self == EventFilter::default()
    }

    /// Whether the subscriber asked for `event`; a subtree grows here with
    /// every `spawned` event, whatever the types asked for.
    pub fn admits(&mut self, event: &Event) -> bool {
        if let Some(Processes { members, subtree }) = &mut self.processes {
            if *subtree
                && let EventKind::Spawned { ppid, .. } = &event.kind
                && members.contains(ppid)
            {
                members.insert(event.pid);
            }
            if !members.contains(&event.pid) {
                return false;
            }
        }
        (self.types.is_empty() || self.types.contains(event.kind.name()))
            && self.trace.is_none_or(|trace| event.trace == Some(trace))
    }
}

/// What part of the event log one subscriber sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventView {
    /// Every event: the admin and operator tokens.
    All,
    /// A process's own events and its descendants': those in the tree when
    /// the view was made, and every process spawned under one of them since
    /// (seen by its `spawned` event). A process reaped leaves the set, so it
    /// stays as large as the subtree.
    Subtree(HashSet<Pid>),
}

impl EventView {
    /// Whether the subscriber sees `event`, following the subtree as it grows.
    pub fn admits(&mut self, event: &Event) -> bool {
        let EventView::Subtree(members) = self else {
            return true;
        };
        if let EventKind::Spawned { ppid, .. } = &event.kind
            && members.contains(ppid)
        {
            members.insert(event.pid);
        }
        let admitted = members.contains(&event.pid);
        if admitted && matches!(event.kind, EventKind::Reaped { .. }) {
            members.remove(&event.pid);
        }
        admitted
    }
}
