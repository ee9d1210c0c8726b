//! `describe`: everything the kernel knows of one process, in sections.

use std::fmt::Write as _;

use hivekernel_proto::v1::{
    CronEntry, GetProcessRequest, ListProcessesRequest, LlmUsage, ProcessInfo,
};
use serde_json::Value;

use super::client::Session;
use super::{CliError, DescribeArgs, human, names, output};

/// Prints one process: identity, supervision, limits, usage and budget,
/// children, the cron entries aimed at it, and its exit if it has one.
pub(super) async fn describe(args: DescribeArgs) -> Result<(), CliError> {
    let mut session = Session::connect(&args.client).await?;
    let pid = session.pid(&args.pid).await?;
    let found = gather(&mut session, pid).await?;
    let text = if args.json {
        format!("{:#}\n", found.json())
    } else {
        found.text(human::now_ms())
    };
    output::print(&text)
}

/// One process, its children, and the cron entries aimed at it.
#[derive(Debug)]
pub(super) struct Described {
    info: ProcessInfo,
    children: Vec<ProcessInfo>,
    cron: Vec<CronEntry>,
}

impl Described {
    /// The process's JSON with `children` and `cron` arrays added.
    pub(super) fn json(&self) -> Value {
        let mut value = output::process_json(&self.info);
        value["children"] = Value::Array(self.children.iter().map(output::process_json).collect());
        value["cron"] = Value::Array(self.cron.iter().map(super::cron::entry_json).collect());
        value
    }

    /// The sections `describe` prints, ages relative to `now` (Unix ms).
    pub(super) fn text(&self, now: u64) -> String {
        text(&self.info, &self.children, &self.cron, now)
    }
}

/// Asks the kernel for everything `describe` shows of `pid`.
pub(super) async fn gather(session: &mut Session, pid: u64) -> Result<Described, CliError> {
    let info = session
        .client
        .get_process(GetProcessRequest { pid })
        .await
        .map_err(|status| session.error(status))?
        .into_inner();
    let mut stream = session
        .client
        .list_processes(ListProcessesRequest {
            root: pid,
            max_depth: 1,
            batch_size: 0,
        })
        .await
        .map_err(|status| session.error(status))?
        .into_inner();
    let mut children = Vec::new();
    while let Some(batch) = stream
        .message()
        .await
        .map_err(|status| session.error(status))?
    {
        children.extend(batch.processes.into_iter().filter(|p| p.pid != pid));
    }
    let cron: Vec<CronEntry> = super::cron::entries(session)
        .await?
        .into_iter()
        .filter(|entry| entry.spec.as_ref().is_some_and(|spec| spec.target == pid))
        .collect();
    Ok(Described {
        info,
        children,
        cron,
    })
}

/// The sections, as text; `now` for ages.
fn text(p: &ProcessInfo, children: &[ProcessInfo], cron: &[CronEntry], now: u64) -> String {
    let mut out = String::new();
    let mut field = |name: &str, value: &str| {
        let _ = writeln!(out, "{:<14}{value}", format!("{name}:"));
    };
    field("Name", &p.name);
    field("PID", &format!("{} (parent {})", p.pid, p.ppid));
    if !p.node.is_empty() {
        field("Node", &p.node);
    }
    field(
        "Role",
        &format!("{} (tier {})", names::role(p.role), names::tier(p.tier)),
    );
    field(
        "State",
        &format!(
            "{} (up {}, started {}{})",
            names::state(p.state),
            human::age(p.started_at_unix_ms, now),
            output::rfc3339_utc(p.started_at_unix_ms),
            if p.restored {
                "; back after a kernel restart"
            } else {
                ""
            }
        ),
    );
    field("Runtime", &p.runtime);
    field("Model", if p.model.is_empty() { "-" } else { &p.model });
    field("Mailbox", &format!("{} queued", p.mailbox_len));
    if let Some(restart) = &p.restart {
        let backoff = match restart.backoff_ms.as_slice() {
            [first, most] => format!(
                ", backoff {} to {}",
                human::duration(*first),
                human::duration(*most)
            ),
            _ => String::new(),
        };
        field(
            "Restart",
            &format!(
                "{}, at most {} in {}{backoff}; restarted {} times; children {}",
                names::policy(restart.policy),
                restart.max_restarts.unwrap_or(0),
                human::duration(restart.within_seconds.unwrap_or(0).saturating_mul(1000)),
                p.restarts,
                names::strategy(p.strategy),
            ),
        );
    }
    if let Some(exit) = &p.last_exit {
        field(
            "Last exit",
            &format!(
                "{} ({} ago)",
                output::exit_text(exit),
                human::age(exit.exited_at_unix_ms, now)
            ),
        );
    }
    field("Tools", &list(&p.tools));
    field("Capabilities", &list(&p.capabilities));
    if !p.log_path.is_empty() {
        field("Log file", &p.log_path);
    }
    if !p.metadata.is_empty() {
        let mut pairs: Vec<String> = p.metadata.iter().map(|(k, v)| format!("{k}={v}")).collect();
        pairs.sort();
        field("Metadata", &pairs.join(", "));
    }
    if let Some(limits) = &p.limits {
        let optional = |n: u64| {
            if n == 0 {
                "-".to_owned()
            } else {
                human::count(n)
            }
        };
        let _ = writeln!(out, "Limits:");
        let rows = [
            ["max_children".to_owned(), limits.max_children.to_string()],
            ["max_depth".to_owned(), limits.max_depth.to_string()],
            [
                "timeout".to_owned(),
                human::duration(limits.timeout_seconds.saturating_mul(1000)),
            ],
            [
                "max_concurrent_tasks".to_owned(),
                limits.max_concurrent_tasks.to_string(),
            ],
            [
                "max_tokens_total".to_owned(),
                optional(limits.max_tokens_total),
            ],
            [
                "spawns_per_minute".to_owned(),
                optional(u64::from(limits.spawns_per_minute)),
            ],
            [
                "llm_calls_per_minute".to_owned(),
                optional(u64::from(limits.llm_calls_per_minute)),
            ],
            [
                "max_storage_bytes".to_owned(),
                optional(limits.max_storage_bytes),
            ],
        ];
        indent(&mut out, &output::aligned(&rows));
    }
    let _ = writeln!(out, "Usage:");
    let usage_rows = [
        ["own".to_owned(), usage_text(p.usage.as_ref())],
        ["subtree".to_owned(), usage_text(p.subtree_usage.as_ref())],
    ];
    indent(&mut out, &output::aligned(&usage_rows));
    let budget = match &p.budget {
        Some(b) => format!(
            "{} of {} tokens used, {} left (allocated to {})",
            human::count(b.used),
            human::count(b.max_tokens_total),
            human::count(b.remaining),
            if b.owner == p.pid {
                "it".to_owned()
            } else {
                format!("pid {}", b.owner)
            }
        ),
        None => "unlimited".to_owned(),
    };
    let _ = writeln!(out, "{:<14}{budget}", "Budget:");
    if children.is_empty() {
        let _ = writeln!(out, "{:<14}none", "Children:");
    } else {
        let _ = writeln!(out, "Children:");
        let mut rows = vec![[
            "PID".to_owned(),
            "NAME".to_owned(),
            "ROLE".to_owned(),
            "STATE".to_owned(),
            "AGE".to_owned(),
        ]];
        rows.extend(children.iter().map(|c| {
            [
                c.pid.to_string(),
                c.name.clone(),
                names::role(c.role).to_owned(),
                names::state(c.state).to_owned(),
                human::age(c.started_at_unix_ms, now),
            ]
        }));
        indent(&mut out, &output::aligned(&rows));
    }
    if cron.is_empty() {
        let _ = writeln!(out, "{:<14}none", "Cron:");
    } else {
        let _ = writeln!(out, "Cron:");
        for entry in cron {
            let Some(spec) = &entry.spec else { continue };
            let next = if entry.next_run_unix_ms == 0 {
                "never".to_owned()
            } else {
                format!(
                    "in {}",
                    human::duration(entry.next_run_unix_ms.saturating_sub(now))
                )
            };
            let _ = writeln!(
                out,
                "  {} {:?} {} {:?}, next {next}, {} runs",
                spec.name, spec.expression, spec.action, spec.description, entry.runs
            );
        }
    }
    if let Some(exit) = &p.exit {
        let _ = writeln!(out, "{:<14}{}", "Exit:", output::exit_text(exit));
    }
    out
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_owned()
    } else {
        items.join(", ")
    }
}

fn usage_text(usage: Option<&LlmUsage>) -> String {
    let Some(u) = usage else {
        return "-".to_owned();
    };
    format!(
        "{} calls, {} tokens ({} prompt + {} completion), {}",
        human::count(u.calls),
        human::count(u.prompt_tokens.saturating_add(u.completion_tokens)),
        human::count(u.prompt_tokens),
        human::count(u.completion_tokens),
        human::usd(u.cost_usd)
    )
}

fn indent(out: &mut String, block: &str) {
    for line in block.lines() {
        let _ = writeln!(out, "  {line}");
    }
}
