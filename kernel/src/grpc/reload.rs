//! The `ReloadConfig` answer, from a [`ReloadReport`].

use hivekernel_proto::v1 as pb;

use crate::reload::{Change, Outcome, ReloadReport};

pub(super) fn response(report: ReloadReport) -> pb::ReloadConfigResponse {
    pb::ReloadConfigResponse {
        config: report.config.display().to_string(),
        applied: report.applied(),
        issues: report
            .issues
            .into_iter()
            .map(|issue| pb::ConfigIssue {
                location: issue.location,
                message: issue.message,
            })
            .collect(),
        agents: report.agents.into_iter().map(change).collect(),
        cron: report.cron.into_iter().map(change).collect(),
        roles: report.roles.into_iter().map(change).collect(),
        skills: report.skills.into_iter().map(change).collect(),
        needs_restart: report.needs_restart,
    }
}

fn change(change: Change) -> pb::ReloadChange {
    let outcome = match change.outcome {
        Outcome::Added => pb::ReloadOutcome::Added,
        Outcome::Removed => pb::ReloadOutcome::Removed,
        Outcome::Restarted => pb::ReloadOutcome::Restarted,
        Outcome::Updated => pb::ReloadOutcome::Updated,
        Outcome::Unchanged => pb::ReloadOutcome::Unchanged,
        Outcome::Failed => pb::ReloadOutcome::Failed,
    };
    pb::ReloadChange {
        name: change.name,
        pid: change.pid.map_or(0, |pid| pid.0),
        outcome: outcome as i32,
        detail: change.detail,
    }
}
