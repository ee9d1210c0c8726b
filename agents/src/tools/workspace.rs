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
//! - `shell_exec` is not a sandbox: it runs `sh` as the kernel's user, in the
//!   workspace, with a scrubbed environment, but it can read and write
//!   anything that user can (including replacing the workspace directory
//!   itself). The path rules bind the file tools; keeping an agent away from
//!   the rest of the machine means not giving it `shell_exec` (a capability
//!   in config), or running the kernel under a dedicated user or container.
//! - A hard link in the workspace to a file elsewhere (which only the shell,
//!   or someone outside, can create) is read through; writes and edits replace
//!   the link rather than writing into its target.
//! - `shell_exec` kills its process group; a command that moves a child into
//!   a new session or group (`setsid`) escapes that and survives.
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

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{Tool, ToolError, ToolRegistry, parse_args};

pub use files::{EditFile, ListDir, ReadFile, WriteFile};
pub use shell::ShellExec;

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

/// Adds `read_file`, `write_file`, `edit_file`, `list_dir` and `shell_exec`.
pub fn register(registry: &mut ToolRegistry) {
    registry.register(Arc::new(ReadFile));
    registry.register(Arc::new(WriteFile));
    registry.register(Arc::new(EditFile));
    registry.register(Arc::new(ListDir));
    registry.register(Arc::new(ShellExec));
}

/// Decodes `tool`'s arguments; a value of the wrong type is named by its
/// field (serde alone says only what type it expected).
fn decode<T: DeserializeOwned>(tool: &dyn Tool, args: Value) -> Result<T, ToolError> {
    if let Some(why) = mismatch(&tool.parameters(), &args) {
        return Err(ToolError::new(format!(
            "invalid arguments for {}: {why}",
            tool.name()
        )));
    }
    parse_args(tool.name(), args)
}

/// The first argument whose JSON type differs from the schema's, described.
fn mismatch(schema: &Value, args: &Value) -> Option<String> {
    let properties = schema.get("properties")?.as_object()?;
    let required = schema.get("required").and_then(Value::as_array);
    for (name, value) in args.as_object()? {
        let Some(expected) = properties.get(name).and_then(|p| p.get("type")?.as_str()) else {
            continue; // unknown fields are named by serde
        };
        let is_required = required.is_some_and(|r| r.iter().any(|f| f == name.as_str()));
        let (fits, wanted) = match expected {
            "string" => (value.is_string(), "a string"),
            "integer" => (value.is_u64(), "a non-negative integer"),
            _ => (true, ""),
        };
        let omitted = value.is_null() && !is_required; // an optional field given as null
        if !fits && !omitted {
            let mut shown = value.to_string();
            if shown.len() > 60 {
                let cut = (0..=60)
                    .rev()
                    .find(|&i| shown.is_char_boundary(i))
                    .unwrap_or(0);
                shown.truncate(cut);
                shown.push_str("...");
            }
            return Some(format!("field `{name}` must be {wanted}, got {shown}"));
        }
    }
    None
}

/// Runs blocking file work off the async threads.
async fn blocking<T, F>(work: F) -> Result<T, ToolError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, ToolError> + Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|err| ToolError::new(format!("workspace tool failed: {err}")))?
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn mismatch_names_the_field() {
        let schema = ReadFile.parameters();
        let why = mismatch(&schema, &json!({"path": 5})).unwrap_or_default();
        assert!(why.contains("`path`") && why.contains("string"), "{why}");
        let why = mismatch(&schema, &json!({"path": "a", "offset": -1})).unwrap_or_default();
        assert!(why.contains("`offset`"), "{why}");
        assert_eq!(
            mismatch(&schema, &json!({"path": "a", "limit": null})),
            None
        );
        assert!(mismatch(&schema, &json!({"path": null})).is_some());
    }
}
