//! `usage`: model calls, tokens, cost and budgets per process and per subtree.

use serde_json::{Value, json};

use hivekernel_proto::v1::{LlmUsage, ProcessInfo, UsageReport, UsageReportRequest};

use super::client::Session;
use super::process::list;
use super::{CliError, Since, UsageArgs, output};

/// Prints the usage of every process under `PID` (default PID 1), or with
/// `--by`, the kernel's usage over time summed by model, day or role.
pub(super) async fn usage(args: UsageArgs) -> Result<(), CliError> {
    let mut session = Session::connect(&args.client).await?;
    if let Some(by) = &args.by {
        return report(&mut session, by, args.since.as_ref(), args.json).await;
    }
    let root = session.pid_or_zero(args.pid.as_ref()).await?;
    let procs = list(&mut session, root).await?;
    let text = if args.json {
        let all = procs.iter().map(row_json).collect();
        format!("{:#}\n", Value::Array(all))
    } else {
        table(&procs)
    };
    output::print(&text)
}

/// `usage --by`: one line per model, day or role, and their total.
async fn report(
    session: &mut Session,
    by: &str,
    since: Option<&Since>,
    json: bool,
) -> Result<(), CliError> {
    let since_day = match since {
        None => String::new(),
        Some(Since::Day(day)) => day.clone(),
        Some(Since::Ago(ago)) => {
            let now = std::time::SystemTime::now();
            let then = now.checked_sub(*ago).unwrap_or(std::time::UNIX_EPOCH);
            crate::store::usage::utc_day(crate::event::unix_ms(then))
        }
    };
    let report = session
        .client
        .get_usage_report(UsageReportRequest {
            by: by.to_owned(),
            since_day: since_day.clone(),
        })
        .await
        .map_err(|status| session.error(status))?
        .into_inner();
    if json {
        let rows: Vec<Value> = report
            .rows
            .iter()
            .map(|row| {
                let mut line = serde_json::Map::new();
                line.insert(by.to_owned(), Value::from(row.key.as_str()));
                let usage = row.usage.as_ref().map(output::usage_json);
                line.insert("usage".to_owned(), usage.unwrap_or(Value::Null));
                Value::Object(line)
            })
            .collect();
        let value = json!({
            "by": by,
            "since_day": Some(since_day).filter(|day| !day.is_empty()),
            "rows": rows,
            "total": report.total.as_ref().map(output::usage_json),
        });
        return output::print(&format!("{value:#}\n"));
    }
    output::print(&report_table(by, &report))
}

fn report_table(by: &str, report: &UsageReport) -> String {
    let mut rows = vec![
        [
            by.to_uppercase().as_str(),
            "CALLS",
            "PROMPT",
            "COMPLETION",
            "COST",
        ]
        .map(str::to_owned),
    ];
    let line = |key: &str, usage: &LlmUsage| {
        [
            key.to_owned(),
            usage.calls.to_string(),
            usage.prompt_tokens.to_string(),
            usage.completion_tokens.to_string(),
            dollars(usage.cost_usd),
        ]
    };
    for row in &report.rows {
        rows.push(line(&row.key, &row.usage.unwrap_or_default()));
    }
    rows.push(line("TOTAL", &report.total.unwrap_or_default()));
    output::aligned(&rows)
}

fn row_json(p: &ProcessInfo) -> Value {
    json!({
        "pid": p.pid,
        "name": p.name,
        "model": p.model,
        "usage": p.usage.as_ref().map(output::usage_json),
        "subtree_usage": p.subtree_usage.as_ref().map(output::usage_json),
        "budget": p.budget.as_ref().map(output::budget_json),
    })
}

fn table(procs: &[ProcessInfo]) -> String {
    let mut rows = vec![
        [
            "PID",
            "NAME",
            "MODEL",
            "CALLS",
            "TOKENS",
            "COST",
            "SUBTREE",
            "SUBTREE_COST",
            "BUDGET",
        ]
        .map(str::to_owned),
    ];
    for p in procs {
        let own = p.usage.unwrap_or_default();
        let subtree = p.subtree_usage.unwrap_or_default();
        let budget = match &p.budget {
            Some(b) if b.owner == p.pid => format!("{}/{} left", b.remaining, b.max_tokens_total),
            Some(b) => format!("{} left (of {})", b.remaining, b.owner),
            None => "-".to_owned(),
        };
        rows.push([
            p.pid.to_string(),
            p.name.clone(),
            if p.model.is_empty() {
                "-".into()
            } else {
                p.model.clone()
            },
            own.calls.to_string(),
            tokens(&own).to_string(),
            dollars(own.cost_usd),
            tokens(&subtree).to_string(),
            dollars(subtree.cost_usd),
            budget,
        ]);
    }
    output::aligned(&rows)
}

fn tokens(usage: &LlmUsage) -> u64 {
    usage.prompt_tokens.saturating_add(usage.completion_tokens)
}

/// Dollars with enough digits for small amounts: `$0.0042`.
fn dollars(amount: f64) -> String {
    format!("${amount:.4}")
}
