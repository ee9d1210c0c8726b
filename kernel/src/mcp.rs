//! MCP servers as kernel resources: started with the kernel, supervised
//! like processes (restart policy, intensity, backoff, a process group
//! ended on shutdown), their tools offered to the agents whose tool lists
//! select them, every call bounded by the server's deadline.
//!
//! Not a PID in the tree: a server belongs to the kernel, and agents reach
//! its tools through the kernel's checks (the facade's kernel/mcp.rs).
//!
//! Layout: `server` (one server's state and supervisor task), `connect`
//! (stdio and streamable HTTP connections, the handshake, stopping),
//! `catalog` (tool names a model accepts, tool lists, results as text).
//! The servers are fixed at start: a config reload reports a changed
//! `mcp_servers` as needing a kernel restart.

mod catalog;
mod connect;
mod server;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use hivekernel_agents::{McpOutput, McpSelector, McpTools};
use rmcp::model::CallToolRequestParams;
use rmcp::service::ServiceError;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub(crate) use catalog::Catalog;
pub(crate) use server::Report;
pub use server::ServerInfo;
use server::{Server, Unready};

use crate::config::McpServerSpec;
use crate::error::{KernelError, Result};

/// The kernel's MCP servers, by name.
#[derive(Debug, Default)]
pub(crate) struct McpServers {
    servers: BTreeMap<Arc<str>, Arc<Server>>,
    /// Where stdio servers' stderr logs go (`<data_dir>/logs`); `None`: dropped.
    logs: Option<PathBuf>,
}

impl McpServers {
    pub(crate) fn new(specs: Vec<McpServerSpec>, logs: Option<PathBuf>) -> McpServers {
        let servers = specs
            .into_iter()
            .map(|spec| {
                let server = Arc::new(Server::new(spec));
                (server.name.clone(), server)
            })
            .collect();
        McpServers { servers, logs }
    }

    /// Starts a supervisor task, owned by `tracker`, for each enabled
    /// server; each ends its server and itself when `stop` is cancelled.
    pub(crate) fn start(&self, tracker: &TaskTracker, stop: &CancellationToken, report: &Report) {
        if self.servers.is_empty() {
            return;
        }
        crate::tls::install_provider();
        for server in self.servers.values().filter(|s| s.spec.enabled) {
            tracker.spawn(server.clone().supervise(
                stop.clone(),
                self.logs.clone(),
                report.clone(),
            ));
        }
    }

    /// Every server, by name.
    pub(crate) fn infos(&self) -> Vec<ServerInfo> {
        self.servers.values().map(|server| server.info()).collect()
    }

    fn get(&self, name: &str) -> Result<&Arc<Server>> {
        self.servers.get(name).ok_or_else(|| {
            KernelError::NoSuchMcpServer(format!(
                "unknown MCP server {} ({})",
                crate::error::shown(name),
                self.known()
            ))
        })
    }

    fn known(&self) -> String {
        if self.servers.is_empty() {
            "this kernel has no mcp_servers".to_owned()
        } else {
            let names: Vec<&str> = self.servers.keys().map(|name| &**name).collect();
            format!("known: {}", names.join(", "))
        }
    }

    /// Restarts `name` now (see [`Server::restart`]) and says how it stands.
    pub(crate) async fn restart(&self, name: &str) -> Result<ServerInfo> {
        let server = self.get(name)?;
        server.restart().await.map_err(unready)?;
        Ok(server.info())
    }

    /// The tool list of `name` as it stands, without waiting.
    pub(crate) fn catalog(&self, name: &str) -> Result<Catalog> {
        Ok(self.get(name)?.catalog())
    }

    /// The tools `name` offers; waits while it starts, up to its startup timeout.
    pub(crate) async fn tools(&self, name: &str) -> Result<McpTools> {
        let server = self.get(name)?;
        let (_, tools) = server
            .ready(server.spec.startup_timeout, false)
            .await
            .map_err(unready)?;
        Ok(tools)
    }

    /// Calls `tool` of `server` with `arguments`, within the server's
    /// deadline (waiting for a starting or restarting stdio server counts
    /// against it). A tool
    /// that failed, or that the server refused as a request (an unknown
    /// tool, arguments its schema rejects), answers `is_error` for the
    /// model; a server that cannot be reached or does not answer is an error.
    pub(crate) async fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: serde_json::Map<String, serde_json::Value>,
    ) -> Result<McpOutput> {
        let server = self.get(server)?;
        let deadline = tokio::time::Instant::now() + server.spec.call_timeout;
        let (peer, tools) = server
            .ready(server.spec.call_timeout, true)
            .await
            .map_err(unready)?;
        if !tools.iter().any(|offered| offered.name == tool) {
            return Err(KernelError::InvalidArgument(format!(
                "MCP server {} offers no tool {} ({})",
                server.name,
                crate::error::shown(tool),
                tool_names(&tools)
            )));
        }
        let mut params = CallToolRequestParams::new(tool.to_owned());
        params.arguments = Some(arguments);
        match tokio::time::timeout_at(deadline, peer.call_tool(params)).await {
            Ok(Ok(result)) => Ok(catalog::output(result)),
            Ok(Err(ServiceError::McpError(error))) => Ok(McpOutput {
                text: format!(
                    "MCP server {} refused the call: {}",
                    server.name, error.message
                ),
                is_error: true,
            }),
            Ok(Err(err)) => {
                server.suspect();
                Err(KernelError::McpUnavailable(server.redact(format!(
                    "MCP server {} lost the call to {tool}: {err}",
                    server.name
                ))))
            }
            Err(_) => {
                server.suspect();
                Err(KernelError::DeadlineExceeded(format!(
                    "MCP server {} did not answer the call to {tool} within {} s (timeout_seconds)",
                    server.name,
                    server.spec.call_timeout.as_secs()
                )))
            }
        }
    }

    /// Checks a tool-list entry at spawn: the server exists, and when its
    /// tools are known, a one-tool entry names one of them.
    pub(crate) fn check(&self, selector: &McpSelector) -> Result<()> {
        let server = self
            .get(&selector.server)
            .map_err(|err| KernelError::InvalidArgument(format!("tool {selector}: {err}")))?;
        let Some(tool) = &selector.tool else {
            return Ok(());
        };
        let catalog = server.catalog();
        let known = !catalog.tools.is_empty() || !catalog.left_out.is_empty();
        if known && !catalog.tools.iter().any(|offered| offered.name == *tool) {
            let why = catalog
                .left_out
                .iter()
                .find(|(name, _)| name == tool)
                .map_or_else(
                    || "it offers no such tool".to_owned(),
                    |(_, why)| format!("that tool is left out: {why}"),
                );
            return Err(KernelError::InvalidArgument(format!(
                "tool {selector}: {why} ({})",
                tool_names(&catalog.tools)
            )));
        }
        Ok(())
    }
}

fn unready(err: Unready) -> KernelError {
    match err {
        Unready::Down(why) => KernelError::FailedPrecondition(why),
        Unready::NotYet(why) => KernelError::McpUnavailable(why),
    }
}

/// `its tools: a, b, c`, at most 30 of them.
fn tool_names(tools: &McpTools) -> String {
    if tools.is_empty() {
        return "it offers no tools now".into();
    }
    let names: Vec<&str> = tools.iter().take(30).map(|t| t.name.as_str()).collect();
    let more = tools.len().saturating_sub(names.len());
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!("its tools: {}{more}", names.join(", "))
}
