//! `cron ls`, `cron add`, `cron rm`, `cron enable|disable` and `cron run`.

use hivekernel_proto::v1::{
    CronEntry, CronSpec, ListCronRequest, RemoveCronRequest, RunCronRequest, SetCronEnabledRequest,
};
use serde_json::{Value, json};

use super::client::Session;
use super::{CliError, CronAddArgs, CronCommand, CronNameArgs, human, output};

/// Runs one `cron` subcommand.
pub(super) async fn run(command: CronCommand) -> Result<(), CliError> {
    match command {
        CronCommand::Ls { json, client } => {
            let mut session = Session::connect(&client).await?;
            let entries = entries(&mut session).await?;
            if json {
                let all: Vec<Value> = entries.iter().map(entry_json).collect();
                output::print(&output::line(&Value::Array(all).to_string()))
            } else {
                output::print(&table(&entries))
            }
        }
        CronCommand::Add(args) => add(args).await,
        CronCommand::Rm { name, json, client } => {
            let mut session = Session::connect(&client).await?;
            session
                .client
                .remove_cron(RemoveCronRequest { name: name.clone() })
                .await
                .map_err(|status| session.error(status))?;
            if json {
                output::print(&output::line(&json!({ "removed": name }).to_string()))
            } else {
                Ok(())
            }
        }
        CronCommand::Enable(args) => change(args, Change::Enable(true)).await,
        CronCommand::Disable(args) => change(args, Change::Enable(false)).await,
        CronCommand::Run(args) => change(args, Change::Run).await,
    }
}

/// What `cron enable|disable|run` asks of one entry.
enum Change {
    Enable(bool),
    Run,
}

async fn change(args: CronNameArgs, change: Change) -> Result<(), CliError> {
    let mut session = Session::connect(&args.client).await?;
    let name = args.name;
    let answer = match change {
        Change::Enable(enabled) => {
            session
                .client
                .set_cron_enabled(SetCronEnabledRequest { name, enabled })
                .await
        }
        Change::Run => session.client.run_cron(RunCronRequest { name }).await,
    };
    let entry = answer.map_err(|status| session.error(status))?.into_inner();
    if args.json {
        output::print(&output::line(&entry_json(&entry).to_string()))
    } else {
        output::print(&table(&[entry]))
    }
}

async fn add(args: CronAddArgs) -> Result<(), CliError> {
    let mut session = Session::connect(&args.client).await?;
    let spec = CronSpec {
        target: session.pid(&args.target).await?,
        name: args.name,
        expression: args.expression,
        action: args.action,
        template: args.template.unwrap_or_default(),
        description: args.description,
        disabled: args.disabled,
        overlap: args.overlap,
        missed: args.missed,
    };
    let entry = add_entry(&mut session, spec).await?;
    if args.json {
        output::print(&output::line(&entry_json(&entry).to_string()))
    } else {
        output::print(&table(&[entry]))
    }
}

/// Every cron entry the caller may see; on a node of a cluster, every
/// node's, with a warning on stderr for each node that did not answer.
pub(super) async fn entries(session: &mut Session) -> Result<Vec<CronEntry>, CliError> {
    let listed = session
        .client
        .list_cron(ListCronRequest {})
        .await
        .map_err(|status| session.error(status))?
        .into_inner();
    for gap in &listed.unanswered {
        eprintln!(
            "warning: node {} did not answer; its cron entries are not shown ({})",
            gap.node, gap.error
        );
    }
    Ok(listed.entries)
}

/// Adds `spec`; the entry as the kernel keeps it.
pub(super) async fn add_entry(
    session: &mut Session,
    spec: CronSpec,
) -> Result<CronEntry, CliError> {
    let entry = session
        .client
        .add_cron(spec)
        .await
        .map_err(|status| session.error(status))?
        .into_inner();
    Ok(entry)
}

/// NAME SCHEDULE ACTION TARGET NEXT LAST STATUS RUNS, one line per entry,
/// and NODE on a node of a cluster; NEXT and LAST relative to now (`in
/// 5m00s`, `2h10m ago`).
fn table(entries: &[CronEntry]) -> String {
    let rows = rows(entries);
    if entries.iter().all(|entry| entry.node.is_empty()) {
        return output::aligned(&rows);
    }
    let with_node: Vec<[String; 9]> = rows
        .into_iter()
        .enumerate()
        .map(|(i, row)| {
            let node = match i {
                0 => "NODE".to_owned(),
                i => entries[i - 1].node.clone(),
            };
            let [name, schedule, action, target, next, last, status, runs] = row;
            [
                name, schedule, action, target, node, next, last, status, runs,
            ]
        })
        .collect();
    output::aligned(&with_node)
}

/// [`table`]'s rows, its header first, without NODE.
fn rows(entries: &[CronEntry]) -> Vec<[String; 8]> {
    let now = human::now_ms();
    let mut rows = vec![
        [
            "NAME", "SCHEDULE", "ACTION", "TARGET", "NEXT", "LAST", "STATUS", "RUNS",
        ]
        .map(str::to_owned),
    ];
    for entry in entries {
        let spec = entry.spec.clone().unwrap_or_default();
        let next = match entry.next_run_unix_ms {
            0 => "-".to_owned(),
            at => format!("in {}", human::duration(at.saturating_sub(now))),
        };
        let last = match entry.last_run_unix_ms {
            0 => "-".to_owned(),
            at => format!("{} ago", human::age(at, now)),
        };
        let status = match (&entry.history.last(), entry.running, spec.disabled) {
            (_, _, true) => "disabled".to_owned(),
            (_, true, _) => "running".to_owned(),
            (Some(run), _, _) => run.status.clone(),
            (None, _, _) => "-".to_owned(),
        };
        rows.push([
            spec.name,
            spec.expression,
            spec.action,
            spec.target.to_string(),
            next,
            last,
            status,
            entry.runs.to_string(),
        ]);
    }
    rows
}

pub(super) fn entry_json(entry: &CronEntry) -> Value {
    let spec = entry.spec.clone().unwrap_or_default();
    let history: Vec<Value> = entry
        .history
        .iter()
        .map(|run| {
            json!({
                "at_unix_ms": run.at_unix_ms,
                "status": run.status,
                "duration_ms": run.duration_ms,
                "output": run.output,
            })
        })
        .collect();
    let some = |ms: u64| (ms != 0).then_some(ms);
    json!({
        "name": spec.name,
        "expression": spec.expression,
        "action": spec.action,
        "target": spec.target,
        "template": (!spec.template.is_empty()).then_some(&spec.template),
        "description": spec.description,
        "enabled": !spec.disabled,
        "overlap": spec.overlap,
        "missed": spec.missed,
        "owner": entry.owner,
        "source": entry.source,
        "next_run_unix_ms": some(entry.next_run_unix_ms),
        "last_run_unix_ms": some(entry.last_run_unix_ms),
        "created_unix_ms": entry.created_unix_ms,
        "runs": entry.runs,
        "running": entry.running,
        "switched": entry.switched,
        "node": (!entry.node.is_empty()).then_some(&entry.node),
        "history": history,
    })
}
