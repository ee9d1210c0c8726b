//! The texts a `tool_agent` sends: its system prompt and its inputs.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use serde::Deserialize;

use super::AgentSettings;
use super::mcp::Offered;
use super::skills::Shelf;
use crate::message::{Message, Task, kinds};
use crate::runtime::ProcessContext;
use crate::tools::Tool;

/// What a system prompt holds besides the agent's own prompt, identity
/// and built-in tools, as of one model call.
pub(super) struct Sections<'a> {
    pub(super) mcp: &'a Offered,
    /// `None`: the tool list selects no skills.
    pub(super) skills: Option<&'a Shelf>,
    /// The budget lines, when the prompt carries them.
    pub(super) budget: Option<&'a str>,
}

/// The agent's prompt, then who it is, the tools it has, its skills and
/// its budget (last: the part that changes most often).
pub(super) fn system_prompt(
    ctx: &ProcessContext,
    tools: &BTreeMap<String, Arc<dyn Tool>>,
    sections: &Sections<'_>,
    settings: &AgentSettings,
) -> String {
    let Sections {
        mcp,
        skills,
        budget,
    } = *sections;
    let mut text = ctx.system_prompt.trim_end().to_owned();
    if !text.is_empty() {
        text.push_str("\n\n");
    }
    let model = if ctx.model.is_empty() {
        "(provider default)"
    } else {
        &ctx.model
    };
    // Writing to a String cannot fail.
    let _ = write!(
        text,
        "## Identity\n- Name: {}\n- PID: {}\n- Role: {}\n- Tier: {}\n- Model: {model} (via {})\n",
        ctx.name, ctx.pid, ctx.role, ctx.tier, settings.provider
    );
    text.push_str("\n## Tools\n");
    let skill_tools = skills.map(Shelf::schemas).unwrap_or_default();
    if tools.is_empty() && mcp.is_empty() && skill_tools.is_empty() {
        text.push_str("You have no tools: answer directly.\n");
    } else {
        for (name, tool) in tools {
            let _ = writeln!(text, "- {name}: {}", tool.description());
        }
        mcp.describe(&mut text);
        for tool in skill_tools {
            let _ = writeln!(text, "- {}: {}", tool.name, tool.description);
        }
    }
    if let Some(skills) = skills {
        skills.describe(&mut text, settings.skills.catalogue_tokens);
    }
    if let Some(budget) = budget {
        text.push_str("\n## Budget\n");
        text.push_str(budget);
    }
    text
}

/// A task as the model reads it: the description, then its parameters.
pub(super) fn task_input(task: &Task) -> String {
    let mut text = task.description.clone();
    if !task.params.is_empty() {
        text.push_str("\n\nParameters:");
        for (key, value) in &task.params {
            let _ = write!(text, "\n{key}: {value}");
        }
    }
    text
}

/// The payload of a `task_response`, as the kernel writes it.
#[derive(Debug, Deserialize)]
struct TaskResponse {
    success: bool,
    #[serde(default)]
    output: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

/// A message as the model reads it.
pub(super) fn message_input(message: &Message) -> String {
    if message.kind == kinds::TASK_RESPONSE {
        let request = message
            .request_id
            .map_or_else(|| "?".to_owned(), |id| id.to_string());
        return match serde_json::from_str::<TaskResponse>(&message.payload) {
            Ok(TaskResponse {
                success: true,
                output,
                ..
            }) => format!(
                "Result of delegated request {request} (succeeded, from process {}):\n{}",
                message.from,
                output.unwrap_or_default()
            ),
            Ok(TaskResponse { error, .. }) => format!(
                "Result of delegated request {request} (failed, from process {}):\n{}",
                message.from,
                error.unwrap_or_default()
            ),
            Err(_) => format!(
                "Result of delegated request {request} (from process {}):\n{}",
                message.from, message.payload
            ),
        };
    }
    let kind = if message.kind == kinds::MESSAGE {
        String::new()
    } else {
        format!(" ({})", message.kind)
    };
    format!(
        "Message from process {}{kind}:\n{}",
        message.from, message.payload
    )
}
