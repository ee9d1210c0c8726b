//! `config reload`: the kernel reads its config file again and applies it.

use hivekernel_proto::v1::{
    ReloadChange, ReloadConfigRequest, ReloadConfigResponse, ReloadOutcome,
};
use serde_json::{Value, json};

use super::client::Session;
use super::{CliError, ClientArgs, output};
use crate::config::{ConfigError, ConfigIssue};

/// Asks the kernel to reload; prints what it did per agent and cron entry.
/// An invalid config is a config error (exit 2, every issue listed); a
/// change that failed makes the exit 1, after the report.
pub(super) async fn reload(json: bool, client: &ClientArgs) -> Result<(), CliError> {
    let mut session = Session::connect(client).await?;
    let report = session
        .client
        .reload_config(ReloadConfigRequest {})
        .await
        .map_err(|status| session.error(status))?
        .into_inner();
    if !report.applied {
        return Err(CliError::Config(ConfigError {
            file: report.config.into(),
            issues: report
                .issues
                .into_iter()
                .map(|issue| ConfigIssue {
                    location: issue.location,
                    message: issue.message,
                })
                .collect(),
        }));
    }
    let text = if json {
        output::line(&report_json(&report).to_string())
    } else {
        report_text(&report)
    };
    output::print(&text)?;
    let failed = report
        .agents
        .iter()
        .chain(&report.cron)
        .chain(&report.roles)
        .chain(&report.skills)
        .filter(|change| outcome(change) == "failed")
        .count();
    if failed > 0 {
        let noun = if failed == 1 { "change" } else { "changes" };
        return Err(CliError::Refused(format!(
            "the config was applied, but {failed} {noun} failed (see above)"
        )));
    }
    Ok(())
}

fn outcome(change: &ReloadChange) -> &'static str {
    match ReloadOutcome::try_from(change.outcome).unwrap_or(ReloadOutcome::Unspecified) {
        ReloadOutcome::Added => "added",
        ReloadOutcome::Removed => "removed",
        ReloadOutcome::Restarted => "restarted",
        ReloadOutcome::Updated => "updated",
        ReloadOutcome::Unchanged => "unchanged",
        ReloadOutcome::Failed => "failed",
        ReloadOutcome::Unspecified => "unknown",
    }
}

fn pid_text(change: &ReloadChange) -> String {
    if change.pid == 0 {
        "-".into()
    } else {
        change.pid.to_string()
    }
}

/// Tables of agents, cron entries and roles, and the settings that need a restart.
fn report_text(report: &ReloadConfigResponse) -> String {
    let mut text = format!("reloaded {}\n", report.config);
    let section = |title: &str, changes: &[ReloadChange]| {
        let mut rows = vec![[
            title.to_owned(),
            "PID".into(),
            "RESULT".into(),
            "DETAIL".into(),
        ]];
        rows.extend(changes.iter().map(|change| {
            [
                change.name.clone(),
                pid_text(change),
                outcome(change).to_owned(),
                change.detail.clone(),
            ]
        }));
        output::aligned(&rows)
    };
    text.push_str(&section("AGENT", &report.agents));
    if !report.cron.is_empty() {
        text.push_str(&section("CRON", &report.cron));
    }
    if !report.roles.is_empty() {
        text.push_str(&section("ROLE", &report.roles));
    }
    if !report.skills.is_empty() {
        text.push_str(&section("SKILLS", &report.skills));
    }
    if !report.needs_restart.is_empty() {
        text.push_str(&format!(
            "needs a restart (changed, not applied): {}\n",
            report.needs_restart.join(", ")
        ));
    }
    text
}

fn report_json(report: &ReloadConfigResponse) -> Value {
    let changes = |changes: &[ReloadChange]| -> Vec<Value> {
        changes
            .iter()
            .map(|change| {
                json!({
                    "name": change.name,
                    "pid": (change.pid != 0).then_some(change.pid),
                    "result": outcome(change),
                    "detail": change.detail,
                })
            })
            .collect()
    };
    json!({
        "config": report.config,
        "applied": report.applied,
        "agents": changes(&report.agents),
        "cron": changes(&report.cron),
        "roles": changes(&report.roles),
        "skills": changes(&report.skills),
        "needs_restart": report.needs_restart,
    })
}
