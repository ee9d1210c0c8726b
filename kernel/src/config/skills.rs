//! Skills, both phases: the directories skills are loaded from
//! (`kernel.skills`, and an agent's `skills`) and how much of a
//! `tool_agent`'s system prompt they may take (`tool_agent.skills`).
//!
//! ```json
//! "kernel": { "skills": ["../skills", "~/.agents/skills"] },
//! "agents": [{ "name": "ops", "skills": ["../ops-skills"], "tools": ["skills"] }],
//! "tool_agent": { "skills": { "catalogue_tokens": 4000, "active_tokens": 16000 } }
//! ```
//!
//! A directory is relative to the config file's directory; `~/` starts at
//! `$HOME`. One that does not exist is not an error: the kernel warns when
//! it loads skills, so one config serves machines with and without it.

use std::path::{Path, PathBuf};

use hivekernel_agents::tool_agent::AgentSettings;
use serde_json::Value;

use super::ConfigIssue;
use super::parse::settings;
use super::validate::Context;

/// Most directories one `skills` list names.
pub(super) const MAX_DIRS: usize = 64;

/// Resolves a `skills` list: each entry a directory, no duplicates.
pub(super) fn dirs<E: AsRef<Path>>(
    entries: &[E],
    location: &str,
    checks: &Context<'_>,
    issues: &mut Vec<ConfigIssue>,
) -> Vec<PathBuf> {
    if entries.len() > MAX_DIRS {
        issues.push(ConfigIssue::new(
            location,
            format!("names {} directories; at most {MAX_DIRS}", entries.len()),
        ));
        return Vec::new();
    }
    // With each one's index in `entries`, for the duplicate message.
    let mut resolved: Vec<(usize, PathBuf)> = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let here = format!("{location}[{i}]");
        let entry = entry.as_ref().to_string_lossy();
        let path = match entry.strip_prefix("~/") {
            Some(rest) => match std::env::var_os("HOME") {
                Some(home) if !home.is_empty() => Some(Path::new(&home).join(rest)),
                _ => {
                    issues.push(ConfigIssue::new(
                        here,
                        "starts with ~/ but HOME is not set; give the directory's full path",
                    ));
                    continue;
                }
            },
            None => checks.path_field(entry.as_ref(), &here, issues),
        };
        let Some(path) = path else {
            continue;
        };
        if let Some((first, _)) = resolved.iter().find(|(_, seen)| *seen == path) {
            issues.push(ConfigIssue::new(
                here,
                format!("duplicate directory {entry:?} (also {location}[{first}])"),
            ));
            continue;
        }
        resolved.push((i, path));
    }
    resolved.into_iter().map(|(_, path)| path).collect()
}

/// Parses and checks `tool_agent.skills` into `agent`.
pub(super) fn prompt(
    value: Option<&Value>,
    agent: &mut AgentSettings,
    issues: &mut Vec<ConfigIssue>,
) {
    agent.skills = settings(value, "tool_agent.skills", issues).value;
}
