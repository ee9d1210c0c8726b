//! Conversions between protobuf messages and kernel types, with argument
//! checks whose messages name the offending field.

use std::time::Duration;

use hivekernel_agents::{
    Artifact, ArtifactInfo, ExecCommand, ExitRecord, LimitOverrides, Limits, LlmUsage, NewArtifact,
    Outgoing, Pid, ProcessInfo, RestartSpec, Role, SpawnRequest, TaskSpec,
};
use hivekernel_proto::v1 as pb;
use tonic::Status;

use super::enums;
use crate::events::{Event, EventKind};
use crate::kernel::{Caller, Placement};

/// A PID that must be non-zero.
pub(crate) fn required_pid(field: &str, value: u64) -> Result<Pid, Status> {
    required_id(field, value).map(Pid)
}

/// An id that must be non-zero.
pub(crate) fn required_id(field: &str, value: u64) -> Result<u64, Status> {
    if value == 0 {
        return Err(Status::invalid_argument(format!("{field} must be set")));
    }
    Ok(value)
}

/// A duration in milliseconds where 0 means "none"; the kernel checks the range.
pub(crate) fn optional_millis(ms: u64) -> Option<Duration> {
    (ms != 0).then(|| Duration::from_millis(ms))
}

fn unknown(field: &str, value: i32) -> Status {
    Status::invalid_argument(format!("{field}: unknown enum value {value}"))
}

/// Spawn request; unset role means agent, unset tier and runtime inherit.
/// Most labels a spawn's placement names.
const MAX_PLACEMENT_LABELS: usize = 32;
/// Longest node name or label (key or value) a placement names, in bytes.
const MAX_PLACEMENT_BYTES: usize = 128;

/// Where a spawn asks to run (`node`, `node_labels`).
pub(crate) fn placement(req: &pb::SpawnRequest) -> Result<Placement, Status> {
    if req.node_labels.len() > MAX_PLACEMENT_LABELS {
        return Err(Status::invalid_argument(format!(
            "node_labels: at most {MAX_PLACEMENT_LABELS} labels, got {}",
            req.node_labels.len()
        )));
    }
    let long = std::iter::once(&req.node)
        .chain(req.node_labels.iter().flat_map(|(k, v)| [k, v]))
        .find(|text| text.len() > MAX_PLACEMENT_BYTES);
    if let Some(text) = long {
        return Err(Status::invalid_argument(format!(
            "node, node_labels: at most {MAX_PLACEMENT_BYTES} bytes each, got {} ({})",
            text.len(),
            crate::error::shown(text)
        )));
    }
    if req.node_labels.keys().any(String::is_empty) {
        return Err(Status::invalid_argument(
            "node_labels: a label has an empty name",
        ));
    }
    Ok(Placement {
        node: (!req.node.is_empty()).then(|| req.node.clone()),
        labels: req
            .node_labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    })
}

pub(crate) fn spawn_request(req: pb::SpawnRequest) -> Result<SpawnRequest, Status> {
    let parent = required_pid("parent", req.parent)?;
    let role = pb::Role::try_from(req.role).map_err(|_| unknown("role", req.role))?;
    let role = enums::role_from_proto(role).unwrap_or(Role::Agent);
    let tier = pb::CognitiveTier::try_from(req.tier).map_err(|_| unknown("tier", req.tier))?;
    let tier = enums::tier_from_proto(tier);
    let limits = req.limits.map(limit_overrides).unwrap_or_default();
    let restart = req.restart.map(restart_spec).transpose()?;
    let strategy =
        pb::Strategy::try_from(req.strategy).map_err(|_| unknown("strategy", req.strategy))?;
    Ok(SpawnRequest {
        parent,
        name: req.name,
        role,
        tier,
        model: req.model,
        runtime: (!req.runtime.is_empty()).then_some(req.runtime),
        system_prompt: req.system_prompt,
        tools: req.tools,
        limits,
        metadata: req.metadata.into_iter().collect(),
        restart,
        strategy: enums::strategy_from_proto(strategy),
        // Clients never pick a host directory: the kernel derives it from the name.
        workspace: None,
        exec: exec_command(req.command, req.env, req.cwd),
        // Approval rules come from the config (roles, agents), never a client.
        approval: Vec::new(),
        // So do skill directories.
        skills: Vec::new(),
    })
}

/// The OS command of an `exec` spawn; none when neither field is set.
/// The kernel checks it (non-empty, no NUL bytes, sizes, the program exists).
fn exec_command(
    argv: Vec<String>,
    env: std::collections::HashMap<String, String>,
    cwd: String,
) -> Option<ExecCommand> {
    (!argv.is_empty() || !env.is_empty() || !cwd.is_empty()).then(|| ExecCommand {
        argv,
        env: env.into_iter().collect(),
        cwd: (!cwd.is_empty()).then(|| cwd.into()),
    })
}

/// A restart spec: the policy is required, unset numbers take the defaults;
/// the kernel checks the ranges.
fn restart_spec(spec: pb::RestartSpec) -> Result<RestartSpec, Status> {
    let policy = pb::RestartPolicy::try_from(spec.policy)
        .map_err(|_| unknown("restart.policy", spec.policy))?;
    let policy = enums::policy_from_proto(policy).ok_or_else(|| {
        Status::invalid_argument("restart.policy must be set (permanent, transient or temporary)")
    })?;
    let mut restart = RestartSpec::new(policy);
    if let Some(max) = spec.max_restarts {
        restart.max_restarts = max;
    }
    if let Some(seconds) = spec.within_seconds {
        restart.within_seconds = seconds;
    }
    match spec.backoff_ms.as_slice() {
        [] => {}
        &[first, most] => restart.backoff_ms = [first, most],
        other => {
            return Err(Status::invalid_argument(format!(
                "restart.backoff_ms: expected [first, most] in milliseconds, got {} values",
                other.len()
            )));
        }
    }
    Ok(restart)
}

/// Zero fields inherit from the parent.
fn limit_overrides(limits: pb::Limits) -> LimitOverrides {
    fn set<T: Default + PartialEq>(v: T) -> Option<T> {
        (v != T::default()).then_some(v)
    }
    LimitOverrides {
        max_children: set(limits.max_children),
        max_depth: set(limits.max_depth),
        timeout_seconds: set(limits.timeout_seconds),
        max_concurrent_tasks: set(limits.max_concurrent_tasks),
        max_tokens_total: set(limits.max_tokens_total),
        spawns_per_minute: set(limits.spawns_per_minute),
        llm_calls_per_minute: set(limits.llm_calls_per_minute),
        max_storage_bytes: set(limits.max_storage_bytes),
    }
}

/// A message from `caller`; `from` may only repeat the caller's own PID.
pub(crate) fn outgoing(caller: Caller, req: pb::SendMessageRequest) -> Result<Outgoing, Status> {
    if req.from != 0 && Pid(req.from) != caller.pid() {
        return Err(Status::permission_denied(
            "from must be the caller's own pid",
        ));
    }
    let to = required_pid("to", req.to)?;
    let priority =
        pb::Priority::try_from(req.priority).map_err(|_| unknown("priority", req.priority))?;
    let priority = enums::priority_from_proto(priority).unwrap_or_default();
    let kind = if req.r#type.is_empty() {
        hivekernel_agents::message::kinds::MESSAGE.to_owned()
    } else {
        req.r#type
    };
    Ok(Outgoing {
        to,
        kind,
        payload: req.payload,
        priority,
        ttl: optional_millis(req.ttl_ms),
        // The kernel sets them from the caller (kernel/asked.rs).
        approvals: hivekernel_agents::approval::Carried::NONE,
    })
}

/// A task; timeout 0 takes the target's default.
pub(crate) fn task_spec(req: pb::ExecuteTaskRequest) -> Result<TaskSpec, Status> {
    Ok(TaskSpec {
        to: required_pid("pid", req.pid)?,
        description: req.description,
        params: req.params.into_iter().collect(),
        timeout: optional_millis(req.timeout_ms),
        approvals: hivekernel_agents::approval::Carried::NONE,
    })
}

/// An artifact to store and its owner (`None`: the caller).
pub(crate) fn new_artifact(
    req: pb::StoreArtifactRequest,
) -> Result<(Option<Pid>, NewArtifact), Status> {
    let visibility = pb::Visibility::try_from(req.visibility)
        .map_err(|_| unknown("visibility", req.visibility))?;
    let artifact = NewArtifact {
        name: req.name,
        content_type: (!req.content_type.is_empty()).then_some(req.content_type),
        visibility: enums::visibility_from_proto(visibility),
        content: req.content,
    };
    Ok(((req.owner != 0).then_some(Pid(req.owner)), artifact))
}

pub(crate) fn artifact_info(info: ArtifactInfo) -> pb::ArtifactInfo {
    pb::ArtifactInfo {
        id: info.id.0,
        name: info.name,
        owner: info.owner.0,
        owner_name: info.owner_name,
        content_type: info.content_type,
        visibility: enums::visibility_to_proto(info.visibility) as i32,
        size: info.size,
        created_at_unix_ms: info.created_at_unix_ms,
        updated_at_unix_ms: info.updated_at_unix_ms,
    }
}

pub(crate) fn artifact(artifact: Artifact) -> pb::Artifact {
    pb::Artifact {
        info: Some(artifact_info(artifact.info)),
        content: artifact.content,
    }
}

pub(crate) fn process_info(info: ProcessInfo) -> pb::ProcessInfo {
    pb::ProcessInfo {
        pid: info.pid.0,
        ppid: info.ppid.0,
        name: info.name,
        role: enums::role_to_proto(info.role) as i32,
        tier: enums::tier_to_proto(info.tier) as i32,
        state: enums::state_to_proto(info.state) as i32,
        model: info.model,
        runtime: info.runtime,
        tools: info.tools,
        limits: Some(limits(info.limits)),
        depth: info.depth,
        children: info.children,
        mailbox_len: info.mailbox_len,
        started_at_unix_ms: info.started_at_unix_ms,
        metadata: info.metadata.into_iter().collect(),
        exit: info.exit.map(exit_record),
        usage: Some(usage(info.usage)),
        restarts: info.restarts,
        log_path: info.log_path.unwrap_or_default(),
        capabilities: info
            .capabilities
            .names()
            .into_iter()
            .map(str::to_owned)
            .collect(),
        subtree_usage: Some(usage(info.subtree_usage)),
        budget: info.budget.map(|b| pb::Budget {
            owner: b.owner.0,
            max_tokens_total: b.max_tokens_total,
            used: b.used,
            remaining: b.remaining,
        }),
        restart: Some(pb::RestartSpec {
            policy: enums::policy_to_proto(info.restart.policy) as i32,
            max_restarts: Some(info.restart.max_restarts),
            within_seconds: Some(info.restart.within_seconds),
            backoff_ms: info.restart.backoff_ms.to_vec(),
        }),
        strategy: enums::strategy_to_proto(info.strategy) as i32,
        last_exit: info.last_exit.map(exit_record),
        restored: info.restored,
        node: info.node.unwrap_or_default(),
    }
}

/// A usage report: its rows and their sum.
pub(crate) fn usage_report(rows: Vec<crate::store::usage::UsageRow>) -> pb::UsageReport {
    let mut total = LlmUsage::default();
    let rows = rows
        .into_iter()
        .map(|row| {
            total.calls = total.calls.saturating_add(row.usage.calls);
            total.prompt_tokens = total.prompt_tokens.saturating_add(row.usage.prompt_tokens);
            total.completion_tokens = total
                .completion_tokens
                .saturating_add(row.usage.completion_tokens);
            total.cost_nano_usd = total.cost_nano_usd.saturating_add(row.usage.cost_nano_usd);
            pb::UsageReportRow {
                key: row.key,
                usage: Some(usage(row.usage)),
            }
        })
        .collect();
    pb::UsageReport {
        rows,
        total: Some(usage(total)),
    }
}

fn usage(usage: LlmUsage) -> pb::LlmUsage {
    pb::LlmUsage {
        calls: usage.calls,
        prompt_tokens: usage.prompt_tokens,
        completion_tokens: usage.completion_tokens,
        cost_usd: usage.cost_usd(),
    }
}

pub(crate) fn exit_record(record: ExitRecord) -> pb::ExitRecord {
    pb::ExitRecord {
        pid: record.pid.0,
        ppid: record.ppid.0,
        name: record.name,
        exit_code: record.exit_code,
        output: record.output,
        reason: record.reason,
        exited_at_unix_ms: record.exited_at_unix_ms,
    }
}

/// An event; `detail` is the kind as JSON, its `type` included.
pub(crate) fn event(event: &Event) -> pb::Event {
    pb::Event {
        seq: event.seq,
        at_unix_ms: event.at_unix_ms,
        pid: event.pid.0,
        r#type: event.kind.name().to_owned(),
        detail: detail(&event.kind),
        trace_id: event.trace.map(|id| id.to_string()).unwrap_or_default(),
        node: String::new(),
    }
}

/// The notice sent in place of `missed` events a slow subscriber lost.
pub(crate) fn lagged(missed: u64, at_unix_ms: u64) -> pb::Event {
    marker(EventKind::Lagged { missed }, at_unix_ms)
}

/// The seq-0 marker that starts a replay reaching back past the log.
pub(crate) fn pruned(missed: u64, at_unix_ms: u64) -> pb::Event {
    marker(EventKind::Pruned { missed }, at_unix_ms)
}

/// The seq-0 marker that ends a replay.
pub(crate) fn replay_done(last_seq: u64, at_unix_ms: u64) -> pb::Event {
    marker(EventKind::ReplayDone { last_seq }, at_unix_ms)
}

/// A stream marker: not a kernel event, so it carries seq 0.
fn marker(kind: EventKind, at_unix_ms: u64) -> pb::Event {
    pb::Event {
        seq: 0,
        at_unix_ms,
        pid: 0,
        r#type: kind.name().to_owned(),
        detail: detail(&kind),
        trace_id: String::new(),
        node: String::new(),
    }
}

fn detail(kind: &EventKind) -> String {
    serde_json::to_string(kind).unwrap_or_else(|err| {
        tracing::error!(error = %err, kind = kind.name(), "cannot encode event detail");
        String::new()
    })
}

fn limits(limits: Limits) -> pb::Limits {
    pb::Limits {
        max_children: limits.max_children,
        max_depth: limits.max_depth,
        timeout_seconds: limits.timeout_seconds,
        max_concurrent_tasks: limits.max_concurrent_tasks,
        max_tokens_total: limits.max_tokens_total.unwrap_or(0),
        spawns_per_minute: limits
            .spawns_per_minute
            .map_or(0, std::num::NonZeroU32::get),
        llm_calls_per_minute: limits
            .llm_calls_per_minute
            .map_or(0, std::num::NonZeroU32::get),
        max_storage_bytes: limits
            .max_storage_bytes
            .map_or(0, std::num::NonZeroU64::get),
    }
}

pub(crate) fn node(info: crate::cluster::NodeInfo) -> pb::Node {
    let record = info.record;
    pb::Node {
        name: record.node,
        epoch: record.epoch,
        address: record.address,
        labels: record.labels.into_iter().collect(),
        started_unix_ms: record.started_unix_ms,
        seen_ms_ago: u64::try_from(info.seen_ago.as_millis()).unwrap_or(u64::MAX),
        processes: record.load.processes,
        running: record.load.running,
        cpu_percent: record.load.cpu_percent,
        this_node: info.this,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tonic::Code;

    use super::*;

    fn spawn(f: impl FnOnce(&mut pb::SpawnRequest)) -> Result<SpawnRequest, Status> {
        let mut req = pb::SpawnRequest {
            parent: 1,
            name: "w".into(),
            ..Default::default()
        };
        f(&mut req);
        spawn_request(req)
    }

    #[test]
    fn spawn_defaults() {
        let req = spawn(|_| {}).unwrap();
        assert_eq!(req.role, Role::Agent);
        assert_eq!(req.tier, None);
        assert_eq!(req.runtime, None);
        assert_eq!(req.limits, LimitOverrides::default());
    }

    #[test]
    fn spawn_limits_zero_inherits() {
        let req = spawn(|r| {
            r.limits = Some(pb::Limits {
                max_children: 3,
                timeout_seconds: 0,
                ..Default::default()
            });
        })
        .unwrap();
        assert_eq!(req.limits.max_children, Some(3));
        assert_eq!(req.limits.timeout_seconds, None);
    }

    #[test]
    fn spawn_rejects_bad_fields_by_name() {
        type Edit = fn(&mut pb::SpawnRequest);
        let cases: [(Edit, &str); 7] = [
            (|r| r.parent = 0, "parent must be set"),
            (|r| r.role = 42, "role: unknown enum value 42"),
            (|r| r.tier = -1, "tier: unknown enum value -1"),
            (|r| r.strategy = 9, "strategy: unknown enum value 9"),
            (
                |r| r.restart = Some(pb::RestartSpec::default()),
                "restart.policy must be set (permanent, transient or temporary)",
            ),
            (
                |r| {
                    r.restart = Some(pb::RestartSpec {
                        policy: 7,
                        ..Default::default()
                    })
                },
                "restart.policy: unknown enum value 7",
            ),
            (
                |r| {
                    r.restart = Some(pb::RestartSpec {
                        policy: pb::RestartPolicy::Permanent as i32,
                        backoff_ms: vec![1, 2, 3],
                        ..Default::default()
                    })
                },
                "restart.backoff_ms: expected [first, most] in milliseconds, got 3 values",
            ),
        ];
        for (edit, message) in cases {
            let err = spawn(edit).unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument);
            assert_eq!(err.message(), message);
        }
    }

    #[test]
    fn spawn_restart_spec_defaults_unset_numbers() {
        let req = spawn(|r| {
            r.restart = Some(pb::RestartSpec {
                policy: pb::RestartPolicy::Transient as i32,
                max_restarts: Some(0),
                ..Default::default()
            });
            r.strategy = pb::Strategy::RestForOne as i32;
        })
        .unwrap();
        let restart = req.restart.unwrap();
        assert_eq!(restart.policy, hivekernel_agents::RestartPolicy::Transient);
        assert_eq!(restart.max_restarts, 0, "an explicit 0 is kept");
        assert_eq!(
            (restart.within_seconds, restart.backoff_ms),
            (5, [100, 30_000])
        );
        assert_eq!(req.strategy, Some(hivekernel_agents::Strategy::RestForOne));
        assert_eq!(spawn(|_| {}).unwrap().strategy, None);
    }

    #[test]
    fn outgoing_checks_from_and_defaults_type() {
        let req = pb::SendMessageRequest {
            to: 2,
            from: 1,
            ..Default::default()
        };
        let out = outgoing(Caller::Admin, req.clone()).unwrap();
        assert_eq!(out.kind, "message");
        assert_eq!(out.priority, hivekernel_agents::Priority::Normal);
        assert_eq!(out.ttl, None);
        let err = outgoing(Caller::Process(Pid(5)), req).unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied);
    }

    #[test]
    fn lagged_detail_names_the_missed_count() {
        let ev = lagged(7, 0);
        assert_eq!(ev.r#type, "lagged");
        let detail: serde_json::Value = serde_json::from_str(&ev.detail).unwrap();
        assert_eq!(detail["missed"], 7);
    }
}
