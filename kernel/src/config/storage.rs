//! `kernel.storage`, `kernel.artifacts`, `kernel.memory` and
//! `kernel.transcripts`, both phases: size limits on what processes keep in
//! the store.
//!
//! ```json
//! "kernel": {
//!   "storage": { "max_bytes": 8589934592, "max_bytes_per_subtree": 1073741824 },
//!   "artifacts": { "max_bytes": 1048576, "max_bytes_per_owner": 67108864 },
//!   "memory": { "max_entry_bytes": 16384, "max_bytes_per_agent": 1048576, "max_results": 20 },
//!   "transcripts": { "enabled": true, "keep_after_exit": false, "max_age_hours": 168,
//!                    "max_bytes_per_process": 16777216, "max_bytes_total": 1073741824,
//!                    "max_text_bytes": 16384, "memory_entries": 10000 }
//! }
//! ```

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use validator::Validate;

/// Largest artifact the kernel accepts at all (gRPC messages grow with it).
const MAX_ARTIFACT_BYTES: u64 = 64 << 20;
/// Ceiling on any per-owner or per-agent total.
const MAX_TOTAL_BYTES: u64 = 1 << 40;

/// Storage quotas (`kernel.storage`): on the whole store, and on each
/// subtree below PID 1, over the artifacts, memory and skills its
/// processes keep (alive or gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema, Validate)]
#[serde(default, deny_unknown_fields)]
pub struct StorageSettings {
    /// Most bytes the store file may hold in use (its pages, free ones not
    /// counted); a write of artifacts, memory or skills that would pass it
    /// is refused, whoever makes it.
    #[validate(range(min = 1_048_576, max = MAX_TOTAL_BYTES))]
    pub max_bytes: u64,
    /// The quota of each subtree whose root, a child of PID 1, sets no
    /// [`limits.max_storage_bytes`](#limits) of its own. What PID 1 itself
    /// (the operator) stores counts toward `max_bytes` only.
    #[validate(range(min = 1, max = MAX_TOTAL_BYTES))]
    pub max_bytes_per_subtree: u64,
}

impl Default for StorageSettings {
    fn default() -> Self {
        StorageSettings {
            max_bytes: 8 << 30,
            max_bytes_per_subtree: 1 << 30,
        }
    }
}

/// Size limits on artifacts (`kernel.artifacts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema, Validate)]
#[serde(default, deny_unknown_fields)]
pub struct ArtifactSettings {
    /// Largest content of one artifact; a larger store is refused
    /// (RESOURCE_EXHAUSTED) and changes nothing. The gRPC server accepts
    /// requests this large (plus 64 KiB).
    #[validate(range(min = 1, max = MAX_ARTIFACT_BYTES))]
    pub max_bytes: u64,
    /// Most bytes the artifacts of one process may total; a store past it
    /// is refused (replacing an artifact counts its new size, not both).
    #[validate(range(min = 1, max = MAX_TOTAL_BYTES))]
    pub max_bytes_per_owner: u64,
}

impl Default for ArtifactSettings {
    fn default() -> Self {
        ArtifactSettings {
            max_bytes: 1 << 20,
            max_bytes_per_owner: 64 << 20,
        }
    }
}

/// Size limits on agent memory (`kernel.memory`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema, Validate)]
#[serde(default, deny_unknown_fields)]
pub struct MemorySettings {
    /// Largest memory entry: its text, key and tags together.
    #[validate(range(min = 1, max = 1_048_576))]
    pub max_entry_bytes: u64,
    /// Most bytes one process's memory may hold; a store past it is refused
    /// (replacing an entry by key counts its new size only).
    #[validate(range(min = 1, max = MAX_TOTAL_BYTES))]
    pub max_bytes_per_agent: u64,
    /// Most entries one `memory_recall` answers (it answers 5 unless asked
    /// for more).
    #[validate(range(min = 1, max = 1000))]
    pub max_results: u32,
}

impl Default for MemorySettings {
    fn default() -> Self {
        MemorySettings {
            max_entry_bytes: 16 << 10,
            max_bytes_per_agent: 1 << 20,
            max_results: 20,
        }
    }
}

/// What transcripts keep, and for how long (`kernel.transcripts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema, Validate)]
#[serde(default, deny_unknown_fields)]
pub struct TranscriptSettings {
    /// Record every turn of every agent.
    pub enabled: bool,
    /// Keep a process's transcript after it is reaped (the admin can still
    /// read it; ages and sizes still prune it). By default it goes with the
    /// process's other state.
    pub keep_after_exit: bool,
    /// Entries older than this are pruned (checked once a minute).
    #[validate(range(min = 1, max = 876_000))]
    pub max_age_hours: u64,
    /// Most one process's transcript keeps; past it, its oldest entries go
    /// until it is a tenth under.
    #[validate(range(min = 65_536, max = MAX_TOTAL_BYTES))]
    pub max_bytes_per_process: u64,
    /// Most all transcripts keep together; past it, the oldest entries go
    /// until a tenth under.
    #[validate(range(min = 1_048_576, max = MAX_TOTAL_BYTES))]
    pub max_bytes_total: u64,
    /// Longest text one entry keeps (an input, an answer, a tool result, a
    /// tool call's arguments); longer ones are cut with
    /// `… [cut: N bytes in all]`.
    #[validate(range(min = 256, max = 1_048_576))]
    pub max_text_bytes: usize,
    /// Entries a kernel without a store keeps in memory, of all processes.
    #[validate(range(min = 100, max = 1_000_000))]
    pub memory_entries: usize,
}

impl Default for TranscriptSettings {
    fn default() -> Self {
        TranscriptSettings {
            enabled: true,
            keep_after_exit: false,
            max_age_hours: 7 * 24,
            max_bytes_per_process: 16 << 20,
            max_bytes_total: 1 << 30,
            max_text_bytes: 16 << 10,
            memory_entries: 10_000,
        }
    }
}
