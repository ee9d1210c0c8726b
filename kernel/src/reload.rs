//! What a config reload did, as values: the daemon produces a
//! [`ReloadReport`], the gRPC service and the log show it. The reload
//! itself is the daemon's (daemon/reload.rs: it knows the config file) over
//! the kernel's operations (kernel/reload.rs).

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use futures::future::BoxFuture;
use hivekernel_agents::Pid;
use serde::Serialize;

use crate::caller::Caller;
use crate::config::ConfigIssue;
use crate::error::KernelError;

/// What a reload did to one config agent or cron entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// New in the config: spawned (an agent) or scheduled (a cron entry).
    Added,
    /// Gone from the config: killed and collected, or unscheduled.
    Removed,
    /// Changed: an agent killed and spawned again with its new spec as the same PID.
    Restarted,
    /// Changed: a cron entry replaced by its new spec (its history kept),
    /// or a role's defaults replaced.
    Updated,
    /// Same as before: left alone.
    Unchanged,
    /// Could not be applied; the change's detail says why and what was kept.
    Failed,
}

impl Outcome {
    /// The word the CLI and the log show.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Added => "added",
            Outcome::Removed => "removed",
            Outcome::Restarted => "restarted",
            Outcome::Updated => "updated",
            Outcome::Unchanged => "unchanged",
            Outcome::Failed => "failed",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One agent's or cron entry's part of a reload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// The agent's or entry's name.
    pub name: String,
    /// The agent's PID (an entry's owner's), when it has one.
    pub pid: Option<Pid>,
    /// What happened.
    pub outcome: Outcome,
    /// What changed, or why it failed; empty when there is nothing to say.
    pub detail: String,
}

impl Change {
    /// A change with no detail.
    pub fn new(name: impl Into<String>, pid: Option<Pid>, outcome: Outcome) -> Self {
        Change {
            name: name.into(),
            pid,
            outcome,
            detail: String::new(),
        }
    }

    /// The same change, with `detail`.
    pub fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = detail.into();
        self
    }
}

/// What one reload did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// The config file read.
    pub config: PathBuf,
    /// Why the config was refused; when any, nothing was changed.
    pub issues: Vec<ConfigIssue>,
    /// Config agents, in the new config's order, then those removed.
    pub agents: Vec<Change>,
    /// Config-declared cron entries, by name.
    pub cron: Vec<Change>,
    /// Roles of the `roles` section (either the old or the new one).
    pub roles: Vec<Change>,
    /// The skills directories, loaded again; empty when neither config names any.
    pub skills: Vec<Change>,
    /// Settings that differ from what the kernel runs with and take effect
    /// only at a kernel restart (`kernel.listen`, `llm`, ...).
    pub needs_restart: Vec<String>,
}

impl ReloadReport {
    /// Whether the config was valid and applied (some changes may still have failed).
    pub fn applied(&self) -> bool {
        self.issues.is_empty()
    }
}

/// Something that reloads the config a kernel was started with: the
/// daemon hands one to the gRPC service. A kernel started without a config
/// file (in-process kernels) has none, and `ReloadConfig` is refused.
pub trait ConfigReload: Send + Sync + fmt::Debug {
    /// Re-reads, validates and applies the config, acting as `caller`
    /// (only the admin may). The work runs to its end even when the
    /// returned future is dropped (a cancelled call).
    fn reload(
        self: Arc<Self>,
        caller: Caller,
    ) -> BoxFuture<'static, Result<ReloadReport, KernelError>>;
}
