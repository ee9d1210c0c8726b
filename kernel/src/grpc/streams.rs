//! The producers behind the two server-streaming RPCs.
//!
//! Each runs as a kernel-tracked task feeding a small bounded channel, so a
//! slow client slows its producer instead of growing a buffer, and the task
//! ends when the client goes away, the server drains or the kernel stops.

use std::sync::Arc;
use std::time::SystemTime;

use hivekernel_agents::Pid;
use hivekernel_proto::v1 as pb;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::convert;
use crate::events::{Event, EventView, Subscription, unix_ms};
use crate::kernel::Kernel;

/// Batches in flight between a `ListProcesses` producer and its client.
const BATCH_BUFFER: usize = 4;
/// Events in flight between a `SubscribeEvents` producer and its client.
const EVENT_BUFFER: usize = 256;

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
            let processes: Vec<_> = kernel
                .infos(chunk)
                .into_iter()
                .map(convert::process_info)
                .collect();
            if processes.is_empty() {
                continue;
            }
            if !send(&tx, Ok(pb::ProcessBatch { processes }), &stop).await {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}

/// Stored events read per query while replaying from the store.
const BACKLOG_CHUNK: usize = 1024;

/// A stream of the subscription's replay (a `pruned` marker first when it
/// reaches back past the log, then the store when it reaches back past
/// memory), a `replay_done` marker when
/// `since` asked for a replay, then live events without repeats; a lost
/// stretch of live events becomes one `lagged` marker. Only events `view`
/// admits are sent; the markers always are.
pub(crate) fn events(
    kernel: &Kernel,
    stop: Stop,
    since: Option<u64>,
    subscription: Subscription,
    mut view: EventView,
) -> ReceiverStream<Result<pb::Event, Status>> {
    let (tx, rx) = mpsc::channel(EVENT_BUFFER);
    let Subscription {
        pruned,
        backlog,
        replay,
        mut live,
    } = subscription;
    kernel.tracker().spawn(async move {
        let mut last_seq = 0;
        if pruned > 0 {
            let marker = convert::pruned(pruned, unix_ms(SystemTime::now()));
            if !send(&tx, Ok(marker), &stop).await {
                return;
            }
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
                if gone_through > after {
                    let marker = convert::pruned(gone_through - after, unix_ms(SystemTime::now()));
                    if !send(&tx, Ok(marker), &stop).await {
                        return;
                    }
                }
                let Some(last) = chunk.last() else { break };
                after = last.seq;
                for event in &chunk {
                    last_seq = event.seq;
                    if !view.admits(event) {
                        continue;
                    }
                    if !send(&tx, Ok(convert::event(event)), &stop).await {
                        return;
                    }
                }
            }
        }
        for event in replay {
            last_seq = event.seq;
            if !view.admits(&event) {
                continue;
            }
            if !send(&tx, Ok(convert::event(&event)), &stop).await {
                return;
            }
        }
        if let Some(since) = since {
            let done = convert::replay_done(last_seq.max(since), unix_ms(SystemTime::now()));
            if !send(&tx, Ok(done), &stop).await {
                return;
            }
        }
        loop {
            let received: Result<Arc<Event>, RecvError> = tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = tx.closed() => return,
                received = live.recv() => received,
            };
            let item = match received {
                Ok(event) if event.seq <= last_seq => continue,
                Ok(event) => {
                    last_seq = event.seq;
                    if !view.admits(&event) {
                        continue;
                    }
                    convert::event(&event)
                }
                Err(RecvError::Lagged(missed)) => {
                    convert::lagged(missed, unix_ms(SystemTime::now()))
                }
                Err(RecvError::Closed) => return,
            };
            if !send(&tx, Ok(item), &stop).await {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
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

    use hivekernel_agents::Pid;
    use tokio_stream::StreamExt;

    use super::*;
    use crate::config::KernelSettings;
    use crate::events::{EventBus, EventKind};
    use crate::runtime::RuntimeRegistry;
    use crate::store::{DB_FILE, Store, Synchronous};

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
        let kernel = Kernel::builder(KernelSettings::default())
            .runtimes(RuntimeRegistry::default())
            .start()
            .await
            .unwrap()
            .kernel;
        let stop = Stop {
            kernel: CancellationToken::new(),
            server: CancellationToken::new(),
        };
        let mut stream = events(
            &kernel,
            stop,
            Some(0),
            bus.subscribe(Some(0)),
            EventView::All,
        );
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
}
