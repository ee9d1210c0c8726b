//! Workspace tools: files and a shell inside the agent's own directory.
//!
//! Every agent works in `ctx.workspace()` (`<workspace>/<agent name>/`),
//! created on first use. The model may name any path it likes; the kernel,
//! not the prompt, keeps the file tools inside that directory, for reads and
//! writes alike, in two steps that every file tool shares:
//!
//! 1. **Check** (`path`): the path is refused outright when it is empty,
//!    absolute, has a `..` component, a backslash, a NUL byte or a drive
//!    prefix. Then the deepest part of it that exists is canonicalized
//!    (following every symlink, at the leaf or in the middle) and must lie
//!    inside the canonical workspace, compared by whole components, so
//!    `/ws/agent-evil` is not inside `/ws/agent`. A path through a dangling
//!    symlink is refused, so a link is never followed to create a file
//!    elsewhere. The result is the target as plain names below the root, with
//!    no symlink left in it at the time of the check.
//! 2. **Use** (`beneath`): the file is reached from an open descriptor of the
//!    root by `openat` one name at a time, each with `O_NOFOLLOW` (and
//!    `O_DIRECTORY` on the way down). A symlink swapped in anywhere on the path
//!    after the check, in the middle or at the leaf, makes the call fail
//!    instead of being followed; writes go to a fresh `O_EXCL` file in the
//!    target's directory and are renamed over the target (`renameat` replaces a
//!    link, never follows it).
//!
//! # Residual risk
//! - `shell_exec` runs confined (see its module and [`crate::sandbox`]): it
//!   reads the system paths and what config grants, and writes only its own
//!   workspace, where a command can do anything, including replacing the
//!   workspace directory itself. On a host without Landlock it is refused
//!   unless config opts out.
//! - A hard link in the workspace to a file elsewhere (which only someone
//!   outside can create now) is read through; writes and edits replace
//!   the link rather than writing into its target.
//!
//! # Layout
//! - `path`: the lexical rules and the symlink-aware check.
//! - `beneath`: open, read, write and list by walking from the root with `O_NOFOLLOW`.
//! - `files`: `read_file`, `write_file`, `edit_file`, `list_dir`.
//! - `shell`: `shell_exec`.
//! - this file: limits, registration, argument decoding.

mod beneath;
mod files;
mod path;
mod shell;

use std::path::Path;
use std::sync::Arc;

use super::{ToolError, ToolRegistry, decode};

pub use files::{EditFile, ListDir, ReadFile, WriteFile};
pub use shell::{ShellExec, ShellSettings};

/// Most bytes `read_file` returns per call.
pub const READ_LIMIT: usize = 256 * 1024;
/// Largest content `write_file` accepts, and largest file `edit_file` handles.
pub const WRITE_LIMIT: usize = 1024 * 1024;
/// Most entries `list_dir` shows.
pub const LIST_LIMIT: usize = 1000;
/// Most bytes of output (stdout and stderr together) `shell_exec` returns.
pub const SHELL_OUTPUT_LIMIT: usize = 64 * 1024;
/// `shell_exec`'s timeout when none is given, in seconds.
pub const SHELL_DEFAULT_TIMEOUT_SECONDS: u64 = 30;
/// Longest timeout `shell_exec` accepts, in seconds.
pub const SHELL_MAX_TIMEOUT_SECONDS: u64 = 600;

/// Adds `read_file`, `write_file`, `edit_file`, `list_dir` and `shell_exec`
/// (confined by `shell`).
pub fn register(registry: &mut ToolRegistry, shell: ShellSettings) {
    registry.register(Arc::new(ReadFile));
    registry.register(Arc::new(WriteFile));
    registry.register(Arc::new(EditFile));
    registry.register(Arc::new(ListDir));
    registry.register(Arc::new(ShellExec::new(shell)));
}

/// Reads up to `limit` bytes of the file at `path` under `dir`, confined
/// as the file tools are (no `..`, no absolute path, no symlink leading
/// out, none swapped in), and, with symlinks resolved, inside one of the
/// folders `under`; answers the bytes and the file's size. Blocking.
pub(crate) fn read_beneath(
    dir: &Path,
    path: &str,
    under: &[&str],
    limit: u64,
) -> Result<(Vec<u8>, u64), ToolError> {
    let root = beneath::Root::existing(dir)?;
    let target = path::resolve(root.path(), path)?;
    let first = target.names.first().and_then(|name| name.to_str());
    if !first.is_some_and(|first| under.contains(&first)) {
        let folders: Vec<String> = under.iter().map(|f| format!("{f}/")).collect();
        return Err(path::refused(
            path,
            &format!("it is not inside {}", folders.join(", ")),
        ));
    }
    let chunk = root.read(&target, 0, limit)?;
    Ok((chunk.bytes, chunk.total))
}

/// Runs blocking file work off the async threads.
pub(crate) async fn blocking<T, F>(work: F) -> Result<T, ToolError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, ToolError> + Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|err| ToolError::new(format!("workspace tool failed: {err}")))?
}
