//! What a restart reads back: counters, processes, pending messages and
//! unanswered requests, cron entries and model usage.

use std::path::Path;

use hivekernel_agents::{LlmUsage, Message, MessageId, Pid, RequestId};
use rusqlite::Connection;

use super::{Counter, StoreError, from_sql_u64, sqlite_error};

/// A process that was alive when the kernel last stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredProcess {
    /// Its PID.
    pub pid: Pid,
    /// Its parent.
    pub ppid: Pid,
    /// Its name.
    pub name: String,
    /// Its role.
    pub role: String,
    /// Its spawn request as stored (JSON), to spawn it again; `None` for a
    /// process the store knows no request of (a config agent, or one
    /// spawned before requests were kept).
    pub spec: Option<String>,
}

/// What a process's supervision and rate limits had come to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StoredHistory {
    /// Restarts so far.
    pub restarts: u32,
    /// When the restarts still in its window were decided, Unix ms, oldest first.
    pub recent_ms: Vec<u64>,
    /// A restart was decided and not yet done.
    pub pending: bool,
    /// The exit its latest restart followed.
    pub last_exit: Option<hivekernel_agents::ExitRecord>,
    /// Its `llm_calls_per_minute` bucket: level as of a Unix ms.
    pub llm_bucket: Option<(f64, u64)>,
    /// Its `spawns_per_minute` bucket.
    pub spawn_bucket: Option<(f64, u64)>,
}

/// An acknowledged message that was never delivered.
#[derive(Debug, Clone)]
pub struct StoredMessage {
    /// Its id.
    pub id: MessageId,
    /// Its receiver.
    pub to: Pid,
    /// Wall-clock expiry from its TTL, in Unix milliseconds.
    pub expires_ms: Option<u64>,
    /// The message, or why it could not be read back.
    pub message: Result<Message, String>,
}

/// A `delegate_async` request that was never answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredRequest {
    /// Its id.
    pub id: RequestId,
    /// Who asked (the answer goes to its mailbox).
    pub from: Pid,
    /// Who was asked.
    pub to: Pid,
}

/// An inbox request that was pending when the kernel stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredInbox {
    /// Its id.
    pub id: u64,
    /// The process that asked.
    pub pid: Pid,
    /// The request as JSON (`crate::inbox::InboxRequest`).
    pub request: String,
    /// The checkpoint of the turn that waits for it, when it has one.
    pub checkpoint: Option<String>,
    /// The `delegate_async` request that turn answers: its id and requester.
    pub origin: Option<(RequestId, Pid)>,
}

/// A cron entry as stored.
#[derive(Debug, Clone)]
pub struct StoredCron {
    /// Its name.
    pub name: String,
    /// Its spec, as JSON.
    pub spec: String,
    /// Who owns it.
    pub owner: Pid,
    /// `config` or `api`.
    pub source: String,
    /// When it was added.
    pub created_ms: u64,
    /// The last slot it fired for.
    pub last_fire_ms: Option<u64>,
    /// Runs so far.
    pub runs: u64,
    /// The latest runs, oldest first.
    pub history: Vec<hivekernel_agents::CronRun>,
    /// A config entry's switch by hand (`None`: as declared).
    pub switched: Option<bool>,
}

/// Everything a restarting kernel needs from the store.
#[derive(Debug, Clone, Default)]
pub struct Recovered {
    /// The next PID to hand out (never one handed out before).
    pub next_pid: u64,
    /// The next message / request id.
    pub next_id: u64,
    /// The next event sequence number.
    pub next_event_seq: u64,
    /// Every event up to this sequence number was pruned from the log (0: none).
    pub events_pruned_through: u64,
    /// The next transcript entry or turn id.
    pub next_transcript_id: u64,
    /// The epoch of this data directory's latest start as a node of a
    /// cluster; 0 when it never was one.
    pub node_epoch: u64,
    /// Processes alive at the last stop (or waiting to be restarted), parents
    /// before children.
    pub processes: Vec<StoredProcess>,
    /// Processes that had exited but were not yet collected.
    pub zombies: Vec<Pid>,
    /// The PID each config-declared agent last ran as, by name.
    pub declared: std::collections::HashMap<String, Pid>,
    /// Undelivered messages, oldest first.
    pub messages: Vec<StoredMessage>,
    /// Unanswered requests, oldest first.
    pub requests: Vec<StoredRequest>,
    /// Cron entries.
    pub cron: Vec<StoredCron>,
    /// Model usage of the processes alive at the last stop and of config
    /// agents, by PID (PID 1's is the whole kernel's).
    pub usage: std::collections::HashMap<Pid, StoredUsage>,
    /// Restart history and rate-limit buckets, by PID.
    pub history: std::collections::HashMap<Pid, StoredHistory>,
    /// Operator tokens, revoked ones included, oldest first.
    pub tokens: Vec<crate::tokens::OperatorToken>,
    /// Inbox requests still pending, oldest first.
    pub inbox: Vec<StoredInbox>,
    /// Skills processes saved, by owner and name.
    pub skills: Vec<super::StoredSkill>,
    /// Server tokens per estimated token, by served model.
    pub token_ratios: Vec<(String, hivekernel_agents::llm::calibration::Ratio)>,
}

/// Model usage of one process as the store kept it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoredUsage {
    /// Its own calls.
    pub own: LlmUsage,
    /// Its calls and every descendant's.
    pub subtree: LlmUsage,
    /// Tokens its own budget and the budgets lent from it spent (`None`:
    /// it had no budget of its own).
    pub budget_spent: Option<u64>,
}

impl Recovered {
    /// The starting value of `counter`.
    pub(crate) fn next(&self, counter: Counter) -> u64 {
        match counter {
            Counter::Pid => self.next_pid,
            Counter::Id => self.next_id,
            Counter::EventSeq => self.next_event_seq,
            Counter::EventsPrunedThrough => self.events_pruned_through,
            Counter::Transcript => self.next_transcript_id,
            Counter::NodeEpoch => self.node_epoch,
        }
    }
}

pub(super) fn load(conn: &Connection, path: &Path) -> Result<Recovered, StoreError> {
    read(conn).map_err(|err| sqlite_error(path, "cannot read back state", err))
}

fn read(conn: &Connection) -> rusqlite::Result<Recovered> {
    let counter = |key: &str| -> rusqlite::Result<u64> {
        let value: Option<i64> = conn
            .query_row("SELECT value FROM counters WHERE name = ?1", [key], |r| {
                r.get(0)
            })
            .or_else(|err| match err {
                rusqlite::Error::QueryReturnedNoRows => Ok(None),
                other => Err(other),
            })?;
        Ok(value.map_or(0, from_sql_u64))
    };
    let max = |sql: &str| -> rusqlite::Result<u64> {
        let value: Option<i64> = conn.query_row(sql, [], |r| r.get(0))?;
        Ok(value.map_or(0, from_sql_u64))
    };
    let next_pid = counter(Counter::Pid.key())?
        .max(max("SELECT max(pid) FROM processes")? + 1)
        .max(max("SELECT max(pid) FROM declared")? + 1)
        // A saved skill's owner may be long gone; its PID is never given again.
        .max(max("SELECT max(owner_pid) FROM skill_version")? + 1)
        .max(2);
    let next_id = counter(Counter::Id.key())?
        .max(max("SELECT max(id) FROM messages")? + 1)
        .max(max("SELECT max(id) FROM requests")? + 1)
        .max(max("SELECT max(id) FROM inbox")? + 1)
        .max(1);
    let next_event_seq = counter(Counter::EventSeq.key())?
        .max(max("SELECT max(seq) FROM events")? + 1)
        .max(1);

    // Turn ids come from the same counter and are below their entries' ids.
    let next_transcript_id = counter(Counter::Transcript.key())?
        .max(max("SELECT max(last_id) FROM transcript_chunk")? + 1)
        .max(1);

    let node_epoch = counter(Counter::NodeEpoch.key())?;

    // A log pruned before the mark was kept: everything below its oldest event.
    let events_pruned_through = match counter(Counter::EventsPrunedThrough.key())? {
        0 => max("SELECT min(seq) FROM events")?.saturating_sub(1),
        through => through,
    };

    // A process waiting out a restart's backoff has exited and comes back.
    const PENDING: &str =
        "EXISTS (SELECT 1 FROM process_history h WHERE h.pid = p.pid AND h.pending)";
    let mut stmt = conn.prepare(&format!(
        "SELECT p.pid, p.ppid, p.name, p.role, s.spec FROM processes p
         LEFT JOIN process_spec s ON s.pid = p.pid
         WHERE p.exit_code IS NULL OR {PENDING} ORDER BY p.pid"
    ))?;
    let processes = stmt
        .query_map([], |r| {
            Ok(StoredProcess {
                pid: Pid(from_sql_u64(r.get(0)?)),
                ppid: Pid(from_sql_u64(r.get(1)?)),
                name: r.get(2)?,
                role: r.get(3)?,
                spec: r.get(4)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;

    let mut stmt = conn.prepare(&format!(
        "SELECT pid FROM processes p WHERE exit_code IS NOT NULL AND NOT {PENDING}"
    ))?;
    let zombies = stmt
        .query_map([], |r| Ok(Pid(from_sql_u64(r.get(0)?))))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut stmt = conn.prepare("SELECT name, pid FROM declared")?;
    let declared = stmt
        .query_map([], |r| Ok((r.get(0)?, Pid(from_sql_u64(r.get(1)?)))))?
        .collect::<rusqlite::Result<_>>()?;

    let mut stmt = conn.prepare("SELECT id, to_pid, body, expires_ms FROM messages ORDER BY id")?;
    let messages = stmt
        .query_map([], |r| {
            let body: String = r.get(2)?;
            Ok(StoredMessage {
                id: MessageId(from_sql_u64(r.get(0)?)),
                to: Pid(from_sql_u64(r.get(1)?)),
                expires_ms: r.get::<_, Option<i64>>(3)?.map(from_sql_u64),
                message: serde_json::from_str(&body).map_err(|e| e.to_string()),
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;

    let mut stmt = conn.prepare("SELECT id, from_pid, to_pid FROM requests ORDER BY id")?;
    let requests = stmt
        .query_map([], |r| {
            Ok(StoredRequest {
                id: RequestId(from_sql_u64(r.get(0)?)),
                from: Pid(from_sql_u64(r.get(1)?)),
                to: Pid(from_sql_u64(r.get(2)?)),
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;

    let mut stmt = conn.prepare(
        "SELECT name, spec, owner, source, created_ms, last_fire_ms, runs, switched
         FROM cron ORDER BY name",
    )?;
    let mut cron = stmt
        .query_map([], |r| {
            Ok(StoredCron {
                name: r.get(0)?,
                spec: r.get(1)?,
                owner: Pid(from_sql_u64(r.get(2)?)),
                source: r.get(3)?,
                created_ms: from_sql_u64(r.get(4)?),
                last_fire_ms: r.get::<_, Option<i64>>(5)?.map(from_sql_u64),
                runs: from_sql_u64(r.get(6)?),
                history: Vec::new(),
                switched: r.get::<_, Option<i64>>(7)?.map(|on| on != 0),
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut stmt = conn.prepare(
        "SELECT at_ms, status, duration_ms, output FROM cron_runs WHERE name = ?1 ORDER BY id",
    )?;
    for entry in &mut cron {
        entry.history = stmt
            .query_map([&entry.name], |r| {
                Ok(hivekernel_agents::CronRun {
                    at_unix_ms: from_sql_u64(r.get(0)?),
                    status: r.get(1)?,
                    duration_ms: from_sql_u64(r.get(2)?),
                    output: r.get(3)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
    }

    let mut stmt = conn.prepare(
        "SELECT pid, calls, prompt_tokens, completion_tokens, cost_nano_usd, subtree_calls,
                subtree_prompt_tokens, subtree_completion_tokens, subtree_cost_nano_usd,
                budget_spent
         FROM usage",
    )?;
    let usage = stmt
        .query_map([], |r| {
            let at = |i| r.get::<_, i64>(i).map(from_sql_u64);
            let counts = |first: usize| -> rusqlite::Result<LlmUsage> {
                Ok(LlmUsage {
                    calls: at(first)?,
                    prompt_tokens: at(first + 1)?,
                    completion_tokens: at(first + 2)?,
                    cost_nano_usd: at(first + 3)?,
                })
            };
            let kept = StoredUsage {
                own: counts(1)?,
                subtree: counts(5)?,
                budget_spent: r.get::<_, Option<i64>>(9)?.map(from_sql_u64),
            };
            Ok((Pid(from_sql_u64(r.get(0)?)), kept))
        })?
        .collect::<rusqlite::Result<_>>()?;

    let mut stmt = conn.prepare(
        "SELECT pid, restarts, recent, pending, llm_bucket, spawn_bucket, last_exit
         FROM process_history",
    )?;
    let history = stmt
        .query_map([], |r| {
            let pid = Pid(from_sql_u64(r.get(0)?));
            let recent: Option<String> = r.get(2)?;
            let bucket = |i| -> rusqlite::Result<Option<(f64, u64)>> {
                let text: Option<String> = r.get(i)?;
                Ok(text.and_then(|t| serde_json::from_str(&t).ok()))
            };
            let kept = StoredHistory {
                restarts: u32::try_from(r.get::<_, i64>(1)?).unwrap_or(0),
                recent_ms: recent
                    .and_then(|t| serde_json::from_str(&t).ok())
                    .unwrap_or_default(),
                pending: r.get(3)?,
                llm_bucket: bucket(4)?,
                spawn_bucket: bucket(5)?,
                last_exit: r
                    .get::<_, Option<String>>(6)?
                    .and_then(|t| serde_json::from_str(&t).ok()),
            };
            Ok((pid, kept))
        })?
        .collect::<rusqlite::Result<_>>()?;

    let mut stmt = conn.prepare(
        "SELECT id, name, scope, hash, created_ms, expires_ms, revoked_ms
         FROM operator_token ORDER BY id",
    )?;
    let tokens = stmt
        .query_map([], |r| {
            let scope: String = r.get(2)?;
            let Ok(scope) = scope.parse() else {
                return Ok(None);
            };
            Ok(Some(crate::tokens::OperatorToken {
                id: from_sql_u64(r.get(0)?),
                name: r.get(1)?,
                scope,
                hash: r.get(3)?,
                created_ms: from_sql_u64(r.get(4)?),
                expires_ms: r.get::<_, Option<i64>>(5)?.map(from_sql_u64),
                revoked_ms: r.get::<_, Option<i64>>(6)?.map(from_sql_u64),
            }))
        })?
        // A row this build cannot read (a scope it does not know) grants nothing.
        .filter_map(Result::transpose)
        .collect::<rusqlite::Result<_>>()?;

    let mut stmt = conn.prepare(
        "SELECT id, pid, request, checkpoint, origin_id, origin_from FROM inbox ORDER BY id",
    )?;
    let inbox = stmt
        .query_map([], |r| {
            let origin = match (r.get::<_, Option<i64>>(4)?, r.get::<_, Option<i64>>(5)?) {
                (Some(id), Some(from)) => {
                    Some((RequestId(from_sql_u64(id)), Pid(from_sql_u64(from))))
                }
                _ => None,
            };
            Ok(StoredInbox {
                id: from_sql_u64(r.get(0)?),
                pid: Pid(from_sql_u64(r.get(1)?)),
                request: r.get(2)?,
                checkpoint: r.get(3)?,
                origin,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;

    Ok(Recovered {
        next_pid,
        next_id,
        next_event_seq,
        events_pruned_through,
        next_transcript_id,
        node_epoch,
        processes,
        zombies,
        declared,
        messages,
        requests,
        cron,
        usage,
        history,
        tokens,
        inbox,
        skills: super::skills::all(conn)?,
        token_ratios: token_ratios(conn)?,
    })
}

/// The token ratios learned so far.
fn token_ratios(
    conn: &rusqlite::Connection,
) -> rusqlite::Result<Vec<(String, hivekernel_agents::llm::calibration::Ratio)>> {
    let mut stmt = conn.prepare("SELECT model, ratio, samples FROM token_ratio ORDER BY model")?;
    stmt.query_map([], |row| {
        let ratio = hivekernel_agents::llm::calibration::Ratio {
            ratio: row.get(1)?,
            samples: from_sql_u64(row.get(2)?),
        };
        Ok((row.get::<_, String>(0)?, ratio))
    })?
    .collect()
}
