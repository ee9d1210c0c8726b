//! The `memory` table and its FTS5 index `memory_fts` (kept in step by
//! triggers): the writer's side (store with the per-agent limit checked in
//! the same transaction, forget by key) and recall.

use hivekernel_agents::{MemoryEntry, MemoryHit, Pid};
use rusqlite::{OptionalExtension, Row, Transaction};

use super::quota::Quota;
use super::{Applied, Store, StoreError, from_sql_u64, to_sql_u64};

/// An entry to write into `pid`'s namespace.
#[derive(Debug)]
pub(crate) struct MemoryWrite {
    /// The id it gets unless it replaces the entry with the same key.
    pub(crate) id: u64,
    pub(crate) pid: Pid,
    /// `/1/.../pid/`: the subtree quotas it counts against.
    pub(crate) lineage: String,
    pub(crate) key: Option<String>,
    pub(crate) text: String,
    /// Space-separated.
    pub(crate) tags: String,
    /// What it counts against the namespace's limit.
    pub(crate) size: u64,
    pub(crate) at_ms: u64,
    /// Most bytes the namespace may hold, this entry included.
    pub(crate) max_bytes: u64,
    /// The storage quotas on the line and the store's ceiling.
    pub(crate) quota: Quota,
}

pub(super) fn put(tx: &Transaction<'_>, write: &MemoryWrite) -> rusqlite::Result<Applied> {
    let pid = to_sql_u64(write.pid.0);
    let (all, replaced): (i64, i64) = tx
        .prepare_cached(
            "SELECT COALESCE(SUM(size), 0),
                    COALESCE(SUM(size) FILTER (WHERE ?2 IS NOT NULL AND key = ?2), 0)
             FROM memory WHERE pid = ?1",
        )?
        .query_row((pid, &write.key), |row| Ok((row.get(0)?, row.get(1)?)))?;
    let replaced = from_sql_u64(replaced);
    let total = from_sql_u64(all)
        .saturating_sub(replaced)
        .saturating_add(write.size);
    if total > write.max_bytes {
        return Ok(Applied::Refused(format!(
            "the memory of process {} would hold {total} bytes, over \
             kernel.memory.max_bytes_per_agent ({} bytes)",
            write.pid, write.max_bytes
        )));
    }
    if let Some(why) = write.quota.refusal(tx, write.size, replaced)? {
        return Ok(Applied::Refused(why));
    }
    let at = to_sql_u64(write.at_ms);
    let size = to_sql_u64(write.size);
    if let Some(key) = &write.key {
        let existing: Option<(i64, i64)> = tx
            .prepare_cached("SELECT id, created_ms FROM memory WHERE pid = ?1 AND key = ?2")?
            .query_row((pid, key), |row| Ok((row.get(0)?, row.get(1)?)))
            .optional()?;
        if let Some((id, created_ms)) = existing {
            tx.prepare_cached(
                "UPDATE memory SET text = ?2, tags = ?3, size = ?4, updated_ms = ?5,
                                   lineage = ?6
                 WHERE id = ?1",
            )?
            .execute((id, &write.text, &write.tags, size, at, &write.lineage))?;
            return Ok(Applied::Stored {
                id: from_sql_u64(id),
                created_ms: from_sql_u64(created_ms),
            });
        }
    }
    tx.prepare_cached(
        "INSERT INTO memory (id, pid, key, text, tags, size, created_ms, updated_ms, lineage)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, ?8)",
    )?
    .execute((
        to_sql_u64(write.id),
        pid,
        &write.key,
        &write.text,
        &write.tags,
        size,
        at,
        &write.lineage,
    ))?;
    Ok(Applied::Stored {
        id: write.id,
        created_ms: write.at_ms,
    })
}

pub(super) fn forget(tx: &Transaction<'_>, pid: Pid, key: &str) -> rusqlite::Result<Applied> {
    let deleted = tx
        .prepare_cached("DELETE FROM memory WHERE pid = ?1 AND key = ?2")?
        .execute((to_sql_u64(pid.0), key))?;
    Ok(if deleted == 0 {
        Applied::Absent
    } else {
        Applied::Done
    })
}

fn hit(row: &Row<'_>) -> rusqlite::Result<MemoryHit> {
    let tags: String = row.get(3)?;
    let rank: f64 = row.get(6)?;
    Ok(MemoryHit {
        entry: MemoryEntry {
            id: from_sql_u64(row.get(0)?),
            key: row.get(1)?,
            text: row.get(2)?,
            tags: tags.split_whitespace().map(str::to_owned).collect(),
            created_at_unix_ms: from_sql_u64(row.get(4)?),
            updated_at_unix_ms: from_sql_u64(row.get(5)?),
        },
        // bm25 is lower for better matches.
        score: -rank,
    })
}

impl Store {
    /// `pid`'s entries matching the FTS5 expression `query`, best first
    /// (bm25); without a query, the newest entries.
    pub(crate) async fn recall(
        &self,
        pid: Pid,
        query: Option<String>,
        limit: usize,
    ) -> Result<Vec<MemoryHit>, StoreError> {
        self.read("recall memory", move |conn| {
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let pid = to_sql_u64(pid.0);
            match query {
                Some(query) => {
                    let mut stmt = conn.prepare_cached(
                        "SELECT m.id, m.key, m.text, m.tags, m.created_ms, m.updated_ms,
                                bm25(memory_fts) AS rank
                         FROM memory_fts JOIN memory m ON m.id = memory_fts.rowid
                         WHERE memory_fts MATCH ?1 AND m.pid = ?2
                         ORDER BY rank, m.id DESC
                         LIMIT ?3",
                    )?;
                    let rows = stmt.query_map((query, pid, limit), hit)?;
                    rows.collect()
                }
                None => {
                    let mut stmt = conn.prepare_cached(
                        "SELECT id, key, text, tags, created_ms, updated_ms, 0.0
                         FROM memory WHERE pid = ?1
                         ORDER BY updated_ms DESC, id DESC
                         LIMIT ?2",
                    )?;
                    let rows = stmt.query_map((pid, limit), hit)?;
                    rows.collect()
                }
            }
        })
        .await
    }
}
