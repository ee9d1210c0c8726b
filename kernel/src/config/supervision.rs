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
    capabilities: Option<Value>,
    approval: Option<Value>,
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
            .filter(|value| !value.is_null())
            .map(|value| capabilities(&value, &at(&location, "capabilities"), issues));
        roles.insert(
            role,
            RoleSettings {
                restart,
                strategy,
                capabilities,
                approval: super::approval::rules(
                    raw.approval.as_ref(),
                    &at(&location, "approval"),
                    issues,
                ),
            },
        );
    }
    roles
}

/// Parses `capabilities` at `location`: a list of names, or `"all"`;
/// unknown and repeated names are issues.
fn capabilities(value: &Value, location: &str, issues: &mut Vec<ConfigIssue>) -> Capabilities {
    let names = match value {
        Value::String(all) if all == "all" => return Capabilities::ALL,
        Value::Array(names) => names,
        _ => {
            issues.push(ConfigIssue::new(
                location,
                format!(
                    "expected a list of capability names or \"all\", got {}",
                    super::parse::describe(value)
                ),
            ));
            return Capabilities::NONE;
        }
    };
    let mut set = Capabilities::NONE;
    for (i, name) in names.iter().enumerate() {
        let Some(name) = name.as_str() else {
            issues.push(ConfigIssue::new(
                format!("{location}[{i}]"),
                format!(
                    "expected a capability name, got {}",
                    super::parse::describe(name)
                ),
            ));
            continue;
        };
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

/// Capabilities `config check` warns about wherever they are granted: each
/// lets an agent act outside its workspace and its tree.
const RISKY: [(Capability, &str); 3] = [
    (Capability::ShellExec, "run shell commands"),
    (Capability::NetworkAccess, "reach the network"),
    (Capability::ManageCron, "schedule work that runs unattended"),
];

/// What each config agent may do, and where each risky grant comes from:
/// what `config check` shows.
#[derive(Debug)]
pub struct Grants<'a> {
    config: &'a super::Config,
}

impl<'a> Grants<'a> {
    /// The grants of `config`.
    pub fn of(config: &'a super::Config) -> Self {
        Grants { config }
    }

    /// Whether `role` takes its capabilities from the config (else its default).
    fn listed(&self, role: Role) -> bool {
        self.config
            .kernel
            .roles
            .get(&role)
            .is_some_and(|settings| settings.capabilities.is_some())
    }

    /// Where `role`'s capabilities come from, as a user would find it.
    fn source(&self, role: Role) -> String {
        if self.listed(role) {
            format!("roles.{role}.capabilities")
        } else {
            format!("the default for role {role}")
        }
    }

    /// One line per config agent: its name, role and capabilities.
    pub fn agent_lines(&self) -> String {
        let width = self
            .config
            .agents
            .iter()
            .map(|agent| agent.name.len() + agent.role.as_str().len() + 3)
            .max()
            .unwrap_or(0);
        let mut text = String::new();
        for agent in &self.config.agents {
            let granted = self.config.kernel.capabilities(agent.role);
            let what = if granted == Capabilities::ALL {
                "every capability".to_owned()
            } else if granted == Capabilities::NONE {
                "no capability".to_owned()
            } else {
                granted.names().join(", ")
            };
            let who = format!("{} ({})", agent.name, agent.role);
            text.push_str(&format!("  {who:<width$}  {what}\n"));
        }
        text
    }

    /// One warning per role that grants a risky capability, naming the
    /// config agents of that role.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        for role in Role::ALL.iter().copied().filter(|r| *r != Role::Kernel) {
            let granted = self.config.kernel.capabilities(role);
            let risky: Vec<&str> = RISKY
                .iter()
                .filter(|(capability, _)| granted.contains(*capability))
                .map(|(capability, _)| capability.as_str())
                .collect();
            if risky.is_empty() {
                continue;
            }
            let does: Vec<&str> = RISKY
                .iter()
                .filter(|(capability, _)| granted.contains(*capability))
                .map(|(_, does)| *does)
                .collect();
            let agents: Vec<&str> = self
                .config
                .agents
                .iter()
                .filter(|agent| agent.role == role)
                .map(|agent| agent.name.as_str())
                .collect();
            let who = if agents.is_empty() {
                format!("processes spawned as {role}")
            } else {
                format!("{} and processes spawned as {role}", agents.join(", "))
            };
            warnings.push(format!(
                "role {role} grants {} ({}): {who} may {}",
                risky.join(", "),
                self.source(role),
                does.join(", ")
            ));
        }
        warnings
    }
}
