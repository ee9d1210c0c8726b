//! `exec` and `send`.

use std::time::Duration;

use hivekernel_proto::v1::{ExecuteTaskRequest, Priority as PbPriority, SendMessageRequest};
use serde_json::json;
use tonic::Request;

use super::client::Session;
use super::process::millis;
use super::{CliError, ExecArgs, SendArgs, names, output};

/// How much longer than the task's own timeout the client waits for the kernel's answer.
const DEADLINE_SLACK: Duration = Duration::from_secs(5);

/// Runs a task and prints its output; a failed task exits 1 with its error on stderr.
pub(super) async fn exec(args: ExecArgs) -> Result<(), CliError> {
    let mut session = Session::connect(&args.client).await?;
    let mut request = Request::new(ExecuteTaskRequest {
        pid: args.pid,
        description: args.text,
        params: Default::default(),
        timeout_ms: args.timeout.map_or(0, millis),
    });
    if let Some(timeout) = args.timeout {
        request.set_timeout(timeout.saturating_add(DEADLINE_SLACK));
    }
    let reply = session
        .client
        .execute_task(request)
        .await
        .map_err(|status| session.error(status))?
        .into_inner();
    if args.json {
        let value = json!({
            "request_id": reply.request_id,
            "success": reply.success,
            "output": reply.output,
            "error": reply.error,
        });
        output::print(&output::line(&value.to_string()))?;
    } else if reply.success {
        output::print(&output::line(&reply.output))?;
    }
    if reply.success {
        Ok(())
    } else if reply.error.is_empty() {
        Err(CliError::TaskFailed("no error message".to_owned()))
    } else {
        Err(CliError::TaskFailed(reply.error))
    }
}

/// Sends a fire-and-forget message and prints its id.
pub(super) async fn send(args: SendArgs) -> Result<(), CliError> {
    let mut session = Session::connect(&args.client).await?;
    let request = SendMessageRequest {
        to: args.pid,
        r#type: args.kind.unwrap_or_default(),
        payload: args.text,
        priority: args
            .priority
            .map_or(PbPriority::Unspecified, names::priority_to_proto) as i32,
        ttl_ms: args.ttl_ms.unwrap_or(0),
        from: 0,
    };
    let id = session
        .client
        .send_message(request)
        .await
        .map_err(|status| session.error(status))?
        .into_inner()
        .message_id;
    output::print(&output::line(&id.to_string()))
}
