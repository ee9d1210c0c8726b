//! Opening the database and migrating its schema.
//!
//! The schema version is SQLite's `user_version`. Pending migrations run in
//! one transaction together with the version bump, so a crash mid-migration
//! leaves the previous version intact. Migrations are only ever appended.
//!
//! A new database is built beside its final name and renamed into place
//! (see [`create`]), so it appears whole, in WAL mode, at the latest version.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::{StoreError, Synchronous, sqlite_error};

/// Migrations in order; `MIGRATIONS[i]` takes the schema from version `i` to `i + 1`.
pub(super) const MIGRATIONS: &[&str] = &[
    // 1: counters, events, processes, config agents' PIDs, pending messages and
    // requests, process state.
    "CREATE TABLE counters (
         name  TEXT PRIMARY KEY,
         value INTEGER NOT NULL
     ) STRICT;
     CREATE TABLE events (
         seq   INTEGER PRIMARY KEY,
         at_ms INTEGER NOT NULL,
         pid   INTEGER NOT NULL,
         type  TEXT NOT NULL,
         body  TEXT NOT NULL
     ) STRICT;
     CREATE TABLE processes (
         pid         INTEGER PRIMARY KEY,
         ppid        INTEGER NOT NULL,
         name        TEXT NOT NULL,
         role        TEXT NOT NULL,
         started_ms  INTEGER NOT NULL,
         exit_code   INTEGER,
         exit_reason TEXT,
         exited_ms   INTEGER
     ) STRICT;
     CREATE TABLE messages (
         id         INTEGER PRIMARY KEY,
         to_pid     INTEGER NOT NULL,
         body       TEXT NOT NULL,
         created_ms INTEGER NOT NULL,
         expires_ms INTEGER
     ) STRICT;
     CREATE TABLE requests (
         id         INTEGER PRIMARY KEY,
         from_pid   INTEGER NOT NULL,
         to_pid     INTEGER NOT NULL,
         created_ms INTEGER NOT NULL
     ) STRICT;
     CREATE TABLE declared (
         name TEXT PRIMARY KEY,
         pid  INTEGER NOT NULL
     ) STRICT;
     CREATE TABLE process_state (
         pid   INTEGER NOT NULL,
         key   TEXT NOT NULL,
         value TEXT NOT NULL,
         PRIMARY KEY (pid, key)
     ) STRICT;",
    // 2: artifacts; agent memory with its full-text index. `lineage` is the
    // owner's PID path from PID 1, `/1/.../owner/`, recorded at store time
    // (a parent never changes), so subtree visibility outlives the owner.
    "CREATE TABLE artifacts (
         id           INTEGER PRIMARY KEY,
         owner_pid    INTEGER NOT NULL,
         owner_name   TEXT NOT NULL,
         lineage      TEXT NOT NULL,
         name         TEXT NOT NULL,
         content_type TEXT NOT NULL,
         visibility   TEXT NOT NULL,
         size         INTEGER NOT NULL,
         content      BLOB NOT NULL,
         created_ms   INTEGER NOT NULL,
         updated_ms   INTEGER NOT NULL,
         UNIQUE (owner_pid, name)
     ) STRICT;
     CREATE TABLE memory (
         id         INTEGER PRIMARY KEY,
         pid        INTEGER NOT NULL,
         key        TEXT,
         text       TEXT NOT NULL,
         tags       TEXT NOT NULL,
         size       INTEGER NOT NULL,
         created_ms INTEGER NOT NULL,
         updated_ms INTEGER NOT NULL
     ) STRICT;
     CREATE INDEX memory_by_pid ON memory (pid, updated_ms);
     CREATE UNIQUE INDEX memory_by_key ON memory (pid, key) WHERE key IS NOT NULL;
     CREATE VIRTUAL TABLE memory_fts USING fts5(
         text, tags, content = 'memory', content_rowid = 'id',
         tokenize = 'porter unicode61 remove_diacritics 2'
     );
     CREATE TRIGGER memory_fts_insert AFTER INSERT ON memory BEGIN
         INSERT INTO memory_fts (rowid, text, tags) VALUES (new.id, new.text, new.tags);
     END;
     CREATE TRIGGER memory_fts_delete AFTER DELETE ON memory BEGIN
         INSERT INTO memory_fts (memory_fts, rowid, text, tags)
         VALUES ('delete', old.id, old.text, old.tags);
     END;
     CREATE TRIGGER memory_fts_update AFTER UPDATE ON memory BEGIN
         INSERT INTO memory_fts (memory_fts, rowid, text, tags)
         VALUES ('delete', old.id, old.text, old.tags);
         INSERT INTO memory_fts (rowid, text, tags) VALUES (new.id, new.text, new.tags);
     END;",
    // 3: cron entries and their run history.
    "CREATE TABLE cron (
         name         TEXT PRIMARY KEY,
         spec         TEXT NOT NULL,
         owner        INTEGER NOT NULL,
         source       TEXT NOT NULL,
         created_ms   INTEGER NOT NULL,
         last_fire_ms INTEGER,
         runs         INTEGER NOT NULL DEFAULT 0
     ) STRICT;
     CREATE TABLE cron_runs (
         id          INTEGER PRIMARY KEY,
         name        TEXT NOT NULL,
         at_ms       INTEGER NOT NULL,
         status      TEXT NOT NULL,
         duration_ms INTEGER NOT NULL,
         output      TEXT NOT NULL
     ) STRICT;
     CREATE INDEX cron_runs_by_name ON cron_runs (name, id);",
    // 4: model usage of live processes and config agents (which come back
    // after a restart with their usage and what their own budget has spent;
    // `budget_spent` is NULL for a process without a budget of its own).
    "CREATE TABLE usage (
         pid                       INTEGER PRIMARY KEY,
         calls                     INTEGER NOT NULL,
         prompt_tokens             INTEGER NOT NULL,
         completion_tokens         INTEGER NOT NULL,
         cost_nano_usd             INTEGER NOT NULL,
         subtree_calls             INTEGER NOT NULL,
         subtree_prompt_tokens     INTEGER NOT NULL,
         subtree_completion_tokens INTEGER NOT NULL,
         subtree_cost_nano_usd     INTEGER NOT NULL,
         budget_spent              INTEGER
     ) STRICT;",
    // 5: transcripts. `body` is the entry's JSON; `bytes` what retention counts.
    "CREATE TABLE transcript (
         id    INTEGER PRIMARY KEY,
         pid   INTEGER NOT NULL,
         turn  INTEGER NOT NULL,
         at_ms INTEGER NOT NULL,
         type  TEXT NOT NULL,
         bytes INTEGER NOT NULL,
         body  TEXT NOT NULL
     ) STRICT;
     CREATE INDEX transcript_by_pid ON transcript (pid, id);",
    // 6: transcripts in chunks. A row holds a run of one process's entries
    // written in the same batch, as a JSON array, so a turn's four or five
    // entries cost one row rather than one each. `last_turn` and `last_ms`
    // are the largest of its entries; `bytes` what retention counts.
    "CREATE TABLE transcript_chunk (
         first_id  INTEGER PRIMARY KEY,
         last_id   INTEGER NOT NULL,
         pid       INTEGER NOT NULL,
         last_turn INTEGER NOT NULL,
         last_ms   INTEGER NOT NULL,
         bytes     INTEGER NOT NULL,
         body      TEXT NOT NULL
     ) STRICT;
     CREATE INDEX transcript_chunk_by_pid ON transcript_chunk (pid, first_id);
     INSERT INTO transcript_chunk (first_id, last_id, pid, last_turn, last_ms, bytes, body)
         SELECT id, id, pid, turn, at_ms, bytes, '[' || body || ']' FROM transcript;
     DROP TABLE transcript;",
    // 7: what brings every process back after a restart. `spec` is the
    // process's spawn request as JSON (with its exec command and workspace);
    // `process_history` its restart count, the restarts still in its window
    // (Unix ms, JSON array), whether a decided restart is still pending (it
    // waits out its backoff; a zombie row that comes back) and its
    // rate-limit buckets (`[level, at_ms]`), kept for config agents too,
    // which come back as the same PID.
    "CREATE TABLE process_spec (
         pid  INTEGER PRIMARY KEY,
         spec TEXT NOT NULL
     ) STRICT;
     CREATE TABLE process_history (
         pid          INTEGER PRIMARY KEY,
         restarts     INTEGER NOT NULL DEFAULT 0,
         recent       TEXT,
         pending      INTEGER NOT NULL DEFAULT 0,
         last_exit    TEXT,
         llm_bucket   TEXT,
         spawn_bucket TEXT
     ) STRICT;",
    // 8: operator tokens (`hivekernel token create`). Only the SHA-256 of a
    // token's secret is kept; revoked tokens stay, so ids are never reused
    // and `token ls -a` shows who had access.
    "CREATE TABLE operator_token (
         id         INTEGER PRIMARY KEY,
         name       TEXT NOT NULL,
         scope      TEXT NOT NULL,
         hash       TEXT NOT NULL,
         created_ms INTEGER NOT NULL,
         expires_ms INTEGER,
         revoked_ms INTEGER
     ) STRICT;",
    // 9: inbox requests still pending, with the checkpoint of the turn that
    // waits for each and the `delegate_async` request that turn answers,
    // so a restart files them again and resumes their turns.
    "CREATE TABLE inbox (
         id          INTEGER PRIMARY KEY,
         pid         INTEGER NOT NULL,
         request     TEXT NOT NULL,
         checkpoint  TEXT,
         origin_id   INTEGER,
         origin_from INTEGER
     ) STRICT;",
    // 10: model usage over time, summed per UTC day, model and role as
    // calls are charged (`hivekernel usage --by model|day|role`).
    "CREATE TABLE usage_daily (
         day               TEXT NOT NULL,
         model             TEXT NOT NULL,
         role              TEXT NOT NULL,
         calls             INTEGER NOT NULL,
         prompt_tokens     INTEGER NOT NULL,
         completion_tokens INTEGER NOT NULL,
         cost_nano_usd     INTEGER NOT NULL,
         PRIMARY KEY (day, model, role)
     ) STRICT, WITHOUT ROWID;",
    // 11: a config cron entry enabled or disabled by hand (`hivekernel cron
    // enable|disable`): 1 or 0, kept until the config changes the entry;
    // NULL: as declared.
    "ALTER TABLE cron ADD COLUMN switched INTEGER;",
    // 12: skills processes saved (`skill_manage`), one row per owner and
    // name, and their versions (`skills history`): every create, edit and
    // delete, with who made it and the text as of it (NULL for a delete).
    // `lineage` is the owner's PID path, as for artifacts.
    "CREATE TABLE skill (
         owner_pid  INTEGER NOT NULL,
         name       TEXT NOT NULL,
         owner_name TEXT NOT NULL,
         lineage    TEXT NOT NULL,
         visibility TEXT NOT NULL,
         version    INTEGER NOT NULL,
         content    TEXT NOT NULL,
         created_ms INTEGER NOT NULL,
         updated_ms INTEGER NOT NULL,
         PRIMARY KEY (owner_pid, name)
     ) STRICT;
     CREATE TABLE skill_version (
         owner_pid  INTEGER NOT NULL,
         name       TEXT NOT NULL,
         version    INTEGER NOT NULL,
         owner_name TEXT NOT NULL,
         action     TEXT NOT NULL,
         by_pid     INTEGER NOT NULL,
         by_name    TEXT NOT NULL,
         visibility TEXT NOT NULL,
         reason     TEXT,
         content    TEXT,
         at_ms      INTEGER NOT NULL,
         PRIMARY KEY (owner_pid, name, version)
     ) STRICT;",
    // 13: server tokens per estimated token, per served model, learned from
    // the usage model answers report (token estimates calibrated).
    "CREATE TABLE token_ratio (
         model      TEXT PRIMARY KEY,
         ratio      REAL NOT NULL,
         samples    INTEGER NOT NULL,
         updated_ms INTEGER NOT NULL
     ) STRICT;",
    // 14: storage quotas per subtree: every kind they cover knows its
    // owner's line, indexed so a subtree's bytes are one range scan per
    // table. Memory stored before has no line (it counts toward the
    // store's ceiling only until rewritten); a skill's history takes the
    // line of its owner's skills.
    "ALTER TABLE memory ADD COLUMN lineage TEXT NOT NULL DEFAULT '';
     ALTER TABLE skill_version ADD COLUMN lineage TEXT NOT NULL DEFAULT '';
     UPDATE skill_version SET lineage = COALESCE(
         (SELECT s.lineage FROM skill s WHERE s.owner_pid = skill_version.owner_pid LIMIT 1), '');
     CREATE INDEX artifacts_by_lineage ON artifacts (lineage, size);
     CREATE INDEX memory_by_lineage ON memory (lineage, size);
     CREATE INDEX skill_by_lineage ON skill (lineage);
     CREATE INDEX skill_version_by_lineage ON skill_version (lineage);",
];

/// The schema version this build writes.
pub(crate) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Statements a connection keeps prepared. More than the writer and the
/// reader each use, so a batch never prepares one again: with fewer, a
/// batch that touches many tables (an event, usage up the tree, a
/// transcript) evicts statements the next batch needs.
const STATEMENT_CACHE: usize = 128;

/// Opens the write connection: WAL, the chosen `synchronous`, migrated.
/// Creates the database first when there is none.
pub(super) fn open(path: &Path, synchronous: Synchronous) -> Result<Connection, StoreError> {
    let err = |what| move |e| sqlite_error(path, what, e);
    match std::fs::symlink_metadata(path) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => create(path)?,
        Err(e) => return Err(io_error(path, "cannot open", &e)),
    }
    let mut conn = Connection::open(path).map_err(err("cannot open"))?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(err("cannot set busy_timeout"))?;
    switch_to_wal(&conn, path)?;
    conn.pragma_update(None, "synchronous", synchronous.pragma())
        .map_err(err("cannot set synchronous"))?;
    migrate(&mut conn, path)?;
    reclaimable(&conn, path)?;
    Ok(conn)
}

/// Makes the file give back the space of deleted rows
/// (`auto_vacuum = INCREMENTAL`; the writer runs `incremental_vacuum`). A
/// database made before that is rebuilt once, here, with `VACUUM`.
fn reclaimable(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let err = |what| move |e| sqlite_error(path, what, e);
    let mode: i64 = conn
        .query_row("PRAGMA auto_vacuum", [], |row| row.get(0))
        .map_err(err("cannot read auto_vacuum"))?;
    if mode == AUTO_VACUUM_INCREMENTAL {
        return Ok(());
    }
    tracing::info!(path = %path.display(), "store: rebuilding the database once so deleted data gives its space back");
    conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL; VACUUM;")
        .map_err(err("cannot switch to incremental vacuum"))
}

/// `PRAGMA auto_vacuum`'s value for `INCREMENTAL`.
const AUTO_VACUUM_INCREMENTAL: i64 = 2;

/// Creates the database at `path`, whole or not at all, on the cold-start
/// path of every new data directory.
///
/// Written the usual way, a new database costs a rollback journal for the
/// switch to WAL and then the WAL's own header: seven fsyncs. Here it is
/// built under `<path>.new` with no journal and no syncing, switched to WAL,
/// closed, then synced once and renamed into place, with the directory synced
/// after. A crash before the rename leaves only `<path>.new`, which the next
/// start builds again; the database itself is never seen half made.
fn create(path: &Path) -> Result<(), StoreError> {
    let mut building = path.as_os_str().to_owned();
    building.push(".new");
    let building = std::path::PathBuf::from(building);
    // What a crash mid-build left behind; a stale WAL would be replayed into the new file.
    for suffix in ["", "-journal", "-wal", "-shm"] {
        let mut stale = building.as_os_str().to_owned();
        stale.push(suffix);
        match std::fs::remove_file(&stale) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io_error(path, "cannot remove a partly built database", &e));
            }
            _ => {}
        }
    }
    let err = |what| move |e| sqlite_error(path, what, e);
    let mut conn = Connection::open(&building).map_err(err("cannot create"))?;
    // auto_vacuum holds only when set before the first table.
    conn.execute_batch(
        "PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF; PRAGMA auto_vacuum = INCREMENTAL;",
    )
    .map_err(err("cannot create"))?;
    migrate(&mut conn, path)?;
    switch_to_wal(&conn, path)?;
    conn.close()
        .map_err(|(_, e)| sqlite_error(path, "cannot create", e))?;
    let synced = std::fs::File::open(&building).and_then(|file| file.sync_all());
    synced.map_err(|e| io_error(path, "cannot sync the new database", &e))?;
    std::fs::rename(&building, path).map_err(|e| io_error(path, "cannot create", &e))?;
    // The rename is durable once the directory is.
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        let synced = std::fs::File::open(dir).and_then(|dir| dir.sync_all());
        synced.map_err(|e| io_error(path, "cannot sync the data directory", &e))?;
    }
    Ok(())
}

/// Puts the database in WAL mode (recorded in the file), or says why not.
fn switch_to_wal(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .map_err(|e| sqlite_error(path, "cannot switch to WAL", e))?;
    if mode.eq_ignore_ascii_case("wal") {
        return Ok(());
    }
    Err(StoreError::Sqlite {
        path: path.display().to_string(),
        what: "cannot switch to WAL",
        message: format!("journal_mode is {mode}"),
    })
}

fn io_error(path: &Path, what: &'static str, err: &std::io::Error) -> StoreError {
    StoreError::Sqlite {
        path: path.display().to_string(),
        what,
        message: err.to_string(),
    }
}

/// Opens a read-only connection to an already migrated database.
pub(super) fn open_reader(path: &Path) -> Result<Connection, StoreError> {
    let err = |what| move |e| sqlite_error(path, what, e);
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(err("cannot open for reading"))?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(err("cannot set busy_timeout"))?;
    Ok(conn)
}

fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let err = |what| move |e| sqlite_error(path, what, e);
    let found: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(err("cannot read the schema version"))?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::TooNew {
            path: path.display().to_string(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    if found == SCHEMA_VERSION {
        return Ok(());
    }
    // Every pending step in one transaction: a crash mid-migration leaves
    // the old version whole.
    let tx = conn.transaction().map_err(err("cannot migrate"))?;
    for sql in MIGRATIONS.iter().skip(found.max(0) as usize) {
        tx.execute_batch(sql).map_err(err("cannot migrate"))?;
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)
        .map_err(err("cannot migrate"))?;
    tx.commit().map_err(err("cannot migrate"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_database_gets_the_latest_schema_and_reopens_without_migrating() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db");
        let conn = open(&path, Synchronous::Normal).expect("open");
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .expect("version");
        assert_eq!(version, SCHEMA_VERSION);
        drop(conn);
        let conn = open(&path, Synchronous::Full).expect("reopen");
        let sync: i64 = conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .expect("sync");
        assert_eq!(sync, 2, "FULL");
    }

    #[test]
    fn a_new_database_appears_whole_in_wal_mode_and_leaves_nothing_beside_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("hivekernel.db");
        drop(open(&path, Synchronous::Normal).expect("create"));
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        assert_eq!(names, ["hivekernel.db"], "only the database itself remains");
        // WAL is recorded in the file, so a plain connection sees it.
        let conn = Connection::open(&path).expect("plain open");
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .expect("mode");
        assert_eq!(mode, "wal");
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .expect("version");
        assert_eq!(version, SCHEMA_VERSION);
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .expect("integrity");
        assert_eq!(check, "ok");
    }

    #[test]
    fn a_database_left_half_built_by_a_crash_is_built_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("hivekernel.db");
        // A build cut off mid-way: a torn file and a WAL that must not be replayed.
        std::fs::write(
            dir.path().join("hivekernel.db.new"),
            b"SQLite format 3\0torn",
        )
        .expect("torn file");
        std::fs::write(dir.path().join("hivekernel.db.new-wal"), vec![0x37; 4096])
            .expect("stale wal");
        let conn = open(&path, Synchronous::Normal).expect("build again");
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .expect("version");
        assert_eq!(version, SCHEMA_VERSION);
        conn.execute("INSERT INTO counters (name, value) VALUES ('pid', 7)", [])
            .expect("usable");
        for leftover in ["hivekernel.db.new", "hivekernel.db.new-wal"] {
            assert!(!dir.path().join(leftover).exists(), "{leftover} remains");
        }
    }

    #[test]
    fn the_bundled_sqlite_has_fts5_and_the_memory_index_follows_its_table() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = open(&dir.path().join("db"), Synchronous::Normal).expect("open");
        let fts5: bool = conn
            .query_row("SELECT sqlite_compileoption_used('ENABLE_FTS5')", [], |r| {
                r.get(0)
            })
            .expect("compile options");
        assert!(fts5, "the bundled SQLite is built without FTS5");
        let insert = "INSERT INTO memory (id, pid, text, tags, size, created_ms, updated_ms)
                      VALUES (?1, 2, ?2, '', 1, 0, 0)";
        conn.execute(insert, (1, "deploying the kernel"))
            .expect("insert");
        conn.execute(insert, (2, "apricot jam")).expect("insert");
        let hits = |conn: &Connection, query: &str| -> Vec<i64> {
            let mut stmt = conn
                .prepare("SELECT rowid FROM memory_fts WHERE memory_fts MATCH ?1 ORDER BY rank")
                .expect("prepare");
            stmt.query_map([query], |r| r.get(0))
                .expect("query")
                .collect::<Result<_, _>>()
                .expect("rows")
        };
        assert_eq!(hits(&conn, "deploy"), [1], "porter stemming");
        conn.execute("UPDATE memory SET text = 'plum jam' WHERE id = 2", [])
            .expect("update");
        assert_eq!(hits(&conn, "apricot"), Vec::<i64>::new());
        assert_eq!(hits(&conn, "plum"), [2]);
        conn.execute("DELETE FROM memory WHERE id = 2", [])
            .expect("delete");
        assert_eq!(hits(&conn, "jam"), Vec::<i64>::new());
    }

    #[test]
    fn a_database_made_before_quotas_is_rebuilt_to_give_space_back_and_keeps_its_data() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db");
        // As a kernel of schema 13 left it: no auto_vacuum, no lines on history.
        let before = SCHEMA_VERSION - 1;
        let conn = Connection::open(&path).expect("open");
        conn.execute_batch("PRAGMA journal_mode = WAL;")
            .expect("wal");
        for sql in &MIGRATIONS[..before as usize] {
            conn.execute_batch(sql).expect("old schema");
        }
        conn.pragma_update(None, "user_version", before)
            .expect("version");
        conn.execute_batch(
            "INSERT INTO skill VALUES (5, 'fill', 'lead', '/1/5/', 'subtree', 2, 'text', 0, 0);
             INSERT INTO skill_version VALUES (5, 'fill', 1, 'lead', 'create', 5, 'lead',
                                               'subtree', NULL, 'old', 0);
             INSERT INTO skill_version VALUES (9, 'gone', 1, 'w', 'delete', 9, 'w',
                                               'subtree', NULL, NULL, 0);",
        )
        .expect("rows");
        drop(conn);

        let conn = open(&path, Synchronous::Normal).expect("migrate");
        let mode: i64 = conn
            .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
            .expect("auto_vacuum");
        assert_eq!(mode, AUTO_VACUUM_INCREMENTAL);
        let lines: Vec<(i64, String)> = conn
            .prepare("SELECT owner_pid, lineage FROM skill_version ORDER BY owner_pid")
            .expect("prepare")
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        assert_eq!(lines, [(5, "/1/5/".to_owned()), (9, String::new())]);
        let memory_line: String = conn
            .query_row(
                "SELECT name FROM pragma_table_info('memory') WHERE name = 'lineage'",
                [],
                |r| r.get(0),
            )
            .expect("memory has a line");
        assert_eq!(memory_line, "lineage");
    }

    #[test]
    fn a_database_from_a_newer_kernel_is_refused_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db");
        let conn = Connection::open(&path).expect("open");
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 5)
            .expect("bump");
        drop(conn);
        let err = open(&path, Synchronous::Normal).expect_err("too new");
        let text = err.to_string();
        assert!(text.contains("newer than this kernel"), "{text}");
        assert!(text.contains(&path.display().to_string()), "{text}");
    }
}
