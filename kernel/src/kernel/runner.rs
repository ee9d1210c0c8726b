//! The runner that drives one process: pops its mailbox, hands tasks and
//! messages to its runtime, sends replies, and turns a panic or a runtime
//! error into an exit of the process (the kernel keeps running).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::Poll;
use std::time::Duration;

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};

use hivekernel_agents::{Message, MessageId, Runtime, Task};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::router::{HANDED_ELSEWHERE, forget_delivered, take_for_handover, unacknowledged};
use super::supervisor::{EXIT_FAILED, EXIT_PANICKED};
use super::{Inner, Kernel};
use crate::events::EventKind;
use crate::mailbox::{Envelope, Item, ReplyTo, Resume};
use crate::otel::Span;
use crate::process::{CountGuard, ProcShared};
use crate::trace::{Origin, scope_message, scope_turn};

/// How handling one mailbox item ended, when it ends the process.
type Fatal = (i32, String);

/// Drives one process until its mailbox closes or its runtime fails. Started
/// by the first item pushed into its mailbox ([`Kernel::start_runner`]), so
/// a process that is never sent anything costs no task.
pub(crate) async fn run_process(kernel: Weak<Inner>, proc: Arc<ProcShared>) {
    let Some(runtime) = proc.runtime.clone() else {
        return;
    };
    let max = proc.limits.max_concurrent_tasks.max(1) as usize;
    let pid = proc.ctx.pid;
    // Created on first need: most processes idle, and an idle one should cost little.
    let mut inflight: Option<FuturesUnordered<Work>> = None;
    let busy = |inflight: &Option<FuturesUnordered<Work>>| inflight.as_ref().map_or(0, |f| f.len());
    let fatal: Option<Fatal> = loop {
        // No await in the branches: what they bind would otherwise stay in
        // this future's state, which every idle process's task carries.
        let step = tokio::select! {
            biased;
            Some(outcome) = next_done(&mut inflight), if busy(&inflight) > 0 => Step::Finished(outcome),
            env = proc.mailbox.recv(|expired| report_expired(&kernel, pid, expired)), if busy(&inflight) < max => {
                match env {
                    Some(env) => Step::Start(handle(kernel.clone(), proc.clone(), runtime.clone(), env)),
                    None => Step::Closed,
                }
            }
        };
        match step {
            Step::Finished(Ok(())) => {}
            Step::Finished(Err(fatal)) => break Some(fatal),
            Step::Closed => break None,
            // Most items finish without waiting (a message a runtime only
            // notes, an echo): poll once here and queue only what must wait.
            Step::Start(mut work) => match futures::poll!(work.as_mut()) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(fatal)) => break Some(fatal),
                Poll::Pending => inflight
                    .get_or_insert_with(FuturesUnordered::new)
                    .push(work),
            },
        }
    };
    match fatal {
        Some((code, reason)) => {
            drop(inflight);
            if let Some(inner) = kernel.upgrade() {
                // Boxed: inline, this rarely taken path would size every idle
                // process's task.
                Box::pin(Kernel { inner }.exit_self(&proc, code, reason)).await;
            }
        }
        // Closed by kill or shutdown: finish what is in flight (kill aborts instead).
        None => {
            if let Some(mut inflight) = inflight {
                while inflight.next().await.is_some() {}
            }
        }
    }
}

impl Kernel {
    /// The task that drives `proc`, for its mailbox to start on the first push.
    pub(crate) fn start_runner(&self, proc: &Arc<ProcShared>) -> Option<JoinHandle<()>> {
        proc.runtime.as_ref()?;
        Some(
            self.inner
                .tracker()
                .spawn(run_process(self.downgrade(), proc.clone())),
        )
    }
}

/// What the runner does next.
enum Step {
    /// An item in flight finished.
    Finished(Result<(), Fatal>),
    /// A new item, to start handling.
    Start(Work),
    /// The mailbox closed.
    Closed,
}

/// One mailbox item being handled.
type Work = Pin<Box<dyn Future<Output = Result<(), Fatal>> + Send>>;

/// The next finished item, or pending while there is none.
fn next_done(
    inflight: &mut Option<FuturesUnordered<Work>>,
) -> impl Future<Output = Option<Result<(), Fatal>>> + '_ {
    std::future::poll_fn(move |cx| match inflight {
        Some(work) if !work.is_empty() => work.poll_next_unpin(cx),
        _ => Poll::Pending,
    })
}

fn report_expired(kernel: &Weak<Inner>, pid: hivekernel_agents::Pid, env: Envelope) {
    if let Some(inner) = kernel.upgrade() {
        Kernel { inner }.report_expired(pid, env);
    }
}

/// Starts handling one mailbox item, in its trace and as one turn of the
/// process's transcript; `Err` from the work ends the process.
/// Messages and tasks are separate futures, so a message (the common case)
/// is not moved to the heap at the size of a task's.
fn handle(
    kernel: Weak<Inner>,
    proc: Arc<ProcShared>,
    runtime: Arc<dyn Runtime>,
    env: Envelope,
) -> Work {
    let (id, durable) = (env.id, env.durable);
    match env.item {
        Item::Task {
            mut task, reply, ..
        } => {
            let opened = work_span(&kernel, &proc, task.trace, "task");
            let approvals = std::mem::take(&mut task.approvals);
            // A waiting turn keeps the request it answers, for a restart.
            let origin = match reply {
                ReplyTo::Mailbox(from) => Some(Origin {
                    request_id: task.request_id,
                    from,
                }),
                // A requester on another node is told of the answer as it
                // comes; a kernel restart does not carry the request over.
                ReplyTo::Waiter(_) | ReplyTo::Node(_) => None,
            };
            Box::pin(scope_turn(
                opened,
                origin,
                None,
                approvals,
                handle_task(kernel, proc, runtime, task, reply),
            ))
        }
        Item::Resume(resume) => {
            let (origin, request) = (resume.origin, resume.request);
            let opened = work_span(&kernel, &proc, resume.trace, "resume");
            let approvals = resume.approvals.clone();
            Box::pin(scope_turn(
                opened,
                origin,
                Some(request),
                approvals,
                handle_resume(kernel, proc, runtime, *resume),
            ))
        }
        Item::Message(mut message) => {
            let opened = work_span(&kernel, &proc, message.trace, "message");
            let handover = deferred(&kernel, runtime.as_ref(), id, durable);
            let approvals = std::mem::take(&mut message.approvals);
            Box::pin(scope_message(
                opened,
                handover.clone(),
                approvals,
                handle_message(kernel, proc, runtime, message, (id, durable), handover),
            ))
        }
    }
}

/// The span a handler runs in, under the trace the item carries, when
/// the kernel exports traces; otherwise none, and the item's trace as it
/// is. Off, this is one relaxed load per item.
fn work_span(
    kernel: &Weak<Inner>,
    proc: &ProcShared,
    trace: Option<hivekernel_agents::TraceContext>,
    item: &'static str,
) -> (Span, Option<hivekernel_agents::TraceContext>) {
    if crate::otel::exporting()
        && let Some(inner) = kernel.upgrade()
        && let Some(traces) = inner.traces()
    {
        let (span, context) = traces.invoke_agent(&proc.ctx, trace, item);
        return (span, Some(context));
    }
    (Span::default(), trace)
}

/// Works on one task and sends its reply.
async fn handle_task(
    kernel: Weak<Inner>,
    proc: Arc<ProcShared>,
    runtime: Arc<dyn Runtime>,
    task: Task,
    reply: ReplyTo,
) -> Result<(), Fatal> {
    let pid = proc.ctx.pid;
    let _running = CountGuard::enter(&proc.running);
    let started = Instant::now();
    let (request_id, from) = (task.request_id, task.from);
    let limit = Duration::from_secs(proc.limits.timeout_seconds.max(1));
    let standing = standing(&kernel, &proc);
    let work = AssertUnwindSafe(async {
        if let Some(standing) = standing {
            standing.await?;
        }
        runtime.execute(&proc.ctx, task).await
    })
    .catch_unwind();
    let (outcome, reply) = match reply {
        // Stop working as soon as a blocked requester gives up.
        ReplyTo::Waiter(mut tx) => {
            let outcome = tokio::select! {
                outcome = tokio::time::timeout(limit, work) => Some(outcome),
                _ = tx.closed() => None,
            };
            (outcome, ReplyTo::Waiter(tx))
        }
        other => {
            // Answered as failed if this handler is dropped first (its
            // process killed or its runtime failed mid-task).
            let unanswered = Unanswered {
                kernel: kernel.clone(),
                worker: pid,
                request_id,
                reply: Some(other),
            };
            let outcome = tokio::time::timeout(limit, work).await;
            (Some(outcome), unanswered.disarm())
        }
    };
    let Some(outcome) = outcome else {
        return Ok(());
    };
    let (answer, fatal) = settled(outcome, limit);
    if let Err(why) = &answer {
        crate::trace::fail("task_failed", why);
    }
    let Some(inner) = kernel.upgrade() else {
        return Ok(());
    };
    let kernel = Kernel { inner };
    let success = answer.is_ok();
    kernel.deliver_reply(pid, request_id, reply, answer);
    kernel.inner.events().emit(
        pid,
        EventKind::TaskFinished {
            request_id,
            from,
            success,
            duration_ms: started.elapsed().as_millis() as u64,
            error: None,
        },
    );
    fatal.map_or(Ok(()), Err)
}

/// A task's reply from how its work ended, and the exit a panic calls for.
fn settled(
    outcome: std::result::Result<
        std::thread::Result<hivekernel_agents::TaskReply>,
        tokio::time::error::Elapsed,
    >,
    limit: Duration,
) -> (hivekernel_agents::TaskReply, Option<Fatal>) {
    match outcome {
        Ok(Ok(answer)) => (answer, None),
        Ok(Err(panic)) => {
            let why = format!("runtime panicked: {}", panic_text(panic.as_ref()));
            (Err(why.clone()), Some((EXIT_PANICKED, why)))
        }
        Err(_) => (
            Err(format!("task timed out after {} s", limit.as_secs())),
            None,
        ),
    }
}

/// Carries on with a turn that waited for a person when the kernel
/// stopped, and answers the `delegate_async` request it works on, if any,
/// as its task would have.
async fn handle_resume(
    kernel: Weak<Inner>,
    proc: Arc<ProcShared>,
    runtime: Arc<dyn Runtime>,
    resume: Resume,
) -> Result<(), Fatal> {
    let pid = proc.ctx.pid;
    let _running = CountGuard::enter(&proc.running);
    let started = Instant::now();
    // Answered as failed if this turn is dropped first (its process killed).
    let unanswered = resume.origin.map(|origin| Unanswered {
        kernel: kernel.clone(),
        worker: pid,
        request_id: origin.request_id,
        reply: Some(ReplyTo::Mailbox(origin.from)),
    });
    // However the turn ends (killed too), a request it did not take up
    // has nobody to wait for it.
    let _unclaimed = Unclaimed {
        kernel: kernel.clone(),
        request: resume.request,
    };
    let limit = Duration::from_secs(proc.limits.timeout_seconds.max(1));
    let work = AssertUnwindSafe(runtime.resume(&proc.ctx, &resume.checkpoint)).catch_unwind();
    let (answer, fatal) = settled(tokio::time::timeout(limit, work).await, limit);
    if let Err(why) = &answer {
        crate::trace::fail("task_failed", why);
    }
    let Some(inner) = kernel.upgrade() else {
        return Ok(());
    };
    let kernel = Kernel { inner };
    match (resume.origin, unanswered) {
        (Some(origin), Some(unanswered)) => {
            let success = answer.is_ok();
            let error = answer.as_ref().err().map(|why| Arc::from(why.as_str()));
            kernel.deliver_reply(pid, origin.request_id, unanswered.disarm(), answer);
            kernel.inner.events().emit(
                pid,
                EventKind::TaskFinished {
                    request_id: origin.request_id,
                    from: origin.from,
                    success,
                    duration_ms: started.elapsed().as_millis() as u64,
                    error,
                },
            );
        }
        _ => match &answer {
            Ok(_) => tracing::info!(%pid, request = resume.request, "resumed turn finished"),
            Err(error) => {
                tracing::warn!(%pid, request = resume.request, %error, "resumed turn failed")
            }
        },
    }
    fatal.map_or(Ok(()), Err)
}

/// The hand-over of a message kept in the cluster's mail stream to a
/// runtime whose turns act only after a call through the kernel
/// ([`Runtime::hands_over_at_first_call`]), deferred to its turn's
/// first model or MCP call ([`Kernel::hand_over_turn`]), or its end: a
/// node that dies, or learns it was fenced, before its turn acts leaves
/// the message to the node that starts the process again. Its id, until
/// it is taken.
fn deferred(
    kernel: &Weak<Inner>,
    runtime: &dyn Runtime,
    id: MessageId,
    durable: bool,
) -> Option<Arc<AtomicU64>> {
    if !durable
        || id.0 == 0
        || !runtime.hands_over_at_first_call()
        || runtime.acknowledges_messages()
    {
        return None;
    }
    let inner = kernel.upgrade()?;
    let held = inner.cluster()?.holds_mail(id);
    held.then(|| Arc::new(AtomicU64::new(id.0)))
}

/// Hands one message to the runtime (once it has left the store, when
/// durable; as its turn first acts, when [`deferred`]).
async fn handle_message(
    kernel: Weak<Inner>,
    proc: Arc<ProcShared>,
    runtime: Arc<dyn Runtime>,
    message: Message,
    (id, durable): (MessageId, bool),
    handover: Option<Arc<AtomicU64>>,
) -> Result<(), Fatal> {
    let pid = proc.ctx.pid;
    let acknowledged = runtime.acknowledges_messages();
    if durable
        && acknowledged
        && let Some(caught_up) = deletes_lagging(&kernel, id)
    {
        caught_up.await;
    }
    if let Some(standing) = standing(&kernel, &proc)
        && standing.await.is_err()
    {
        // Its node is no member now: the message stays in the cluster's
        // stream for the node that runs the process.
        return Ok(());
    }
    let _running = CountGuard::enter(&proc.running);
    let deferred = handover.map(|pending| Deferred {
        kernel: kernel.clone(),
        pid,
        pending,
    });
    if durable
        && !acknowledged
        && deferred.is_none()
        && let Some(inner) = kernel.upgrade()
        && !take_for_handover(&inner, pid, id).await
    {
        // Delivered means handed over: gone from where it is kept first,
        // so a crash can never hand the same message over twice.
        return Ok(());
    }
    let handed = async {
        if acknowledged {
            runtime.on_acknowledged_message(&proc.ctx, message).await
        } else {
            // Recorded done above, before it was handed over.
            runtime.on_message(&proc.ctx, message).await.map(|()| false)
        }
    };
    let answer = AssertUnwindSafe(handed).catch_unwind().await;
    // A turn that never acted hands its message over as it ends, however
    // it ended, so a message that fails it is not delivered again.
    if let Some(deferred) = deferred {
        deferred.finish().await;
    }
    if durable
        && acknowledged
        && !matches!(answer, Ok(Ok(true)))
        && let Some(inner) = kernel.upgrade()
    {
        unacknowledged(&inner, id);
    }
    match answer {
        Ok(Ok(acknowledged_now)) => {
            // Acknowledged by the agent: done with. Until this commits, a
            // crash delivers it again (at least once).
            if durable
                && acknowledged_now
                && let Some(inner) = kernel.upgrade()
            {
                forget_delivered(&inner, id);
            }
            Ok(())
        }
        Ok(Err(err)) => Err((EXIT_FAILED, format!("runtime failed: {err}"))),
        Err(panic) => Err((
            EXIT_PANICKED,
            format!("runtime panicked: {}", panic_text(panic.as_ref())),
        )),
    }
}

/// For a process that may move, on a node that does not know afresh that
/// it is still a member of its cluster (it was paused, or cut off from
/// NATS): the wait for the next heartbeat's verdict, `Err` when the node is
/// no member (the process runs elsewhere now), before anything is handed
/// to the process (docs/CLUSTER.md, "Losing a node"). `None`, after one
/// clock read, in the common case.
fn standing(
    kernel: &Weak<Inner>,
    proc: &ProcShared,
) -> Option<futures::future::BoxFuture<'static, Result<(), String>>> {
    if !proc.mail_in_cluster {
        return None;
    }
    let cluster = kernel.upgrade()?.cluster()?.clone();
    if cluster.member_now() {
        return None;
    }
    let pid = proc.ctx.pid;
    Some(Box::pin(async move {
        if cluster.still_member().await {
            return Ok(());
        }
        Err(super::cluster::moved_away(pid, cluster.node()))
    }))
}

/// For a message kept in the cluster's mail stream, to an agent that
/// acknowledges its messages, on a node whose deletes of acknowledged
/// messages lag behind (the stream takes none: an outage): the wait until
/// they catch up, so that a node lost meanwhile leaves its messages in
/// the stream unhandled rather than handled and not taken out
/// ([`crate::cluster::Cluster::deletes_caught_up`]). `None`, after one
/// atomic load, in the common case.
fn deletes_lagging(
    kernel: &Weak<Inner>,
    id: MessageId,
) -> Option<futures::future::BoxFuture<'static, ()>> {
    let inner = kernel.upgrade()?;
    let cluster = inner.cluster()?;
    if !cluster.deletes_behind() || !cluster.holds_mail(id) {
        return None;
    }
    let cluster = cluster.clone();
    Some(Box::pin(async move { cluster.deletes_caught_up().await }))
}

/// A message whose hand-over waits for its turn to act: taken as the turn
/// ends if it has not acted; dropped from the stream (in the background)
/// if the turn is dropped first (its process killed), unless the kernel
/// stops (the node that takes the process over delivers it).
struct Deferred {
    kernel: Weak<Inner>,
    pid: hivekernel_agents::Pid,
    pending: Arc<AtomicU64>,
}

impl Deferred {
    async fn finish(self) {
        let id = self.pending.swap(0, Ordering::AcqRel);
        if id != 0
            && id != HANDED_ELSEWHERE
            && let Some(inner) = self.kernel.upgrade()
        {
            take_for_handover(&inner, self.pid, MessageId(id)).await;
        }
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        let id = self.pending.swap(0, Ordering::AcqRel);
        if id != 0
            && id != HANDED_ELSEWHERE
            && let Some(inner) = self.kernel.upgrade()
            && !inner.stopping().load(Ordering::SeqCst)
            && let Some(cluster) = inner.cluster()
        {
            cluster.drop_mail(MessageId(id));
        }
    }
}

/// Withdraws a resumed turn's request when the turn ends without having
/// taken it up (a no-op once it is resolved); a stopping kernel keeps it.
struct Unclaimed {
    kernel: Weak<Inner>,
    request: u64,
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        if let Some(inner) = self.kernel.upgrade() {
            let kernel = Kernel { inner };
            if !kernel.is_stopping() {
                kernel.inbox().withdraw(self.request, "kernel");
            }
        }
    }
}

/// A `delegate_async` reply port held while its task runs: dropped before
/// [`Unanswered::disarm`], it tells the requester the task failed, so a
/// killed worker never leaves its requester waiting.
struct Unanswered {
    kernel: Weak<Inner>,
    worker: hivekernel_agents::Pid,
    request_id: hivekernel_agents::RequestId,
    reply: Option<ReplyTo>,
}

impl Unanswered {
    /// The reply port, for the normal answer.
    fn disarm(mut self) -> ReplyTo {
        self.reply
            .take()
            .unwrap_or(ReplyTo::Mailbox(hivekernel_agents::Pid::KERNEL))
    }
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        let Some(reply) = self.reply.take() else {
            return;
        };
        let Some(inner) = self.kernel.upgrade() else {
            return;
        };
        let kernel = Kernel { inner };
        // A stop keeps the request in the store: the restart reports it.
        if kernel.is_stopping() {
            return;
        }
        let why = format!("process {} exited before answering", self.worker);
        kernel.deliver_reply(self.worker, self.request_id, reply, Err(why));
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}
