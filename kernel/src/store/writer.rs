//! The writer thread: drains the queue into one transaction per batch.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use rusqlite::{Connection, Transaction};

use crate::event::{Event, EventKind};

use super::transcript::Tally;
use super::{
    Applied, BucketKind, Counter, LAZY_DELAY, Op, Shared, Write, artifacts, memory, skills,
    sqlite_error, to_sql_u64, transcript,
};

/// Events written between two prunings of the event log.
const PRUNE_EVERY: u64 = 10_000;
/// Longest the writer sleeps with nothing to write.
const IDLE_WAKE: std::time::Duration = std::time::Duration::from_secs(60);
/// Free pages the file may hold before the writer gives them back.
const RECLAIM_FROM_PAGES: i64 = 256;
/// Gives back at most 8192 free pages at once (more wait for the next round).
const RECLAIM: &str = "PRAGMA incremental_vacuum(8192)";
/// Least time between two looks at the free pages, unless a batch deleted.
const RECLAIM_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs until the store is closed and its queue is empty.
pub(super) fn run(mut conn: Connection, shared: &Arc<Shared>) {
    let mut since_prune = 0u64;
    // Processes reaped since lazy writes were last taken whose transcripts
    // leave with them: their entries still queued are dropped when taken.
    let mut gone = HashSet::new();
    let mut transcripts = match Tally::load(&conn) {
        Ok(tally) => Some(tally),
        Err(err) => {
            tracing::warn!(error = %err, "store: transcript sizes unreadable; transcripts are not pruned");
            None
        }
    };
    let mut reclaimed_at = std::time::Instant::now();
    loop {
        let (ops, lazy, closed, waited) = {
            let mut queue = shared.queue.lock();
            let lazy_due = loop {
                let lazy_due = queue
                    .lazy_since
                    .is_some_and(|since| since.elapsed() >= LAZY_DELAY);
                if queue.closed || lazy_due || !queue.ops.is_empty() {
                    break lazy_due;
                }
                let sleep = match queue.lazy_since {
                    Some(since) => LAZY_DELAY.saturating_sub(since.elapsed()),
                    // Woken at least once a minute, so transcripts age out on an idle kernel too.
                    None => IDLE_WAKE,
                };
                queue.waiting = true;
                let idle = shared.wake.wait_for(&mut queue, sleep).timed_out()
                    && queue.lazy_since.is_none();
                queue.waiting = false;
                if idle {
                    break false;
                }
            };
            let ops = std::mem::take(&mut queue.ops);
            // Lazy writes are taken when they are due, or when a read
            // waits on this batch (a flush) or the store closes.
            let waited = queue.closed || ops.iter().any(|op| matches!(op.write, Write::Flush));
            let lazy = (waited || lazy_due).then(|| {
                queue.lazy_since = None;
                std::mem::take(&mut queue.lazy)
            });
            (ops, lazy, queue.closed, waited)
        };
        let settings = *shared.transcripts.lock();
        gone.extend(transcript::gone(&conn, &ops, &settings));
        let lazy: Vec<Op> = match lazy {
            Some(lazy) => {
                let kept = lazy
                    .into_iter()
                    .filter(|write| !transcript::of_gone(write, &gone))
                    .map(|write| Op { write, ack: None })
                    .collect();
                // Reaped processes record nothing more.
                gone.clear();
                kept
            }
            None => Vec::new(),
        };
        // Waited on, lazy writes go first, in the order queued, in the
        // batch; otherwise after it, in a transaction of their own, so no
        // waiter waits for them.
        let batches = match waited {
            true => [lazy.into_iter().chain(ops).collect(), Vec::new()],
            false => [ops, lazy],
        };
        let mut reaped = Vec::new();
        let mut deleted = false;
        for ops in batches.into_iter().filter(|ops| !ops.is_empty()) {
            deleted |= ops.iter().any(|op| frees(&op.write));
            if let Some(tally) = &mut transcripts {
                reaped.extend(tally.count(ops.iter().map(|op| &op.write), &settings));
            }
            since_prune += ops
                .iter()
                .filter(|op| matches!(op.write, Write::Event(_)))
                .count() as u64;
            commit_batch(&mut conn, shared, ops);
        }
        if since_prune >= PRUNE_EVERY {
            since_prune = 0;
            prune_events(&conn, shared);
        }
        if let Some(tally) = &mut transcripts
            && let Err(err) = tally.tidy(&conn, &settings, &reaped)
        {
            tracing::warn!(error = %err, "store: transcripts not pruned");
        }
        if deleted || reclaimed_at.elapsed() >= RECLAIM_EVERY {
            reclaimed_at = std::time::Instant::now();
            if let Err(err) = reclaim(&conn) {
                tracing::warn!(error = %err, "store: free space not given back");
            }
        }
        if closed && {
            let queue = shared.queue.lock();
            queue.ops.is_empty() && queue.lazy.is_empty()
        } {
            break;
        }
    }
    // Fold the WAL back into the database so a stopped kernel leaves one file.
    if let Err(err) = conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)") {
        tracing::warn!(error = %err, "store: checkpoint at close failed");
    }
}

/// Whether `write` deletes data whose space should go back soon.
fn frees(write: &Write) -> bool {
    match write {
        Write::ArtifactDeleted(_) | Write::MemoryForget { .. } => true,
        Write::Skill(put) => put.content.is_none(),
        _ => false,
    }
}

/// Gives the file's free pages back to the file system once there are
/// enough of them: `incremental_vacuum` moves them to the end and cuts
/// them off, and a checkpoint carries the cut into the file itself.
fn reclaim(conn: &Connection) -> rusqlite::Result<()> {
    let free: i64 = conn.query_row("PRAGMA freelist_count", [], |row| row.get(0))?;
    if free < RECLAIM_FROM_PAGES {
        return Ok(());
    }
    // The pragma frees a page per step: stepped to its end.
    let mut vacuum = conn.prepare_cached(RECLAIM)?;
    let mut steps = vacuum.query([])?;
    while steps.next()?.is_some() {}
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
}

/// Deletes the events older than the newest `event_log_limit`.
fn prune_events(conn: &Connection, shared: &Shared) {
    let limit = shared.event_log_limit.load(Ordering::Relaxed);
    let newest = shared.persisted_event_seq.load(Ordering::Acquire);
    let Some(first_kept) = newest.checked_sub(limit) else {
        return;
    };
    // The pruning and its mark commit together, so a replay can say what it missed.
    let pruned = conn.unchecked_transaction().and_then(|tx| {
        tx.prepare_cached("DELETE FROM events WHERE seq <= ?1")?
            .execute([to_sql_u64(first_kept)])?;
        tx.prepare_cached(
            "INSERT INTO counters (name, value) VALUES (?1, ?2)
             ON CONFLICT (name) DO UPDATE SET value = max(value, excluded.value)",
        )?
        .execute((Counter::EventsPrunedThrough.key(), to_sql_u64(first_kept)))?;
        tx.commit()
    });
    match pruned {
        Ok(()) => {
            shared
                .events_pruned_through
                .fetch_max(first_kept, Ordering::AcqRel);
        }
        Err(err) => {
            tracing::warn!(error = %err, "store: old events not pruned");
        }
    }
}

/// Writes `ops` in one transaction and answers every waiter.
fn commit_batch(conn: &mut Connection, shared: &Shared, ops: Vec<Op>) {
    let timer = shared.commit_seconds.get().map(|h| h.start_timer());
    let result = conn
        .transaction()
        .and_then(|tx| {
            let mut applied = Vec::with_capacity(ops.len());
            let mut entries = Vec::new();
            for op in &ops {
                applied.push(match &op.write {
                    // Written together below, in chunks.
                    Write::Transcript(entry) => {
                        entries.push(&**entry);
                        Applied::Done
                    }
                    write => apply(&tx, write)?,
                });
            }
            transcript::put_all(&tx, &entries)?;
            tx.commit().map(|()| applied)
        })
        .map_err(|err| sqlite_error(&shared.path, "cannot commit", err));
    drop(timer);
    if let Err(err) = &result {
        tracing::error!(error = %err, writes = ops.len(), "store: a batch was not written");
    }
    // Advanced on failure too: events that could not be written must not pin memory forever.
    let newest = ops.iter().rev().find_map(|op| match &op.write {
        Write::Event(event) => Some(event.seq),
        _ => None,
    });
    if let Some(seq) = newest {
        shared.persisted_event_seq.fetch_max(seq, Ordering::AcqRel);
    }
    match result {
        Ok(applied) => {
            for (op, applied) in ops.into_iter().zip(applied) {
                if let Some(ack) = op.ack {
                    let _ = ack.send(Ok(applied));
                }
            }
        }
        Err(err) => {
            for op in ops {
                if let Some(ack) = op.ack {
                    let _ = ack.send(Err(err.clone()));
                }
            }
        }
    }
}

fn apply(tx: &Transaction<'_>, write: &Write) -> rusqlite::Result<Applied> {
    match write {
        Write::Artifact(artifact) => artifacts::put(tx, artifact),
        Write::ArtifactDeleted(id) => artifacts::delete(tx, *id),
        Write::Skill(put) => skills::put(tx, put),
        Write::Memory(entry) => memory::put(tx, entry),
        Write::MemoryForget { pid, key } => memory::forget(tx, *pid, key),
        other => apply_plain(tx, other).map(|()| Applied::Done),
    }
}

/// The writes that cannot be refused.
fn apply_plain(tx: &Transaction<'_>, write: &Write) -> rusqlite::Result<()> {
    match write {
        Write::Event(event) => {
            let body = serde_json::to_string(&**event)
                .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
            tx.prepare_cached(
                "INSERT OR REPLACE INTO events (seq, at_ms, pid, type, body) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute((
                to_sql_u64(event.seq),
                to_sql_u64(event.at_unix_ms),
                to_sql_u64(event.pid.0),
                event.kind.name(),
                body,
            ))?;
            track_process(tx, event)?;
        }
        Write::Message {
            id,
            to,
            body,
            created_ms,
            expires_ms,
        } => {
            tx.prepare_cached(
                "INSERT OR IGNORE INTO messages (id, to_pid, body, created_ms, expires_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute((
                to_sql_u64(id.0),
                to_sql_u64(to.0),
                body,
                to_sql_u64(*created_ms),
                expires_ms.map(to_sql_u64),
            ))?;
        }
        Write::MessageDone(id) => {
            tx.prepare_cached("DELETE FROM messages WHERE id = ?1")?
                .execute([to_sql_u64(id.0)])?;
        }
        Write::Request {
            id,
            from,
            to,
            created_ms,
        } => {
            tx.prepare_cached(
                "INSERT OR IGNORE INTO requests (id, from_pid, to_pid, created_ms) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute((
                to_sql_u64(id.0),
                to_sql_u64(from.0),
                to_sql_u64(to.0),
                to_sql_u64(*created_ms),
            ))?;
        }
        Write::RequestDone(id) => {
            tx.prepare_cached("DELETE FROM requests WHERE id = ?1")?
                .execute([to_sql_u64(id.0)])?;
        }
        Write::Reserve { counter, until } => {
            tx.prepare_cached(
                "INSERT INTO counters (name, value) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET value = max(value, excluded.value)",
            )?
            .execute((counter.key(), to_sql_u64(*until)))?;
        }
        Write::Settle { counter, next } => {
            tx.prepare_cached(
                "INSERT INTO counters (name, value) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            )?
            .execute((counter.key(), to_sql_u64(*next)))?;
        }
        Write::State { pid, key, value } => match value {
            Some(value) => {
                tx.prepare_cached(
                    "INSERT INTO process_state (pid, key, value) VALUES (?1, ?2, ?3)
                     ON CONFLICT (pid, key) DO UPDATE SET value = excluded.value",
                )?
                .execute((to_sql_u64(pid.0), key, value))?;
            }
            None => {
                tx.prepare_cached("DELETE FROM process_state WHERE pid = ?1 AND key = ?2")?
                    .execute((to_sql_u64(pid.0), key))?;
            }
        },
        Write::Usage {
            pid,
            own,
            subtree,
            budget_spent,
        } => {
            tx.prepare_cached(
                "INSERT INTO usage (pid, calls, prompt_tokens, completion_tokens, cost_nano_usd,
                     subtree_calls, subtree_prompt_tokens, subtree_completion_tokens,
                     subtree_cost_nano_usd, budget_spent)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
                 ON CONFLICT (pid) DO UPDATE SET
                     calls = max(calls, excluded.calls),
                     prompt_tokens = max(prompt_tokens, excluded.prompt_tokens),
                     completion_tokens = max(completion_tokens, excluded.completion_tokens),
                     cost_nano_usd = max(cost_nano_usd, excluded.cost_nano_usd),
                     subtree_calls = max(subtree_calls, excluded.subtree_calls),
                     subtree_prompt_tokens = max(subtree_prompt_tokens, excluded.subtree_prompt_tokens),
                     subtree_completion_tokens =
                         max(subtree_completion_tokens, excluded.subtree_completion_tokens),
                     subtree_cost_nano_usd = max(subtree_cost_nano_usd, excluded.subtree_cost_nano_usd),
                     budget_spent = CASE WHEN excluded.budget_spent IS NULL THEN budget_spent
                         ELSE max(coalesce(budget_spent, 0), excluded.budget_spent) END",
            )?
            .execute((
                to_sql_u64(pid.0),
                to_sql_u64(own.calls),
                to_sql_u64(own.prompt_tokens),
                to_sql_u64(own.completion_tokens),
                to_sql_u64(own.cost_nano_usd),
                to_sql_u64(subtree.calls),
                to_sql_u64(subtree.prompt_tokens),
                to_sql_u64(subtree.completion_tokens),
                to_sql_u64(subtree.cost_nano_usd),
                budget_spent.map(to_sql_u64),
            ))?;
        }
        Write::UsageDay {
            day,
            model,
            role,
            usage,
            cost_nano_usd,
        } => super::usage::add(tx, day, model, role, *usage, *cost_nano_usd)?,
        Write::TokenRatio { model, ratio } => {
            tx.prepare_cached(
                "INSERT INTO token_ratio (model, ratio, samples, updated_ms) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (model) DO UPDATE SET ratio = excluded.ratio,
                 samples = excluded.samples, updated_ms = excluded.updated_ms",
            )?
            .execute((
                model,
                ratio.ratio,
                to_sql_u64(ratio.samples),
                to_sql_u64(crate::event::unix_ms(std::time::SystemTime::now())),
            ))?;
        }
        Write::Declared { name, pid } => {
            tx.prepare_cached(
                "INSERT INTO declared (name, pid) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET pid = excluded.pid",
            )?
            .execute((name, to_sql_u64(pid.0)))?;
        }
        Write::CronPut {
            name,
            spec,
            owner,
            source,
            created_ms,
            switched,
        } => {
            tx.prepare_cached(
                "INSERT INTO cron (name, spec, owner, source, created_ms, switched)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, owner = excluded.owner,
                 source = excluded.source, switched = excluded.switched",
            )?
            .execute((
                name,
                spec,
                to_sql_u64(owner.0),
                source,
                to_sql_u64(*created_ms),
                switched.map(i64::from),
            ))?;
        }
        Write::CronRemove(name) => {
            tx.prepare_cached("DELETE FROM cron WHERE name = ?1")?
                .execute([name])?;
            tx.prepare_cached("DELETE FROM cron_runs WHERE name = ?1")?
                .execute([name])?;
        }
        Write::CronFired { name, at_ms } => {
            tx.prepare_cached("UPDATE cron SET last_fire_ms = ?2 WHERE name = ?1")?
                .execute((name, to_sql_u64(*at_ms)))?;
        }
        Write::CronRun { name, run } => {
            tx.prepare_cached(
                "INSERT INTO cron_runs (name, at_ms, status, duration_ms, output)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute((
                name,
                to_sql_u64(run.at_unix_ms),
                &run.status,
                to_sql_u64(run.duration_ms),
                &run.output,
            ))?;
            tx.prepare_cached("UPDATE cron SET runs = runs + 1 WHERE name = ?1")?
                .execute([name])?;
            // Only the latest runs are kept.
            tx.prepare_cached(
                "DELETE FROM cron_runs WHERE name = ?1 AND id NOT IN
                 (SELECT id FROM cron_runs WHERE name = ?1 ORDER BY id DESC LIMIT ?2)",
            )?
            .execute((name, hivekernel_agents::cron::HISTORY as i64))?;
        }
        Write::Token(token) => {
            tx.prepare_cached(
                "INSERT OR REPLACE INTO operator_token
                     (id, name, scope, hash, created_ms, expires_ms, revoked_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute((
                to_sql_u64(token.id),
                &token.name,
                token.scope.as_str(),
                &token.hash,
                to_sql_u64(token.created_ms),
                token.expires_ms.map(to_sql_u64),
                token.revoked_ms.map(to_sql_u64),
            ))?;
        }
        Write::InboxPut(row) => {
            tx.prepare_cached(
                "INSERT OR REPLACE INTO inbox
                     (id, pid, request, checkpoint, origin_id, origin_from)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute((
                to_sql_u64(row.id),
                to_sql_u64(row.pid.0),
                &row.request,
                row.checkpoint.as_deref(),
                row.origin.map(|(id, _)| to_sql_u64(id.0)),
                row.origin.map(|(_, from)| to_sql_u64(from.0)),
            ))?;
        }
        Write::InboxDone(id) => {
            tx.prepare_cached("DELETE FROM inbox WHERE id = ?1")?
                .execute([to_sql_u64(*id)])?;
        }
        Write::Spec { pid, spec } => {
            tx.prepare_cached("INSERT OR REPLACE INTO process_spec (pid, spec) VALUES (?1, ?2)")?
                .execute((to_sql_u64(pid.0), spec))?;
        }
        Write::Restarts {
            pid,
            restarts,
            recent_ms,
            pending,
            last_exit,
        } => {
            let recent = serde_json::to_string(recent_ms).unwrap_or_else(|_| "[]".into());
            tx.prepare_cached(
                "INSERT INTO process_history (pid, restarts, recent, pending, last_exit)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (pid) DO UPDATE SET restarts = excluded.restarts,
                     recent = excluded.recent, pending = excluded.pending,
                     last_exit = excluded.last_exit",
            )?
            .execute((to_sql_u64(pid.0), restarts, recent, pending, last_exit))?;
        }
        Write::Bucket {
            pid,
            kind,
            level,
            at_ms,
        } => {
            let sql = match kind {
                BucketKind::LlmCalls => {
                    "INSERT INTO process_history (pid, llm_bucket) VALUES (?1, ?2)
                     ON CONFLICT (pid) DO UPDATE SET llm_bucket = excluded.llm_bucket"
                }
                BucketKind::Spawns => {
                    "INSERT INTO process_history (pid, spawn_bucket) VALUES (?1, ?2)
                     ON CONFLICT (pid) DO UPDATE SET spawn_bucket = excluded.spawn_bucket"
                }
            };
            let level = format!("[{level},{at_ms}]");
            tx.prepare_cached(sql)?
                .execute((to_sql_u64(pid.0), level))?;
        }
        Write::Flush => {}
        // Dispatched by `apply`.
        Write::Artifact(_)
        | Write::ArtifactDeleted(_)
        | Write::Skill(_)
        | Write::Memory(_)
        | Write::MemoryForget { .. } => {}
        // Dispatched by `commit_batch`.
        Write::Transcript(_) => {}
    }
    Ok(())
}

/// Keeps the process table in step with the events that change it, in the
/// same transaction: alive, restarting and zombie processes have a row,
/// reaped ones none.
fn track_process(tx: &Transaction<'_>, event: &Event) -> rusqlite::Result<()> {
    let pid = to_sql_u64(event.pid.0);
    match &event.kind {
        EventKind::Spawned {
            ppid, name, role, ..
        } => {
            tx.prepare_cached(
                "INSERT OR REPLACE INTO processes (pid, ppid, name, role, started_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute((
                pid,
                to_sql_u64(ppid.0),
                &**name,
                role.as_str(),
                to_sql_u64(event.at_unix_ms),
            ))?;
        }
        EventKind::Exited {
            exit_code, reason, ..
        } => {
            tx.prepare_cached(
                "UPDATE processes SET exit_code = ?2, exit_reason = ?3, exited_ms = ?4 WHERE pid = ?1",
            )?
            .execute((pid, exit_code, &**reason, to_sql_u64(event.at_unix_ms)))?;
            // A restart decided after this exit says so after it.
            tx.prepare_cached("UPDATE process_history SET pending = 0 WHERE pid = ?1 AND pending")?
                .execute([pid])?;
        }
        // A restart keeps the PID: the process is alive again.
        EventKind::Restarted { .. } => {
            tx.prepare_cached(
                "UPDATE processes SET exit_code = NULL, exit_reason = NULL, exited_ms = NULL
                 WHERE pid = ?1",
            )?
            .execute([pid])?;
        }
        EventKind::Reaped { .. } => {
            tx.prepare_cached("DELETE FROM processes WHERE pid = ?1")?
                .execute([pid])?;
            tx.prepare_cached("DELETE FROM process_spec WHERE pid = ?1")?
                .execute([pid])?;
            // A PID is never reused, so its state, usage, history and memory
            // are dead weight, unless a config agent comes back as it.
            for sql in [
                "DELETE FROM process_history WHERE pid = ?1
                 AND NOT EXISTS (SELECT 1 FROM declared WHERE declared.pid = ?1)",
                "DELETE FROM process_state WHERE pid = ?1
                 AND NOT EXISTS (SELECT 1 FROM declared WHERE declared.pid = ?1)",
                "DELETE FROM usage WHERE pid = ?1
                 AND NOT EXISTS (SELECT 1 FROM declared WHERE declared.pid = ?1)",
                // Memory is recalled only by its own PID: nobody can reach it now.
                "DELETE FROM memory WHERE pid = ?1
                 AND NOT EXISTS (SELECT 1 FROM declared WHERE declared.pid = ?1)",
            ] {
                tx.prepare_cached(sql)?.execute([pid])?;
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use hivekernel_agents::{LlmUsage, Pid};

    use super::*;
    use crate::store::{Synchronous, recover, schema};

    fn counts(calls: u64) -> LlmUsage {
        LlmUsage {
            calls,
            prompt_tokens: 10 * calls,
            completion_tokens: calls,
            cost_nano_usd: 100 * calls,
        }
    }

    #[test]
    fn an_older_usage_snapshot_never_lowers_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hivekernel.db");
        let mut conn = schema::open(&path, Synchronous::Normal).unwrap();
        let usage = |calls, subtree, budget_spent| Write::Usage {
            pid: Pid(7),
            own: counts(calls),
            subtree: counts(subtree),
            budget_spent,
        };
        // Two calls charged at once can reach the queue newest first.
        let tx = conn.transaction().unwrap();
        for write in [
            usage(2, 5, Some(70)),
            usage(1, 6, Some(40)),
            usage(0, 0, None),
        ] {
            apply_plain(&tx, &write).unwrap();
        }
        tx.commit().unwrap();
        let kept = recover::load(&conn, &path).unwrap().usage[&Pid(7)];
        assert_eq!(kept.own, counts(2));
        assert_eq!(kept.subtree, counts(6));
        assert_eq!(kept.budget_spent, Some(70));
    }
}
