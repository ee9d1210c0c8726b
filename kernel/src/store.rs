//! Durable state in one SQLite file: `<data_dir>/hivekernel.db`.
//!
//! One writer thread owns the write connection. Every write goes through one
//! ordered queue ([`Store::submit`] for writes nobody waits on, such as
//! events and exit records; [`Store::commit`] for writes a call acknowledges,
//! such as a message send) and the writer turns whatever has queued up into
//! one transaction, so a burst of ten thousand exits costs one commit. A
//! write is acknowledged only after its transaction has committed. Reads run
//! on a second connection under `spawn_blocking`, so no SQLite call ever
//! runs on an async worker thread.
//!
//! Durability: the database runs in WAL mode with `synchronous = NORMAL`
//! unless `kernel.store.synchronous` says `full`. With `normal`, a commit
//! survives a crash or `kill -9` of the kernel (the WAL is in the OS before
//! the commit returns); a power loss or OS crash may roll back the last
//! commits, never corrupt the file. With `full`, each commit is fsynced, so
//! a commit also survives a power loss.
//!
//! Layout: `schema` (migrations), `writer` (the writer thread), `recover`
//! (what a restart reads back), `artifacts`, `memory` and `transcript`
//! (their tables).

mod artifacts;
pub mod backup;
mod memory;
mod quota;
mod recover;
mod schema;
mod skills;
mod transcript;
pub mod usage;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hivekernel_agents::{ArtifactId, LlmUsage, MessageId, Pid, RequestId};
use parking_lot::{Condvar, Mutex};
use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::event::Event;
use crate::transcript::Entry;

pub(crate) use artifacts::{ArtifactWrite, StoredArtifact, Viewer, in_lineage, lineage};
pub(crate) use memory::MemoryWrite;
pub(crate) use quota::{Quota, SubtreeQuota};
pub use recover::{
    Recovered, StoredCron, StoredHistory, StoredInbox, StoredMessage, StoredProcess, StoredRequest,
    StoredUsage,
};
pub(crate) use skills::SkillPut;
pub use skills::StoredSkill;
pub use transcript::Retention;

/// Longest a [`Store::submit_lazy`] write waits for a batch.
pub(crate) const LAZY_DELAY: std::time::Duration = std::time::Duration::from_millis(100);

/// Events the store keeps unless told otherwise (`kernel.event_log_limit`).
pub const DEFAULT_EVENT_LOG_LIMIT: u64 = 1_000_000;

/// File name of the database inside the data directory.
pub const DB_FILE: &str = "hivekernel.db";

/// How hard a commit is pushed to disk (`kernel.synchronous`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(try_from = "String")]
pub enum Synchronous {
    /// Survives a crash of the kernel; a power loss may lose the last commits.
    #[default]
    Normal,
    /// Every commit is fsynced: survives a power loss too.
    Full,
}

impl TryFrom<String> for Synchronous {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        match text.as_str() {
            "normal" => Ok(Synchronous::Normal),
            "full" => Ok(Synchronous::Full),
            other => Err(format!(
                "unknown value {} (expected \"normal\" or \"full\")",
                hivekernel_agents::text::shown(other)
            )),
        }
    }
}

impl Synchronous {
    fn pragma(self) -> &'static str {
        match self {
            Synchronous::Normal => "NORMAL",
            Synchronous::Full => "FULL",
        }
    }
}

/// Why the store failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// SQLite refused an operation.
    #[error("store {path}: {what}: {message}")]
    Sqlite {
        /// The database file.
        path: String,
        /// What was being done.
        what: &'static str,
        /// SQLite's message.
        message: String,
    },
    /// The database was written by a newer kernel.
    #[error(
        "store {path}: schema version {found} is newer than this kernel's {supported}; \
         use a newer hivekernel or another data directory"
    )]
    TooNew {
        /// The database file.
        path: String,
        /// Version in the file.
        found: i64,
        /// Newest version this build knows.
        supported: i64,
    },
    /// The kernel keeps nothing on disk, so there is nothing to read.
    #[error("this kernel has no store")]
    InMemory,
    /// The store was closed (the kernel is stopping).
    #[error("store is closed")]
    Closed,
}

/// A named counter whose values are reserved ahead in blocks, so that a
/// value handed out before a crash is never handed out again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counter {
    Pid,
    Id,
    EventSeq,
    /// Not handed out: the newest pruned event's sequence number.
    EventsPrunedThrough,
    /// Transcript entry and turn ids.
    Transcript,
    /// Not handed out: the epoch of this data directory's latest start
    /// as a node of a cluster (0: never one).
    NodeEpoch,
}

impl Counter {
    fn key(self) -> &'static str {
        match self {
            Counter::Pid => "next_pid",
            Counter::Id => "next_id",
            Counter::EventSeq => "next_event_seq",
            Counter::EventsPrunedThrough => "events_pruned_through",
            Counter::Transcript => "next_transcript_id",
            Counter::NodeEpoch => "node_epoch",
        }
    }
}

/// One change to the database.
#[derive(Debug)]
pub(crate) enum Write {
    /// An event; `spawned`, `exited` and `reaped` also update the process table.
    Event(Arc<Event>),
    /// An acknowledged message waiting for delivery (`body` is its JSON).
    Message {
        id: MessageId,
        to: Pid,
        body: String,
        created_ms: u64,
        /// Wall-clock expiry, from its TTL.
        expires_ms: Option<u64>,
    },
    /// A message was handed to its runtime, expired or was dropped.
    MessageDone(MessageId),
    /// A `delegate_async` request waiting for its answer.
    Request {
        id: RequestId,
        from: Pid,
        to: Pid,
        created_ms: u64,
    },
    RequestDone(RequestId),
    /// Values of `counter` below `until` may be handed out.
    Reserve {
        counter: Counter,
        until: u64,
    },
    /// At a clean stop: the next value of `counter` is exactly `next`.
    Settle {
        counter: Counter,
        next: u64,
    },
    /// A process's durable value under `key` (`None` deletes it).
    State {
        pid: Pid,
        key: String,
        value: Option<String>,
    },
    /// The model usage of `pid` and of its subtree, as counted now (counts
    /// only grow: an older snapshot never overwrites a newer one).
    Usage {
        pid: Pid,
        own: LlmUsage,
        subtree: LlmUsage,
        /// What its own budget (if it has one) and the budgets lent from it spent.
        budget_spent: Option<u64>,
    },
    /// One model call's usage, added to its UTC day, model and role.
    UsageDay {
        /// `YYYY-MM-DD`.
        day: String,
        model: Arc<str>,
        role: &'static str,
        usage: hivekernel_agents::llm::Usage,
        cost_nano_usd: u64,
    },
    /// Server tokens per estimated token for served `model`, as learned so far.
    TokenRatio {
        model: String,
        ratio: hivekernel_agents::llm::calibration::Ratio,
    },
    /// How to spawn `pid` again after a restart: its spawn request as JSON.
    Spec {
        pid: Pid,
        spec: String,
    },
    /// `pid`'s restarts so far, when those still in its restart window were
    /// decided (Unix ms, oldest first), and whether one is decided and not
    /// yet done (the process waits out its backoff).
    Restarts {
        pid: Pid,
        restarts: u32,
        recent_ms: Vec<u64>,
        pending: bool,
        /// The exit its latest restart followed, as JSON.
        last_exit: Option<String>,
    },
    /// The level of one of `pid`'s rate-limit buckets as of `at_ms`.
    Bucket {
        pid: Pid,
        kind: BucketKind,
        level: f64,
        at_ms: u64,
    },
    /// A config-declared agent runs as `pid` (and comes back as it after a restart).
    Declared {
        name: String,
        pid: Pid,
    },
    /// A cron entry was added, (config) declared or switched on or off;
    /// `spec` is its JSON, `switched` a config entry's switch by hand.
    CronPut {
        name: String,
        spec: String,
        owner: Pid,
        source: &'static str,
        created_ms: u64,
        switched: Option<bool>,
    },
    CronRemove(String),
    /// A cron entry is about to run for the slot `at_ms`.
    CronFired {
        name: String,
        at_ms: u64,
    },
    /// A run (or skipped slot) of a cron entry.
    CronRun {
        name: String,
        run: hivekernel_agents::CronRun,
    },
    /// An artifact, replacing its owner's artifact of the same name, unless
    /// the owner's artifacts would pass their limit ([`Applied::Refused`]).
    Artifact(Box<ArtifactWrite>),
    /// An artifact is deleted.
    ArtifactDeleted(ArtifactId),
    /// A saved skill is created, changed or deleted, unless it changed
    /// since the version the change builds on or its owner has too many
    /// ([`Applied::Refused`]); [`Applied::Stored`] gives the new version.
    Skill(Box<SkillPut>),
    /// A memory entry, replacing the namespace's entry with the same key,
    /// unless the namespace would pass its limit ([`Applied::Refused`]).
    Memory(Box<MemoryWrite>),
    /// `pid`'s memory entry under `key` is deleted ([`Applied::Absent`]
    /// when there is none).
    MemoryForget {
        pid: Pid,
        key: String,
    },
    /// A transcript entry.
    Transcript(Arc<Entry>),
    /// An operator token, new or changed (revoked).
    Token(Box<crate::tokens::OperatorToken>),
    /// A pending inbox request.
    InboxPut(Box<StoredInbox>),
    /// An inbox request left the inbox.
    InboxDone(u64),
    /// Nothing; a barrier to wait for everything queued before it.
    Flush,
}

/// Which of a process's rate limits a [`Write::Bucket`] is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BucketKind {
    LlmCalls,
    Spawns,
}

/// What a committed write did, for the writes whose caller needs more than "committed".
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Applied {
    /// Written.
    Done,
    /// Written under `id` (a new row, or the one it replaced, first written at `created_ms`).
    Stored { id: u64, created_ms: u64 },
    /// Refused by a check inside the transaction; nothing was written, and
    /// the rest of the batch is not affected.
    Refused(String),
    /// Nothing matched what it was to change or delete; nothing changed.
    Absent,
}

type Ack = oneshot::Sender<Result<Applied, StoreError>>;

/// Whether [`Store::enqueue`] took the ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queued {
    Yes,
    /// An in-memory store: nothing to queue, nothing to wait for.
    InMemory,
    /// The store is closed: the kernel is stopping.
    Closed,
}

/// What the writer takes from the queue.
#[derive(Debug)]
struct Op {
    write: Write,
    ack: Option<Ack>,
}

#[derive(Debug, Default)]
struct Queue {
    /// Written as soon as the writer gets to them.
    ops: Vec<Op>,
    /// [`Store::submit_lazy`]'s writes: written together once the oldest has
    /// waited [`LAZY_DELAY`], or sooner with a flush.
    lazy: Vec<Write>,
    /// When the oldest write in `lazy` was queued.
    lazy_since: Option<std::time::Instant>,
    closed: bool,
    /// The writer is asleep on the condvar.
    waiting: bool,
}

#[derive(Debug)]
struct Shared {
    path: PathBuf,
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Read connection, used under `spawn_blocking` only.
    read: Mutex<Connection>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Sequence number of the newest committed event.
    persisted_event_seq: AtomicU64,
    /// Events kept in the store; older ones are pruned as new ones arrive.
    event_log_limit: AtomicU64,
    /// Every event up to this sequence number has been pruned (0: none).
    events_pruned_through: AtomicU64,
    /// What transcripts keep (set by the kernel at start).
    transcripts: Mutex<Retention>,
    /// Where the writer records how long each commit took, when the
    /// kernel keeps metrics (set by the kernel as it is built).
    commit_seconds: std::sync::OnceLock<prometheus::Histogram>,
}

/// Handle to the store; cheap to clone.
///
/// Every kernel has one. A kernel started without a data directory (tests,
/// benchmarks, embedders) has the in-memory form, [`Store::in_memory`]: it
/// keeps nothing, so writes are accepted and dropped and commits resolve at
/// once, and reads find nothing ([`StoreError::InMemory`]). This is the one
/// place where a kernel without a store behaves differently.
#[derive(Debug, Clone)]
pub struct Store {
    shared: Option<Arc<Shared>>,
}

impl Store {
    /// Opens (creating or migrating) the database at `path`, reads back what
    /// a restart needs and starts the writer thread. Blocking: call it from
    /// `spawn_blocking` or before the runtime starts.
    pub fn open(path: &Path, synchronous: Synchronous) -> Result<(Store, Recovered), StoreError> {
        let write = schema::open(path, synchronous)?;
        let recovered = recover::load(&write, path)?;
        let read = schema::open_reader(path)?;
        let shared = Arc::new(Shared {
            path: path.to_owned(),
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            read: Mutex::new(read),
            writer: Mutex::new(None),
            persisted_event_seq: AtomicU64::new(recovered.next_event_seq.saturating_sub(1)),
            event_log_limit: AtomicU64::new(DEFAULT_EVENT_LOG_LIMIT),
            events_pruned_through: AtomicU64::new(recovered.events_pruned_through),
            transcripts: Mutex::new(Retention::default()),
            commit_seconds: std::sync::OnceLock::new(),
        });
        let worker = shared.clone();
        let handle = std::thread::Builder::new()
            .name("hivekernel-store".into())
            .spawn(move || writer::run(write, &worker))
            .map_err(|err| StoreError::Sqlite {
                path: path.display().to_string(),
                what: "cannot start the writer thread",
                message: err.to_string(),
            })?;
        *shared.writer.lock() = Some(handle);
        Ok((
            Store {
                shared: Some(shared),
            },
            recovered,
        ))
    }

    /// A store that keeps nothing; see [`Store`].
    pub fn in_memory() -> Store {
        Store { shared: None }
    }

    /// Whether this store keeps what it is given (it is not [`Store::in_memory`]).
    pub fn is_durable(&self) -> bool {
        self.shared.is_some()
    }

    /// The database file; `None` in memory.
    pub fn path(&self) -> Option<&Path> {
        self.shared.as_deref().map(|shared| shared.path.as_path())
    }

    /// Keeps only the newest `limit` events (at least 1,000); older ones are
    /// pruned in the batches that add new ones.
    pub fn set_event_log_limit(&self, limit: u64) {
        if let Some(shared) = &self.shared {
            shared
                .event_log_limit
                .store(limit.max(1_000), Ordering::Relaxed);
        }
    }

    /// Prunes transcripts and keeps them after exit as `settings` say.
    pub fn set_transcript_retention(&self, settings: Retention) {
        if let Some(shared) = &self.shared {
            *shared.transcripts.lock() = settings;
        }
    }

    /// Records how long each commit takes in `histogram` from now on (the
    /// first histogram given stays).
    pub fn observe_commits(&self, histogram: prometheus::Histogram) {
        if let Some(shared) = &self.shared {
            let _ = shared.commit_seconds.set(histogram);
        }
    }

    /// Writes queued and not yet committed (0 in memory).
    pub fn queued(&self) -> usize {
        self.shared.as_deref().map_or(0, |shared| {
            let queue = shared.queue.lock();
            queue.ops.len() + queue.lazy.len()
        })
    }

    /// Every event up to this sequence number has left the log (0: none
    /// has). In memory, every event has: none can be read back.
    pub(crate) fn events_pruned_through(&self) -> u64 {
        self.shared.as_deref().map_or(u64::MAX, |shared| {
            shared.events_pruned_through.load(Ordering::Acquire)
        })
    }

    /// Sequence number of the newest event known to be committed. In
    /// memory, every event counts as committed: nothing is waited for.
    pub(crate) fn persisted_event_seq(&self) -> u64 {
        self.shared.as_deref().map_or(u64::MAX, |shared| {
            shared.persisted_event_seq.load(Ordering::Acquire)
        })
    }

    /// Queues a write nobody waits for; it commits with the next batch.
    pub(crate) fn submit(&self, write: Write) {
        self.enqueue(std::iter::once(Op { write, ack: None }));
    }

    /// Queues a write that nobody waits for and that may wait up to
    /// [`LAZY_DELAY`]: such writes (transcript entries, which come often)
    /// are committed together, so they cost neither a transaction each nor
    /// time in the commits others wait for. A [`Store::flush`] commits them
    /// first, so a read always sees them; a reap drops the reaped process's
    /// entries when its transcript goes with it.
    pub(crate) fn submit_lazy(&self, write: Write) {
        let Some(shared) = &self.shared else {
            return;
        };
        let mut queue = shared.queue.lock();
        if queue.closed {
            return;
        }
        queue.lazy.push(write);
        if queue.lazy_since.is_none() {
            queue.lazy_since = Some(std::time::Instant::now());
            // Once, so the writer sets its alarm for the delay.
            if queue.waiting {
                queue.waiting = false;
                shared.wake.notify_one();
            }
        }
    }

    /// Queues several writes, in order, under one lock.
    pub(crate) fn submit_all(&self, writes: impl IntoIterator<Item = Write>) {
        self.enqueue(writes.into_iter().map(|write| Op { write, ack: None }));
    }

    /// Queues a write now, in order with everything queued before it, and
    /// returns a future that resolves once its transaction has committed.
    pub(crate) fn commit(
        &self,
        write: Write,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + use<> {
        let applied = self.commit_applied(write);
        async move { applied.await.map(drop) }
    }

    /// Queues `writes` in order under one lock, so they commit in one
    /// transaction, and resolves once it has committed.
    pub(crate) fn commit_all(
        &self,
        writes: Vec<Write>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + use<> {
        let (tx, rx) = oneshot::channel();
        let last = writes.len().saturating_sub(1);
        let mut ack = Some(tx);
        let queued = self.enqueue(writes.into_iter().enumerate().map(|(i, write)| Op {
            write,
            ack: if i == last { ack.take() } else { None },
        }));
        async move {
            match queued {
                Queued::Yes => {}
                Queued::InMemory => return Ok(()),
                Queued::Closed => return Err(StoreError::Closed),
            }
            match ack {
                // Nothing was queued: nothing to wait for.
                Some(_) => Ok(()),
                None => rx.await.unwrap_or(Err(StoreError::Closed)).map(drop),
            }
        }
    }

    /// [`Store::commit`], answering what the write did.
    pub(crate) fn commit_applied(
        &self,
        write: Write,
    ) -> impl Future<Output = Result<Applied, StoreError>> + Send + use<> {
        let (tx, rx) = oneshot::channel();
        let queued = self.enqueue(std::iter::once(Op {
            write,
            ack: Some(tx),
        }));
        async move {
            match queued {
                Queued::Yes => rx.await.unwrap_or(Err(StoreError::Closed)),
                Queued::InMemory => Ok(Applied::Done),
                Queued::Closed => Err(StoreError::Closed),
            }
        }
    }

    /// Waits until everything queued so far has committed.
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.commit(Write::Flush).await
    }

    /// Adds ops to the queue, unless the store is closed. In memory, the
    /// ops are dropped unbuilt, and with them their acknowledgements.
    fn enqueue(&self, ops: impl Iterator<Item = Op>) -> Queued {
        let Some(shared) = &self.shared else {
            return Queued::InMemory;
        };
        let mut queue = shared.queue.lock();
        if queue.closed {
            return Queued::Closed;
        }
        queue.ops.extend(ops);
        if queue.waiting {
            queue.waiting = false;
            shared.wake.notify_one();
        }
        Queued::Yes
    }

    /// Commits what is queued, stops the writer and waits for it. Later
    /// writes are refused with [`StoreError::Closed`].
    pub async fn close(&self) {
        let Some(shared) = &self.shared else {
            return;
        };
        {
            let mut queue = shared.queue.lock();
            queue.closed = true;
            shared.wake.notify_one();
        }
        let handle = shared.writer.lock().take();
        if let Some(handle) = handle {
            let _ = tokio::task::spawn_blocking(move || handle.join()).await;
        }
    }

    /// Runs `read` on the read connection off the async threads.
    pub(crate) async fn read<T, F>(&self, what: &'static str, read: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        let Some(shared) = self.shared.clone() else {
            return Err(StoreError::InMemory);
        };
        tokio::task::spawn_blocking(move || {
            let conn = shared.read.lock();
            read(&conn).map_err(|err| sqlite_error(&shared.path, what, err))
        })
        .await
        .unwrap_or(Err(StoreError::Closed))
    }

    /// Stored events with `after < seq < before`, oldest first, at most `limit`.
    pub async fn events_between(
        &self,
        after: u64,
        before: u64,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        self.read("read events", move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT body FROM events WHERE seq > ?1 AND seq < ?2 ORDER BY seq LIMIT ?3",
            )?;
            let rows = stmt.query_map(
                (to_sql_u64(after), to_sql_u64(before), limit as i64),
                |row| row.get::<_, String>(0),
            )?;
            let mut events = Vec::new();
            for body in rows {
                // A row this build cannot read is skipped, not fatal.
                if let Ok(event) = serde_json::from_str::<Event>(&body?) {
                    events.push(event);
                }
            }
            Ok(events)
        })
        .await
    }

    /// A process's durable value under `key`.
    pub(crate) async fn state(&self, pid: Pid, key: String) -> Result<Option<String>, StoreError> {
        self.read("read process state", move |conn| {
            let mut stmt =
                conn.prepare_cached("SELECT value FROM process_state WHERE pid = ?1 AND key = ?2")?;
            let mut rows = stmt.query((to_sql_u64(pid.0), key))?;
            match rows.next()? {
                Some(row) => row.get(0).map(Some),
                None => Ok(None),
            }
        })
        .await
    }
}

pub(crate) fn sqlite_error(path: &Path, what: &'static str, err: rusqlite::Error) -> StoreError {
    StoreError::Sqlite {
        path: path.display().to_string(),
        what,
        message: err.to_string(),
    }
}

/// SQLite integers are signed; kernel counters never reach 2^63.
pub(crate) fn to_sql_u64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

pub(crate) fn from_sql_u64(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}
