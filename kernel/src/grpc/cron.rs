//! Cron RPCs: conversions between `pb::CronSpec`/`CronEntry` and the kernel's types.

use hivekernel_agents::Pid;
use hivekernel_proto::v1 as pb;
use tonic::Status;

use crate::cron::{CronInfo, CronSpec, CronText};
use crate::kernel::Caller;

/// The kernel's spec for an `AddCron` request; names are checked here.
pub(super) fn spec(caller: Caller, spec: pb::CronSpec) -> Result<CronSpec, Status> {
    CronSpec::from_text(CronText {
        name: spec.name,
        expression: spec.expression,
        action: spec.action,
        target: match spec.target {
            0 => caller.pid(),
            pid => Pid(pid),
        },
        template: Some(spec.template),
        description: spec.description,
        enabled: !spec.disabled,
        overlap: spec.overlap,
        missed: spec.missed,
    })
    .map_err(|why| Status::invalid_argument(crate::error::capped(why)))
}

/// An entry as the API shows it.
pub(super) fn entry(info: CronInfo) -> pb::CronEntry {
    let spec = &info.spec;
    pb::CronEntry {
        spec: Some(pb::CronSpec {
            name: spec.name.clone(),
            expression: spec.expression.clone(),
            action: name(&spec.action),
            target: spec.target.0,
            template: spec.template.clone().unwrap_or_default(),
            description: spec.description.clone(),
            disabled: !spec.enabled,
            overlap: name(&spec.overlap),
            missed: name(&spec.missed),
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
    }
}

/// The snake_case name serde gives a unit variant.
fn name<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        _ => String::new(),
    }
}
