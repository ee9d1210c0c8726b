//! Rendering for the client commands: process tables, trees and JSON, exit
//! records, events and UTC timestamps. Pure functions over proto messages.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::io::{self, Write};

use hivekernel_proto::v1::{Budget, Event, ExitRecord, Limits, LlmUsage, ProcessInfo};
use serde_json::{Map, Value, json};

use super::{CliError, names};

/// Writes `text` to stdout with its control characters made visible
/// ([`visible`]); a closed pipe is reported as an error the caller keeps quiet.
pub(super) fn print(text: &str) -> Result<(), CliError> {
    print_raw(&visible(text))
}

/// Writes `text` to stdout as it is: only for what this program composed
/// itself (a terminal's clear-screen sequence).
pub(super) fn print_raw(text: &str) -> Result<(), CliError> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// `text` with every control character but newline and tab written as
/// `\u001b` (JSON's own escape, so JSON output stays valid JSON): names,
/// messages, model output and logs come from processes and models, and an
/// escape sequence among them would drive the reader's terminal (retitle
/// it, rewrite what is on screen, paste into its input).
pub(crate) fn visible(text: &str) -> std::borrow::Cow<'_, str> {
    let hidden = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.contains(hidden) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if hidden(c) {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `text` followed by exactly one newline.
pub(super) fn line(text: &str) -> String {
    let mut text = text.trim_end_matches('\n').to_owned();
    text.push('\n');
    text
}

/// An aligned table: PID PPID NAME ROLE TIER STATE AGE RESTARTS CHILDREN
/// MAILBOX TOKENS MODEL RUNTIME (AGE: since it started, as of `now`;
/// TOKENS: prompt plus completion tokens of the process's model calls).
pub(super) fn table(procs: &[ProcessInfo], now: u64) -> String {
    const HEADER: [&str; 13] = [
        "PID", "PPID", "NAME", "ROLE", "TIER", "STATE", "AGE", "RESTARTS", "CHILDREN", "MAILBOX",
        "TOKENS", "MODEL", "RUNTIME",
    ];
    let mut rows = vec![HEADER.map(str::to_owned)];
    rows.extend(procs.iter().map(|p| {
        [
            p.pid.to_string(),
            p.ppid.to_string(),
            p.name.clone(),
            names::role(p.role).to_owned(),
            names::tier(p.tier).to_owned(),
            names::state(p.state).to_owned(),
            super::human::age(p.started_at_unix_ms, now),
            p.restarts.to_string(),
            p.children.to_string(),
            p.mailbox_len.to_string(),
            super::human::count(
                p.usage
                    .as_ref()
                    .map_or(0, |u| u.prompt_tokens.saturating_add(u.completion_tokens)),
            ),
            if p.model.is_empty() {
                "-".to_owned()
            } else {
                p.model.clone()
            },
            p.runtime.clone(),
        ]
    }));
    // Nodes of a cluster say where each process lives, after its name.
    if procs.iter().any(|p| !p.node.is_empty()) {
        let nodes = std::iter::once("NODE").chain(procs.iter().map(|p| p.node.as_str()));
        let rows: Vec<[String; 14]> = rows
            .into_iter()
            .zip(nodes)
            .map(|(row, node)| with_cell(row, 3, node.to_owned()))
            .collect();
        return aligned(&rows);
    }
    aligned(&rows)
}

/// `row` with `cell` put in at column `at`.
fn with_cell<const N: usize, const M: usize>(
    row: [String; N],
    at: usize,
    cell: String,
) -> [String; M] {
    let mut cells = row.into_iter();
    let mut cell = Some(cell);
    std::array::from_fn(|i| {
        if i == at {
            cell.take().unwrap_or_default()
        } else {
            cells.next().unwrap_or_default()
        }
    })
}

/// Rows as left-aligned columns two spaces apart, each line trimmed.
pub(super) fn aligned<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut text = String::new();
        for (cell, width) in row.iter().zip(widths) {
            let _ = write!(text, "{cell:<width$}  ");
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

/// An indented tree, one `name (pid) role/tier state` per line, children by PID.
///
/// A process whose parent is not in `procs` is a root. Nothing is dropped: a
/// process caught in a parent cycle (which a sane kernel never reports) is
/// printed as a root of its own.
pub(super) fn tree(procs: &[ProcessInfo]) -> String {
    let present: HashSet<u64> = procs.iter().map(|p| p.pid).collect();
    let mut children: HashMap<u64, Vec<&ProcessInfo>> = HashMap::new();
    let mut roots = Vec::new();
    for p in procs {
        if p.ppid != p.pid && present.contains(&p.ppid) {
            children.entry(p.ppid).or_default().push(p);
        } else {
            roots.push(p);
        }
    }
    for kids in children.values_mut() {
        kids.sort_by_key(|p| p.pid);
    }
    let mut rest: Vec<&ProcessInfo> = procs.iter().collect();
    rest.sort_by_key(|p| p.pid);
    roots.sort_by_key(|p| p.pid);

    let mut out = String::new();
    let mut seen = HashSet::new();
    for root in roots.into_iter().chain(rest) {
        if !seen.contains(&root.pid) {
            subtree(&mut out, root, &children, &mut seen);
        }
    }
    out
}

/// Renders `root` and its descendants depth first, with an explicit stack.
fn subtree(
    out: &mut String,
    root: &ProcessInfo,
    children: &HashMap<u64, Vec<&ProcessInfo>>,
    seen: &mut HashSet<u64>,
) {
    // (process, what goes before its label, what goes before its children's branches)
    let mut stack = vec![(root, String::new(), String::new())];
    while let Some((p, lead, indent)) = stack.pop() {
        if !seen.insert(p.pid) {
            continue;
        }
        let _ = writeln!(out, "{lead}{}", tree_label(p));
        let kids = children.get(&p.pid).map(Vec::as_slice).unwrap_or_default();
        let last = kids.len().saturating_sub(1);
        for (i, kid) in kids.iter().enumerate().rev() {
            let (branch, under) = if i == last {
                ("└─ ", "   ")
            } else {
                ("├─ ", "│  ")
            };
            stack.push((kid, format!("{indent}{branch}"), format!("{indent}{under}")));
        }
    }
}

fn tree_label(p: &ProcessInfo) -> String {
    let mut label = format!(
        "{} ({}) {}/{} {}",
        p.name,
        p.pid,
        names::role(p.role),
        names::tier(p.tier),
        names::state(p.state)
    );
    // On a node of a cluster: where it lives (PID 1 is every node's kernel).
    if !p.node.is_empty() && p.pid != 1 {
        let _ = write!(label, " @{}", p.node);
    }
    label
}

/// One process as JSON, with lowercase role, tier and state names.
pub(super) fn process_json(p: &ProcessInfo) -> Value {
    json!({
        "pid": p.pid,
        "ppid": p.ppid,
        "name": p.name,
        "role": names::role(p.role),
        "tier": names::tier(p.tier),
        "state": names::state(p.state),
        "model": p.model,
        "runtime": p.runtime,
        "tools": p.tools,
        "limits": p.limits.as_ref().map(limits_json),
        "depth": p.depth,
        "children": p.children,
        "mailbox_len": p.mailbox_len,
        "started_at_unix_ms": p.started_at_unix_ms,
        "metadata": p.metadata,
        "usage": p.usage.as_ref().map(usage_json),
        "subtree_usage": p.subtree_usage.as_ref().map(usage_json),
        "budget": p.budget.as_ref().map(budget_json),
        "capabilities": p.capabilities,
        "exit": p.exit.as_ref().map(exit_json),
        "restarts": p.restarts,
        "restart": p.restart.as_ref().map(|r| json!({
            "policy": names::policy(r.policy),
            "max_restarts": r.max_restarts,
            "within_seconds": r.within_seconds,
            "backoff_ms": r.backoff_ms,
        })),
        "strategy": names::strategy(p.strategy),
        "last_exit": p.last_exit.as_ref().map(exit_json),
        "restored": p.restored,
        "log_path": (!p.log_path.is_empty()).then_some(&p.log_path),
        "node": (!p.node.is_empty()).then_some(&p.node),
    })
}

/// A token budget as JSON.
pub(super) fn budget_json(b: &Budget) -> Value {
    json!({
        "owner": b.owner,
        "max_tokens_total": b.max_tokens_total,
        "used": b.used,
        "remaining": b.remaining,
    })
}

/// Model usage as JSON, with its total and its cost in dollars.
pub(super) fn usage_json(u: &LlmUsage) -> Value {
    json!({
        "calls": u.calls,
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens.saturating_add(u.completion_tokens),
        "cost_usd": u.cost_usd,
    })
}

fn limits_json(limits: &Limits) -> Value {
    json!({
        "max_children": limits.max_children,
        "max_depth": limits.max_depth,
        "timeout_seconds": limits.timeout_seconds,
        "max_concurrent_tasks": limits.max_concurrent_tasks,
        "max_tokens_total": (limits.max_tokens_total > 0).then_some(limits.max_tokens_total),
        "spawns_per_minute": (limits.spawns_per_minute > 0).then_some(limits.spawns_per_minute),
        "llm_calls_per_minute": (limits.llm_calls_per_minute > 0)
            .then_some(limits.llm_calls_per_minute),
        "max_storage_bytes": (limits.max_storage_bytes > 0).then_some(limits.max_storage_bytes),
    })
}

/// An exit record as JSON.
pub(super) fn exit_json(exit: &ExitRecord) -> Value {
    json!({
        "pid": exit.pid,
        "ppid": exit.ppid,
        "name": exit.name,
        "exit_code": exit.exit_code,
        "output": exit.output,
        "reason": exit.reason,
        "exited_at_unix_ms": exit.exited_at_unix_ms,
    })
}

/// `pid N exited with code C: reason`.
pub(super) fn exit_text(exit: &ExitRecord) -> String {
    let mut text = format!("pid {} exited with code {}", exit.pid, exit.exit_code);
    if !exit.reason.is_empty() {
        let _ = write!(text, ": {}", exit.reason);
    }
    text
}

/// `<seq> <UTC time> pid=<pid> <type> key=value ...`: the detail's fields
/// but `type`, durations and costs in human form (`--json` has them exact).
pub(super) fn event_text(event: &Event) -> String {
    let mut text = format!(
        "{} {} pid={}",
        event.seq,
        rfc3339_utc(event.at_unix_ms),
        event.pid
    );
    if !event.node.is_empty() {
        let _ = write!(text, " node={}", event.node);
    }
    let _ = write!(text, " {}", event.r#type);
    match serde_json::from_str::<Value>(&event.detail) {
        Ok(Value::Object(fields)) => {
            for (key, value) in fields.iter().filter(|(key, _)| *key != "type") {
                let (key, shown) = field_text(key, value);
                let _ = write!(text, " {key}={shown}");
            }
        }
        _ if event.detail.is_empty() => {}
        _ => {
            let _ = write!(text, " {}", event.detail);
        }
    }
    text
}

/// One detail field as text: `duration_ms: 1500` reads `duration=1.5s`...
fn field_text<'a>(key: &'a str, value: &Value) -> (&'a str, String) {
    match (key, value.as_u64()) {
        ("cost_nano_usd", Some(nanos)) => ("cost", super::human::usd(nanos as f64 / 1e9)),
        (key, Some(ms)) if key.ends_with("_ms") => {
            (key.trim_end_matches("_ms"), super::human::duration(ms))
        }
        _ => match value {
            Value::String(text) if !text.is_empty() && !text.contains([' ', '"', '=']) => {
                (key, text.clone())
            }
            other => (key, other.to_string()),
        },
    }
}

/// One JSON object: the detail's fields plus seq, at_unix_ms, pid and type (which win).
pub(super) fn event_json(event: &Event) -> Value {
    let mut object = match serde_json::from_str::<Value>(&event.detail) {
        Ok(Value::Object(fields)) => fields,
        Ok(other) => Map::from_iter([("detail".to_owned(), other)]),
        Err(_) if event.detail.is_empty() => Map::new(),
        Err(_) => Map::from_iter([("detail".to_owned(), Value::from(event.detail.clone()))]),
    };
    object.insert("seq".to_owned(), event.seq.into());
    object.insert("at_unix_ms".to_owned(), event.at_unix_ms.into());
    object.insert("pid".to_owned(), event.pid.into());
    object.insert("type".to_owned(), event.r#type.clone().into());
    if !event.trace_id.is_empty() {
        object.insert("trace_id".to_owned(), event.trace_id.clone().into());
    }
    if !event.node.is_empty() {
        object.insert("node".to_owned(), event.node.clone().into());
    }
    Value::Object(object)
}

/// `2024-05-06T07:08:09.010Z` for a Unix time in milliseconds.
pub(super) fn rfc3339_utc(unix_ms: u64) -> String {
    let millis = unix_ms % 1000;
    let secs = unix_ms / 1000;
    let (days, day_secs) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        day_secs / 3600,
        day_secs % 3600 / 60,
        day_secs % 60
    )
}

/// Proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests;
