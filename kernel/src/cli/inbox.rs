//! `inbox`, `approve`, `deny` and `answer`.

pub(super) use hivekernel_proto::v1::Verdict;
use hivekernel_proto::v1::{
    InboxChange, InboxRequest, ListRequestsRequest, ResolveRequest, WatchRequestsRequest,
};
use serde_json::{Value, json};

use super::client::Session;
use super::{CliError, ClientArgs, InboxArgs, human, output};

/// `hivekernel inbox`: the pending requests, or (-f) every change.
pub(super) async fn inbox(args: InboxArgs) -> Result<(), CliError> {
    let mut session = Session::connect(&args.client).await?;
    if !args.follow {
        let requests = session
            .client
            .list_requests(ListRequestsRequest {})
            .await
            .map_err(|status| session.error(status))?
            .into_inner()
            .requests;
        return if args.json {
            let all: Vec<Value> = requests.iter().map(request_json).collect();
            output::print(&output::line(&Value::Array(all).to_string()))
        } else if requests.is_empty() {
            output::print("no pending requests\n")
        } else {
            output::print(&table(&requests))
        };
    }
    let mut changes = session
        .client
        .watch_requests(WatchRequestsRequest {})
        .await
        .map_err(|status| session.error(status))?
        .into_inner();
    loop {
        let change = match changes.message().await {
            Ok(Some(change)) => change,
            Ok(None) => return Ok(()),
            Err(status) => return Err(session.error(status)),
        };
        let text = if args.json {
            output::line(&change_json(&change).to_string())
        } else {
            match change_text(&change) {
                Some(text) => output::line(&text),
                None => continue,
            }
        };
        output::print(&text)?;
    }
}

/// `approve`, `deny` and `answer`.
pub(super) async fn resolve(
    client: &ClientArgs,
    id: u64,
    verdict: Verdict,
    text: String,
) -> Result<(), CliError> {
    let mut session = Session::connect(client).await?;
    let request = session
        .client
        .resolve(ResolveRequest {
            id,
            verdict: verdict.into(),
            text,
        })
        .await
        .map_err(|status| session.error(status))?
        .into_inner();
    let done = match verdict {
        Verdict::Approve => "approved",
        Verdict::Deny => "denied",
        Verdict::Answer | Verdict::Unspecified => "answered",
    };
    output::print(&output::line(&format!(
        "{done} request {id} of process {} ({})",
        request.pid, request.name
    )))
}

/// What a request asks, in one line.
fn asks(request: &InboxRequest) -> String {
    if request.kind == "approval" {
        format!("run {} {}", request.tool, request.arguments)
    } else if request.choices.is_empty() {
        request.question.clone()
    } else {
        format!("{} [{}]", request.question, request.choices.join(" | "))
    }
}

/// ID PROCESS KIND WAITING TIMEOUT ASKS, one line per request.
fn table(requests: &[InboxRequest]) -> String {
    let now = human::now_ms();
    let mut rows = vec![["ID", "PROCESS", "KIND", "WAITING", "TIMEOUT", "ASKS"].map(str::to_owned)];
    for request in requests {
        let timeout = format!(
            "in {} ({})",
            human::duration(request.deadline_unix_ms.saturating_sub(now)),
            if request.kind == "approval" {
                request.on_timeout.as_str()
            } else {
                "no answer"
            }
        );
        rows.push([
            request.id.to_string(),
            format!("{} ({})", request.pid, request.name),
            request.kind.clone(),
            human::age(request.created_at_unix_ms, now),
            timeout,
            hivekernel_agents::text::cut_str(&asks(request), 160),
        ]);
    }
    output::aligned(&rows)
}

fn change_text(change: &InboxChange) -> Option<String> {
    let request = change.request.as_ref();
    match (change.change.as_str(), request) {
        ("pending" | "asked", Some(request)) => Some(format!(
            "asked    #{} process {} ({}): {}",
            request.id,
            request.pid,
            request.name,
            asks(request)
        )),
        ("resolved", Some(request)) => {
            let said = if change.text.is_empty() {
                String::new()
            } else {
                format!(": {}", change.text)
            };
            Some(format!(
                "{:<8} #{} process {} ({}) by {}{said}",
                change.decision, request.id, request.pid, request.name, change.by
            ))
        }
        ("lagged", _) => Some("(changes were missed; run hivekernel inbox for the list)".into()),
        _ => None,
    }
}

fn request_json(request: &InboxRequest) -> Value {
    let mut value = json!({
        "id": request.id,
        "pid": request.pid,
        "name": request.name,
        "kind": request.kind,
        "created_at_unix_ms": request.created_at_unix_ms,
        "deadline_unix_ms": request.deadline_unix_ms,
    });
    if request.kind == "approval" {
        value["tool"] = json!(request.tool);
        value["arguments"] = json!(request.arguments);
        value["on_timeout"] = json!(request.on_timeout);
    } else {
        value["question"] = json!(request.question);
        value["choices"] = json!(request.choices);
    }
    if !request.trace_id.is_empty() {
        value["trace_id"] = json!(request.trace_id);
    }
    value
}

fn change_json(change: &InboxChange) -> Value {
    let mut value = json!({ "change": change.change });
    if let Some(request) = &change.request {
        value["request"] = request_json(request);
    }
    if change.change == "resolved" {
        value["decision"] = json!(change.decision);
        value["by"] = json!(change.by);
        value["text"] = json!(change.text);
    }
    value
}
