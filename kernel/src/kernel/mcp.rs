//! MCP tools through the kernel's checks: a process reaches a server's
//! tools only when it holds `mcp_tools` and its tool list selects them
//! (`mcp:<server>` or `mcp:<server>/<tool>`); the admin reaches every one.
//! The servers themselves are the `mcp` subsystem's (crate::mcp).

use std::sync::Arc;

use hivekernel_agents::{Capability, McpOutput, McpSelector, McpTools};

use crate::error::{KernelError, Result};
use crate::kernel::{Caller, Kernel};
use crate::mcp::{Report, ServerInfo};

/// One tool of a server as `mcp tools` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct McpToolInfo {
    /// Its name on the server.
    pub name: String,
    /// The name models see; empty for a tool left out.
    pub exposed: String,
    /// Its description, as the server gave it.
    pub description: String,
    /// Its input schema, as JSON.
    pub input_schema: String,
    /// Why agents are not offered it; `None` when they are.
    pub left_out: Option<String>,
}

/// The MCP servers through the kernel ([`Kernel::mcp`]): their state and tools,
/// restarts, and calls as the caller may.
#[derive(Debug, Clone, Copy)]
pub struct McpHandle<'k> {
    kernel: &'k Kernel,
}

impl Kernel {
    /// The kernel's MCP servers.
    pub fn mcp(&self) -> McpHandle<'_> {
        McpHandle { kernel: self }
    }
}

impl McpHandle<'_> {
    /// Starts the supervisors of the enabled MCP servers; they stop with
    /// the kernel's shutdown token, after its processes.
    pub(super) fn start(self) {
        let weak = self.kernel.downgrade();
        let report: Report = Arc::new(move |pid, kind| {
            if let Some(inner) = weak.upgrade() {
                inner.events().emit(pid, kind);
            }
        });
        self.kernel.inner.mcp().start(
            self.kernel.inner.tracker(),
            self.kernel.inner.shutdown(),
            &report,
        );
    }

    /// Restarts MCP server `name` now (admin only): a ready server is
    /// closed and started again, a restarting one skips its backoff, one
    /// that failed for good starts again with its intensity window cleared.
    /// Not counted against its intensity. Answers once the new start is
    /// ready (waiting up to its startup timeout), with its state.
    pub async fn restart_server(self, caller: Caller, name: &str) -> Result<ServerInfo> {
        if caller.scope() < crate::caller::Scope::Admin {
            return Err(KernelError::PermissionDenied(
                "only the admin scope may restart an MCP server".into(),
            ));
        }
        self.kernel.check_running()?;
        self.kernel.inner.mcp().restart(name).await
    }

    /// Every configured MCP server and its state.
    pub fn servers(self) -> Vec<ServerInfo> {
        self.kernel.inner.mcp().infos()
    }

    /// The tools MCP server `name` lists, those offered to agents first.
    pub fn server_tools(self, name: &str) -> Result<Vec<McpToolInfo>> {
        let catalog = self.kernel.inner.mcp().catalog(name)?;
        let offered = catalog.tools.iter().map(|tool| McpToolInfo {
            name: tool.name.clone(),
            exposed: tool.schema.name.clone(),
            description: tool.schema.description.clone(),
            input_schema: tool.schema.parameters.to_string(),
            left_out: None,
        });
        let left_out = catalog.left_out.iter().map(|(name, why)| McpToolInfo {
            name: name.clone(),
            exposed: String::new(),
            description: String::new(),
            input_schema: String::new(),
            left_out: Some(why.clone()),
        });
        Ok(offered.chain(left_out).collect())
    }

    /// Checks the MCP entries of a spawn's tool list: well formed, a
    /// configured server, and a tool it offers when its tools are known
    /// (a server still starting is checked at each call instead).
    pub(crate) fn check_tools(self, tools: &[String]) -> Result<()> {
        for entry in tools {
            let Some(selector) = McpSelector::parse(entry) else {
                continue;
            };
            let selector = selector.map_err(KernelError::InvalidArgument)?;
            self.kernel.inner.mcp().check(&selector)?;
        }
        Ok(())
    }

    /// The tools of `server` for `caller`'s turn: what the server offers now
    /// (waiting while it starts, up to its startup timeout).
    pub async fn tools(self, caller: Caller, server: &str) -> Result<McpTools> {
        let granted = self.grant(caller, server, None);
        self.kernel.report_denial(caller, "mcp_tools", granted)?;
        self.kernel.inner.mcp().tools(server).await
    }

    /// Calls `tool` of `server` for `caller`, within the server's deadline.
    pub async fn call(
        self,
        caller: Caller,
        server: &str,
        tool: &str,
        arguments: serde_json::Map<String, serde_json::Value>,
    ) -> Result<McpOutput> {
        self.kernel.check_running()?;
        let granted = self.grant(caller, server, Some(tool));
        self.kernel.report_denial(caller, "mcp_call", granted)?;
        if let Caller::Process(pid) = caller {
            let proc = self
                .kernel
                .inner
                .table()
                .read()
                .get(pid)
                .map(|e| e.proc.clone());
            if let Some(proc) = proc {
                self.kernel.node().still_acting(&proc).await?;
                self.kernel.check_running()?;
                self.kernel.hand_over_turn(pid).await?;
            }
        }
        self.kernel.inner.mcp().call(server, tool, arguments).await
    }

    /// Refuses a process that lacks `mcp_tools`, or whose tool list selects
    /// nothing of `server` (with `tool`: not that tool).
    fn grant(self, caller: Caller, server: &str, tool: Option<&str>) -> Result<()> {
        let Caller::Process(pid) = caller else {
            return Ok(());
        };
        self.kernel
            .require(caller, Capability::McpTools, "use MCP tools")?;
        let tools = {
            let table = self.kernel.inner.table().read();
            let Some(entry) = table.get(pid) else {
                return Err(KernelError::NotFound(pid));
            };
            entry.proc.ctx.tools.clone()
        };
        let selected = tools
            .iter()
            .filter_map(|entry| McpSelector::parse(entry)?.ok())
            .any(|selector| match tool {
                Some(tool) => selector.selects(server, tool),
                None => selector.server == server,
            });
        if selected {
            return Ok(());
        }
        let wanted = match tool {
            Some(tool) => format!("mcp:{server}/{tool}"),
            None => format!("mcp:{server}"),
        };
        Err(KernelError::PermissionDenied(format!(
            "process {pid} was not given {} (its tool list has no entry selecting it)",
            crate::error::shown(&wanted)
        )))
    }
}
