//! Typed kernel events with a monotonically increasing sequence number.
//!
//! Every event goes to live subscribers (a broadcast channel) and into a
//! bounded in-memory ring, so a subscriber can replay from a sequence number
//! and then go live without a gap.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use hivekernel_agents::{MessageId, Pid, RequestId, Role, Tier};
use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::broadcast;

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    /// A process was created.
    Spawned {
        /// Its parent.
        ppid: Pid,
        /// Its name.
        name: Arc<str>,
        /// Its role.
        role: Role,
        /// Its tier.
        tier: Tier,
        /// Its runtime.
        runtime: Arc<str>,
    },
    /// A process exited and is a zombie until collected (or was reaped with its parent).
    Exited {
        /// Its parent.
        ppid: Pid,
        /// Its name.
        name: Arc<str>,
        /// Exit code.
        exit_code: i32,
        /// Why; shared by every process one exit takes with it.
        reason: Arc<str>,
    },
    /// A zombie was removed from the table.
    Reaped {
        /// `wait_child`, `timeout` or `parent_exited`.
        by: &'static str,
    },
    /// A message passed its TTL before delivery and was dropped.
    MessageExpired {
        /// Its id.
        message_id: MessageId,
        /// Sender.
        from: Pid,
        /// Its kind.
        kind: String,
    },
    /// A message the kernel produced itself could not be delivered.
    MessageDropped {
        /// Its id.
        message_id: MessageId,
        /// Sender.
        from: Pid,
        /// Its kind.
        kind: String,
        /// Why.
        reason: String,
    },
    /// A message addressed to the kernel (PID 1), which keeps no mailbox.
    KernelMessage {
        /// Its id.
        message_id: MessageId,
        /// Sender.
        from: Pid,
        /// Its kind.
        kind: String,
        /// Body.
        payload: String,
    },
    /// A send or task was refused by the routing rules.
    RouteDenied {
        /// Would-be receiver.
        to: Pid,
        /// Why.
        reason: String,
    },
    /// A task finished on this process.
    TaskFinished {
        /// Its request id.
        request_id: RequestId,
        /// Who asked.
        from: Pid,
        /// Whether it succeeded.
        success: bool,
        /// Time from pop to reply.
        duration_ms: u64,
    },
    /// The kernel restarted this process (same PID, fresh mailbox and runtime) after it exited.
    Restarted {
        /// Times it has been restarted, this one included.
        attempt: u32,
        /// How long it waited after its exit (its backoff delay).
        delay_ms: u64,
    },
    /// A child of this process exceeded its restart intensity: the child
    /// stays dead and this process fails in turn (PID 1 only reports it).
    Escalated {
        /// The child that failed too often.
        child: Pid,
        /// Its name.
        name: Arc<str>,
        /// Restarts it had within the window.
        restarts: u32,
        /// The window.
        within_seconds: u64,
    },
    /// Stream marker (seq 0): a subscriber fell behind and missed this many events.
    Lagged {
        /// Events skipped.
        missed: u64,
    },
    /// Stream marker (seq 0): the replay requested is complete; live events follow.
    ReplayDone {
        /// Sequence number of the last replayed event (the requested start when none were).
        last_seq: u64,
    },
}

impl EventKind {
    /// The snake_case name, as in the `type` field of the JSON form.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::Spawned { .. } => "spawned",
            EventKind::Exited { .. } => "exited",
            EventKind::Reaped { .. } => "reaped",
            EventKind::MessageExpired { .. } => "message_expired",
            EventKind::MessageDropped { .. } => "message_dropped",
            EventKind::KernelMessage { .. } => "kernel_message",
            EventKind::RouteDenied { .. } => "route_denied",
            EventKind::TaskFinished { .. } => "task_finished",
            EventKind::Restarted { .. } => "restarted",
            EventKind::Escalated { .. } => "escalated",
            EventKind::Lagged { .. } => "lagged",
            EventKind::ReplayDone { .. } => "replay_done",
        }
    }
}

/// One kernel event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    /// Position in the kernel's event sequence, starting at 1.
    pub seq: u64,
    /// Wall-clock time.
    pub at_unix_ms: u64,
    /// The process it concerns.
    pub pid: Pid,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// Retained events plus a live feed that continues exactly after them.
#[derive(Debug)]
pub struct Subscription {
    /// Retained events with `seq > since`, oldest first.
    pub replay: Vec<Arc<Event>>,
    /// Events emitted after the replay.
    pub live: broadcast::Receiver<Arc<Event>>,
}

#[derive(Debug)]
struct Ring {
    next_seq: u64,
    events: VecDeque<Arc<Event>>,
}

/// Sequences, retains and broadcasts events.
#[derive(Debug)]
pub struct EventBus {
    ring: Mutex<Ring>,
    retain: usize,
    live: broadcast::Sender<Arc<Event>>,
}

impl EventBus {
    /// A bus retaining the last `retain` events for replay.
    pub fn new(retain: usize) -> Self {
        let (live, _) = broadcast::channel(4096);
        EventBus {
            ring: Mutex::new(Ring {
                next_seq: 1,
                events: VecDeque::new(),
            }),
            retain: retain.max(1),
            live,
        }
    }

    /// Records an event about `pid` and returns its sequence number.
    pub fn emit(&self, pid: Pid, kind: EventKind) -> u64 {
        let mut ring = self.ring.lock();
        self.push(&mut ring, pid, kind, unix_ms(SystemTime::now()))
    }

    /// Records events in order with consecutive sequence numbers and one
    /// timestamp, taking the lock once: an exit of 10,000 processes emits
    /// 20,000 events.
    pub fn emit_all(&self, events: Vec<(Pid, EventKind)>) {
        let at_unix_ms = unix_ms(SystemTime::now());
        let mut ring = self.ring.lock();
        let live = self.live.receiver_count() > 0;
        for (pid, kind) in events {
            let event = self.retained(&mut ring, pid, kind, at_unix_ms);
            if live {
                let _ = self.live.send(event);
            }
        }
    }

    fn push(&self, ring: &mut Ring, pid: Pid, kind: EventKind, at_unix_ms: u64) -> u64 {
        let event = self.retained(ring, pid, kind, at_unix_ms);
        let seq = event.seq;
        // Sent under the ring lock so live order matches sequence order.
        let _ = self.live.send(event);
        seq
    }

    /// Numbers the event and keeps it in the ring.
    fn retained(&self, ring: &mut Ring, pid: Pid, kind: EventKind, at_unix_ms: u64) -> Arc<Event> {
        let seq = ring.next_seq;
        ring.next_seq += 1;
        let event = Arc::new(Event {
            seq,
            at_unix_ms,
            pid,
            kind,
        });
        if ring.events.len() == self.retain {
            ring.events.pop_front();
        }
        ring.events.push_back(event.clone());
        event
    }

    /// Retained events after `since` (when given), then everything emitted later.
    pub fn subscribe(&self, since: Option<u64>) -> Subscription {
        let ring = self.ring.lock();
        let replay = match since {
            Some(since) => ring
                .events
                .iter()
                .filter(|e| e.seq > since)
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        Subscription {
            replay,
            live: self.live.subscribe(),
        }
    }

    /// Sequence number of the newest event (0 when none yet).
    pub fn last_seq(&self) -> u64 {
        self.ring.lock().next_seq - 1
    }
}

/// Milliseconds since the Unix epoch.
pub(crate) fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
