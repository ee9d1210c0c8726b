//! Copies of the store, for `hivekernel backup` and `hivekernel restore`.
//!
//! A copy is SQLite's `VACUUM INTO`: one read transaction on the source,
//! so the copy is the database as of one moment however hard a running
//! kernel writes meanwhile (in WAL mode a reader never blocks the writer,
//! and the writer never changes what a reader sees). The copy is written
//! beside its destination under a `.partial` name, checked
//! (`PRAGMA integrity_check`, the schema version, the kernel's tables),
//! flushed to disk and only then renamed into place, so a failed copy
//! leaves nothing that looks like a backup.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use rusqlite::{Connection, OpenFlags};

use super::schema::SCHEMA_VERSION;

/// Why a backup or restore did not happen. Nothing was changed.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// There is no store where one was expected.
    #[error("no store at {0} (is --data-dir right?)")]
    NoStore(PathBuf),
    /// The destination exists; a backup never overwrites.
    #[error("{0} exists: a backup does not overwrite; remove it or name another file")]
    Exists(PathBuf),
    /// The file is not a HiveKernel store, or not a sound one.
    #[error("{path} is not a usable HiveKernel store: {why}")]
    NotAStore {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The file was written by a newer kernel.
    #[error(
        "{path} has schema version {found}, newer than this kernel's {supported}; \
         restore it with a newer hivekernel"
    )]
    TooNew {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: i64,
        /// The newest this build knows.
        supported: i64,
    },
    /// SQLite failed.
    #[error("{path}: {what}: {message}")]
    Sqlite {
        /// The file.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// SQLite's message.
        message: String,
    },
    /// The file system failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// What a copy holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    /// Where it is.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// Its schema version.
    pub schema: i64,
    /// How long the copy and its check took.
    pub elapsed: Duration,
}

/// Copies the store at `db` to the new file `dest`, consistent as of one
/// moment, whether or not a kernel is running on it.
pub fn backup(db: &Path, dest: &Path) -> Result<Copied, BackupError> {
    let started = Instant::now();
    if !db.is_file() {
        return Err(BackupError::NoStore(db.to_owned()));
    }
    if dest.exists() {
        return Err(BackupError::Exists(dest.to_owned()));
    }
    let schema = copy_checked(db, dest, OpenFlags::SQLITE_OPEN_READ_WRITE)?;
    Ok(Copied {
        path: dest.to_owned(),
        bytes: size(dest)?,
        schema,
        elapsed: started.elapsed(),
    })
}

/// What a restore did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// The store now in place.
    pub copied: Copied,
    /// Where the store it replaced was kept, if there was one.
    pub previous: Option<PathBuf>,
}

/// Puts a copy of `src` in place as the store `db`. A store already there
/// is checkpointed (its WAL folded in) and kept beside it as
/// `<db>.before-restore-<unix seconds>`. The caller holds the data
/// directory's lock, so no kernel opens `db` meanwhile.
pub fn restore(src: &Path, db: &Path) -> Result<Restored, BackupError> {
    let started = Instant::now();
    if !src.is_file() {
        return Err(BackupError::NoStore(src.to_owned()));
    }
    // Refuse a bad source before anything in the data directory changes.
    check(src)?;
    let partial = partial_path(db);
    let schema = copy_checked(src, &partial, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let previous = match keep_previous(db) {
        Ok(previous) => previous,
        Err(err) => {
            let _ = std::fs::remove_file(&partial);
            return Err(err);
        }
    };
    std::fs::rename(&partial, db).map_err(io("cannot rename into place", db))?;
    sync_dir(db)?;
    Ok(Restored {
        copied: Copied {
            path: db.to_owned(),
            bytes: size(db)?,
            schema,
            elapsed: started.elapsed(),
        },
        previous,
    })
}

/// Copies `from` to `to` through `<to>.partial`, checks the copy, flushes
/// it and renames it into place; the copy's schema version. `from` is
/// opened with `mode`: read-write for a live store (a reader of a WAL
/// database another process writes needs its shared memory), read-only
/// for a file to restore from.
fn copy_checked(from: &Path, to: &Path, mode: OpenFlags) -> Result<i64, BackupError> {
    let partial = partial_path(to);
    let _ = std::fs::remove_file(&partial);
    let copied = vacuum_into(from, &partial, mode).and_then(|()| {
        let schema = check(&partial)?;
        std::fs::File::open(&partial)
            .and_then(|file| file.sync_all())
            .map_err(io("cannot flush", &partial))?;
        Ok(schema)
    });
    let schema = match copied {
        Ok(schema) => schema,
        Err(err) => {
            let _ = std::fs::remove_file(&partial);
            return Err(err);
        }
    };
    if partial != to {
        std::fs::rename(&partial, to).map_err(io("cannot rename into place", to))?;
        sync_dir(to)?;
    }
    Ok(schema)
}

/// `to` for a destination that is itself a `.partial` file; else
/// `<to>.partial`.
fn partial_path(to: &Path) -> PathBuf {
    if to.extension().is_some_and(|ext| ext == "partial") {
        return to.to_owned();
    }
    let mut name = to.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

fn vacuum_into(from: &Path, to: &Path, mode: OpenFlags) -> Result<(), BackupError> {
    let sqlite = |what| move |err: rusqlite::Error| sqlite_error(from, what, err);
    let conn = Connection::open_with_flags(from, mode | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .map_err(sqlite("cannot open"))?;
    // A kernel's writer holds its lock only for a commit at a time.
    conn.busy_timeout(Duration::from_secs(30))
        .map_err(sqlite("cannot set a busy timeout"))?;
    let to_text = to.to_str().ok_or_else(|| BackupError::NotAStore {
        path: to.to_owned(),
        why: "the path is not UTF-8".to_owned(),
    })?;
    conn.execute("VACUUM INTO ?1", [to_text])
        .map_err(|err| match err.sqlite_error_code() {
            Some(rusqlite::ErrorCode::NotADatabase) => BackupError::NotAStore {
                path: from.to_owned(),
                why: "not an SQLite database".to_owned(),
            },
            _ => sqlite_error(from, "cannot copy", err),
        })?;
    Ok(())
}

/// Checks that `path` is a sound store this kernel can open: its schema
/// version.
fn check(path: &Path) -> Result<i64, BackupError> {
    let not_a_store = |why: String| BackupError::NotAStore {
        path: path.to_owned(),
        why,
    };
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|err| sqlite_error(path, "cannot open", err))?;
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .map_err(|err| match err.sqlite_error_code() {
            Some(rusqlite::ErrorCode::NotADatabase) => {
                not_a_store("not an SQLite database".to_owned())
            }
            _ => sqlite_error(path, "cannot check", err),
        })?;
    if integrity != "ok" {
        return Err(not_a_store(format!("integrity check: {integrity}")));
    }
    let schema: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(|err| sqlite_error(path, "cannot read the schema version", err))?;
    if schema > SCHEMA_VERSION {
        return Err(BackupError::TooNew {
            path: path.to_owned(),
            found: schema,
            supported: SCHEMA_VERSION,
        });
    }
    let kernel_tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' \
             AND name IN ('counters', 'processes', 'events')",
            [],
            |row| row.get(0),
        )
        .map_err(|err| sqlite_error(path, "cannot list tables", err))?;
    if schema < 1 || kernel_tables != 3 {
        return Err(not_a_store(
            "an SQLite database without the kernel's tables".to_owned(),
        ));
    }
    Ok(schema)
}

/// Folds the WAL of the store at `db` into it and moves it aside; where
/// it went, or `None` when there was none.
fn keep_previous(db: &Path) -> Result<Option<PathBuf>, BackupError> {
    if !db.exists() {
        return Ok(None);
    }
    {
        let conn = Connection::open(db).map_err(|err| sqlite_error(db, "cannot open", err))?;
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .map_err(|err| sqlite_error(db, "cannot checkpoint", err))?;
    }
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let mut kept = db.as_os_str().to_owned();
    kept.push(format!(".before-restore-{secs}"));
    let kept = PathBuf::from(kept);
    std::fs::rename(db, &kept).map_err(io("cannot move aside", db))?;
    for suffix in ["-wal", "-shm"] {
        let mut side = db.as_os_str().to_owned();
        side.push(suffix);
        let side = PathBuf::from(side);
        match std::fs::remove_file(&side) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(BackupError::Io {
                    what: "cannot remove",
                    path: side,
                    source,
                });
            }
        }
    }
    Ok(Some(kept))
}

fn size(path: &Path) -> Result<u64, BackupError> {
    Ok(std::fs::metadata(path)
        .map_err(io("cannot read the size of", path))?
        .len())
}

/// Flushes the directory holding `path`, so a rename into it survives a
/// power loss.
fn sync_dir(path: &Path) -> Result<(), BackupError> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(io("cannot flush the directory", dir))
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> BackupError {
    let path = path.to_owned();
    move |source| BackupError::Io { what, path, source }
}

fn sqlite_error(path: &Path, what: &'static str, err: rusqlite::Error) -> BackupError {
    BackupError::Sqlite {
        path: path.to_owned(),
        what,
        message: err.to_string(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::store::{Store, Synchronous};

    #[test]
    fn a_backup_is_a_checked_copy_and_refuses_to_overwrite_or_copy_a_stranger() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("hivekernel.db");
        drop(Store::open(&db, Synchronous::Normal).unwrap());
        let dest = dir.path().join("copy.db");
        let copied = backup(&db, &dest).unwrap();
        assert_eq!(copied.schema, SCHEMA_VERSION);
        assert!(copied.bytes > 0 && dest.is_file());
        assert!(!dir.path().join("copy.db.partial").exists());

        let again = backup(&db, &dest).unwrap_err();
        assert!(matches!(again, BackupError::Exists(_)), "{again}");
        let none = backup(&dir.path().join("absent.db"), &dir.path().join("x.db")).unwrap_err();
        assert!(none.to_string().contains("no store at"), "{none}");

        let text = dir.path().join("notes.txt");
        std::fs::write(&text, "not a database, just some words long enough").unwrap();
        let err = backup(&text, &dir.path().join("y.db")).unwrap_err();
        assert!(err.to_string().contains("not an SQLite database"), "{err}");
        assert!(!dir.path().join("y.db").exists() && !dir.path().join("y.db.partial").exists());

        let other = dir.path().join("other.db");
        Connection::open(&other)
            .unwrap()
            .execute_batch("CREATE TABLE t (x); PRAGMA user_version = 3;")
            .unwrap();
        let err = restore(&other, &db).unwrap_err();
        assert!(
            err.to_string().contains("without the kernel's tables"),
            "{err}"
        );
        assert!(db.is_file(), "a refused restore changes nothing");
    }

    #[test]
    fn a_restore_keeps_the_store_it_replaces_and_refuses_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("hivekernel.db");
        drop(Store::open(&db, Synchronous::Normal).unwrap());
        let saved = dir.path().join("saved.db");
        backup(&db, &saved).unwrap();

        let restored = restore(&saved, &db).unwrap();
        let previous = restored.previous.unwrap();
        assert!(previous.is_file() && db.is_file());
        assert!(
            previous
                .to_string_lossy()
                .contains("hivekernel.db.before-restore-")
        );
        drop(Store::open(&db, Synchronous::Normal).unwrap());

        Connection::open(&saved)
            .unwrap()
            .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        let err = restore(&saved, &db).unwrap_err();
        assert!(matches!(err, BackupError::TooNew { .. }), "{err}");
    }
}
