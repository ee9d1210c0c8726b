//! `ask_human`: an agent puts a question to a person and waits for the
//! answer (the kernel's inbox: `hivekernel inbox`, `hivekernel answer`).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Tool, ToolContext, ToolError, ToolRegistry, decode};
use crate::capability::Capability;
use crate::syscalls::{HumanAnswer, HumanQuestion};

/// Most choices a question may offer.
pub const MAX_CHOICES: usize = 20;
/// Longest wait a question may ask for: a day.
pub const MAX_TIMEOUT_SECONDS: u64 = 86_400;
/// The wait when the question names none.
pub const DEFAULT_TIMEOUT_SECONDS: u64 = 3_600;
/// Longest question, and longest choice, in bytes.
pub const MAX_QUESTION_BYTES: usize = 8192;

/// Adds `ask_human`.
pub fn register(registry: &mut ToolRegistry) {
    registry.register(Arc::new(AskHuman));
}

/// Asks a person a question and waits for the answer.
#[derive(Debug, Clone, Copy, Default)]
pub struct AskHuman;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    question: String,
    #[serde(default)]
    choices: Vec<String>,
    timeout_seconds: Option<u64>,
}

#[async_trait]
impl Tool for AskHuman {
    fn name(&self) -> &'static str {
        "ask_human"
    }

    fn capability(&self) -> Option<Capability> {
        None
    }

    fn description(&self) -> &'static str {
        "Ask a person a question you cannot answer alone (optionally offering choices) and wait for the answer."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "question": { "type": "string", "description": "The question, complete enough to answer without more context." },
                "choices": { "type": "array", "items": { "type": "string" }, "maxItems": MAX_CHOICES, "description": "Answers to choose from; leave out for a free answer." },
                "timeout_seconds": { "type": "integer", "minimum": 1, "maximum": MAX_TIMEOUT_SECONDS, "description": "How long to wait (default 3600)." }
            },
            "required": ["question"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let args: Args = decode(self, args)?;
        let question = args.question.trim();
        if question.is_empty() {
            return Err(ToolError::new("question must not be empty"));
        }
        if question.len() > MAX_QUESTION_BYTES {
            return Err(ToolError::new(format!(
                "question is {} bytes; at most {MAX_QUESTION_BYTES}",
                question.len()
            )));
        }
        if args.choices.iter().any(|c| c.len() > MAX_QUESTION_BYTES) {
            return Err(ToolError::new(format!(
                "a choice is longer than {MAX_QUESTION_BYTES} bytes"
            )));
        }
        if args.choices.len() > MAX_CHOICES {
            return Err(ToolError::new(format!(
                "at most {MAX_CHOICES} choices, got {}",
                args.choices.len()
            )));
        }
        if args.choices.iter().any(|c| c.trim().is_empty()) {
            return Err(ToolError::new("a choice must not be empty"));
        }
        let seconds = args.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS);
        if !(1..=MAX_TIMEOUT_SECONDS).contains(&seconds) {
            return Err(ToolError::new(format!(
                "timeout_seconds must be between 1 and {MAX_TIMEOUT_SECONDS}, got {seconds}"
            )));
        }
        let asked = HumanQuestion {
            question: question.to_owned(),
            choices: args.choices,
            timeout: Duration::from_secs(seconds),
        };
        let answer = ctx
            .process
            .syscalls
            .ask_human(asked, ctx.checkpoint)
            .await
            .map_err(|err| ToolError::new(err.message))?;
        Ok(match answer {
            HumanAnswer::Answered(text) => text,
            HumanAnswer::Declined(reason) if reason.is_empty() => {
                "the person declined to answer".to_owned()
            }
            HumanAnswer::Declined(reason) => format!("the person declined to answer: {reason}"),
            HumanAnswer::TimedOut => {
                format!("no answer within {seconds} seconds; decide without it or ask again later")
            }
        })
    }
}
