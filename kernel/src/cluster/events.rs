//! The cluster's one event sequence: stream `HK_EVENTS` (docs/CLUSTER.md,
//! "Events and cron"). Each node publishes the events of its bus to
//! `hk.events.<node>`, in its own order, each once (its name, epoch and
//! local sequence number are the message id, so a publish retried after a
//! lost acknowledgement is stored once). The stream's sequence is the
//! order every subscriber of every node sees; a subscriber reads it with
//! an ordered consumer of its own, from where it asked.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, Context, stream};
use bytes::Bytes;
use futures::StreamExt;

use super::seal::{Forged, Fresh, Seal};
use super::{Cluster, ClusterError, open_stream};
use crate::events::{Backlog, Event, Missed, Subscription};

/// The stream of every node's events.
pub(crate) const EVENTS: &str = "HK_EVENTS";
/// Events taken from the bus and published at a time, their acknowledgements
/// awaited together.
const BATCH: usize = 256;
/// The longest wait between two tries of a publish that failed.
const MOST_BACKOFF: Duration = Duration::from_secs(5);
/// How long a leaving node goes on publishing what its bus still holds.
const DRAIN: Duration = Duration::from_secs(2);
/// How long a leaving node waits for one more live event before it has
/// published them all.
const LAST_WAIT: Duration = Duration::from_millis(20);

/// A subscription to this node's bus from after a sequence number, or
/// `None` once the kernel has gone.
pub type Subscribe = Arc<dyn Fn(u64) -> Option<Subscription> + Send + Sync>;

/// One event of the stream, as a subscriber reads it.
#[derive(Debug)]
pub struct Published {
    /// Its place in the cluster's sequence.
    pub seq: u64,
    /// Whether it was the newest in the stream when it was read.
    pub newest: bool,
    /// The node it happened on.
    pub node: String,
    /// The event, its `seq` the stream's; why it could not be read when a
    /// peer published something else there.
    pub event: Result<Event, String>,
}

/// A subscriber's read of the stream, from the sequence it started at.
pub struct EventFeed {
    messages: pull::Ordered,
    /// Checks that a node signed each event, as the node it is filed under.
    seal: Seal,
    /// The first sequence not read yet. An ordered consumer that is made
    /// again before it delivered anything (a reconnect, a new stream
    /// leader) starts over from the stream's oldest: what comes before
    /// this is dropped.
    next: u64,
}

impl std::fmt::Debug for EventFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventFeed").finish_non_exhaustive()
    }
}

impl EventFeed {
    /// The next event, waiting for one; `None` when the feed has ended.
    pub async fn next(&mut self) -> Option<Result<Published, ClusterError>> {
        let failed = |err: &dyn std::fmt::Display| {
            Some(Err(ClusterError::jetstream(
                &format!("reading {EVENTS}"),
                err,
            )))
        };
        let (message, seq, newest) = loop {
            let message = match self.messages.next().await? {
                Ok(message) => message,
                Err(err) => return failed(&err),
            };
            let (seq, newest) = match message.info() {
                Ok(info) => (info.stream_sequence, info.pending == 0),
                Err(err) => return failed(&err),
            };
            if seq >= self.next {
                self.next = seq + 1;
                break (message, seq, newest);
            }
        };
        let node = message
            .subject
            .as_str()
            .strip_prefix("hk.events.")
            .unwrap_or_default()
            .to_owned();
        let stored = message.info().map_or(0, |info| stored_ms(&info.published));
        let id = message_id(message.headers.as_ref());
        let event = open_event(
            &self.seal,
            &message.subject,
            &id,
            &node,
            &message.payload,
            stored,
        )
        .map_err(|why| format!("message {seq} of {EVENTS} was refused: {why}"))
        .and_then(|body| {
            serde_json::from_slice::<Event>(&body)
                .map(|mut event| {
                    event.seq = seq;
                    event
                })
                .map_err(|err| format!("message {seq} of {EVENTS} is not an event: {err}"))
        });
        Some(Ok(Published {
            seq,
            newest,
            node,
            event,
        }))
    }
}

/// The payload of event message `payload` on `subject` under message id
/// `id`, filed under `node` and stored at `stored_ms`, if `node` signed
/// it within the window of its storing.
fn open_event(
    seal: &Seal,
    subject: &str,
    id: &str,
    node: &str,
    payload: &Bytes,
    stored_ms: u64,
) -> Result<Bytes, Forged> {
    let what = || format!("an event on {subject}");
    let opened = seal.open(
        &[b"event", subject.as_bytes(), id.as_bytes()],
        payload,
        Fresh::Stored(stored_ms),
        what,
    )?;
    if seal.signs() && opened.node != node {
        let why = Forged::WrongNode {
            claimed: node.to_owned(),
            signer: opened.node,
        };
        seal.refused(&what(), &why);
        return Err(why);
    }
    Ok(opened.body)
}

/// When the stream stored a message, in Unix ms.
pub(crate) fn stored_ms(at: &async_nats::datetime::DateTime) -> u64 {
    u64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(0)
}

/// A stored message's id (`Nats-Msg-Id`), or empty.
pub(crate) fn message_id(headers: Option<&async_nats::HeaderMap>) -> String {
    headers
        .and_then(|headers| headers.get(async_nats::header::NATS_MESSAGE_ID))
        .map(|id| id.as_str().to_owned())
        .unwrap_or_default()
}

/// The stream's first and last sequence numbers now (while it is empty,
/// the first is the one after the last).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub first: u64,
    pub last: u64,
}

/// Opens stream `HK_EVENTS`, creating it when missing: file storage, the
/// newest `keep` events (the creating node's `event_log_limit`).
pub(crate) async fn open(
    js: &Context,
    replicas: Option<usize>,
    keep: u64,
) -> Result<stream::Stream, ClusterError> {
    let config = jetstream::stream::Config {
        name: EVENTS.to_owned(),
        subjects: vec!["hk.events.>".to_owned()],
        storage: jetstream::stream::StorageType::File,
        max_messages: i64::try_from(keep).unwrap_or(i64::MAX),
        discard: jetstream::stream::DiscardPolicy::Old,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    };
    open_stream(js, replicas, config).await
}

/// What this node still has to publish: what a subscription to its bus
/// replays (from the store, then from memory), then its live feed.
struct Outbox {
    backlog: Option<Backlog>,
    replay: VecDeque<Arc<Event>>,
    live: crate::events::Live,
}

impl Outbox {
    fn new(subscription: Subscription) -> Self {
        if subscription.pruned > 0 {
            tracing::warn!(
                missed = subscription.pruned,
                "cluster: events pruned from this node's store before they were published to {EVENTS}"
            );
        }
        Outbox {
            backlog: subscription.backlog,
            replay: subscription.replay.into(),
            live: subscription.live,
        }
    }

    /// Whether events older than the live feed wait (from the store or
    /// the replay).
    fn has_older(&self) -> bool {
        self.backlog.is_some() || !self.replay.is_empty()
    }

    /// Appends the next events, at most `max`, oldest first, waiting for
    /// live ones when nothing older is left.
    async fn next(&mut self, into: &mut Vec<Arc<Event>>, max: usize) -> Result<(), Missed> {
        if let Some(backlog) = &mut self.backlog {
            match backlog
                .store
                .events_between(backlog.after, backlog.before, max)
                .await
            {
                Ok(chunk) if !chunk.is_empty() => {
                    backlog.after = chunk.last().map_or(backlog.before, |e| e.seq);
                    into.extend(chunk.into_iter().map(Arc::new));
                    return Ok(());
                }
                Ok(_) => self.backlog = None,
                Err(err) => {
                    tracing::warn!(error = %err, "cluster: events in this node's store could not be read for {EVENTS}; they are not published");
                    self.backlog = None;
                }
            }
        }
        if !self.replay.is_empty() {
            let take = self.replay.len().min(max);
            into.extend(self.replay.drain(..take));
            return Ok(());
        }
        self.live.recv_many(into, max).await.map(|_| ())
    }
}

impl Cluster {
    /// The stream's bounds now.
    pub async fn event_bounds(&self) -> Result<Bounds, ClusterError> {
        let info = self
            .events
            .get_info()
            .await
            .map_err(|err| ClusterError::jetstream(&format!("reading {EVENTS}"), err))?;
        let state = info.state;
        Ok(Bounds {
            first: if state.messages == 0 {
                state.last_sequence + 1
            } else {
                state.first_sequence
            },
            last: state.last_sequence,
        })
    }

    /// Reads the stream from sequence `start` on (the oldest kept, when
    /// that is later), then as events arrive.
    pub async fn event_feed(&self, start: u64) -> Result<EventFeed, ClusterError> {
        let what = || format!("reading {EVENTS} from {start}");
        let consumer = self
            .events
            .create_consumer(pull::OrderedConfig {
                deliver_policy: DeliverPolicy::ByStartSequence {
                    start_sequence: start.max(1),
                },
                ..Default::default()
            })
            .await
            .map_err(|err| ClusterError::jetstream(&what(), err))?;
        let messages = consumer
            .messages()
            .await
            .map_err(|err| ClusterError::jetstream(&what(), err))?;
        Ok(EventFeed {
            messages,
            seal: self.seal.clone(),
            next: start.max(1),
        })
    }

    /// Publishes this node's events to the stream until it leaves: every
    /// one after sequence number `after` of its bus, read through
    /// `subscribe`, in order. A publish that fails is tried again (backing
    /// off) from the first event not acknowledged, so the stream holds
    /// each event once and in this node's order. A feed that falls behind
    /// the bus takes up again from the store. A node that leaves publishes
    /// what its bus still holds for up to 2 s; a fenced one publishes
    /// nothing more (its processes are the cluster's now).
    pub fn publish_events(self: &Arc<Self>, after: u64, subscribe: Subscribe) {
        let cluster = self.clone();
        self.tracker.spawn(async move {
            let Some(subscription) = subscribe(after) else {
                return;
            };
            let mut outbox = Outbox::new(subscription);
            let mut batch: Vec<Arc<Event>> = Vec::with_capacity(BATCH);
            let mut published = after;
            let mut draining: Option<tokio::time::Instant> = None;
            loop {
                batch.clear();
                let next = match draining {
                    None => tokio::select! {
                        biased;
                        () = cluster.cancel.cancelled() => {
                            draining = Some(tokio::time::Instant::now() + DRAIN);
                            continue;
                        }
                        next = outbox.next(&mut batch, BATCH) => next,
                    },
                    // What the bus holds arrives at once; a pause in its
                    // live feed means nothing is left.
                    Some(deadline) => {
                        let until = if outbox.has_older() {
                            deadline
                        } else {
                            deadline.min(tokio::time::Instant::now() + LAST_WAIT)
                        };
                        match tokio::time::timeout_at(until, outbox.next(&mut batch, BATCH)).await {
                            Ok(next) => next,
                            Err(_) => return,
                        }
                    }
                };
                match next {
                    Ok(()) => {}
                    Err(Missed::Lagged(missed)) => {
                        tracing::warn!(
                            missed,
                            "cluster: publishing to {EVENTS} fell behind this node's events; \
                             taking up again from its store"
                        );
                        match subscribe(published) {
                            Some(subscription) => outbox = Outbox::new(subscription),
                            None => return,
                        }
                        continue;
                    }
                    Err(Missed::Closed) => {
                        if batch.is_empty() {
                            return;
                        }
                    }
                }
                // A feed taken up again may repeat what went out already.
                batch.retain(|event| event.seq > published);
                let Some(last) = batch.last().map(|event| event.seq) else {
                    continue;
                };
                if !cluster.publish_batch(&batch, draining).await {
                    return;
                }
                published = last;
            }
        });
    }

    /// Publishes `batch`, trying again until every event is acknowledged:
    /// false when it gave up (the node was fenced, or it is leaving and
    /// its drain `deadline` passed; a leave during the tries sets one).
    async fn publish_batch(
        &self,
        batch: &[Arc<Event>],
        mut deadline: Option<tokio::time::Instant>,
    ) -> bool {
        let subject = format!("hk.events.{}", self.settings.node);
        let mut done = 0;
        let mut backoff = Duration::from_millis(100);
        let mut told = false;
        while done < batch.len() {
            if self.fenced.borrow().is_some() {
                return false;
            }
            let attempt = self.publish_from(&subject, &batch[done..]);
            let mut attempt = std::pin::pin!(attempt);
            // A leave while it is under way gives it until the drain's end.
            let result = loop {
                match deadline {
                    None => tokio::select! {
                        biased;
                        result = &mut attempt => break result,
                        () = self.cancel.cancelled() => {
                            deadline = Some(tokio::time::Instant::now() + DRAIN);
                        }
                    },
                    Some(deadline) => match tokio::time::timeout_at(deadline, &mut attempt).await {
                        Ok(result) => break result,
                        Err(_) => return false,
                    },
                }
            };
            let Err((acknowledged, err)) = result else {
                break;
            };
            done += acknowledged;
            if !told {
                tracing::warn!(error = %err, "cluster: publishing this node's events to {EVENTS} failed; trying again");
                told = true;
            }
            let pause = tokio::time::Instant::now() + backoff;
            match deadline {
                Some(deadline) if deadline <= pause => return false,
                Some(_) => tokio::time::sleep_until(pause).await,
                None => tokio::select! {
                    biased;
                    () = self.cancel.cancelled() => {
                        deadline = Some(tokio::time::Instant::now() + DRAIN);
                    }
                    () = tokio::time::sleep_until(pause) => {}
                },
            }
            backoff = (backoff * 2).min(MOST_BACKOFF);
        }
        if told {
            tracing::info!("cluster: publishing this node's events to {EVENTS} again");
        }
        true
    }

    /// Sends every event of `events`, then waits for their
    /// acknowledgements in order; on failure, how many of the first ones
    /// were acknowledged, and why the next was not. An event that cannot
    /// be encoded (none can fail) is left out, said in the log.
    async fn publish_from(
        &self,
        subject: &str,
        events: &[Arc<Event>],
    ) -> Result<(), (usize, ClusterError)> {
        let what = || format!("publishing to {EVENTS}");
        let mut acks = Vec::with_capacity(events.len());
        let mut failed = None;
        for event in events {
            let payload = match serde_json::to_vec(&**event) {
                Ok(payload) => payload,
                Err(err) => {
                    tracing::warn!(seq = event.seq, error = %err, "cluster: an event could not be encoded for {EVENTS}");
                    acks.push(None);
                    continue;
                }
            };
            let id = format!("{}.{}.{}", self.settings.node, self.epoch, event.seq);
            // Signed with its subject and id: a copy published again
            // carries the same id, which the stream stores once within
            // its duplicate window, and past that its time is stale.
            let payload = self
                .seal
                .seal(&[b"event", subject.as_bytes(), id.as_bytes()], &payload);
            let publish = PublishMessage::build().payload(payload).message_id(id);
            match self.js.send_publish(subject.to_owned(), publish).await {
                Ok(ack) => acks.push(Some(ack)),
                Err(err) => {
                    failed = Some(ClusterError::jetstream(&what(), err));
                    break;
                }
            }
        }
        let sent = acks.len();
        for (acknowledged, ack) in acks.into_iter().enumerate() {
            if let Some(ack) = ack
                && let Err(err) = ack.await
            {
                return Err((acknowledged, ClusterError::jetstream(&what(), err)));
            }
        }
        match failed {
            None => Ok(()),
            Some(err) => Err((sent, err)),
        }
    }
}
