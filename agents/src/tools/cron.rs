//! `schedule_cron`, `list_cron` and `remove_cron`: an agent's own schedules.
//!
//! They act through `Syscalls`, so an agent may aim an entry only at itself
//! or a descendant, and sees and removes only its own entries.

use crate::capability::Capability;
use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Tool, ToolContext, ToolError, ToolRegistry, decode};
use crate::cron::{CronAction, CronSpec, Missed, Overlap};
use crate::process::Pid;

/// Adds the three cron tools.
pub fn register(registry: &mut ToolRegistry) {
    registry.register(Arc::new(ScheduleCron));
    registry.register(Arc::new(ListCron));
    registry.register(Arc::new(RemoveCron));
}

/// Adds a cron entry.
#[derive(Debug, Clone, Copy, Default)]
pub struct ScheduleCron;

/// Lists the caller's cron entries.
#[derive(Debug, Clone, Copy, Default)]
pub struct ListCron;

/// Removes one of the caller's cron entries.
#[derive(Debug, Clone, Copy, Default)]
pub struct RemoveCron;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleArgs {
    name: String,
    expression: String,
    task: String,
    #[serde(default)]
    action: CronAction,
    pid: Option<u64>,
    template: Option<String>,
    #[serde(default)]
    overlap: Overlap,
    #[serde(default)]
    missed: Missed,
}

/// `list_cron` takes no arguments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RemoveArgs {
    name: String,
}

fn refused(err: crate::syscalls::SyscallError) -> ToolError {
    ToolError::new(err.message)
}

#[async_trait]
impl Tool for ScheduleCron {
    fn name(&self) -> &'static str {
        "schedule_cron"
    }

    fn capability(&self) -> Option<Capability> {
        Some(Capability::ManageCron)
    }

    fn description(&self) -> &'static str {
        "Schedule a recurring task, spawn or message (cron expression, UTC) for yourself or a descendant."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "name": { "type": "string", "description": "Unique name of the entry." },
                "expression": { "type": "string", "description": "5-field crontab line (e.g. \"*/15 * * * *\"), 6 fields with seconds first, or @hourly/@daily." },
                "task": { "type": "string", "description": "The task (or message) text." },
                "action": { "type": "string", "enum": CronAction::ALL, "description": "execute (default): run the task on pid; spawn: start an agent from a template under pid and run it there; message: send the text to pid." },
                "pid": { "type": "integer", "minimum": 2, "description": "Yourself (default) or a descendant." },
                "template": { "type": "string", "description": "For spawn: a template name from the config." },
                "overlap": { "type": "string", "enum": Overlap::ALL, "description": "A slot that comes while the last run still goes on: skip (default) or allow." },
                "missed": { "type": "string", "enum": Missed::ALL, "description": "Slots missed while the kernel was down: skip (default) or run_once." }
            },
            "required": ["name", "expression", "task"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let args: ScheduleArgs = decode(self, args)?;
        let spec = CronSpec {
            name: args.name,
            expression: args.expression,
            action: args.action,
            // Yourself unless you name a descendant.
            target: args.pid.map_or(ctx.process.pid, Pid),
            template: args.template,
            description: args.task,
            enabled: true,
            overlap: args.overlap,
            missed: args.missed,
            approvals: Vec::new(),
        };
        let entry = ctx
            .process
            .syscalls
            .schedule_cron(spec)
            .await
            .map_err(refused)?;
        Ok(match entry.next_run_unix_ms {
            Some(next) => format!(
                "scheduled {}; next run at {next} (Unix ms)",
                entry.spec.name
            ),
            None => format!("scheduled {}; it has no next run", entry.spec.name),
        })
    }
}

#[async_trait]
impl Tool for ListCron {
    fn name(&self) -> &'static str {
        "list_cron"
    }

    fn capability(&self) -> Option<Capability> {
        None
    }

    fn description(&self) -> &'static str {
        "List your cron entries with their next run and latest runs."
    }

    fn parameters(&self) -> Value {
        json!({ "type": "object", "properties": {}, "additionalProperties": false })
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let NoArgs {} = decode(self, args)?;
        let entries = ctx.process.syscalls.list_cron().await.map_err(refused)?;
        let summaries: Vec<Value> = entries
            .iter()
            .map(|e| {
                json!({
                    "name": e.spec.name,
                    "expression": e.spec.expression,
                    "action": e.spec.action,
                    "pid": e.spec.target,
                    "task": e.spec.description,
                    "next_run_unix_ms": e.next_run_unix_ms,
                    "runs": e.runs,
                    "last": e.history.last(),
                })
            })
            .collect();
        serde_json::to_string(&summaries)
            .map_err(|err| ToolError::new(format!("cannot encode answer: {err}")))
    }
}

#[async_trait]
impl Tool for RemoveCron {
    fn name(&self) -> &'static str {
        "remove_cron"
    }

    fn capability(&self) -> Option<Capability> {
        Some(Capability::ManageCron)
    }

    fn description(&self) -> &'static str {
        "Remove one of your cron entries by name."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": { "name": { "type": "string", "description": "The entry's name." } },
            "required": ["name"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let args: RemoveArgs = decode(self, args)?;
        ctx.process
            .syscalls
            .remove_cron(&args.name)
            .await
            .map_err(refused)?;
        Ok(format!("removed {}", args.name))
    }
}
