//! The work running now: a task-local set around each handler (the trace
//! of the task or message it handles, and the turn its transcript entries
//! share), around a gRPC call (from the caller's `traceparent`, or a new
//! trace) and around each cron firing (a new trace). Tasks and messages
//! made while it is set continue its trace; events and transcript entries
//! recorded while it is set carry its trace id.
//!
//! A task or message carries the context of the work that made it (its
//! span is the new item's parent, as a `traceparent` names the caller's
//! span); the work that handles it runs in a span of its own under that
//! one when the kernel exports traces (otel.rs), and in the item's context
//! as it is when it does not (nothing reads span ids then).

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use hivekernel_agents::approval::Carried;
use hivekernel_agents::{Pid, RequestId, TraceContext, TraceId};

use crate::otel::Span;

/// What the task-local holds.
struct Work {
    trace: Option<TraceContext>,
    /// The exported span the work runs in (ended when the work ends); a
    /// no-op when the kernel exports no traces.
    span: RefCell<Span>,
    /// The turn's id once something was recorded in it; 0 before.
    turn: Cell<u64>,
    /// The `delegate_async` request the work answers, if it does.
    origin: Option<Origin>,
    /// A resumed turn's inbox request, until its first wait takes it up.
    resume: Cell<Option<u64>>,
    /// The message a turn hands over (takes out of the cluster's mail
    /// stream) at its first model or MCP call, or at its end: its id, 0
    /// once taken (see runner.rs).
    handover: Option<Arc<AtomicU64>>,
    /// The approval rules the work was asked under (see
    /// [`hivekernel_agents::Task::approvals`]).
    approvals: Carried,
}

impl Work {
    fn new(
        span: Span,
        trace: Option<TraceContext>,
        origin: Option<Origin>,
        resume: Option<u64>,
        handover: Option<Arc<AtomicU64>>,
        approvals: Carried,
    ) -> Work {
        Work {
            trace,
            span: RefCell::new(span),
            turn: Cell::new(0),
            origin,
            resume: Cell::new(resume),
            handover,
            approvals,
        }
    }
}

/// A `delegate_async` request being worked on: its id and its requester,
/// who is answered with a `task_response`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Origin {
    pub(crate) request_id: RequestId,
    pub(crate) from: Pid,
}

tokio::task_local! {
    static CURRENT: Work;
}

/// Runs `work` as one piece of work in `trace` (none: no trace).
pub(crate) fn scope<F: Future>(
    trace: Option<TraceContext>,
    work: F,
) -> impl Future<Output = F::Output> {
    scope_in((Span::default(), trace), work)
}

/// [`scope`] in an exported span (`trace` is its context).
pub(crate) fn scope_in<F: Future>(
    opened: (Span, Option<TraceContext>),
    work: F,
) -> impl Future<Output = F::Output> {
    scope_turn(opened, None, None, Carried::NONE, work)
}

/// [`scope_in`] for a message's turn that hands its message over at its
/// first model or MCP call ([`handover`]), under the `approvals` the
/// message carries.
pub(crate) fn scope_message<F: Future>(
    (span, trace): (Span, Option<TraceContext>),
    handover: Option<Arc<AtomicU64>>,
    approvals: Carried,
    work: F,
) -> impl Future<Output = F::Output> {
    CURRENT.scope(
        Work::new(span, trace, None, None, handover, approvals),
        work,
    )
}

/// [`scope`] for a turn that answers `origin`, resuming inbox request
/// `resume` when it is one that waited across a kernel restart, under the
/// `approvals` of whoever asked for it.
pub(crate) fn scope_turn<F: Future>(
    (span, trace): (Span, Option<TraceContext>),
    origin: Option<Origin>,
    resume: Option<u64>,
    approvals: Carried,
    work: F,
) -> impl Future<Output = F::Output> {
    CURRENT.scope(
        Work::new(span, trace, origin, resume, None, approvals),
        work,
    )
}

/// The approval rules the work running now was asked under (none outside
/// any work, or when whoever asked has none).
pub(crate) fn approvals() -> Carried {
    CURRENT
        .try_with(|work| work.approvals.clone())
        .unwrap_or_default()
}

/// The `delegate_async` request the work running now answers.
pub(crate) fn origin() -> Option<Origin> {
    CURRENT.try_with(|work| work.origin).ok().flatten()
}

/// The message the turn running now hands over at its first model or MCP
/// call, while it has not (see [`scope_message`]).
pub(crate) fn handover() -> Option<Arc<AtomicU64>> {
    CURRENT
        .try_with(|work| work.handover.clone())
        .ok()
        .flatten()
}

/// The inbox request a resumed turn waited for, the first time it is asked.
pub(crate) fn take_resume() -> Option<u64> {
    CURRENT.try_with(|work| work.resume.take()).ok().flatten()
}

/// The trace of the work running now, if any.
pub(crate) fn current() -> Option<TraceContext> {
    CURRENT.try_with(|work| work.trace).ok().flatten()
}

/// The id events and transcript entries recorded now carry.
pub(crate) fn current_id() -> Option<TraceId> {
    current().map(|trace| trace.trace_id)
}

/// The trace of a task or message made now: the current work's (whose
/// span is the item's parent), or a new one.
pub(crate) fn for_new_item() -> TraceContext {
    current().unwrap_or_else(TraceContext::new_root)
}

/// Marks the span of the work running now failed (`error.type` and why).
pub(crate) fn fail(error_type: impl Into<opentelemetry::Value>, why: &str) {
    let _ = CURRENT.try_with(|work| work.span.borrow_mut().fail(error_type, why));
}

/// The turn of the work running now, taking its id from `new` the first
/// time it is asked for; `None` outside any work.
pub(crate) fn turn(new: impl FnOnce() -> u64) -> Option<u64> {
    CURRENT
        .try_with(|work| {
            if work.turn.get() == 0 {
                work.turn.set(new());
            }
            work.turn.get()
        })
        .ok()
}
