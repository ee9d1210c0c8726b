//! The OpenAI chat-completions wire format: request encoding, response and error decoding.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ChatMessage, ChatRequest, ChatResponse, ChatRole, LlmError, ToolCall, Usage};

/// Error bodies are cut to about this many bytes before they go into an error.
const MAX_ERROR_BODY: usize = 2048;

#[derive(Serialize)]
struct Request<'a> {
    model: &'a str,
    messages: Vec<Message<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<Tool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
}

#[derive(Serialize)]
struct StreamOptions {
    /// A last chunk carries the usage (OpenAI, vLLM, llama.cpp, Ollama).
    include_usage: bool,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'static str,
    /// `null` only for an assistant turn that calls tools and says nothing.
    content: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<Call<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
}

#[derive(Serialize)]
struct Call<'a> {
    id: &'a str,
    r#type: &'static str,
    function: Function<'a>,
}

#[derive(Serialize)]
struct Function<'a> {
    name: &'a str,
    arguments: &'a str,
}

#[derive(Serialize)]
struct Tool<'a> {
    r#type: &'static str,
    function: ToolFunction<'a>,
}

#[derive(Serialize)]
struct ToolFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

/// How a conversation is shaped for the server's chat template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Shape {
    /// Roles strictly alternate after the system message (Mistral-family
    /// templates): consecutive user messages are merged, and the first
    /// message after the system one is a user message.
    pub(super) strict: bool,
    /// `max_tokens` for a request that names none.
    pub(super) max_tokens: u32,
    /// Ask for the answer as server-sent events.
    pub(super) stream: bool,
    /// `parallel_tool_calls` of a request that offers tools; `None`: the
    /// server's default.
    pub(super) parallel_tool_calls: Option<bool>,
}

/// The JSON body of a chat-completions request for `request`, sent as
/// `model_id`, in `shape`. Whatever the shape, there is one system message,
/// first: every system message is merged into it (many chat templates
/// refuse a second one, or one after the conversation has started).
pub(super) fn encode(
    request: &ChatRequest,
    model_id: &str,
    shape: Shape,
) -> Result<Vec<u8>, LlmError> {
    let messages = shaped(&request.messages, shape.strict);
    let tools = request
        .tools
        .iter()
        .map(|tool| Tool {
            r#type: "function",
            function: ToolFunction {
                name: &tool.name,
                description: &tool.description,
                parameters: &tool.parameters,
            },
        })
        .collect();
    let body = Request {
        model: model_id,
        messages,
        tools,
        max_tokens: Some(request.max_tokens.unwrap_or(shape.max_tokens)),
        tool_choice: (request.require_tool && !request.tools.is_empty()).then_some("required"),
        parallel_tool_calls: shape
            .parallel_tool_calls
            .filter(|_| !request.tools.is_empty()),
        stream: shape.stream,
        stream_options: shape.stream.then_some(StreamOptions {
            include_usage: true,
        }),
    };
    serde_json::to_vec(&body)
        .map_err(|e| LlmError::InvalidResponse(format!("cannot encode the request: {e}")))
}

/// `messages` as sent: the system messages merged into one, first; when
/// `strict`, consecutive user messages merged and a user message first
/// after the system one.
fn shaped(messages: &[ChatMessage], strict: bool) -> Vec<Message<'_>> {
    let system: Vec<&str> = messages
        .iter()
        .filter(|m| m.role == ChatRole::System && !m.content.is_empty())
        .map(|m| m.content.as_str())
        .collect();
    let mut out: Vec<Message<'_>> = Vec::with_capacity(messages.len() + 1);
    match system.as_slice() {
        [] => {}
        [one] => out.push(Message::text(ChatRole::System, Cow::Borrowed(one))),
        many => out.push(Message::text(
            ChatRole::System,
            Cow::Owned(many.join("\n\n")),
        )),
    }
    for message in messages.iter().filter(|m| m.role != ChatRole::System) {
        if strict
            && message.role == ChatRole::User
            && let Some(last) = out.last_mut()
            && last.role == ChatRole::User.as_str()
        {
            let said = last.content.as_deref().unwrap_or_default();
            last.content = Some(Cow::Owned(format!("{said}\n\n{}", message.content)));
            continue;
        }
        // The system message, if any, is the only one so far.
        let first = out
            .last()
            .is_none_or(|m| m.role == ChatRole::System.as_str());
        if strict && first && message.role != ChatRole::User {
            let opening = Cow::Borrowed("(The conversation so far follows.)");
            out.push(Message::text(ChatRole::User, opening));
        }
        out.push(encode_message(message));
    }
    out
}

impl<'a> Message<'a> {
    /// A message of text alone.
    fn text(role: ChatRole, content: Cow<'a, str>) -> Self {
        Message {
            role: role.as_str(),
            content: Some(content),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

fn encode_message(message: &ChatMessage) -> Message<'_> {
    let silent_call = message.role == ChatRole::Assistant
        && message.content.is_empty()
        && !message.tool_calls.is_empty();
    Message {
        role: message.role.as_str(),
        content: (!silent_call).then_some(Cow::Borrowed(message.content.as_str())),
        tool_calls: message
            .tool_calls
            .iter()
            .map(|call| Call {
                id: &call.id,
                r#type: "function",
                function: Function {
                    name: &call.name,
                    arguments: &call.arguments,
                },
            })
            .collect(),
        tool_call_id: message.tool_call_id.as_deref(),
    }
}

#[derive(Deserialize)]
struct Response {
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    message: Option<Answer>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    content: Option<Value>,
    /// DeepSeek, vLLM, llama.cpp (`--reasoning-format`): the thinking.
    #[serde(default)]
    reasoning_content: Option<Value>,
    /// Ollama and newer vLLM call it this.
    #[serde(default)]
    reasoning: Option<Value>,
    #[serde(default)]
    tool_calls: Option<Vec<AnswerCall>>,
}

#[derive(Deserialize)]
struct AnswerCall {
    #[serde(default)]
    id: Option<String>,
    function: AnswerFunction,
}

#[derive(Deserialize)]
struct AnswerFunction {
    name: String,
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Deserialize)]
pub(super) struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

/// Reads a successful (2xx) chat-completions body.
pub(super) fn decode(body: &[u8]) -> Result<ChatResponse, LlmError> {
    let response: Response = serde_json::from_slice(body).map_err(|e| {
        LlmError::InvalidResponse(format!(
            "not a chat completion ({e}): {}",
            truncate(&String::from_utf8_lossy(body))
        ))
    })?;
    let Some(choice) = response.choices.into_iter().next() else {
        // Some gateways (OpenRouter) report upstream failures inside a 200.
        if let Some(error) = response.error {
            let ProviderError { code, message } = ProviderError::from_value(&error);
            if is_context_length(code.as_deref(), &message) {
                return Err(LlmError::ContextLength(message));
            }
            return Err(LlmError::InvalidResponse(format!(
                "the provider reported an error: {message}"
            )));
        }
        return Err(LlmError::InvalidResponse(
            "the answer has no choices".into(),
        ));
    };
    let answer = choice
        .message
        .ok_or_else(|| LlmError::InvalidResponse("the first choice has no message".into()))?;
    let tool_calls = answer
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .map(|call| ToolCall {
            id: call.id.filter(|id| !id.is_empty()).unwrap_or_else(call_id),
            name: call.function.name,
            arguments: arguments_text(call.function.arguments),
        })
        .collect();
    let usage = response.usage.map_or(Usage::default(), Usage::from);
    let reasoning = content_text(answer.reasoning_content.or(answer.reasoning));
    let mut message =
        ChatMessage::assistant(content_text(answer.content)).with_tool_calls(tool_calls);
    message.reasoning = (!reasoning.trim().is_empty()).then_some(reasoning);
    Ok(ChatResponse {
        message,
        usage,
        finish_reason: choice.finish_reason,
    })
}

impl From<WireUsage> for Usage {
    fn from(usage: WireUsage) -> Self {
        Usage {
            prompt_tokens: usage.prompt_tokens.unwrap_or(0),
            completion_tokens: usage.completion_tokens.unwrap_or(0),
        }
    }
}

/// An id for a tool call the model gave none: 9 letters and digits, the
/// shape the strictest templates (Mistral's) accept.
pub(super) fn call_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..9].to_owned()
}

/// Content is a string, `null`, or (some servers) an array of `{type, text}` parts.
pub(super) fn content_text(content: Option<Value>) -> String {
    match content {
        Some(Value::String(text)) => text,
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

/// Arguments are JSON text; a server that sends an object gets it re-encoded,
/// and missing arguments mean none.
fn arguments_text(arguments: Option<Value>) -> String {
    match arguments {
        Some(Value::String(text)) => text,
        None | Some(Value::Null) => "{}".into(),
        Some(other) => other.to_string(),
    }
}

/// What an error body says, from `{"error": {"code", "type", "message"}}` or plain text.
#[derive(Debug)]
pub(super) struct ProviderError {
    pub(super) code: Option<String>,
    pub(super) message: String,
}

impl ProviderError {
    pub(super) fn parse(body: &[u8]) -> Self {
        let text = String::from_utf8_lossy(body);
        match serde_json::from_slice::<Value>(body) {
            Ok(value) => {
                let error = value.get("error").unwrap_or(&value);
                let parsed = Self::from_value(error);
                if parsed.message.is_empty() {
                    ProviderError {
                        message: truncate(&text),
                        ..parsed
                    }
                } else {
                    parsed
                }
            }
            Err(_) => ProviderError {
                code: None,
                message: truncate(&text),
            },
        }
    }

    pub(super) fn from_value(error: &Value) -> Self {
        let field = |name| error.get(name).and_then(Value::as_str).map(str::to_owned);
        let message = match error {
            Value::String(text) => text.clone(),
            _ => field("message").unwrap_or_default(),
        };
        ProviderError {
            code: field("code").or_else(|| field("type")),
            message: truncate(&message),
        }
    }
}

/// Whether an error says the conversation is too long for the model.
pub(super) fn is_context_length(code: Option<&str>, message: &str) -> bool {
    if code == Some("context_length_exceeded") {
        return true;
    }
    let message = message.to_lowercase();
    [
        "context length",
        "context_length",
        "maximum context",
        "context window",
        "context size",
        "too many tokens",
        "prompt is too long",
    ]
    .iter()
    .any(|phrase| message.contains(phrase))
}

/// Whether a 400 says the chat template refused the conversation's roles:
/// a second system message, or roles that do not alternate.
pub(super) fn is_role_rule(body: &str) -> bool {
    let body = body.to_lowercase();
    [
        "roles must alternate",
        "after the optional system message",
        "system role not supported",
        "system message must be at the beginning",
    ]
    .iter()
    .any(|phrase| body.contains(phrase))
}

/// Whether an error says the model does not exist.
pub(super) fn is_unknown_model(code: Option<&str>, message: &str) -> bool {
    if code == Some("model_not_found") {
        return true;
    }
    let message = message.to_lowercase();
    message.contains("model")
        && (message.contains("not found") || message.contains("does not exist"))
}

/// `text` cut to [`MAX_ERROR_BODY`] bytes.
pub(super) fn truncate(text: &str) -> String {
    crate::text::cut_str(text, MAX_ERROR_BODY)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn content_may_be_null_or_parts() {
        let body = br#"{"choices":[{"message":{"content":null,"tool_calls":[
            {"function":{"name":"f","arguments":{"a":1}}}]}}]}"#;
        let response = decode(body).unwrap();
        assert_eq!(response.message.content, "");
        let id = &response.message.tool_calls[0].id;
        assert!(
            id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()),
            "a made-up id any template accepts: {id}"
        );
        assert_eq!(response.message.tool_calls[0].arguments, r#"{"a":1}"#);
        assert_eq!(response.usage, Usage::default());

        let body = br#"{"choices":[{"message":{"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}}]}"#;
        assert_eq!(decode(body).unwrap().message.content, "ab");
    }

    #[test]
    fn reasoning_is_kept_apart_from_the_answer() {
        let body = br#"{"choices":[{"message":{"content":"","reasoning_content":"2+2 is 4"},
            "finish_reason":"stop"}]}"#;
        let response = decode(body).unwrap();
        assert_eq!(response.message.content, "");
        assert_eq!(response.message.reasoning.as_deref(), Some("2+2 is 4"));
        let body = br#"{"choices":[{"message":{"content":"4","reasoning":"think"},"finish_reason":"length"}]}"#;
        let response = decode(body).unwrap();
        assert_eq!(response.message.reasoning.as_deref(), Some("think"));
        assert_eq!(response.finish(), crate::llm::Finish::Truncated);
    }

    #[test]
    fn parallel_tool_calls_is_sent_only_when_set_and_tools_are_offered() {
        let shape = |parallel_tool_calls| Shape {
            strict: false,
            max_tokens: 10,
            stream: false,
            parallel_tool_calls,
        };
        let body = |request: &ChatRequest, parallel| -> Value {
            serde_json::from_slice(&encode(request, "m", shape(parallel)).unwrap()).unwrap()
        };
        let plain = ChatRequest::new("m", vec![ChatMessage::user("hi")]);
        assert!(
            body(&plain, Some(false))
                .get("parallel_tool_calls")
                .is_none()
        );
        let mut with_tools = plain.clone();
        with_tools.tools = vec![crate::llm::ToolSchema {
            name: "echo".into(),
            description: "Says it back.".into(),
            parameters: serde_json::json!({ "type": "object" }),
        }];
        assert_eq!(body(&with_tools, Some(false))["parallel_tool_calls"], false);
        assert!(body(&with_tools, None).get("parallel_tool_calls").is_none());
    }

    fn sent(messages: &[ChatMessage], strict: bool) -> Vec<(String, String)> {
        let request = ChatRequest::new("m", messages.to_vec());
        let body = encode(
            &request,
            "m",
            Shape {
                strict,
                max_tokens: 77,
                stream: false,
                parallel_tool_calls: None,
            },
        )
        .unwrap();
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["max_tokens"], 77, "a request always caps its answer");
        body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["role"].as_str().unwrap().to_owned(),
                    m["content"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn one_system_message_first_and_strict_alternation_when_asked() {
        let pair = |r: &str, c: &str| (r.to_owned(), c.to_owned());
        let messages = [
            ChatMessage::system("rules"),
            ChatMessage::system("[note]"),
            ChatMessage::user("a"),
            ChatMessage::user("b"),
            ChatMessage::assistant("c"),
        ];
        assert_eq!(
            sent(&messages, false),
            [
                pair("system", "rules\n\n[note]"),
                pair("user", "a"),
                pair("user", "b"),
                pair("assistant", "c")
            ]
        );
        assert_eq!(
            sent(&messages, true),
            [
                pair("system", "rules\n\n[note]"),
                pair("user", "a\n\nb"),
                pair("assistant", "c")
            ]
        );
        // History cut to start at an answer: a user message goes first.
        let cut = [ChatMessage::system("rules"), ChatMessage::assistant("c")];
        assert_eq!(sent(&cut, true)[1].0, "user");
        assert_eq!(sent(&cut, false)[1].0, "assistant");
    }

    #[test]
    fn error_bodies() {
        let parsed = ProviderError::parse(
            br#"{"error":{"message":"This model's maximum context length is 8192 tokens","code":"context_length_exceeded"}}"#,
        );
        assert!(is_context_length(parsed.code.as_deref(), &parsed.message));
        let parsed = ProviderError::parse(b"upstream exploded");
        assert_eq!(parsed.message, "upstream exploded");
        assert!(!is_context_length(None, "invalid value for temperature"));
        assert!(is_unknown_model(None, "The model `gpt-9` does not exist"));
        let long = "é".repeat(3000);
        let cut = truncate(&long);
        assert!(cut.len() < 2100 && cut.ends_with("[cut: 6000 bytes in all]"));
    }
}
