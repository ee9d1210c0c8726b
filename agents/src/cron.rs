//! Cron vocabulary shared by the kernel, its doors and the cron tools: what
//! an entry does, its policies, the entry as declared and as it has run.
//!
//! Each word (`execute`, `skip`, `run_once`, ...) is spelled once, in the
//! enums below; configs, gRPC, the CLI, the tools and the store all read and
//! write it through them.

use serde::{Deserialize, Serialize};

use crate::named::named_enum;
use crate::process::Pid;

named_enum!(
    /// What an entry does when it fires.
    #[derive(Default)]
    CronAction, "action" {
        #[default]
        /// Run the text as a task on the target and record its answer.
        Execute = "execute",
        /// Spawn a fresh agent from a config template under the target, run the
        /// text as its task, record the answer, and kill and collect the agent.
        Spawn = "spawn",
        /// Drop the text into the target's mailbox as a `cron` message.
        Message = "message",
    }
);

named_enum!(
    /// What happens to a slot that comes while the previous run is still going.
    #[derive(Default)]
    Overlap, "overlap policy" {
        #[default]
        /// Record the slot as skipped.
        Skip = "skip",
        /// Run it anyway, beside the previous run.
        Allow = "allow",
    }
);

named_enum!(
    /// What happens to slots that passed while the kernel was down.
    #[derive(Default)]
    Missed, "missed-run policy" {
        #[default]
        /// Forget them; wait for the next slot.
        Skip = "skip",
        /// Run once at start, however many passed.
        RunOnce = "run_once",
    }
);

named_enum!(
    /// Where an entry came from.
    CronSource, "source" {
        /// `agents[].cron` in the startup config: edited there, not through the API.
        Config = "config",
        /// Added through gRPC, the CLI or a tool.
        Api = "api",
    }
);

/// Reads one of these enums as gRPC and the CLI send it: empty is the
/// default; an unknown word is an error naming `field` and the known words.
pub fn parse_or_default<T>(field: &str, text: &str) -> Result<T, String>
where
    T: Default + std::str::FromStr<Err = String>,
{
    if text.is_empty() {
        return Ok(T::default());
    }
    text.parse().map_err(|why| format!("{field}: {why}"))
}

/// One cron entry as it is declared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CronSpec {
    /// Unique name.
    pub name: String,
    /// The schedule: 5-field crontab, 6/7 fields with seconds, or `@daily` and friends.
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
    /// The approval rules its firings run under: those of whoever added
    /// it, set by the kernel (whatever the caller puts here is replaced;
    /// see [`crate::Task::approvals`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<crate::approval::ApprovalRule>,
}

fn enabled() -> bool {
    true
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    /// A config entry enabled or disabled by hand rather than as the
    /// config declares it (`spec.enabled` is the switch).
    #[serde(default)]
    pub switched: bool,
    /// On a node of a cluster, the node that keeps and fires it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn words_are_read_once_with_defaults_for_empty() {
        assert_eq!(
            parse_or_default::<CronAction>("action", ""),
            Ok(CronAction::Execute)
        );
        assert_eq!(
            parse_or_default::<Missed>("missed", "run_once"),
            Ok(Missed::RunOnce)
        );
        let why = parse_or_default::<Overlap>("overlap", "maybe").unwrap_err();
        assert_eq!(
            why,
            "overlap: unknown overlap policy \"maybe\" (expected one of: skip, allow)"
        );
        let huge = "a".repeat(2 << 20);
        let why = parse_or_default::<CronAction>("action", &huge).unwrap_err();
        assert!(why.len() < 200 && why.contains("2097152 bytes"), "{why}");
    }

    #[test]
    fn an_entry_reads_back_as_it_was_written() {
        let info = CronInfo {
            spec: CronSpec {
                name: "n".into(),
                expression: "@daily".into(),
                action: CronAction::Spawn,
                target: Pid(4),
                template: Some("t".into()),
                description: "d".into(),
                enabled: true,
                overlap: Overlap::Allow,
                missed: Missed::RunOnce,
                approvals: Vec::new(),
            },
            owner: Pid(4),
            source: CronSource::Api,
            next_run_unix_ms: Some(5),
            last_run_unix_ms: None,
            created_unix_ms: 1,
            runs: 0,
            running: false,
            history: Vec::new(),
            switched: false,
            node: Some("b".into()),
        };
        let json = serde_json::to_value(&info).unwrap();
        assert_eq!(json["action"], "spawn");
        assert_eq!(json["missed"], "run_once");
        assert_eq!(serde_json::from_value::<CronInfo>(json).unwrap(), info);
    }
}
