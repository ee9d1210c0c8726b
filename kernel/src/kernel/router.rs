//! Routing operations: messages, `execute_task`, `delegate_async` and their replies,
//! by the rules in the `router` module.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hivekernel_agents::Capability;
use hivekernel_agents::approval::Carried;
use hivekernel_agents::message::kinds;
use hivekernel_agents::{
    Message, MessageId, Outgoing, Pid, Priority, RequestId, Task, TaskReply, TaskSpec,
};

use tokio::sync::oneshot;

use super::inner::Inner;
use super::lanes::Posting;
use super::{Caller, Kernel};
use crate::cluster::{ClusterError, Letter};
use crate::error::{KernelError, Result};
use crate::events::{EventKind, unix_ms};
use crate::mailbox::{Envelope, Item, PushError, ReplyTo};
use crate::process::ProcShared;

use crate::router::{KERNEL_MESSAGE_PREVIEW, Route, RouteError, check_duration, route};
use crate::store::Write;

/// A store write the caller waits for.
type Recorded = std::pin::Pin<
    Box<dyn std::future::Future<Output = std::result::Result<(), crate::store::StoreError>> + Send>,
>;

/// Where a routed item goes once the route is known.
struct Target {
    proc: Option<Arc<ProcShared>>,
    route: Route,
    timeout: Duration,
}

impl Kernel {
    /// Fire-and-forget: puts a message in `message.to`'s mailbox.
    /// The message carries the approval rules the caller works under
    /// (kernel/asked.rs).
    pub async fn send_message(&self, caller: Caller, mut message: Outgoing) -> Result<MessageId> {
        let result = async {
            self.require(caller, Capability::SendMessage, "send messages")?;
            message.approvals = self.asked_under(caller.pid())?;
            if let Some(remote) = self.node().elsewhere(caller, message.to).await? {
                return self
                    .node()
                    .send_elsewhere(caller.pid(), remote, message)
                    .await;
            }
            self.send_here(caller.pid(), message, None).await
        };
        self.report_denial(caller, "send_message", result.await)
    }

    /// [`Kernel::send_message`] from `from`, once it holds the capability,
    /// to a process of this node (never forwarded); `judged` is the route
    /// when the sender's node judged it.
    pub(super) async fn send_here(
        &self,
        from: Pid,
        message: Outgoing,
        judged: Option<Route>,
    ) -> Result<MessageId> {
        self.check_running()?;
        self.inner.settings().limits.check_message(&message)?;
        if let Some(ttl) = message.ttl {
            check_duration("ttl", ttl)?;
        }
        if message.kind.trim().is_empty() {
            return Err(KernelError::InvalidArgument(
                "message type must not be empty".into(),
            ));
        }
        let to = message.to;
        let target = self.resolve(from, to, judged)?;
        let id = MessageId(self.next_id());
        let body = Message {
            id,
            from,
            to,
            kind: message.kind,
            payload: message.payload,
            priority: message.priority,
            request_id: None,
            via: target.route.via,
            trace: Some(crate::trace::for_new_item()),
            approvals: message.approvals,
        };
        let Some(proc) = target.proc else {
            self.to_kernel(body);
            return Ok(id);
        };
        let copy = target.route.copy_to.map(|parent| {
            (
                parent,
                body.payload.clone(),
                body.trace,
                body.approvals.clone(),
            )
        });
        // Committed before it enters the mailbox: the runner cannot take it,
        // nor remove it from the store, before it is there; and a send
        // answered with an error was never delivered.
        let durable = self.keep_message(&proc, &body, message.ttl).await?;
        let env = Envelope::new(id, Item::Message(body), message.ttl).durable(durable);
        if let Err(err) = self.push(&proc, env) {
            self.message_done(id, durable);
            return Err(err);
        }
        if let Some((parent, payload, trace, approvals)) = copy {
            self.copy_to_parent(parent, from, payload, None, (trace, approvals));
        }
        Ok(id)
    }

    /// Keeps acknowledged message `body` until it is delivered: in the
    /// cluster's mail stream for a process that may move to another node,
    /// else in the store when it is durable. False when nothing keeps it.
    async fn keep_message(
        &self,
        proc: &ProcShared,
        body: &Message,
        ttl: Option<Duration>,
    ) -> Result<bool> {
        let now = unix_ms(SystemTime::now());
        let expires_ms = ttl.map(|ttl| now.saturating_add(ttl.as_millis() as u64));
        if proc.mail_in_cluster
            && let Some(cluster) = self.inner.cluster()
        {
            let letter = Letter {
                message: body.clone(),
                created_ms: now,
                expires_ms,
            };
            cluster
                .keep_mail(body.to, body.id, None, &letter)
                .await
                .map_err(|err| match err {
                    ClusterError::TooLarge(why) => KernelError::LimitExceeded(why),
                    err => KernelError::ClusterUnavailable(err.to_string()),
                })?;
            return Ok(true);
        }
        let store = self.inner.store();
        if !store.is_durable() {
            return Ok(false);
        }
        store
            .commit(Write::Message {
                id: body.id,
                to: body.to,
                body: serde_json::to_string(body).unwrap_or_default(),
                created_ms: now,
                expires_ms,
            })
            .await?;
        Ok(true)
    }

    /// Removes a durable message from where it is kept: it was delivered,
    /// expired or dropped. Messages left in mailboxes by a clean stop stay,
    /// to be delivered after the restart (on the node that starts their
    /// process then, for those in the cluster's mail stream).
    pub(crate) fn message_done(&self, id: MessageId, durable: bool) {
        if durable {
            forget_delivered(&self.inner, id);
        }
    }

    /// Request/reply: runs a task on `task.to` and waits for its reply.
    /// The task carries the approval rules the caller works under
    /// (kernel/asked.rs).
    pub async fn execute_task(
        &self,
        caller: Caller,
        mut task: TaskSpec,
    ) -> Result<(RequestId, TaskReply)> {
        task.approvals = self.asked_under(caller.pid())?;
        let to = task.to;
        if let Caller::Process(me) = caller
            && me == to
        {
            return Err(KernelError::InvalidArgument(format!(
                "process {me} cannot run a task on itself and wait for the answer"
            )));
        }
        let remote = self.node().elsewhere(caller, to).await?;
        let _blocked = self.blocked_guard(caller);
        match remote {
            Some(remote) => self.node().forward_task(caller.pid(), remote, task).await,
            None => self.execute_here(caller.pid(), task, None).await,
        }
    }

    /// [`Kernel::execute_task`] from `from` on a process of this node
    /// (never forwarded); `judged` is the route when the requester's node
    /// judged it.
    pub(super) async fn execute_here(
        &self,
        from: Pid,
        task: TaskSpec,
        judged: Option<Route>,
    ) -> Result<(RequestId, TaskReply)> {
        let to = task.to;
        let (tx, rx) = oneshot::channel();
        let (request_id, timeout, _) = self.submit(from, task, ReplyTo::Waiter(tx), judged)?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(reply)) => Ok((request_id, reply)),
            Ok(Err(_)) => Err(KernelError::FailedPrecondition(format!(
                "process {to} exited before answering request {request_id}"
            ))),
            Err(_) => Err(KernelError::DeadlineExceeded(format!(
                "no reply from process {to} to request {request_id} within {} ms",
                timeout.as_millis()
            ))),
        }
    }

    /// Sends a task and returns at once; the reply lands in the caller's
    /// mailbox as a `task_response` naming the returned request id.
    pub async fn delegate_async(&self, caller: Caller, mut task: TaskSpec) -> Result<RequestId> {
        let requester = caller.pid();
        task.approvals = self.asked_under(requester)?;
        if let Some(remote) = self.node().elsewhere(caller, task.to).await? {
            return self
                .node()
                .delegate_elsewhere(requester, remote, task)
                .await;
        }
        let (request_id, _, recorded) =
            self.submit(requester, task, ReplyTo::Mailbox(requester), None)?;
        // Acknowledged once recorded: after a crash the requester is told the
        // request failed instead of waiting forever.
        if let Some(recorded) = recorded {
            recorded.await?;
        }
        Ok(request_id)
    }

    /// Routes a task request into the target's mailbox.
    /// For a `delegate_async` with a store, the request is queued for the
    /// store before the task enters the mailbox (so its answer's removal can
    /// never reach the store first); the returned future resolves on commit.
    pub(super) fn submit(
        &self,
        from: Pid,
        spec: TaskSpec,
        reply: ReplyTo,
        judged: Option<Route>,
    ) -> Result<(RequestId, Duration, Option<Recorded>)> {
        self.check_running()?;
        self.inner.settings().limits.check_task(&spec)?;
        let target = self.resolve(from, spec.to, judged)?;
        let Some(proc) = target.proc else {
            return Err(KernelError::InvalidArgument(
                "PID 1 is the kernel and does not run tasks".into(),
            ));
        };
        if let Some(timeout) = spec.timeout {
            check_duration("timeout", timeout)?;
        }
        let timeout = spec.timeout.unwrap_or(target.timeout);
        let spec_to = spec.to;
        let request_id = RequestId(self.next_id());
        let copy = target
            .route
            .copy_to
            .map(|parent| (parent, spec.description.clone(), spec.approvals.clone()));
        let trace = crate::trace::for_new_item();
        let task = Task {
            request_id,
            from,
            description: spec.description,
            params: spec.params,
            trace: Some(trace),
            approvals: spec.approvals,
        };
        let store = &self.inner.store();
        let recorded = match &reply {
            ReplyTo::Mailbox(requester) if store.is_durable() => {
                let commit = store.commit(Write::Request {
                    id: request_id,
                    from: *requester,
                    to: spec_to,
                    created_ms: unix_ms(SystemTime::now()),
                });
                Some(Box::pin(commit) as Recorded)
            }
            _ => None,
        };
        let item = Item::Task {
            task,
            priority: Priority::Normal,
            reply,
        };
        if let Err(err) = self.push(&proc, Envelope::new(MessageId(request_id.0), item, None)) {
            if recorded.is_some() {
                store.submit(Write::RequestDone(request_id));
            }
            return Err(err);
        }
        if let Some((parent, description, approvals)) = copy {
            let carried = (Some(trace), approvals);
            self.copy_to_parent(parent, from, description, Some(request_id), carried);
        }
        Ok((request_id, timeout, recorded))
    }

    /// A low-priority copy of sibling traffic for the siblings' parent,
    /// in the original's trace and under its approval rules.
    pub(super) fn copy_to_parent(
        &self,
        parent: Pid,
        from: Pid,
        payload: String,
        request_id: Option<RequestId>,
        (trace, approvals): (Option<hivekernel_agents::TraceContext>, Carried),
    ) {
        let copy = Message {
            id: MessageId(self.next_id()),
            from,
            to: parent,
            kind: kinds::SIBLING_COPY.to_owned(),
            payload,
            priority: Priority::Low,
            request_id,
            via: None,
            trace,
            approvals,
        };
        self.deliver_system(copy);
    }

    /// Checks the route (unless the sender's node `judged` it) and finds
    /// the receiver (`proc` is `None` for PID 1).
    fn resolve(&self, from: Pid, to: Pid, judged: Option<Route>) -> Result<Target> {
        let table = self.inner.table().read();
        let judged = match judged {
            Some(route) => Ok(route),
            None => route(&*table, from, to),
        };
        let route = match judged {
            Ok(route) => route,
            Err(err) => {
                drop(table);
                return Err(self.deny(from, to, err));
            }
        };
        let entry = table.get(to).ok_or(KernelError::NotFound(to))?;
        if !entry.is_alive() {
            return Err(KernelError::FailedPrecondition(format!(
                "process {to} has exited"
            )));
        }
        let timeout = Duration::from_secs(entry.proc.limits.timeout_seconds.max(1));
        let proc = (to != Pid::KERNEL).then(|| entry.proc.clone());
        Ok(Target {
            proc,
            route,
            timeout,
        })
    }

    pub(super) fn deny(&self, from: Pid, to: Pid, err: RouteError) -> KernelError {
        match err {
            RouteError::NoReceiver(pid) => KernelError::NotFound(pid),
            RouteError::SenderNotAlive(pid) => {
                KernelError::FailedPrecondition(format!("sender {pid} is not alive"))
            }
            RouteError::Denied(reason) => {
                self.inner.events().emit(
                    from,
                    EventKind::RouteDenied {
                        to,
                        reason: reason.clone(),
                    },
                );
                KernelError::PermissionDenied(reason)
            }
        }
    }

    /// Pushes into a mailbox, reporting expired messages it purged.
    fn push(&self, proc: &Arc<ProcShared>, env: Envelope) -> Result<()> {
        let pid = proc.ctx.pid;
        let on_expired = |expired| self.report_expired(pid, expired);
        let kind = env.item_type();
        let pushed = proc
            .mailbox
            .push(env, on_expired, || self.start_runner(proc));
        if let Some(metrics) = self.inner.metrics() {
            match &pushed {
                Ok(()) => metrics.routed(kind),
                Err(PushError::Full) => metrics.mailbox_refused("full"),
                Err(PushError::FullBytes) => metrics.mailbox_refused("full_bytes"),
                Err(PushError::Closed) => metrics.mailbox_refused("closed"),
            }
        }
        match pushed {
            Ok(()) => Ok(()),
            Err(PushError::Full) => Err(KernelError::MailboxFull {
                pid,
                limit: format!("{} messages", proc.mailbox.capacity()),
            }),
            Err(PushError::FullBytes) => Err(KernelError::MailboxFull {
                pid,
                limit: format!(
                    "{} bytes, kernel.mailbox_max_bytes",
                    proc.mailbox.max_bytes()
                ),
            }),
            Err(PushError::Closed) => Err(KernelError::FailedPrecondition(format!(
                "process {pid} has exited"
            ))),
        }
    }

    /// Delivers a message the kernel produced (copies, exit notices)
    /// to its receiver, `message.to`, without routing checks; a failure
    /// is reported as an event, never lost silently. On a node of a
    /// cluster it goes through the receiver's lane (lanes.rs).
    pub(crate) fn deliver_system(&self, message: Message) {
        self.node().hand_on(Posting::new(message, None));
    }

    /// [`Kernel::deliver_system`] to a process of this node, for a message
    /// that may already be in the store.
    pub(super) fn deliver(&self, to: Pid, message: Message, durable: bool) {
        if to == Pid::KERNEL {
            self.to_kernel(message);
            return;
        }
        let proc = self.inner.table().read().get(to).map(|e| e.proc.clone());
        let (id, from, kind) = (message.id, message.from, message.kind.clone());
        let result = match proc {
            Some(proc) => {
                let env = Envelope::new(id, Item::Message(message), None).durable(durable);
                self.push(&proc, env)
            }
            None => Err(KernelError::NotFound(to)),
        };
        if let Err(err) = result {
            self.message_done(id, durable && !self.is_stopping());
            self.report_dropped(to, id, from, kind, &err);
        }
    }

    /// Reports a message the kernel made that its receiver did not get.
    pub(super) fn report_dropped(
        &self,
        to: Pid,
        id: MessageId,
        from: Pid,
        kind: String,
        err: &KernelError,
    ) {
        tracing::warn!(%to, %kind, error = %err, "kernel message not delivered");
        self.inner.events().emit(
            to,
            EventKind::MessageDropped {
                message_id: id,
                from,
                kind,
                reason: err.to_string(),
            },
        );
    }

    /// Sends a task's reply where it was asked to go.
    pub(crate) fn deliver_reply(
        &self,
        worker: Pid,
        request_id: RequestId,
        reply_to: ReplyTo,
        reply: TaskReply,
    ) {
        match reply_to {
            ReplyTo::Waiter(tx) => {
                // The requester may have timed out; that is its business.
                let _ = tx.send(reply);
            }
            ReplyTo::Mailbox(requester) => {
                let message = task_response(worker, requester, request_id, &reply);
                self.node().hand_on(Posting::new(message, Some(request_id)));
            }
            ReplyTo::Node(requester) => {
                let message = task_response(worker, requester.pid, requester.request_id, &reply);
                self.node().hand_on(Posting {
                    node: Some(requester.node),
                    ..Posting::new(message, Some(requester.request_id))
                });
            }
        }
    }

    /// Puts a `task_response` into its requester's mailbox. With a store,
    /// the answer replaces the request in one ordered step: a crash leaves
    /// one or the other, never neither. A stop keeps the request, so the
    /// restart reports it failed.
    pub(super) fn answer_requester(&self, mut message: Message, request_id: RequestId) {
        message.id = MessageId(self.next_id());
        let requester = message.to;
        let store = &self.inner.store();
        let durable = match store.is_durable() && !self.is_stopping() {
            true if requester != Pid::KERNEL => {
                store.submit_all([
                    Write::Message {
                        id: message.id,
                        to: requester,
                        body: serde_json::to_string(&message).unwrap_or_default(),
                        created_ms: unix_ms(SystemTime::now()),
                        expires_ms: None,
                    },
                    Write::RequestDone(request_id),
                ]);
                true
            }
            true => {
                store.submit(Write::RequestDone(request_id));
                false
            }
            false => false,
        };
        self.deliver(requester, message, durable);
    }

    /// A message for PID 1, which keeps no mailbox: it becomes an event,
    /// its payload cut to [`KERNEL_MESSAGE_PREVIEW`] bytes so events stay small.
    fn to_kernel(&self, mut message: Message) {
        message.payload = hivekernel_agents::text::cut(message.payload, KERNEL_MESSAGE_PREVIEW);
        self.inner.events().emit(
            Pid::KERNEL,
            EventKind::KernelMessage {
                message_id: message.id,
                from: message.from,
                kind: message.kind,
                payload: message.payload,
            },
        );
    }

    /// Reports a message that expired in `pid`'s mailbox; a task gets a failed reply.
    pub(crate) fn report_expired(&self, pid: Pid, env: Envelope) {
        self.message_done(env.id, env.durable);
        self.inner.events().emit(
            pid,
            EventKind::MessageExpired {
                message_id: env.id,
                from: env.from(),
                kind: env.kind().to_owned(),
            },
        );
        if let Item::Task { task, reply, .. } = env.item {
            self.deliver_reply(
                pid,
                task.request_id,
                reply,
                Err("task expired before delivery".into()),
            );
        }
    }
}

/// The `task_response` message answering `request_id` (its id is set
/// where it is delivered).
fn task_response(worker: Pid, requester: Pid, request_id: RequestId, reply: &TaskReply) -> Message {
    let payload = match reply {
        Ok(output) => {
            serde_json::json!({"request_id": request_id, "success": true, "output": output})
        }
        Err(error) => {
            serde_json::json!({"request_id": request_id, "success": false, "error": error})
        }
    };
    Message {
        id: MessageId(0),
        from: worker,
        to: requester,
        kind: kinds::TASK_RESPONSE.to_owned(),
        payload: payload.to_string(),
        priority: Priority::High,
        request_id: Some(request_id),
        via: None,
        // The answer continues the task's trace.
        trace: crate::trace::current(),
        // An answer asks for nothing.
        approvals: Carried::NONE,
    }
}

/// Forgets durable message `id`, which its agent did not acknowledge,
/// where it is kept in the cluster's mail stream: it waits there for the
/// agent's next start (in the store, a kernel restart delivers it again).
pub(super) fn unacknowledged(inner: &Inner, id: MessageId) {
    if let Some(cluster) = inner.cluster() {
        cluster.forget_mail(id);
    }
}

/// Removes durable message `id` from where it is kept, in the background.
pub(super) fn forget_delivered(inner: &Inner, id: MessageId) {
    if !inner.cluster().is_some_and(|cluster| cluster.drop_mail(id)) {
        inner.store().submit(Write::MessageDone(id));
    }
}

/// What a turn's pending hand-over holds once another node handed its
/// message over (no message id is this large).
pub(super) const HANDED_ELSEWHERE: u64 = u64::MAX;

impl Kernel {
    /// Hands over the message the turn running now works on, at its first
    /// model or MCP call, if it waits for that (a message kept in the
    /// cluster's mail stream; runner.rs): refused when this node may not
    /// act for `pid` any more, or another node handed the message over.
    pub(crate) async fn hand_over_turn(&self, pid: Pid) -> Result<()> {
        let Some(pending) = crate::trace::handover() else {
            return Ok(());
        };
        let id = pending.swap(0, std::sync::atomic::Ordering::AcqRel);
        if id == 0 {
            return Ok(());
        }
        if id != HANDED_ELSEWHERE && take_for_handover(&self.inner, pid, MessageId(id)).await {
            return Ok(());
        }
        // Every later call of the turn is refused too.
        pending.store(HANDED_ELSEWHERE, std::sync::atomic::Ordering::Release);
        Err(KernelError::FailedPrecondition(format!(
            "the message this turn answers ({id}) was handed over by another node, which runs \
             process {pid} now"
        )))
    }
}

/// Takes durable message `id` of `pid`'s mailbox out of where it is kept,
/// before it is handed over, so that a crash never hands it over twice.
/// False when another node took it first (a node that held a copy too: a
/// paused one, or the one that took its process over), so this copy is
/// not handed over.
pub(super) async fn take_for_handover(inner: &Inner, pid: Pid, id: MessageId) -> bool {
    if let Some(cluster) = inner.cluster()
        && let Some(taken) = cluster.take_mail(pid, id).await
    {
        return match taken {
            Ok(true) => true,
            Ok(false) => {
                tracing::info!(%pid, message_id = id.0, "message left to another node: it handed it over, or took this process over");
                false
            }
            // Handed over all the same, as when the store fails below.
            Err(err) => {
                tracing::error!(%pid, message_id = id.0, error = %err, "cluster: delivery not recorded");
                true
            }
        };
    }
    if let Err(err) = inner.store().commit(Write::MessageDone(id)).await {
        tracing::error!(%pid, message_id = id.0, error = %err, "store: delivery not recorded");
    }
    true
}
