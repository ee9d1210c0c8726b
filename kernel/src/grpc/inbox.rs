//! The inbox methods: list and watch requests, resolve one.

use std::sync::Arc;

use hivekernel_proto::v1 as pb;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::streams::{Stop, send};
use crate::inbox::{Ask, Change, Decision, InboxRequest};
use crate::kernel::{Caller, Kernel};

/// Changes in flight between a `WatchRequests` producer and its client.
const CHANGE_BUFFER: usize = 64;

pub(super) fn list(kernel: &Kernel, caller: Caller) -> pb::ListRequestsResponse {
    pb::ListRequestsResponse {
        requests: kernel.inbox().pending(caller).iter().map(request).collect(),
    }
}

pub(super) async fn resolve(
    kernel: &Kernel,
    caller: Caller,
    req: pb::ResolveRequest,
) -> Result<pb::InboxRequest, Status> {
    if req.id == 0 {
        return Err(Status::invalid_argument("id must name a request (not 0)"));
    }
    let decision = match pb::Verdict::try_from(req.verdict) {
        Ok(pb::Verdict::Approve) => Decision::Approved { note: req.text },
        Ok(pb::Verdict::Deny) => Decision::Denied { reason: req.text },
        Ok(pb::Verdict::Answer) => Decision::Answered { answer: req.text },
        Ok(pb::Verdict::Unspecified) | Err(_) => {
            return Err(Status::invalid_argument(format!(
                "verdict must be VERDICT_APPROVE, VERDICT_DENY or VERDICT_ANSWER, got {}",
                req.verdict
            )));
        }
    };
    let resolved = kernel.inbox().resolve(caller, req.id, decision).await?;
    Ok(request(&resolved))
}

/// The requests `caller` may see, a `pending` marker, then each change.
pub(super) fn watch(
    kernel: &Kernel,
    caller: Caller,
    stop: Stop,
) -> ReceiverStream<Result<pb::InboxChange, Status>> {
    let (tx, rx) = mpsc::channel(CHANGE_BUFFER);
    let (pending, mut changes) = kernel.inbox().watch(caller);
    let kernel = kernel.clone();
    kernel.tracker().clone().spawn(async move {
        for asked in &pending {
            let item = pb::InboxChange {
                change: "pending".into(),
                request: Some(request(asked)),
                ..Default::default()
            };
            if !send(&tx, Ok(item), &stop).await {
                return;
            }
        }
        let done = pb::InboxChange {
            change: "pending".into(),
            ..Default::default()
        };
        if !send(&tx, Ok(done), &stop).await {
            return;
        }
        loop {
            let received = tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = tx.closed() => return,
                received = changes.recv() => received,
            };
            let item = match received {
                Ok(Change::Asked(asked)) if kernel.inbox().sees(caller, &asked) => {
                    pb::InboxChange {
                        change: "asked".into(),
                        request: Some(request(&asked)),
                        ..Default::default()
                    }
                }
                Ok(Change::Resolved(done, how)) if kernel.inbox().sees(caller, &done) => {
                    pb::InboxChange {
                        change: "resolved".into(),
                        request: Some(request(&done)),
                        decision: how.decision.as_str().into(),
                        by: how.by.clone(),
                        text: how.decision.text().to_owned(),
                    }
                }
                Ok(_) => continue,
                Err(RecvError::Lagged(_)) => pb::InboxChange {
                    change: "lagged".into(),
                    ..Default::default()
                },
                Err(RecvError::Closed) => return,
            };
            if !send(&tx, Ok(item), &stop).await {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}

pub(super) fn request(request: &Arc<InboxRequest>) -> pb::InboxRequest {
    let mut out = pb::InboxRequest {
        id: request.id,
        pid: request.pid.0,
        name: request.name.clone(),
        kind: request.ask.kind().into(),
        created_at_unix_ms: request.created_ms,
        deadline_unix_ms: request.deadline_ms,
        on_timeout: request.on_timeout.as_str().into(),
        trace_id: request.trace.map(|t| t.to_string()).unwrap_or_default(),
        ..Default::default()
    };
    match &request.ask {
        Ask::Approval { tool, arguments } => {
            out.tool = tool.clone();
            out.arguments = arguments.clone();
        }
        Ask::Question { question, choices } => {
            out.question = question.clone();
            out.choices = choices.clone();
        }
    }
    out
}
