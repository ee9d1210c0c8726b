//! Cron RPCs: conversions between `pb::CronSpec`/`CronEntry` and the kernel's types.

use hivekernel_agents::Pid;
use hivekernel_proto::v1 as pb;
use tonic::Status;

use hivekernel_agents::cron::parse_or_default;

use crate::cron::{CronInfo, CronSpec};
use crate::kernel::Caller;

/// The kernel's spec for an `AddCron` request; the words are read here.
pub(super) fn spec(caller: Caller, spec: pb::CronSpec) -> Result<CronSpec, Status> {
    Ok(CronSpec {
        action: word("action", &spec.action)?,
        overlap: word("overlap", &spec.overlap)?,
        missed: word("missed", &spec.missed)?,
        name: spec.name,
        expression: spec.expression,
        target: match spec.target {
            0 => caller.pid(),
            pid => Pid(pid),
        },
        template: Some(spec.template),
        description: spec.description,
        enabled: !spec.disabled,
        approvals: Vec::new(),
    })
}

/// One of the cron words, as gRPC sends it (empty: the default).
fn word<T>(field: &str, text: &str) -> Result<T, Status>
where
    T: Default + std::str::FromStr<Err = String>,
{
    parse_or_default(field, text).map_err(|why| Status::invalid_argument(crate::error::capped(why)))
}

/// An entry as the API shows it.
pub(super) fn entry(info: CronInfo) -> pb::CronEntry {
    let spec = &info.spec;
    pb::CronEntry {
        spec: Some(pb::CronSpec {
            name: spec.name.clone(),
            expression: spec.expression.clone(),
            action: spec.action.to_string(),
            target: spec.target.0,
            template: spec.template.clone().unwrap_or_default(),
            description: spec.description.clone(),
            disabled: !spec.enabled,
            overlap: spec.overlap.to_string(),
            missed: spec.missed.to_string(),
        }),
        owner: info.owner.0,
        source: info.source.as_str().to_owned(),
        next_run_unix_ms: info.next_run_unix_ms.unwrap_or(0),
        last_run_unix_ms: info.last_run_unix_ms.unwrap_or(0),
        runs: info.runs,
        running: info.running,
        history: info
            .history
            .into_iter()
            .map(|run| pb::CronRun {
                at_unix_ms: run.at_unix_ms,
                status: run.status,
                duration_ms: run.duration_ms,
                output: run.output,
            })
            .collect(),
        created_unix_ms: info.created_unix_ms,
        switched: info.switched,
        node: info.node.unwrap_or_default(),
    }
}
