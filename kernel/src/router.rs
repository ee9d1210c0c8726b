//! Who may send to whom, and delivery of messages, tasks and replies.
//!
//! Rules, checked for every message and task:
//! - parent <-> child, and any process <-> its ancestors and descendants: direct;
//! - sibling -> sibling: delivered, with a low-priority copy to the parent;
//! - cross-branch: delivered through the nearest common ancestor, which is
//!   recorded on the message (`via`);
//! - a `task` process may only address its parent.

use std::time::Duration;

use hivekernel_agents::{Pid, Role};

use crate::error::{KernelError, Result};
use crate::process::ProcessTable;

/// Bytes of a message to PID 1 kept in its `kernel_message` event.
pub const KERNEL_MESSAGE_PREVIEW: usize = 4096;

/// How a permitted message travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Route {
    /// Parent to receive a low-priority copy (sibling traffic).
    pub(crate) copy_to: Option<Pid>,
    /// Nearest common ancestor of a cross-branch route.
    pub(crate) via: Option<Pid>,
}

/// Why a route was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RouteError {
    /// The sender is not a live process.
    SenderNotAlive(Pid),
    /// The receiver does not exist.
    NoReceiver(Pid),
    /// The routing rules forbid it.
    Denied(String),
}

/// Applies the routing rules to `from` -> `to`.
pub(crate) fn route(table: &ProcessTable, from: Pid, to: Pid) -> Result<Route, RouteError> {
    let direct = Route {
        copy_to: None,
        via: None,
    };
    let sender = table
        .get(from)
        .filter(|e| e.is_alive())
        .ok_or(RouteError::SenderNotAlive(from))?;
    let receiver = table.get(to).ok_or(RouteError::NoReceiver(to))?;
    if from == to {
        return Ok(direct);
    }
    if sender.proc.ctx.role == Role::Task && sender.ppid != to {
        return Err(RouteError::Denied(format!(
            "process {from} is a task and may only address its parent {}",
            sender.ppid
        )));
    }
    if sender.ppid == to || receiver.ppid == from {
        return Ok(direct);
    }
    if sender.ppid == receiver.ppid {
        // The kernel is every top-level agent's parent; it needs no copies.
        let copy_to = (sender.ppid != Pid::KERNEL).then_some(sender.ppid);
        return Ok(Route { copy_to, via: None });
    }
    match table.nearest_common_ancestor(from, to) {
        // One is the other's ancestor: a direct line.
        Some(nca) if nca == from || nca == to => Ok(direct),
        Some(nca) => Ok(Route {
            copy_to: None,
            via: Some(nca),
        }),
        None => Err(RouteError::Denied(format!(
            "processes {from} and {to} share no ancestor"
        ))),
    }
}

/// Longest timeout or TTL the kernel accepts.
pub const MAX_DURATION: Duration = Duration::from_secs(30 * 24 * 3600);

/// Refuses zero and anything past [`MAX_DURATION`].
pub(crate) fn check_duration(field: &str, value: Duration) -> Result<()> {
    if value.is_zero() || value > MAX_DURATION {
        return Err(KernelError::InvalidArgument(format!(
            "{field} must be between 1 ms and 30 days, got {} ms",
            value.as_millis()
        )));
    }
    Ok(())
}
