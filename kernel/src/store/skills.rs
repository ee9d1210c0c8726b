//! The `skill` and `skill_version` tables: skills processes saved with
//! `skill_manage`, and every version of them. The writer checks the version
//! a change builds on and the owner's limit in the same transaction as the
//! change, so two changes to one skill never both land.

use hivekernel_agents::Pid;
use hivekernel_agents::skill::{SkillAction, SkillVersion, SkillVisibility};
use rusqlite::{OptionalExtension, Transaction};

use super::quota::Quota;
use super::{Applied, Store, StoreError, from_sql_u64, to_sql_u64};

/// Versions kept per skill; older ones leave the history.
pub(crate) const KEPT_VERSIONS: u64 = 50;

/// A change to a saved skill.
#[derive(Debug, Clone)]
pub(crate) struct SkillPut {
    pub(crate) owner: Pid,
    pub(crate) owner_name: String,
    /// `/1/.../owner/`.
    pub(crate) lineage: String,
    pub(crate) name: String,
    pub(crate) visibility: SkillVisibility,
    pub(crate) action: SkillAction,
    /// The `SKILL.md`; `None` for a delete.
    pub(crate) content: Option<String>,
    pub(crate) by: Pid,
    pub(crate) by_name: String,
    pub(crate) reason: Option<String>,
    pub(crate) at_ms: u64,
    /// The version the change builds on; `None`: the skill must not exist.
    pub(crate) base: Option<u64>,
    /// Most skills the owner may have, this one included.
    pub(crate) max_per_owner: u64,
    /// The storage quotas on the owner's line and the store's ceiling.
    pub(crate) quota: Quota,
}

/// A saved skill as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSkill {
    pub owner: Pid,
    pub owner_name: String,
    pub lineage: String,
    pub name: String,
    /// As stored; a value this build does not know is read as `private`.
    pub visibility: SkillVisibility,
    pub version: u64,
    pub content: String,
    pub updated_ms: u64,
}

pub(super) fn put(tx: &Transaction<'_>, put: &SkillPut) -> rusqlite::Result<Applied> {
    let owner = to_sql_u64(put.owner.0);
    let current: Option<(i64, i64)> = tx
        .prepare_cached(
            "SELECT version, octet_length(content) FROM skill WHERE owner_pid = ?1 AND name = ?2",
        )?
        .query_row((owner, &put.name), |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    let (current, held) = match current {
        Some((version, bytes)) => (Some(from_sql_u64(version)), from_sql_u64(bytes)),
        None => (None, 0),
    };
    if current != put.base {
        return Ok(Applied::Refused(match current {
            Some(version) if put.base.is_none() => format!(
                "process {} already has a skill {:?} (version {version}); edit it",
                put.owner, put.name
            ),
            Some(version) => format!(
                "skill {:?} changed meanwhile (now version {version}); view it again and retry",
                put.name
            ),
            None => format!("skill {:?} was deleted meanwhile", put.name),
        }));
    }
    if current.is_none() {
        let count: i64 = tx
            .prepare_cached("SELECT count(*) FROM skill WHERE owner_pid = ?1")?
            .query_row([owner], |row| row.get(0))?;
        if from_sql_u64(count) >= put.max_per_owner {
            return Ok(Applied::Refused(format!(
                "process {} already has {count} saved skills, the most one process may have; \
                 delete one first",
                put.owner
            )));
        }
    }
    // The text is kept twice: as the skill and as its newest version.
    let adding = put.content.as_ref().map_or(0, |text| 2 * text.len() as u64);
    if let Some(why) = put.quota.refusal(tx, adding, held)? {
        return Ok(Applied::Refused(why));
    }
    // Versions go on after a delete: a name used again continues its history.
    let last: Option<i64> = tx
        .prepare_cached(
            "SELECT max(version) FROM skill_version WHERE owner_pid = ?1 AND name = ?2",
        )?
        .query_row((owner, &put.name), |row| row.get(0))?;
    let version = last.map_or(0, from_sql_u64).max(current.unwrap_or(0)) + 1;
    match &put.content {
        Some(content) => {
            tx.prepare_cached(
                "INSERT INTO skill (owner_pid, name, owner_name, lineage, visibility, version,
                                    content, created_ms, updated_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8)
                 ON CONFLICT (owner_pid, name) DO UPDATE SET
                     visibility = excluded.visibility, version = excluded.version,
                     content = excluded.content, updated_ms = excluded.updated_ms",
            )?
            .execute((
                owner,
                &put.name,
                &put.owner_name,
                &put.lineage,
                put.visibility.as_str(),
                to_sql_u64(version),
                content,
                to_sql_u64(put.at_ms),
            ))?;
        }
        None => {
            tx.prepare_cached("DELETE FROM skill WHERE owner_pid = ?1 AND name = ?2")?
                .execute((owner, &put.name))?;
        }
    }
    tx.prepare_cached(
        "INSERT INTO skill_version (owner_pid, name, version, owner_name, action, by_pid,
                                    by_name, visibility, reason, content, at_ms, lineage)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
    )?
    .execute((
        owner,
        &put.name,
        to_sql_u64(version),
        &put.owner_name,
        put.action.as_str(),
        to_sql_u64(put.by.0),
        &put.by_name,
        put.visibility.as_str(),
        &put.reason,
        &put.content,
        to_sql_u64(put.at_ms),
        &put.lineage,
    ))?;
    // A deleted skill keeps the version it was deleted at and the text
    // before it (enough to bring it back); a live one its last versions.
    let keep_from = match (&put.content, current) {
        (None, Some(last)) => last,
        _ => version.saturating_sub(KEPT_VERSIONS) + 1,
    };
    tx.prepare_cached(
        "DELETE FROM skill_version WHERE owner_pid = ?1 AND name = ?2 AND version < ?3",
    )?
    .execute((owner, &put.name, to_sql_u64(keep_from)))?;
    Ok(Applied::Stored {
        id: version,
        created_ms: put.at_ms,
    })
}

/// Every saved skill, by owner and name (a restart reads them back).
pub(super) fn all(conn: &rusqlite::Connection) -> rusqlite::Result<Vec<StoredSkill>> {
    let mut stmt = conn.prepare(
        "SELECT owner_pid, owner_name, lineage, name, visibility, version, content, updated_ms
         FROM skill ORDER BY owner_pid, name",
    )?;
    stmt.query_map([], |row| {
        let visibility: String = row.get(4)?;
        Ok(StoredSkill {
            owner: Pid(from_sql_u64(row.get(0)?)),
            owner_name: row.get(1)?,
            lineage: row.get(2)?,
            name: row.get(3)?,
            visibility: visibility.parse().unwrap_or(SkillVisibility::Private),
            version: from_sql_u64(row.get(5)?),
            content: row.get(6)?,
            updated_ms: from_sql_u64(row.get(7)?),
        })
    })?
    .collect()
}

impl Store {
    /// The kept versions of saved skill `name` (only `owner`'s when given),
    /// by owner then oldest first, with their text when `content` is true.
    pub(crate) async fn skill_history(
        &self,
        name: String,
        owner: Option<Pid>,
        content: bool,
    ) -> Result<Vec<SkillVersion>, StoreError> {
        self.read("read a skill's history", move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT owner_pid, owner_name, version, action, by_pid, by_name, visibility,
                        reason, at_ms, CASE WHEN ?3 THEN content END
                 FROM skill_version
                 WHERE name = ?1 AND (?2 IS NULL OR owner_pid = ?2)
                 ORDER BY owner_pid, version",
            )?;
            let rows = stmt.query_map((&name, owner.map(|p| to_sql_u64(p.0)), content), |row| {
                let action: String = row.get(3)?;
                let visibility: String = row.get(6)?;
                Ok(SkillVersion {
                    name: name.clone(),
                    owner: Pid(from_sql_u64(row.get(0)?)),
                    owner_name: row.get(1)?,
                    version: from_sql_u64(row.get(2)?),
                    action: action.parse().unwrap_or(SkillAction::Edit),
                    by: Pid(from_sql_u64(row.get(4)?)),
                    by_name: row.get(5)?,
                    visibility: visibility.parse().unwrap_or(SkillVisibility::Private),
                    reason: row.get(7)?,
                    at_unix_ms: from_sql_u64(row.get(8)?),
                    content: row.get(9)?,
                })
            })?;
            rows.collect()
        })
        .await
    }
}
