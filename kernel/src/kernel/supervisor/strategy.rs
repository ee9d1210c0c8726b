//! Supervision strategies: which siblings a child's restart takes with it.
//!
//! The strategy belongs to the parent. `one_for_one` touches nobody else;
//! `one_for_all` stops every other live child, `rest_for_one` those spawned
//! after the failed one (in the order they came to it: PID order on one
//! node, where PIDs only grow, but not across the nodes of a cluster,
//! which take PIDs in blocks). A
//! stopped sibling is restarted with the failed child if its own policy
//! restarts after an abnormal exit (permanent, transient); a temporary one
//! stays dead and its parent is told as for any exit.
//!
//! A sibling on another node stops there, and restarts after the failed
//! child's delay, or, temporary, is killed; the siblings of a child whose parent is on another node are
//! the parent node's to stop (supervisor/remote.rs).

use std::time::Duration;

use hivekernel_agents::{Pid, Strategy};

use super::remote::Elsewhere;
use super::restart::stop_for_restart;
use super::{EXIT_KILLED, Exits, terminate};
use crate::process::ProcessTable;

/// Stops the siblings of `failed` that `parent`'s strategy takes down and
/// returns those that join restart `group` (after `delay`; those on other
/// nodes restart there after it).
pub(super) fn stop_siblings(
    table: &mut ProcessTable,
    parent: Pid,
    failed: Pid,
    group: u64,
    delay: Duration,
    exits: &mut Exits,
) -> Vec<Pid> {
    let Some(entry) = table.get(parent) else {
        return Vec::new();
    };
    let siblings: Vec<Pid> = match entry.strategy() {
        Strategy::OneForOne => return Vec::new(),
        Strategy::OneForAll => entry.children.iter().filter(|&pid| pid != failed).collect(),
        Strategy::RestForOne => entry.children.after(failed),
    };
    let reason = format!("restart: sibling {failed} failed");
    let mut joined = Vec::new();
    for pid in siblings {
        let Some(sibling) = table.get_mut(pid) else {
            // A sibling on another node restarts there.
            exits.follow.elsewhere.push(Elsewhere::Sibling {
                pid,
                reason: reason.clone(),
                delay,
            });
            continue;
        };
        if !sibling.is_alive() {
            continue;
        }
        if sibling.is_restarting() {
            // Already down: it now comes back with this group.
            sibling.wait_in_group(group);
            joined.push(pid);
        } else if sibling.restart_spec().policy.restarts_after(true) {
            stop_for_restart(table, pid, EXIT_KILLED, &reason, group, exits);
            joined.push(pid);
        } else {
            terminate(table, pid, EXIT_KILLED, &reason, exits);
        }
    }
    joined
}
