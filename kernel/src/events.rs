//! Typed kernel events with a monotonically increasing sequence number.
//!
//! Every event goes into a bounded in-memory ring and, when the kernel has
//! a store, into the persisted event log, so a subscriber can replay from a
//! sequence number (from memory, or from the store for older events) and
//! then go live without a gap. Live subscribers read the same ring, as many
//! events at a time as have arrived: an emit only wakes a subscriber that
//! is waiting, and copies nothing for it.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::SystemTime;

use hivekernel_agents::{Pid, TraceId};
use parking_lot::Mutex;
use tokio::sync::Notify;

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
    pub live: Live,
}

/// The events emitted after a subscription began, read from the bus's ring.
#[derive(Debug)]
pub struct Live {
    shared: Arc<Shared>,
    /// The sequence number of the next event to read.
    next: u64,
}

/// Why a live feed gave no events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Missed {
    /// The subscriber fell so far behind that this many events left the
    /// ring before it read them; it goes on from the oldest one kept.
    #[error("fell behind and missed {0} events")]
    Lagged(u64),
    /// The bus has gone (the kernel was dropped).
    #[error("the event bus has closed")]
    Closed,
}

impl Live {
    /// The next event, waiting for one.
    pub async fn recv(&mut self) -> Result<Arc<Event>, Missed> {
        let mut one = Vec::with_capacity(1);
        self.recv_many(&mut one, 1).await?;
        one.pop().ok_or(Missed::Closed)
    }

    /// The next event if one has arrived; `None` when there is none yet.
    pub fn try_recv(&mut self) -> Result<Option<Arc<Event>>, Missed> {
        let mut one = Vec::with_capacity(1);
        match self.shared.take(&mut self.next, &mut one, 1, false) {
            Some(taken) => taken.map(|_| one.pop()),
            None => Ok(None),
        }
    }

    /// Waits for events and appends up to `max` of them (at least one) to
    /// `into`, oldest first; returns how many. Cancel-safe: events are
    /// taken only in the poll that returns them.
    pub async fn recv_many(
        &mut self,
        into: &mut Vec<Arc<Event>>,
        max: usize,
    ) -> Result<usize, Missed> {
        let max = max.max(1);
        let Live { shared, next } = self;
        loop {
            if let Some(taken) = shared.take(next, into, max, false) {
                return taken;
            }
            // Registered before the ring is read again, so an emit after
            // that read wakes it.
            let arrived = shared.arrived.notified();
            let mut arrived = std::pin::pin!(arrived);
            arrived.as_mut().enable();
            if let Some(taken) = shared.take(next, into, max, true) {
                return taken;
            }
            arrived.await;
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.shared.readers.fetch_sub(1, Ordering::Relaxed);
    }
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
    /// A live reader found nothing new and waits for [`Shared::arrived`].
    waiting: bool,
    /// The bus has gone: live readers stop once they have read the rest.
    closed: bool,
}

/// What the bus shares with its live readers.
#[derive(Debug)]
struct Shared {
    ring: Mutex<Ring>,
    /// Wakes the live readers waiting for new events.
    arrived: Notify,
    /// Live readers now.
    readers: AtomicUsize,
}

impl Shared {
    /// Wakes the waiting readers, when `ring` had any; the lock is given up first.
    fn wake(&self, mut ring: parking_lot::MutexGuard<'_, Ring>) {
        let waiting = std::mem::take(&mut ring.waiting);
        drop(ring);
        if waiting {
            self.arrived.notify_waiters();
        }
    }

    /// Takes what has arrived after `next`, if anything has (or the reader
    /// has lagged, or the bus closed); otherwise, with `wait`, marks the
    /// ring as waited on.
    fn take(
        &self,
        next: &mut u64,
        into: &mut Vec<Arc<Event>>,
        max: usize,
        wait: bool,
    ) -> Option<Result<usize, Missed>> {
        let mut ring = self.ring.lock();
        let first = ring.events.front().map_or(ring.next_seq, |e| e.seq);
        if *next < first {
            let missed = first - *next;
            *next = first;
            return Some(Err(Missed::Lagged(missed)));
        }
        let skip = usize::try_from(*next - first).unwrap_or(usize::MAX);
        if skip < ring.events.len() {
            let before = into.len();
            into.extend(ring.events.range(skip..).take(max).cloned());
            let taken = into.len() - before;
            *next += taken as u64;
            return Some(Ok(taken));
        }
        if ring.closed {
            return Some(Err(Missed::Closed));
        }
        ring.waiting |= wait;
        None
    }
}

/// Sequence numbers reserved in the store at a time.
const SEQ_BLOCK: u64 = 1 << 16;

/// Sequences, retains, persists and feeds events to live readers.
#[derive(Debug)]
pub struct EventBus {
    shared: Arc<Shared>,
    retain: usize,
    /// The sequence number of this bus's first event.
    first: u64,
    /// Where events are persisted (nowhere, in memory).
    store: Store,
    /// Counts every event, when the kernel keeps metrics.
    metrics: Option<Arc<Metrics>>,
    /// Told of every process birth, exit and removal (a cluster node's
    /// directory).
    tap: Option<Arc<dyn ProcessTap>>,
}

/// What is told of every process's birth, exit and removal as its event is
/// emitted: a cluster node's directory.
pub trait ProcessTap: Send + Sync + std::fmt::Debug {
    /// `pid` was born, exited, was restarted or left the table (`gone`).
    fn changed(&self, pid: Pid, gone: bool);
}

impl EventKind {
    /// Whether this event is a process's birth, exit, restart or removal.
    fn changes_process(&self) -> bool {
        matches!(
            self,
            EventKind::Spawned { .. }
                | EventKind::Exited { .. }
                | EventKind::Reaped { .. }
                | EventKind::Restarted { .. }
        )
    }
}

impl EventBus {
    /// A bus retaining the last `retain` events in memory, and no store.
    pub fn new(retain: usize) -> Self {
        Self::with_store(retain, Store::in_memory(), 1)
    }

    /// A bus that also persists every event to `store`, numbering from `next_seq`.
    pub fn with_store(retain: usize, store: Store, next_seq: u64) -> Self {
        EventBus {
            shared: Arc::new(Shared {
                ring: Mutex::new(Ring {
                    next_seq: next_seq.max(1),
                    reserved_seq: next_seq.max(1),
                    events: VecDeque::new(),
                    waiting: false,
                    closed: false,
                }),
                arrived: Notify::new(),
                readers: AtomicUsize::new(0),
            }),
            retain: retain.max(1),
            first: next_seq.max(1),
            store,
            metrics: None,
            tap: None,
        }
    }

    /// This bus, telling `tap` of every process birth, exit and removal.
    pub fn with_tap(mut self, tap: Option<Arc<dyn ProcessTap>>) -> Self {
        self.tap = tap;
        self
    }

    /// This bus, counting every event it emits in `metrics`.
    pub fn with_metrics(mut self, metrics: Option<Arc<Metrics>>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Live subscribers now.
    pub fn subscribers(&self) -> usize {
        self.shared.readers.load(Ordering::Relaxed)
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
        if let Some(tap) = &self.tap
            && kind.changes_process()
        {
            tap.changed(pid, matches!(kind, EventKind::Reaped { .. }));
        }
        let trace = crate::trace::current_id();
        let mut ring = self.shared.ring.lock();
        let event = self.retained(&mut ring, pid, kind, at_unix_ms, trace);
        let seq = event.seq;
        if self.store.is_durable() {
            // Under the ring lock, so the store gets events in sequence order.
            self.store.submit(Write::Event(event));
        }
        self.shared.wake(ring);
        seq
    }

    /// Records events in order with consecutive sequence numbers and one
    /// timestamp, taking the lock once: an exit of 10,000 processes emits
    /// 20,000 events.
    pub fn emit_all(&self, mut events: Vec<(Pid, EventKind)>) {
        for (pid, kind) in &mut events {
            kind.bound();
            if let Some(metrics) = &self.metrics {
                metrics.event(kind);
            }
            if let Some(tap) = &self.tap
                && kind.changes_process()
            {
                tap.changed(*pid, matches!(kind, EventKind::Reaped { .. }));
            }
        }
        let at_unix_ms = unix_ms(SystemTime::now());
        let trace = crate::trace::current_id();
        let mut ring = self.shared.ring.lock();
        let durable = self.store.is_durable();
        let mut writes = Vec::with_capacity(if durable { events.len() } else { 0 });
        for (pid, kind) in events {
            let event = self.retained(&mut ring, pid, kind, at_unix_ms, trace);
            if durable {
                writes.push(Write::Event(event));
            }
        }
        self.store.submit_all(writes);
        self.shared.wake(ring);
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
        let ring = self.shared.ring.lock();
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
        self.shared.readers.fetch_add(1, Ordering::Relaxed);
        Subscription {
            pruned,
            backlog,
            replay,
            live: Live {
                shared: self.shared.clone(),
                next: ring.next_seq,
            },
        }
    }

    /// Sequence number of the newest event (0 when none yet).
    pub fn last_seq(&self) -> u64 {
        self.shared.ring.lock().next_seq - 1
    }

    /// The sequence number of the first event this bus emitted (or will):
    /// where this run of the kernel began.
    pub(crate) fn first_seq(&self) -> u64 {
        self.first
    }

    /// The next sequence number, exactly: what a clean stop writes back.
    pub(crate) fn next_seq(&self) -> u64 {
        self.shared.ring.lock().next_seq
    }
}

impl Drop for EventBus {
    fn drop(&mut self) {
        self.shared.ring.lock().closed = true;
        self.shared.arrived.notify_waiters();
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use super::*;

    fn emit(bus: &EventBus, n: u64) {
        for missed in 0..n {
            bus.emit(Pid(2), EventKind::Lagged { missed });
        }
    }

    #[tokio::test]
    async fn a_live_reader_takes_what_has_arrived_in_order_up_to_its_limit() {
        let bus = EventBus::new(100);
        emit(&bus, 2);
        let mut live = bus.subscribe(None).live;
        emit(&bus, 5);
        let mut batch = Vec::new();
        assert_eq!(live.recv_many(&mut batch, 3).await, Ok(3));
        assert_eq!(live.recv_many(&mut batch, 100).await, Ok(2));
        assert!(matches!(live.try_recv(), Ok(None)));
        let seqs: Vec<u64> = batch.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [3, 4, 5, 6, 7]);
        assert_eq!(bus.subscribers(), 1);
        drop(live);
        assert_eq!(bus.subscribers(), 0);
    }

    #[tokio::test]
    async fn a_waiting_reader_is_woken_by_an_emit_and_by_a_batch() {
        let bus = Arc::new(EventBus::new(100));
        let mut live = bus.subscribe(None).live;
        let reader = tokio::spawn(async move {
            let first = live.recv().await.unwrap().seq;
            let mut rest = Vec::new();
            while rest.len() < 3 {
                live.recv_many(&mut rest, 10).await.unwrap();
            }
            (first, rest.iter().map(|e| e.seq).collect::<Vec<_>>())
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        bus.emit(Pid(2), EventKind::Lagged { missed: 0 });
        tokio::time::sleep(Duration::from_millis(20)).await;
        bus.emit_all(
            (0..3)
                .map(|missed| (Pid(3), EventKind::Lagged { missed }))
                .collect(),
        );
        let (first, rest) = tokio::time::timeout(Duration::from_secs(5), reader)
            .await
            .expect("the reader was woken")
            .unwrap();
        assert_eq!(first, 1);
        assert_eq!(rest, [2, 3, 4]);
    }

    #[tokio::test]
    async fn a_reader_that_falls_behind_the_ring_is_told_how_many_it_missed_and_goes_on() {
        let bus = EventBus::new(10);
        let mut live = bus.subscribe(None).live;
        emit(&bus, 25);
        // Events 1..=15 left the ring of ten before the reader came back.
        assert_eq!(live.recv().await.map(|e| e.seq), Err(Missed::Lagged(15)));
        let mut batch = Vec::new();
        assert_eq!(live.recv_many(&mut batch, 100).await, Ok(10));
        assert_eq!(batch.first().map(|e| e.seq), Some(16));
        assert_eq!(batch.last().map(|e| e.seq), Some(25));
    }

    #[tokio::test]
    async fn a_reader_reads_the_rest_after_the_bus_has_gone_and_then_is_told_it_closed() {
        let bus = EventBus::new(100);
        let mut live = bus.subscribe(None).live;
        emit(&bus, 2);
        drop(bus);
        let mut batch = Vec::new();
        assert_eq!(live.recv_many(&mut batch, 100).await, Ok(2));
        assert_eq!(live.recv().await.map(|e| e.seq), Err(Missed::Closed));
    }

    #[tokio::test]
    async fn a_waiting_reader_is_ended_when_the_bus_goes() {
        let bus = EventBus::new(100);
        let mut live = bus.subscribe(None).live;
        let reader = tokio::spawn(async move { live.recv().await.map(|e| e.seq) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(bus);
        let ended = tokio::time::timeout(Duration::from_secs(5), reader)
            .await
            .expect("the reader ended")
            .unwrap();
        assert_eq!(ended, Err(Missed::Closed));
    }
}
