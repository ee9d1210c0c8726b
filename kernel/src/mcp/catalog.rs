//! What a server's answers become for the model: its tool list as tools
//! with names a model accepts, and a tool's result as text.
//!
//! # Names
//! A tool is offered as `mcp__<server>__<tool>`. Models accept
//! `[A-Za-z0-9_-]{1,64}`; a server name is already within that alphabet
//! (the config's rule), a tool name may not be. When the plain form would
//! be ambiguous or invalid — the tool name needs characters replaced, the
//! server name holds `__` (so the split point is unclear), or the result
//! is longer than 64 bytes — the name is cut to fit and ends in `_` and
//! eight hex digits of a hash of the server and tool names. No built-in tool
//! starts with `mcp__`, so an MCP tool never shadows one, and two tools
//! share a name only if their hashes collide, which is checked: a second
//! tool under a name already taken is left out, with the reason.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::Arc;

use hivekernel_agents::llm::{ChatRequest, ToolSchema, estimate_request_tokens};
use hivekernel_agents::{McpOutput, McpTool};
use rmcp::model::{CallToolResult, ContentBlock, ResourceContents, Tool};

use crate::config::McpToolFilter;

/// Longest name a model accepts for a tool.
pub(crate) const MAX_EXPOSED: usize = 64;

/// What starts every exposed name.
const EXPOSED_PREFIX: &str = "mcp__";

/// The name the model sees for `tool` of `server`.
pub(crate) fn exposed_name(server: &str, tool: &str) -> String {
    let clean: String = tool
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let plain = format!("{EXPOSED_PREFIX}{server}__{clean}");
    // With no `__` in the server name and none at its end, the first `__`
    // after the prefix is always the separator, so plain names are unique.
    if clean == tool
        && !server.contains("__")
        && !server.ends_with('_')
        && !tool.is_empty()
        && plain.len() <= MAX_EXPOSED
    {
        return plain;
    }
    let suffix = format!("_{:08x}", fnv1a(server, tool) as u32);
    let keep = MAX_EXPOSED - suffix.len();
    let mut name = plain;
    // ASCII only by now, so any cut is on a character boundary.
    name.truncate(keep);
    name.push_str(&suffix);
    name
}

/// FNV-1a over the server name, a separator and the tool name: stable
/// across runs and builds, so a tool keeps its name in transcripts.
fn fnv1a(server: &str, tool: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in server.bytes().chain([0]).chain(tool.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// A server's tool list, as offered to agents.
#[derive(Debug, Clone, Default)]
pub(crate) struct Catalog {
    /// The tools agents may be given: filtered, named, schemas checked.
    pub(crate) tools: hivekernel_agents::McpTools,
    /// Tools the server lists that agents are not offered, and why
    /// (`tools.exclude`, an unusable schema, a name taken).
    pub(crate) left_out: Vec<(String, String)>,
}

impl Catalog {
    /// Whether the tools offered differ from `other`'s (by name and schema).
    pub(crate) fn differs(&self, other: &Catalog) -> bool {
        self.tools.len() != other.tools.len()
            || self
                .tools
                .iter()
                .zip(other.tools.iter())
                .any(|(a, b)| a.name != b.name || a.schema != b.schema)
    }

    /// The catalog of `listed`, the server's `tools/list` answer.
    pub(crate) fn new(server: &Arc<str>, listed: Vec<Tool>, filter: &McpToolFilter) -> Catalog {
        let mut tools = Vec::with_capacity(listed.len());
        let mut left_out = Vec::new();
        let mut taken = HashSet::new();
        for tool in listed {
            let name = tool.name.to_string();
            if name.is_empty()
                || name.len() > hivekernel_agents::mcp::MAX_TOOL_NAME
                || name.chars().any(char::is_control)
            {
                let shown = crate::error::shown(&name);
                left_out.push((
                    shown,
                    "its name is empty, longer than 128 bytes or holds control characters".into(),
                ));
                continue;
            }
            if !filter.allows(&name) {
                left_out.push((name, "not selected by tools.include/tools.exclude".into()));
                continue;
            }
            if let Err(why) = usable_schema(&tool) {
                left_out.push((name, why));
                continue;
            }
            let exposed = exposed_name(server, &name);
            if !taken.insert(exposed.clone()) {
                left_out.push((
                    name,
                    format!("its model-facing name {exposed} is taken by another tool"),
                ));
                continue;
            }
            let schema = ToolSchema {
                name: exposed,
                description: tool
                    .description
                    .as_deref()
                    .or(tool.title.as_deref())
                    .unwrap_or("")
                    .to_owned(),
                parameters: serde_json::Value::Object((*tool.input_schema).clone()),
            };
            let tokens = estimate_request_tokens(&ChatRequest {
                tools: vec![schema.clone()],
                ..ChatRequest::new("", Vec::new())
            });
            tools.push(McpTool {
                server: server.clone(),
                name,
                bytes: schema.definition_bytes(),
                schema,
                tokens,
            });
        }
        Catalog {
            tools: tools.into(),
            left_out,
        }
    }
}

/// A model takes a tool's arguments as a JSON object, so its input schema
/// must describe one.
fn usable_schema(tool: &Tool) -> Result<(), String> {
    match tool.input_schema.get("type") {
        Some(serde_json::Value::String(kind)) if kind == "object" => Ok(()),
        Some(other) => Err(format!(
            "its input schema has type {}, and a model can only pass an object",
            hivekernel_agents::text::prefix(&other.to_string(), 64)
        )),
        None => Err("its input schema has no \"type\": \"object\"".into()),
    }
}

/// A tool's result as text for the model: text content as it came, any
/// other content described in a line, the structured content as JSON when
/// there is no text (a server that sends both puts the same in the text).
pub(crate) fn output(result: CallToolResult) -> McpOutput {
    let mut text = String::new();
    let mut has_text = false;
    for block in &result.content {
        if !text.is_empty() {
            text.push('\n');
        }
        match block {
            ContentBlock::Text(content) => {
                has_text = true;
                text.push_str(&content.text);
            }
            ContentBlock::Image(image) => {
                let _ = write!(
                    text,
                    "[image: {}, {} bytes]",
                    image.mime_type,
                    base64_len(&image.data)
                );
            }
            ContentBlock::Audio(audio) => {
                let _ = write!(
                    text,
                    "[audio: {}, {} bytes]",
                    audio.mime_type,
                    base64_len(&audio.data)
                );
            }
            ContentBlock::Resource(embedded) => match &embedded.resource {
                ResourceContents::TextResourceContents {
                    uri, text: body, ..
                } => {
                    has_text = true;
                    let _ = write!(text, "[resource {uri}]\n{body}");
                }
                ResourceContents::BlobResourceContents {
                    uri,
                    mime_type,
                    blob,
                    ..
                } => {
                    let _ = write!(
                        text,
                        "[resource {uri}: {}, {} bytes]",
                        mime_type.as_deref().unwrap_or("binary"),
                        base64_len(blob)
                    );
                }
                _ => text.push_str("[a resource of a kind this kernel does not know]"),
            },
            ContentBlock::ResourceLink(link) => {
                let _ = write!(text, "[resource link: {} ({})]", link.uri, link.name);
            }
            _ => text.push_str("[content of a kind this kernel does not know]"),
        }
    }
    if !has_text && let Some(structured) = &result.structured_content {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&structured.to_string());
    }
    let is_error = result.is_error.unwrap_or(false);
    if text.is_empty() {
        text = if is_error {
            "the tool failed and said nothing more".into()
        } else {
            "(no content)".into()
        };
    }
    McpOutput { text, is_error }
}

/// Bytes that `data`, base64, decodes to.
fn base64_len(data: &str) -> usize {
    let padding = data.bytes().rev().take_while(|b| *b == b'=').count();
    (data.len() / 4 * 3).saturating_sub(padding)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use rmcp::model::{ContentBlock as Content, JsonObject};

    use super::*;

    fn valid(name: &str) -> bool {
        !name.is_empty()
            && name.len() <= MAX_EXPOSED
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    }

    #[test]
    fn plain_names_stay_readable_and_every_name_is_valid() {
        assert_eq!(exposed_name("fs", "read_file"), "mcp__fs__read_file");
        let odd = exposed_name("fs", "read.file");
        assert!(
            odd.starts_with("mcp__fs__read_file_") && valid(&odd),
            "{odd}"
        );
        assert_ne!(
            odd,
            exposed_name("fs", "read/file"),
            "replaced characters differ by hash"
        );
        let long = exposed_name("a-server-with-a-long-name", &"x".repeat(100));
        assert!(valid(&long) && long.len() == MAX_EXPOSED, "{long}");
        assert_ne!(
            long,
            exposed_name("a-server-with-a-long-name", &"x".repeat(101))
        );
        // `a__b`/`c` and `a`/`b__c` would both be mcp__a__b__c.
        assert_ne!(exposed_name("a__b", "c"), exposed_name("a", "b__c"));
        assert_ne!(exposed_name("a_", "b"), exposed_name("a", "_b"));
        assert!(valid(&exposed_name("s", "")) && valid(&exposed_name("s", "ü")));
        assert_eq!(exposed_name("fs", "read.file"), odd, "stable");
    }

    fn tool(name: &str, schema: serde_json::Value) -> Tool {
        let serde_json::Value::Object(schema) = schema else {
            panic!("schema must be an object")
        };
        Tool::new(
            name.to_owned(),
            "does things",
            Arc::new(schema as JsonObject),
        )
    }

    #[test]
    fn a_catalog_filters_and_refuses_unusable_schemas() {
        let filter = McpToolFilter {
            include: vec![],
            exclude: vec!["secret*".into()],
        };
        let server: Arc<str> = Arc::from("fs");
        let catalog = Catalog::new(
            &server,
            vec![
                tool("read", serde_json::json!({"type": "object"})),
                tool("secret_key", serde_json::json!({"type": "object"})),
                tool("bad", serde_json::json!({"type": "string"})),
                tool("untyped", serde_json::json!({})),
            ],
            &filter,
        );
        let names: Vec<&str> = catalog.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["read"]);
        assert_eq!(catalog.tools[0].schema.name, "mcp__fs__read");
        assert!(catalog.tools[0].tokens > 0);
        let left: Vec<&str> = catalog.left_out.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(left, ["secret_key", "bad", "untyped"]);
        assert!(
            catalog.left_out[1].1.contains("type \"string\""),
            "{:?}",
            catalog.left_out
        );
    }

    #[test]
    fn results_become_text() {
        let text = output(CallToolResult::success(vec![
            Content::text("hello"),
            Content::image("aGVsbG8=", "image/png"),
        ]));
        assert_eq!(text.text, "hello\n[image: image/png, 5 bytes]");
        assert!(!text.is_error);
        let mut structured = CallToolResult::success(vec![]);
        structured.structured_content = Some(serde_json::json!({"sum": 3}));
        assert_eq!(output(structured).text, r#"{"sum":3}"#);
        let failed = output(CallToolResult::error(vec![Content::text("no such file")]));
        assert_eq!(
            (failed.text.as_str(), failed.is_error),
            ("no such file", true)
        );
        let silent = output(CallToolResult::error(vec![]));
        assert!(silent.is_error && !silent.text.is_empty());
    }
}
