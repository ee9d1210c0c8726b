//! Messages the kernel makes (a task's answer, a copy to a parent, a
//! `child_exited` notice), on a node of a cluster: one ordered lane per
//! receiver (docs/CLUSTER.md, "Messages the kernel makes").
//!
//! Such a message comes from a path that does not wait (a runner ending a
//! task, a reap). To a process on another node it is posted there; to a
//! process of this node that may move (its mail is the cluster's), it is
//! kept in `HK_MAIL` before it enters the mailbox, as an acknowledged send
//! is, so a node's loss does not lose it. Both wait on NATS, so they go
//! through the receiver's lane: one task at a time per receiver, in the
//! order they were made, so a task's answer still comes before the notice
//! that its worker exited. A message to a process of this node whose mail
//! stays here, with no lane open for it, goes into its mailbox at once, as
//! on a kernel alone.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hivekernel_agents::{ErrorKind, Message, MessageId, Pid, RequestId};
use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::cluster::rpc::Op;
use crate::cluster::{ClusterError, Letter, Standing};
use crate::error::{KernelError, Result};
use crate::events::unix_ms;
use crate::kernel::cluster::NodeHandle;
use crate::kernel::cluster::{FORWARDED_SEND, Holder};
use crate::store::Write;

/// The first wait before a keep in `HK_MAIL` whose outcome is unknown is
/// tried again; it doubles while it is at most [`KEEP_RETRY_MAX`]: four
/// more tries, 3 s of waiting between them.
const KEEP_RETRY: Duration = Duration::from_millis(200);
const KEEP_RETRY_MAX: Duration = Duration::from_secs(2);
/// When a process is looked for after a message was left for its next
/// start (each wait after the one before): a start that read its mail just
/// before lists the process within moments.
const LOOK_AGAIN: [Duration; 3] = [
    Duration::ZERO,
    Duration::from_secs(1),
    Duration::from_secs(3),
];

/// When a post to a node that did not take it (it did not answer, or
/// could not keep it in time) is sent again, each wait after the one
/// before, while that node stays in the view under the same epoch: a
/// node that lost its NATS connection for a moment has it back.
const POST_AGAIN: [Duration; 3] = [
    Duration::from_secs(1),
    Duration::from_secs(3),
    Duration::from_secs(10),
];
/// How long the key of a post from another node handed over here is
/// remembered, so the same post sent again is not handed over twice: past
/// the posts again and the stream's duplicate window.
const TAKEN_FOR: Duration = Duration::from_secs(120);
/// At most this many keys are remembered; past that the oldest go first.
const TAKEN_KEPT: usize = 65_536;

/// The lanes open on this node: for each receiver whose lane is open,
/// the messages waiting behind the one being handed on.
#[derive(Debug, Default)]
pub(super) struct Lanes {
    open: Mutex<HashMap<Pid, VecDeque<Posting>>>,
    taken: Mutex<Taken>,
}

/// The keys of the posts from other nodes handed over here in the last
/// [`TAKEN_FOR`] (at most [`TAKEN_KEPT`]), oldest first.
#[derive(Debug, Default)]
struct Taken {
    keys: HashSet<Arc<str>>,
    order: VecDeque<(Instant, Arc<str>)>,
}

impl Taken {
    /// Notes `key`, taken at `now`: false if it was noted already.
    fn insert(&mut self, key: &str, now: Instant) -> bool {
        while let Some((at, _)) = self.order.front()
            && now.saturating_duration_since(*at) > TAKEN_FOR
        {
            self.forget_oldest();
        }
        if self.keys.contains(key) {
            return false;
        }
        if self.order.len() >= TAKEN_KEPT {
            self.forget_oldest();
        }
        let key: Arc<str> = Arc::from(key);
        self.keys.insert(key.clone());
        self.order.push_back((now, key));
        true
    }

    fn forget_oldest(&mut self) {
        if let Some((_, oldest)) = self.order.pop_front() {
            self.keys.remove(&oldest);
        }
    }
}

/// A message the kernel made, on its way.
#[derive(Debug)]
pub(super) struct Posting {
    pub(super) message: Message,
    /// The `delegate_async` request it answers, which this node recorded.
    pub(super) done: Option<RequestId>,
    /// The node holding the receiver, when the message must go there (an
    /// answer to a request another node sent); else where the receiver is
    /// when its turn comes.
    pub(super) node: Option<String>,
    /// Told once the message is where its receiver reads it (a post from
    /// another node is answered then).
    pub(super) kept: Option<oneshot::Sender<Result<()>>>,
    /// The id it is kept under in `HK_MAIL`, when another node made it
    /// (see [`Op::Post`]).
    pub(super) key: Option<String>,
}

impl Posting {
    pub(super) fn new(message: Message, done: Option<RequestId>) -> Posting {
        Posting {
            message,
            done,
            node: None,
            kept: None,
            key: None,
        }
    }
}

impl NodeHandle<'_> {
    /// Hands a message the kernel made to its receiver: through the
    /// receiver's lane on a node of a cluster, at once otherwise.
    pub(super) fn hand_on(self, posting: Posting) {
        if self.kernel.inner.cluster().is_none() || !self.needs_lane(&posting) {
            self.hand_here(posting);
            return;
        }
        let to = posting.message.to;
        let most = self.kernel.inner.settings().mailbox_capacity;
        let refused = {
            let mut open = self.kernel.inner.lanes().open.lock();
            match open.get_mut(&to) {
                Some(waiting) if waiting.len() >= most => Some(posting),
                Some(waiting) => {
                    waiting.push_back(posting);
                    None
                }
                None => {
                    open.insert(to, VecDeque::from([posting]));
                    let kernel = self.kernel.clone();
                    self.kernel
                        .inner
                        .tracker()
                        .spawn(async move { kernel.node().run_lane(to).await });
                    None
                }
            }
        };
        if let Some(posting) = refused {
            let err = KernelError::MailboxFull {
                pid: to,
                limit: format!("{most} kernel messages waiting to be kept"),
            };
            self.refuse_posting(posting, err);
        }
    }

    /// Whether `posting` waits on NATS, or on messages before it that do:
    /// its receiver is elsewhere, its mail is the cluster's, or its lane
    /// is open.
    fn needs_lane(self, posting: &Posting) -> bool {
        let to = posting.message.to;
        if posting.node.is_some() || self.kernel.inner.lanes().open.lock().contains_key(&to) {
            return true;
        }
        match self.kernel.inner.table().read().get(to) {
            Some(entry) => entry.proc.mail_in_cluster,
            None => to != Pid::KERNEL,
        }
    }

    /// Hands on the messages of `to`'s lane, oldest first, until none
    /// waits; the lane closes then. While one is handed on, the lane stays
    /// open, so a message made meanwhile waits behind it. A kernel
    /// stopping drops what is left.
    async fn run_lane(self, to: Pid) {
        loop {
            let next = {
                let mut open = self.kernel.inner.lanes().open.lock();
                let Some(waiting) = open.get_mut(&to) else {
                    return;
                };
                match waiting.pop_front() {
                    Some(next) => next,
                    None => {
                        open.remove(&to);
                        return;
                    }
                }
            };
            let shutdown = self.kernel.inner.shutdown().clone();
            let (id, from, kind) = (
                next.message.id,
                next.message.from,
                next.message.kind.clone(),
            );
            let posted_here = next.kept.is_none();
            tokio::select! {
                () = shutdown.cancelled() => {
                    // The one under way ends with its future (a post from
                    // another node is answered that this node stops, and
                    // that node reports it).
                    if posted_here {
                        self.kernel.report_dropped(to, id, from, kind, &KernelError::ShuttingDown);
                    }
                    let left = self.kernel.inner.lanes().open.lock().remove(&to).unwrap_or_default();
                    for posting in left {
                        self.refuse_posting(posting, KernelError::ShuttingDown);
                    }
                    return;
                }
                () = self.hand_over_lane(next) => {}
            }
        }
    }

    /// Hands one message of a lane on: posted to the node holding its
    /// receiver, or kept in `HK_MAIL` and put in its mailbox here.
    async fn hand_over_lane(self, mut posting: Posting) {
        let to = posting.message.to;
        // A post whose sender stopped waiting: that node reports it.
        if posting.kept.as_ref().is_some_and(|kept| kept.is_closed()) {
            return;
        }
        let elsewhere = self.held_elsewhere(to);
        let here = self.kernel.inner.table().read().get(to).is_some();
        match (posting.node.take(), elsewhere) {
            // A post from another node, for a process that left since:
            // done here or not at all (an answer is not waited for here
            // any more).
            (_, Some(_)) if posting.kept.is_some() => {
                if let (Some(request_id), Some(cluster)) =
                    (posting.done, self.kernel.inner.cluster())
                {
                    cluster.answered(request_id);
                }
                self.refuse_posting(posting, KernelError::NotFound(to));
            }
            // Where the request came from: the answer goes there, with the
            // request it answers (that node recorded it).
            (Some(asked), at)
                if at.as_ref().is_some_and(|at| *at == asked) || (at.is_none() && !here) =>
            {
                self.post_from_lane(asked, posting).await;
            }
            // The receiver moved to another node since: that node does not
            // know the request, so the answer goes as a message of its own,
            // and a request this node recorded is done.
            (asked, Some(at)) => {
                if asked.is_none()
                    && let Some(request_id) = posting.done
                {
                    self.request_done_here(request_id);
                }
                posting.done = None;
                self.post_from_lane(at, posting).await;
            }
            // Nowhere now, and to start again (its node was lost): it
            // waits in the stream.
            (None, None) if !here && posting.kept.is_none() && self.starts_again(to).await => {
                if let Some(request_id) = posting.done {
                    self.request_done_here(request_id);
                }
                let key = self.post_key();
                let err = KernelError::NotFound(to);
                self.leave_for_next_start(None, key, posting.message, err)
                    .await;
            }
            // The receiver is here, or nowhere known.
            (asked, None) => {
                if asked.is_some() {
                    // Moved here: the request is its first node's record.
                    posting.done = None;
                    posting.message.id = MessageId(self.kernel.next_id());
                }
                self.keep_here(posting).await;
            }
        }
    }

    /// Posts a message of a lane to `node`, waiting for its answer; sent
    /// again ([`POST_AGAIN`]) while that node does not take it and stays
    /// in the view. One that node never answers for, to a process that
    /// moves, waits in the stream for its next start; one it refuses is
    /// reported dropped.
    async fn post_from_lane(self, node: String, posting: Posting) {
        let Posting { message, done, .. } = posting;
        let key = self.post_key();
        let (to, id, from, kind) = (message.to, message.id, message.from, message.kind.clone());
        // The receiver's node as listed now, so a start of it after this
        // post is told apart.
        let epoch = self
            .kernel
            .inner
            .cluster()
            .and_then(|cluster| cluster.last_listed(to))
            .filter(|listing| listing.node == node)
            .map_or(0, |listing| listing.epoch);
        let op = Op::Post {
            message: message.clone(),
            done,
            key: Some(key.clone()),
        };
        let Err(err) = self.post_until_taken(&node, op).await else {
            return;
        };
        let moves = self
            .kernel
            .inner
            .cluster()
            .and_then(|cluster| cluster.last_listed(to))
            .is_some_and(|listing| listing.moves);
        if moves && err.kind() == ErrorKind::Unavailable {
            self.leave_for_next_start(Some((&node, epoch)), key, message, err)
                .await;
        } else {
            self.kernel.report_dropped(to, id, from, kind, &err);
        }
    }

    /// Posts `op` to `node`, and again after each wait of [`POST_AGAIN`]
    /// while `node` does not take it (it does not answer, or did not keep
    /// it in time) and stays in the view under the epoch it had: the same
    /// key each time, so it is handed over once. A stopping kernel sends
    /// nothing again.
    async fn post_until_taken(self, node: &str, op: Op) -> Result<()> {
        let untaken = |err: &KernelError| {
            matches!(
                err.kind(),
                ErrorKind::Unavailable | ErrorKind::DeadlineExceeded
            )
        };
        let epoch = self
            .kernel
            .inner
            .cluster()
            .and_then(|cluster| cluster.epoch_of(node));
        // What the first try said is what is reported: a later refusal
        // (the receiver left that node meanwhile) says no more of where
        // it is.
        let first = match self.forward::<()>(node, op.clone(), FORWARDED_SEND).await {
            Ok(()) => return Ok(()),
            Err(err) => err,
        };
        let (Some(cluster), Some(epoch)) = (self.kernel.inner.cluster(), epoch) else {
            return Err(first);
        };
        if !untaken(&first) {
            return Err(first);
        }
        for wait in POST_AGAIN {
            tracing::info!(%node, error = %first, "cluster: a kernel message not taken by its receiver's node; sent again");
            if self.kernel.is_stopping() || !cluster.stays(node, epoch, wait).await {
                break;
            }
            match self.forward::<()>(node, op.clone(), FORWARDED_SEND).await {
                Ok(()) => return Ok(()),
                Err(err) if untaken(&err) => {}
                Err(_) => break,
            }
        }
        Err(first)
    }

    /// A new id to keep a message this node made under in `HK_MAIL`,
    /// whichever node keeps it (an answer has no message id of its own
    /// yet: its receiver gives it one).
    fn post_key(self) -> String {
        let id = self.kernel.next_id();
        match self.kernel.inner.cluster() {
            Some(cluster) => format!("{}.{}.p{id}", cluster.node(), cluster.epoch()),
            None => format!("p{id}"),
        }
    }

    /// Whether `to`, which no live node holds, starts again on some node:
    /// a process that moves, listed last on a node that was lost, whose
    /// spec the cluster keeps (spawned) or whose key still names it (a
    /// config agent).
    async fn starts_again(self, to: Pid) -> bool {
        let Some(cluster) = self.kernel.inner.cluster() else {
            return false;
        };
        let Some(listing) = cluster.last_listed(to).filter(|listing| listing.moves) else {
            return false;
        };
        if matches!(cluster.kept_spec(to).await, Ok(Some(_))) {
            return true;
        }
        match cluster.declared(&listing.name).await {
            Ok((Standing::Live(holding) | Standing::Orphaned(holding), _)) => {
                holding.pid() == Some(to)
            }
            Ok((Standing::Unclaimed(pid), _)) => pid == Some(to),
            Err(_) => false,
        }
    }

    /// Leaves `message`, which `failed` (the node holding its receiver,
    /// and its epoch) did not answer for, or whose receiver no node holds
    /// now, in the stream for its receiver's next start, under `key`, as
    /// a message of its own. The receiver may start meanwhile, reading its
    /// mail before the message is there: so it is looked for a few times
    /// over the next seconds, and once it runs somewhere the message goes
    /// to it too, under the same key, so it is stored once and handed
    /// over once. One the stream does not take is reported dropped, with
    /// `why`.
    async fn leave_for_next_start(
        self,
        failed: Option<(&str, u64)>,
        key: String,
        mut message: Message,
        why: KernelError,
    ) {
        let Some(cluster) = self.kernel.inner.cluster() else {
            return;
        };
        let (to, id, from, kind) = (message.to, message.id, message.from, message.kind.clone());
        // An answer has no id yet; whoever takes it keeps it by this one.
        message.id = MessageId(self.kernel.next_id());
        let letter = Letter {
            message,
            created_ms: unix_ms(std::time::SystemTime::now()),
            expires_ms: None,
        };
        if let Err(err) = cluster.leave_mail(to, &key, &letter).await {
            let err = KernelError::ClusterUnavailable(format!(
                "{why}; and not kept for its next start: {err}"
            ));
            self.kernel.report_dropped(to, id, from, kind, &err);
            return;
        }
        tracing::info!(%to, message_id = id.0, %kind, reason = %why, "cluster: a kernel message waits in the mail stream for its receiver's next start");
        // In the background: the lane's next messages do not wait for it.
        let kernel = self.kernel.clone();
        let failed = failed.map(|(node, epoch)| (node.to_owned(), epoch));
        let shutdown = self.kernel.inner.shutdown().clone();
        self.kernel.inner.tracker().spawn(async move {
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = kernel.node().look_again(to, key, letter.message, failed) => {}
            }
        });
    }

    /// Looks for `to`, for which `message` was left in the stream under
    /// `key`, a few times over the next seconds ([`LOOK_AGAIN`]); once it
    /// runs on a node other than `failed`, the message goes to it too.
    async fn look_again(
        self,
        to: Pid,
        key: String,
        message: Message,
        failed: Option<(String, u64)>,
    ) {
        let id = message.id;
        for wait in LOOK_AGAIN {
            tokio::time::sleep(wait).await;
            match self.holder(to).await {
                Ok(Some(Holder::Here)) => {
                    let mut posting = Posting::new(message, None);
                    posting.key = Some(key);
                    self.keep_here(posting).await;
                    return;
                }
                Ok(Some(Holder::There(listing)))
                    if failed.as_ref().is_none_or(|(node, epoch)| {
                        (node.as_str(), *epoch) != (listing.node.as_str(), listing.epoch)
                    }) =>
                {
                    let op = Op::Post {
                        message,
                        done: None,
                        key: Some(key),
                    };
                    if let Err(err) = self.forward::<()>(&listing.node, op, FORWARDED_SEND).await {
                        tracing::warn!(%to, message_id = id.0, node = %listing.node, error = %err, "cluster: a kernel message waits for its receiver's next start");
                    }
                    return;
                }
                _ => {}
            }
        }
    }

    /// Removes request `request_id`, answered, from this node's store (a
    /// stopping kernel keeps it, so its restart reports it failed, as on a
    /// kernel alone).
    fn request_done_here(self, request_id: RequestId) {
        let store = self.kernel.inner.store();
        if store.is_durable() && !self.kernel.is_stopping() {
            store.submit(Write::RequestDone(request_id));
        }
    }

    /// Puts a message in its receiver's mailbox here: kept in `HK_MAIL`
    /// first when its mail is the cluster's. One the stream refused before
    /// anything was sent (the process runs elsewhere now, or it is too
    /// large), or that a stopping kernel makes, goes in as on a kernel
    /// alone. A keep whose outcome is unknown (no acknowledgement) is
    /// tried again under the same message id, which the stream stores
    /// once, rather than handed over twice.
    async fn keep_here(self, posting: Posting) {
        let Some(mut posting) = self.first_take(posting) else {
            return;
        };
        let to = posting.message.to;
        let cluster = self.kernel.inner.cluster();
        let Some(cluster) =
            cluster.filter(|_| self.moves_from_here(to) && !self.kernel.is_stopping())
        else {
            self.put_here(posting);
            return;
        };
        if posting.done.is_some() {
            posting.message.id = MessageId(self.kernel.next_id());
        }
        let letter = Letter {
            message: posting.message,
            created_ms: unix_ms(std::time::SystemTime::now()),
            expires_ms: None,
        };
        let key = posting.key.as_deref();
        let mut wait = KEEP_RETRY;
        // Some(false): the copy the node that made it left in the stream,
        // which this node read already or handed over.
        let stored = loop {
            match cluster.keep_mail(to, letter.message.id, key, &letter).await {
                Ok(deliver) => break Some(deliver),
                Err(err @ (ClusterError::NotHere(_) | ClusterError::TooLarge(_))) => {
                    tracing::warn!(%to, error = %err, "cluster: a kernel message was not kept in the mail stream; delivered from this node only");
                    break None;
                }
                Err(err) if wait > KEEP_RETRY_MAX => {
                    tracing::error!(%to, error = %err, "cluster: a kernel message may not be kept in the mail stream; delivered from this node");
                    break None;
                }
                Err(err) => {
                    tracing::warn!(%to, error = %err, "cluster: keeping a kernel message failed; trying again");
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
            }
        };
        posting.message = letter.message;
        let Some(deliver) = stored else {
            self.put_here(posting);
            return;
        };
        let Posting {
            message,
            done,
            kept,
            ..
        } = posting;
        if let Some(request_id) = done {
            self.request_done_here(request_id);
        }
        if deliver {
            self.kernel.deliver(to, message, true);
        }
        if let Some(kept) = kept {
            let _ = kept.send(Ok(()));
        }
    }

    /// Puts a message in its receiver's mailbox on this node, as a kernel
    /// alone does (an answer to a request with the request's removal); a
    /// post from another node only the first time ([`NodeHandle::first_take`]).
    fn hand_here(self, posting: Posting) {
        if let Some(posting) = self.first_take(posting) {
            self.put_here(posting);
        }
    }

    /// `posting`, when it is handed over: every message this node made; a
    /// post from another node the first time its key comes (one sent
    /// again, its sender not having heard that it was taken, was), and an
    /// answer only while its request is waited for (its requester is told
    /// it failed once the worker's node leaves the view). Notes the key
    /// and the answer as taken. One that is not is answered as taken.
    fn first_take(self, posting: Posting) -> Option<Posting> {
        if posting.kept.is_none() {
            return Some(posting);
        }
        let not_handed = if let Some(key) = &posting.key
            && !self
                .kernel
                .inner
                .lanes()
                .taken
                .lock()
                .insert(key, Instant::now())
        {
            tracing::info!(to = %posting.message.to, %key, "cluster: a post from another node came again; handed over once");
            true
        } else if let (Some(request_id), Some(cluster)) =
            (posting.done, self.kernel.inner.cluster())
            && !cluster.answered(request_id)
        {
            tracing::info!(request = %request_id.0, "cluster: an answer came after its requester was told the request failed; dropped");
            true
        } else {
            false
        };
        if !not_handed {
            return Some(posting);
        }
        if let Some(kept) = posting.kept {
            let _ = kept.send(Ok(()));
        }
        None
    }

    /// Puts a message in its receiver's mailbox on this node, as a kernel
    /// alone does (an answer to a request with the request's removal).
    fn put_here(self, posting: Posting) {
        let Posting {
            message,
            done,
            kept,
            ..
        } = posting;
        match done {
            Some(request_id) => self.kernel.answer_requester(message, request_id),
            None => self.kernel.deliver(message.to, message, false),
        }
        if let Some(kept) = kept {
            let _ = kept.send(Ok(()));
        }
    }

    /// Reports a message that will not reach its receiver: here, or by
    /// the node that posted it, told why.
    fn refuse_posting(self, posting: Posting, err: KernelError) {
        let Posting { message, kept, .. } = posting;
        match kept {
            Some(kept) => {
                let _ = kept.send(Err(err));
            }
            None => {
                self.kernel
                    .report_dropped(message.to, message.id, message.from, message.kind, &err)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{TAKEN_FOR, TAKEN_KEPT, Taken};

    #[test]
    fn a_post_is_taken_once_and_the_oldest_keys_are_forgotten_past_the_bound() {
        let now = Instant::now();
        let mut taken = Taken::default();
        assert!(taken.insert("a.1.p1", now));
        assert!(!taken.insert("a.1.p1", now));
        for i in 2..=TAKEN_KEPT {
            assert!(taken.insert(&format!("a.1.p{i}"), now));
        }
        // Full: one more forgets the oldest, and only it.
        assert!(taken.insert("b.1.p1", now));
        assert!(!taken.insert("a.1.p2", now));
        assert!(taken.insert("a.1.p1", now));
        assert!(!taken.insert("b.1.p1", now));
        assert_eq!(
            (taken.keys.len(), taken.order.len()),
            (TAKEN_KEPT, TAKEN_KEPT)
        );
    }

    #[test]
    fn a_posts_key_is_forgotten_once_it_is_old() {
        let now = Instant::now();
        let mut taken = Taken::default();
        assert!(taken.insert("a.1.p1", now));
        let later = now + TAKEN_FOR / 2;
        assert!(taken.insert("a.1.p2", later));
        assert!(!taken.insert("a.1.p1", later));
        let past = now + TAKEN_FOR + Duration::from_millis(1);
        assert!(taken.insert("a.1.p1", past));
        assert!(!taken.insert("a.1.p2", past));
        assert_eq!(taken.keys.len(), 2);
    }
}
