//! Skills: procedures in the Agent Skills format (a directory holding a
//! `SKILL.md`: YAML frontmatter, then a Markdown body; optional
//! `scripts/`, `references/` and `assets/`) that agents discover by name
//! and description and read when they need them.
//!
//! The kernel loads skills from the directories its config names and
//! answers which of them a process may see ([`Syscalls::skills`](crate::Syscalls::skills));
//! a tool list selects them with [`SkillSelector`] entries.
//!
//! Processes holding the `manage_skills` capability save skills of their
//! own with `skill_manage`; the kernel keeps those in its store, versioned,
//! and shows them by their [`SkillVisibility`].
//!
//! Layout: `format` (reading and checking a `SKILL.md`), `saved` (skills
//! processes save: visibility, changes, versions), this file (the skill as
//! loaded, where it came from, tool-list entries, finding skill
//! directories).

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod format;
mod saved;
pub use format::{
    FIELDS, Finding, LONG_BODY, MAX_COMPATIBILITY, MAX_DESCRIPTION, MAX_FILE_BYTES, MAX_NAME, Read,
    SKILL_FILE, Severity, Strictness, parse, read,
};
pub use saved::{
    Rewrite, Saved, SkillAction, SkillChange, SkillRequest, SkillVersion, SkillVisibility,
    SkillWrite,
};

/// A skill as read from its directory.
#[derive(Debug, Clone, PartialEq)]
pub struct Skill {
    pub name: String,
    pub description: String,
    pub license: Option<String>,
    pub compatibility: Option<String>,
    /// `allowed-tools`, split on spaces (or given as a list).
    pub allowed_tools: Vec<String>,
    /// `metadata`, values as text, in the file's order.
    pub metadata: Vec<(String, String)>,
    /// Top-level fields the format does not define, kept as JSON.
    pub extra: Vec<(String, serde_json::Value)>,
    /// The Markdown after the frontmatter, trimmed.
    pub body: String,
    /// The skill's directory; for a saved skill, just its name (it has no
    /// files besides its `SKILL.md`, which the store holds).
    pub dir: PathBuf,
}

/// Where a loaded skill came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A directory of skills named in the config (`kernel.skills`, or an
    /// agent's `skills`), as resolved.
    Dir(Arc<Path>),
    /// Saved by a process with `skill_manage`, kept in the kernel's store.
    Saved(Arc<Saved>),
}

impl Source {
    /// The saved skill's record, when it is one.
    pub fn saved(&self) -> Option<&Saved> {
        match self {
            Source::Saved(saved) => Some(saved),
            Source::Dir(_) => None,
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Dir(dir) => write!(f, "{}", dir.display()),
            Source::Saved(saved) => write!(
                f,
                "saved by process {} ({}), version {}",
                saved.owner, saved.owner_name, saved.version
            ),
        }
    }
}

/// A skill a process may see, and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct SkillEntry {
    pub skill: Arc<Skill>,
    pub source: Source,
}

/// The skills a process may see, sorted by name, one per name.
pub type Catalogue = Arc<[SkillEntry]>;

/// The tool-list entry that selects every skill a process may see.
pub const ALL: &str = "skills";
/// The prefix of a tool-list entry selecting one skill: `skill:<name>`.
pub const PREFIX: &str = "skill:";

/// A tool-list entry selecting skills.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SkillSelector {
    /// `skills`: every skill the process may see.
    All,
    /// `skill:<name>`: that skill only.
    One(String),
}

impl SkillSelector {
    /// The selector `entry` spells; `None` when `entry` is no skill entry,
    /// `Some(Err)` naming the problem when it is one but malformed.
    pub fn parse(entry: &str) -> Option<Result<SkillSelector, String>> {
        if entry == ALL {
            return Some(Ok(SkillSelector::All));
        }
        let name = entry.strip_prefix(PREFIX)?;
        Some(match name_problem(name) {
            None => Ok(SkillSelector::One(name.to_owned())),
            Some(why) => Err(format!(
                "{}: {why}",
                crate::text::quoted(entry, MAX_NAME + PREFIX.len() + 8)
            )),
        })
    }

    /// Whether this entry selects skill `name`.
    pub fn selects(&self, name: &str) -> bool {
        match self {
            SkillSelector::All => true,
            SkillSelector::One(one) => one == name,
        }
    }

    /// Whether every skill `other` selects is selected by this entry too
    /// (a child may get `skill:deploy` from a parent holding `skills`).
    pub fn covers(&self, other: &SkillSelector) -> bool {
        match (self, other) {
            (SkillSelector::All, _) => true,
            (SkillSelector::One(mine), SkillSelector::One(theirs)) => mine == theirs,
            (SkillSelector::One(_), SkillSelector::All) => false,
        }
    }
}

impl fmt::Display for SkillSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkillSelector::All => f.write_str(ALL),
            SkillSelector::One(name) => write!(f, "{PREFIX}{name}"),
        }
    }
}

/// Whether a tool list selects skill `name`.
pub fn selected(tools: &[String], name: &str) -> bool {
    tools
        .iter()
        .filter_map(|entry| SkillSelector::parse(entry)?.ok())
        .any(|selector| selector.selects(name))
}

/// Why `name` cannot address a skill (in a tool list, a tool call or a
/// request), or `None`: 1 to [`MAX_NAME`] characters, none of them
/// whitespace, a control character or `/`. A loaded skill may break the
/// format's stricter rules (lowercase, hyphens) and still be used.
pub fn name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("the skill name is empty")
    } else if name.chars().count() > MAX_NAME {
        Some("a skill name is at most 64 characters")
    } else if name
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '/')
    {
        Some("a skill name holds no spaces, control characters or `/`")
    } else {
        None
    }
}

/// Directories a scan never enters.
const SKIPPED: [&str; 2] = ["node_modules", "target"];

/// The skill directories directly under `dir` (those holding a
/// [`SKILL_FILE`]), sorted; hidden directories are skipped.
pub fn scan(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || SKIPPED.contains(&name.as_ref()) {
            continue;
        }
        let path = entry.path();
        if path.is_dir() && path.join(SKILL_FILE).exists() {
            found.push(path);
        }
    }
    found.sort();
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_list_entries_select_every_skill_or_one() {
        assert_eq!(SkillSelector::parse("skills"), Some(Ok(SkillSelector::All)));
        assert_eq!(
            SkillSelector::parse("skill:deploy"),
            Some(Ok(SkillSelector::One("deploy".into())))
        );
        assert_eq!(SkillSelector::parse("shell_exec"), None);
        assert_eq!(SkillSelector::parse("skillset"), None);
        for bad in ["skill:", "skill:a b", "skill:a/b", "skill:\u{7}"] {
            assert!(
                matches!(SkillSelector::parse(bad), Some(Err(_))),
                "{bad:?} accepted"
            );
        }
        let long = format!("skill:{}", "a".repeat(65));
        let Some(Err(why)) = SkillSelector::parse(&long) else {
            panic!("a 65-character name accepted");
        };
        assert!(why.contains("at most 64"), "{why}");

        let tools = vec!["skill:deploy".to_owned(), "shell_exec".to_owned()];
        assert!(selected(&tools, "deploy"));
        assert!(!selected(&tools, "triage"));
        assert!(selected(&["skills".to_owned()], "triage"));
        assert!(SkillSelector::All.covers(&SkillSelector::One("x".into())));
        assert!(!SkillSelector::One("x".into()).covers(&SkillSelector::All));
        assert!(!SkillSelector::One("x".into()).covers(&SkillSelector::One("y".into())));
    }
}
