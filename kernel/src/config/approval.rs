//! `approval`, both phases: the tool calls that need a person's yes before
//! they run, per role (`roles.<role>.approval`) and per agent
//! (`agents[i].approval`).
//!
//! ```json
//! "approval": [
//!   { "tool": "shell_exec", "arguments": "*rm *", "timeout_seconds": 300 },
//!   { "tool": "mcp:github", "on_timeout": "deny" }
//! ]
//! ```

use hivekernel_agents::approval::{DEFAULT_APPROVAL_TIMEOUT_SECONDS, MAX_APPROVAL_TIMEOUT_SECONDS};
use hivekernel_agents::{ApprovalRule, OnTimeout};
use serde::Deserialize;
use serde_json::Value;

use super::parse::{describe, section};
use super::{ConfigIssue, at};

/// Longest `arguments` glob, in bytes.
const MAX_GLOB_BYTES: usize = 1024;
/// Most rules in one list.
const MAX_RULES: usize = 64;

/// One rule as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawRule {
    tool: Option<String>,
    arguments: Option<String>,
    timeout_seconds: Option<u64>,
    on_timeout: Option<String>,
}

/// Parses and checks an `approval` list at `location` (tool names are
/// checked against the known tools by the caller, which knows them).
pub(super) fn rules(
    value: Option<&Value>,
    location: &str,
    issues: &mut Vec<ConfigIssue>,
) -> Vec<ApprovalRule> {
    let list = match value {
        None | Some(Value::Null) => return Vec::new(),
        Some(Value::Array(list)) => list,
        Some(other) => {
            issues.push(ConfigIssue::new(
                location,
                format!(
                    "expected a list of approval rules, found {}",
                    describe(other)
                ),
            ));
            return Vec::new();
        }
    };
    if list.len() > MAX_RULES {
        issues.push(ConfigIssue::new(
            location,
            format!("at most {MAX_RULES} rules, got {}", list.len()),
        ));
        return Vec::new();
    }
    let mut rules = Vec::new();
    for (i, value) in list.iter().enumerate() {
        let here = format!("{location}[{i}]");
        let raw = section::<RawRule>(Some(value), &here, issues);
        let tool = match raw.value.tool {
            Some(tool) if !tool.trim().is_empty() => tool,
            Some(_) => {
                issues.push(ConfigIssue::new(
                    at(&here, "tool"),
                    "tool must not be empty",
                ));
                continue;
            }
            None if raw.is_ok("tool") => {
                issues.push(ConfigIssue::new(
                    at(&here, "tool"),
                    "missing required field `tool` (a tool name, or mcp:<server>[/<tool>])",
                ));
                continue;
            }
            None => continue,
        };
        if let Some(glob) = &raw.value.arguments
            && (glob.is_empty() || glob.len() > MAX_GLOB_BYTES)
        {
            issues.push(ConfigIssue::new(
                at(&here, "arguments"),
                format!(
                    "a glob of 1 to {MAX_GLOB_BYTES} bytes (`*` any text, `?` one character), \
                     got {} bytes",
                    glob.len()
                ),
            ));
        }
        let timeout_seconds = raw
            .value
            .timeout_seconds
            .unwrap_or(DEFAULT_APPROVAL_TIMEOUT_SECONDS);
        if !(1..=MAX_APPROVAL_TIMEOUT_SECONDS).contains(&timeout_seconds) {
            issues.push(ConfigIssue::new(
                at(&here, "timeout_seconds"),
                format!(
                    "must be between 1 and {MAX_APPROVAL_TIMEOUT_SECONDS}, got {timeout_seconds}"
                ),
            ));
        }
        let on_timeout = match raw.value.on_timeout.as_deref() {
            None | Some("deny") => OnTimeout::Deny,
            Some("approve") => OnTimeout::Approve,
            Some(other) => {
                issues.push(ConfigIssue::new(
                    at(&here, "on_timeout"),
                    format!(
                        "unknown on_timeout {} (expected one of: deny, approve)",
                        hivekernel_agents::text::shown(other)
                    ),
                ));
                OnTimeout::Deny
            }
        };
        rules.push(ApprovalRule {
            tool,
            arguments: raw.value.arguments,
            timeout_seconds,
            on_timeout,
        });
    }
    rules
}
