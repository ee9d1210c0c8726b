//! Approval rules: which tool calls need a person's yes before they run.
//!
//! A rule names a tool (`shell_exec`, an MCP entry `mcp:<server>/<tool>` or
//! a whole server `mcp:<server>`) and, optionally, a glob its arguments must
//! match (for `shell_exec` the command; for any other tool its arguments as
//! compact JSON), matched without regard to case: a rule that asks about
//! `*curl *` also holds `CURL` (where case makes another command, the call
//! only needs an approval it did not strictly need). A process gets its role's rules, its own (a config agent's
//! `approval`) and its parent's: a child never needs fewer approvals than
//! its parent.

use serde::{Deserialize, Serialize};

use crate::text::glob_matches;

/// The wait for a decision when a rule names none: ten minutes.
pub const DEFAULT_APPROVAL_TIMEOUT_SECONDS: u64 = 600;
/// The longest wait a rule may name: a day.
pub const MAX_APPROVAL_TIMEOUT_SECONDS: u64 = 86_400;

/// What a timeout decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    /// The call is refused (the default).
    #[default]
    Deny,
    /// The call runs.
    Approve,
}

impl OnTimeout {
    /// `deny` or `approve`.
    pub fn as_str(self) -> &'static str {
        match self {
            OnTimeout::Deny => "deny",
            OnTimeout::Approve => "approve",
        }
    }
}

/// One rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ApprovalRule {
    /// The tool it covers.
    pub tool: String,
    /// A glob the arguments must match (`*` any text, `?` one character;
    /// letters of either case match each other); `None`: every call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
    /// How long to wait for a decision.
    pub timeout_seconds: u64,
    /// What the timeout decides.
    #[serde(default)]
    pub on_timeout: OnTimeout,
}

impl ApprovalRule {
    /// Whether a call of `tool` (canonical: a built-in name or
    /// `mcp:<server>/<tool>`) with `arguments` needs this rule's approval.
    pub fn covers(&self, tool: &str, arguments: &serde_json::Value) -> bool {
        let named = self.tool == tool
            || tool.strip_prefix(&self.tool).is_some_and(|rest| {
                self.tool.starts_with("mcp:") && !self.tool.contains('/') && rest.starts_with('/')
            });
        if !named {
            return false;
        }
        match &self.arguments {
            None => true,
            Some(glob) => glob_matches(
                &glob.to_lowercase(),
                &argument_text(tool, arguments).to_lowercase(),
            ),
        }
    }
}

/// What an `arguments` glob is matched against: `shell_exec`'s command, or
/// the arguments as compact JSON.
pub fn argument_text(tool: &str, arguments: &serde_json::Value) -> String {
    if tool == "shell_exec"
        && let Some(command) = arguments.get("command").and_then(|c| c.as_str())
    {
        return command.to_owned();
    }
    arguments.to_string()
}

/// The most distinct rules one piece of work may be asked under (its
/// requesters' along the chain, together): more is refused rather than
/// forgotten, since a rule forgotten is an approval skipped.
pub const MAX_CARRIED_RULES: usize = 256;

/// The approval rules a piece of work carries from whoever asked for it
/// (a message's, a task's): most carry none, so they take one pointer
/// (a `Vec` would add three words to every message and task, which are
/// moved at every step of their delivery), and a copy shares them.
/// Reads as a slice; (de)serialized as a list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Carried(Option<std::sync::Arc<Vec<ApprovalRule>>>);

impl Carried {
    /// No rules.
    pub const NONE: Carried = Carried(None);

    /// Whether it carries no rule.
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// The rules, as a list of their own.
    pub fn to_vec(&self) -> Vec<ApprovalRule> {
        self.0.as_deref().cloned().unwrap_or_default()
    }
}

impl From<Vec<ApprovalRule>> for Carried {
    fn from(rules: Vec<ApprovalRule>) -> Self {
        Carried((!rules.is_empty()).then(|| std::sync::Arc::new(rules)))
    }
}

impl std::ops::Deref for Carried {
    type Target = [ApprovalRule];

    fn deref(&self) -> &[ApprovalRule] {
        self.0.as_deref().map_or(&[], Vec::as_slice)
    }
}

impl Serialize for Carried {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        (**self).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Carried {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<ApprovalRule>::deserialize(deserializer).map(Carried::from)
    }
}

/// Adds to `into` each rule of `more` it does not hold yet.
pub fn join(into: &mut Vec<ApprovalRule>, more: &[ApprovalRule]) {
    for rule in more {
        if !into.contains(rule) {
            into.push(rule.clone());
        }
    }
}

/// The first rule of `rules` that covers the call, if any.
pub fn first_covering<'a>(
    rules: &'a [ApprovalRule],
    tool: &str,
    arguments: &serde_json::Value,
) -> Option<&'a ApprovalRule> {
    rules.iter().find(|rule| rule.covers(tool, arguments))
}
