//! Which paths an agent may name, and where they lead.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use rustix::io::Errno;

use crate::tools::ToolError;

/// Longest path accepted, in bytes (Linux's `PATH_MAX`).
const MAX_PATH_BYTES: usize = 4096;
/// Most bytes of a path a message quotes.
const SHOWN_PATH_BYTES: usize = 256;

/// A path checked to lead inside the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Resolved {
    /// The path as the agent wrote it, for messages.
    pub(super) shown: String,
    /// Names from the canonical workspace root down to the target, none of
    /// them a symlink when checked; empty for the root itself.
    pub(super) names: Vec<OsString>,
}

/// Checks `path` against the workspace whose canonical root is `root`.
///
/// The deepest part of the path that exists (a dangling link counts) is
/// canonicalized and must stay under `root`; the rest is plain names.
pub(super) fn resolve(root: &Path, path: &str) -> Result<Resolved, ToolError> {
    let names = names(path)?;
    let mut existing = 0;
    let mut probe = root.to_path_buf();
    for name in &names {
        probe.push(name);
        match fs::symlink_metadata(&probe) {
            Ok(_) => existing += 1,
            Err(err) if err.kind() == io::ErrorKind::NotFound => break,
            Err(err) => return Err(failed(path, &err)),
        }
    }
    let base = root.join(names[..existing].iter().collect::<PathBuf>());
    let canonical = fs::canonicalize(&base).map_err(|err| match err.kind() {
        io::ErrorKind::NotFound => refused(
            path,
            "it goes through a symlink that points nowhere (a dangling link is never followed)",
        ),
        _ => failed(path, &err),
    })?;
    // Component-wise, so a sibling such as `<root>-evil` is outside.
    let inside = canonical
        .strip_prefix(root)
        .map_err(|_| refused(path, "it leads outside the workspace through a symlink"))?;
    if existing < names.len() && !canonical.is_dir() {
        let parent = names[..existing].join("/");
        return Err(ToolError::new(format!(
            "{path:?}: {parent:?} is not a directory"
        )));
    }
    let names = inside
        .iter()
        .map(OsStr::to_os_string)
        .chain(names[existing..].iter().map(OsString::from))
        .collect();
    Ok(Resolved {
        shown: path.to_owned(),
        names,
    })
}

/// The plain names in `path`, or why it is refused before the disk is touched.
pub(super) fn names(path: &str) -> Result<Vec<&str>, ToolError> {
    let bytes = path.as_bytes();
    let why = if path.is_empty() {
        "it is empty; name a file or directory inside the workspace"
    } else if path.contains('\0') {
        "it contains a NUL byte"
    } else if path.len() > MAX_PATH_BYTES {
        "it is longer than 4096 bytes"
    } else if path.starts_with('/') {
        "it is absolute; give a path relative to the workspace"
    } else if bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':' {
        "it starts with a drive prefix; give a path relative to the workspace"
    } else if path.contains('\\') {
        "it contains a backslash; separate directories with /"
    } else if path.split('/').any(|name| name == "..") {
        "it contains a `..` component; paths must stay inside the workspace"
    } else {
        return Ok(path
            .split('/')
            .filter(|name| !name.is_empty() && *name != ".")
            .collect());
    };
    Err(refused(path, why))
}

/// `path` refused for reason `why`.
pub(super) fn refused(path: &str, why: &str) -> ToolError {
    ToolError::new(format!("path {} refused: {why}", shown(path)))
}

/// `path` quoted for a message, cut to about [`SHOWN_PATH_BYTES`]: a refused
/// path may be megabytes long, and the message goes back to the model.
fn shown(path: &str) -> String {
    crate::text::quoted(path, SHOWN_PATH_BYTES)
}

/// `path` failed with `err`, said plainly.
pub(super) fn failed(path: &str, err: &io::Error) -> ToolError {
    let why = match Errno::from_io_error(err) {
        Some(Errno::NOENT) => "no such file or directory".to_owned(),
        Some(Errno::NOTDIR) => "a part of the path is not a directory".to_owned(),
        Some(Errno::ISDIR) => "it is a directory".to_owned(),
        Some(Errno::LOOP) => {
            return refused(
                path,
                "a symlink appeared on the path after it was checked, or the links loop",
            );
        }
        _ => err.to_string(),
    };
    ToolError::new(format!("{}: {why}", shown(path)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_paths_become_names() {
        assert_eq!(names("a/b.txt").ok(), Some(vec!["a", "b.txt"]));
        assert_eq!(names("./a//b/").ok(), Some(vec!["a", "b"]));
        assert_eq!(names(".").ok(), Some(vec![]));
        assert_eq!(names("..a/b..").ok(), Some(vec!["..a", "b.."]));
    }

    #[test]
    fn escapes_are_refused_before_touching_the_disk() {
        for bad in [
            "",
            "..",
            "../x",
            "a/../../x",
            "a/..",
            "/etc/passwd",
            "//server/share",
            "\\..\\x",
            "a\\b",
            "C:\\x",
            "c:/x",
            "C:",
            "a\0b",
        ] {
            let err = names(bad).err().map(|e| e.0).unwrap_or_default();
            assert!(err.contains("refused"), "{bad:?}: {err}");
            assert!(err.contains(&format!("{bad:?}")), "{bad:?}: {err}");
        }
        let long = "a/".repeat(3000);
        let err = names(&long).err().map(|e| e.0).unwrap_or_default();
        assert!(
            err.contains("longer than 4096 bytes") && err.contains("… [cut: 6000 bytes in all]"),
            "{err}"
        );
        assert!(err.len() < 400, "{err}");
    }
}
