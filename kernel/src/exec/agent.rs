//! The kernel side of one external agent: its attach stream, the tasks it
//! has been handed and not yet answered, and the [`Runtime`] the runner
//! drives, which forwards mailbox items to the stream.
//!
//! The runner pops the mailbox as for any process, at most
//! `max_concurrent_tasks` items at a time; each waits here until an agent is
//! attached, so nothing is lost before the first Attach and the rest waits
//! in the bounded mailbox.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use hivekernel_agents::{
    Message, Pid, ProcessContext, RequestId, Runtime, RuntimeError, Task, TaskReply,
};
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::os::OsState;
use crate::events::unix_ms;

/// Items in flight between the kernel and one attach stream.
const STREAM_BUFFER: usize = 32;

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
}

/// One attach stream, as the control plane serves it.
pub struct Attached {
    /// What to send down the stream, starting with [`Delivery::Attached`];
    /// it ends when the process exits.
    pub deliveries: mpsc::Receiver<Delivery>,
    /// Cancelled when a newer Attach replaces this one: end the stream then,
    /// so deliveries still in it go to the new one.
    pub replaced: CancellationToken,
    /// Sends tasks that older streams took and nobody answered; run it
    /// while `deliveries` is read.
    pub resend: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl std::fmt::Debug for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attached")
            .field("deliveries", &self.deliveries)
            .field("replaced", &self.replaced)
            .finish_non_exhaustive()
    }
}

/// A task handed to the agent and not yet answered.
#[derive(Debug)]
struct Pending {
    delivery: Delivery,
    reply: oneshot::Sender<TaskReply>,
    /// The attachment it was sent on, if it was sent.
    sent_on: Option<u64>,
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
    pending: Mutex<HashMap<RequestId, Pending>>,
    /// Cancelled when the kernel process ends: the OS process must go.
    pub(crate) stop: CancellationToken,
    pub(crate) os: Mutex<OsState>,
}

impl ExecProc {
    pub(crate) fn new(pid: Pid, name: Arc<str>, timeout: Duration) -> Self {
        ExecProc {
            pid,
            name,
            timeout,
            attach: watch::Sender::new(None),
            next_attach: AtomicU64::new(1),
            pending: Mutex::default(),
            stop: CancellationToken::new(),
            os: Mutex::new(OsState::NotStarted),
        }
    }

    /// A new attach stream, replacing the one before it, if any. Tasks sent
    /// on earlier streams and still unanswered are sent again on this one.
    pub(crate) fn attach(&self) -> Attached {
        let id = self.next_attach.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        // A fresh channel has room: the notice is always the first item.
        let _ = tx.try_send(Delivery::Attached {
            pid: self.pid,
            name: self.name.clone(),
        });
        let replaced = CancellationToken::new();
        let old = self.attach.send_replace(Some(Attachment {
            id,
            tx: tx.clone(),
            replaced: replaced.clone(),
        }));
        if let Some(old) = old {
            old.replaced.cancel();
        }
        let resend: Vec<Delivery> = self
            .pending
            .lock()
            .values_mut()
            .filter(|p| p.sent_on.is_some_and(|on| on != id))
            .map(|p| {
                p.sent_on = Some(id);
                p.delivery.clone()
            })
            .collect();
        let resend = Box::pin(async move {
            for delivery in resend {
                if tx.send(delivery).await.is_err() {
                    return;
                }
            }
        });
        Attached {
            deliveries: rx,
            replaced,
            resend,
        }
    }

    /// Ends the attach stream for good: the process has exited.
    pub(crate) fn detach(&self) {
        self.attach.send_replace(None);
    }

    /// Answers a pending task; `false` when it is not pending.
    pub(crate) fn complete(&self, request_id: RequestId, reply: TaskReply) -> bool {
        match self.pending.lock().remove(&request_id) {
            Some(pending) => {
                // The requester may have gone; the task is answered either way.
                let _ = pending.reply.send(reply);
                true
            }
            None => false,
        }
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

    /// Sends a message once an agent is attached, again on a newer stream if
    /// the one it was given to is gone.
    async fn deliver_message(&self, message: Message) {
        let mut delivery = Delivery::Message(message);
        let mut failed = None;
        loop {
            let Some(attachment) = self.attached(failed).await else {
                return;
            };
            match attachment.tx.send(delivery).await {
                Ok(()) => return,
                Err(returned) => {
                    delivery = returned.0;
                    failed = Some(attachment.id);
                }
            }
        }
    }

    /// Sends a pending task once an agent is attached. A newer Attach resends
    /// what older streams took, so a send that fails is retried only when no
    /// Attach has resent it meanwhile.
    async fn deliver_task(&self, request_id: RequestId, delivery: Delivery) {
        let mut failed = None;
        loop {
            let Some(attachment) = self.attached(failed).await else {
                return;
            };
            match self.pending.lock().get_mut(&request_id) {
                Some(pending) => pending.sent_on = Some(attachment.id),
                None => return,
            }
            if attachment.tx.send(delivery.clone()).await.is_ok() {
                return;
            }
            let mut pending = self.pending.lock();
            match pending.get_mut(&request_id) {
                Some(p) if p.sent_on == Some(attachment.id) => p.sent_on = None,
                _ => return,
            }
            failed = Some(attachment.id);
        }
    }
}

/// Removes a task from the pending set when its handler ends unanswered
/// (timeout, a requester that gave up, kill).
struct Forget<'a>(&'a ExecProc, RequestId);

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
        proc.pending.lock().insert(
            request_id,
            Pending {
                delivery: delivery.clone(),
                reply: tx,
                sent_on: None,
            },
        );
        let _forget = Forget(proc, request_id);
        let deliver = proc.deliver_task(request_id, delivery);
        tokio::pin!(deliver);
        let mut rx = rx;
        // An answer ends the wait even while a send to a stalled stream is pending.
        let answer = tokio::select! {
            answer = &mut rx => answer,
            () = &mut deliver => rx.await,
        };
        answer.unwrap_or_else(|_| {
            Err(format!(
                "process {} ended before answering request {request_id}",
                proc.pid
            ))
        })
    }

    async fn on_message(
        &self,
        _ctx: &ProcessContext,
        message: Message,
    ) -> Result<(), RuntimeError> {
        self.0.deliver_message(message).await;
        Ok(())
    }
}
