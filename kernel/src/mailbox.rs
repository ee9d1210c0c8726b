//! A per-process mailbox with four priorities, aging and TTL, bounded by
//! count and by bytes.
//!
//! Messages of one priority are served in order. Across priorities the most
//! urgent head wins, but a message rises one level for every aging interval
//! it has waited, so low-priority traffic is never starved. Expired messages
//! are dropped when they reach the head (or when a full mailbox is purged)
//! and handed back so the kernel can report them.

use std::collections::VecDeque;
use std::time::Duration;

use hivekernel_agents::{Message, MessageId, Pid, Priority, Task, TaskReply, TraceContext};
use parking_lot::Mutex;
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Where the answer to a task goes.
#[derive(Debug)]
pub(crate) enum ReplyTo {
    /// A caller blocked in `execute_task`.
    Waiter(oneshot::Sender<TaskReply>),
    /// A `task_response` message into this process's mailbox (`delegate_async`).
    Mailbox(Pid),
    /// A `task_response` for a `delegate_async` requester on another node
    /// of the cluster.
    Node(Box<Requester>),
}

/// A `delegate_async` requester on another node, and the request id it
/// was given there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Requester {
    pub(crate) node: String,
    pub(crate) pid: Pid,
    pub(crate) request_id: hivekernel_agents::RequestId,
}

/// What a mailbox carries.
#[derive(Debug)]
pub(crate) enum Item {
    /// A message.
    Message(Message),
    /// A task request and where its reply goes.
    Task {
        task: Task,
        priority: Priority,
        reply: ReplyTo,
    },
    /// A turn that waited for a person when the kernel stopped, to carry on.
    Resume(Box<Resume>),
}

/// A turn to resume after a restart.
#[derive(Debug)]
pub(crate) struct Resume {
    /// The inbox request it waits for.
    pub(crate) request: u64,
    /// Its runtime's checkpoint.
    pub(crate) checkpoint: String,
    /// The `delegate_async` request it answers.
    pub(crate) origin: Option<crate::trace::Origin>,
    /// The trace it belongs to.
    pub(crate) trace: Option<TraceContext>,
    /// The approval rules it was asked under.
    pub(crate) approvals: hivekernel_agents::approval::Carried,
}

/// An item with its delivery bookkeeping.
#[derive(Debug)]
pub(crate) struct Envelope {
    pub(crate) item: Item,
    pub(crate) id: MessageId,
    pub(crate) enqueued_at: Instant,
    pub(crate) expires_at: Option<Instant>,
    /// Kept in the store until handed to the runtime (an acknowledged send).
    pub(crate) durable: bool,
}

impl Envelope {
    /// Wraps `item`, expiring `ttl` from now when given.
    pub(crate) fn new(id: MessageId, item: Item, ttl: Option<Duration>) -> Self {
        let now = Instant::now();
        Envelope {
            item,
            id,
            enqueued_at: now,
            // A TTL too large to represent never expires.
            expires_at: ttl.and_then(|ttl| now.checked_add(ttl)),
            durable: false,
        }
    }

    /// Marks the envelope as kept in the store until delivery.
    pub(crate) fn durable(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    pub(crate) fn priority(&self) -> Priority {
        match &self.item {
            Item::Message(m) => m.priority,
            Item::Task { priority, .. } => *priority,
            Item::Resume(_) => Priority::High,
        }
    }

    /// `message`, `task` or `resume`: what metrics count it as.
    pub(crate) fn item_type(&self) -> &'static str {
        match &self.item {
            Item::Message(_) => "message",
            Item::Task { .. } => "task",
            Item::Resume(_) => "resume",
        }
    }

    pub(crate) fn from(&self) -> Pid {
        match &self.item {
            Item::Message(m) => m.from,
            Item::Task { task, .. } => task.from,
            Item::Resume(_) => Pid::KERNEL,
        }
    }

    pub(crate) fn kind(&self) -> &str {
        match &self.item {
            Item::Message(m) => &m.kind,
            Item::Task { .. } => "task_request",
            Item::Resume(_) => "resume",
        }
    }

    /// What it weighs against the mailbox's byte limit: the text it carries.
    fn weight(&self) -> u64 {
        let bytes = match &self.item {
            Item::Message(m) => m.kind.len() + m.payload.len(),
            Item::Task { task, .. } => task
                .params
                .iter()
                .fold(task.description.len(), |sum, (k, v)| {
                    sum + k.len() + v.len()
                }),
            Item::Resume(resume) => resume.checkpoint.len(),
        };
        bytes as u64
    }

    fn expired(&self, now: Instant) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }
}

/// Why a push was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PushError {
    /// At capacity even after dropping expired messages.
    Full,
    /// Not empty, and this item would take it past its byte limit.
    FullBytes,
    /// The owner has exited.
    Closed,
}

#[derive(Debug, Default)]
struct Queues {
    /// One queue per priority, made on the first push: most processes idle,
    /// and four empty queues inline would cost every one of them 128 bytes.
    levels: Option<Box<[VecDeque<Envelope>; 4]>>,
    /// Items queued, and the bytes they weigh: u32 each, as every idle
    /// process has one of these (the limits are checked to fit).
    len: u32,
    bytes: u32,
    closed: bool,
    /// Earliest expiry among queued messages (a lower bound), so a full
    /// mailbox is scanned for expired messages only when one may have expired.
    next_expiry: Option<Instant>,
    /// The consumer's task, started by the first accepted push. It lives
    /// under this lock so that the push that starts it and the close that
    /// takes it are never interleaved: a closer always gets every consumer
    /// that will ever run (a closed mailbox accepts no push).
    runner: Option<JoinHandle<()>>,
}

/// What a close hands back: items still queued, and the consumer's task if
/// one was started.
pub(crate) type Closed = (Vec<Envelope>, Option<JoinHandle<()>>);

/// A bounded priority mailbox with a single consumer, which the first push
/// starts: a process that was never sent anything runs no task.
#[derive(Debug)]
pub(crate) struct Mailbox {
    queues: Mutex<Queues>,
    ready: Notify,
    capacity: u32,
    max_bytes: u32,
    aging: Duration,
}

impl Mailbox {
    /// A mailbox holding at most `capacity` messages, and at most `max_bytes`
    /// of them unless it holds just one (so any one message fits); waiting
    /// messages rise a level per `aging`.
    pub(crate) fn new(capacity: usize, max_bytes: u64, aging: Duration) -> Self {
        Mailbox {
            queues: Mutex::new(Queues::default()),
            ready: Notify::new(),
            capacity: u32::try_from(capacity).unwrap_or(u32::MAX),
            max_bytes: u32::try_from(max_bytes).unwrap_or(u32::MAX),
            aging: aging.max(Duration::from_millis(1)),
        }
    }

    /// Why `q` cannot take `weight` more bytes now, if it cannot.
    fn refusal(&self, q: &Queues, weight: u64) -> Option<PushError> {
        if q.len >= self.capacity {
            Some(PushError::Full)
        } else if q.len > 0 && u64::from(q.bytes) + weight > u64::from(self.max_bytes) {
            Some(PushError::FullBytes)
        } else {
            None
        }
    }

    /// Enqueue. When full, expired messages are purged first and handed to
    /// `on_expired`. The first push calls `start` for the consumer's task.
    pub(crate) fn push(
        &self,
        env: Envelope,
        on_expired: impl FnMut(Envelope),
        start: impl FnOnce() -> Option<JoinHandle<()>>,
    ) -> Result<(), PushError> {
        let mut purged = Vec::new();
        let weight = env.weight();
        let result = {
            let mut q = self.queues.lock();
            if q.closed {
                Err(PushError::Closed)
            } else {
                if self.refusal(&q, weight).is_some() {
                    purged = q.purge_expired(Instant::now());
                }
                match self.refusal(&q, weight) {
                    Some(refused) => Err(refused),
                    None => {
                        q.enqueue(env, weight, start);
                        Ok(())
                    }
                }
            }
        };
        if result.is_ok() {
            self.ready.notify_one();
        }
        purged.into_iter().for_each(on_expired);
        result
    }

    /// Enqueue a message restored from the store after a restart, even past
    /// its limits: it was acknowledged before the restart and must not be lost.
    pub(crate) fn push_restored(
        &self,
        env: Envelope,
        start: impl FnOnce() -> Option<JoinHandle<()>>,
    ) -> Result<(), PushError> {
        {
            let mut q = self.queues.lock();
            if q.closed {
                return Err(PushError::Closed);
            }
            let weight = env.weight();
            q.enqueue(env, weight, start);
        }
        self.ready.notify_one();
        Ok(())
    }

    /// The next message by effective priority, or `None` when empty.
    /// Expired messages met on the way go to `on_expired`.
    #[cfg(test)]
    pub(crate) fn try_pop(&self, on_expired: impl FnMut(Envelope)) -> Option<Envelope> {
        let mut expired = Vec::new();
        let popped = self.queues.lock().pop(self.aging, &mut expired);
        expired.into_iter().for_each(on_expired);
        popped
    }

    /// Waits for the next message; `None` once the mailbox is closed.
    /// Expired messages met on the way go to `on_expired`.
    ///
    /// Only the wake-up future lives across the await: this future sits in
    /// every idle process's task, so its size is memory per agent.
    pub(crate) async fn recv(&self, mut on_expired: impl FnMut(Envelope)) -> Option<Envelope> {
        loop {
            if let Some(next) = self.poll_queues(&mut on_expired) {
                return next;
            }
            // Single consumer: a push between the check and here leaves a permit.
            self.ready.notified().await;
        }
    }

    /// `Some(None)` when closed, `Some(Some(_))` with the next message,
    /// `None` when there is nothing to take yet.
    fn poll_queues(&self, on_expired: &mut impl FnMut(Envelope)) -> Option<Option<Envelope>> {
        let mut expired = Vec::new();
        let popped = {
            let mut q = self.queues.lock();
            if q.closed {
                return Some(None);
            }
            q.pop(self.aging, &mut expired)
        };
        expired.into_iter().for_each(on_expired);
        popped.map(Some)
    }

    /// Refuses further pushes and returns what was still queued, and the
    /// consumer's task; the consumer wakes to find the mailbox closed.
    pub(crate) fn close(&self) -> Closed {
        let closed = self.close_without_wake();
        self.ready.notify_one();
        closed
    }

    /// [`Mailbox::close`] for a consumer that is about to be aborted: waking
    /// it would only schedule its task once more before the abort does.
    pub(crate) fn close_without_wake(&self) -> Closed {
        let mut q = self.queues.lock();
        q.closed = true;
        let runner = q.runner.take();
        if q.len == 0 {
            return (Vec::new(), runner);
        }
        q.len = 0;
        q.bytes = 0;
        let pending = q
            .levels
            .iter_mut()
            .flat_map(|levels| levels.iter_mut())
            .flat_map(|level| level.drain(..))
            .collect();
        (pending, runner)
    }

    /// Messages waiting now (including expired ones not yet dropped).
    pub(crate) fn len(&self) -> usize {
        self.queues.lock().len as usize
    }

    /// Most messages it holds.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity as usize
    }

    /// Most bytes it holds (of more than one message).
    pub(crate) fn max_bytes(&self) -> u64 {
        u64::from(self.max_bytes)
    }
}

impl Queues {
    fn enqueue(
        &mut self,
        env: Envelope,
        weight: u64,
        start: impl FnOnce() -> Option<JoinHandle<()>>,
    ) {
        if let Some(at) = env.expires_at {
            self.next_expiry = Some(self.next_expiry.map_or(at, |n| n.min(at)));
        }
        let levels = self.levels.get_or_insert_with(Default::default);
        levels[env.priority().level()].push_back(env);
        self.len += 1;
        // Restored messages may pass the limit; the sum saturates, never wraps.
        self.bytes = u32::try_from(u64::from(self.bytes) + weight).unwrap_or(u32::MAX);
        if self.runner.is_none() {
            self.runner = start();
        }
    }

    /// Pops the head with the best effective priority. The clock is read
    /// only when it matters: several levels compete, or a TTL must be checked.
    fn pop(&mut self, aging: Duration, expired: &mut Vec<Envelope>) -> Option<Envelope> {
        let levels = self.levels.as_deref_mut()?;
        let mut now = None;
        loop {
            let mut heads = [None; 4];
            for (level, queue) in levels.iter().enumerate() {
                heads[level] = queue.front().map(|head| head.enqueued_at);
            }
            let competing = heads.iter().flatten().count();
            let level = if competing <= 1 {
                heads.iter().position(Option::is_some)?
            } else {
                let now = *now.get_or_insert_with(Instant::now);
                // Rank by effective level (levels climbed by whole aging
                // intervals waited, up to critical), then by age.
                let rank = |level: usize, at: Instant| {
                    let waited = now.saturating_duration_since(at);
                    let climbed = (1..=level as u32)
                        .take_while(|k| waited >= aging * *k)
                        .count();
                    (level - climbed, at)
                };
                (0..4)
                    .filter_map(|level| heads[level].map(|at| (rank(level, at), level)))
                    .min()?
                    .1
            };
            let env = levels[level].pop_front()?;
            self.len -= 1;
            self.bytes = self.bytes.saturating_sub(weight32(&env));
            if env.expires_at.is_some() && env.expired(*now.get_or_insert_with(Instant::now)) {
                expired.push(env);
                continue;
            }
            return Some(env);
        }
    }

    fn purge_expired(&mut self, now: Instant) -> Vec<Envelope> {
        let mut purged = Vec::new();
        if self.next_expiry.is_none_or(|at| at > now) {
            return purged;
        }
        let mut next_expiry = None;
        for queue in self.levels.iter_mut().flat_map(|levels| levels.iter_mut()) {
            let mut i = 0;
            while i < queue.len() {
                match queue[i].expires_at {
                    Some(at) if at <= now => {
                        if let Some(env) = queue.remove(i) {
                            self.len -= 1;
                            self.bytes = self.bytes.saturating_sub(weight32(&env));
                            purged.push(env);
                        }
                    }
                    Some(at) => {
                        next_expiry = Some(next_expiry.map_or(at, |n: Instant| n.min(at)));
                        i += 1;
                    }
                    None => i += 1,
                }
            }
        }
        self.next_expiry = next_expiry;
        purged
    }
}

/// An envelope's weight as the queues count it.
fn weight32(env: &Envelope) -> u32 {
    u32::try_from(env.weight()).unwrap_or(u32::MAX)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// No byte limit a test would reach.
    const UNBOUNDED: u64 = u32::MAX as u64;

    fn message(id: u64, priority: Priority) -> Envelope {
        message_ttl(id, priority, None)
    }

    fn message_ttl(id: u64, priority: Priority, ttl: Option<Duration>) -> Envelope {
        let body = Message {
            id: MessageId(id),
            from: Pid(2),
            to: Pid(3),
            kind: "message".into(),
            payload: format!("m{id}"),
            priority,
            request_id: None,
            via: None,
            trace: None,
            approvals: hivekernel_agents::approval::Carried::NONE,
        };
        Envelope::new(MessageId(id), Item::Message(body), ttl)
    }

    /// Pushes `env`, which must be accepted, starting no consumer.
    fn put(mailbox: &Mailbox, env: Envelope) {
        mailbox.push(env, |_| {}, || None).unwrap();
    }

    fn drain(mailbox: &Mailbox) -> Vec<u64> {
        std::iter::from_fn(|| mailbox.try_pop(|_| {}).map(|e| e.id.0)).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn serves_higher_priority_first_and_fifo_within_a_level() {
        let mailbox = Mailbox::new(16, UNBOUNDED, Duration::from_secs(5));
        put(&mailbox, message(1, Priority::Low));
        put(&mailbox, message(2, Priority::Normal));
        put(&mailbox, message(3, Priority::Critical));
        put(&mailbox, message(4, Priority::Normal));
        put(&mailbox, message(5, Priority::High));
        assert_eq!(drain(&mailbox), vec![3, 5, 2, 4, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn aging_lifts_a_waiting_message_above_newer_urgent_ones() {
        let mailbox = Mailbox::new(16, UNBOUNDED, Duration::from_secs(5));
        put(&mailbox, message(1, Priority::Low));
        // Waiting 10 s lifts low two levels, to high.
        tokio::time::advance(Duration::from_secs(10)).await;
        put(&mailbox, message(2, Priority::High));
        put(&mailbox, message(3, Priority::Normal));
        // Equal effective level: the older message goes first.
        assert_eq!(drain(&mailbox), vec![1, 2, 3]);

        put(&mailbox, message(4, Priority::Low));
        tokio::time::advance(Duration::from_secs(4)).await;
        put(&mailbox, message(5, Priority::Normal));
        // Not yet a full interval: low stays behind normal.
        assert_eq!(drain(&mailbox), vec![5, 4]);
    }

    #[tokio::test(start_paused = true)]
    async fn expired_messages_are_dropped_and_reported() {
        let mailbox = Mailbox::new(16, UNBOUNDED, Duration::from_secs(5));
        mailbox
            .push(
                message_ttl(1, Priority::High, Some(Duration::from_millis(100))),
                |_| {},
                || None,
            )
            .unwrap();
        put(&mailbox, message(2, Priority::Normal));
        tokio::time::advance(Duration::from_millis(150)).await;
        let mut expired = Vec::new();
        let next = mailbox.try_pop(|e| expired.push(e.id.0)).unwrap();
        assert_eq!(next.id.0, 2);
        assert_eq!(expired, vec![1]);
        assert_eq!(mailbox.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn full_mailbox_refuses_until_expired_messages_are_purged() {
        let mailbox = Mailbox::new(2, UNBOUNDED, Duration::from_secs(5));
        mailbox
            .push(
                message_ttl(1, Priority::Normal, Some(Duration::from_millis(10))),
                |_| {},
                || None,
            )
            .unwrap();
        put(&mailbox, message(2, Priority::Normal));
        assert_eq!(
            mailbox
                .push(message(3, Priority::Critical), |_| {}, || None)
                .unwrap_err(),
            PushError::Full
        );
        assert_eq!(mailbox.len(), 2);
        tokio::time::advance(Duration::from_millis(20)).await;
        let mut purged = Vec::new();
        mailbox
            .push(
                message(4, Priority::Normal),
                |e| purged.push(e.id.0),
                || None,
            )
            .unwrap();
        assert_eq!(purged, vec![1]);
        assert_eq!(drain(&mailbox), vec![2, 4]);
    }

    #[tokio::test]
    async fn recv_wakes_on_push_and_ends_on_close() {
        let mailbox = std::sync::Arc::new(Mailbox::new(4, UNBOUNDED, Duration::from_secs(5)));
        let reader = {
            let mailbox = mailbox.clone();
            tokio::spawn(async move {
                let first = mailbox.recv(|_| {}).await.map(|e| e.id.0);
                let second = mailbox.recv(|_| {}).await.map(|e| e.id.0);
                (first, second)
            })
        };
        tokio::task::yield_now().await;
        put(&mailbox, message(7, Priority::Normal));
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (leftover, runner) = mailbox.close();
        assert!(leftover.is_empty());
        assert!(
            runner.is_none(),
            "no consumer was started through this mailbox"
        );
        assert_eq!(reader.await.unwrap(), (Some(7), None));
        assert_eq!(
            mailbox
                .push(message(8, Priority::Normal), |_| {}, || None)
                .unwrap_err(),
            PushError::Closed
        );
    }

    #[tokio::test]
    async fn the_first_push_starts_the_consumer_once_and_close_hands_it_over() {
        let mailbox = Mailbox::new(4, UNBOUNDED, Duration::from_secs(5));
        let starts = std::sync::atomic::AtomicU32::new(0);
        let start = || {
            starts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Some(tokio::spawn(std::future::pending::<()>()))
        };
        mailbox
            .push(message(1, Priority::Normal), |_| {}, start)
            .unwrap();
        mailbox
            .push(message(2, Priority::Normal), |_| {}, start)
            .unwrap();
        assert_eq!(starts.load(std::sync::atomic::Ordering::Relaxed), 1);
        let (pending, runner) = mailbox.close_without_wake();
        assert_eq!(
            pending.iter().map(|e| e.id.0).collect::<Vec<_>>(),
            vec![1, 2]
        );
        let runner = runner.expect("the consumer the first push started");
        runner.abort();
        assert!(runner.await.unwrap_err().is_cancelled());
        // Closed: nothing starts another consumer.
        assert_eq!(
            mailbox
                .push(message(3, Priority::Normal), |_| {}, start)
                .unwrap_err(),
            PushError::Closed
        );
        assert!(mailbox.close().1.is_none());
        assert_eq!(starts.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_bound_a_mailbox_but_any_one_message_fits_an_empty_one() {
        // Each test message weighs "message" + "mN": 9 bytes.
        let mailbox = Mailbox::new(100, 20, Duration::from_secs(5));
        put(&mailbox, message(1, Priority::Normal));
        put(&mailbox, message(2, Priority::Normal));
        let refused = mailbox.push(message(3, Priority::Normal), |_| {}, || None);
        assert_eq!(refused.unwrap_err(), PushError::FullBytes);
        assert_eq!(drain(&mailbox), vec![1, 2]);

        // Taking one frees its bytes.
        put(&mailbox, message(4, Priority::Normal));
        put(&mailbox, message(5, Priority::Normal));
        assert_eq!(mailbox.try_pop(|_| {}).map(|e| e.id.0), Some(4));
        put(&mailbox, message(6, Priority::Normal));
        assert_eq!(drain(&mailbox), vec![5, 6]);

        // Bigger than the whole limit, alone: taken; behind another: refused.
        let big = |id| {
            let mut env = message(id, Priority::Normal);
            if let Item::Message(m) = &mut env.item {
                m.payload = "x".repeat(100);
            }
            env
        };
        put(&mailbox, big(7));
        let refused = mailbox.push(big(8), |_| {}, || None);
        assert_eq!(refused.unwrap_err(), PushError::FullBytes);

        // Expired messages are purged to make room.
        let mailbox = Mailbox::new(100, 20, Duration::from_secs(5));
        let short = Some(Duration::from_millis(10));
        put(&mailbox, message_ttl(9, Priority::Normal, short));
        put(&mailbox, message_ttl(10, Priority::Normal, short));
        tokio::time::advance(Duration::from_millis(20)).await;
        let mut expired = Vec::new();
        mailbox
            .push(
                message(11, Priority::Normal),
                |e| expired.push(e.id.0),
                || None,
            )
            .unwrap();
        assert_eq!(expired, vec![9, 10]);
        assert_eq!(drain(&mailbox), vec![11]);
    }
}
