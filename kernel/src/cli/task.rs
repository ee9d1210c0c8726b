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
    let json = args.json;
    let reply = match ask(&args).await {
        Ok(reply) => reply,
        // A script reading JSON gets JSON, whatever went wrong.
        Err(err) if json => {
            let value = json!({
                "success": false,
                "error": err.to_string(),
                "exit_code": err.exit_code(),
            });
            output::print(&output::line(&value.to_string()))?;
            return Err(err);
        }
        Err(err) => return Err(err),
    };
    if args.json {
        let value = json!({
            "request_id": reply.request_id,
            "success": reply.success,
            "output": reply.output,
            "error": reply.error,
            "trace_id": reply.trace_id,
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

/// Connects, finds the process and runs the task.
async fn ask(args: &ExecArgs) -> Result<hivekernel_proto::v1::ExecuteTaskResponse, CliError> {
    let mut session = Session::connect(&args.client).await?;
    let mut request = Request::new(ExecuteTaskRequest {
        pid: session.pid(&args.pid).await?,
        description: args.text.clone(),
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
        .map_err(|status| session.error(status))?;
    Ok(reply.into_inner())
}

/// Sends a fire-and-forget message and prints its id.
pub(super) async fn send(args: SendArgs) -> Result<(), CliError> {
    let mut session = Session::connect(&args.client).await?;
    let request = SendMessageRequest {
        to: session.pid(&args.pid).await?,
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
