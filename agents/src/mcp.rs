//! Tools of MCP (Model Context Protocol) servers, as a process sees them.
//!
//! The kernel runs and supervises the servers; a process reaches their tools
//! through [`Syscalls::mcp_tools`](crate::Syscalls::mcp_tools) and
//! [`Syscalls::mcp_call`](crate::Syscalls::mcp_call), and only those its
//! tool list selects with an [`McpSelector`] entry: `mcp:<server>` for all of
//! a server's tools, `mcp:<server>/<tool>` for one.

use std::fmt;
use std::sync::Arc;

use crate::llm::ToolSchema;

/// What starts an MCP entry in a tool list.
pub const PREFIX: &str = "mcp:";

/// Longest server name, in bytes.
pub const MAX_SERVER_NAME: usize = 64;

/// Longest tool name in a selector, in bytes (MCP names are at most 128).
pub const MAX_TOOL_NAME: usize = 128;

/// A tool-list entry selecting MCP tools.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct McpSelector {
    /// The server, as `mcp_servers` names it.
    pub server: String,
    /// One tool of it, as the server names it; `None`: every tool it offers.
    pub tool: Option<String>,
}

impl McpSelector {
    /// The selector `entry` spells; `None` when `entry` is no MCP entry (it
    /// does not start with `mcp:`), `Some(Err)` naming the problem when it
    /// is one but malformed.
    pub fn parse(entry: &str) -> Option<Result<McpSelector, String>> {
        let rest = entry.strip_prefix(PREFIX)?;
        let (server, tool) = match rest.split_once('/') {
            Some((server, tool)) => (server, Some(tool)),
            None => (rest, None),
        };
        Some(Self::checked(entry, server, tool))
    }

    fn checked(entry: &str, server: &str, tool: Option<&str>) -> Result<McpSelector, String> {
        check_server_name(server).map_err(|why| format!("{entry:?}: {why}"))?;
        if let Some(tool) = tool {
            if tool.is_empty() || tool.len() > MAX_TOOL_NAME {
                return Err(format!(
                    "{entry:?}: the tool name after the \"/\" must be 1 to {MAX_TOOL_NAME} bytes"
                ));
            }
            if tool.chars().any(char::is_control) {
                return Err(format!(
                    "{entry:?}: the tool name must not hold control characters"
                ));
            }
        }
        Ok(McpSelector {
            server: server.to_owned(),
            tool: tool.map(str::to_owned),
        })
    }

    /// Whether this entry selects `tool` of `server`.
    pub fn selects(&self, server: &str, tool: &str) -> bool {
        self.server == server && self.tool.as_deref().is_none_or(|only| only == tool)
    }

    /// Whether every tool `other` selects is selected by this entry too
    /// (a child may get `mcp:fs/read_file` from a parent holding `mcp:fs`).
    pub fn covers(&self, other: &McpSelector) -> bool {
        self.server == other.server
            && match (&self.tool, &other.tool) {
                (None, _) => true,
                (Some(mine), Some(theirs)) => mine == theirs,
                (Some(_), None) => false,
            }
    }
}

impl fmt::Display for McpSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.tool {
            Some(tool) => write!(f, "{PREFIX}{}/{tool}", self.server),
            None => write!(f, "{PREFIX}{}", self.server),
        }
    }
}

/// The rule for an MCP server's name: 1 to 64 bytes of ASCII letters,
/// digits, `_` and `-`, so it fits in a tool name a model accepts.
pub fn check_server_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_SERVER_NAME {
        return Err(format!(
            "an MCP server name must be 1 to {MAX_SERVER_NAME} bytes, got {} bytes",
            name.len()
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return Err(format!(
            "an MCP server name may hold only ASCII letters, digits, '_' and '-', not {bad:?}"
        ));
    }
    Ok(())
}

/// One tool of an MCP server, as the model is offered it.
#[derive(Debug, Clone, PartialEq)]
pub struct McpTool {
    /// The server it belongs to.
    pub server: Arc<str>,
    /// Its name on the server (what a selector and a call name).
    pub name: String,
    /// What the model sees: a name unique among every tool the kernel offers,
    /// at most 64 bytes; the server's description and input schema.
    pub schema: ToolSchema,
    /// Estimated tokens the schema takes in every request that offers it.
    pub tokens: u64,
    /// Bytes the schema takes in such a request ([`ToolSchema::definition_bytes`]).
    pub bytes: usize,
}

/// The tools a server offers now, after its `tools.include`/`exclude`
/// filters; shared, so handing it to every turn copies nothing.
pub type McpTools = Arc<[McpTool]>;

/// What an MCP tool answered, as text for the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpOutput {
    /// The content: text as given, other kinds described in a line each,
    /// structured content as JSON when there is no text.
    pub text: String,
    /// The server said the call failed (`isError`); `text` says why.
    pub is_error: bool,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn selectors_parse_what_a_tool_list_writes() {
        assert_eq!(McpSelector::parse("read_file"), None);
        let all = McpSelector::parse("mcp:fs").unwrap().unwrap();
        assert_eq!((all.server.as_str(), all.tool.as_deref()), ("fs", None));
        let one = McpSelector::parse("mcp:fs/read_text_file")
            .unwrap()
            .unwrap();
        assert_eq!(one.tool.as_deref(), Some("read_text_file"));
        assert_eq!(one.to_string(), "mcp:fs/read_text_file");
        for bad in ["mcp:", "mcp:/x", "mcp:fs/", "mcp:f s", "mcp:fs/a\nb"] {
            let err = McpSelector::parse(bad).unwrap().unwrap_err();
            assert!(err.starts_with(&format!("{bad:?}")), "{err}");
        }
        let long = format!("mcp:{}", "a".repeat(65));
        assert!(McpSelector::parse(&long).unwrap().is_err());
    }

    #[test]
    fn a_whole_server_covers_its_tools_but_not_the_reverse() {
        let all = McpSelector::parse("mcp:fs").unwrap().unwrap();
        let one = McpSelector::parse("mcp:fs/read").unwrap().unwrap();
        let other = McpSelector::parse("mcp:git").unwrap().unwrap();
        assert!(all.covers(&one) && all.covers(&all) && one.covers(&one));
        assert!(!one.covers(&all) && !all.covers(&other));
        assert!(all.selects("fs", "anything") && one.selects("fs", "read"));
        assert!(!one.selects("fs", "write") && !all.selects("git", "read"));
    }
}
