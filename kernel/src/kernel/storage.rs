//! Storage quotas: which quotas a write of artifacts, memory or skills is
//! checked against (the writer checks them, see `store::quota`).
//!
//! Every process with `max_storage_bytes` roots a quota over its subtree,
//! and a child of PID 1 without one roots
//! `kernel.storage.max_bytes_per_subtree`. A write counts toward every
//! quota on its owner's line, so a quota nested inside another never lets
//! a subtree keep more than the outer one allows; the store's ceiling
//! (`kernel.storage.max_bytes`) is checked last.

use hivekernel_agents::Pid;

use crate::kernel::Kernel;
use crate::store::{Quota, SubtreeQuota};

impl Kernel {
    /// The quotas a write by the owner of `line` (`/1/.../owner/`, as
    /// stored) counts toward, nearest first. A quota of a process gone from
    /// the table no longer guards writes (only a skill of a gone owner is
    /// written so); the default one of a child of PID 1 always does.
    pub(super) fn storage_quota(&self, line: &str) -> Quota {
        let settings = self.inner.settings().storage;
        let pids: Vec<Pid> = line
            .split('/')
            .filter_map(|part| part.parse::<u64>().ok().map(Pid))
            .collect();
        let mut subtrees = Vec::new();
        {
            let table = self.inner.table().read();
            for depth in (1..pids.len()).rev() {
                let pid = pids[depth];
                let entry = table.get(pid);
                let own = entry.and_then(|entry| entry.proc.limits.max_storage_bytes);
                let own = own.map(std::num::NonZeroU64::get);
                let (max_bytes, setting) = match own {
                    Some(max) => (max, "max_storage_bytes"),
                    None if depth == 1 => (
                        settings.max_bytes_per_subtree,
                        "kernel.storage.max_bytes_per_subtree",
                    ),
                    None => continue,
                };
                subtrees.push(SubtreeQuota {
                    pid,
                    name: entry.map_or_else(String::new, |entry| entry.proc.ctx.name.to_string()),
                    lineage: crate::store::lineage(&pids[..=depth]),
                    max_bytes,
                    setting,
                });
            }
        }
        Quota {
            subtrees,
            ceiling: Some(settings.max_bytes),
        }
    }
}
