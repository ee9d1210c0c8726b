//! Streamed chat completions: the server-sent events of a `stream: true`
//! request read into one answer.
//!
//! [`Events`] splits the bytes into events (`data:` lines up to a blank
//! line; comments and other fields are skipped). [`Assembly`] applies each
//! event's chunk: text and reasoning deltas are appended, a tool call's
//! pieces are joined by their `index` (its id and name come first, its
//! arguments in pieces), and `finish_reason` and `usage` are taken where
//! they come (usage in a last chunk with no choices, as
//! `stream_options.include_usage` asks). `data: [DONE]` ends the stream.
//! The answer is held to the provider's [`Limits`]: a chunk that takes it
//! past its bytes, or opens a tool call past its count, ends it.

use serde::Deserialize;
use serde_json::Value;

use super::wire::{self, ProviderError};
use super::{ChatMessage, ChatResponse, Limits, LlmError, OverLimit, ToolCall, Usage};

/// Longest event (or line) a stream may send: far above any chunk, small
/// enough that a server that never sends a newline cannot fill memory.
const MAX_EVENT_BYTES: usize = 16 << 20;

/// A server-sent events parser fed bytes as they arrive.
#[derive(Debug, Default)]
pub(super) struct Events {
    /// Bytes of an unfinished line.
    line: Vec<u8>,
    /// The data of an unfinished event.
    data: String,
    /// Whether `data` has a field yet (an event of `data:` alone is empty, not absent).
    has_data: bool,
}

impl Events {
    /// The events `bytes` completes, each as its data.
    pub(super) fn push(&mut self, bytes: &[u8]) -> Result<Vec<String>, LlmError> {
        let mut done = Vec::new();
        for &byte in bytes {
            if byte != b'\n' {
                self.line.push(byte);
                if self.line.len() + self.data.len() > MAX_EVENT_BYTES {
                    return Err(LlmError::InvalidResponse(format!(
                        "a streamed event is longer than {MAX_EVENT_BYTES} bytes"
                    )));
                }
                continue;
            }
            if self.line.last() == Some(&b'\r') {
                self.line.pop();
            }
            let line = std::mem::take(&mut self.line);
            if line.is_empty() {
                if self.has_data {
                    done.push(std::mem::take(&mut self.data));
                    self.has_data = false;
                }
                continue;
            }
            let text = String::from_utf8_lossy(&line);
            let (field, value) = match text.split_once(':') {
                Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
                None => (text.as_ref(), ""),
            };
            // Comments (":keep-alive") have an empty field; `event`, `id` and
            // `retry` say nothing a chat completion needs.
            if field == "data" {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
        }
        Ok(done)
    }

    /// The last event, when the stream ended without the blank line after it.
    pub(super) fn finish(mut self) -> Option<String> {
        if !self.line.is_empty() {
            let _ = self.push(b"\n");
        }
        self.has_data.then_some(self.data)
    }
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<ChunkChoice>,
    #[serde(default)]
    usage: Option<wire::WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    index: u64,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    reasoning_content: Option<Value>,
    #[serde(default)]
    reasoning: Option<Value>,
    #[serde(default)]
    tool_calls: Option<Vec<CallDelta>>,
}

#[derive(Deserialize)]
struct CallDelta {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<Value>,
}

/// A tool call being put together.
#[derive(Debug, Default)]
struct PartCall {
    index: Option<u64>,
    id: String,
    name: String,
    arguments: String,
}

/// What one event added, for whoever watches the answer arrive.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Added {
    /// Answer text.
    pub(super) text: String,
    /// Reasoning text.
    pub(super) reasoning: String,
}

/// How a stream said it failed.
#[derive(Debug)]
pub(super) enum Said {
    /// An `{"error": ...}` event.
    Error(ProviderError),
    /// An event the answer cannot take: not a chunk, or one past a limit.
    Fatal(LlmError),
}

impl From<OverLimit> for Said {
    fn from(over: OverLimit) -> Self {
        Said::Fatal(over.into())
    }
}

/// The answer so far.
#[derive(Debug, Default)]
pub(super) struct Assembly {
    content: String,
    reasoning: String,
    calls: Vec<PartCall>,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    /// `[DONE]` arrived.
    done: bool,
    /// Any chunk arrived.
    started: bool,
    limits: Limits,
    /// Bytes of the answer so far, as [`super::limits::answer_bytes`] counts them.
    bytes: usize,
}

impl Assembly {
    /// An empty answer, to be held to `limits`.
    pub(super) fn new(limits: Limits) -> Self {
        Assembly {
            limits,
            ..Assembly::default()
        }
    }

    /// Whether `[DONE]` arrived.
    pub(super) fn is_done(&self) -> bool {
        self.done
    }

    /// Whether the answer says how it ended (`finish_reason`), so a stream
    /// that closes without `[DONE]` is still whole.
    pub(super) fn is_finished(&self) -> bool {
        self.done || self.finish_reason.is_some()
    }

    /// Answer text received so far.
    pub(super) fn text(&self) -> &str {
        &self.content
    }

    /// Applies one event's data.
    pub(super) fn apply(&mut self, data: &str) -> Result<Added, Said> {
        let data = data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(Added::default());
        }
        if data.is_empty() {
            return Ok(Added::default());
        }
        let chunk: Chunk = serde_json::from_str(data).map_err(|e| {
            Said::Fatal(LlmError::InvalidResponse(format!(
                "a streamed event is not a chat-completion chunk ({e}): {}",
                wire::truncate(data)
            )))
        })?;
        if let Some(error) = &chunk.error {
            return Err(Said::Error(ProviderError::from_value(
                error.get("error").unwrap_or(error),
            )));
        }
        self.started = true;
        if let Some(usage) = chunk.usage {
            self.usage = Some(usage.into());
        }
        let mut added = Added::default();
        // One answer is asked for; other choices (n > 1) are not ours.
        for choice in chunk.choices.into_iter().filter(|c| c.index == 0) {
            if let Some(reason) = choice.finish_reason.filter(|r| !r.is_empty()) {
                self.finish_reason = Some(reason);
            }
            let Some(delta) = choice.delta else { continue };
            let text = wire::content_text(delta.content);
            let reasoning = wire::content_text(delta.reasoning_content.or(delta.reasoning));
            self.count(0, text.len() + reasoning.len())?;
            self.content.push_str(&text);
            self.reasoning.push_str(&reasoning);
            added.text.push_str(&text);
            added.reasoning.push_str(&reasoning);
            for call in delta.tool_calls.unwrap_or_default() {
                self.add_call(call)?;
            }
        }
        Ok(added)
    }

    /// Counts `added` bytes more of the answer and `dropped` ones it no
    /// longer holds, refusing the change when it takes the answer past
    /// the limit.
    fn count(&mut self, dropped: usize, added: usize) -> Result<(), OverLimit> {
        let bytes = self.bytes.saturating_sub(dropped).saturating_add(added);
        self.limits.check_bytes(bytes)?;
        self.bytes = bytes;
        Ok(())
    }

    /// Joins a tool call's piece to the call it continues: the one of its
    /// `index`; without an index, the last one unless it brings a new id.
    fn add_call(&mut self, piece: CallDelta) -> Result<(), OverLimit> {
        let id = piece.id.filter(|id| !id.is_empty());
        let at = match piece.index {
            Some(index) => self.calls.iter().position(|c| c.index == Some(index)),
            None => match (&id, self.calls.last()) {
                (Some(id), Some(last)) if last.id != *id && !last.id.is_empty() => None,
                (_, Some(_)) => Some(self.calls.len() - 1),
                (_, None) => None,
            },
        };
        let at = match at {
            Some(at) => at,
            None if self.calls.len() >= self.limits.tool_calls => {
                return Err(OverLimit::ToolCalls(self.limits.tool_calls));
            }
            None => {
                self.calls.push(PartCall {
                    index: piece.index,
                    ..PartCall::default()
                });
                self.calls.len() - 1
            }
        };
        let (name, arguments) = match piece.function {
            Some(function) => (
                function.name.unwrap_or_default(),
                match function.arguments {
                    Some(Value::String(text)) => text,
                    None | Some(Value::Null) => String::new(),
                    Some(other) => other.to_string(),
                },
            ),
            None => Default::default(),
        };
        // An id replaces the one before it; names and arguments add up.
        let replaced = id.as_ref().map_or(0, |_| self.calls[at].id.len());
        let added = id.as_ref().map_or(0, String::len) + name.len() + arguments.len();
        self.count(replaced, added)?;
        let call = &mut self.calls[at];
        if let Some(id) = id {
            call.id = id;
        }
        call.name.push_str(&name);
        call.arguments.push_str(&arguments);
        Ok(())
    }

    /// The whole answer.
    pub(super) fn finish(self) -> Result<ChatResponse, LlmError> {
        if !self.started {
            return Err(LlmError::InvalidResponse(
                "the stream ended without a chunk".into(),
            ));
        }
        let calls = self
            .calls
            .into_iter()
            .map(|call| ToolCall {
                id: if call.id.is_empty() {
                    wire::call_id()
                } else {
                    call.id
                },
                name: call.name,
                arguments: if call.arguments.trim().is_empty() {
                    "{}".into()
                } else {
                    call.arguments
                },
            })
            .collect();
        let mut message = ChatMessage::assistant(self.content).with_tool_calls(calls);
        message.reasoning = (!self.reasoning.trim().is_empty()).then_some(self.reasoning);
        Ok(ChatResponse {
            message,
            usage: self.usage.unwrap_or_default(),
            finish_reason: self.finish_reason,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn events(parts: &[&[u8]]) -> Vec<String> {
        let mut events = Events::default();
        let mut out = Vec::new();
        for part in parts {
            out.extend(events.push(part).unwrap());
        }
        out.extend(events.finish());
        out
    }

    #[test]
    fn events_split_on_blank_lines_whatever_the_chunking() {
        let stream = b"data: {\"a\":1}\r\n\r\n: keep-alive\n\nevent: x\ndata: one\ndata: two\n\ndata:[DONE]\n\n";
        let whole = events(&[stream]);
        assert_eq!(whole, ["{\"a\":1}", "one\ntwo", "[DONE]"]);
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(events(&bytes), whole, "one byte at a time");
        assert_eq!(events(&[b"data: last"]), ["last"], "no final blank line");
    }

    #[test]
    fn an_endless_line_is_refused() {
        let mut events = Events::default();
        let long = vec![b'x'; MAX_EVENT_BYTES + 1];
        assert!(matches!(
            events.push(&long),
            Err(LlmError::InvalidResponse(_))
        ));
    }

    fn assemble(chunks: &[&str]) -> ChatResponse {
        let mut answer = Assembly::default();
        for chunk in chunks {
            answer.apply(chunk).unwrap();
        }
        answer.finish().unwrap()
    }

    #[test]
    fn text_reasoning_and_usage_add_up() {
        let answer = assemble(&[
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"reasoning_content":"think"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"Hel"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}"#,
            "[DONE]",
        ]);
        assert_eq!(answer.message.content, "Hello");
        assert_eq!(answer.message.reasoning.as_deref(), Some("think"));
        assert_eq!(answer.finish_reason.as_deref(), Some("stop"));
        assert_eq!(answer.usage.total(), 9);
    }

    #[test]
    fn tool_calls_are_joined_by_index() {
        let answer = assemble(&[
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"read","arguments":""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","function":{"name":"list","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"path\":"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"a\"}"}}]},"finish_reason":"tool_calls"}]}"#,
        ]);
        let calls = &answer.message.tool_calls;
        assert_eq!(calls.len(), 2);
        assert_eq!(
            (calls[0].id.as_str(), calls[0].name.as_str()),
            ("call_a", "read")
        );
        assert_eq!(calls[0].arguments, r#"{"path":"a"}"#);
        assert_eq!(calls[1].arguments, "{}");
        assert_eq!(answer.finish_reason.as_deref(), Some("tool_calls"));
    }

    #[test]
    fn calls_without_an_index_or_an_id_still_come_out_whole() {
        // Whole calls in one chunk each, as some servers send them.
        let answer = assemble(&[
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"a","function":{"name":"f","arguments":{"x":1}}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"b","function":{"name":"g"}}]}}]}"#,
        ]);
        let calls = &answer.message.tool_calls;
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments, r#"{"x":1}"#);
        assert_eq!(calls[1].arguments, "{}", "missing arguments mean none");
        let answer =
            assemble(&[r#"{"choices":[{"delta":{"tool_calls":[{"function":{"name":"f"}}]}}]}"#]);
        let id = &answer.message.tool_calls[0].id;
        assert!(id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()));
    }

    fn limited(answer_bytes: usize, tool_calls: usize) -> Assembly {
        Assembly::new(Limits {
            answer_bytes,
            tool_calls,
            ..Limits::default()
        })
    }

    fn over(said: Result<Added, Said>) -> OverLimit {
        match said {
            Err(Said::Fatal(LlmError::OverLimit(over))) => over,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_endless_answer_is_cut_at_its_byte_limit() {
        let piece = r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"xxxxxxxxxx"}}]}}]}"#;
        let mut answer = limited(1000, 64);
        let head = r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f"}}]}}]}"#;
        answer.apply(head).unwrap();
        let mut taken = 0;
        let cut = loop {
            match answer.apply(piece) {
                Ok(_) => taken += 1,
                Err(said) => break over(Err(said)),
            }
            assert!(taken < 1000, "never cut");
        };
        assert_eq!(cut, OverLimit::AnswerBytes(1000));
        assert_eq!(
            taken, 99,
            "the id, the name and 99 pieces fit in 1000 bytes"
        );
        // Text and reasoning count too.
        let mut answer = limited(10, 64);
        answer
            .apply(r#"{"choices":[{"delta":{"reasoning_content":"12345"}}]}"#)
            .unwrap();
        let text = answer.apply(r#"{"choices":[{"delta":{"content":"123456"}}]}"#);
        assert_eq!(over(text), OverLimit::AnswerBytes(10));
    }

    #[test]
    fn an_id_sent_again_is_counted_once() {
        let piece = r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_1","function":{"arguments":"x"}}]}}]}"#;
        let mut answer = limited(100, 64);
        for _ in 0..90 {
            answer.apply(piece).unwrap();
        }
        let answer = answer.finish().unwrap();
        assert_eq!(answer.message.tool_calls[0].arguments.len(), 90);
    }

    #[test]
    fn calls_past_the_limit_end_the_answer() {
        let call = |i: usize| {
            format!(
                r#"{{"choices":[{{"delta":{{"tool_calls":[{{"index":{i},"id":"c{i}","function":{{"name":"f","arguments":"{{}}"}}}}]}}}}]}}"#
            )
        };
        let mut answer = limited(1 << 20, 3);
        for i in 0..3 {
            answer.apply(&call(i)).unwrap();
        }
        // More pieces of a call already open are fine.
        answer.apply(&call(2)).unwrap();
        assert_eq!(over(answer.apply(&call(3))), OverLimit::ToolCalls(3));
        // Without an index, each new id opens a call.
        let mut answer = limited(1 << 20, 1);
        let unindexed = |id: &str| {
            format!(
                r#"{{"choices":[{{"delta":{{"tool_calls":[{{"id":"{id}","function":{{"name":"f"}}}}]}}}}]}}"#
            )
        };
        answer.apply(&unindexed("a")).unwrap();
        assert_eq!(over(answer.apply(&unindexed("b"))), OverLimit::ToolCalls(1));
    }

    #[test]
    fn errors_and_garbage_in_a_stream_are_told_apart() {
        let mut answer = Assembly::default();
        match answer.apply(r#"{"error":{"message":"Context size has been exceeded.","code":500}}"#)
        {
            Err(Said::Error(said)) => {
                assert!(wire::is_context_length(None, &said.message));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(answer.apply("not json"), Err(Said::Fatal(_))));
        assert!(Assembly::default().finish().is_err(), "no chunk at all");
    }
}
