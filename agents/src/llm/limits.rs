//! Caps on what one model call may send and take in: a broken or hostile
//! endpoint may write an answer of any size, but the kernel reads only so
//! much of it, and a request offers only so many bytes of tools.

use super::{ChatMessage, ChatRequest, ChatResponse};

/// The caps of a provider (the `llm.max_answer_bytes`, `llm.max_tool_calls`
/// and `llm.max_tool_definition_bytes` settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of one answer: its text, reasoning and tool calls (ids, names,
    /// arguments) together. A streamed answer is cut once past it; a body
    /// read whole is read up to it.
    pub answer_bytes: usize,
    /// Tool calls in one answer.
    pub tool_calls: usize,
    /// Bytes of the tool definitions (names, descriptions, parameter
    /// schemas as JSON) one request offers.
    pub tool_definition_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            answer_bytes: 4 << 20,
            tool_calls: 64,
            tool_definition_bytes: 256 << 10,
        }
    }
}

/// A cap a model call passed. The call fails and is not tried again: the
/// server was answering, and would answer the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OverLimit {
    /// [`Limits::answer_bytes`].
    #[error("the model's answer is over {0} bytes (llm.max_answer_bytes)")]
    AnswerBytes(usize),
    /// [`Limits::tool_calls`].
    #[error("the model's answer has more than {0} tool calls (llm.max_tool_calls)")]
    ToolCalls(usize),
    /// [`Limits::tool_definition_bytes`].
    #[error("the request's tool definitions are over {0} bytes (llm.max_tool_definition_bytes)")]
    ToolDefinitionBytes(usize),
}

impl Limits {
    /// Refuses a request whose tool definitions are over the cap.
    pub fn check_request(&self, request: &ChatRequest) -> Result<(), OverLimit> {
        let mut bytes = 0usize;
        for tool in &request.tools {
            bytes = bytes.saturating_add(tool.definition_bytes());
            if bytes > self.tool_definition_bytes {
                return Err(OverLimit::ToolDefinitionBytes(self.tool_definition_bytes));
            }
        }
        Ok(())
    }

    /// Refuses a whole answer over the caps.
    pub fn check_answer(&self, response: &ChatResponse) -> Result<(), OverLimit> {
        if response.message.tool_calls.len() > self.tool_calls {
            return Err(OverLimit::ToolCalls(self.tool_calls));
        }
        self.check_bytes(answer_bytes(&response.message))
    }

    /// Refuses `bytes` of answer when they are over the cap.
    pub(super) fn check_bytes(&self, bytes: usize) -> Result<(), OverLimit> {
        if bytes > self.answer_bytes {
            return Err(OverLimit::AnswerBytes(self.answer_bytes));
        }
        Ok(())
    }
}

/// The bytes of an answer that count against [`Limits::answer_bytes`].
pub fn answer_bytes(message: &ChatMessage) -> usize {
    let calls: usize = message
        .tool_calls
        .iter()
        .map(|call| call.id.len() + call.name.len() + call.arguments.len())
        .sum();
    message.content.len() + message.reasoning.as_ref().map_or(0, String::len) + calls
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::llm::{ToolCall, ToolSchema};

    fn limits(answer_bytes: usize, tool_calls: usize, tool_definition_bytes: usize) -> Limits {
        Limits {
            answer_bytes,
            tool_calls,
            tool_definition_bytes,
        }
    }

    #[test]
    fn an_answer_counts_its_text_reasoning_and_calls() {
        let mut message =
            ChatMessage::assistant("12345").with_tool_calls(vec![ToolCall::new("a", "f", "{}")]);
        message.reasoning = Some("678".into());
        assert_eq!(answer_bytes(&message), 5 + 3 + 4);
        let response = ChatResponse {
            message,
            usage: Default::default(),
            finish_reason: None,
        };
        assert_eq!(limits(12, 1, 0).check_answer(&response), Ok(()));
        assert_eq!(
            limits(11, 1, 0).check_answer(&response),
            Err(OverLimit::AnswerBytes(11))
        );
        assert_eq!(
            limits(100, 0, 0).check_answer(&response),
            Err(OverLimit::ToolCalls(0))
        );
    }

    #[test]
    fn a_request_counts_its_tool_definitions() {
        let tool = ToolSchema {
            name: "echo".into(),
            description: "Says it back.".into(),
            parameters: serde_json::json!({ "type": "object" }),
        };
        let bytes = tool.definition_bytes();
        assert_eq!(bytes, 4 + 13 + r#"{"type":"object"}"#.len());
        let request = ChatRequest {
            tools: vec![tool.clone(), tool],
            ..ChatRequest::new("m", Vec::new())
        };
        assert_eq!(limits(0, 0, 2 * bytes).check_request(&request), Ok(()));
        let over = limits(0, 0, 2 * bytes - 1).check_request(&request);
        assert_eq!(over, Err(OverLimit::ToolDefinitionBytes(2 * bytes - 1)));
        assert_eq!(
            over.unwrap_err().to_string(),
            format!(
                "the request's tool definitions are over {} bytes (llm.max_tool_definition_bytes)",
                2 * bytes - 1
            )
        );
    }

    #[test]
    fn the_errors_name_the_setting() {
        assert_eq!(
            OverLimit::AnswerBytes(4 << 20).to_string(),
            "the model's answer is over 4194304 bytes (llm.max_answer_bytes)"
        );
        assert_eq!(
            OverLimit::ToolCalls(64).to_string(),
            "the model's answer has more than 64 tool calls (llm.max_tool_calls)"
        );
    }
}
