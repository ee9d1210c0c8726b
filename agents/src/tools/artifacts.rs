//! `store_artifact`, `get_artifact` and `list_artifacts`: named results a
//! process keeps in the kernel's store and shares by visibility.
//!
//! Content goes in and out as text; an artifact whose bytes are not UTF-8
//! (stored over gRPC, say) is described but not shown.

use crate::capability::Capability;
use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::args::invalid;
use super::{Tool, ToolContext, ToolError, ToolRegistry, decode, refused, to_json};
use crate::artifact::{ArtifactId, NewArtifact, Visibility};
use crate::process::Pid;

/// Stores (or replaces) an artifact owned by the caller.
#[derive(Debug, Clone, Copy, Default)]
pub struct StoreArtifact;

/// Reads an artifact the caller may see.
#[derive(Debug, Clone, Copy, Default)]
pub struct GetArtifact;

/// Lists the artifacts the caller may see.
#[derive(Debug, Clone, Copy, Default)]
pub struct ListArtifacts;

/// Adds `store_artifact`, `get_artifact` and `list_artifacts`.
pub fn register(registry: &mut ToolRegistry) {
    registry.register(Arc::new(StoreArtifact));
    registry.register(Arc::new(GetArtifact));
    registry.register(Arc::new(ListArtifacts));
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreArgs {
    name: String,
    content: String,
    content_type: Option<String>,
    visibility: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GetArgs {
    id: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    owner: Option<u64>,
}

#[async_trait]
impl Tool for StoreArtifact {
    fn name(&self) -> &'static str {
        "store_artifact"
    }

    fn capability(&self) -> Option<Capability> {
        Some(Capability::WriteArtifact)
    }

    fn description(&self) -> &'static str {
        "Store a named text artifact (a result to keep or share); storing a name again replaces it. Answers its id."
    }

    fn parameters(&self) -> Value {
        let visibilities: Vec<&str> = Visibility::ALL.iter().map(|v| v.as_str()).collect();
        json!({
            "type": "object",
            "properties": {
                "name": { "type": "string", "description": "Its name, unique among your artifacts." },
                "content": { "type": "string", "description": "The text." },
                "content_type": { "type": "string", "description": "MIME type (default text/plain)." },
                "visibility": {
                    "type": "string",
                    "enum": visibilities,
                    "description": "Who may read it: private (you), user (you and the operator; default), subtree (also your ancestors and descendants), global (every process)."
                }
            },
            "required": ["name", "content"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let args: StoreArgs = decode(self, args)?;
        let visibility = args
            .visibility
            .map(|v| v.parse::<Visibility>())
            .transpose()
            .map_err(|why| invalid(self, format!("field `visibility`: {why}")))?;
        let artifact = NewArtifact {
            name: args.name,
            content_type: args.content_type,
            visibility,
            content: args.content.into_bytes(),
        };
        let info = ctx
            .process
            .syscalls
            .store_artifact(artifact)
            .await
            .map_err(refused)?;
        Ok(format!(
            "stored artifact {} ({:?}, {} bytes, {})",
            info.id, info.name, info.size, info.visibility
        ))
    }
}

#[async_trait]
impl Tool for GetArtifact {
    fn name(&self) -> &'static str {
        "get_artifact"
    }

    fn capability(&self) -> Option<Capability> {
        None
    }

    fn description(&self) -> &'static str {
        "Read an artifact by id: its description and text content as JSON."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "id": { "type": "integer", "minimum": 1, "description": "The artifact's id." }
            },
            "required": ["id"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let args: GetArgs = decode(self, args)?;
        let artifact = ctx
            .process
            .syscalls
            .get_artifact(ArtifactId(args.id))
            .await
            .map_err(refused)?;
        let info = artifact.info;
        let content = String::from_utf8(artifact.content).map_err(|_| {
            ToolError::new(format!(
                "artifact {} ({:?}) is {} bytes of {}, not text; it cannot be shown",
                info.id, info.name, info.size, info.content_type
            ))
        })?;
        let mut answer = serde_json::to_value(&info)
            .map_err(|err| ToolError::new(format!("cannot encode answer: {err}")))?;
        answer["content"] = Value::String(content);
        to_json(&answer)
    }
}

#[async_trait]
impl Tool for ListArtifacts {
    fn name(&self) -> &'static str {
        "list_artifacts"
    }

    fn capability(&self) -> Option<Capability> {
        None
    }

    fn description(&self) -> &'static str {
        "List the artifacts you may read, newest first, as JSON (without content); optionally only one owner's."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "owner": { "type": "integer", "minimum": 1, "description": "Only this process's artifacts." }
            },
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let args: ListArgs = decode(self, args)?;
        let listed = ctx
            .process
            .syscalls
            .list_artifacts(args.owner.map(Pid))
            .await
            .map_err(refused)?;
        to_json(&listed)
    }
}
