//! `GetTranscript` and `WatchTranscript`: requests into queries, entries
//! into messages, page tokens, and the watch's producer.

use std::sync::Arc;
use std::time::Duration;

use hivekernel_agents::Pid;
use hivekernel_proto::v1 as pb;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::streams::{Stop, send};
use crate::kernel::{Caller, Kernel, Recording};
use crate::transcript::{Entry, Page, Query};

/// Entries per page when the request leaves it at 0.
const DEFAULT_PAGE: usize = 200;
/// Most entries per page.
const MAX_PAGE: usize = 1000;
/// A page ends once it holds about this much (well under gRPC's 4 MiB).
const PAGE_BYTES: usize = 1 << 20;
/// Entries in flight between a watch's producer and its client.
const WATCH_BUFFER: usize = 256;
/// How often a watch checks whether its process has exited.
const EXIT_CHECK: Duration = Duration::from_secs(1);
/// How often a watch of a process on another node reads what it added.
const REMOTE_POLL: Duration = Duration::from_millis(250);

/// The query a `GetTranscript` asks for.
pub(super) fn query(req: &pb::GetTranscriptRequest) -> Result<Query, Status> {
    let mut query = Query {
        after_turn: req.after_turn,
        since_unix_ms: req.since_unix_ms,
        tail_turns: (req.tail_turns != 0).then_some(req.tail_turns),
        limit: match req.page_size {
            0 => DEFAULT_PAGE,
            n => (n as usize).min(MAX_PAGE),
        },
        max_bytes: PAGE_BYTES,
        ..Query::default()
    };
    if !req.page_token.is_empty() {
        let (after_id, min_turn) = decode_token(&req.page_token)?;
        query.after_id = after_id;
        query.min_turn = min_turn;
        // The tail was resolved by the first page.
        query.tail_turns = None;
    }
    Ok(query)
}

/// The query a `WatchTranscript` replays.
pub(super) fn watch_query(req: &pb::WatchTranscriptRequest) -> Query {
    Query {
        after_id: req.after_id,
        since_unix_ms: req.since_unix_ms,
        tail_turns: (req.tail_turns != 0).then_some(req.tail_turns),
        limit: MAX_PAGE,
        max_bytes: PAGE_BYTES,
        ..Query::default()
    }
}

/// A page as the response; its token names where the next one starts.
pub(super) fn page(page: Page) -> pb::GetTranscriptResponse {
    let next_page_token = match (page.more, page.entries.last()) {
        (true, Some(last)) => encode_token(last.id, page.min_turn),
        _ => String::new(),
    };
    pb::GetTranscriptResponse {
        entries: page.entries.iter().map(entry).collect(),
        next_page_token,
    }
}

pub(super) fn entry(entry: &Entry) -> pb::TranscriptEntry {
    pb::TranscriptEntry {
        id: entry.id,
        pid: entry.pid.0,
        turn: entry.turn,
        at_unix_ms: entry.at_unix_ms,
        r#type: entry.kind.name().to_owned(),
        trace_id: entry.trace.map(|id| id.to_string()).unwrap_or_default(),
        detail: serde_json::to_string(&entry.kind).unwrap_or_else(|err| {
            tracing::error!(error = %err, id = entry.id, "cannot encode a transcript entry");
            String::new()
        }),
    }
}

/// `t<after_id>.<min_turn>`: the cursor and the first turn of the tail.
fn encode_token(after_id: u64, min_turn: u64) -> String {
    format!("t{after_id}.{min_turn}")
}

fn decode_token(token: &str) -> Result<(u64, u64), Status> {
    token
        .strip_prefix('t')
        .and_then(|rest| rest.split_once('.'))
        .and_then(|(id, turn)| Some((id.parse().ok()?, turn.parse().ok()?)))
        .ok_or_else(|| {
            let shown = hivekernel_agents::text::cut_str(token, 64);
            Status::invalid_argument(format!(
                "page_token: {shown:?} is not a token this kernel gave out \
                 (pass next_page_token as it came)"
            ))
        })
}

/// The producer of a `WatchTranscript`: what `query` replays, then each
/// new entry of `pid`, until the process has exited for good (with its
/// last entries sent), the client goes or the kernel stops. A watcher that
/// falls behind the live feed reads what it missed back from the kernel,
/// so it loses nothing that is still kept. A process on another node of a
/// cluster is read there every [`REMOTE_POLL`] ([`follow_there`]).
pub(super) fn watch(
    kernel: &Kernel,
    stop: Stop,
    caller: Caller,
    pid: Pid,
    query: Query,
    mut live: broadcast::Receiver<Arc<Entry>>,
) -> ReceiverStream<Result<pb::TranscriptEntry, Status>> {
    let (tx, rx) = mpsc::channel(WATCH_BUFFER);
    let reader = kernel.clone();
    kernel.tracker().spawn(async move {
        let mut last = query.after_id;
        if !catch_up(&reader, &tx, &stop, caller, pid, query, &mut last).await {
            return;
        }
        if let Some((node, epoch)) = reader.transcripts().recorded_elsewhere(pid).await {
            follow_there(&reader, &tx, &stop, caller, pid, (&node, epoch), &mut last).await;
            return;
        }
        let mut check = tokio::time::interval(EXIT_CHECK);
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = tx.closed() => return,
                received = live.recv() => match received {
                    Ok(entry) if entry.pid == pid && entry.id > last => {
                        last = entry.id;
                        if !send(&tx, Ok(self::entry(&entry)), &stop).await {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(RecvError::Lagged(_)) => {
                        if !catch_up(&reader, &tx, &stop, caller, pid, query_after(last), &mut last).await {
                            return;
                        }
                    }
                    Err(RecvError::Closed) => return,
                },
                _ = check.tick() => {
                    if reader.transcripts().has_exited(pid) {
                        // What it recorded before it exited, then the end.
                        let _ = catch_up(&reader, &tx, &stop, caller, pid, query_after(last), &mut last).await;
                        return;
                    }
                }
            }
        }
    });
    ReceiverStream::new(rx)
}

/// Reads what `pid`, on another node (its name and epoch there),
/// recorded after `last`, every [`REMOTE_POLL`], until it exits (what it
/// recorded before that sent) or moves, the client goes or the kernel
/// stops.
async fn follow_there(
    kernel: &Kernel,
    tx: &mpsc::Sender<Result<pb::TranscriptEntry, Status>>,
    stop: &Stop,
    caller: Caller,
    pid: Pid,
    (node, epoch): (&str, u64),
    last: &mut u64,
) {
    let mut poll = tokio::time::interval(REMOTE_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = tx.closed() => return,
            _ = poll.tick() => {}
        }
        // Asked before the read, so the read holds what it recorded last.
        let recording = kernel.transcripts().recording_there(pid, node, epoch).await;
        // Its new node numbers its entries afresh: nothing of it follows.
        if recording == Recording::Moved {
            return;
        }
        let after = query_after(*last);
        if !catch_up(kernel, tx, stop, caller, pid, after, last).await
            || recording == Recording::Ended
        {
            return;
        }
    }
}

fn query_after(after_id: u64) -> Query {
    Query {
        after_id,
        limit: MAX_PAGE,
        max_bytes: PAGE_BYTES,
        ..Query::default()
    }
}

/// Sends every kept entry `query` matches, page by page; false when the
/// stream is over (the client went, or the read failed and said so).
async fn catch_up(
    kernel: &Kernel,
    tx: &mpsc::Sender<Result<pb::TranscriptEntry, Status>>,
    stop: &Stop,
    caller: Caller,
    pid: Pid,
    mut query: Query,
    last: &mut u64,
) -> bool {
    loop {
        let page = match kernel.transcripts().read(caller, pid, query).await {
            Ok(page) => page,
            // Nothing kept of a process that is gone: nothing to send.
            Err(crate::KernelError::NotFound(_)) => return true,
            Err(err) => {
                let _ = send(tx, Err(Status::from(err)), stop).await;
                return false;
            }
        };
        for entry in &page.entries {
            *last = (*last).max(entry.id);
            if !send(tx, Ok(self::entry(entry)), stop).await {
                return false;
            }
        }
        if !page.more {
            return true;
        }
        query = Query {
            after_id: *last,
            min_turn: page.min_turn,
            tail_turns: None,
            ..query
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tokens_round_trip_and_nonsense_is_refused() {
        assert_eq!(decode_token(&encode_token(42, 7)).ok(), Some((42, 7)));
        for bad in ["", "t", "t1", "x1.2", "t1.x", "t-1.2", "t1.2.3"] {
            let err = decode_token(bad)
                .err()
                .map(|s| (s.code(), s.message().to_owned()));
            let (code, message) = err.unwrap_or((tonic::Code::Ok, String::new()));
            assert_eq!(code, tonic::Code::InvalidArgument, "{bad:?}");
            assert!(message.starts_with("page_token: "), "{message}");
        }
    }
}
