//! `mcp ls`, `mcp tools`, `mcp call`, and `mcp serve` (in `serve`).

mod serve;

use hivekernel_proto::v1::{
    CallMcpToolRequest, ListMcpServersRequest, ListMcpToolsRequest, McpServer, McpTool,
    RestartMcpServerRequest,
};
use serde_json::{Value, json};

use super::client::Session;
use super::{CliError, McpCommand, human, output};

/// Runs one `mcp` subcommand.
pub(super) async fn run(command: McpCommand) -> Result<(), CliError> {
    match command {
        McpCommand::Ls { json, client } => {
            let mut session = Session::connect(&client).await?;
            let servers = session
                .client
                .list_mcp_servers(ListMcpServersRequest {})
                .await
                .map_err(|status| session.error(status))?
                .into_inner()
                .servers;
            if json {
                let all: Vec<Value> = servers.iter().map(server_json).collect();
                output::print(&output::line(&Value::Array(all).to_string()))
            } else if servers.is_empty() {
                output::print("no MCP servers (mcp_servers in the config)\n")
            } else {
                output::print(&servers_table(&servers))
            }
        }
        McpCommand::Tools {
            server,
            json,
            client,
        } => {
            let mut session = Session::connect(&client).await?;
            let tools = session
                .client
                .list_mcp_tools(ListMcpToolsRequest { server })
                .await
                .map_err(|status| session.error(status))?
                .into_inner()
                .tools;
            if json {
                let all: Vec<Value> = tools.iter().map(tool_json).collect();
                output::print(&output::line(&Value::Array(all).to_string()))
            } else {
                output::print(&tools_table(&tools))
            }
        }
        McpCommand::Call {
            server,
            tool,
            args,
            json,
            client,
        } => {
            let mut session = Session::connect(&client).await?;
            let answer = session
                .client
                .call_mcp_tool(CallMcpToolRequest {
                    server,
                    tool,
                    arguments_json: args,
                })
                .await
                .map_err(|status| session.error(status))?
                .into_inner();
            if json {
                let text = json!({ "text": answer.text, "is_error": answer.is_error });
                return output::print(&output::line(&text.to_string()));
            }
            if answer.is_error {
                return Err(CliError::Refused(format!(
                    "the tool failed: {}",
                    answer.text
                )));
            }
            output::print(&output::line(&answer.text))
        }
        McpCommand::Restart {
            server,
            json,
            client,
        } => {
            let mut session = Session::connect(&client).await?;
            let answer = session
                .client
                .restart_mcp_server(RestartMcpServerRequest { server })
                .await
                .map_err(|status| session.error(status))?
                .into_inner();
            let text = if json {
                server_json(&answer).to_string()
            } else {
                format!(
                    "restarted {}: {}, {} tools (restart {})",
                    answer.name, answer.state, answer.tools, answer.restarts
                )
            };
            output::print(&output::line(&text))
        }
        McpCommand::Serve {
            http,
            allow_origin,
            client,
        } => serve::run(http, allow_origin, client).await,
    }
}

/// NAME STATE TRANSPORT TOOLS RESTARTS SINCE TARGET, then each failed
/// server's last error on a line of its own.
fn servers_table(servers: &[McpServer]) -> String {
    let now = human::now_ms();
    let mut rows = vec![
        [
            "NAME",
            "STATE",
            "TRANSPORT",
            "TOOLS",
            "RESTARTS",
            "SINCE",
            "TARGET",
        ]
        .map(str::to_owned),
    ];
    for server in servers {
        let tools = if server.left_out > 0 {
            format!("{} (+{} left out)", server.tools, server.left_out)
        } else {
            server.tools.to_string()
        };
        rows.push([
            server.name.clone(),
            server.state.clone(),
            server.transport.clone(),
            tools,
            server.restarts.to_string(),
            format!("{} ago", human::age(server.since_unix_ms, now)),
            server.target.clone(),
        ]);
    }
    let mut text = output::aligned(&rows);
    for server in servers.iter().filter(|s| !s.last_error.is_empty()) {
        text.push_str(&format!(
            "{}: last error: {}\n",
            server.name, server.last_error
        ));
    }
    text
}

/// TOOL MODEL-NAME DESCRIPTION (first line, cut), then the tools left out.
fn tools_table(tools: &[McpTool]) -> String {
    let mut rows = vec![["TOOL", "MODEL NAME", "DESCRIPTION"].map(str::to_owned)];
    for tool in tools.iter().filter(|t| t.left_out.is_empty()) {
        let first = tool.description.lines().next().unwrap_or("");
        let shown = hivekernel_agents::text::prefix(first, 72);
        let description = if shown.len() < first.len() {
            format!("{shown}…")
        } else {
            shown.to_owned()
        };
        rows.push([tool.name.clone(), tool.exposed.clone(), description]);
    }
    let mut text = output::aligned(&rows);
    for tool in tools.iter().filter(|t| !t.left_out.is_empty()) {
        text.push_str(&format!("left out: {}: {}\n", tool.name, tool.left_out));
    }
    text
}

fn server_json(server: &McpServer) -> Value {
    let some_text = |text: &str| (!text.is_empty()).then(|| text.to_owned());
    json!({
        "name": server.name,
        "transport": server.transport,
        "target": server.target,
        "state": server.state,
        "restarts": server.restarts,
        "tools": server.tools,
        "left_out": server.left_out,
        "last_error": some_text(&server.last_error),
        "os_pid": (server.os_pid != 0).then_some(server.os_pid),
        "since_unix_ms": server.since_unix_ms,
        "server": some_text(&server.server),
    })
}

fn tool_json(tool: &McpTool) -> Value {
    let schema: Value = serde_json::from_str(&tool.input_schema).unwrap_or(Value::Null);
    json!({
        "name": tool.name,
        "model_name": (!tool.exposed.is_empty()).then_some(&tool.exposed),
        "description": tool.description,
        "input_schema": schema,
        "left_out": (!tool.left_out.is_empty()).then_some(&tool.left_out),
    })
}
