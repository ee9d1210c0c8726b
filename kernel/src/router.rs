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

impl Route {
    /// Straight to the receiver: no copy, no common ancestor to record.
    pub(crate) const DIRECT: Route = Route {
        copy_to: None,
        via: None,
    };
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

/// What the routing rules read of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Link {
    /// Its parent.
    pub(crate) ppid: Pid,
    /// Distance from PID 1.
    pub(crate) depth: u32,
    /// Alive, not a zombie.
    pub(crate) alive: bool,
    pub(crate) role: Role,
}

/// The tree the rules are judged on: one kernel's table, or on a node of a
/// cluster the tree across the nodes.
pub(crate) trait Lineage {
    /// `pid`'s place in the tree, if it is there.
    fn link(&self, pid: Pid) -> Option<Link>;
}

impl Lineage for ProcessTable {
    #[inline]
    fn link(&self, pid: Pid) -> Option<Link> {
        self.get(pid).map(|entry| Link {
            ppid: entry.ppid,
            depth: entry.depth,
            alive: entry.is_alive(),
            role: entry.proc.ctx.role,
        })
    }
}

/// Applies the routing rules to `from` -> `to`.
pub(crate) fn route(tree: &impl Lineage, from: Pid, to: Pid) -> Result<Route, RouteError> {
    let direct = Route::DIRECT;
    let sender = tree
        .link(from)
        .filter(|link| link.alive)
        .ok_or(RouteError::SenderNotAlive(from))?;
    let receiver = tree.link(to).ok_or(RouteError::NoReceiver(to))?;
    if from == to {
        return Ok(direct);
    }
    if sender.role == Role::Task && sender.ppid != to {
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
    match nearest_common_ancestor(tree, (from, sender), (to, receiver)) {
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

/// The deepest process that is an ancestor of (or equal to) both. Every
/// step up must lessen the depth, so a loop in links another node wrote
/// ends the walk (`None`) instead of looping.
fn nearest_common_ancestor(
    tree: &impl Lineage,
    (mut a, mut at_a): (Pid, Link),
    (mut b, mut at_b): (Pid, Link),
) -> Option<Pid> {
    let up = |pid: &mut Pid, link: &mut Link| -> Option<()> {
        let parent = tree.link(link.ppid)?;
        if parent.depth >= link.depth {
            return None;
        }
        *pid = link.ppid;
        *link = parent;
        Some(())
    };
    while at_a.depth > at_b.depth {
        up(&mut a, &mut at_a)?;
    }
    while at_b.depth > at_a.depth {
        up(&mut b, &mut at_b)?;
    }
    while a != b {
        up(&mut a, &mut at_a)?;
        up(&mut b, &mut at_b)?;
    }
    Some(a)
}

/// Whether `ancestor` is a strict ancestor of `pid`, walking up links
/// whose depth lessens at every step (a loop ends the walk: not one).
pub(crate) fn descends(tree: &impl Lineage, ancestor: Pid, pid: Pid) -> bool {
    let Some(mut link) = tree.link(pid) else {
        return false;
    };
    while link.depth > 0 {
        if link.ppid == ancestor {
            return true;
        }
        match tree.link(link.ppid) {
            Some(parent) if parent.depth < link.depth => link = parent,
            _ => return false,
        }
    }
    false
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// A tree as links alone, as a peer's listings may hold it.
    struct Links(HashMap<Pid, Link>);

    impl Lineage for Links {
        fn link(&self, pid: Pid) -> Option<Link> {
            self.0.get(&pid).copied()
        }
    }

    fn link(ppid: u64, depth: u32, role: Role) -> Link {
        Link {
            ppid: Pid(ppid),
            depth,
            alive: true,
            role,
        }
    }

    /// 1 ─┬─ 2 ─┬─ 4
    ///    │     └─ 5 (a task)
    ///    └─ 3 ─── 6
    fn tree() -> Links {
        Links(HashMap::from([
            (Pid(1), link(0, 0, Role::Kernel)),
            (Pid(2), link(1, 1, Role::Lead)),
            (Pid(3), link(1, 1, Role::Lead)),
            (Pid(4), link(2, 2, Role::Worker)),
            (Pid(5), link(2, 2, Role::Task)),
            (Pid(6), link(3, 2, Role::Worker)),
        ]))
    }

    #[test]
    fn the_rules_hold_on_any_tree() {
        let tree = tree();
        let route = |from, to| route(&tree, Pid(from), Pid(to));
        assert_eq!(route(4, 2), Ok(Route::DIRECT));
        assert_eq!(route(1, 6), Ok(Route::DIRECT));
        assert_eq!(
            route(4, 5).map(|r| r.copy_to),
            Ok(Some(Pid(2))),
            "siblings: a copy to their parent"
        );
        assert_eq!(route(2, 3), Ok(Route::DIRECT), "PID 1 takes no copies");
        assert_eq!(route(4, 6).map(|r| r.via), Ok(Some(Pid(1))));
        assert_eq!(route(5, 2), Ok(Route::DIRECT));
        assert!(matches!(route(5, 4), Err(RouteError::Denied(why)) if why.contains("is a task")));
        assert_eq!(route(4, 9), Err(RouteError::NoReceiver(Pid(9))));
        assert_eq!(route(9, 4), Err(RouteError::SenderNotAlive(Pid(9))));
        assert!(descends(&tree, Pid(1), Pid(6)));
        assert!(descends(&tree, Pid(3), Pid(6)));
        assert!(!descends(&tree, Pid(2), Pid(6)));
        assert!(!descends(&tree, Pid(6), Pid(6)));
    }

    #[test]
    fn a_loop_or_a_gap_in_the_links_ends_the_walk() {
        // 7 and 8 claim each other as parents at one depth; 9's parent is
        // not in the tree.
        let mut tree = tree();
        tree.0.insert(Pid(7), link(8, 3, Role::Worker));
        tree.0.insert(Pid(8), link(7, 3, Role::Worker));
        tree.0.insert(Pid(9), link(42, 3, Role::Worker));
        assert!(matches!(
            route(&tree, Pid(7), Pid(4)),
            Err(RouteError::Denied(why)) if why.contains("share no ancestor")
        ));
        assert!(matches!(
            route(&tree, Pid(9), Pid(6)),
            Err(RouteError::Denied(why)) if why.contains("share no ancestor")
        ));
        assert!(!descends(&tree, Pid(1), Pid(7)));
        assert!(!descends(&tree, Pid(1), Pid(9)));
    }
}
