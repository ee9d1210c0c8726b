//! The MCP part of a tool list: which servers' tools the agent has, and
//! what those servers offer at the moment of a model call.
//!
//! The tools are asked for before every model call, not once at spawn: a
//! server may start after the agent, restart with other tools, or announce
//! that its list changed, and the model should see what can be called now.
//! The kernel keeps each server's list ready, so asking copies one `Arc`.

use std::fmt::Write as _;

use crate::llm::ToolSchema;
use crate::mcp::{McpSelector, McpTool};
use crate::runtime::ProcessContext;

/// The servers a tool list selects: each wholly, or only some of its tools.
#[derive(Debug, Default)]
pub(super) struct McpSelection {
    /// By server name, in tool-list order; `None`: every tool it offers.
    servers: Vec<(String, Option<Vec<String>>)>,
}

impl McpSelection {
    /// Adds one tool-list entry.
    pub(super) fn add(&mut self, selector: McpSelector) {
        let at = match self.servers.iter().position(|(s, _)| *s == selector.server) {
            Some(at) => at,
            None => {
                self.servers.push((selector.server, Some(Vec::new())));
                self.servers.len() - 1
            }
        };
        let only = &mut self.servers[at].1;
        match (only.as_mut(), selector.tool) {
            (Some(tools), Some(tool)) => tools.push(tool),
            (_, None) => *only = None,
            (None, Some(_)) => {}
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// What the selected servers offer now. A server that cannot answer (not
    /// running, failed for good) is named in `unavailable` and offers nothing.
    pub(super) async fn offered(&self, ctx: &ProcessContext) -> Offered {
        let mut offered = Offered::default();
        // Asked together: one slow server does not add to another's wait.
        let answers = futures::future::join_all(
            self.servers
                .iter()
                .map(|(server, _)| ctx.syscalls.mcp_tools(server)),
        )
        .await;
        for ((server, only), answer) in self.servers.iter().zip(answers) {
            match answer {
                Ok(tools) => {
                    for tool in tools.iter() {
                        if only.as_ref().is_some_and(|only| !only.contains(&tool.name)) {
                            continue;
                        }
                        // Two tools under one name would make the request invalid.
                        if offered.get(&tool.schema.name).is_some() {
                            tracing::warn!(pid = %ctx.pid, %server, tool = %tool.name, "an MCP tool's model-facing name is taken; left out");
                            continue;
                        }
                        offered.tools.push(tool.clone());
                    }
                }
                Err(err) => {
                    tracing::debug!(pid = %ctx.pid, %server, error = %err, "MCP server offers no tools now");
                    offered.unavailable.push((server.clone(), err.message));
                }
            }
        }
        offered
    }
}

/// The MCP tools one model call offers.
#[derive(Debug, Default)]
pub(super) struct Offered {
    pub(super) tools: Vec<McpTool>,
    /// Servers of the selection that offer nothing now, and why.
    pub(super) unavailable: Vec<(String, String)>,
}

impl Offered {
    /// The tool the model calls `name`.
    pub(super) fn get(&self, name: &str) -> Option<&McpTool> {
        self.tools.iter().find(|tool| tool.schema.name == name)
    }

    pub(super) fn schemas(&self) -> impl Iterator<Item = ToolSchema> + '_ {
        self.tools.iter().map(|tool| tool.schema.clone())
    }

    pub(super) fn tokens(&self) -> u64 {
        self.tools.iter().map(|tool| tool.tokens).sum()
    }

    /// Lines for the system prompt's tool section.
    pub(super) fn describe(&self, text: &mut String) {
        for tool in &self.tools {
            let first_line = tool.schema.description.lines().next().unwrap_or("");
            let _ = writeln!(
                text,
                "- {}: {} (tool {} of MCP server {})",
                tool.schema.name,
                crate::text::prefix(first_line, 200),
                tool.name,
                tool.server
            );
        }
        for (server, why) in &self.unavailable {
            let _ = writeln!(
                text,
                "- (MCP server {server} is unavailable now, so its tools are missing: {})",
                crate::text::prefix(why, 200)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn selection(entries: &[&str]) -> McpSelection {
        let mut selection = McpSelection::default();
        for entry in entries {
            selection.add(McpSelector::parse(entry).unwrap().unwrap());
        }
        selection
    }

    #[test]
    fn a_whole_server_wins_over_single_tools_of_it() {
        let s = selection(&["mcp:fs/read", "mcp:git/log", "mcp:fs", "mcp:git/diff"]);
        assert_eq!(
            s.servers,
            [
                ("fs".to_owned(), None),
                (
                    "git".to_owned(),
                    Some(vec!["log".to_owned(), "diff".to_owned()])
                )
            ]
        );
        assert!(selection(&[]).is_empty());
    }
}
