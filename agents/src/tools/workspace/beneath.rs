//! File operations that reach a checked path from the workspace root one
//! name at a time, never following a symlink.
//!
//! [`resolve`](super::path::resolve) turns what the agent wrote into names
//! that held no symlink when checked. Between that check and the use,
//! something else (the agent's own shell, say) could swap a directory or the
//! leaf for a link. Every name is therefore opened with `openat` relative to
//! its parent's descriptor and `O_NOFOLLOW`: a link that appeared anywhere on
//! the path fails the call (`ELOOP` or `ENOTDIR`) instead of leading outside.

use std::collections::BinaryHeap;
use std::ffi::{CString, OsString};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;

use super::path::{Resolved, failed, refused};
use crate::tools::ToolError;

/// How a directory on the way down is opened: never through a link.
const DIR: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// An open workspace root.
#[derive(Debug)]
pub(super) struct Root {
    dir: OwnedFd,
    canonical: PathBuf,
}

/// Bytes read from a file, and its size.
#[derive(Debug)]
pub(super) struct Chunk {
    pub(super) bytes: Vec<u8>,
    pub(super) total: u64,
}

/// One directory entry.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) name: String,
    pub(super) kind: &'static str,
    /// Size in bytes, for files.
    pub(super) size: Option<u64>,
}

/// The first entries of a directory by name, and how many it has.
#[derive(Debug)]
pub(super) struct Listing {
    pub(super) entries: Vec<Entry>,
    pub(super) total: usize,
}

impl Root {
    /// Opens the workspace, creating it if it does not exist yet.
    pub(super) fn open(workspace: &Path) -> Result<Root, ToolError> {
        std::fs::create_dir_all(workspace).map_err(|err| {
            ToolError::new(format!(
                "cannot open the workspace {}: {err}",
                workspace.display()
            ))
        })?;
        Self::existing(workspace)
    }

    /// Opens a directory that must exist already.
    pub(super) fn existing(workspace: &Path) -> Result<Root, ToolError> {
        let fail =
            |err: io::Error| ToolError::new(format!("cannot open {}: {err}", workspace.display()));
        let canonical = std::fs::canonicalize(workspace).map_err(fail)?;
        let dir = rustix::fs::open(&canonical, DIR, Mode::empty()).map_err(|e| fail(e.into()))?;
        Ok(Root { dir, canonical })
    }

    /// The canonical path of the root, which [`resolve`](super::path::resolve) checks against.
    pub(super) fn path(&self) -> &Path {
        &self.canonical
    }

    /// Reads up to `limit` bytes from `offset` of a regular file.
    pub(super) fn read(
        &self,
        target: &Resolved,
        offset: u64,
        limit: u64,
    ) -> Result<Chunk, ToolError> {
        let fail = |err: Errno| failed(&target.shown, &err.into());
        let (parent, leaf) = self.parent(target, false)?;
        // O_NONBLOCK: opening a FIFO must not hang; it is refused below anyway.
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&parent, leaf, flags, Mode::empty()).map_err(fail)?;
        let stat = rustix::fs::fstat(&fd).map_err(fail)?;
        regular(target, stat.st_mode)?;
        let total = u64::try_from(stat.st_size).unwrap_or(0);
        let file = File::from(fd);
        let want = limit.min(total.saturating_sub(offset));
        let mut bytes = vec![0; usize::try_from(want).unwrap_or(0)];
        let mut filled = 0;
        while filled < bytes.len() {
            match file.read_at(&mut bytes[filled..], offset + filled as u64) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => return Err(failed(&target.shown, &err)),
            }
        }
        bytes.truncate(filled);
        Ok(Chunk { bytes, total })
    }

    /// Replaces (or creates) a file with `content`, making missing parent
    /// directories: written to a fresh file beside it, then renamed over it.
    pub(super) fn write(&self, target: &Resolved, content: &[u8]) -> Result<(), ToolError> {
        let fail = |err: io::Error| failed(&target.shown, &err);
        let (parent, leaf) = self.parent(target, true)?;
        let mode = match rustix::fs::statat(&parent, leaf, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) if FileType::from_raw_mode(stat.st_mode) == FileType::Directory => {
                return Err(fail(Errno::ISDIR.into()));
            }
            Ok(stat) if FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile => {
                Mode::from_raw_mode(stat.st_mode) & Mode::from_raw_mode(0o777)
            }
            _ => Mode::from_raw_mode(0o644),
        };
        let temp = temp_name();
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&parent, &temp, flags, mode).map_err(|e| fail(e.into()))?;
        let written = File::from(fd).write_all(content).and_then(|()| {
            rustix::fs::renameat(&parent, &temp, &parent, leaf).map_err(io::Error::from)
        });
        if written.is_err() {
            let _ = rustix::fs::unlinkat(&parent, &temp, AtFlags::empty());
        }
        written.map_err(fail)
    }

    /// The first `max` entries of a directory, sorted by name.
    pub(super) fn list(&self, target: &Resolved, max: usize) -> Result<Listing, ToolError> {
        let fail = |err: Errno| failed(&target.shown, &err.into());
        let dir = self.descend(target, &target.names, false)?;
        // The `max` smallest names, in bounded memory whatever the directory holds.
        let mut first = BinaryHeap::with_capacity(max + 1);
        let mut total = 0;
        for entry in Dir::read_from(&dir).map_err(fail)? {
            let entry = entry.map_err(fail)?;
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            total += 1;
            first.push(name.to_owned());
            if first.len() > max {
                first.pop();
            }
        }
        let entries = first
            .into_sorted_vec()
            .into_iter()
            .map(|name| describe(&dir, name))
            .collect();
        Ok(Listing { entries, total })
    }

    /// The target's parent directory, open, and the target's own name.
    fn parent<'t>(
        &self,
        target: &'t Resolved,
        create: bool,
    ) -> Result<(OwnedFd, &'t OsString), ToolError> {
        let Some((leaf, dirs)) = target.names.split_last() else {
            return Err(ToolError::new(format!(
                "{:?} is the workspace directory itself, not a file",
                target.shown
            )));
        };
        Ok((self.descend(target, dirs, create)?, leaf))
    }

    /// Opens the directory `names` lead to below the root, refusing links;
    /// `create` makes the missing ones.
    fn descend(
        &self,
        target: &Resolved,
        names: &[OsString],
        create: bool,
    ) -> Result<OwnedFd, ToolError> {
        let fail = |err: Errno| failed(&target.shown, &err.into());
        let mut dir = self
            .dir
            .try_clone()
            .map_err(|e| failed(&target.shown, &e))?;
        for name in names {
            dir = match rustix::fs::openat(&dir, name, DIR, Mode::empty()) {
                Err(Errno::NOENT) if create => {
                    match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(err) => return Err(fail(err)),
                    }
                    rustix::fs::openat(&dir, name, DIR, Mode::empty()).map_err(fail)?
                }
                Err(Errno::NOTDIR | Errno::LOOP) if is_link(&dir, name) => {
                    return Err(refused(&target.shown, SWAPPED));
                }
                opened => opened.map_err(fail)?,
            };
        }
        Ok(dir)
    }
}

/// Why a path that passed the check fails at use.
const SWAPPED: &str = "a symlink appeared on the path after it was checked";

/// Whether `name` in `dir` is a symlink (not followed).
fn is_link(dir: &OwnedFd, name: &OsString) -> bool {
    rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .is_ok_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::Symlink)
}

/// Refuses anything but a regular file (directories, FIFOs, devices, sockets).
fn regular(target: &Resolved, mode: rustix::fs::RawMode) -> Result<(), ToolError> {
    match FileType::from_raw_mode(mode) {
        FileType::RegularFile => Ok(()),
        FileType::Directory => Err(failed(&target.shown, &Errno::ISDIR.into())),
        _ => Err(ToolError::new(format!(
            "{:?} is not a regular file",
            target.shown
        ))),
    }
}

/// Kind and size of the entry `name` in `dir`, without following it.
fn describe(dir: &OwnedFd, name: CString) -> Entry {
    let stat = rustix::fs::statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW).ok();
    let kind = stat.map(|s| FileType::from_raw_mode(s.st_mode));
    let (kind, size) = match (kind, stat) {
        (Some(FileType::RegularFile), Some(s)) => ("file", u64::try_from(s.st_size).ok()),
        (Some(FileType::Directory), _) => ("dir", None),
        (Some(FileType::Symlink), _) => ("symlink", None),
        (Some(_), _) => ("other", None),
        (None, _) => ("gone", None),
    };
    Entry {
        name: String::from_utf8_lossy(name.as_bytes()).into_owned(),
        kind,
        size,
    }
}

/// A name for a write in progress that no other write picks.
fn temp_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        ".hk-write.{}.{}.tmp",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::symlink;

    use super::super::path::resolve;
    use super::*;

    /// `<tmp>/ws` as the workspace and `<tmp>/outside` beside it.
    fn layout() -> (tempfile::TempDir, Root, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        let root = Root::open(&tmp.path().join("ws")).unwrap();
        (tmp, root, outside)
    }

    #[test]
    fn a_directory_swapped_for_a_link_after_the_check_is_not_followed() {
        let (_tmp, root, outside) = layout();
        std::fs::create_dir(root.path().join("sub")).unwrap();
        let target = resolve(root.path(), "sub/file.txt").unwrap();
        std::fs::remove_dir(root.path().join("sub")).unwrap();
        symlink(&outside, root.path().join("sub")).unwrap();

        let err = root.write(&target, b"pwned").unwrap_err();
        assert!(err.0.contains("refused"), "{err}");
        assert!(root.read(&target, 0, 10).is_err());
        assert!(root.list(&resolve(root.path(), ".").unwrap(), 10).is_ok());
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    }

    #[test]
    fn a_leaf_swapped_for_a_link_after_the_check_is_replaced_not_followed() {
        let (_tmp, root, outside) = layout();
        std::fs::write(outside.join("secret"), "keep").unwrap();
        std::fs::write(root.path().join("f"), "mine").unwrap();
        let target = resolve(root.path(), "f").unwrap();
        std::fs::remove_file(root.path().join("f")).unwrap();
        symlink(outside.join("secret"), root.path().join("f")).unwrap();

        assert!(root.read(&target, 0, 10).unwrap_err().0.contains("refused"));
        root.write(&target, b"new").unwrap();
        assert_eq!(std::fs::read(outside.join("secret")).unwrap(), b"keep");
        assert_eq!(std::fs::read(root.path().join("f")).unwrap(), b"new");
    }

    #[test]
    fn fifos_are_refused_without_blocking() {
        let (_tmp, root, _outside) = layout();
        let status = std::process::Command::new("mkfifo")
            .arg(root.path().join("pipe"))
            .status()
            .unwrap();
        assert!(status.success());
        let err = root
            .read(&resolve(root.path(), "pipe").unwrap(), 0, 10)
            .unwrap_err();
        assert!(err.0.contains("not a regular file"), "{err}");
    }
}
