//! `spawn_child`, `kill_child` and `wait_child`.

use crate::capability::Capability;
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{WAIT_DEFAULT_TIMEOUT_SECONDS, decode, invalid, refused, timeout, to_json};
use crate::process::{LimitOverrides, Pid, Role, SpawnRequest, Tier};
use crate::tools::{Tool, ToolContext, ToolError};

/// Spawns a child of the calling process.
#[derive(Debug, Clone, Copy, Default)]
pub struct SpawnChild;

/// Kills a descendant and its subtree.
#[derive(Debug, Clone, Copy, Default)]
pub struct KillChild;

/// Waits for a child to exit and collects its exit record.
#[derive(Debug, Clone, Copy, Default)]
pub struct WaitChild;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpawnArgs {
    name: String,
    role: Option<String>,
    tier: Option<String>,
    prompt: Option<String>,
    tools: Option<Vec<String>>,
    model: Option<String>,
    runtime: Option<String>,
    limits: Option<LimitOverrides>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KillArgs {
    pid: u64,
    reason: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WaitArgs {
    pid: u64,
    timeout_seconds: Option<u64>,
}

/// Role names a model may ask for (`kernel` is PID 1's alone).
fn role_names() -> Vec<&'static str> {
    Role::ALL
        .iter()
        .filter(|r| **r != Role::Kernel)
        .map(|r| r.as_str())
        .collect()
}

#[async_trait]
impl Tool for SpawnChild {
    fn name(&self) -> &'static str {
        "spawn_child"
    }

    fn capability(&self) -> Option<Capability> {
        Some(Capability::SpawnChildren)
    }

    fn description(&self) -> &'static str {
        "Spawn a child process under you; role, tier, model and limits default to what the kernel allows."
    }

    fn parameters(&self) -> Value {
        let tiers: Vec<&str> = Tier::ALL.iter().map(|t| t.as_str()).collect();
        json!({
            "type": "object",
            "properties": {
                "name": { "type": "string", "description": "Name of the new process." },
                "role": { "type": "string", "enum": role_names(), "description": "Its role (default agent); the role decides what it may do." },
                "tier": { "type": "string", "enum": tiers, "description": "Its tier (default yours); never above yours." },
                "prompt": { "type": "string", "description": "Its system prompt." },
                "tools": { "type": "array", "items": { "type": "string" }, "description": "Tool names it may use." },
                "model": { "type": "string", "description": "Logical model name." },
                "runtime": { "type": "string", "description": "Runtime name (default: the kernel's)." },
                "limits": {
                    "type": "object",
                    "properties": {
                        "max_children": { "type": "integer", "minimum": 0 },
                        "max_depth": { "type": "integer", "minimum": 0 },
                        "timeout_seconds": { "type": "integer", "minimum": 1, "maximum": super::MAX_TIMEOUT_SECONDS },
                        "max_concurrent_tasks": { "type": "integer", "minimum": 1 },
                        "max_storage_bytes": { "type": "integer", "minimum": 1, "description": "Bytes of artifacts, memory and skills the child's subtree may keep (within yours)." }
                    },
                    "additionalProperties": false,
                    "description": "Limits, each at most yours (default: inherited)."
                }
            },
            "required": ["name"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let args: SpawnArgs = decode(self, args)?;
        let mut request = SpawnRequest::new(ctx.process.pid, args.name);
        if let Some(role) = args.role {
            request.role = role
                .parse()
                .map_err(|why: String| invalid(self, format!("field `role`: {why}")))?;
        }
        if let Some(tier) = args.tier {
            let tier = tier
                .parse()
                .map_err(|why: String| invalid(self, format!("field `tier`: {why}")))?;
            request.tier = Some(tier);
        }
        if let Some(limits) = args.limits {
            timeout(self, "limits.timeout_seconds", limits.timeout_seconds)?;
            request.limits = limits;
        }
        request.system_prompt = args.prompt.unwrap_or_default();
        request.tools = args.tools.unwrap_or_default();
        request.model = args.model.unwrap_or_default();
        request.runtime = args.runtime;
        let name = request.name.clone();
        let pid = ctx
            .process
            .syscalls
            .spawn_child(request)
            .await
            .map_err(refused)?;
        Ok(format!("spawned {name} as pid {pid}"))
    }
}

#[async_trait]
impl Tool for KillChild {
    fn name(&self) -> &'static str {
        "kill_child"
    }

    fn capability(&self) -> Option<Capability> {
        Some(Capability::KillProcesses)
    }

    fn description(&self) -> &'static str {
        "Kill one of your descendants and everything below it; answers the PIDs that exited."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "pid": { "type": "integer", "minimum": 1, "description": "The process to kill." },
                "reason": { "type": "string", "description": "Why, for its exit record." }
            },
            "required": ["pid"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let args: KillArgs = decode(self, args)?;
        let killed = ctx
            .process
            .syscalls
            .kill(Pid(args.pid), args.reason.as_deref().unwrap_or_default())
            .await
            .map_err(refused)?;
        let mut said = format!("killed {}", to_json(&killed.exited)?);
        if !killed.unreached.is_empty() {
            said.push_str(&format!(
                "; not reached (their node did not answer; they may still run): {}",
                to_json(&killed.unreached)?
            ));
        }
        Ok(said)
    }
}

#[async_trait]
impl Tool for WaitChild {
    fn name(&self) -> &'static str {
        "wait_child"
    }

    fn capability(&self) -> Option<Capability> {
        None
    }

    fn description(&self) -> &'static str {
        "Wait for one of your children to exit (default 300 s) and answer its exit record as JSON."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "pid": { "type": "integer", "minimum": 1, "description": "The child to wait for." },
                "timeout_seconds": { "type": "integer", "minimum": 1, "maximum": super::MAX_TIMEOUT_SECONDS, "description": "Longest wait (default 300)." }
            },
            "required": ["pid"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let args: WaitArgs = decode(self, args)?;
        let limit = timeout(
            self,
            "timeout_seconds",
            Some(args.timeout_seconds.unwrap_or(WAIT_DEFAULT_TIMEOUT_SECONDS)),
        )?;
        let record = ctx
            .process
            .syscalls
            .wait_child(Pid(args.pid), limit)
            .await
            .map_err(refused)?;
        to_json(&record)
    }
}
