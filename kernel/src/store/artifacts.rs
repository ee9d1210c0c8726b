//! The `artifacts` table: the writer's side (store with the per-owner
//! limit checked in the same transaction, delete) and the reader's.

use hivekernel_agents::{ArtifactId, ArtifactInfo, Pid, Visibility};
use rusqlite::{OptionalExtension, Row, Transaction};

use super::quota::Quota;
use super::{Applied, Store, StoreError, from_sql_u64, to_sql_u64};

/// An artifact to write.
#[derive(Debug)]
pub(crate) struct ArtifactWrite {
    /// The id it gets unless it replaces the owner's artifact of the same name.
    pub(crate) id: ArtifactId,
    pub(crate) owner: Pid,
    pub(crate) owner_name: String,
    /// `/1/.../owner/`.
    pub(crate) lineage: String,
    pub(crate) name: String,
    pub(crate) content_type: String,
    pub(crate) visibility: Visibility,
    pub(crate) content: Vec<u8>,
    pub(crate) at_ms: u64,
    /// Most bytes the owner's artifacts may total, this one included.
    pub(crate) max_owner_bytes: u64,
    /// The storage quotas on the owner's line and the store's ceiling.
    pub(crate) quota: Quota,
}

/// An artifact as read back, with the lineage its visibility is judged by.
#[derive(Debug, Clone)]
pub(crate) struct StoredArtifact {
    pub(crate) info: ArtifactInfo,
    pub(crate) lineage: String,
    /// Present when asked for.
    pub(crate) content: Option<Vec<u8>>,
}

/// Who lists: the operator sees everything; a process what its visibility rules allow.
#[derive(Debug, Clone)]
pub(crate) enum Viewer {
    Admin,
    Process { pid: Pid, lineage: String },
}

/// `/1/5/9/` for the PIDs from PID 1 down to a process.
pub(crate) fn lineage(path: &[Pid]) -> String {
    let mut text = String::from("/");
    for pid in path {
        text.push_str(&pid.0.to_string());
        text.push('/');
    }
    text
}

/// Whether `lineage` (as written by [`lineage`]) contains `pid`.
pub(crate) fn in_lineage(lineage: &str, pid: Pid) -> bool {
    lineage.contains(&format!("/{pid}/"))
}

pub(super) fn put(tx: &Transaction<'_>, write: &ArtifactWrite) -> rusqlite::Result<Applied> {
    let size = write.content.len() as u64;
    let (all, replaced): (i64, i64) = tx
        .prepare_cached(
            "SELECT COALESCE(SUM(size), 0), COALESCE(SUM(size) FILTER (WHERE name = ?2), 0)
             FROM artifacts WHERE owner_pid = ?1",
        )?
        .query_row((to_sql_u64(write.owner.0), &write.name), |row| {
            Ok((row.get(0)?, row.get(1)?))
        })?;
    let replaced = from_sql_u64(replaced);
    let total = from_sql_u64(all)
        .saturating_sub(replaced)
        .saturating_add(size);
    if total > write.max_owner_bytes {
        return Ok(Applied::Refused(format!(
            "artifacts of process {} would total {total} bytes, over \
             kernel.artifacts.max_bytes_per_owner ({} bytes); delete some first",
            write.owner, write.max_owner_bytes
        )));
    }
    if let Some(why) = write.quota.refusal(tx, size, replaced)? {
        return Ok(Applied::Refused(why));
    }
    let (id, created_ms): (i64, i64) = tx
        .prepare_cached(
            "INSERT INTO artifacts (id, owner_pid, owner_name, lineage, name, content_type,
                                    visibility, size, content, created_ms, updated_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10)
             ON CONFLICT (owner_pid, name) DO UPDATE SET
                 owner_name = excluded.owner_name, lineage = excluded.lineage,
                 content_type = excluded.content_type, visibility = excluded.visibility,
                 size = excluded.size, content = excluded.content,
                 updated_ms = excluded.updated_ms
             RETURNING id, created_ms",
        )?
        .query_row(
            (
                to_sql_u64(write.id.0),
                to_sql_u64(write.owner.0),
                &write.owner_name,
                &write.lineage,
                &write.name,
                &write.content_type,
                write.visibility.as_str(),
                to_sql_u64(size),
                &write.content,
                to_sql_u64(write.at_ms),
            ),
            |row| Ok((row.get(0)?, row.get(1)?)),
        )?;
    Ok(Applied::Stored {
        id: from_sql_u64(id),
        created_ms: from_sql_u64(created_ms),
    })
}

pub(super) fn delete(tx: &Transaction<'_>, id: ArtifactId) -> rusqlite::Result<Applied> {
    tx.prepare_cached("DELETE FROM artifacts WHERE id = ?1")?
        .execute([to_sql_u64(id.0)])?;
    Ok(Applied::Done)
}

const COLUMNS: &str = "id, name, owner_pid, owner_name, content_type, visibility, size, \
                       created_ms, updated_ms, lineage";

fn info(row: &Row<'_>) -> rusqlite::Result<(ArtifactInfo, String)> {
    let visibility: String = row.get(5)?;
    let info = ArtifactInfo {
        id: ArtifactId(from_sql_u64(row.get(0)?)),
        name: row.get(1)?,
        owner: Pid(from_sql_u64(row.get(2)?)),
        owner_name: row.get(3)?,
        content_type: row.get(4)?,
        // A value this build does not know is read as the most restrictive.
        visibility: visibility.parse().unwrap_or(Visibility::Private),
        size: from_sql_u64(row.get(6)?),
        created_at_unix_ms: from_sql_u64(row.get(7)?),
        updated_at_unix_ms: from_sql_u64(row.get(8)?),
    };
    Ok((info, row.get(9)?))
}

impl Store {
    /// One artifact, with its content when `content` is true.
    pub(crate) async fn artifact(
        &self,
        id: ArtifactId,
        content: bool,
    ) -> Result<Option<StoredArtifact>, StoreError> {
        self.read("read an artifact", move |conn| {
            let sql = if content {
                format!("SELECT {COLUMNS}, content FROM artifacts WHERE id = ?1")
            } else {
                format!("SELECT {COLUMNS} FROM artifacts WHERE id = ?1")
            };
            conn.prepare_cached(&sql)?
                .query_row([to_sql_u64(id.0)], |row| {
                    let (info, lineage) = info(row)?;
                    let content = if content { Some(row.get(10)?) } else { None };
                    Ok(StoredArtifact {
                        info,
                        lineage,
                        content,
                    })
                })
                .optional()
        })
        .await
    }

    /// The artifacts `viewer` may see, newest first, at most `limit`,
    /// only `owner`'s when given.
    pub(crate) async fn artifacts(
        &self,
        viewer: Viewer,
        owner: Option<Pid>,
        limit: usize,
    ) -> Result<Vec<ArtifactInfo>, StoreError> {
        self.read("list artifacts", move |conn| {
            // The same rules as `Kernel::may_read`, in SQL: own, global, or
            // subtree with the viewer on the owner's line or the owner on the viewer's.
            let (admin, pid, viewer_lineage) = match viewer {
                Viewer::Admin => (true, 0, String::new()),
                Viewer::Process { pid, lineage } => (false, to_sql_u64(pid.0), lineage),
            };
            let sql = format!(
                "SELECT {COLUMNS} FROM artifacts
                 WHERE (?1 OR owner_pid = ?2 OR visibility = 'global'
                        OR (visibility = 'subtree'
                            AND (instr(lineage, '/' || ?2 || '/') > 0
                                 OR instr(?3, '/' || owner_pid || '/') > 0)))
                   AND (?4 IS NULL OR owner_pid = ?4)
                 ORDER BY updated_ms DESC, id DESC
                 LIMIT ?5"
            );
            let mut stmt = conn.prepare_cached(&sql)?;
            let rows = stmt.query_map(
                (
                    admin,
                    pid,
                    viewer_lineage,
                    owner.map(|p| to_sql_u64(p.0)),
                    i64::try_from(limit).unwrap_or(i64::MAX),
                ),
                |row| info(row).map(|(info, _)| info),
            )?;
            rows.collect()
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lineage_matches_whole_pids_only() {
        let line = lineage(&[Pid(1), Pid(12), Pid(123)]);
        assert_eq!(line, "/1/12/123/");
        assert!(in_lineage(&line, Pid(12)));
        assert!(in_lineage(&line, Pid(1)));
        assert!(!in_lineage(&line, Pid(2)));
        assert!(!in_lineage(&line, Pid(23)));
    }
}
