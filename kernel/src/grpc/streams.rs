//! The producers behind the two server-streaming RPCs.
//!
//! Each runs as a kernel-tracked task feeding a small bounded channel, so a
//! slow client slows its producer instead of growing a buffer, and the task
//! ends when the client goes away, the server drains or the kernel stops.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hivekernel_agents::Pid;
use hivekernel_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::convert;
use crate::cluster::{Bounds, Cluster};
use crate::events::{Event, EventFilter, EventView, Missed, Subscription, unix_ms};
use crate::kernel::Kernel;

/// Batches in flight between a `ListProcesses` producer and its client.
const BATCH_BUFFER: usize = 4;
/// Events in flight between a `SubscribeEvents` producer and its client.
const EVENT_BUFFER: usize = 256;
/// Live events taken from the bus at a time.
const LIVE_BATCH: usize = 1024;
/// A batch this large means the bus is busy: the producer pauses for
/// [`BUSY_PAUSE`] before it reads again, so what arrives meanwhile is taken
/// in one go instead of one wake per event. The bus keeps 65,536 events, so
/// a pause loses nothing.
const BUSY_BATCH: usize = 64;
/// How long a producer waits after a busy batch.
const BUSY_PAUSE: Duration = Duration::from_millis(5);

/// A stream of the processes in `pids`, `batch_size` at a time, read from the
/// table one batch at a time so the table lock is held only briefly.
pub(crate) fn process_batches(
    kernel: Kernel,
    stop: Stop,
    pids: Vec<Pid>,
    batch_size: usize,
) -> ReceiverStream<Result<pb::ProcessBatch, Status>> {
    let (tx, rx) = mpsc::channel(BATCH_BUFFER);
    let tracker = kernel.tracker().clone();
    tracker.spawn(async move {
        for chunk in pids.chunks(batch_size) {
            let read = kernel.snapshots(chunk).await;
            let processes: Vec<_> = read.infos.into_iter().map(convert::process_info).collect();
            let unanswered: Vec<_> = read
                .unanswered
                .into_iter()
                .map(|gap| pb::UnansweredNode {
                    node: gap.node,
                    error: gap.error,
                    processes: u32::try_from(gap.processes).unwrap_or(u32::MAX),
                })
                .collect();
            if processes.is_empty() && unanswered.is_empty() {
                continue;
            }
            let batch = pb::ProcessBatch {
                processes,
                unanswered,
            };
            if !send(&tx, Ok(batch), &stop).await {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}

/// Stored events read per query while replaying from the store.
const BACKLOG_CHUNK: usize = 1024;

/// The most events a `tail` holds back.
pub(crate) const MAX_TAIL: usize = 100_000;

/// What one `SubscribeEvents` asked for and may see.
#[derive(Debug)]
pub(crate) struct Wanted {
    /// Replay the retained events after this sequence number first.
    pub(crate) since: Option<u64>,
    /// Of the replay, only the newest N that match.
    pub(crate) tail: Option<usize>,
    /// What the caller may see.
    pub(crate) view: EventView,
    /// What the caller asked to see.
    pub(crate) filter: EventFilter,
}

impl Wanted {
    fn admits(&mut self, event: &Event) -> bool {
        // Both see every event, so each follows the subtrees it tracks.
        let seen = self.view.admits(event);
        self.filter.admits(event) && seen
    }
}

/// The replayed events a `tail` holds back until the replay ends, and how
/// many events it found pruned meanwhile: said only when the tail is not
/// full, since pruning takes the oldest and a full tail lost none of them.
struct Held {
    /// Each with its node (empty on a kernel alone).
    events: VecDeque<(Event, String)>,
    keep: usize,
    pruned: u64,
}

impl Held {
    /// What holds back the replay of a subscriber that asked for its
    /// newest `tail` events (`None`: it asked for all of them).
    fn for_tail(tail: Option<usize>) -> Option<Held> {
        tail.map(|keep| Held {
            events: VecDeque::new(),
            keep,
            pruned: 0,
        })
    }
}

/// What a replay came to next.
enum Found<'a> {
    Event(&'a Event),
    /// Events after where the replay stood that the log no longer has.
    Pruned(u64),
}

/// Sends what a replay found, or holds it back when only a tail is
/// wanted; false when the stream must end.
async fn replayed(
    tx: &mpsc::Sender<Result<pb::Event, Status>>,
    stop: &Stop,
    held: &mut Option<Held>,
    found: Found<'_>,
    node: &str,
) -> bool {
    match (held, found) {
        (Some(held), Found::Event(event)) => {
            if held.events.len() == held.keep {
                held.events.pop_front();
            }
            held.events.push_back((event.clone(), node.to_owned()));
            true
        }
        (Some(held), Found::Pruned(missed)) => {
            held.pruned += missed;
            true
        }
        (None, Found::Event(event)) => send(tx, Ok(shown(event, node)), stop).await,
        (None, Found::Pruned(missed)) => {
            let marker = convert::pruned(missed, unix_ms(SystemTime::now()));
            send(tx, Ok(marker), stop).await
        }
    }
}

/// A stream of the subscription's replay (a `pruned` marker first when it
/// reaches back past the log, then the store when it reaches back past
/// memory; with a tail only its newest events), a `replay_done` marker
/// when a replay was asked for, then live events without repeats; a lost
/// stretch of live events becomes one `lagged` marker. Only events the
/// caller may see and asked for are sent; the markers always are.
pub(crate) fn events(
    kernel: &Kernel,
    stop: Stop,
    subscription: Subscription,
    mut wanted: Wanted,
) -> ReceiverStream<Result<pb::Event, Status>> {
    let (tx, rx) = mpsc::channel(EVENT_BUFFER);
    let Subscription {
        pruned,
        backlog,
        replay,
        mut live,
    } = subscription;
    let since = wanted.since;
    let mut held = Held::for_tail(wanted.tail);
    kernel.tracker().spawn(async move {
        let mut last_seq = 0;
        if pruned > 0 && !replayed(&tx, &stop, &mut held, Found::Pruned(pruned), "").await {
            return;
        }
        if let Some(backlog) = backlog {
            // Older events come from the store, a chunk at a time.
            let mut after = backlog.after;
            loop {
                let chunk = match backlog
                    .store
                    .events_between(after, backlog.before, BACKLOG_CHUNK)
                    .await
                {
                    Ok(chunk) => chunk,
                    Err(err) => {
                        let _ = send(&tx, Err(Status::unavailable(err.to_string())), &stop).await;
                        return;
                    }
                };
                // Pruned while this replay was under way: say so, as at the start.
                let next = chunk.first().map_or(backlog.before, |e| e.seq);
                let gone_through = backlog.store.events_pruned_through().min(next - 1);
                if gone_through > after
                    && !replayed(
                        &tx,
                        &stop,
                        &mut held,
                        Found::Pruned(gone_through - after),
                        "",
                    )
                    .await
                {
                    return;
                }
                let Some(last) = chunk.last() else { break };
                after = last.seq;
                for event in &chunk {
                    last_seq = event.seq;
                    if !wanted.admits(event) {
                        continue;
                    }
                    if !replayed(&tx, &stop, &mut held, Found::Event(event), "").await {
                        return;
                    }
                }
            }
        }
        for event in replay {
            last_seq = event.seq;
            if !wanted.admits(&event) {
                continue;
            }
            if !replayed(&tx, &stop, &mut held, Found::Event(&event), "").await {
                return;
            }
        }
        if !replay_ends(&tx, &stop, held, since, last_seq).await {
            return;
        }
        let mut batch = Vec::with_capacity(LIVE_BATCH);
        loop {
            let received = tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = tx.closed() => return,
                received = live.recv_many(&mut batch, LIVE_BATCH) => received,
            };
            match received {
                Ok(_) => {}
                Err(Missed::Lagged(missed)) => {
                    let marker = convert::lagged(missed, unix_ms(SystemTime::now()));
                    if !send(&tx, Ok(marker), &stop).await {
                        return;
                    }
                }
                Err(Missed::Closed) => return,
            }
            let busy = batch.len() >= BUSY_BATCH;
            for event in batch.drain(..) {
                if event.seq <= last_seq {
                    continue;
                }
                last_seq = event.seq;
                if !wanted.admits(&event) {
                    continue;
                }
                if !send(&tx, Ok(shown(&event, "")), &stop).await {
                    return;
                }
            }
            if busy {
                // A busy bus is read in larger batches, from the timer's
                // wake rather than from every emit.
                tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    () = tx.closed() => return,
                    () = tokio::time::sleep(BUSY_PAUSE) => {}
                }
            }
        }
    });
    ReceiverStream::new(rx)
}

/// The `SubscribeEvents` stream of a cluster node: the cluster's event
/// stream (`HK_EVENTS`) as [`events`] serves its own bus, every node's
/// events in the stream's order, each with its node. It starts at
/// `wanted.since` (a `pruned` marker first when the stream no longer
/// reaches back that far), or after the last event of `bounds` for live
/// events only; the replay is what the stream held at `bounds`. A
/// subscriber reading slowly slows its read of the stream; events the
/// stream dropped before it read them (past `event_log_limit`) become a
/// `pruned` marker where they were. An entry of the stream that is not an
/// event is skipped, said in the log; a read that fails ends the stream
/// with `unavailable`.
pub(crate) fn cluster_events(
    kernel: &Kernel,
    cluster: Arc<Cluster>,
    stop: Stop,
    bounds: Bounds,
    mut wanted: Wanted,
) -> ReceiverStream<Result<pb::Event, Status>> {
    let (tx, rx) = mpsc::channel(EVENT_BUFFER);
    let since = wanted.since;
    let mut held = Held::for_tail(wanted.tail);
    kernel.tracker().spawn(async move {
        let start = match since {
            Some(since) => since.saturating_add(1).max(bounds.first),
            None => bounds.last + 1,
        };
        if let Some(since) = since {
            let missed = bounds.first.saturating_sub(since.saturating_add(1));
            if missed > 0 && !replayed(&tx, &stop, &mut held, Found::Pruned(missed), "").await {
                return;
            }
        }
        let mut feed = match cluster.event_feed(start).await {
            Ok(feed) => feed,
            Err(err) => {
                let status = Status::unavailable(format!("reading the cluster's events: {err}"));
                let _ = send(&tx, Err(status), &stop).await;
                return;
            }
        };
        // What the stream held when the subscription began is the replay;
        // it ends after its last event, or before a newer one, or once the
        // stream has nothing newer (its last event was deleted).
        let mut replay = since.map(|_| bounds.last);
        let mut expected = start;
        let mut caught_up = false;
        loop {
            if let Some(last) = replay
                && (expected > last || caught_up)
            {
                replay = None;
                if !replay_ends(&tx, &stop, held.take(), since, last).await {
                    return;
                }
            }
            let next = tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = tx.closed() => return,
                next = feed.next() => next,
            };
            let published = match next {
                Some(Ok(published)) => published,
                Some(Err(err)) => {
                    let status =
                        Status::unavailable(format!("reading the cluster's events: {err}"));
                    let _ = send(&tx, Err(status), &stop).await;
                    return;
                }
                None => return,
            };
            if let Some(last) = replay
                && published.seq > last
            {
                replay = None;
                if !replay_ends(&tx, &stop, held.take(), since, last).await {
                    return;
                }
            }
            // Events gone before they were read: the stream's limit
            // dropped them (a subscriber that fell that far behind), or an
            // operator deleted them.
            if published.seq > expected {
                let missed = published.seq - expected;
                let told = match replay {
                    Some(_) => replayed(&tx, &stop, &mut held, Found::Pruned(missed), "").await,
                    None => {
                        let marker = convert::pruned(missed, unix_ms(SystemTime::now()));
                        send(&tx, Ok(marker), &stop).await
                    }
                };
                if !told {
                    return;
                }
            }
            expected = published.seq + 1;
            caught_up = published.newest;
            let event = match published.event {
                Ok(event) => event,
                Err(why) => {
                    tracing::warn!("cluster: {why}; skipped");
                    continue;
                }
            };
            if !wanted.admits(&event) {
                continue;
            }
            let sent = match replay {
                Some(_) => {
                    replayed(&tx, &stop, &mut held, Found::Event(&event), &published.node).await
                }
                None => send(&tx, Ok(shown(&event, &published.node)), &stop).await,
            };
            if !sent {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}

/// Ends a replay: the events a tail `held` back, a `pruned` marker before
/// them when the tail is not full, then `replay_done` when a replay was
/// asked for; false when the stream must end.
async fn replay_ends(
    tx: &mpsc::Sender<Result<pb::Event, Status>>,
    stop: &Stop,
    held: Option<Held>,
    since: Option<u64>,
    last_seq: u64,
) -> bool {
    if let Some(held) = held {
        if held.pruned > 0 && held.events.len() < held.keep {
            let marker = convert::pruned(held.pruned, unix_ms(SystemTime::now()));
            if !send(tx, Ok(marker), stop).await {
                return false;
            }
        }
        for (event, node) in &held.events {
            if !send(tx, Ok(shown(event, node)), stop).await {
                return false;
            }
        }
    }
    match since {
        Some(since) => {
            let done = convert::replay_done(last_seq.max(since), unix_ms(SystemTime::now()));
            send(tx, Ok(done), stop).await
        }
        None => true,
    }
}

/// `event` as a subscriber receives it, with its `node` (empty on a kernel alone).
fn shown(event: &Event, node: &str) -> pb::Event {
    let mut shown = convert::event(event);
    if !node.is_empty() {
        shown.node = node.to_owned();
    }
    shown
}

/// When a producer must stop although its client is still reading.
#[derive(Debug, Clone)]
pub(crate) struct Stop {
    /// Cancelled once the kernel has stopped its processes.
    pub(crate) kernel: CancellationToken,
    /// Cancelled when the server starts draining.
    pub(crate) server: CancellationToken,
}

impl Stop {
    pub(crate) async fn cancelled(&self) {
        tokio::select! {
            () = self.kernel.cancelled() => {}
            () = self.server.cancelled() => {}
        }
    }
}

/// Sends `item`; false when the client has gone or the stream must stop.
pub(crate) async fn send<T>(tx: &mpsc::Sender<T>, item: T, stop: &Stop) -> bool {
    tokio::select! {
        biased;
        () = stop.cancelled() => false,
        sent = tx.send(item) => sent.is_ok(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use hivekernel_agents::Pid;
    use tokio_stream::StreamExt;

    use super::*;
    use crate::config::KernelSettings;
    use crate::events::{EventBus, EventKind};
    use crate::runtime::RuntimeRegistry;
    use crate::store::{DB_FILE, Store, Synchronous};

    /// A kernel with nothing in it, for a stream's producer to run under.
    async fn idle_kernel() -> Kernel {
        Kernel::builder(KernelSettings::default())
            .runtimes(RuntimeRegistry::default())
            .start()
            .await
            .unwrap()
            .kernel
    }

    fn never_stops() -> Stop {
        Stop {
            kernel: CancellationToken::new(),
            server: CancellationToken::new(),
        }
    }

    fn emit(bus: &EventBus, n: u64) {
        for i in 0..n {
            let kind = EventKind::Lagged { missed: i };
            bus.emit(Pid(2), kind);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pruning_that_overtakes_a_slow_replay_is_reported_where_it_happens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(DB_FILE);
        let (store, _) = Store::open(&path, Synchronous::Normal).unwrap();
        store.set_event_log_limit(1_000);
        // 100 events in memory: the replay of 3,001 reads the rest from the store.
        let bus = EventBus::with_store(100, store.clone(), 1);
        emit(&bus, 3_000);
        store.flush().await.unwrap();
        // Memory lets go of committed events as new ones come.
        emit(&bus, 1);
        let kernel = idle_kernel().await;
        let stop = never_stops();
        let wanted = Wanted {
            since: Some(0),
            tail: None,
            view: EventView::All,
            filter: EventFilter::any(),
        };
        let mut stream = events(&kernel, stop, bus.subscribe(Some(0)), wanted);
        // The replay is under way: its first chunk (1,024 events) is read.
        let first = stream.next().await.unwrap().unwrap();
        assert_eq!(first.seq, 1);

        // Enough new events for the writer to prune the rest of the backlog.
        emit(&bus, 12_000);
        store.flush().await.unwrap();
        store.flush().await.unwrap();
        let pruned_through = store.events_pruned_through();
        assert!(pruned_through > 3_000, "{pruned_through}");

        let mut seqs = Vec::new();
        let mut markers = Vec::new();
        while let Some(item) = stream.next().await {
            let event = item.unwrap();
            if event.r#type == "replay_done" {
                break;
            }
            if event.seq == 0 {
                let detail: serde_json::Value = serde_json::from_str(&event.detail).unwrap();
                markers.push((event.r#type.clone(), seqs.len(), detail["missed"].clone()));
            } else {
                seqs.push(event.seq);
            }
        }
        // Chunk one, then the marker for what went meanwhile, then what memory kept.
        assert_eq!(
            markers,
            [("pruned".to_owned(), 1_023, serde_json::json!(2_901 - 1_024))]
        );
        assert_eq!(seqs[..1_023], (2..=1_024).collect::<Vec<u64>>()[..]);
        assert_eq!(seqs[1_023..], (2_902..=3_001).collect::<Vec<u64>>()[..]);
        // The stream's task lives until its reader goes.
        drop(stream);
        kernel.shutdown().await;
        store.close().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tail_of_a_filtered_replay_is_the_newest_that_match_from_store_and_memory() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(&dir.path().join(DB_FILE), Synchronous::Normal).unwrap();
        // 100 events in memory, the rest only in the store.
        let bus = EventBus::with_store(100, store.clone(), 1);
        let mut wanted_seqs = Vec::new();
        for i in 0..3_000u64 {
            if i % 10 == 0 {
                let kind = EventKind::CronRun {
                    name: Arc::from("nightly"),
                    status: "ok".into(),
                    duration_ms: i,
                };
                wanted_seqs.push(bus.emit(Pid(3), kind));
                // Of another process: not asked for.
                bus.emit(
                    Pid(4),
                    EventKind::CronRun {
                        name: Arc::from("other"),
                        status: "ok".into(),
                        duration_ms: i,
                    },
                );
            } else {
                bus.emit(Pid(3), EventKind::Lagged { missed: i });
            }
        }
        store.flush().await.unwrap();
        let kernel = idle_kernel().await;
        let stop = never_stops();
        let filter = EventFilter::any()
            .processes([Pid(3)].into(), false)
            .types(&["cron_run".to_owned()])
            .unwrap();
        let wanted = Wanted {
            since: Some(0),
            tail: Some(5),
            view: EventView::All,
            filter,
        };
        let mut stream = events(&kernel, stop, bus.subscribe(Some(0)), wanted);
        let mut seqs = Vec::new();
        while let Some(item) = stream.next().await {
            let event = item.unwrap();
            if event.r#type == "replay_done" {
                break;
            }
            assert_eq!((event.pid, event.r#type.as_str()), (3, "cron_run"));
            seqs.push(event.seq);
        }
        assert_eq!(seqs, wanted_seqs[wanted_seqs.len() - 5..]);
        // Live: only what matches comes through.
        bus.emit(Pid(4), EventKind::Lagged { missed: 0 });
        let live = bus.emit(
            Pid(3),
            EventKind::CronRun {
                name: Arc::from("nightly"),
                status: "failed".into(),
                duration_ms: 1,
            },
        );
        assert_eq!(stream.next().await.unwrap().unwrap().seq, live);
        drop(stream);
        kernel.shutdown().await;
        store.close().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tail_says_events_were_pruned_only_when_it_is_not_full() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(&dir.path().join(DB_FILE), Synchronous::Normal).unwrap();
        store.set_event_log_limit(1_000);
        let bus = EventBus::with_store(100, store.clone(), 1);
        emit(&bus, 15_000);
        store.flush().await.unwrap();
        store.flush().await.unwrap();
        assert!(store.events_pruned_through() > 0);
        // Memory lets go of committed events as new ones come.
        emit(&bus, 1);
        let kernel = idle_kernel().await;
        let read = |keep: usize| {
            let stop = never_stops();
            let wanted = Wanted {
                since: Some(0),
                tail: Some(keep),
                view: EventView::All,
                filter: EventFilter::any().processes([Pid(2)].into(), false),
            };
            events(&kernel, stop, bus.subscribe(Some(0)), wanted)
        };
        let until_done = |mut stream: ReceiverStream<Result<pb::Event, Status>>| async move {
            let mut got = Vec::new();
            while let Some(item) = stream.next().await {
                let event = item.unwrap();
                if event.r#type == "replay_done" {
                    return got;
                }
                got.push((event.seq, event.r#type));
            }
            panic!("no replay_done");
        };
        let full = until_done(read(5)).await;
        let seqs: Vec<u64> = full.iter().map(|(seq, _)| *seq).collect();
        assert_eq!(seqs, (14_997..=15_001).collect::<Vec<u64>>());
        let short = until_done(read(100_000)).await;
        assert_eq!(short[0].1, "pruned", "{:?}", &short[..3]);
        assert_eq!(short.last().unwrap().0, 15_001);
        kernel.shutdown().await;
        store.close().await;
    }

    #[test]
    fn a_filter_names_unknown_types_and_follows_a_subtree_whatever_the_types() {
        let err = EventFilter::any()
            .types(&["spawned".to_owned(), "spawnd".to_owned()])
            .unwrap_err();
        assert!(
            err.contains("\"spawnd\"") && err.contains("llm_call"),
            "{err}"
        );
        let mut filter = EventFilter::any()
            .processes([Pid(2)].into(), true)
            .types(&["reaped".to_owned()])
            .unwrap();
        let event = |seq, pid, kind| Event {
            seq,
            at_unix_ms: 0,
            pid: Pid(pid),
            trace: None,
            kind,
        };
        let spawned = |ppid| EventKind::Spawned {
            ppid: Pid(ppid),
            name: Arc::from("w"),
            role: hivekernel_agents::Role::Worker,
            tier: hivekernel_agents::Tier::Operational,
            runtime: Arc::from("tool_agent"),
            restored: false,
        };
        let reaped = || EventKind::Reaped {
            by: crate::events::ReapCause::Timeout,
        };
        // The spawn is not shown, but its child joins the subtree.
        assert!(!filter.admits(&event(1, 5, spawned(2))));
        assert!(filter.admits(&event(2, 5, reaped())));
        assert!(!filter.admits(&event(3, 6, reaped())));
        assert!(!filter.is_any() && EventFilter::any().is_any());
    }
}
