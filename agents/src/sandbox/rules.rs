//! Which paths a policy grants, after hiding what must stay hidden, opened
//! the way Landlock takes them: as descriptors.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

/// Read-only (and executable) for every confined command: programs,
/// libraries, configuration, and the kernel's views of processes and devices.
/// `/dev` is not among them: block devices would bypass every path rule.
pub const SYSTEM_READ_ONLY: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
    "/proc",
    "/sys",
    "/dev/random",
    "/dev/urandom",
];

/// Device files every confined command may read and write.
pub const SYSTEM_READ_WRITE: &[&str] = &["/dev/null", "/dev/zero", "/dev/full"];

/// One granted file or directory, opened without following a link at its end.
#[derive(Debug)]
pub(super) struct Grant {
    pub(super) fd: OwnedFd,
    pub(super) is_dir: bool,
}

/// What to keep out of the grants.
#[derive(Debug, Default)]
pub(super) struct Exclusions {
    /// Never granted: a grant at or under one is dropped, one around it is cut.
    forbidden: Vec<PathBuf>,
    /// Cut out of grants around them; a grant at or under one is kept (it
    /// was given on purpose, like a command's own workspace).
    hidden: Vec<PathBuf>,
}

impl Exclusions {
    pub(super) fn new(forbidden: &[PathBuf], hidden: &[PathBuf]) -> Exclusions {
        Exclusions {
            forbidden: forbidden.iter().map(|p| resolve(p)).collect(),
            hidden: hidden.iter().map(|p| resolve(p)).collect(),
        }
    }

    fn all(&self) -> impl Iterator<Item = &PathBuf> {
        self.forbidden.iter().chain(&self.hidden)
    }
}

/// Opens what `granted` grants (each path resolved; a missing one grants
/// nothing), with every grant that strictly contains an excluded path
/// replaced by grants on its other entries, level by level down to it.
/// Entries met on the way down are opened by name from their directory
/// with `O_NOFOLLOW`, and links among them are never granted: a link planted
/// in a granted tree cannot point a grant at what is excluded.
pub(super) fn carve(granted: &[PathBuf], exclusions: &Exclusions) -> Vec<Grant> {
    let mut out = Vec::new();
    for path in granted {
        let Ok(path) = path.canonicalize() else {
            continue;
        };
        if exclusions.forbidden.iter().any(|f| path.starts_with(f)) {
            continue;
        }
        // The canonical path has no link in it; refuse one swapped in since.
        let Ok(fd) = open_canonical(&path) else {
            continue;
        };
        carve_open(fd, path, exclusions, &mut out);
    }
    out
}

/// Grants `fd` (at `path`), or, when it holds an excluded path, its entries.
fn carve_open(fd: OwnedFd, path: PathBuf, exclusions: &Exclusions, out: &mut Vec<Grant>) {
    let Ok(stat) = rustix::fs::fstat(&fd) else {
        return;
    };
    let file_type = rustix::fs::FileType::from_raw_mode(stat.st_mode);
    if file_type == rustix::fs::FileType::Symlink {
        return;
    }
    let is_dir = file_type == rustix::fs::FileType::Directory;
    if !is_dir || !exclusions.all().any(|e| strictly_inside(e, &path)) {
        out.push(Grant { fd, is_dir });
        return;
    }
    // Listed through a descriptor of the directory itself, never by path again.
    let Ok(dir) = rustix::fs::openat(
        &fd,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return;
    };
    let Ok(entries) = rustix::fs::Dir::read_from(&dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        let Ok(text) = name.to_str() else {
            continue;
        };
        let child = path.join(text);
        if exclusions.all().any(|e| *e == child) {
            continue;
        }
        let opened = rustix::fs::openat(
            &dir,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        );
        if let Ok(child_fd) = opened {
            carve_open(child_fd, child, exclusions, out);
        }
    }
}

/// Opens a canonical path refusing any link on the way (`openat2` with
/// `RESOLVE_NO_SYMLINKS`; on kernels before 5.6, a plain `O_PATH` open).
fn open_canonical(path: &Path) -> rustix::io::Result<OwnedFd> {
    let flags = OFlags::PATH | OFlags::CLOEXEC;
    match rustix::fs::openat2(
        rustix::fs::CWD,
        path,
        flags,
        Mode::empty(),
        rustix::fs::ResolveFlags::NO_SYMLINKS,
    ) {
        Err(rustix::io::Errno::NOSYS) => {
            rustix::fs::openat(rustix::fs::CWD, path, flags, Mode::empty())
        }
        other => other,
    }
}

/// `path` with its deepest existing ancestor canonicalized and the rest
/// appended (made absolute first), so a path that does not exist yet still
/// compares with canonical grants.
fn resolve(path: &Path) -> PathBuf {
    let absolute = absolute(path);
    if let Ok(canonical) = absolute.canonicalize() {
        return canonical;
    }
    match (absolute.parent(), absolute.file_name()) {
        (Some(parent), Some(name)) => resolve(parent).join(name),
        _ => absolute,
    }
}

/// `path` made absolute (against the current directory) and rid of `.` and
/// `..` by its components alone (it may not exist).
pub fn absolute(path: &Path) -> PathBuf {
    use std::path::Component;
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut out = PathBuf::new();
    for component in absolute.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// `inner` lies below `outer` (compared by whole components) and is not it.
fn strictly_inside(inner: &Path, outer: &Path) -> bool {
    inner != outer && inner.starts_with(outer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The canonical paths of what `grants` grants.
    fn paths(grants: &[Grant]) -> Vec<PathBuf> {
        let mut paths: Vec<PathBuf> = grants
            .iter()
            .map(|g| {
                std::fs::read_link(format!(
                    "/proc/self/fd/{}",
                    std::os::fd::AsRawFd::as_raw_fd(&g.fd)
                ))
                .expect("fd link")
            })
            .collect();
        paths.sort();
        paths
    }

    #[test]
    fn grants_are_cut_around_excluded_paths_and_never_follow_links() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        for sub in ["a/data", "a/other", "b", "ws/mine", "ws/theirs"] {
            std::fs::create_dir_all(root.join(sub)).expect("mkdir");
        }
        std::fs::write(root.join("a/file"), "x").expect("write");
        std::os::unix::fs::symlink(root.join("a/data"), root.join("a/link")).expect("link");
        let exclusions = Exclusions::new(&[root.join("a/data")], &[root.join("ws")]);
        let got = carve(std::slice::from_ref(&root), &exclusions);
        // The link to the data directory is not granted; nor is anything in ws.
        assert_eq!(
            paths(&got),
            vec![root.join("a/file"), root.join("a/other"), root.join("b")]
        );
        assert!(got.iter().any(|g| !g.is_dir));
        // Inside a forbidden path: dropped; inside a hidden one: kept.
        assert!(carve(&[root.join("a/data")], &exclusions).is_empty());
        assert_eq!(
            paths(&carve(&[root.join("ws/mine")], &exclusions)),
            vec![root.join("ws/mine")]
        );
        // Missing: dropped. A sibling sharing the prefix is not inside.
        assert!(carve(&[root.join("missing")], &exclusions).is_empty());
        std::fs::create_dir_all(root.join("a/data-not")).expect("mkdir");
        assert!(paths(&carve(&[root.join("a")], &exclusions)).contains(&root.join("a/data-not")));
        // An excluded path that does not exist yet is still cut out, and a
        // relative one is taken from the current directory.
        let later = Exclusions::new(&[root.join("b/later")], &[]);
        std::fs::create_dir_all(root.join("b/now")).expect("mkdir");
        assert_eq!(
            paths(&carve(&[root.join("b")], &later)),
            vec![root.join("b/now")]
        );
        assert_eq!(
            resolve(Path::new("x/../y")),
            resolve(Path::new(".")).join("y")
        );
    }
}
