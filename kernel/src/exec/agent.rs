//! The kernel side of one external agent: its attach stream, the tasks it
//! has been handed and not yet answered, and the [`Runtime`] the runner
//! drives, which forwards mailbox items to the stream.
//!
//! The runner pops the mailbox as for any process, at most
//! `max_concurrent_tasks` items at a time; each waits here until an agent is
//! attached, so nothing is lost before the first Attach and the rest waits
//! in the bounded mailbox. A task is out until answered, a message until
//! acknowledged (or, on an `auto_ack` stream, until it is on the stream):
//! a newer Attach is sent both again, and a message kept in the store
//! leaves it only once acknowledged.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use hivekernel_agents::approval::{ApprovalRule, MAX_CARRIED_RULES, join};
use hivekernel_agents::{
    Message, MessageId, Pid, ProcessContext, RequestId, Runtime, RuntimeError, Task, TaskReply,
};
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::os::{LaunchSpec, Os};
use crate::events::unix_ms;

/// Items in flight between the kernel and one attach stream.
const STREAM_BUFFER: usize = 32;

/// A task or message out to this many OS processes of one exec process
/// that each ended without answering it is given up: sent again once after
/// a crash, never into a crash loop of its own making.
const MAX_LOST: u8 = 2;

/// One item on an attach stream.
#[derive(Debug, Clone)]
pub enum Delivery {
    /// First item of every stream.
    Attached {
        /// The process.
        pid: Pid,
        /// Its name.
        name: Arc<str>,
    },
    /// A task to answer by request id.
    Task {
        /// The task.
        task: Task,
        /// When the process's own timeout ends it.
        deadline_unix_ms: u64,
    },
    /// A message from the mailbox.
    Message(Message),
}

/// A live attach stream.
#[derive(Debug, Clone)]
struct Attachment {
    id: u64,
    tx: mpsc::Sender<Delivery>,
    /// Cancelled when a newer Attach takes over.
    replaced: CancellationToken,
    /// A message is done with once on this stream (no acknowledgement).
    auto_ack: bool,
}

/// One attach stream, as the control plane serves it.
#[derive(Debug)]
pub struct Attached {
    /// What to send down the stream, starting with [`Delivery::Attached`];
    /// it ends when the process exits.
    pub deliveries: mpsc::Receiver<Delivery>,
    /// Cancelled when a newer Attach replaces this one: end the stream then,
    /// so deliveries still in it go to the new one.
    pub replaced: CancellationToken,
}

/// What a delivery waits for from the agent.
#[derive(Debug)]
enum Answer {
    /// A task's reply.
    Task(oneshot::Sender<TaskReply>),
    /// A message's acknowledgement.
    Ack(oneshot::Sender<()>),
}

/// A task or message handed to the agent and not yet answered or
/// acknowledged, by request or message id (one counter numbers both).
#[derive(Debug)]
struct Pending {
    delivery: Delivery,
    answer: Answer,
    /// The attachment it was sent on, if it was sent.
    sent_on: Option<u64>,
    /// OS processes that ended while it was out to them.
    lost: u8,
}

/// What the kernel keeps for one `exec` process.
#[derive(Debug)]
pub(crate) struct ExecProc {
    pub(crate) pid: Pid,
    pub(crate) name: Arc<str>,
    /// The process's own task timeout, for the deadline shown to the agent.
    timeout: Duration,
    attach: watch::Sender<Option<Attachment>>,
    next_attach: AtomicU64,
    pending: Mutex<HashMap<u64, Pending>>,
    /// Taken by each delivery for its first send, in the order the runner
    /// hands them over (the queue is fair), so that they reach the stream
    /// in mailbox order even when several wait for the same Attach.
    send_order: tokio::sync::Mutex<()>,
    /// How its OS process starts, at spawn and at every restart.
    pub(crate) spec: LaunchSpec,
    /// Its current OS process.
    pub(crate) os: Mutex<Os>,
    /// The approval rules of every task and message handed to it in this
    /// run: its requests carry them (kernel/asked.rs), since which of its
    /// requests serves which task cannot be told.
    asked_under: Mutex<Vec<ApprovalRule>>,
}

impl ExecProc {
    pub(crate) fn new(pid: Pid, name: Arc<str>, timeout: Duration, spec: LaunchSpec) -> Self {
        ExecProc {
            pid,
            name,
            timeout,
            attach: watch::Sender::new(None),
            next_attach: AtomicU64::new(1),
            pending: Mutex::default(),
            send_order: tokio::sync::Mutex::new(()),
            spec,
            os: Mutex::new(Os::new()),
            asked_under: Mutex::default(),
        }
    }

    /// A new attach stream, replacing the one before it, if any. Tasks sent
    /// on earlier streams (or to an earlier OS process) and still
    /// unanswered, and messages not yet acknowledged, are sent again on this
    /// one, in the order they were first sent and ahead of anything new.
    /// With `auto_ack`, a message is done with once it is on the stream.
    pub(crate) fn attach(&self, auto_ack: bool) -> Attached {
        let id = self.next_attach.fetch_add(1, Ordering::Relaxed);
        let mut resend: Vec<(u64, Delivery)> = self
            .pending
            .lock()
            .iter_mut()
            .filter(|(_, p)| p.sent_on.is_some_and(|on| on != id))
            .map(|(key, p)| {
                p.sent_on = Some(id);
                (*key, p.delivery.clone())
            })
            .collect();
        resend.sort_unstable_by_key(|(key, _)| *key);
        // Room for the notice and everything sent again, queued before the
        // stream is published, so no new delivery can come first.
        let (tx, rx) = mpsc::channel(STREAM_BUFFER + 1 + resend.len());
        let _ = tx.try_send(Delivery::Attached {
            pid: self.pid,
            name: self.name.clone(),
        });
        let mut done = Vec::new();
        for (key, delivery) in resend {
            if auto_ack && matches!(delivery, Delivery::Message(_)) {
                done.push(MessageId(key));
            }
            let _ = tx.try_send(delivery);
        }
        let replaced = CancellationToken::new();
        let old = self.attach.send_replace(Some(Attachment {
            id,
            tx,
            replaced: replaced.clone(),
            auto_ack,
        }));
        if let Some(old) = old {
            old.replaced.cancel();
        }
        for id in done {
            self.acknowledge(id);
        }
        Attached {
            deliveries: rx,
            replaced,
        }
    }

    /// Ends the attach stream of an OS process that has ended: what it was
    /// handed and did not answer stays, to be sent again to the next one
    /// that attaches (after a restart), unless [`MAX_LOST`] OS processes
    /// have now ended with it out: then a task fails and a message is done
    /// with (logged), so one that kills its agent cannot keep killing the
    /// next.
    /// Only what is out on the stream ended counts: an OS process that
    /// never attached was handed nothing, and a second call for the same
    /// OS process (its exit, then its restart) finds no stream.
    pub(crate) fn end_stream(&self) {
        let Some(ended) = self.attach.send_replace(None).map(|a| a.id) else {
            return;
        };
        let given_up: Vec<(u64, Answer)> = {
            let mut pending = self.pending.lock();
            let mut lost = Vec::new();
            for (key, item) in pending.iter_mut() {
                if item.sent_on == Some(ended) {
                    item.lost += 1;
                    if item.lost >= MAX_LOST {
                        lost.push(*key);
                    }
                }
            }
            lost.into_iter()
                .filter_map(|key| pending.remove(&key).map(|item| (key, item.answer)))
                .collect()
        };
        for (key, answer) in given_up {
            match answer {
                Answer::Task(tx) => {
                    let _ = tx.send(Err(format!(
                        "process {}: its agent ended {MAX_LOST} times while working on request \
                         {key}; not sent again",
                        self.pid
                    )));
                }
                Answer::Ack(tx) => {
                    tracing::warn!(
                        pid = %self.pid,
                        message_id = key,
                        "message given up: its agent ended {MAX_LOST} times while it was out"
                    );
                    let _ = tx.send(());
                }
            }
        }
    }

    /// The approval rules of the work it was handed in this run.
    pub(crate) fn asked_under(&self) -> Vec<ApprovalRule> {
        self.asked_under.lock().clone()
    }

    /// Ends the attach stream for good: the process has exited. What is
    /// still out is never answered: tasks fail, messages stay where they are
    /// kept.
    pub(crate) fn detach(&self) {
        self.attach.send_replace(None);
        self.pending.lock().clear();
    }

    /// Answers a pending task; `false` when it is not pending.
    pub(crate) fn complete(&self, request_id: RequestId, reply: TaskReply) -> bool {
        match self.take(request_id.0, true) {
            Some(Answer::Task(tx)) => {
                // The requester may have gone; the task is answered either way.
                let _ = tx.send(reply);
                true
            }
            _ => false,
        }
    }

    /// Acknowledges a message handed to the agent; `false` when it is not
    /// waiting for one (acknowledged already, or not this agent's).
    pub(crate) fn acknowledge(&self, id: MessageId) -> bool {
        match self.take(id.0, false) {
            Some(Answer::Ack(tx)) => {
                let _ = tx.send(());
                true
            }
            _ => false,
        }
    }

    /// Takes what pending delivery `key` waits for, if it is a task's reply
    /// (`task`) or a message's acknowledgement (not `task`): an agent cannot
    /// answer a message as a task, nor acknowledge a task.
    fn take(&self, key: u64, task: bool) -> Option<Answer> {
        let mut pending = self.pending.lock();
        let wanted = pending
            .get(&key)
            .is_some_and(|p| matches!(p.answer, Answer::Task(_)) == task);
        wanted
            .then(|| pending.remove(&key))
            .flatten()
            .map(|p| p.answer)
    }

    /// Waits for an attachment other than `failed` and returns it.
    async fn attached(&self, failed: Option<u64>) -> Option<Attachment> {
        let mut rx = self.attach.subscribe();
        let found = rx
            .wait_for(|a| a.as_ref().is_some_and(|a| Some(a.id) != failed))
            .await
            .ok()?;
        found.clone()
    }

    /// Sends a pending task or message once an agent is attached. A newer
    /// Attach resends what older streams took, so a send that fails is
    /// retried only when no Attach has resent it meanwhile. A message sent
    /// on an `auto_ack` stream is done with at once.
    async fn deliver(&self, key: u64, delivery: Delivery) {
        let message = matches!(delivery, Delivery::Message(_));
        let _turn = self.send_order.lock().await;
        let mut failed = None;
        loop {
            let Some(attachment) = self.attached(failed).await else {
                return;
            };
            match self.pending.lock().get_mut(&key) {
                Some(pending) => pending.sent_on = Some(attachment.id),
                None => return,
            }
            if attachment.tx.send(delivery.clone()).await.is_ok() {
                if message && attachment.auto_ack {
                    self.acknowledge(MessageId(key));
                }
                return;
            }
            let mut pending = self.pending.lock();
            match pending.get_mut(&key) {
                Some(p) if p.sent_on == Some(attachment.id) => p.sent_on = None,
                _ => return,
            }
            failed = Some(attachment.id);
        }
    }

    /// Hands `delivery` to the agent under `key` and waits for `answer` (or
    /// for the process to end, when the receiver errs).
    async fn hand_over<T>(
        &self,
        key: u64,
        delivery: Delivery,
        answer: Answer,
        rx: oneshot::Receiver<T>,
    ) -> Result<T, oneshot::error::RecvError> {
        let approvals = crate::trace::approvals();
        if !approvals.is_empty() {
            let mut held = self.asked_under.lock();
            // One past the most a request may carry is enough for its
            // requests to be refused as carrying too many.
            if held.len() <= MAX_CARRIED_RULES {
                join(&mut held, &approvals);
            }
        }
        self.pending.lock().insert(
            key,
            Pending {
                delivery: delivery.clone(),
                answer,
                sent_on: None,
                lost: 0,
            },
        );
        let _forget = Forget(self, key);
        let deliver = self.deliver(key, delivery);
        tokio::pin!(deliver);
        let mut rx = rx;
        // An answer ends the wait even while a send to a stalled stream is pending.
        tokio::select! {
            answer = &mut rx => answer,
            () = &mut deliver => rx.await,
        }
    }
}

/// Removes a task or message from the pending set when its handler ends
/// first (timeout, a requester that gave up, kill).
struct Forget<'a>(&'a ExecProc, u64);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.0.pending.lock().remove(&self.1);
    }
}

/// The runtime of an `exec` process: forwards its mailbox to the attached agent.
#[derive(Debug)]
pub(crate) struct ExecAgent(pub(crate) Arc<ExecProc>);

#[async_trait]
impl Runtime for ExecAgent {
    async fn execute(&self, _ctx: &ProcessContext, task: Task) -> TaskReply {
        let proc = &self.0;
        let request_id = task.request_id;
        let deadline_unix_ms = unix_ms(SystemTime::now() + proc.timeout);
        let delivery = Delivery::Task {
            task,
            deadline_unix_ms,
        };
        let (tx, rx) = oneshot::channel();
        let answer = proc
            .hand_over(request_id.0, delivery, Answer::Task(tx), rx)
            .await;
        answer.unwrap_or_else(|_| {
            Err(format!(
                "process {} ended before answering request {request_id}",
                proc.pid
            ))
        })
    }

    async fn on_message(&self, ctx: &ProcessContext, message: Message) -> Result<(), RuntimeError> {
        self.on_acknowledged_message(ctx, message).await.map(drop)
    }

    fn acknowledges_messages(&self) -> bool {
        true
    }

    async fn on_acknowledged_message(
        &self,
        _ctx: &ProcessContext,
        message: Message,
    ) -> Result<bool, RuntimeError> {
        let (tx, rx) = oneshot::channel();
        let key = message.id.0;
        let acked = self
            .0
            .hand_over(key, Delivery::Message(message), Answer::Ack(tx), rx)
            .await;
        Ok(acked.is_ok())
    }
}
