//! The MCP methods: servers and tools out, a tool call in.

use hivekernel_proto::v1 as pb;
use tonic::Status;

use crate::kernel::{Caller, Kernel, McpToolInfo};
use crate::mcp::ServerInfo;

/// Largest `arguments_json` of a `CallMcpTool`.
pub(super) const MAX_ARGUMENTS_BYTES: usize = 1 << 20;

pub(super) fn servers(kernel: &Kernel) -> pb::ListMcpServersResponse {
    pb::ListMcpServersResponse {
        servers: kernel.mcp().servers().into_iter().map(server).collect(),
    }
}

pub(super) async fn restart(
    kernel: &Kernel,
    caller: Caller,
    name: &str,
) -> Result<pb::McpServer, Status> {
    if name.is_empty() {
        return Err(Status::invalid_argument("server must not be empty"));
    }
    Ok(server(kernel.mcp().restart_server(caller, name).await?))
}

fn server(info: ServerInfo) -> pb::McpServer {
    pb::McpServer {
        name: info.name,
        transport: info.transport.to_owned(),
        target: info.target,
        state: info.state.to_owned(),
        restarts: info.restarts,
        tools: u32::try_from(info.tools).unwrap_or(u32::MAX),
        left_out: u32::try_from(info.left_out).unwrap_or(u32::MAX),
        last_error: info.last_error.unwrap_or_default(),
        os_pid: info.os_pid.unwrap_or(0),
        since_unix_ms: info.since_unix_ms,
        server: info.server.unwrap_or_default(),
    }
}

pub(super) fn tools(kernel: &Kernel, server: &str) -> Result<pb::ListMcpToolsResponse, Status> {
    let tools = kernel.mcp().server_tools(server)?;
    Ok(pb::ListMcpToolsResponse {
        tools: tools.into_iter().map(tool).collect(),
    })
}

fn tool(info: McpToolInfo) -> pb::McpTool {
    pb::McpTool {
        name: info.name,
        exposed: info.exposed,
        description: info.description,
        input_schema: info.input_schema,
        left_out: info.left_out.unwrap_or_default(),
    }
}

pub(super) async fn call(
    kernel: &Kernel,
    caller: Caller,
    request: &pb::CallMcpToolRequest,
) -> Result<pb::CallMcpToolResponse, Status> {
    if request.server.is_empty() || request.tool.is_empty() {
        return Err(Status::invalid_argument(
            "server and tool must not be empty",
        ));
    }
    if request.arguments_json.len() > MAX_ARGUMENTS_BYTES {
        return Err(Status::invalid_argument(format!(
            "arguments_json is {} bytes, more than the {MAX_ARGUMENTS_BYTES} allowed",
            request.arguments_json.len()
        )));
    }
    let arguments = if request.arguments_json.trim().is_empty() {
        serde_json::Map::new()
    } else {
        match serde_json::from_str::<serde_json::Value>(&request.arguments_json) {
            Ok(serde_json::Value::Object(map)) => map,
            Ok(_) => {
                return Err(Status::invalid_argument(
                    "arguments_json must be a JSON object",
                ));
            }
            Err(err) => {
                return Err(Status::invalid_argument(format!(
                    "arguments_json is not valid JSON: {err}"
                )));
            }
        }
    };
    let output = kernel
        .mcp()
        .call(caller, &request.server, &request.tool, arguments)
        .await?;
    Ok(pb::CallMcpToolResponse {
        text: output.text,
        is_error: output.is_error,
    })
}
