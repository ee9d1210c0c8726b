//! A bounded per-process mailbox with four priorities, aging and TTL.
//!
//! Messages of one priority are served in order. Across priorities the most
//! urgent head wins, but a message rises one level for every aging interval
//! it has waited, so low-priority traffic is never starved. Expired messages
//! are dropped when they reach the head (or when a full mailbox is purged)
//! and handed back so the kernel can report them.

use std::collections::VecDeque;
use std::time::Duration;

use hivekernel_agents::{Message, MessageId, Pid, Priority, Task, TaskReply};
use parking_lot::Mutex;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

/// Where the answer to a task goes.
#[derive(Debug)]
pub(crate) enum ReplyTo {
    /// A caller blocked in `execute_task`.
    Waiter(oneshot::Sender<TaskReply>),
    /// A `task_response` message into this process's mailbox (`delegate_async`).
    Mailbox(Pid),
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
}

/// An item with its delivery bookkeeping.
#[derive(Debug)]
pub(crate) struct Envelope {
    pub(crate) item: Item,
    pub(crate) id: MessageId,
    pub(crate) enqueued_at: Instant,
    pub(crate) expires_at: Option<Instant>,
}

impl Envelope {
    /// Wraps `item`, expiring `ttl` from now when given.
    pub(crate) fn new(id: MessageId, item: Item, ttl: Option<Duration>) -> Self {
        let now = Instant::now();
        Envelope {
            item,
            id,
            enqueued_at: now,
            expires_at: ttl.map(|ttl| now + ttl),
        }
    }

    pub(crate) fn priority(&self) -> Priority {
        match &self.item {
            Item::Message(m) => m.priority,
            Item::Task { priority, .. } => *priority,
        }
    }

    pub(crate) fn from(&self) -> Pid {
        match &self.item {
            Item::Message(m) => m.from,
            Item::Task { task, .. } => task.from,
        }
    }

    pub(crate) fn kind(&self) -> &str {
        match &self.item {
            Item::Message(m) => &m.kind,
            Item::Task { .. } => "task_request",
        }
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
    /// The owner has exited.
    Closed,
}

#[derive(Debug, Default)]
struct Queues {
    levels: [VecDeque<Envelope>; 4],
    len: usize,
    closed: bool,
}

/// A bounded priority mailbox with a single consumer.
#[derive(Debug)]
pub(crate) struct Mailbox {
    queues: Mutex<Queues>,
    ready: Notify,
    capacity: usize,
    aging: Duration,
}

impl Mailbox {
    /// A mailbox holding at most `capacity` messages; waiting messages rise a level per `aging`.
    pub(crate) fn new(capacity: usize, aging: Duration) -> Self {
        Mailbox {
            queues: Mutex::new(Queues::default()),
            ready: Notify::new(),
            capacity,
            aging: aging.max(Duration::from_millis(1)),
        }
    }

    /// Enqueue. When full, expired messages are purged first and handed to `on_expired`.
    pub(crate) fn push(
        &self,
        env: Envelope,
        on_expired: impl FnMut(Envelope),
    ) -> Result<(), PushError> {
        let mut purged = Vec::new();
        let result = {
            let mut q = self.queues.lock();
            if q.closed {
                Err(PushError::Closed)
            } else {
                if q.len >= self.capacity {
                    purged = q.purge_expired(Instant::now());
                }
                if q.len >= self.capacity {
                    Err(PushError::Full)
                } else {
                    q.levels[env.priority().level()].push_back(env);
                    q.len += 1;
                    Ok(())
                }
            }
        };
        if result.is_ok() {
            self.ready.notify_one();
        }
        purged.into_iter().for_each(on_expired);
        result
    }

    /// The next message by effective priority, or `None` when empty.
    /// Expired messages met on the way go to `on_expired`.
    #[cfg(test)]
    pub(crate) fn try_pop(&self, on_expired: impl FnMut(Envelope)) -> Option<Envelope> {
        let mut expired = Vec::new();
        let popped = self.queues.lock().pop(Instant::now(), self.aging, &mut expired);
        expired.into_iter().for_each(on_expired);
        popped
    }

    /// Waits for the next message; `None` once the mailbox is closed.
    /// Expired messages met on the way go to `on_expired`.
    pub(crate) async fn recv(&self, mut on_expired: impl FnMut(Envelope)) -> Option<Envelope> {
        let mut expired = Vec::new();
        loop {
            let popped = {
                let mut q = self.queues.lock();
                if q.closed {
                    return None;
                }
                q.pop(Instant::now(), self.aging, &mut expired)
            };
            expired.drain(..).for_each(&mut on_expired);
            if popped.is_some() {
                return popped;
            }
            // Single consumer: a push between the check and here leaves a permit.
            self.ready.notified().await;
        }
    }

    /// Refuses further pushes and returns what was still queued.
    pub(crate) fn close(&self) -> Vec<Envelope> {
        let drained = {
            let mut q = self.queues.lock();
            q.closed = true;
            q.len = 0;
            q.levels.iter_mut().flat_map(|l| l.drain(..)).collect()
        };
        self.ready.notify_one();
        drained
    }

    /// Messages waiting now (including expired ones not yet dropped).
    pub(crate) fn len(&self) -> usize {
        self.queues.lock().len
    }

    /// Most messages it holds.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }
}

impl Queues {
    fn pop(&mut self, now: Instant, aging: Duration, expired: &mut Vec<Envelope>) -> Option<Envelope> {
        loop {
            let mut best: Option<(usize, usize, Instant)> = None;
            for (level, queue) in self.levels.iter().enumerate() {
                let Some(head) = queue.front() else { continue };
                let waited = now.saturating_duration_since(head.enqueued_at);
                let lift = (waited.as_nanos() / aging.as_nanos()).min(level as u128) as usize;
                let effective = level - lift;
                let better = match best {
                    None => true,
                    Some((e, _, at)) => effective < e || (effective == e && head.enqueued_at < at),
                };
                if better {
                    best = Some((effective, level, head.enqueued_at));
                }
            }
            let (_, level, _) = best?;
            let env = self.levels[level].pop_front()?;
            self.len -= 1;
            if env.expired(now) {
                expired.push(env);
                continue;
            }
            return Some(env);
        }
    }

    fn purge_expired(&mut self, now: Instant) -> Vec<Envelope> {
        let mut purged = Vec::new();
        for queue in &mut self.levels {
            let before = queue.len();
            let mut kept = VecDeque::with_capacity(before);
            for env in queue.drain(..) {
                if env.expired(now) {
                    purged.push(env);
                } else {
                    kept.push_back(env);
                }
            }
            *queue = kept;
        }
        self.len -= purged.len();
        purged
    }
}

