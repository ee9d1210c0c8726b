//! Reading a file the config names (the config itself, prompts, TLS files,
//! NATS credentials): only a regular file, and never more than a limit.
//!
//! A path may name anything: `/dev/zero` never ends, a FIFO blocks its
//! reader until a writer comes (deaf to signals meanwhile), and a file's
//! size can change between a `stat` and a read. So the file is opened
//! without blocking, its type (and, for a secret, its mode) is taken from
//! the open handle (no window to swap the path), and at most the limit
//! plus one byte is read. Files of the kernel's own interfaces (`/proc`,
//! `/sys`, `/dev`) look regular and hold secrets (`/proc/self/environ`):
//! they are refused by where they lie, after symlinks, and by the
//! filesystem the open handle is on.

use std::fmt;
use std::fs::{FileType, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Why a file could not be read.
#[derive(Debug)]
pub enum FileProblem {
    /// The OS refused to open or read it.
    Io(io::Error),
    /// It is not a regular file (the kind it is instead).
    NotRegular(&'static str),
    /// It lies in one of the kernel's own interfaces (the directory).
    Interface(&'static str),
    /// It holds more than the limit.
    TooLarge {
        /// The limit, in bytes.
        max: u64,
        /// Its size when it was opened (it may have grown since).
        size: u64,
    },
    /// It holds a secret, and users other than its owner have access to it.
    Shared {
        /// Its permission bits.
        mode: u32,
    },
}

impl fmt::Display for FileProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileProblem::Io(err) => err.fmt(f),
            FileProblem::NotRegular(kind) => write!(f, "it is {kind}, not a regular file"),
            FileProblem::Interface(dir) => write!(
                f,
                "it is in {dir}, an interface of the operating system, not a file a config may name"
            ),
            FileProblem::TooLarge { max, size } => {
                write!(f, "it is {size} bytes, larger than {max} bytes")
            }
            FileProblem::Shared { mode } => write!(
                f,
                "users other than its owner have access to it (mode {mode:o}): it holds a \
                 secret, so make it its owner's alone (chmod 600)"
            ),
        }
    }
}

/// The bytes of the regular file at `path`, at most `max` of them.
pub fn read_capped(path: &Path, max: u64) -> Result<Vec<u8>, FileProblem> {
    read(path, max, false)
}

/// [`read_capped`] for a file holding a secret (a key, a password): also
/// refused when its group or other users may read, write or run it, as
/// ssh refuses such a private key.
pub fn read_private(path: &Path, max: u64) -> Result<Vec<u8>, FileProblem> {
    read(path, max, true)
}

fn read(path: &Path, max: u64, private: bool) -> Result<Vec<u8>, FileProblem> {
    let file = OpenOptions::new()
        .read(true)
        // Opening a FIFO for reading would wait for a writer; opening a
        // regular file is unaffected, and so are its reads.
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)
        .map_err(FileProblem::Io)?;
    let meta = file.metadata().map_err(FileProblem::Io)?;
    if !meta.file_type().is_file() {
        return Err(FileProblem::NotRegular(describe(meta.file_type())));
    }
    if let Some(dir) = interface(path, &file) {
        return Err(FileProblem::Interface(dir));
    }
    let mode = meta.permissions().mode() & 0o777;
    if private && mode & 0o077 != 0 {
        return Err(FileProblem::Shared { mode });
    }
    let too_large = |size: u64| FileProblem::TooLarge { max, size };
    if meta.len() > max {
        return Err(too_large(meta.len()));
    }
    // Whatever the size said: a file that grows meanwhile is still cut off.
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(FileProblem::Io)?;
    if bytes.len() as u64 > max {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// The interface directory `file` (opened from `path`) lies in, if any:
/// by its real path, and by its filesystem (procfs or sysfs mounted elsewhere).
fn interface(path: &Path, file: &std::fs::File) -> Option<&'static str> {
    const DIRS: [&str; 3] = ["/proc", "/sys", "/dev"];
    if let Ok(real) = std::fs::canonicalize(path)
        && let Some(dir) = DIRS.into_iter().find(|dir| real.starts_with(dir))
    {
        return Some(dir);
    }
    let kind = rustix::fs::fstatfs(file).ok()?.f_type;
    if kind == rustix::fs::PROC_SUPER_MAGIC {
        Some("/proc")
    } else if kind == SYSFS_MAGIC {
        Some("/sys")
    } else {
        None
    }
}

/// sysfs's filesystem type (`statfs(2)`).
const SYSFS_MAGIC: rustix::fs::FsWord = 0x6265_6572;

fn describe(kind: FileType) -> &'static str {
    if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_regular_file_is_read_up_to_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("prompt.md");
        std::fs::write(&path, "x".repeat(100)).unwrap();
        assert_eq!(read_capped(&path, 100).unwrap().len(), 100);
        let err = read_capped(&path, 99).unwrap_err();
        assert_eq!(err.to_string(), "it is 100 bytes, larger than 99 bytes");
    }

    #[test]
    fn devices_and_directories_are_refused_unread() {
        let err = read_capped(Path::new("/dev/zero"), 10).unwrap_err();
        assert_eq!(
            err.to_string(),
            "it is a character device, not a regular file"
        );
        let dir = tempfile::tempdir().unwrap();
        let err = read_capped(dir.path(), 10).unwrap_err();
        assert_eq!(err.to_string(), "it is a directory, not a regular file");
        let err = read_capped(&dir.path().join("absent"), 10).unwrap_err();
        assert!(matches!(err, FileProblem::Io(_)), "{err}");
    }

    #[test]
    fn files_of_the_kernels_interfaces_are_refused_unread() {
        for path in [
            "/proc/self/environ",
            "/proc/self/status",
            "/sys/kernel/mm/transparent_hugepage/enabled",
        ] {
            if !Path::new(path).exists() {
                continue;
            }
            let err = read_capped(Path::new(path), 1 << 20).unwrap_err();
            assert!(matches!(err, FileProblem::Interface(_)), "{path}: {err}");
            assert!(
                err.to_string()
                    .contains("an interface of the operating system"),
                "{err}"
            );
        }
        // A symlink to one is refused the same.
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("prompt.md");
        std::os::unix::fs::symlink("/proc/self/environ", &link).unwrap();
        let err = read_capped(&link, 1 << 20).unwrap_err();
        assert_eq!(
            err.to_string(),
            "it is in /proc, an interface of the operating system, not a file a config may name"
        );
    }

    #[test]
    fn a_secret_others_may_read_is_refused() {
        use std::fs::Permissions;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("user.nk");
        std::fs::write(&path, "SU...").unwrap();
        for mode in [0o644, 0o640, 0o604, 0o620] {
            std::fs::set_permissions(&path, Permissions::from_mode(mode)).unwrap();
            let err = read_private(&path, 100).unwrap_err().to_string();
            assert!(
                err.contains(&format!("mode {mode:o}")) && err.contains("chmod 600"),
                "{err}"
            );
            assert!(!err.contains("SU..."), "{err}");
            assert!(read_capped(&path, 100).is_ok());
        }
        std::fs::set_permissions(&path, Permissions::from_mode(0o400)).unwrap();
        assert_eq!(read_private(&path, 100).unwrap(), b"SU...");
    }
}
