//! `exec` and `send`.

use std::time::Duration;

use hivekernel_proto::v1::{
    ExecuteTaskRequest, ExecuteTaskResponse, Priority as PbPriority, SendMessageRequest,
};
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
async fn ask(args: &ExecArgs) -> Result<ExecuteTaskResponse, CliError> {
    let mut session = Session::connect(&args.client).await?;
    let pid = session.pid(&args.pid).await?;
    execute(&mut session, pid, args.text.clone(), args.timeout).await
}

/// Runs `task` on `pid` and waits for its reply; with `timeout`, the task
/// fails after it and the call waits a little longer for the kernel to say so.
pub(super) async fn execute(
    session: &mut Session,
    pid: u64,
    task: String,
    timeout: Option<Duration>,
) -> Result<ExecuteTaskResponse, CliError> {
    let mut request = Request::new(ExecuteTaskRequest {
        pid,
        description: task,
        params: Default::default(),
        timeout_ms: timeout.map_or(0, millis),
    });
    if let Some(timeout) = timeout {
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
    let to = session.pid(&args.pid).await?;
    let id = send_message(
        &mut session,
        to,
        args.text,
        args.kind.unwrap_or_default(),
        args.priority,
        args.ttl_ms.unwrap_or(0),
    )
    .await?;
    output::print(&output::line(&id.to_string()))
}

/// Puts a message from outside the kernel into `to`'s mailbox; its id.
pub(super) async fn send_message(
    session: &mut Session,
    to: u64,
    payload: String,
    kind: String,
    priority: Option<hivekernel_agents::Priority>,
    ttl_ms: u64,
) -> Result<u64, CliError> {
    let request = SendMessageRequest {
        to,
        r#type: kind,
        payload,
        priority: priority.map_or(PbPriority::Unspecified, names::priority_to_proto) as i32,
        ttl_ms,
        from: 0,
    };
    let id = session
        .client
        .send_message(request)
        .await
        .map_err(|status| session.error(status))?
        .into_inner()
        .message_id;
    Ok(id)
}
