//! `memory_store`, `memory_recall` and `memory_forget`: an agent's own
//! long-term memory, kept by the kernel across restarts and searched by words.

use crate::capability::Capability;
use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::args::invalid;
use super::{Tool, ToolContext, ToolError, ToolRegistry, decode, refused, to_json};
use crate::memory::NewMemory;

/// Remembers a text in the caller's memory.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryStore;

/// Finds entries in the caller's memory by words.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryRecall;

/// Deletes an entry of the caller's memory by its key.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryForget;

/// Most entries one recall may ask for; the kernel may cap it lower.
const MAX_RECALL: u64 = 1000;

/// Adds `memory_store`, `memory_recall` and `memory_forget`.
pub fn register(registry: &mut ToolRegistry) {
    registry.register(Arc::new(MemoryStore));
    registry.register(Arc::new(MemoryRecall));
    registry.register(Arc::new(MemoryForget));
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreArgs {
    text: String,
    key: Option<String>,
    tags: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecallArgs {
    query: Option<String>,
    limit: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ForgetArgs {
    key: String,
}

#[async_trait]
impl Tool for MemoryStore {
    fn name(&self) -> &'static str {
        "memory_store"
    }

    fn capability(&self) -> Option<Capability> {
        None
    }

    fn description(&self) -> &'static str {
        "Remember a text for later (kept across restarts; only you can recall it). Storing a key again replaces that entry."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "text": { "type": "string", "description": "What to remember." },
                "key": { "type": "string", "description": "Optional name for the entry; storing it again replaces it." },
                "tags": { "type": "array", "items": { "type": "string" }, "description": "Optional one-word labels, searched along with the text." }
            },
            "required": ["text"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let args: StoreArgs = decode(self, args)?;
        let entry = NewMemory {
            text: args.text,
            key: args.key,
            tags: args.tags.unwrap_or_default(),
        };
        let stored = ctx
            .process
            .syscalls
            .memory_store(entry)
            .await
            .map_err(refused)?;
        Ok(format!("remembered as entry {}", stored.id))
    }
}

#[async_trait]
impl Tool for MemoryRecall {
    fn name(&self) -> &'static str {
        "memory_recall"
    }

    fn capability(&self) -> Option<Capability> {
        None
    }

    fn description(&self) -> &'static str {
        "Search your memory by words; answers the best matching entries as JSON, best first (no query: the newest)."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "query": { "type": "string", "description": "Words to look for; entries matching more of them rank higher." },
                "limit": { "type": "integer", "minimum": 1, "maximum": MAX_RECALL, "description": "Most entries to answer (default 5)." }
            },
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let args: RecallArgs = decode(self, args)?;
        let limit = match args.limit {
            None => None,
            Some(n @ 1..=MAX_RECALL) => Some(n as usize),
            Some(n) => {
                return Err(invalid(
                    self,
                    format!("field `limit` must be between 1 and {MAX_RECALL}, got {n}"),
                ));
            }
        };
        let hits = ctx
            .process
            .syscalls
            .memory_recall(args.query.as_deref().unwrap_or_default(), limit)
            .await
            .map_err(refused)?;
        to_json(&hits)
    }
}

#[async_trait]
impl Tool for MemoryForget {
    fn name(&self) -> &'static str {
        "memory_forget"
    }

    fn capability(&self) -> Option<Capability> {
        None
    }

    fn description(&self) -> &'static str {
        "Forget the entry of your memory stored under a key (what is no longer true)."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "key": { "type": "string", "description": "The key the entry was stored under." }
            },
            "required": ["key"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let args: ForgetArgs = decode(self, args)?;
        ctx.process
            .syscalls
            .memory_forget(&args.key)
            .await
            .map_err(refused)?;
        Ok(format!("forgot the entry with key {:?}", args.key))
    }
}
