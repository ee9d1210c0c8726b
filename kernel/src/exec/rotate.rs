//! Size-based rotation of an `exec` agent's log (`kernel.exec.log`).
//!
//! The OS process writes its stdout and stderr to its log file itself (an
//! append-mode descriptor it inherited: nothing of the kernel sits in the
//! way of its output, and a kernel killed with SIGKILL finds its orphans by
//! that descriptor). So the log is rotated by copying, as logrotate's
//! `copytruncate` does: once it is over `max_bytes`, `NAME.log.1` ...
//! `NAME.log.{keep-1}` move up one, the log is copied to `NAME.log.1` and
//! truncated to zero; the process's next write lands at the new start
//! (append mode). Output written between the copy and the truncation (a
//! few milliseconds at 10 MiB) is lost; everything else is kept.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

pub use crate::config::LogRotation;

/// `log` rotated as `rotation` says when it has grown past its limit;
/// `Ok(true)` when it was rotated.
pub(crate) fn rotate_if_over(log: &Path, rotation: LogRotation) -> io::Result<bool> {
    if rotation.max_bytes == 0 {
        return Ok(false);
    }
    let size = match std::fs::metadata(log) {
        Ok(meta) => meta.len(),
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(err) => return Err(err),
    };
    if size <= rotation.max_bytes {
        return Ok(false);
    }
    if rotation.keep > 0 {
        // The oldest goes; each other moves up one.
        let _ = std::fs::remove_file(numbered(log, rotation.keep));
        for n in (1..rotation.keep).rev() {
            match std::fs::rename(numbered(log, n), numbered(log, n + 1)) {
                Ok(()) => {}
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(err),
            }
        }
        let mut from = File::open(log)?;
        let mut to = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(numbered(log, 1))?;
        io::copy(&mut from, &mut to)?;
    }
    OpenOptions::new().write(true).open(log)?.set_len(0)?;
    Ok(true)
}

/// `NAME.log.N`.
pub(crate) fn numbered(log: &Path, n: u32) -> PathBuf {
    let mut name = log.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::io::Write;

    use super::*;

    fn append(path: &Path, text: &str) {
        OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }

    #[test]
    fn a_log_over_its_limit_moves_to_dot_one_and_the_oldest_goes() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("7-agent.log");
        let rotation = LogRotation {
            max_bytes: 10,
            keep: 2,
        };
        append(&log, "0123456789");
        assert!(
            !rotate_if_over(&log, rotation).unwrap(),
            "at the limit, kept"
        );
        append(&log, "a");
        assert!(rotate_if_over(&log, rotation).unwrap());
        assert_eq!(
            std::fs::read_to_string(numbered(&log, 1)).unwrap(),
            "0123456789a"
        );
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 0);
        append(&log, "second generation");
        assert!(rotate_if_over(&log, rotation).unwrap());
        append(&log, "third generation!");
        assert!(rotate_if_over(&log, rotation).unwrap());
        assert_eq!(
            std::fs::read_to_string(numbered(&log, 1)).unwrap(),
            "third generation!"
        );
        assert_eq!(
            std::fs::read_to_string(numbered(&log, 2)).unwrap(),
            "second generation"
        );
        assert!(!numbered(&log, 3).exists(), "only `keep` files are kept");
    }

    #[test]
    fn a_writer_in_append_mode_carries_on_at_the_start_after_a_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("7-agent.log");
        let mut writer = OpenOptions::new()
            .append(true)
            .create(true)
            .open(&log)
            .unwrap();
        writer.write_all(b"before the rotation\n").unwrap();
        let rotation = LogRotation {
            max_bytes: 5,
            keep: 0,
        };
        assert!(rotate_if_over(&log, rotation).unwrap());
        assert!(!numbered(&log, 1).exists(), "keep 0: truncated only");
        writer.write_all(b"after\n").unwrap();
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "after\n");
        assert!(
            !rotate_if_over(
                &log,
                LogRotation {
                    max_bytes: 0,
                    keep: 5
                }
            )
            .unwrap(),
            "max_bytes 0 never rotates"
        );
    }
}
