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
use crate::events::{Event, Subscription, unix_ms};
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
/// stretch of live events becomes one `lagged` marker.
pub(crate) fn events(
    kernel: &Kernel,
    stop: Stop,
    since: Option<u64>,
    subscription: Subscription,
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
                    if !send(&tx, Ok(convert::event(event)), &stop).await {
                        return;
                    }
                }
            }
        }
        for event in replay {
            last_seq = event.seq;
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
