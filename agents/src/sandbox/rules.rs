//! Which paths a policy grants, after hiding what must stay hidden.

use std::path::{Path, PathBuf};

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

/// The paths to grant for `granted` (each canonical, existing), with every
/// grant that strictly contains a `hidden` path replaced by grants on its
/// other entries, level by level down to the hidden one. A grant equal to
/// or inside a hidden path is kept: it was given on purpose.
pub(super) fn carve(granted: &[PathBuf], hidden: &[PathBuf]) -> Vec<PathBuf> {
    let hidden: Vec<PathBuf> = hidden
        .iter()
        .filter_map(|path| path.canonicalize().ok())
        .collect();
    let mut out = Vec::new();
    for path in granted {
        // A path that does not exist grants nothing.
        if let Ok(path) = path.canonicalize() {
            carve_one(path, &hidden, &mut out);
        }
    }
    out
}

fn carve_one(path: PathBuf, hidden: &[PathBuf], out: &mut Vec<PathBuf>) {
    if !hidden.iter().any(|h| strictly_inside(h, &path)) {
        out.push(path);
        return;
    }
    // An unreadable directory grants nothing, rather than all of it.
    let Ok(entries) = std::fs::read_dir(&path) else {
        return;
    };
    for entry in entries.flatten() {
        let child = entry.path();
        if hidden.contains(&child) {
            continue;
        }
        carve_one(child, hidden, out);
    }
}

/// `inner` lies below `outer` (compared by whole components) and is not it.
fn strictly_inside(inner: &Path, outer: &Path) -> bool {
    inner != outer && inner.starts_with(outer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_around_a_hidden_path_is_split_around_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        for sub in ["a/data", "a/other", "b"] {
            std::fs::create_dir_all(root.join(sub)).expect("mkdir");
        }
        std::fs::write(root.join("a/file"), "x").expect("write");
        let hidden = vec![root.join("a/data")];
        let mut got = carve(std::slice::from_ref(&root), &hidden);
        got.sort();
        assert_eq!(
            got,
            vec![root.join("a/file"), root.join("a/other"), root.join("b")]
        );
        // Inside the hidden path: given on purpose, kept.
        let inside = root.join("a/data");
        assert_eq!(carve(std::slice::from_ref(&inside), &hidden), vec![inside]);
        // Not around it: kept whole; missing: dropped.
        let b = root.join("b");
        assert_eq!(carve(&[b.clone(), root.join("missing")], &hidden), vec![b]);
        // A sibling sharing the prefix is not inside.
        std::fs::create_dir_all(root.join("a/data-not")).expect("mkdir");
        assert!(carve(&[root.join("a")], &hidden).contains(&root.join("a/data-not")));
    }
}
