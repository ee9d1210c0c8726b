//! `usage`: model calls, tokens, cost and budgets per process and per subtree.

use serde_json::{Value, json};

use hivekernel_proto::v1::{LlmUsage, ProcessInfo};

use super::client::Session;
use super::process::list;
use super::{CliError, UsageArgs, output};

/// Prints the usage of every process under `PID` (default PID 1).
pub(super) async fn usage(args: UsageArgs) -> Result<(), CliError> {
    let mut session = Session::connect(&args.client).await?;
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
