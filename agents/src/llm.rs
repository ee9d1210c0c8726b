//! Model providers: the provider-neutral chat types, the [`Provider`] trait,
//! an OpenAI-compatible HTTP client and a deterministic offline provider.
//!
//! A provider turns a [`ChatRequest`] (logical model name, conversation,
//! tools offered) into a [`ChatResponse`] (one assistant message, possibly
//! with tool calls, and token usage). It does not run tools or loop: the
//! agent loop does that, and sees every failure as a typed [`LlmError`]
//! (context too long, rate limited, HTTP error, timeout, unreadable answer).
//!
//! # Layout
//! - [`types`]: messages, tool calls, tool schemas, requests, responses, usage.
//! - [`error`]: every way a model call can fail, as [`LlmError`].
//! - [`openai`]: [`OpenAiProvider`] for any OpenAI-compatible chat-completions endpoint.
//! - [`admission`]: [`Admission`], the kernel-wide cap on requests in flight.
//! - [`limits`]: [`Limits`], the caps on an answer's bytes and tool calls
//!   and on a request's tool definitions.
//! - [`calibration`]: token estimates scaled by what servers count.
//! - [`scripted`]: [`ScriptedProvider`], deterministic and offline; its rules are in its docs.
//! - `retry` (private): backoff with jitter and `Retry-After`.
//! - `wire` (private): the chat-completions JSON format.
//! - `stream` (private): a streamed answer's server-sent events.

pub mod admission;
pub mod calibration;
pub mod catalogue;
pub mod error;
pub mod limits;
pub mod openai;
mod retry;
pub mod scripted;
mod stream;
pub mod types;
mod wire;

use std::time::Duration;

use async_trait::async_trait;

pub use admission::Admission;
pub use error::LlmError;
pub use limits::{Limits, OverLimit};
pub use openai::{OpenAiProvider, OpenAiSettings};
pub use scripted::{SUBTASKS_MARKER, SYNTHESIZE_MARKER, ScriptedProvider};
pub use types::{
    ChatMessage, ChatRequest, ChatResponse, ChatRole, Finish, ToolCall, ToolSchema, Usage,
};

/// A model endpoint.
#[async_trait]
pub trait Provider: Send + Sync + std::fmt::Debug {
    /// Short name for logs and `ps` (`openai`, `scripted`).
    fn name(&self) -> &str;

    /// One completion of `request`, telling `watch` what happens while it
    /// runs; retries, timeouts and admission are the provider's business.
    /// Dropping the future abandons the call (an HTTP provider closes its
    /// connection, so the server stops generating).
    async fn call(
        &self,
        request: &ChatRequest,
        watch: &dyn Watch,
    ) -> Result<ChatResponse, LlmError>;

    /// [`Provider::call`] with nobody watching.
    async fn chat(&self, request: &ChatRequest) -> Result<ChatResponse, LlmError> {
        self.call(request, &Unwatched).await
    }
}

/// What a provider tells while a call runs. Both methods are called on
/// the caller's task, in order, and must not block.
pub trait Watch: Send + Sync {
    /// Answer text as it streams in (`reasoning`: the model's thinking,
    /// not its answer). A retry starts the answer over.
    fn streamed(&self, _text: &str, _reasoning: bool) {}

    /// An attempt failed and the call goes on: another attempt follows
    /// after [`Retry::wait`].
    fn retrying(&self, _retry: &Retry<'_>) {}
}

/// A failed attempt that is tried again.
#[derive(Debug, Clone, Copy)]
pub struct Retry<'a> {
    /// The attempt that failed (1 for the first).
    pub attempt: u32,
    /// Why.
    pub error: &'a LlmError,
    /// How long it took.
    pub took: Duration,
    /// The wait before the next attempt.
    pub wait: Duration,
}

/// A [`Watch`] that ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unwatched;

impl Watch for Unwatched {}

/// Tokens added per message for its role and framing.
const MESSAGE_OVERHEAD_TOKENS: u64 = 4;

/// A rough token count of `messages`: a quarter of their text's UTF-8 bytes
/// (about chars/4 for English, less of an undercount for other scripts) plus
/// a few tokens of framing per message.
pub fn estimate_tokens(messages: &[ChatMessage]) -> u64 {
    messages.iter().map(message_tokens).sum()
}

/// [`estimate_tokens`] of the messages plus the tool schemas, which also take up context.
pub fn estimate_request_tokens(request: &ChatRequest) -> u64 {
    let tools: usize = request.tools.iter().map(ToolSchema::definition_bytes).sum();
    estimate_tokens(&request.messages) + (tools as u64).div_ceil(4)
}

fn message_tokens(message: &ChatMessage) -> u64 {
    let calls: usize = message
        .tool_calls
        .iter()
        .map(|call| call.id.len() + call.name.len() + call.arguments.len())
        .sum();
    let id = message.tool_call_id.as_ref().map_or(0, String::len);
    let bytes = message.content.len() + calls + id;
    MESSAGE_OVERHEAD_TOKENS + (bytes as u64).div_ceil(4)
}
