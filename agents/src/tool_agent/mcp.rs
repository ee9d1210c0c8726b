//! The MCP part of a tool list: which servers' tools the agent has, and
//! what those servers offer at the moment of a model call.
//!
//! The tools are asked for before every model call, not once at spawn: a
//! server may start after the agent, restart with other tools, or announce
//! that its list changed, and the model should see what can be called now.
//! The kernel keeps each server's list ready, so asking copies one `Arc`.
//! What a call offers is then cut to the room left for tool definitions
//! (`llm.max_tool_definition_bytes`), and the system prompt names the
//! tools left out, so a server listing megabytes of tools costs neither
//! the request nor the context.

use std::fmt::Write as _;
use std::sync::Arc;

use crate::llm::ToolSchema;
use crate::mcp::{McpSelector, McpTool, PREFIX};
use crate::runtime::ProcessContext;

/// Most bytes of tool names the note on tools left out lists.
const MAX_LEFT_OUT_NAMES: usize = 2048;

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
    /// Tools the servers offer that did not fit the room for tool
    /// definitions, as (server, tool), in tool-list order.
    left_out: Vec<(Arc<str>, String)>,
    /// `llm.max_tool_definition_bytes`, for the note on `left_out`.
    definition_bytes: usize,
}

impl Offered {
    /// Keeps the tools whose definitions fit in `room` bytes together, in
    /// order (a tool too large for what is left is skipped, and a smaller
    /// one after it may still fit); the others are left out. `limit` is
    /// the setting the room comes from, for the note.
    pub(super) fn fit(&mut self, room: usize, limit: usize) {
        let mut used = 0usize;
        let mut kept = Vec::with_capacity(self.tools.len());
        for tool in std::mem::take(&mut self.tools) {
            match used.checked_add(tool.bytes).filter(|total| *total <= room) {
                Some(total) => {
                    used = total;
                    kept.push(tool);
                }
                None => self.left_out.push((tool.server, tool.name)),
            }
        }
        self.tools = kept;
        self.definition_bytes = limit;
    }

    /// Whether there is nothing to tell the model: no tool, no server
    /// unavailable, none left out.
    pub(super) fn is_empty(&self) -> bool {
        self.tools.is_empty() && self.unavailable.is_empty() && self.left_out.is_empty()
    }

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
        if self.left_out.is_empty() {
            return;
        }
        let mut names = String::new();
        let mut named = 0;
        for (server, tool) in &self.left_out {
            let name = format!("{PREFIX}{server}/{}", crate::text::prefix(tool, 128));
            if names.len() + name.len() > MAX_LEFT_OUT_NAMES {
                break;
            }
            if named > 0 {
                names.push_str(", ");
            }
            names.push_str(&name);
            named += 1;
        }
        let more = match self.left_out.len() - named {
            0 => String::new(),
            rest => format!(" and {rest} more"),
        };
        let _ = writeln!(
            text,
            "- ({} MCP tools are left out and cannot be called, as the tool definitions of a \
             request may take at most {} bytes (llm.max_tool_definition_bytes): {names}{more})",
            self.left_out.len(),
            self.definition_bytes
        );
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

    fn tool(server: &str, name: &str, description_bytes: usize) -> McpTool {
        let schema = ToolSchema {
            name: format!("mcp__{server}__{name}"),
            description: "d".repeat(description_bytes),
            parameters: serde_json::json!({ "type": "object" }),
        };
        McpTool {
            server: Arc::from(server),
            name: name.to_owned(),
            bytes: schema.definition_bytes(),
            tokens: 0,
            schema,
        }
    }

    fn names(offered: &Offered) -> Vec<&str> {
        offered.tools.iter().map(|t| t.name.as_str()).collect()
    }

    #[test]
    fn tools_are_kept_while_they_fit_and_the_rest_are_named() {
        let big = tool("fs", "big", 1000);
        let small = tool("fs", "small", 10);
        let room = small.bytes * 2 + 5;
        let mut offered = Offered {
            tools: vec![small.clone(), big, tool("git", "log", 10), small],
            ..Offered::default()
        };
        offered.fit(room, 9999);
        // The big one does not fit; a small one after it still does.
        assert_eq!(names(&offered), ["small", "log"]);
        assert!(offered.tokens() == 0 && !offered.is_empty());
        let mut text = String::new();
        offered.describe(&mut text);
        let note = text.lines().last().unwrap();
        assert_eq!(
            note,
            "- (2 MCP tools are left out and cannot be called, as the tool definitions of a \
             request may take at most 9999 bytes (llm.max_tool_definition_bytes): \
             mcp:fs/big, mcp:fs/small)"
        );
        let mut nothing = Offered {
            tools: vec![tool("fs", "a", 10)],
            ..Offered::default()
        };
        nothing.fit(0, 1);
        assert!(
            nothing.tools.is_empty() && !nothing.is_empty(),
            "the note still goes"
        );
    }

    #[test]
    fn megabytes_of_tools_are_cut_to_the_room_with_a_short_note() {
        // 3.5 MB of tools, as a hostile server might list them.
        let tools: Vec<McpTool> = (0..2000)
            .map(|i| tool("huge", &format!("tool_{i:04}"), 1750))
            .collect();
        let listed: usize = tools.iter().map(|t| t.bytes).sum();
        assert!(listed > 3_500_000);
        let mut offered = Offered {
            tools,
            ..Offered::default()
        };
        let room = 256 << 10;
        offered.fit(room, room);
        let kept: usize = offered.tools.iter().map(|t| t.bytes).sum();
        assert!(kept <= room && kept + 2000 > room, "{kept}");
        assert_eq!(offered.tools[0].name, "tool_0000", "kept in list order");
        let mut text = String::new();
        offered.describe(&mut text);
        let note = text.lines().last().unwrap();
        let left = 2000 - offered.tools.len();
        assert!(
            note.starts_with(&format!("- ({left} MCP tools are left out"))
                && note.contains("(llm.max_tool_definition_bytes): mcp:huge/tool_")
                && note.ends_with(" more)"),
            "{note}"
        );
        assert!(
            note.len() < MAX_LEFT_OUT_NAMES + 300,
            "{} bytes",
            note.len()
        );
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
