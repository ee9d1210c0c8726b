//! `tool_agent.shell` and `kernel.exec`, both phases: what the sandbox gives
//! `shell_exec` commands and `exec` agents beyond the system paths and their
//! own workspace (see `hivekernel_agents::sandbox`).
//!
//! ```json
//! "tool_agent": {
//!   "shell": { "unsandboxed": false, "read_only": ["/srv/reference"], "read_write": ["/srv/scratch"] }
//! },
//! "kernel": {
//!   "exec": { "sandbox": true, "read_only": ["../sdk-examples/python", "/opt/venv"],
//!             "log": { "max_bytes": 10485760, "keep": 5 } }
//! }
//! ```
//!
//! Paths are relative to the config file's directory. A grant may not be
//! the data directory or lie inside it; one that contains it is fine (the
//! data directory is cut out of it).

use std::path::{Path, PathBuf};

use hivekernel_agents::sandbox::Grants;
use hivekernel_agents::tools::workspace::ShellSettings;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use validator::{Validate, ValidationError};

use super::ConfigIssue;
use super::parse::{section, settings};
use super::validate::Context;

/// Whether and how `exec` agents run confined (`kernel.exec`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecSettings {
    /// Start every `exec` agent (from config or at run time) in the sandbox.
    pub sandbox: bool,
    /// Paths granted on top of the system ones, the agent's workspace, its
    /// program and its working directory (read-only).
    pub grants: Grants,
    /// When each agent's log is rotated (`kernel.exec.log`).
    pub log: LogRotation,
}

/// How an `exec` agent's log is rotated (`kernel.exec.log`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema, Validate)]
#[serde(default, deny_unknown_fields)]
pub struct LogRotation {
    /// Rotate once the log is larger than this; 0: never.
    #[validate(custom(function = "rotation_size"))]
    pub max_bytes: u64,
    /// Rotated files kept beside the log (`.1` the newest); 0: the log is
    /// only truncated.
    #[validate(range(max = 100))]
    pub keep: u32,
}

/// A rotation size is 0 (never) or at least 64 KiB: a smaller one would
/// rotate on every check.
fn rotation_size(max_bytes: u64) -> Result<(), ValidationError> {
    const MIN: u64 = 64 * 1024;
    if max_bytes == 0 || max_bytes >= MIN {
        return Ok(());
    }
    Err(ValidationError::new("rotation_size").with_message(
        format!("{max_bytes} is too small (at least {MIN}, or 0 never to rotate)").into(),
    ))
}

impl LogRotation {
    /// 10 MiB, five rotated files: at most 60 MiB per agent.
    pub const DEFAULT: LogRotation = LogRotation {
        max_bytes: 10 * 1024 * 1024,
        keep: 5,
    };
}

impl Default for LogRotation {
    fn default() -> Self {
        LogRotation::DEFAULT
    }
}

/// `tool_agent.shell` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawShell {
    unsandboxed: bool,
    read_only: Vec<String>,
    read_write: Vec<String>,
}

/// `kernel.exec` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawExec {
    sandbox: bool,
    read_only: Vec<String>,
    read_write: Vec<String>,
    log: Option<Value>,
}

/// Parses and checks `tool_agent.shell` (the hidden paths are filled in
/// once the kernel section is known).
pub(super) fn shell(
    value: Option<&Value>,
    checks: &Context<'_>,
    issues: &mut Vec<ConfigIssue>,
) -> ShellSettings {
    let raw = section::<RawShell>(value, "tool_agent.shell", issues).value;
    ShellSettings {
        unsandboxed: raw.unsandboxed,
        grants: grants(
            &raw.read_only,
            &raw.read_write,
            "tool_agent.shell",
            checks,
            issues,
        ),
        keep_out: Default::default(),
        helper: None,
    }
}

/// Parses `kernel.exec` (checked against the data directory by [`check_grants`]).
pub(super) fn exec(
    value: Option<&Value>,
    checks: &Context<'_>,
    issues: &mut Vec<ConfigIssue>,
) -> ExecSettings {
    let raw = section::<RawExec>(value, "kernel.exec", issues).value;
    ExecSettings {
        log: log_rotation(raw.log.as_ref(), issues),
        sandbox: raw.sandbox,
        grants: grants(
            &raw.read_only,
            &raw.read_write,
            "kernel.exec",
            checks,
            issues,
        ),
    }
}

/// `kernel.exec.log`: the defaults for what it leaves out.
fn log_rotation(value: Option<&Value>, issues: &mut Vec<ConfigIssue>) -> LogRotation {
    settings(value, "kernel.exec.log", issues).value
}

/// `read_only` and `read_write` of `section`, resolved against the config's directory.
fn grants(
    read_only: &[String],
    read_write: &[String],
    section: &str,
    checks: &Context<'_>,
    issues: &mut Vec<ConfigIssue>,
) -> Grants {
    Grants {
        read_only: paths(read_only, &format!("{section}.read_only"), checks, issues),
        read_write: paths(read_write, &format!("{section}.read_write"), checks, issues),
    }
}

fn paths(
    values: &[String],
    location: &str,
    checks: &Context<'_>,
    issues: &mut Vec<ConfigIssue>,
) -> Vec<PathBuf> {
    values
        .iter()
        .enumerate()
        .filter_map(|(i, value)| checks.path_field(value, &format!("{location}[{i}]"), issues))
        .collect()
}

/// Refuses grants that are the data directory or lie inside it.
pub(crate) fn check_grants(
    grants: &Grants,
    location: &str,
    data_dir: &Path,
    issues: &mut Vec<ConfigIssue>,
) {
    let data = lexical(data_dir);
    let lists = [
        ("read_only", &grants.read_only),
        ("read_write", &grants.read_write),
    ];
    for (field, list) in lists {
        for (i, path) in list.iter().enumerate() {
            if lexical(path).starts_with(&data) {
                issues.push(ConfigIssue::new(
                    format!("{location}.{field}[{i}]"),
                    format!(
                        "{} is inside the kernel's data directory {} (its admin token and \
                         store must stay out of the sandbox)",
                        path.display(),
                        data_dir.display()
                    ),
                ));
            }
        }
    }
}

/// Why a workspace at `dir` and the data directory `data_dir` cannot go
/// together, if they cannot: one inside the other would put agents' files
/// beside the admin token and the store.
pub(super) fn overlap(dir: &Path, data_dir: &Path) -> Option<String> {
    let (workspace, data) = (lexical(dir), lexical(data_dir));
    if workspace.starts_with(&data) {
        return Some(format!(
            "{} is inside the data directory {}: agents would work beside its admin token and \
             store; put the workspaces elsewhere",
            dir.display(),
            data_dir.display()
        ));
    }
    if data.starts_with(&workspace) {
        return Some(format!(
            "{} holds the data directory {}: an agent's workspace would contain its admin \
             token and store; put the workspaces elsewhere",
            dir.display(),
            data_dir.display()
        ));
    }
    None
}

/// `path` made absolute and rid of `.` and `..` by its components alone
/// (it may not exist yet).
pub(crate) fn lexical(path: &Path) -> PathBuf {
    hivekernel_agents::sandbox::absolute(path)
}
