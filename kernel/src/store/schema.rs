//! Opening the database and migrating its schema.
//!
//! The schema version is SQLite's `user_version`. Each migration runs in its
//! own transaction together with the version bump, so a crash mid-migration
//! leaves the previous version intact. Migrations are only ever appended.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::{StoreError, Synchronous, sqlite_error};

/// Migrations in order; `MIGRATIONS[i]` takes the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
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
    // 2: cron entries and their run history.
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
];

/// The schema version this build writes.
pub(crate) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Opens the write connection: WAL, the chosen `synchronous`, migrated.
pub(super) fn open(path: &Path, synchronous: Synchronous) -> Result<Connection, StoreError> {
    let err = |what| move |e| sqlite_error(path, what, e);
    let mut conn = Connection::open(path).map_err(err("cannot open"))?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(err("cannot set busy_timeout"))?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .map_err(err("cannot switch to WAL"))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Sqlite {
            path: path.display().to_string(),
            what: "cannot switch to WAL",
            message: format!("journal_mode is {mode}"),
        });
    }
    conn.pragma_update(None, "synchronous", synchronous.pragma())
        .map_err(err("cannot set synchronous"))?;
    migrate(&mut conn, path)?;
    Ok(conn)
}

/// Opens a read-only connection to an already migrated database.
pub(super) fn open_reader(path: &Path) -> Result<Connection, StoreError> {
    let err = |what| move |e| sqlite_error(path, what, e);
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(err("cannot open for reading"))?;
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
    for (version, sql) in MIGRATIONS.iter().enumerate().skip(found.max(0) as usize) {
        let tx = conn.transaction().map_err(err("cannot migrate"))?;
        tx.execute_batch(sql).map_err(err("cannot migrate"))?;
        tx.pragma_update(None, "user_version", version as i64 + 1)
            .map_err(err("cannot migrate"))?;
        tx.commit().map_err(err("cannot migrate"))?;
    }
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
