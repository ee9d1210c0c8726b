//! Cron: schedules that run tasks, spawn short-lived agents or drop messages.
//!
//! An entry names a schedule ([`expr`]: 5-field crontab, or 6/7 fields with
//! seconds), an action, a target process and a text. Entries come from the
//! config (`agents[].cron`, owned by that agent) and from the API (gRPC, the
//! CLI, the cron tools), and all of them are kept in the store with their
//! run history.
//!
//! Firing is at most once: the fire time is committed to the store before
//! the action starts, so a crash between the two never fires the same slot
//! twice. After downtime, a slot that passed is skipped, or run once when
//! the entry's `missed` policy is `run_once`. With `overlap: skip` (the
//! default) a slot that comes while the previous run is still going is
//! recorded as skipped.
//!
//! Layout: `expr` (expressions), `schedule` (the entries and the timer
//! task), `run` (the actions).

pub(crate) mod expr;
mod run;
mod schedule;

use hivekernel_agents::Pid;
use serde::{Deserialize, Serialize};

use crate::error::shown;

pub use run::CRON_MESSAGE;
pub(crate) use schedule::Cron;
pub use schedule::{MAX_CRON_NAME_BYTES, MAX_CRON_PER_PROCESS};

/// The first time `expression` fires strictly after `after_ms` (Unix ms),
/// `None` when it never fires again; or why the expression is refused, as
/// the config check and `add_cron` say it.
pub fn next_fire(expression: &str, after_ms: u64) -> Result<Option<u64>, String> {
    expr::parse(expression).map(|schedule| expr::next_after(&schedule, after_ms))
}

/// What an entry does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CronAction {
    /// Run the text as a task on the target and record its answer.
    #[default]
    Execute,
    /// Spawn a fresh agent from a config template under the target, run the
    /// text as its task, record the answer, and kill and collect the agent.
    Spawn,
    /// Drop the text into the target's mailbox as a `cron` message.
    Message,
}

/// What happens to a slot that comes while the previous run is still going.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// Record the slot as skipped.
    #[default]
    Skip,
    /// Run it anyway, beside the previous run.
    Allow,
}

/// What happens to slots that passed while the kernel was down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Missed {
    /// Forget them; wait for the next slot.
    #[default]
    Skip,
    /// Run once at start, however many passed.
    RunOnce,
}

/// Where an entry came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CronSource {
    /// `agents[].cron` in the startup config: edited there, not through the API.
    Config,
    /// Added through gRPC, the CLI or a tool.
    Api,
}

impl CronSource {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CronSource::Config => "config",
            CronSource::Api => "api",
        }
    }
}

/// One cron entry as it is declared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CronSpec {
    /// Unique name.
    pub name: String,
    /// The schedule.
    pub expression: String,
    /// What it does.
    #[serde(default)]
    pub action: CronAction,
    /// Who it acts on: the task's or message's receiver, or the spawned agent's parent.
    pub target: Pid,
    /// For `spawn`: the name of a `templates` entry in the config.
    #[serde(default)]
    pub template: Option<String>,
    /// The task or message text.
    #[serde(default)]
    pub description: String,
    /// A disabled entry keeps its place and history but never fires.
    #[serde(default = "enabled")]
    pub enabled: bool,
    /// See [`Overlap`].
    #[serde(default)]
    pub overlap: Overlap,
    /// See [`Missed`].
    #[serde(default)]
    pub missed: Missed,
}

fn enabled() -> bool {
    true
}

/// A spec's fields as text, the way gRPC and the cron tools spell them
/// (empty action and policies take the defaults).
#[derive(Debug, Clone)]
pub struct CronText {
    /// Unique name.
    pub name: String,
    /// The schedule.
    pub expression: String,
    /// `execute`, `spawn` or `message`.
    pub action: String,
    /// Who it acts on.
    pub target: Pid,
    /// For `spawn`.
    pub template: Option<String>,
    /// The task or message text.
    pub description: String,
    /// Whether it fires.
    pub enabled: bool,
    /// `skip` or `allow`.
    pub overlap: String,
    /// `skip` or `run_once`.
    pub missed: String,
}

impl CronSpec {
    /// Reads the names in `text`; an unknown one is an error naming the field
    /// and the allowed values. The rest is checked when the entry is added.
    pub fn from_text(text: CronText) -> Result<CronSpec, String> {
        let action = match text.action.as_str() {
            "" | "execute" => CronAction::Execute,
            "spawn" => CronAction::Spawn,
            "message" => CronAction::Message,
            other => {
                return Err(format!(
                    "action: unknown {} (expected execute, spawn or message)",
                    shown(other)
                ));
            }
        };
        let overlap = match text.overlap.as_str() {
            "" | "skip" => Overlap::Skip,
            "allow" => Overlap::Allow,
            other => {
                return Err(format!(
                    "overlap: unknown {} (expected skip or allow)",
                    shown(other)
                ));
            }
        };
        let missed = match text.missed.as_str() {
            "" | "skip" => Missed::Skip,
            "run_once" => Missed::RunOnce,
            other => {
                return Err(format!(
                    "missed: unknown {} (expected skip or run_once)",
                    shown(other)
                ));
            }
        };
        Ok(CronSpec {
            name: text.name,
            expression: text.expression,
            action,
            target: text.target,
            template: text.template.filter(|t| !t.is_empty()),
            description: text.description,
            enabled: text.enabled,
            overlap,
            missed,
        })
    }
}

/// One run of an entry (or a slot it skipped).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CronRun {
    /// The slot it ran for (Unix ms).
    pub at_unix_ms: u64,
    /// `ok`, `failed`, `skipped` (overlap) or `missed` (downtime, not run).
    pub status: String,
    /// How long the action took.
    pub duration_ms: u64,
    /// The start of its answer or error, at most [`OUTPUT_PREVIEW`] bytes.
    pub output: String,
}

/// Bytes of a run's answer kept in its history.
pub const OUTPUT_PREVIEW: usize = 200;
/// Runs kept per entry.
pub const HISTORY: usize = 20;

/// An entry and what it has done.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CronInfo {
    /// As declared.
    #[serde(flatten)]
    pub spec: CronSpec,
    /// The process it belongs to (PID 1 for the operator's).
    pub owner: Pid,
    /// Where it came from.
    pub source: CronSource,
    /// The next slot, when enabled and the schedule has one.
    pub next_run_unix_ms: Option<u64>,
    /// The last slot it fired for.
    pub last_run_unix_ms: Option<u64>,
    /// When it was added.
    pub created_unix_ms: u64,
    /// Runs so far (skipped slots included).
    pub runs: u64,
    /// Whether a run is going now.
    pub running: bool,
    /// The latest runs, newest last.
    pub history: Vec<CronRun>,
}
