//! Mail kept in JetStream: the acknowledged messages to a process that
//! may move to another node (a config agent), in stream `HK_MAIL` on
//! subject `hk.mail.<pid>` (docs/CLUSTER.md, "Exactly once across
//! nodes"). A send to such a process is acknowledged once the stream has
//! stored it; the node that runs the process delivers it from its own
//! mailbox, as it would a message from its store; the node that starts the
//! process (first, or taking it over) reads what waits on its subject.
//!
//! A message leaves the stream by its sequence number. Deleting it is the
//! handover: a stream applies deletes in one order, so of two nodes that
//! hold the same message (a paused node that resumed before it learned it
//! was fenced, and the node that took its process over) exactly one
//! deletes it and hands it over; the other is told it was gone and drops
//! its copy.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::{self, DeleteMessageErrorKind, RawMessageErrorKind};
use async_nats::jetstream::{self, Context};
use hivekernel_agents::{Message, MessageId, Pid};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::seal::Fresh;
use super::{Cluster, ClusterError, open_stream};

/// The stream of mail.
pub(crate) const MAIL: &str = "HK_MAIL";
/// JetStream's error code for a delete that found no message: "no message
/// found" once deleted, "stream store EOF" past the last (nats-server 2.9).
const NOT_DELETED: u64 = 10057;
/// How long a failed delete waits before it is tried again.
const RETRY: Duration = Duration::from_millis(200);
/// The longest wait between two tries of the deletes that failed: once
/// the stream answers again, what waits goes through within this.
const DROP_RETRY_MAX: Duration = Duration::from_secs(2);
/// Most failed deletes waiting to be tried again; past that, the oldest is
/// given up (its message comes again at its agent's next start: at least
/// once).
const DROPS_WAITING: usize = 100_000;
/// Most deletes of messages their agents acknowledged that may wait for
/// the stream's answer before this node hands its movable processes no
/// more acknowledged mail ([`Cluster::deletes_caught_up`]): each is a
/// message handled that comes again where its process starts next if this
/// node is lost before the delete goes through, so this bounds what a
/// stream outage followed by the node's loss hands over twice.
const MOST_UNCONFIRMED: usize = 16;
/// At most this many messages are read back for one process at its start,
/// more than any mailbox holds (`kernel.mailbox_capacity` is at most 100,000).
const MAX_QUEUED: usize = 100_000;

/// The subject of `pid`'s mail.
fn subject(pid: Pid) -> String {
    format!("hk.mail.{}", pid.0)
}

/// A message as the stream keeps it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Letter {
    /// The message, with the id its sender was given.
    pub(crate) message: Message,
    /// When it was sent (Unix ms).
    pub(crate) created_ms: u64,
    /// When it expires (Unix ms), if it has a TTL.
    pub(crate) expires_ms: Option<u64>,
}

/// A letter read back from the stream: its sequence, and the letter or why
/// it could not be read.
pub(crate) type Queued = (u64, Result<Letter, String>);

/// This node's side of `HK_MAIL`: the stream, the receiver and sequence
/// of each message in this node's mailboxes (by the id its envelope has
/// here), and the processes whose copy here stood down.
pub(crate) struct Mailroom {
    stream: stream::Stream,
    held: Mutex<HashMap<MessageId, (Pid, u64)>>,
    left: Mutex<HashSet<Pid>>,
    /// Deletes that failed, by sequence, oldest first, for the one task
    /// that tries them again ([`Cluster::retry_drops`]).
    drops: Mutex<VecDeque<u64>>,
    dropped: tokio::sync::Notify,
    /// Deletes of acknowledged messages sent and not yet answered, with
    /// those waiting in `drops`.
    unconfirmed: AtomicUsize,
    /// Told each time an unconfirmed delete goes through or is given up.
    confirmed: tokio::sync::Notify,
    /// Whether mail is held back for those deletes now (said once in the
    /// log as it starts and once as it ends).
    holding: AtomicBool,
}

impl Mailroom {
    /// Opens stream `HK_MAIL`, creating it when missing: file storage,
    /// kept until each message is deleted (no age: a message waits for
    /// its process however long that takes).
    pub(crate) async fn open(js: &Context, replicas: Option<usize>) -> Result<Self, ClusterError> {
        let config = jetstream::stream::Config {
            name: MAIL.to_owned(),
            subjects: vec!["hk.mail.>".to_owned()],
            storage: jetstream::stream::StorageType::File,
            duplicate_window: Duration::from_secs(120),
            discard: jetstream::stream::DiscardPolicy::New,
            ..Default::default()
        };
        Ok(Mailroom {
            stream: open_stream(js, replicas, config).await?,
            held: Mutex::new(HashMap::new()),
            left: Mutex::new(HashSet::new()),
            drops: Mutex::new(VecDeque::new()),
            dropped: tokio::sync::Notify::new(),
            unconfirmed: AtomicUsize::new(0),
            confirmed: tokio::sync::Notify::new(),
            holding: AtomicBool::new(false),
        })
    }
}

impl Cluster {
    /// Keeps message `message` to `to` in the stream, as envelope `id` of
    /// this node's mailbox: answered once the stream has stored it. The
    /// publish carries `key` as its message id, or else this node's name,
    /// epoch and `id`, so a retry after a lost answer (or the same
    /// message kept by the node that made it, see [`Cluster::leave_mail`])
    /// is not stored twice. False when a message kept under `key` is one
    /// this node holds already (it read it from the stream) or that was
    /// handed over: this copy is not to be delivered.
    pub(crate) async fn keep_mail(
        &self,
        to: Pid,
        id: MessageId,
        key: Option<&str>,
        letter: &Letter,
    ) -> Result<bool, ClusterError> {
        // A copy that stood down, or a node that is no member any more,
        // takes nothing the agent's node would not read.
        if self.mail.left.lock().contains(&to) || !self.still_member().await {
            return Err(ClusterError::NotHere(format!(
                "process {to} runs on another node now; send it there"
            )));
        }
        let foreign = key.is_some();
        let key = match key {
            Some(key) => key.to_owned(),
            None => format!("{}.{}.{}", self.settings.node, self.epoch, id.0),
        };
        let (seq, duplicate) = self.publish_mail(to, key, letter).await?;
        // Left by the node that made it, and read here or handed over since.
        if foreign && duplicate {
            let held = self
                .mail
                .held
                .lock()
                .values()
                .any(|kept| *kept == (to, seq));
            if held || !self.still_kept(seq).await {
                return Ok(false);
            }
        }
        self.mail.held.lock().insert(id, (to, seq));
        Ok(true)
    }

    /// Whether message `seq` is still in the stream (an error reading it
    /// says yes: a copy too many is refused by its delete, a lost one is not
    /// found again).
    async fn still_kept(&self, seq: u64) -> bool {
        match self.mail.stream.get_raw_message(seq).await {
            Ok(_) => true,
            Err(err) => err.kind() != RawMessageErrorKind::NoMessageFound,
        }
    }

    /// Leaves message `letter` for `to`, which no node can take now (its
    /// node does not answer, or was lost and nobody started it again yet),
    /// in the stream for its next start, under message id `key`: the node
    /// holding `to` keeps it under the same id if it took it after all,
    /// so it is stored once. Refused when this node is no member.
    pub(crate) async fn leave_mail(
        &self,
        to: Pid,
        key: &str,
        letter: &Letter,
    ) -> Result<(), ClusterError> {
        if !self.still_member().await {
            return Err(ClusterError::NotHere(
                "this node may have been declared lost".into(),
            ));
        }
        self.publish_mail(to, key.to_owned(), letter)
            .await
            .map(drop)
    }

    /// Publishes `letter` on `to`'s subject under message id `key`, and
    /// answers its sequence once the stream has stored it, and whether it
    /// was there already (a duplicate's sequence is the first copy's).
    async fn publish_mail(
        &self,
        to: Pid,
        key: String,
        letter: &Letter,
    ) -> Result<(u64, bool), ClusterError> {
        let payload = serde_json::to_vec(letter)
            .map_err(|err| ClusterError::JetStream(format!("encoding a message: {err}")))?;
        // Signed with its subject and id: a copy published again carries
        // the same id, which the stream stores once within its duplicate
        // window, and past that its time is stale.
        let subject = subject(to);
        let payload = self
            .seal
            .seal(&[b"mail", subject.as_bytes(), key.as_bytes()], &payload);
        let most = self.client.server_info().max_payload;
        if most > 0 && payload.len() > most {
            return Err(ClusterError::TooLarge(format!(
                "a message to process {to} is kept in the cluster's {MAIL} stream, and \
                 this one takes {} bytes there, more than the {most} a NATS message may hold \
                 (the servers' max_payload)",
                payload.len()
            )));
        }
        let publish = PublishMessage::build().payload(payload).message_id(key);
        let what = || {
            format!(
                "keeping message {} to process {to} in {MAIL}",
                letter.message.id
            )
        };
        let mut last = None;
        // Once more after a lost answer: the message id makes it one message.
        for _ in 0..2 {
            let sent = self
                .js
                .send_publish(subject.clone(), publish.clone())
                .await
                .map_err(|err| ClusterError::jetstream(&what(), err))?;
            match sent.await {
                Ok(ack) => return Ok((ack.sequence, ack.duplicate)),
                Err(err) => last = Some(err),
            }
        }
        Err(match last {
            Some(err) => ClusterError::jetstream(&what(), err),
            None => ClusterError::JetStream(what()),
        })
    }

    /// Records that envelope `id` of `to`'s mailbox here is message `seq`
    /// of the stream (one read back by [`Cluster::queued_mail`]).
    pub(crate) fn hold_mail(&self, id: MessageId, to: Pid, seq: u64) {
        self.mail.held.lock().insert(id, (to, seq));
    }

    /// Marks this node's copy of `pid` as standing down: what its mailbox
    /// holds is the other copy's, and stays in the stream (neither handed
    /// over nor deleted here), and sends to it are refused, until this
    /// node starts `pid` again ([`Cluster::back_mail_of`]).
    pub(crate) fn leave_mail_of(&self, pid: Pid) {
        self.mail.left.lock().insert(pid);
        self.mail.held.lock().retain(|_, (to, _)| *to != pid);
    }

    /// This node starts `pid` again: its mail is this node's to deliver.
    pub(crate) fn back_mail_of(&self, pid: Pid) {
        self.mail.left.lock().remove(&pid);
    }

    /// Whether envelope `id` of a mailbox here is kept in the stream.
    pub(crate) fn holds_mail(&self, id: MessageId) -> bool {
        self.mail.held.lock().contains_key(&id)
    }

    /// Forgets envelope `id` without deleting it from the stream: it stays
    /// for the process's next start (an agent that did not acknowledge it).
    pub(crate) fn forget_mail(&self, id: MessageId) {
        self.mail.held.lock().remove(&id);
    }

    /// Takes envelope `id` of `pid`'s mailbox out of the stream to hand it
    /// over: `Some(true)` when this node deleted it; `Some(false)` when it
    /// was gone (another node handed it over), when this node's copy of
    /// `pid` stood down, or when this node is no member any more (declared
    /// lost while paused: the node that took its process over delivers
    /// it); `None` when it is not kept in the stream. A delete that fails
    /// is tried twice more; an error then leaves it there.
    pub(crate) async fn take_mail(
        &self,
        pid: Pid,
        id: MessageId,
    ) -> Option<Result<bool, ClusterError>> {
        if self.mail.left.lock().contains(&pid) {
            self.mail.held.lock().remove(&id);
            return Some(Ok(false));
        }
        let (_, seq) = self.mail.held.lock().remove(&id)?;
        let mut failed = None;
        for _ in 0..3 {
            if !self.still_member().await {
                return Some(Ok(false));
            }
            match delete(&self.mail.stream, seq).await {
                // After a failed try whose delete may have gone through
                // unanswered, gone is taken as this node's own delete.
                Ok(deleted) => return Some(Ok(deleted || failed.is_some())),
                Err(err) => {
                    tracing::warn!(seq, error = %err, "cluster: taking a message from {MAIL} failed; trying again");
                    failed = Some(err);
                    tokio::time::sleep(RETRY).await;
                }
            }
        }
        failed.map(Err)
    }

    /// Drops envelope `id` from the stream in the background (it was
    /// acknowledged, it expired, or its process exited before taking it);
    /// false when it is not kept in the stream. A copy that stood down, or
    /// a node that is no member any more, leaves it there. A delete that
    /// fails (a NATS server down, a leader being elected) joins the queue
    /// [`Cluster::retry_drops`] works through until it goes through or the
    /// node stops or is fenced: one given up would come back as a message
    /// already handled at the agent's next start.
    pub(crate) fn drop_mail(self: &Arc<Self>, id: MessageId) -> bool {
        let Some((to, seq)) = self.mail.held.lock().remove(&id) else {
            return false;
        };
        if self.mail.left.lock().contains(&to) || self.fenced.borrow().is_some() {
            return true;
        }
        let cluster = self.clone();
        self.mail.unconfirmed.fetch_add(1, Ordering::AcqRel);
        self.tracker.spawn(async move {
            match delete(&cluster.mail.stream, seq).await {
                Ok(_) => cluster.confirm_drop(),
                Err(err) => {
                    tracing::warn!(seq, error = %err, "cluster: dropping a message from {MAIL} failed; trying again");
                    cluster.drop_later(seq);
                }
            }
        });
        true
    }

    /// One unconfirmed delete went through or was given up.
    fn confirm_drop(&self) {
        self.mail.unconfirmed.fetch_sub(1, Ordering::AcqRel);
        self.mail.confirmed.notify_waiters();
    }

    /// Whether [`MOST_UNCONFIRMED`] or more deletes of acknowledged
    /// messages wait for the stream (one atomic load).
    pub(crate) fn deletes_behind(&self) -> bool {
        self.mail.unconfirmed.load(Ordering::Acquire) >= MOST_UNCONFIRMED
    }

    /// Waits until fewer than [`MOST_UNCONFIRMED`] deletes of acknowledged
    /// messages wait for the stream (it answers again after an outage), or
    /// the node stops or is fenced. While the stream takes no delete,
    /// a message handed to its agent would be handled, and not taken out
    /// of the stream, and come again at the agent's next start if this
    /// node is lost: waiting keeps it in the stream unhandled instead.
    pub(crate) async fn deletes_caught_up(&self) {
        let mut fenced = self.fenced.subscribe();
        loop {
            let confirmed = self.mail.confirmed.notified();
            if !self.deletes_behind() {
                if self.mail.holding.swap(false, Ordering::AcqRel) {
                    tracing::info!(
                        "cluster: deletes from {MAIL} caught up; acknowledged mail handed to agents again"
                    );
                }
                return;
            }
            if !self.mail.holding.swap(true, Ordering::AcqRel) {
                tracing::warn!(
                    waiting = MOST_UNCONFIRMED,
                    "cluster: deletes from {MAIL} unanswered; agents that acknowledge their messages get no more until they go through"
                );
            }
            tokio::select! {
                () = confirmed => {}
                () = self.cancel.cancelled() => return,
                _ = fenced.wait_for(Option::is_some) => return,
            }
        }
    }

    /// Queues the delete of `seq` for [`Cluster::retry_drops`].
    fn drop_later(&self, seq: u64) {
        let given_up = {
            let mut drops = self.mail.drops.lock();
            drops.push_back(seq);
            (drops.len() > DROPS_WAITING).then(|| drops.pop_front())
        };
        if let Some(Some(seq)) = given_up {
            self.confirm_drop();
            tracing::warn!(
                seq,
                "cluster: too many deletes from {MAIL} waiting; a dropped message stays there and comes again at its agent's next start"
            );
        }
        self.mail.dropped.notify_one();
    }

    /// Tries the deletes that failed again, oldest first, until the node
    /// stops or is fenced: while the stream does not answer, the oldest
    /// every while (backing off from 200 ms to [`DROP_RETRY_MAX`]); once
    /// it does, the rest at once, one after the other.
    pub(crate) async fn retry_drops(&self) {
        let mut fenced = self.fenced.subscribe();
        let mut wait = RETRY;
        let mut tries = 0u32;
        loop {
            let next = self.mail.drops.lock().front().copied();
            let Some(seq) = next else {
                tokio::select! {
                    () = self.cancel.cancelled() => break,
                    _ = fenced.wait_for(Option::is_some) => break,
                    () = self.mail.dropped.notified() => continue,
                }
            };
            tokio::select! {
                () = self.cancel.cancelled() => break,
                _ = fenced.wait_for(Option::is_some) => break,
                () = tokio::time::sleep(wait) => {}
            }
            tries += 1;
            match delete(&self.mail.stream, seq).await {
                Ok(_) => {
                    self.mail.drops.lock().pop_front();
                    self.confirm_drop();
                    tracing::info!(seq, tries, "cluster: a dropped message left {MAIL} at last");
                    // The stream answers: the rest go at once.
                    (wait, tries) = (Duration::ZERO, 0);
                }
                Err(err) => {
                    tracing::debug!(seq, error = %err, "cluster: dropping a message from {MAIL} failed again");
                    wait = (wait * 2).clamp(RETRY, DROP_RETRY_MAX);
                }
            }
        }
        let left = self.mail.drops.lock().len();
        if left > 0 {
            tracing::warn!(
                left,
                "cluster: dropped messages stay in {MAIL}: they come again at their agents' next start"
            );
        }
    }

    /// The messages waiting for `pid` in the stream, oldest first, each
    /// with its sequence (see [`Cluster::hold_mail`]).
    pub(crate) async fn queued_mail(&self, pid: Pid) -> Result<Vec<Queued>, ClusterError> {
        let subject = subject(pid);
        let mut found = Vec::new();
        let mut from = 1;
        while found.len() < MAX_QUEUED {
            let read = self
                .mail
                .stream
                .raw_message_builder()
                .sequence(from)
                .next_by_subject(subject.clone())
                .send()
                .await;
            let message = match read {
                Ok(message) => message,
                Err(err) if err.kind() == RawMessageErrorKind::NoMessageFound => break,
                Err(err) => {
                    return Err(ClusterError::jetstream(
                        &format!("reading {subject} in {MAIL}"),
                        err,
                    ));
                }
            };
            from = message.sequence + 1;
            let id = super::events::message_id(Some(&message.headers));
            let letter = self
                .seal
                .open(
                    &[b"mail", subject.as_bytes(), id.as_bytes()],
                    &message.payload,
                    Fresh::Stored(super::events::stored_ms(&message.time)),
                    || format!("a message on {subject} in {MAIL}"),
                )
                .map_err(|why| format!("refused: {why}"))
                .and_then(|opened| {
                    serde_json::from_slice(&opened.body).map_err(|err| err.to_string())
                });
            found.push((message.sequence, letter));
        }
        Ok(found)
    }
}

/// How long a delete may take before it counts as failed (it may still
/// go through; its retry then finds the message gone): short, so that a
/// delete sent to a stream leader that died joins the retries at once,
/// rather than after the client's timeout, and goes through as soon as
/// a new leader answers.
const DELETE_WAIT: Duration = Duration::from_secs(1);

/// How late past its deadline a wait must end to tell of a pause of the
/// node, not of a busy runtime.
const PAUSED: Duration = Duration::from_millis(100);

/// How long an answer that arrived as the wait ended still gets.
const ANSWER_GRACE: Duration = Duration::from_millis(50);

/// Deletes message `seq` of the mail stream: true when this call deleted
/// it, false when it was not there.
///
/// A node paused while it waits (SIGSTOP, a stopped VM) finds the wait
/// over as it resumes, though the answer may lie in its socket, not yet
/// read: the delete went through, and the message is this node's to hand
/// over (the node that took its process over no longer finds it). So a
/// wait that ended late (the runtime did not run at its deadline) reads
/// the answer for one more wait, and any other for [`ANSWER_GRACE`],
/// before the delete counts as failed; a node that then learns it is no
/// member would otherwise take the message from the stream and hand it to
/// no one.
async fn delete(stream: &stream::Stream, seq: u64) -> Result<bool, ClusterError> {
    let asked = tokio::time::Instant::now();
    let mut call = std::pin::pin!(stream.delete_message(seq));
    let mut answer = tokio::time::timeout(DELETE_WAIT, &mut call).await;
    if answer.is_err() {
        let late = asked.elapsed().saturating_sub(DELETE_WAIT);
        let grace = if late > PAUSED {
            tracing::info!(
                seq,
                late_ms = late.as_millis() as u64,
                "cluster: this node was paused while deleting a message from {MAIL}; reading the answer"
            );
            DELETE_WAIT
        } else {
            ANSWER_GRACE
        };
        answer = tokio::time::timeout(grace, &mut call).await;
    }
    let Ok(deleted) = answer else {
        return Err(ClusterError::JetStream(format!(
            "deleting message {seq} of {MAIL}: no answer within {DELETE_WAIT:?}"
        )));
    };
    match deleted {
        Ok(deleted) => Ok(deleted),
        Err(err) => match err.kind() {
            DeleteMessageErrorKind::JetStream(js) if js.error_code().0 == NOT_DELETED => Ok(false),
            _ => Err(ClusterError::jetstream(
                &format!("deleting message {seq} of {MAIL}"),
                err,
            )),
        },
    }
}
