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

use serde::Deserialize;
use serde_json::Value;

use super::ConfigIssue;
use super::parse::section;
use super::validate::in_range;

/// Storage quotas (`kernel.storage`): on the whole store, and on each
/// subtree below PID 1, over the artifacts, memory and skills its
/// processes keep (alive or gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorageSettings {
    /// Most bytes the store file may hold in use; a write of artifacts,
    /// memory or skills that would pass it is refused.
    pub max_bytes: u64,
    /// The quota of a subtree whose root, a child of PID 1, sets no
    /// `max_storage_bytes` of its own.
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArtifactSettings {
    /// Largest content of one artifact, in bytes.
    pub max_bytes: u64,
    /// Most bytes the artifacts of one owner may total.
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemorySettings {
    /// Largest entry (text, key and tags), in bytes.
    pub max_entry_bytes: u64,
    /// Most bytes one process's entries may total.
    pub max_bytes_per_agent: u64,
    /// Most entries one recall returns.
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TranscriptSettings {
    /// Whether turns are recorded at all.
    pub enabled: bool,
    /// Keep a process's transcript after it is reaped (until age or size
    /// prunes it); by default it goes with the process's other state.
    pub keep_after_exit: bool,
    /// Entries older than this many hours are pruned.
    pub max_age_hours: u64,
    /// Most bytes one process's transcript keeps; its oldest entries go first.
    pub max_bytes_per_process: u64,
    /// Most bytes all transcripts keep together; the oldest entries go first.
    pub max_bytes_total: u64,
    /// Longest text one entry keeps (an input, an answer, a tool result or
    /// its arguments); longer ones are cut, with the marker.
    pub max_text_bytes: usize,
    /// Entries a kernel without a store keeps in memory, of all processes.
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

/// Largest artifact the kernel accepts at all (gRPC messages grow with it).
const MAX_ARTIFACT_BYTES: u64 = 64 << 20;
/// Ceiling on any per-owner or per-agent total.
const MAX_TOTAL_BYTES: u64 = 1 << 40;

/// `kernel.storage` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawStorage {
    max_bytes: u64,
    max_bytes_per_subtree: u64,
}

impl Default for RawStorage {
    fn default() -> Self {
        let defaults = StorageSettings::default();
        RawStorage {
            max_bytes: defaults.max_bytes,
            max_bytes_per_subtree: defaults.max_bytes_per_subtree,
        }
    }
}

/// `kernel.artifacts` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawArtifacts {
    max_bytes: u64,
    max_bytes_per_owner: u64,
}

impl Default for RawArtifacts {
    fn default() -> Self {
        let defaults = ArtifactSettings::default();
        RawArtifacts {
            max_bytes: defaults.max_bytes,
            max_bytes_per_owner: defaults.max_bytes_per_owner,
        }
    }
}

/// `kernel.memory` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawMemory {
    max_entry_bytes: u64,
    max_bytes_per_agent: u64,
    max_results: u32,
}

impl Default for RawMemory {
    fn default() -> Self {
        let defaults = MemorySettings::default();
        RawMemory {
            max_entry_bytes: defaults.max_entry_bytes,
            max_bytes_per_agent: defaults.max_bytes_per_agent,
            max_results: defaults.max_results,
        }
    }
}

/// `kernel.transcripts` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawTranscripts {
    enabled: bool,
    keep_after_exit: bool,
    max_age_hours: u64,
    max_bytes_per_process: u64,
    max_bytes_total: u64,
    max_text_bytes: u64,
    memory_entries: u64,
}

impl Default for RawTranscripts {
    fn default() -> Self {
        let defaults = TranscriptSettings::default();
        RawTranscripts {
            enabled: defaults.enabled,
            keep_after_exit: defaults.keep_after_exit,
            max_age_hours: defaults.max_age_hours,
            max_bytes_per_process: defaults.max_bytes_per_process,
            max_bytes_total: defaults.max_bytes_total,
            max_text_bytes: defaults.max_text_bytes as u64,
            memory_entries: defaults.memory_entries as u64,
        }
    }
}

/// Parses and checks `kernel.transcripts`.
pub(super) fn transcripts(
    value: Option<&Value>,
    issues: &mut Vec<ConfigIssue>,
) -> TranscriptSettings {
    let raw = section::<RawTranscripts>(value, "kernel.transcripts", issues).value;
    let at = |field: &str| format!("kernel.transcripts.{field}");
    in_range(
        raw.max_age_hours,
        1..=100 * 365 * 24,
        &at("max_age_hours"),
        issues,
    );
    in_range(
        raw.max_bytes_per_process,
        64 << 10..=MAX_TOTAL_BYTES,
        &at("max_bytes_per_process"),
        issues,
    );
    in_range(
        raw.max_bytes_total,
        1 << 20..=MAX_TOTAL_BYTES,
        &at("max_bytes_total"),
        issues,
    );
    in_range(
        raw.max_text_bytes,
        256..=1 << 20,
        &at("max_text_bytes"),
        issues,
    );
    in_range(
        raw.memory_entries,
        100..=1_000_000,
        &at("memory_entries"),
        issues,
    );
    TranscriptSettings {
        enabled: raw.enabled,
        keep_after_exit: raw.keep_after_exit,
        max_age_hours: raw.max_age_hours,
        max_bytes_per_process: raw.max_bytes_per_process,
        max_bytes_total: raw.max_bytes_total,
        max_text_bytes: usize::try_from(raw.max_text_bytes).unwrap_or(usize::MAX),
        memory_entries: usize::try_from(raw.memory_entries).unwrap_or(usize::MAX),
    }
}

/// Parses and checks `kernel.storage`.
pub(super) fn storage(value: Option<&Value>, issues: &mut Vec<ConfigIssue>) -> StorageSettings {
    let raw = section::<RawStorage>(value, "kernel.storage", issues).value;
    in_range(
        raw.max_bytes,
        1 << 20..=MAX_TOTAL_BYTES,
        "kernel.storage.max_bytes",
        issues,
    );
    in_range(
        raw.max_bytes_per_subtree,
        1..=MAX_TOTAL_BYTES,
        "kernel.storage.max_bytes_per_subtree",
        issues,
    );
    StorageSettings {
        max_bytes: raw.max_bytes,
        max_bytes_per_subtree: raw.max_bytes_per_subtree,
    }
}

/// Parses and checks `kernel.artifacts`.
pub(super) fn artifacts(value: Option<&Value>, issues: &mut Vec<ConfigIssue>) -> ArtifactSettings {
    let raw = section::<RawArtifacts>(value, "kernel.artifacts", issues).value;
    let at = "kernel.artifacts.";
    in_range(
        raw.max_bytes,
        1..=MAX_ARTIFACT_BYTES,
        &format!("{at}max_bytes"),
        issues,
    );
    in_range(
        raw.max_bytes_per_owner,
        1..=MAX_TOTAL_BYTES,
        &format!("{at}max_bytes_per_owner"),
        issues,
    );
    ArtifactSettings {
        max_bytes: raw.max_bytes,
        max_bytes_per_owner: raw.max_bytes_per_owner,
    }
}

/// Parses and checks `kernel.memory`.
pub(super) fn memory(value: Option<&Value>, issues: &mut Vec<ConfigIssue>) -> MemorySettings {
    let raw = section::<RawMemory>(value, "kernel.memory", issues).value;
    let at = "kernel.memory.";
    in_range(
        raw.max_entry_bytes,
        1..=1 << 20,
        &format!("{at}max_entry_bytes"),
        issues,
    );
    in_range(
        raw.max_bytes_per_agent,
        1..=MAX_TOTAL_BYTES,
        &format!("{at}max_bytes_per_agent"),
        issues,
    );
    in_range(
        raw.max_results,
        1..=1000,
        &format!("{at}max_results"),
        issues,
    );
    MemorySettings {
        max_entry_bytes: raw.max_entry_bytes,
        max_bytes_per_agent: raw.max_bytes_per_agent,
        max_results: raw.max_results,
    }
}
