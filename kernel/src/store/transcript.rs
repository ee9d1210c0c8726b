//! The `transcript` table: writing entries, reading a process's, and
//! keeping the table within its age and size limits.
//!
//! The writer keeps a tally of the bytes each process's transcript holds
//! (read once at open), so a size limit is checked without a scan; pruning
//! goes past the limit by a tenth, so it does not run on every write.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime};

use hivekernel_agents::Pid;
use rusqlite::{Connection, Transaction};

use super::{Op, Store, StoreError, Write, from_sql_u64, to_sql_u64};
use crate::event::{EventKind, unix_ms};
use crate::transcript::{Entry, Page, Query};

/// What the store keeps of transcripts (from `kernel.transcripts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Keep a process's transcript after it is reaped.
    pub keep_after_exit: bool,
    /// Entries older than this many hours are pruned.
    pub max_age_hours: u64,
    /// Most bytes one process's transcript keeps.
    pub max_bytes_per_process: u64,
    /// Most bytes all transcripts keep together.
    pub max_bytes_total: u64,
}

impl Default for Retention {
    /// Until the kernel says otherwise: prune nothing, keep nothing of the reaped.
    fn default() -> Self {
        Retention {
            keep_after_exit: false,
            max_age_hours: u64::MAX,
            max_bytes_per_process: u64::MAX,
            max_bytes_total: u64::MAX,
        }
    }
}

/// How often entries are checked for age.
const AGE_CHECK: Duration = Duration::from_secs(60);
/// Rows looked at per step of a pruning.
const PRUNE_STEP: i64 = 1024;

pub(super) fn put(tx: &Transaction<'_>, entry: &Entry) -> rusqlite::Result<()> {
    let body = serde_json::to_string(entry)
        .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
    tx.prepare_cached(
        "INSERT OR REPLACE INTO transcript (id, pid, turn, at_ms, type, bytes, body)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute((
        to_sql_u64(entry.id),
        to_sql_u64(entry.pid.0),
        to_sql_u64(entry.turn),
        to_sql_u64(entry.at_unix_ms),
        entry.kind.name(),
        to_sql_u64(entry.kind.weight()),
        body,
    ))?;
    Ok(())
}

impl Store {
    /// `pid`'s stored entries matching `query`, oldest first.
    pub(crate) async fn transcript(&self, pid: Pid, query: Query) -> Result<Page, StoreError> {
        self.read("read a transcript", move |conn| {
            let pid = to_sql_u64(pid.0);
            let filters = (
                pid,
                to_sql_u64(query.after_id),
                to_sql_u64(query.after_turn.max(query.min_turn.saturating_sub(1))),
                to_sql_u64(query.since_unix_ms),
            );
            let min_turn = match query.tail_turns {
                Some(n) => conn
                    .prepare_cached(
                        "SELECT min(turn) FROM (SELECT DISTINCT turn FROM transcript
                         WHERE pid = ?1 AND id > ?2 AND turn > ?3 AND at_ms >= ?4
                         ORDER BY turn DESC LIMIT ?5)",
                    )?
                    .query_row(
                        (filters.0, filters.1, filters.2, filters.3, i64::from(n)),
                        |row| row.get::<_, Option<i64>>(0),
                    )?
                    .map_or(u64::MAX, from_sql_u64),
                None => query.min_turn,
            };
            let mut stmt = conn.prepare_cached(
                "SELECT body FROM transcript
                 WHERE pid = ?1 AND id > ?2 AND turn > ?3 AND at_ms >= ?4 AND turn >= ?5
                 ORDER BY id LIMIT ?6",
            )?;
            let limit = query.limit.max(1);
            let mut rows = stmt.query((
                filters.0,
                filters.1,
                filters.2,
                filters.3,
                to_sql_u64(min_turn),
                i64::try_from(limit + 1).unwrap_or(i64::MAX),
            ))?;
            let mut page = Page {
                min_turn,
                ..Page::default()
            };
            let mut bytes = 0;
            while let Some(row) = rows.next()? {
                if page.entries.len() >= limit
                    || (!page.entries.is_empty() && bytes >= query.max_bytes)
                {
                    page.more = true;
                    break;
                }
                let body: String = row.get(0)?;
                bytes += body.len();
                // A row this build cannot read is skipped, not fatal.
                if let Ok(entry) = serde_json::from_str::<Entry>(&body) {
                    page.entries.push(entry);
                }
            }
            Ok(page)
        })
        .await
    }
}

/// Drops the entries of the processes `ops` reaps, which their transcript
/// would leave with at once (unless kept, or a config agent's): the entries
/// of a short-lived worker, still queued when it is collected, never
/// reach the disk.
pub(super) fn skip_reaped(conn: &Connection, ops: Vec<Op>, settings: &Retention) -> Vec<Op> {
    if settings.keep_after_exit {
        return ops;
    }
    let reaped: HashSet<u64> = ops
        .iter()
        .filter_map(|op| match &op.write {
            Write::Event(event) if matches!(event.kind, EventKind::Reaped { .. }) => {
                Some(event.pid.0)
            }
            _ => None,
        })
        .collect();
    if reaped.is_empty() {
        return ops;
    }
    let declared = |pid: u64| {
        conn.prepare_cached("SELECT 1 FROM declared WHERE pid = ?1")
            .and_then(|mut stmt| stmt.exists([to_sql_u64(pid)]))
            // When in doubt, write it: the reap's deletion still applies.
            .unwrap_or(true)
    };
    let gone: HashSet<u64> = reaped.into_iter().filter(|pid| !declared(*pid)).collect();
    ops.into_iter()
        .filter(|op| !matches!(&op.write, Write::Transcript(entry) if gone.contains(&entry.pid.0)))
        .collect()
}

/// What the writer knows of the table's size, and when it last checked ages.
#[derive(Debug)]
pub(super) struct Tally {
    per_pid: HashMap<u64, u64>,
    total: u64,
    /// Processes past their limit since the last tidy.
    over: Vec<u64>,
    age_checked: Instant,
}

impl Tally {
    /// The sizes as stored.
    pub(super) fn load(conn: &Connection) -> rusqlite::Result<Tally> {
        let mut stmt = conn.prepare("SELECT pid, sum(bytes) FROM transcript GROUP BY pid")?;
        let per_pid = stmt
            .query_map([], |row| {
                Ok((from_sql_u64(row.get(0)?), from_sql_u64(row.get(1)?)))
            })?
            .collect::<rusqlite::Result<HashMap<u64, u64>>>()?;
        let total = per_pid.values().sum();
        Ok(Tally {
            per_pid,
            total,
            over: Vec::new(),
            // The first batch after a start checks ages.
            age_checked: Instant::now()
                .checked_sub(AGE_CHECK)
                .unwrap_or_else(Instant::now),
        })
    }

    /// Counts what a batch is about to write, and answers the processes
    /// it reaps.
    pub(super) fn count<'a>(
        &mut self,
        writes: impl Iterator<Item = &'a Write>,
        settings: &Retention,
    ) -> Vec<Pid> {
        let mut reaped = Vec::new();
        for write in writes {
            match write {
                Write::Transcript(entry) => {
                    let bytes = entry.kind.weight();
                    let kept = self.per_pid.entry(entry.pid.0).or_default();
                    let was = *kept;
                    *kept += bytes;
                    if *kept > settings.max_bytes_per_process
                        && was <= settings.max_bytes_per_process
                    {
                        self.over.push(entry.pid.0);
                    }
                    self.total += bytes;
                }
                Write::Event(event) if matches!(event.kind, EventKind::Reaped { .. }) => {
                    reaped.push(event.pid);
                }
                _ => {}
            }
        }
        reaped
    }

    /// After a batch: drops the transcripts of `reaped` processes (unless
    /// kept, or a config agent's), then prunes by age and size.
    pub(super) fn tidy(
        &mut self,
        conn: &Connection,
        settings: &Retention,
        reaped: &[Pid],
    ) -> rusqlite::Result<()> {
        let due = self.age_checked.elapsed() >= AGE_CHECK;
        let over_total = self.total > settings.max_bytes_total;
        let over = std::mem::take(&mut self.over);
        let forget = !settings.keep_after_exit && !reaped.is_empty();
        if !due && !over_total && over.is_empty() && !forget {
            return Ok(());
        }
        let tx = conn.unchecked_transaction()?;
        if forget {
            for pid in reaped {
                let pid = to_sql_u64(pid.0);
                let deleted = tx
                    .prepare_cached(
                        "DELETE FROM transcript WHERE pid = ?1
                         AND NOT EXISTS (SELECT 1 FROM declared WHERE declared.pid = ?1)",
                    )?
                    .execute([pid])?;
                if deleted > 0
                    && let Some(bytes) = self.per_pid.remove(&from_sql_u64(pid))
                {
                    self.total = self.total.saturating_sub(bytes);
                }
            }
        }
        for pid in over {
            let target = settings.max_bytes_per_process / 10 * 9;
            self.prune(&tx, Some(pid), |tally| {
                tally.per_pid.get(&pid).copied().unwrap_or(0) > target
            })?;
        }
        if self.total > settings.max_bytes_total {
            let target = settings.max_bytes_total / 10 * 9;
            self.prune(&tx, None, |tally| tally.total > target)?;
        }
        if due {
            self.age_checked = Instant::now();
            let max_age = Duration::from_secs(settings.max_age_hours.saturating_mul(3600));
            let cutoff = SystemTime::now().checked_sub(max_age).map_or(0, unix_ms);
            self.prune_older(&tx, cutoff)?;
        }
        tx.commit()
    }

    /// Deletes the oldest entries (of `pid`, or of everyone) while `over`
    /// says the tally is still too large.
    fn prune(
        &mut self,
        tx: &Transaction<'_>,
        pid: Option<u64>,
        over: impl Fn(&Tally) -> bool,
    ) -> rusqlite::Result<()> {
        while over(self) {
            let rows = oldest(tx, pid, 0)?;
            if rows.is_empty() {
                // The tally is ahead of the table: believe the table.
                match pid {
                    Some(pid) => {
                        let bytes = self.per_pid.remove(&pid).unwrap_or(0);
                        self.total = self.total.saturating_sub(bytes);
                    }
                    None => {
                        self.per_pid.clear();
                        self.total = 0;
                    }
                }
                break;
            }
            let mut last = 0;
            for (id, owner, bytes) in rows {
                if !over(self) {
                    break;
                }
                last = id;
                self.deduct(owner, bytes);
            }
            delete_through(tx, pid, last)?;
        }
        Ok(())
    }

    /// Deletes every entry recorded before `cutoff_ms`: they are the oldest
    /// ids, so the scan stops at the first younger one.
    fn prune_older(&mut self, tx: &Transaction<'_>, cutoff_ms: u64) -> rusqlite::Result<()> {
        // No cutoff (an age beyond the clock's start): nothing is that old.
        if cutoff_ms == 0 {
            return Ok(());
        }
        loop {
            let rows = oldest(tx, None, cutoff_ms)?;
            let Some(&(last, ..)) = rows.last() else {
                return Ok(());
            };
            let full = rows.len() as i64 == PRUNE_STEP;
            for (_, owner, bytes) in rows {
                self.deduct(owner, bytes);
            }
            delete_through(tx, None, last)?;
            if !full {
                return Ok(());
            }
        }
    }

    fn deduct(&mut self, pid: u64, bytes: u64) {
        if let Some(kept) = self.per_pid.get_mut(&pid) {
            *kept = kept.saturating_sub(bytes);
            if *kept == 0 {
                self.per_pid.remove(&pid);
            }
        }
        self.total = self.total.saturating_sub(bytes);
    }
}

/// The oldest entries (of `pid`, or of everyone), at most a step's worth;
/// with `before_ms`, only the leading run recorded before that time.
fn oldest(
    tx: &Transaction<'_>,
    pid: Option<u64>,
    before_ms: u64,
) -> rusqlite::Result<Vec<(u64, u64, u64)>> {
    let mut of_pid;
    let mut of_all;
    let mut rows = match pid {
        Some(pid) => {
            of_pid = tx.prepare_cached(
                "SELECT id, pid, bytes, at_ms FROM transcript WHERE pid = ?1 ORDER BY id LIMIT ?2",
            )?;
            of_pid.query((to_sql_u64(pid), PRUNE_STEP))?
        }
        None => {
            of_all = tx.prepare_cached(
                "SELECT id, pid, bytes, at_ms FROM transcript ORDER BY id LIMIT ?1",
            )?;
            of_all.query([PRUNE_STEP])?
        }
    };
    let mut found = Vec::new();
    while let Some(row) = rows.next()? {
        let at_ms = from_sql_u64(row.get(3)?);
        if before_ms > 0 && at_ms >= before_ms {
            break;
        }
        found.push((
            from_sql_u64(row.get(0)?),
            from_sql_u64(row.get(1)?),
            from_sql_u64(row.get(2)?),
        ));
    }
    Ok(found)
}

/// Deletes the entries (of `pid`, or of everyone) with ids up to `last`.
fn delete_through(tx: &Transaction<'_>, pid: Option<u64>, last: u64) -> rusqlite::Result<()> {
    match pid {
        Some(pid) => tx
            .prepare_cached("DELETE FROM transcript WHERE pid = ?1 AND id <= ?2")?
            .execute((to_sql_u64(pid), to_sql_u64(last)))?,
        None => tx
            .prepare_cached("DELETE FROM transcript WHERE id <= ?1")?
            .execute([to_sql_u64(last)])?,
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use super::*;
    use crate::store::{Synchronous, schema};
    use crate::transcript::EntryKind;

    fn entry(id: u64, pid: u64, at_unix_ms: u64, text: &str) -> Entry {
        Entry {
            id,
            pid: Pid(pid),
            turn: id,
            at_unix_ms,
            trace: None,
            kind: EntryKind::Answer { text: text.into() },
        }
    }

    fn ids(conn: &Connection) -> Vec<u64> {
        let mut stmt = conn
            .prepare("SELECT id FROM transcript ORDER BY id")
            .unwrap();
        stmt.query_map([], |row| row.get::<_, i64>(0))
            .unwrap()
            .map(|id| from_sql_u64(id.unwrap()))
            .collect()
    }

    #[test]
    fn entries_older_than_the_age_limit_and_past_the_total_go_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = schema::open(&dir.path().join("t.db"), Synchronous::Normal).unwrap();
        let now = unix_ms(SystemTime::now());
        let hours = |h: u64| h * 3_600_000;
        let tx = conn.transaction().unwrap();
        for (id, at) in [
            (1, now - hours(5)),
            (2, now - hours(3)),
            (3, now - 1000),
            (4, now),
        ] {
            put(&tx, &entry(id, 2 + id % 2, at, "x")).unwrap();
        }
        tx.commit().unwrap();
        let mut tally = Tally::load(&conn).unwrap();
        let settings = Retention {
            max_age_hours: 2,
            ..Retention::default()
        };
        tally.tidy(&conn, &settings, &[]).unwrap();
        assert_eq!(ids(&conn), [3, 4]);
        assert_eq!(tally.total, 2 * entry(0, 0, 0, "x").kind.weight());

        // Past the total: the oldest go until a tenth under it.
        let big = "y".repeat(400_000);
        let tx = conn.transaction().unwrap();
        let writes: Vec<Write> = (5..9)
            .map(|id| Write::Transcript(Arc::new(entry(id, 7, now, &big))))
            .collect();
        for write in &writes {
            if let Write::Transcript(e) = write {
                put(&tx, e).unwrap();
            }
        }
        tx.commit().unwrap();
        let settings = Retention {
            max_bytes_total: 1 << 20,
            ..settings
        };
        tally.count(writes.iter(), &settings);
        tally.tidy(&conn, &settings, &[]).unwrap();
        assert_eq!(ids(&conn), [7, 8]);
        assert!(tally.total <= (1 << 20) / 10 * 9, "{}", tally.total);
    }
}
