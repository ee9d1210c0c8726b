//! Roles in the config, both phases: the `roles` section (capabilities and
//! supervision defaults per role) and the `restart` and `strategy` fields an agent or a role may set.
//! An MCP server's `restart` follows the same rule, with its own defaults.
//!
//! ```json
//! "roles": {
//!   "worker": { "capabilities": ["file_read", "send_message"] },
//!   "daemon": { "restart": { "policy": "permanent", "max_restarts": 3,
//!                            "within_seconds": 60, "backoff_ms": [1000, 30000] } },
//!   "lead":   { "strategy": "one_for_all" }
//! },
//! "agents": [{ "name": "queen", "restart": { "policy": "transient" }, "strategy": "rest_for_one" }]
//! ```

use std::collections::HashMap;

use hivekernel_agents::{Capabilities, Capability, RestartPolicy, RestartSpec, Role, Strategy};
use serde::Deserialize;
use serde_json::Value;

use super::parse::section;
use super::{ConfigIssue, RoleSettings, at};

/// One entry of `roles` as written. More per-role settings join this struct.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawRole {
    restart: Option<Value>,
    strategy: Option<String>,
    capabilities: Option<Vec<String>>,
}

/// A `restart` object as written; what is left out takes the defaults of
/// whoever it restarts (a process, an MCP server).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawRestart {
    policy: Option<String>,
    max_restarts: Option<u32>,
    within_seconds: Option<u64>,
    backoff_ms: Option<Vec<u64>>,
}

/// Parses and checks `roles`: each key a role other than `kernel`.
pub(super) fn roles(
    value: Option<&Value>,
    issues: &mut Vec<ConfigIssue>,
) -> HashMap<Role, RoleSettings> {
    let mut roles = HashMap::new();
    let map = match value {
        None | Some(Value::Null) => return roles,
        Some(Value::Object(map)) => map,
        Some(_) => {
            let message = "expected a JSON object of role name -> role settings";
            issues.push(ConfigIssue::new("roles", message));
            return roles;
        }
    };
    for (name, settings) in map {
        let location = format!("roles.{name}");
        let role = match name.parse::<Role>() {
            Ok(Role::Kernel) => {
                let message = "role \"kernel\" is reserved for PID 1, which has no settings here";
                issues.push(ConfigIssue::new(location, message));
                continue;
            }
            Ok(role) => role,
            Err(problem) => {
                issues.push(ConfigIssue::new(location, problem));
                continue;
            }
        };
        let raw = section::<RawRole>(Some(settings), &location, issues).value;
        let restart = restart(raw.restart.as_ref(), &at(&location, "restart"), issues);
        let strategy = strategy(raw.strategy.as_deref(), &at(&location, "strategy"), issues);
        let capabilities = raw
            .capabilities
            .map(|names| capabilities(&names, &at(&location, "capabilities"), issues));
        roles.insert(
            role,
            RoleSettings {
                restart,
                strategy,
                capabilities,
            },
        );
    }
    roles
}

/// Parses a `capabilities` list at `location`; unknown and repeated names are issues.
fn capabilities(names: &[String], location: &str, issues: &mut Vec<ConfigIssue>) -> Capabilities {
    let mut set = Capabilities::NONE;
    for (i, name) in names.iter().enumerate() {
        match name.parse::<Capability>() {
            Ok(capability) if set.contains(capability) => issues.push(ConfigIssue::new(
                format!("{location}[{i}]"),
                format!("duplicate capability {name:?}"),
            )),
            Ok(capability) => set = set.with(capability),
            Err(problem) => issues.push(ConfigIssue::new(format!("{location}[{i}]"), problem)),
        }
    }
    set
}

/// Parses and checks a process's `restart` object at `location` (`policy`
/// required, numbers defaulting to [`RestartSpec::new`]'s); `None` when absent.
pub(super) fn restart(
    value: Option<&Value>,
    location: &str,
    issues: &mut Vec<ConfigIssue>,
) -> Option<RestartSpec> {
    if value.is_none_or(Value::is_null) {
        return None;
    }
    Some(restart_over(
        value,
        RestartSpec::default(),
        true,
        location,
        issues,
    ))
}

/// Parses and checks a `restart` object at `location`: each field left out
/// (or the whole object) takes its value from `defaults`, except `policy`
/// when `policy_required`. The one rule for every `restart` in the config.
pub(super) fn restart_over(
    value: Option<&Value>,
    defaults: RestartSpec,
    policy_required: bool,
    location: &str,
    issues: &mut Vec<ConfigIssue>,
) -> RestartSpec {
    let raw = section::<RawRestart>(value, location, issues);
    let mut spec = defaults;
    match raw.value.policy.as_deref().map(str::parse::<RestartPolicy>) {
        Some(Ok(policy)) => spec.policy = policy,
        Some(Err(problem)) => issues.push(ConfigIssue::new(at(location, "policy"), problem)),
        None if policy_required && raw.is_ok("policy") => {
            let names: Vec<&str> = RestartPolicy::ALL.iter().map(|p| p.as_str()).collect();
            issues.push(ConfigIssue::new(
                at(location, "policy"),
                format!(
                    "missing required field `policy` (one of: {})",
                    names.join(", ")
                ),
            ));
        }
        None => {}
    }
    spec.max_restarts = raw.value.max_restarts.unwrap_or(defaults.max_restarts);
    spec.within_seconds = raw.value.within_seconds.unwrap_or(defaults.within_seconds);
    match raw.value.backoff_ms.as_deref() {
        None => {}
        Some(&[first, most]) => spec.backoff_ms = [first, most],
        Some(other) => issues.push(ConfigIssue::new(
            at(location, "backoff_ms"),
            format!(
                "expected [first, most] in milliseconds, got {} values",
                other.len()
            ),
        )),
    }
    for (field, problem) in spec.problems() {
        issues.push(ConfigIssue::new(at(location, field), problem));
    }
    spec
}

/// Parses a `strategy` name at `location`; `None` when absent.
pub(super) fn strategy(
    value: Option<&str>,
    location: &str,
    issues: &mut Vec<ConfigIssue>,
) -> Option<Strategy> {
    match value?.parse::<Strategy>() {
        Ok(strategy) => Some(strategy),
        Err(problem) => {
            issues.push(ConfigIssue::new(location, problem));
            None
        }
    }
}
