//! `list_children`, `list_siblings` and `get_process_info`.

use crate::capability::Capability;
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{decode, refused, summary, to_json};
use crate::process::Pid;
use crate::tools::{Tool, ToolContext, ToolError};

/// Lists the calling process's children.
#[derive(Debug, Clone, Copy, Default)]
pub struct ListChildren;

/// Lists the other children of the calling process's parent.
#[derive(Debug, Clone, Copy, Default)]
pub struct ListSiblings;

/// Describes one process (by default the caller).
#[derive(Debug, Clone, Copy, Default)]
pub struct GetProcessInfo;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InfoArgs {
    pid: Option<u64>,
}

/// The schema of a tool that takes no arguments.
fn no_parameters() -> Value {
    json!({ "type": "object", "properties": {}, "additionalProperties": false })
}

#[async_trait]
impl Tool for ListChildren {
    fn name(&self) -> &'static str {
        "list_children"
    }

    fn capability(&self) -> Option<Capability> {
        None
    }

    fn description(&self) -> &'static str {
        "List your live children as JSON: pid, name, role, tier, state."
    }

    fn parameters(&self) -> Value {
        no_parameters()
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let NoArgs {} = decode(self, args)?;
        let children = ctx
            .process
            .syscalls
            .list_children()
            .await
            .map_err(refused)?;
        to_json(&children.iter().map(summary).collect::<Vec<_>>())
    }
}

#[async_trait]
impl Tool for ListSiblings {
    fn name(&self) -> &'static str {
        "list_siblings"
    }

    fn capability(&self) -> Option<Capability> {
        None
    }

    fn description(&self) -> &'static str {
        "List your parent's other children as JSON: pid, name, role, tier, state."
    }

    fn parameters(&self) -> Value {
        no_parameters()
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let NoArgs {} = decode(self, args)?;
        let sys = &ctx.process.syscalls;
        let me = ctx.process.pid;
        let parent = sys.get_process(me).await.map_err(refused)?.ppid;
        let family = sys.list_processes(parent, Some(1)).await.map_err(refused)?;
        let siblings: Vec<Value> = family
            .iter()
            .filter(|p| p.pid != parent && p.pid != me)
            .map(summary)
            .collect();
        to_json(&siblings)
    }
}

#[async_trait]
impl Tool for GetProcessInfo {
    fn name(&self) -> &'static str {
        "get_process_info"
    }

    fn capability(&self) -> Option<Capability> {
        None
    }

    fn description(&self) -> &'static str {
        "Describe a process (default: yourself) as JSON, including its limits and mailbox length."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "pid": { "type": "integer", "minimum": 1, "description": "The process (default: you)." }
            },
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let args: InfoArgs = decode(self, args)?;
        let pid = args.pid.map_or(ctx.process.pid, Pid);
        let info = ctx
            .process
            .syscalls
            .get_process(pid)
            .await
            .map_err(refused)?;
        to_json(&json!({
            "pid": info.pid,
            "ppid": info.ppid,
            "name": info.name,
            "role": info.role,
            "tier": info.tier,
            "state": info.state,
            "model": info.model,
            "runtime": info.runtime,
            "tools": info.tools,
            "children": info.children,
            "mailbox_len": info.mailbox_len,
            "limits": info.limits,
        }))
    }
}
