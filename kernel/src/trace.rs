//! The work running now: a task-local set around each handler (the trace
//! of the task or message it handles, and the turn its transcript entries
//! share), around a gRPC call (from the caller's `traceparent`, or a new
//! trace) and around each cron firing (a new trace). Tasks and messages
//! made while it is set continue its trace; events and transcript entries
//! recorded while it is set carry its trace id.

use std::cell::Cell;

use hivekernel_agents::{TraceContext, TraceId};

/// What the task-local holds.
struct Work {
    trace: Option<TraceContext>,
    /// The turn's id once something was recorded in it; 0 before.
    turn: Cell<u64>,
}

tokio::task_local! {
    static CURRENT: Work;
}

/// Runs `work` as one piece of work in `trace` (none: no trace).
pub(crate) fn scope<F: Future>(
    trace: Option<TraceContext>,
    work: F,
) -> impl Future<Output = F::Output> {
    CURRENT.scope(
        Work {
            trace,
            turn: Cell::new(0),
        },
        work,
    )
}

/// The trace of the work running now, if any.
pub(crate) fn current() -> Option<TraceContext> {
    CURRENT.try_with(|work| work.trace).ok().flatten()
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
