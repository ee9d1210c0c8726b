//! `agents[].cron` entries and the `templates` they may spawn from.

use std::collections::BTreeMap;

use hivekernel_agents::Pid;
use serde::Deserialize;
use serde_json::Value;

use super::validate::Checked;
use super::{AgentSpec, ConfigIssue, at};
use crate::crontab;
use hivekernel_agents::cron::{CronAction, CronSpec, Missed, Overlap};

/// One `cron[i]` entry as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCron {
    name: String,
    expression: String,
    #[serde(default)]
    action: Option<String>,
    #[serde(default)]
    description: String,
    #[serde(default)]
    template: Option<String>,
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default)]
    overlap: Option<String>,
    #[serde(default)]
    missed: Option<String>,
}

/// Templates with duplicate names and cron entries (which only agents take) reported.
pub(super) fn templates(checked: Vec<Checked>, issues: &mut Vec<ConfigIssue>) -> Vec<AgentSpec> {
    let mut seen = BTreeMap::new();
    let mut out = Vec::new();
    for template in checked {
        let has_cron = template.has_cron();
        let (label, spec) = template.into_parts();
        if has_cron {
            issues.push(ConfigIssue::new(
                at(&label, "cron"),
                "templates take no cron entries; give them to the agent whose entry spawns from it",
            ));
        }
        if spec.node.is_some() || !spec.node_labels.is_empty() {
            let field = if spec.node.is_some() { "node" } else { "where" };
            issues.push(ConfigIssue::new(
                at(&label, field),
                "templates are not placed; a spawn from one is (--node, --where)",
            ));
        }
        if let Some(first) = seen.insert(spec.name.clone(), label.clone()) {
            issues.push(ConfigIssue::new(
                at(&label, "name"),
                format!("duplicate template name {:?} (also {first})", spec.name),
            ));
        }
        out.push(spec);
    }
    out
}

/// Reads each agent's `cron` list from its raw entry into its spec; entry
/// names must be unique across agents and `spawn` templates must exist.
pub(super) fn agent_entries(
    agents: &mut [AgentSpec],
    raw: &[Value],
    templates: &[AgentSpec],
    issues: &mut Vec<ConfigIssue>,
) {
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for (index, agent) in agents.iter_mut().enumerate() {
        let Some(list) = raw.get(index).and_then(|v| v.get("cron")) else {
            continue;
        };
        let label = format!("agents[{index}] ({})", agent.name);
        let Value::Array(list) = list else {
            issues.push(ConfigIssue::new(
                at(&label, "cron"),
                "expected a JSON array of cron entries",
            ));
            continue;
        };
        for (i, value) in list.iter().enumerate() {
            let loc = format!("{}[{i}]", at(&label, "cron"));
            let raw: RawCron = match serde_json::from_value(value.clone()) {
                Ok(raw) => raw,
                Err(err) => {
                    issues.push(ConfigIssue::new(loc, err.to_string()));
                    continue;
                }
            };
            if let Some(spec) = entry(raw, &loc, templates, issues) {
                if let Some(first) = seen.insert(spec.name.clone(), loc.clone()) {
                    issues.push(ConfigIssue::new(
                        at(&loc, "name"),
                        format!("duplicate cron name {:?} (also {first})", spec.name),
                    ));
                }
                agent.cron.push(spec);
            }
        }
    }
}

/// One of the cron words, its default when absent; an unknown one is reported.
fn word<T>(text: &Option<String>, loc: &str, issues: &mut Vec<ConfigIssue>) -> T
where
    T: Default + std::str::FromStr<Err = String>,
{
    match text.as_deref().map(str::parse) {
        None => T::default(),
        Some(Ok(value)) => value,
        Some(Err(why)) => {
            issues.push(ConfigIssue::new(loc.to_owned(), why));
            T::default()
        }
    }
}

/// Checks one entry; `None` when any field is wrong (each reported).
fn entry(
    raw: RawCron,
    loc: &str,
    templates: &[AgentSpec],
    issues: &mut Vec<ConfigIssue>,
) -> Option<CronSpec> {
    let before = issues.len();
    if raw.name.trim().is_empty() || raw.name.chars().any(char::is_control) {
        issues.push(ConfigIssue::new(
            at(loc, "name"),
            format!(
                "must be non-empty without control characters, got {:?}",
                raw.name
            ),
        ));
    }
    if let Err(why) = crontab::parse(&raw.expression) {
        issues.push(ConfigIssue::new(at(loc, "expression"), why));
    }
    let action: CronAction = word(&raw.action, &at(loc, "action"), issues);
    match (action, &raw.template) {
        (CronAction::Spawn, None) => issues.push(ConfigIssue::new(
            at(loc, "template"),
            "the spawn action needs a template",
        )),
        (CronAction::Spawn, Some(name)) if !templates.iter().any(|t| &t.name == name) => {
            let known: Vec<&str> = templates.iter().map(|t| t.name.as_str()).collect();
            issues.push(ConfigIssue::new(
                at(loc, "template"),
                format!(
                    "unknown template {name:?} (known: {})",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ),
            ));
        }
        (CronAction::Execute | CronAction::Message, Some(_)) => issues.push(ConfigIssue::new(
            at(loc, "template"),
            "a template is only for the spawn action",
        )),
        _ => {}
    }
    let overlap: Overlap = word(&raw.overlap, &at(loc, "overlap"), issues);
    let missed: Missed = word(&raw.missed, &at(loc, "missed"), issues);
    (issues.len() == before).then(|| CronSpec {
        name: raw.name,
        expression: raw.expression,
        action,
        // Set to the agent's PID when it runs.
        target: Pid::KERNEL,
        template: raw.template,
        description: raw.description,
        enabled: raw.enabled.unwrap_or(true),
        overlap,
        missed,
        approvals: Vec::new(),
    })
}
