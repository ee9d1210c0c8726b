//! The `transcript_chunk` table: writing entries, reading a process's,
//! and keeping the table within its age and size limits.
//!
//! Entries are written in chunks: the entries of one process that one
//! batch carries (up to 64, or about 64 KiB) share a row, as a JSON array.
//! A row costs far more to write than its JSON (two B-tree inserts, the
//! page writes), so a turn's entries cost about one row, not four or five.
//! A read picks the chunks that may hold what it wants by their largest
//! id, turn and time, and filters their entries; pruning deletes whole
//! chunks, oldest first.
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
use crate::transcript::{Entry, Page, PageBuilder, Query, TailTurns};

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

/// Most entries one chunk holds.
const CHUNK_ENTRIES: usize = 64;
/// About the most bytes of JSON one chunk holds (one entry may be larger).
const CHUNK_BYTES: usize = 64 * 1024;

/// Writes `entries` (in the order recorded) as chunks: runs of one
/// process's entries, each a JSON array in one row.
pub(super) fn put_all(tx: &Transaction<'_>, entries: &[&Entry]) -> rusqlite::Result<()> {
    // Each process's entries, in order; a batch holds a few processes.
    let mut by_pid: Vec<(Pid, Vec<&Entry>)> = Vec::new();
    for &entry in entries {
        match by_pid.iter_mut().find(|(pid, _)| *pid == entry.pid) {
            Some((_, of_pid)) => of_pid.push(entry),
            None => by_pid.push((entry.pid, vec![entry])),
        }
    }
    for (_, of_pid) in by_pid {
        let mut chunk = Chunk::default();
        for entry in of_pid {
            chunk.push(entry)?;
            if chunk.count >= CHUNK_ENTRIES || chunk.body.len() >= CHUNK_BYTES {
                chunk.write(tx)?;
            }
        }
        chunk.write(tx)?;
    }
    Ok(())
}

/// A chunk being filled.
#[derive(Debug, Default)]
struct Chunk {
    count: usize,
    first_id: u64,
    last_id: u64,
    pid: u64,
    last_turn: u64,
    last_ms: u64,
    bytes: u64,
    body: Vec<u8>,
}

impl Chunk {
    fn push(&mut self, entry: &Entry) -> rusqlite::Result<()> {
        if self.count == 0 {
            self.first_id = entry.id;
            self.pid = entry.pid.0;
            self.body.push(b'[');
        } else {
            self.body.push(b',');
        }
        serde_json::to_writer(&mut self.body, entry)
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
        self.count += 1;
        self.last_id = entry.id;
        self.last_turn = self.last_turn.max(entry.turn);
        self.last_ms = self.last_ms.max(entry.at_unix_ms);
        self.bytes += entry.kind.weight();
        Ok(())
    }

    /// Writes what it holds, if anything, and starts over.
    fn write(&mut self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        if self.count == 0 {
            return Ok(());
        }
        self.body.push(b']');
        let chunk = std::mem::take(self);
        let body = String::from_utf8(chunk.body)
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
        tx.prepare_cached(
            "INSERT OR REPLACE INTO transcript_chunk
             (first_id, last_id, pid, last_turn, last_ms, bytes, body)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?
        .execute((
            to_sql_u64(chunk.first_id),
            to_sql_u64(chunk.last_id),
            to_sql_u64(chunk.pid),
            to_sql_u64(chunk.last_turn),
            to_sql_u64(chunk.last_ms),
            to_sql_u64(chunk.bytes),
            body,
        ))?;
        Ok(())
    }
}

/// The entries a chunk's body holds; one this build cannot read is
/// skipped, not fatal.
fn entries(body: &str) -> Vec<Entry> {
    serde_json::from_str::<Vec<Entry>>(body).unwrap_or_else(|_| {
        serde_json::from_str::<Vec<serde_json::Value>>(body)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|value| serde_json::from_value(value).ok())
            .collect()
    })
}

impl Store {
    /// `pid`'s stored entries matching `query`, oldest first.
    pub(crate) async fn transcript(&self, pid: Pid, query: Query) -> Result<Page, StoreError> {
        self.read("read a transcript", move |conn| {
            // The chunks that may hold a matching entry: one whose newest
            // entry is too old, or whose largest turn is too small, holds none.
            let filters = (
                to_sql_u64(pid.0),
                to_sql_u64(query.after_id),
                to_sql_u64(query.after_turn.max(query.min_turn.saturating_sub(1))),
                to_sql_u64(query.since_unix_ms),
            );
            let min_turn = match query.tail_turns {
                Some(n) => {
                    // Newest first, until no older chunk can hold a newer turn.
                    let mut tail = TailTurns::new(n);
                    let mut stmt = conn.prepare_cached(
                        "SELECT last_id, body FROM transcript_chunk
                         WHERE pid = ?1 AND last_id > ?2 AND last_turn > ?3 AND last_ms >= ?4
                         ORDER BY first_id DESC",
                    )?;
                    let mut rows = stmt.query(filters)?;
                    while let Some(row) = rows.next()? {
                        if tail.settled_before(from_sql_u64(row.get(0)?)) {
                            break;
                        }
                        let body: String = row.get(1)?;
                        for entry in entries(&body) {
                            if query.matches(&entry) {
                                tail.see(entry.turn);
                            }
                        }
                    }
                    tail.first()
                }
                None => query.min_turn,
            };
            let query = Query {
                min_turn: min_turn.max(query.min_turn),
                ..query
            };
            let mut page = PageBuilder::new(&query, min_turn);
            let mut stmt = conn.prepare_cached(
                "SELECT body FROM transcript_chunk
                 WHERE pid = ?1 AND last_id > ?2 AND last_turn > ?3 AND last_ms >= ?4
                     AND last_turn >= ?5
                 ORDER BY first_id",
            )?;
            let mut rows = stmt.query((
                filters.0,
                filters.1,
                filters.2,
                filters.3,
                to_sql_u64(min_turn),
            ))?;
            'chunks: while let Some(row) = rows.next()? {
                let body: String = row.get(0)?;
                for entry in entries(&body) {
                    if query.matches(&entry) && !page.push(entry) {
                        break 'chunks;
                    }
                }
            }
            Ok(page.finish())
        })
        .await
    }
}

/// The processes `ops` reaps whose transcript leaves with them (unless
/// kept, or a config agent's): their entries not yet written never are,
/// so a short-lived worker's transcript never reaches the disk.
pub(super) fn gone(conn: &Connection, ops: &[Op], settings: &Retention) -> HashSet<u64> {
    if settings.keep_after_exit {
        return HashSet::new();
    }
    let declared = |pid: u64| {
        conn.prepare_cached("SELECT 1 FROM declared WHERE pid = ?1")
            .and_then(|mut stmt| stmt.exists([to_sql_u64(pid)]))
            // When in doubt, write it: the reap's deletion still applies.
            .unwrap_or(true)
    };
    ops.iter()
        .filter_map(|op| match &op.write {
            Write::Event(event) if matches!(event.kind, EventKind::Reaped { .. }) => {
                Some(event.pid.0)
            }
            _ => None,
        })
        .filter(|pid| !declared(*pid))
        .collect()
}

/// Whether `write` is an entry of one of the `gone` processes.
pub(super) fn of_gone(write: &Write, gone: &HashSet<u64>) -> bool {
    matches!(write, Write::Transcript(entry) if gone.contains(&entry.pid.0))
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
        let mut stmt = conn.prepare("SELECT pid, sum(bytes) FROM transcript_chunk GROUP BY pid")?;
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
        // Only the reaped with something stored: most short-lived workers'
        // entries were dropped before they were written.
        let forget: Vec<u64> = reaped
            .iter()
            .map(|pid| pid.0)
            .filter(|pid| !settings.keep_after_exit && self.per_pid.contains_key(pid))
            .collect();
        if !due && !over_total && over.is_empty() && forget.is_empty() {
            return Ok(());
        }
        let tx = conn.unchecked_transaction()?;
        for pid in forget {
            let deleted = tx
                .prepare_cached(
                    "DELETE FROM transcript_chunk WHERE pid = ?1
                     AND NOT EXISTS (SELECT 1 FROM declared WHERE declared.pid = ?1)",
                )?
                .execute([to_sql_u64(pid)])?;
            if deleted > 0
                && let Some(bytes) = self.per_pid.remove(&pid)
            {
                self.total = self.total.saturating_sub(bytes);
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

    /// Deletes every chunk whose entries were all recorded before
    /// `cutoff_ms`: they are the oldest ids, so the scan stops at the first
    /// younger one.
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

/// The oldest chunks (of `pid`, or of everyone), at most a step's worth,
/// as (first id, pid, bytes); with `before_ms`, only the leading run whose
/// entries were all recorded before that time.
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
                "SELECT first_id, pid, bytes, last_ms FROM transcript_chunk
                 WHERE pid = ?1 ORDER BY first_id LIMIT ?2",
            )?;
            of_pid.query((to_sql_u64(pid), PRUNE_STEP))?
        }
        None => {
            of_all = tx.prepare_cached(
                "SELECT first_id, pid, bytes, last_ms FROM transcript_chunk
                 ORDER BY first_id LIMIT ?1",
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

/// Deletes the chunks (of `pid`, or of everyone) that begin at `last` or before.
fn delete_through(tx: &Transaction<'_>, pid: Option<u64>, last: u64) -> rusqlite::Result<()> {
    match pid {
        Some(pid) => tx
            .prepare_cached("DELETE FROM transcript_chunk WHERE pid = ?1 AND first_id <= ?2")?
            .execute((to_sql_u64(pid), to_sql_u64(last)))?,
        None => tx
            .prepare_cached("DELETE FROM transcript_chunk WHERE first_id <= ?1")?
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
            .prepare("SELECT first_id FROM transcript_chunk ORDER BY first_id")
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
            put_all(&tx, &[&entry(id, 2 + id % 2, at, "x")]).unwrap();
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
                put_all(&tx, &[e]).unwrap();
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

    /// What a read of `all` must answer, computed plainly.
    fn expected(all: &[Entry], pid: u64, query: Query) -> Page {
        let matching: Vec<&Entry> = all
            .iter()
            .filter(|e| e.pid.0 == pid && query.matches(e))
            .collect();
        let min_turn = match query.tail_turns {
            Some(n) => {
                let mut turns: Vec<u64> = matching.iter().map(|e| e.turn).collect();
                turns.sort_unstable();
                turns.dedup();
                let skip = turns.len().saturating_sub(n as usize);
                turns.get(skip).copied().unwrap_or(u64::MAX)
            }
            None => query.min_turn,
        };
        let mut page = Page {
            min_turn,
            ..Page::default()
        };
        let mut bytes = 0;
        for e in matching.into_iter().filter(|e| e.turn >= min_turn) {
            if page.entries.len() >= query.limit.max(1)
                || (!page.entries.is_empty() && bytes >= query.max_bytes)
            {
                page.more = true;
                break;
            }
            bytes += e.kind.weight() as usize;
            page.entries.push(e.clone());
        }
        page
    }

    #[tokio::test]
    async fn reads_of_chunked_entries_answer_what_a_plain_filter_does() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let mut conn = schema::open(&path, Synchronous::Normal).unwrap();
        // Two processes, interleaved: pid 2 has turns of three entries,
        // pid 3 one-entry turns; some texts large enough to end a chunk early.
        let mut all = Vec::new();
        let mut turn = [0, 0];
        for id in 1..=400u64 {
            let pid = if id % 4 == 0 { 3 } else { 2 };
            let slot = (pid - 2) as usize;
            if pid == 3 || turn[slot] == 0 || id % 9 == 1 {
                turn[slot] = id;
            }
            let text = if id % 37 == 0 {
                "z".repeat(70_000)
            } else {
                format!("entry {id}")
            };
            let mut e = entry(id, pid, 1_000 + id * 10, &text);
            e.turn = turn[slot];
            all.push(e);
        }
        // Batches of uneven sizes, as the writer's would be.
        let mut rest: &[Entry] = &all;
        for size in [1, 7, 150, 2, 90, 200].iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (batch, after) = rest.split_at((*size).min(rest.len()));
            let tx = conn.transaction().unwrap();
            put_all(&tx, &batch.iter().collect::<Vec<_>>()).unwrap();
            tx.commit().unwrap();
            rest = after;
        }
        // Last, in a batch of their own: late entries of an old turn (a
        // turn's id is its first entry's, so newer chunks can hold older turns).
        let late: Vec<Entry> = (401..=406)
            .map(|id| Entry {
                turn: 3,
                ..entry(id, 2, 5_000 + id, "late")
            })
            .collect();
        let tx = conn.transaction().unwrap();
        put_all(&tx, &late.iter().collect::<Vec<_>>()).unwrap();
        tx.commit().unwrap();
        all.extend(late);
        let chunks: i64 = conn
            .query_row("SELECT count(*) FROM transcript_chunk", [], |r| r.get(0))
            .unwrap();
        assert!(
            chunks > 10 && chunks < 60,
            "{chunks} chunks for 400 entries"
        );
        drop(conn);
        let (store, _) = Store::open(&path, Synchronous::Normal).unwrap();
        let base = Query {
            limit: 10_000,
            max_bytes: usize::MAX,
            ..Query::default()
        };
        let queries = [
            base,
            Query { limit: 25, ..base },
            Query {
                after_id: 133,
                limit: 40,
                ..base
            },
            Query {
                max_bytes: 100_000,
                ..base
            },
            Query {
                after_turn: 200,
                ..base
            },
            Query {
                min_turn: 301,
                ..base
            },
            Query {
                since_unix_ms: 3_000,
                ..base
            },
            Query {
                tail_turns: Some(1),
                ..base
            },
            Query {
                tail_turns: Some(5),
                limit: 4,
                ..base
            },
            Query {
                tail_turns: Some(5),
                after_id: 390,
                ..base
            },
            Query {
                tail_turns: Some(1_000),
                ..base
            },
            Query {
                tail_turns: Some(3),
                since_unix_ms: 1_000_000,
                ..base
            },
        ];
        for pid in [2, 3, 9] {
            for query in queries {
                let got = store.transcript(Pid(pid), query).await.unwrap();
                assert_eq!(got, expected(&all, pid, query), "pid {pid}, {query:?}");
            }
        }
        store.close().await;
    }

    #[tokio::test]
    async fn a_transcript_kept_before_chunks_is_read_after_the_upgrade() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        // A version 5 database: one row per entry, its body the entry's JSON.
        let conn = Connection::open(&path).unwrap();
        for sql in &schema::MIGRATIONS[..5] {
            conn.execute_batch(sql).unwrap();
        }
        conn.pragma_update(None, "user_version", 5).unwrap();
        let mut old = Vec::new();
        for id in 1..=3u64 {
            let mut e = entry(id, 4, 1_000 + id, &format!("old {id}"));
            e.trace = Some(hivekernel_agents::TraceContext::new_root().trace_id);
            conn.execute(
                "INSERT INTO transcript (id, pid, turn, at_ms, type, bytes, body)
                 VALUES (?1, 4, ?1, ?2, 'answer', ?3, ?4)",
                (
                    id as i64,
                    e.at_unix_ms as i64,
                    e.kind.weight() as i64,
                    serde_json::to_string(&e).unwrap(),
                ),
            )
            .unwrap();
            old.push(e);
        }
        drop(conn);
        let (store, recovered) = Store::open(&path, Synchronous::Normal).unwrap();
        assert_eq!(recovered.next_transcript_id, 4);
        let page = store
            .transcript(
                Pid(4),
                Query {
                    limit: 10,
                    max_bytes: usize::MAX,
                    ..Query::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(page.entries, old);
        let tally = store.read("tally", Tally::load).await.unwrap();
        assert_eq!(tally.total, 3 * old[0].kind.weight());
        store.close().await;
    }
}
