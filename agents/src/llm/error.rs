//! What can go wrong when calling a model.

use std::time::Duration;

/// A failed model call, with a message naming what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LlmError {
    /// The provider said the conversation does not fit the model's context.
    #[error("context length exceeded: {0}")]
    ContextLength(String),
    /// Still rate limited (HTTP 429) after every retry.
    #[error("rate limited by the provider{}", retry_after_note(.retry_after))]
    RateLimited {
        /// How long the provider last asked us to wait, if it said.
        retry_after: Option<Duration>,
    },
    /// The provider answered with an error status (body truncated to about 2 KB).
    #[error("provider answered HTTP {status}: {body}")]
    Http {
        /// The HTTP status code.
        status: u16,
        /// The start of the response body.
        body: String,
    },
    /// The request did not reach the provider or the answer did not come back.
    #[error("transport error: {0}")]
    Transport(String),
    /// The answer did not come in time (after every retry): which limit it
    /// passed (no first token, a silence between chunks, the overall cap).
    #[error("the provider did not answer in time: {0}")]
    Timeout(String),
    /// The answer was not a chat completion we can read.
    #[error("invalid response from the provider: {0}")]
    InvalidResponse(String),
    /// The answer (or the request) passed one of the provider's [`Limits`](super::Limits);
    /// never tried again.
    #[error(transparent)]
    OverLimit(#[from] super::OverLimit),
    /// The provider does not know the model.
    #[error("unknown model {0:?}")]
    UnknownModel(String),
    /// The provider's settings are unusable.
    #[error("invalid LLM provider settings: {0}")]
    Config(String),
    /// The kernel did not pass the call on (no provider configured, shutting
    /// down, a rate limit).
    #[error("model call refused: {0}")]
    Refused(String),
    /// The budget the process draws on is used up; its task ends.
    #[error("budget_exceeded: {0}")]
    BudgetExceeded(String),
}

fn retry_after_note(retry_after: &Option<Duration>) -> String {
    match retry_after {
        Some(wait) => format!(" (asked to retry after {} ms)", wait.as_millis()),
        None => String::new(),
    }
}
