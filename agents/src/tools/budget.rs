//! `budget`: what the calling agent has spent and has left: tokens against
//! its token budget, cost so far, its rate limits. The same text a
//! `tool_agent`'s system prompt carries when it has a budget
//! (`tool_agent.budget_in_prompt`).

use std::fmt::Write as _;

use async_trait::async_trait;
use serde_json::json;

use super::{Tool, ToolContext, ToolError, decode, refused};
use crate::capability::Capability;
use crate::process::ProcessInfo;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

/// The `budget` tool.
#[derive(Debug)]
pub struct Budget;

#[async_trait]
impl Tool for Budget {
    fn name(&self) -> &'static str {
        "budget"
    }

    fn description(&self) -> &'static str {
        "Your token budget (used and left), what your model calls cost so far, and your rate limits."
    }

    fn capability(&self) -> Option<Capability> {
        None
    }

    fn parameters(&self) -> serde_json::Value {
        json!({ "type": "object", "properties": {}, "additionalProperties": false })
    }

    async fn call(
        &self,
        ctx: &ToolContext<'_>,
        args: serde_json::Value,
    ) -> Result<String, ToolError> {
        let NoArgs {} = decode(self, args)?;
        let me = ctx.process.pid;
        let info = ctx
            .process
            .syscalls
            .get_process(me)
            .await
            .map_err(refused)?;
        Ok(describe(&info).unwrap_or_else(|| {
            let mut text = String::from("You have no token budget and no rate limits.\n");
            spent(&info, &mut text);
            text
        }))
    }
}

/// The budget state of `info` as lines for a model, or `None` when it has
/// neither a token budget nor a rate limit.
pub fn describe(info: &ProcessInfo) -> Option<String> {
    let limits = &info.limits;
    if info.budget.is_none()
        && limits.llm_calls_per_minute.is_none()
        && limits.spawns_per_minute.is_none()
    {
        return None;
    }
    let mut text = String::new();
    if let Some(budget) = &info.budget {
        let _ = write!(
            text,
            "- Tokens: {} used of {}, {} left",
            budget.used, budget.max_tokens_total, budget.remaining
        );
        if budget.owner == info.pid {
            text.push_str(" (your own budget, which your descendants draw on too)\n");
        } else {
            let _ = writeln!(
                text,
                " (the budget of process {}, which you share)",
                budget.owner
            );
        }
    } else {
        text.push_str("- Tokens: no budget\n");
    }
    spent(info, &mut text);
    let rates: Vec<String> = [
        limits
            .llm_calls_per_minute
            .map(|n| format!("{n} model calls")),
        limits.spawns_per_minute.map(|n| format!("{n} spawns")),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !rates.is_empty() {
        let _ = writeln!(text, "- Rate limits: {} a minute", rates.join(", "));
    }
    text.push_str(
        "When the tokens run out, model calls are refused: plan the work to fit, and say so \
         early when it cannot.\n",
    );
    Some(text)
}

/// Cost so far, own and with descendants.
fn spent(info: &ProcessInfo, text: &mut String) {
    let own = &info.usage;
    let _ = write!(
        text,
        "- Spent: {} model calls, {} tokens, ${:.4}",
        own.calls,
        own.total_tokens(),
        own.cost_usd()
    );
    let subtree = &info.subtree_usage;
    if subtree.calls > own.calls {
        let _ = write!(
            text,
            "; with your descendants {} tokens, ${:.4}",
            subtree.total_tokens(),
            subtree.cost_usd()
        );
    }
    text.push('\n');
}
