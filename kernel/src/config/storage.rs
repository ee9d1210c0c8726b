//! `kernel.artifacts` and `kernel.memory`, both phases: size limits on what
//! processes keep in the store.
//!
//! ```json
//! "kernel": {
//!   "artifacts": { "max_bytes": 1048576, "max_bytes_per_owner": 67108864 },
//!   "memory": { "max_entry_bytes": 16384, "max_bytes_per_agent": 1048576, "max_results": 20 }
//! }
//! ```

use serde::Deserialize;
use serde_json::Value;

use super::ConfigIssue;
use super::parse::section;
use super::validate::in_range;

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

/// Largest artifact the kernel accepts at all (gRPC messages grow with it).
const MAX_ARTIFACT_BYTES: u64 = 64 << 20;
/// Ceiling on any per-owner or per-agent total.
const MAX_TOTAL_BYTES: u64 = 1 << 40;

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
