//! The `scripted` provider: deterministic and offline, yet it drives the real agent loop.
//!
//! It reads only the request (never a clock, never randomness), so the same
//! request always gets the same answer. It looks at the last message, the
//! system prompt and the tools offered, and applies the first rule that fits:
//!
//! 1. **Tool results.** The last message is a tool result: a final answer
//!    `Done: <first 200 chars of the result>` (the trailing run of tool
//!    results, joined with `; `, when one turn made several calls).
//! 2. **Split a task.** The system prompt or the last user message contains
//!    [`SUBTASKS_MARKER`] (`Return a JSON array of subtasks`): the content is
//!    a JSON array of strings, the parts of the task. The task is the text
//!    after the first line starting with `Task:` (in the last user message,
//!    else in the system prompt) up to the next blank line; without such a
//!    line, the last user message minus lines holding the marker. Parts are
//!    split as in [Splitting](#splitting); a task that does not split is one part.
//! 3. **Synthesize.** The last user message contains [`SYNTHESIZE_MARKER`]
//!    (`Synthesize`): the content is `Summary: ` followed by the results it
//!    lists, joined with `; `. The results are the list items (`- x`, `* x`,
//!    `1. x`, `1) x`) after the last line starting with `Results`; without
//!    such a line, the list items outside the `Task:` block; without list
//!    items, the non-empty lines there that are not the marker line.
//! 4. **Delegate.** The last message is a user message starting with
//!    `delegate:`, the tool `delegate_async` is offered, and a PID follows:
//!    one call `delegate_async` with `{"pid": N, "task": "<rest>"}`, so
//!    `delegate: 5 summarise x` becomes `{"pid": 5, "task": "summarise x"}`.
//!    (This comes before orchestrate: the prefix is the more explicit ask.)
//! 5. **Orchestrate.** The last message is a user message, the tool
//!    `orchestrate` is offered, and the text splits into at least two parts:
//!    one call `orchestrate` with `{"task": "<the whole text>"}`.
//! 6. **Otherwise** a final answer `<name> handled: <last message text>`,
//!    where `<name>` comes from a line `Name: X` (optionally bulleted with
//!    `-` or `*`) in the system prompt, else `agent`.
//!
//! # Splitting
//! A text with at least two list-item lines (`- x`, `* x`, `1. x`, `1) x`)
//! splits into those items (other lines, such as a heading, are dropped).
//! Otherwise it splits on `; ` if that gives at least two non-empty parts,
//! else on ` and `; parts are trimmed.
//!
//! # Ids and usage
//! A tool call's id is `call_<number of messages in the request>`, unique
//! within a growing conversation. Usage is estimated, never zero: prompt
//! tokens by [`estimate_tokens`] over the request's messages, completion
//! tokens as a quarter of the answer's bytes (at least 1).

use std::ops::Range;

use async_trait::async_trait;
use serde_json::json;

use super::{
    ChatMessage, ChatRequest, ChatResponse, ChatRole, LlmError, Provider, ToolCall, Usage, Watch,
    estimate_tokens,
};

/// Asking for a subtask split: a prompt holding this gets a JSON array of strings.
pub const SUBTASKS_MARKER: &str = "Return a JSON array of subtasks";
/// Asking for a synthesis of worker results: a user message holding this gets `Summary: ...`.
pub const SYNTHESIZE_MARKER: &str = "Synthesize";

/// Characters of a tool result quoted in the `Done:` answer.
const DONE_QUOTE_CHARS: usize = 200;

/// The deterministic offline provider; see the [module docs](self) for its rules.
#[derive(Debug, Clone, Copy, Default)]
pub struct ScriptedProvider;

impl ScriptedProvider {
    /// The provider (it has no state).
    pub fn new() -> Self {
        ScriptedProvider
    }

    /// The answer to `request`, computed synchronously.
    pub fn answer(&self, request: &ChatRequest) -> ChatResponse {
        let message = match decide(request) {
            Reply::Text(text) => ChatMessage::assistant(text),
            Reply::Call { name, arguments } => {
                let id = format!("call_{}", request.messages.len());
                ChatMessage::assistant("").with_tool_calls(vec![ToolCall::new(
                    id,
                    name,
                    arguments.to_string(),
                )])
            }
        };
        let finish_reason = if message.tool_calls.is_empty() {
            "stop"
        } else {
            "tool_calls"
        };
        let answer_bytes = message.content.len()
            + message
                .tool_calls
                .iter()
                .map(|call| call.name.len() + call.arguments.len())
                .sum::<usize>();
        let usage = Usage {
            prompt_tokens: estimate_tokens(&request.messages),
            completion_tokens: (answer_bytes as u64).div_ceil(4).max(1),
        };
        ChatResponse {
            message,
            usage,
            finish_reason: Some(finish_reason.into()),
        }
    }
}

#[async_trait]
impl Provider for ScriptedProvider {
    fn name(&self) -> &str {
        "scripted"
    }

    async fn call(
        &self,
        request: &ChatRequest,
        _watch: &dyn Watch,
    ) -> Result<ChatResponse, LlmError> {
        Ok(self.answer(request))
    }
}

enum Reply {
    Text(String),
    Call {
        name: &'static str,
        arguments: serde_json::Value,
    },
}

fn decide(request: &ChatRequest) -> Reply {
    let messages = &request.messages;
    let Some(last) = messages.last() else {
        return Reply::Text(format!("{} handled: ", agent_name(request)));
    };
    if last.role == ChatRole::Tool {
        let mut results: Vec<&str> = messages
            .iter()
            .rev()
            .take_while(|m| m.role == ChatRole::Tool)
            .map(|m| m.content.as_str())
            .collect();
        results.reverse();
        let quoted: String = results.join("; ").chars().take(DONE_QUOTE_CHARS).collect();
        return Reply::Text(format!("Done: {quoted}"));
    }
    let user = (last.role == ChatRole::User).then_some(last.content.as_str());
    let system = system_prompt(request);
    if system.contains(SUBTASKS_MARKER) || user.is_some_and(|text| text.contains(SUBTASKS_MARKER)) {
        let task = user
            .and_then(task_block)
            .or_else(|| task_block(&system))
            .map(|(_, task)| task)
            .unwrap_or_else(|| without_marker_lines(user.unwrap_or_default()));
        let parts = split_task(&task);
        return Reply::Text(serde_json::Value::from(parts).to_string());
    }
    if let Some(text) = user {
        if text.contains(SYNTHESIZE_MARKER) {
            return Reply::Text(synthesize(text));
        }
        if request.offers("delegate_async")
            && let Some((pid, task)) = parse_delegate(text)
        {
            return Reply::Call {
                name: "delegate_async",
                arguments: json!({ "pid": pid, "task": task }),
            };
        }
        if request.offers("orchestrate") && split_task(text).len() >= 2 {
            return Reply::Call {
                name: "orchestrate",
                arguments: json!({ "task": text }),
            };
        }
    }
    Reply::Text(format!("{} handled: {}", agent_name(request), last.content))
}

/// Every system message, one after the other.
fn system_prompt(request: &ChatRequest) -> String {
    let parts: Vec<&str> = request
        .messages
        .iter()
        .filter(|m| m.role == ChatRole::System)
        .map(|m| m.content.as_str())
        .collect();
    parts.join("\n")
}

/// The name from a `Name: X` line of the system prompt, else `agent`.
fn agent_name(request: &ChatRequest) -> String {
    let system = system_prompt(request);
    system
        .lines()
        .filter_map(|line| {
            line.trim_start_matches(|c: char| c == '-' || c == '*' || c.is_whitespace())
                .strip_prefix("Name:")
                .map(str::trim)
        })
        .find(|name| !name.is_empty())
        .unwrap_or("agent")
        .to_owned()
}

/// The `Task:` block of `text`: its range of lines, and its text (the rest of
/// the first `Task:` line and the lines after it, up to the next blank line).
fn task_block(text: &str) -> Option<(Range<usize>, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|line| line.trim_start().starts_with("Task:"))?;
    let following = lines[start + 1..]
        .iter()
        .take_while(|line| !line.trim().is_empty())
        .count();
    let end = start + 1 + following;
    let first = lines[start].trim_start().trim_start_matches("Task:").trim();
    let block: Vec<&str> = std::iter::once(first)
        .chain(lines[start + 1..end].iter().copied())
        .filter(|line| !line.trim().is_empty())
        .collect();
    Some((start..end, block.join("\n")))
}

fn without_marker_lines(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| !line.contains(SUBTASKS_MARKER))
        .collect();
    lines.join("\n")
}

/// The item of a list line (`- x`, `* x`, `1. x`, `1) x`), if it is one.
fn list_item(line: &str) -> Option<&str> {
    let line = line.trim();
    let item = if let Some(rest) = line.strip_prefix("- ").or_else(|| line.strip_prefix("* ")) {
        rest
    } else {
        let digits = line.len() - line.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return None;
        }
        let rest = line[digits..]
            .strip_prefix('.')
            .or_else(|| line[digits..].strip_prefix(')'))?;
        if !rest.starts_with(char::is_whitespace) {
            return None;
        }
        rest
    };
    let item = item.trim();
    (!item.is_empty()).then_some(item)
}

/// The parts of a task; see [Splitting](self#splitting).
fn split_task(text: &str) -> Vec<String> {
    let text = text.trim();
    if text.is_empty() {
        return Vec::new();
    }
    let items: Vec<&str> = text.lines().filter_map(list_item).collect();
    if items.len() >= 2 {
        return items.into_iter().map(str::to_owned).collect();
    }
    for separator in ["; ", " and "] {
        let parts: Vec<String> = text
            .split(separator)
            .map(str::trim)
            .filter(|part| !part.is_empty())
            .map(str::to_owned)
            .collect();
        if parts.len() >= 2 {
            return parts;
        }
    }
    vec![text.to_owned()]
}

/// `Summary: ` and the listed results; see rule 3 in the module docs.
fn synthesize(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let region: Vec<&str> = match lines
        .iter()
        .rposition(|line| line.trim_start().starts_with("Results"))
    {
        Some(header) => lines[header + 1..].to_vec(),
        None => match task_block(text) {
            Some((block, _)) => lines[..block.start]
                .iter()
                .chain(&lines[block.end..])
                .copied()
                .collect(),
            None => lines,
        },
    };
    let mut results: Vec<&str> = region.iter().filter_map(|line| list_item(line)).collect();
    if results.is_empty() {
        results = region
            .iter()
            .map(|line| line.trim())
            .filter(|line| !line.is_empty() && !line.contains(SYNTHESIZE_MARKER))
            .collect();
    }
    if results.is_empty() {
        return "Summary: no results".into();
    }
    format!("Summary: {}", results.join("; "))
}

/// `delegate: PID TASK` as `(PID, TASK)`; `None` unless both are there.
fn parse_delegate(text: &str) -> Option<(u64, String)> {
    let rest = text.trim_start().strip_prefix("delegate:")?.trim_start();
    let (pid, task) = rest.split_once(char::is_whitespace)?;
    let pid: u64 = pid.parse().ok()?;
    let task = task.trim();
    (!task.is_empty()).then(|| (pid, task.to_owned()))
}
