//! The provider-neutral conversation: messages, tool calls, requests, responses.

use serde::{Deserialize, Serialize};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatRole {
    /// Instructions that frame the conversation.
    System,
    /// A task or message from outside the agent.
    User,
    /// The model.
    Assistant,
    /// The result of a tool call the model asked for.
    Tool,
}

impl ChatRole {
    /// The role's name on the wire (`system`, `user`, `assistant`, `tool`).
    pub fn as_str(self) -> &'static str {
        match self {
            ChatRole::System => "system",
            ChatRole::User => "user",
            ChatRole::Assistant => "assistant",
            ChatRole::Tool => "tool",
        }
    }
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who wrote it.
    pub role: ChatRole,
    /// Its text; empty for an assistant turn that only calls tools.
    #[serde(default)]
    pub content: String,
    /// Tools the assistant asks to run (assistant messages only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// The call this message answers (tool messages only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// What a reasoning model thought before it answered
    /// (`reasoning_content`); kept for the transcript, never sent back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
}

impl ChatMessage {
    fn new(role: ChatRole, content: impl Into<String>) -> Self {
        ChatMessage {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            reasoning: None,
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new(ChatRole::System, content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new(ChatRole::User, content)
    }

    /// An assistant message with text and no tool calls.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(ChatRole::Assistant, content)
    }

    /// The result of the tool call `id`.
    pub fn tool_result(id: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            tool_call_id: Some(id.into()),
            ..Self::new(ChatRole::Tool, content)
        }
    }

    /// This message with `calls` attached (for an assistant turn that calls tools).
    pub fn with_tool_calls(mut self, calls: Vec<ToolCall>) -> Self {
        self.tool_calls = calls;
        self
    }
}

/// A tool the model asks to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id for this call; the result must name it.
    pub id: String,
    /// The tool's name, as the model wrote it (it may name no known tool).
    pub name: String,
    /// Raw JSON text of the arguments as the model produced it; may be malformed.
    pub arguments: String,
}

impl ToolCall {
    /// A call of `name` with raw JSON `arguments`.
    pub fn new(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> Self {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSchema {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON schema of its arguments object.
    pub parameters: serde_json::Value,
}

impl ToolSchema {
    /// Bytes it takes in a request: its name, its description and its
    /// parameter schema as compact JSON.
    pub fn definition_bytes(&self) -> usize {
        let mut counted = Counted(0);
        // Writing to a counter cannot fail, and a `Value` always serializes.
        let _ = serde_json::to_writer(&mut counted, &self.parameters);
        self.name.len() + self.description.len() + counted.0
    }
}

/// A writer that only counts the bytes written to it.
struct Counted(usize);

impl std::io::Write for Counted {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0 += bytes.len();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One call to a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// Logical model name (e.g. `sonnet`); the provider maps it to its own id.
    pub model: String,
    /// The conversation so far, oldest first.
    pub messages: Vec<ChatMessage>,
    /// Tools the model may call; empty for none.
    #[serde(default)]
    pub tools: Vec<ToolSchema>,
    /// Upper bound on the completion's tokens.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// The model must call one of `tools` (`tool_choice: "required"`):
    /// what `hivekernel llm check` asks to see whether tools work.
    #[serde(default)]
    pub require_tool: bool,
}

impl ChatRequest {
    /// A request for `model` with `messages`, no tools and no token cap.
    pub fn new(model: impl Into<String>, messages: Vec<ChatMessage>) -> Self {
        ChatRequest {
            model: model.into(),
            messages,
            tools: Vec::new(),
            max_tokens: None,
            require_tool: false,
        }
    }

    /// Whether a tool called `name` is offered.
    pub fn offers(&self, name: &str) -> bool {
        self.tools.iter().any(|tool| tool.name == name)
    }
}

/// Tokens a call consumed, as the provider counted them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens of the request.
    pub prompt_tokens: u64,
    /// Tokens of the answer.
    pub completion_tokens: u64,
}

impl Usage {
    /// Prompt plus completion tokens.
    pub fn total(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, other: Usage) {
        self.prompt_tokens = self.prompt_tokens.saturating_add(other.prompt_tokens);
        self.completion_tokens = self
            .completion_tokens
            .saturating_add(other.completion_tokens);
    }
}

/// The model's answer to one [`ChatRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatResponse {
    /// An assistant message: final text, or tool calls (possibly with text).
    pub message: ChatMessage,
    /// Tokens the call consumed (zeros when the provider did not say).
    pub usage: Usage,
    /// Why the model stopped (`stop`, `tool_calls`, `length`, ...), when it said.
    pub finish_reason: Option<String>,
}

/// Why a model stopped, as far as what to do next is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// It finished its answer or its tool calls (`stop`, `tool_calls`, or
    /// nothing said).
    Done,
    /// It was cut off at `max_tokens` or at the end of the context
    /// (`length`): the text, or the tool calls' arguments, are incomplete.
    Truncated,
    /// The provider withheld (part of) the answer (`content_filter`).
    Filtered,
}

impl ChatResponse {
    /// What `finish_reason` means for the answer.
    pub fn finish(&self) -> Finish {
        match self.finish_reason.as_deref() {
            Some("length") => Finish::Truncated,
            Some("content_filter") => Finish::Filtered,
            _ => Finish::Done,
        }
    }
}
