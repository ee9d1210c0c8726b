//! Storage quotas, checked by the writer in the transaction of the write
//! they guard, so two writes never both squeeze under one quota.
//!
//! A subtree's quota (a process's `max_storage_bytes`, or
//! `kernel.storage.max_bytes_per_subtree` for a child of PID 1 that sets
//! none) covers the artifacts, memory and saved skills (with their
//! history) of every process below it, alive or gone: rows carry their
//! owner's PID line, so data outlives its owner and keeps counting until it
//! is deleted. The kernel-wide ceiling (`kernel.storage.max_bytes`) covers
//! the whole store file, pages in use.

use hivekernel_agents::Pid;
use rusqlite::Transaction;

use super::from_sql_u64;

/// What one write is checked against.
#[derive(Debug, Clone, Default)]
pub(crate) struct Quota {
    /// The subtree quotas on the writer's line, nearest first.
    pub(crate) subtrees: Vec<SubtreeQuota>,
    /// Most bytes the store may hold in use; `None`: no ceiling.
    pub(crate) ceiling: Option<u64>,
}

/// One subtree's quota.
#[derive(Debug, Clone)]
pub(crate) struct SubtreeQuota {
    /// The process at the subtree's root.
    pub(crate) pid: Pid,
    pub(crate) name: String,
    /// Its line, `/1/.../pid/`: everything stored below it starts so.
    pub(crate) lineage: String,
    pub(crate) max_bytes: u64,
    /// The setting that set it, named in a refusal.
    pub(crate) setting: &'static str,
}

impl Quota {
    /// Why writing `adding` bytes (in place of `freed` bytes the write
    /// replaces) would pass a quota, nearest first; `None` when it fits.
    pub(super) fn refusal(
        &self,
        tx: &Transaction<'_>,
        adding: u64,
        freed: u64,
    ) -> rusqlite::Result<Option<String>> {
        if adding <= freed {
            // Shrinking or replacing with no more is always allowed: it is
            // how a subtree over its quota gets back under it.
            return Ok(None);
        }
        for quota in &self.subtrees {
            let kept = subtree_bytes(tx, &quota.lineage)?;
            let after = kept.saturating_sub(freed).saturating_add(adding);
            if after > quota.max_bytes {
                return Ok(Some(format!(
                    "storage quota of process {} ({}) exceeded: its subtree keeps {kept} bytes \
                     of artifacts, memory and skills, and {adding} more would pass its \
                     {} ({} bytes); delete some under it first",
                    quota.pid, quota.name, quota.setting, quota.max_bytes
                )));
            }
        }
        if let Some(ceiling) = self.ceiling {
            let used = store_bytes(tx)?;
            if used.saturating_add(adding - freed) > ceiling {
                return Ok(Some(format!(
                    "the store holds {used} bytes, and {adding} more would pass \
                     kernel.storage.max_bytes ({ceiling} bytes); delete artifacts, memory or \
                     skills, or raise it"
                )));
            }
        }
        Ok(None)
    }
}

/// Bytes of artifacts, memory and skills (with their history) stored by
/// the processes on or below `lineage`.
pub(super) fn subtree_bytes(tx: &Transaction<'_>, lineage: &str) -> rusqlite::Result<u64> {
    let end = lineage_end(lineage);
    let bytes: i64 = tx
        .prepare_cached(
            "SELECT (SELECT COALESCE(SUM(size), 0) FROM artifacts
                     WHERE lineage >= ?1 AND lineage < ?2)
                  + (SELECT COALESCE(SUM(size), 0) FROM memory
                     WHERE lineage >= ?1 AND lineage < ?2)
                  + (SELECT COALESCE(SUM(octet_length(content)), 0) FROM skill
                     WHERE lineage >= ?1 AND lineage < ?2)
                  + (SELECT COALESCE(SUM(octet_length(content)), 0) FROM skill_version
                     WHERE lineage >= ?1 AND lineage < ?2)",
        )?
        .query_row((lineage, &end), |row| row.get(0))?;
    Ok(from_sql_u64(bytes))
}

/// Bytes of the store file in use (free pages left out).
pub(super) fn store_bytes(tx: &Transaction<'_>) -> rusqlite::Result<u64> {
    let bytes: i64 = tx
        .prepare_cached(
            "SELECT (page_count - freelist_count) * page_size
             FROM pragma_page_count(), pragma_freelist_count(), pragma_page_size()",
        )?
        .query_row([], |row| row.get(0))?;
    Ok(from_sql_u64(bytes))
}

/// The first string after every string that starts with `lineage` (which
/// ends in `/`): the same with its last `/` raised to `0`, so a range scan
/// over the lineage index finds the subtree.
fn lineage_end(lineage: &str) -> String {
    match lineage.strip_suffix('/') {
        Some(stem) => format!("{stem}0"),
        // Not a line: an empty range.
        None => lineage.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lineage_range_holds_exactly_its_subtree() {
        let start = "/1/5/";
        let end = lineage_end(start);
        for inside in ["/1/5/", "/1/5/9/", "/1/5/9/12/"] {
            assert!(inside >= start && inside < end.as_str(), "{inside}");
        }
        for outside in ["/1/", "/1/50/", "/1/6/", "/1/4/", "/1/5"] {
            assert!(!(outside >= start && outside < end.as_str()), "{outside}");
        }
    }
}
