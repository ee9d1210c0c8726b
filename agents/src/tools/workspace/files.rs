//! `read_file`, `write_file`, `edit_file` and `list_dir`.

use crate::capability::Capability;
use std::fmt::Write as _;
use std::path::PathBuf;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::beneath::Root;
use super::path::resolve;
use super::{LIST_LIMIT, READ_LIMIT, WRITE_LIMIT, blocking, decode};
use crate::tools::{Tool, ToolContext, ToolError};

/// Reads a text file in the workspace, by byte range.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadFile;

/// Creates or replaces a file in the workspace.
#[derive(Debug, Clone, Copy, Default)]
pub struct WriteFile;

/// Replaces one exact occurrence of a text in a workspace file.
#[derive(Debug, Clone, Copy, Default)]
pub struct EditFile;

/// Lists a directory in the workspace.
#[derive(Debug, Clone, Copy, Default)]
pub struct ListDir;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    path: String,
    offset: Option<u64>,
    limit: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    path: String,
    content: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EditArgs {
    path: String,
    old: String,
    new: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    path: Option<String>,
}

/// The workspace path, owned, for the blocking pool.
fn workspace(ctx: &ToolContext<'_>) -> Result<PathBuf, ToolError> {
    ctx.workspace().map(|p| p.to_path_buf())
}

#[async_trait]
impl Tool for ReadFile {
    fn name(&self) -> &'static str {
        "read_file"
    }

    fn capability(&self) -> Option<Capability> {
        Some(Capability::FileRead)
    }

    fn description(&self) -> &'static str {
        "Read a text file in your workspace (up to 256 KiB per call; use offset to continue)."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": { "type": "string", "description": "File path relative to the workspace." },
                "offset": { "type": "integer", "minimum": 0, "description": "Byte to start at (default 0)." },
                "limit": { "type": "integer", "minimum": 0, "description": "Most bytes to read (default and cap 262144)." }
            },
            "required": ["path"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let args: ReadArgs = decode(self, args)?;
        let workspace = workspace(ctx)?;
        blocking(move || {
            let root = Root::open(&workspace)?;
            let target = resolve(root.path(), &args.path)?;
            let offset = args.offset.unwrap_or(0);
            let limit = args
                .limit
                .map_or(READ_LIMIT as u64, |l| l.min(READ_LIMIT as u64));
            let chunk = root.read(&target, offset, limit)?;
            let end = offset + chunk.bytes.len() as u64;
            let mut text = String::from_utf8_lossy(&chunk.bytes).into_owned();
            if offset > chunk.total {
                let _ = write!(
                    text,
                    "[offset {offset} is past the end: {:?} is {} bytes]",
                    args.path, chunk.total
                );
            } else if end < chunk.total {
                let _ = write!(
                    text,
                    "\n[truncated: bytes {offset}..{end} of {} shown; continue with offset={end}]",
                    chunk.total
                );
            }
            Ok(text)
        })
        .await
    }
}

#[async_trait]
impl Tool for WriteFile {
    fn name(&self) -> &'static str {
        "write_file"
    }

    fn capability(&self) -> Option<Capability> {
        Some(Capability::FileWrite)
    }

    fn description(&self) -> &'static str {
        "Create or replace a file in your workspace (parent directories are created; up to 1 MiB)."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": { "type": "string", "description": "File path relative to the workspace." },
                "content": { "type": "string", "description": "The whole new content of the file." }
            },
            "required": ["path", "content"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let args: WriteArgs = decode(self, args)?;
        if args.content.len() > WRITE_LIMIT {
            return Err(ToolError::new(format!(
                "content for {:?} is {} bytes; write_file takes at most {WRITE_LIMIT}",
                args.path,
                args.content.len()
            )));
        }
        let workspace = workspace(ctx)?;
        blocking(move || {
            let root = Root::open(&workspace)?;
            let target = resolve(root.path(), &args.path)?;
            root.write(&target, args.content.as_bytes())?;
            Ok(format!(
                "wrote {} bytes to {:?}",
                args.content.len(),
                args.path
            ))
        })
        .await
    }
}

#[async_trait]
impl Tool for EditFile {
    fn name(&self) -> &'static str {
        "edit_file"
    }

    fn capability(&self) -> Option<Capability> {
        Some(Capability::FileWrite)
    }

    fn description(&self) -> &'static str {
        "Replace exactly one occurrence of `old` with `new` in a workspace file."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": { "type": "string", "description": "File path relative to the workspace." },
                "old": { "type": "string", "description": "Exact text to find; must occur exactly once." },
                "new": { "type": "string", "description": "Text to put in its place." }
            },
            "required": ["path", "old", "new"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let args: EditArgs = decode(self, args)?;
        if args.old.is_empty() {
            return Err(ToolError::new(
                "`old` is empty; give the exact text to replace",
            ));
        }
        let workspace = workspace(ctx)?;
        blocking(move || {
            let root = Root::open(&workspace)?;
            let target = resolve(root.path(), &args.path)?;
            let chunk = root.read(&target, 0, WRITE_LIMIT as u64 + 1)?;
            if chunk.total > WRITE_LIMIT as u64 {
                return Err(ToolError::new(format!(
                    "{:?} is {} bytes; edit_file handles files up to {WRITE_LIMIT}",
                    args.path, chunk.total
                )));
            }
            let text = String::from_utf8(chunk.bytes).map_err(|_| {
                ToolError::new(format!(
                    "{:?} is not UTF-8 text; edit_file cannot edit it",
                    args.path
                ))
            })?;
            let at = match occurrences(&text, &args.old) {
                (0, _) => {
                    return Err(ToolError::new(format!(
                        "`old` was not found in {:?}; nothing changed",
                        args.path
                    )));
                }
                (1, at) => at,
                (n, _) => {
                    return Err(ToolError::new(format!(
                        "`old` occurs {n} times in {:?}; include more context so it occurs once",
                        args.path
                    )));
                }
            };
            let mut edited = String::with_capacity(text.len() - args.old.len() + args.new.len());
            edited.push_str(&text[..at]);
            edited.push_str(&args.new);
            edited.push_str(&text[at + args.old.len()..]);
            if edited.len() > WRITE_LIMIT {
                return Err(ToolError::new(format!(
                    "the edited {:?} would be {} bytes, over the {WRITE_LIMIT}-byte limit",
                    args.path,
                    edited.len()
                )));
            }
            root.write(&target, edited.as_bytes())?;
            Ok(format!(
                "replaced 1 occurrence in {:?} (now {} bytes)",
                args.path,
                edited.len()
            ))
        })
        .await
    }
}

/// How many times `needle` (non-empty) occurs in `text`, overlaps counted,
/// and where the first starts.
fn occurrences(text: &str, needle: &str) -> (usize, usize) {
    let step = needle.chars().next().map_or(1, char::len_utf8);
    let mut count = 0;
    let mut first = 0;
    let mut from = 0;
    while let Some(found) = text[from..].find(needle) {
        if count == 0 {
            first = from + found;
        }
        count += 1;
        from += found + step;
    }
    (count, first)
}

#[async_trait]
impl Tool for ListDir {
    fn name(&self) -> &'static str {
        "list_dir"
    }

    fn capability(&self) -> Option<Capability> {
        Some(Capability::FileRead)
    }

    fn description(&self) -> &'static str {
        "List a directory in your workspace: names, kinds (file/dir/symlink) and sizes, sorted."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": { "type": "string", "description": "Directory relative to the workspace (default \".\")." }
            },
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let args: ListArgs = decode(self, args)?;
        let path = args.path.unwrap_or_else(|| ".".to_owned());
        let workspace = workspace(ctx)?;
        blocking(move || {
            let root = Root::open(&workspace)?;
            let target = resolve(root.path(), &path)?;
            let listing = root.list(&target, LIST_LIMIT)?;
            let mut text = format!("{path:?}: {} entries\n", listing.total);
            for entry in &listing.entries {
                let size = entry.size.map_or_else(|| "-".to_owned(), |s| s.to_string());
                let slash = if entry.kind == "dir" { "/" } else { "" };
                let _ = writeln!(text, "{:<8}{size:>10}  {}{slash}", entry.kind, entry.name);
            }
            if listing.entries.len() < listing.total {
                let _ = write!(
                    text,
                    "[truncated: first {} of {} entries shown]",
                    listing.entries.len(),
                    listing.total
                );
            }
            Ok(text)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::occurrences;

    #[test]
    fn occurrences_count_overlaps_and_find_the_first() {
        assert_eq!(occurrences("abc", "x"), (0, 0));
        assert_eq!(occurrences("xabc", "ab"), (1, 1));
        assert_eq!(occurrences("aaa", "aa"), (2, 0));
        assert_eq!(occurrences("éé", "é"), (2, 0));
    }
}
