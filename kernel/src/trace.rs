//! The trace of the work running now: a task-local set around each handler
//! (from the task or message it handles), around a gRPC call (from the
//! caller's `traceparent`, or a new trace) and around each cron firing (a
//! new trace). Tasks and messages made while it is set continue it; events
//! and transcript entries recorded while it is set carry its id.

use hivekernel_agents::{TraceContext, TraceId};

tokio::task_local! {
    static CURRENT: Option<TraceContext>;
}

/// Runs `work` as part of `trace` (none: no trace).
pub(crate) fn scope<F: Future>(
    trace: Option<TraceContext>,
    work: F,
) -> impl Future<Output = F::Output> {
    CURRENT.scope(trace, work)
}

/// The trace of the work running now, if any.
pub(crate) fn current() -> Option<TraceContext> {
    CURRENT.try_with(|trace| *trace).ok().flatten()
}

/// The id events and transcript entries recorded now carry.
pub(crate) fn current_id() -> Option<TraceId> {
    current().map(|trace| trace.trace_id)
}

/// The trace of a task or message made now: a step of the current trace,
/// or a new one.
pub(crate) fn for_new_item() -> TraceContext {
    current().map_or_else(TraceContext::new_root, TraceContext::child)
}
