//! `kernel.limits`, both phases: the size of every string, list and map a
//! caller sends.
//!
//! ```json
//! "kernel": {
//!   "limits": { "type_bytes": 128, "reason_bytes": 1024, "model_bytes": 256,
//!               "prompt_bytes": 262144, "payload_bytes": 1048576, "tools": 128,
//!               "metadata_entries": 64, "metadata_bytes": 1024, "command_bytes": 65536 }
//! }
//! ```

use serde::Deserialize;
use serde_json::Value;

use super::ConfigIssue;
use super::parse::section;
use super::validate::in_range;
use crate::limits::InputLimits;

/// Largest payload the kernel can be told to accept: requests carry it
/// whole, so the gRPC server's request limit grows with it.
const MAX_PAYLOAD_BYTES: usize = 16 << 20;

/// `kernel.limits` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawLimits {
    type_bytes: usize,
    reason_bytes: usize,
    model_bytes: usize,
    prompt_bytes: usize,
    payload_bytes: usize,
    tools: usize,
    metadata_entries: usize,
    metadata_bytes: usize,
    command_bytes: usize,
}

impl Default for RawLimits {
    fn default() -> Self {
        let d = InputLimits::default();
        RawLimits {
            type_bytes: d.type_bytes,
            reason_bytes: d.reason_bytes,
            model_bytes: d.model_bytes,
            prompt_bytes: d.prompt_bytes,
            payload_bytes: d.payload_bytes,
            tools: d.tools,
            metadata_entries: d.metadata_entries,
            metadata_bytes: d.metadata_bytes,
            command_bytes: d.command_bytes,
        }
    }
}

/// Parses and checks `kernel.limits`.
pub(super) fn limits(value: Option<&Value>, issues: &mut Vec<ConfigIssue>) -> InputLimits {
    let raw = section::<RawLimits>(value, "kernel.limits", issues).value;
    let ranges = [
        ("type_bytes", raw.type_bytes, 1..=64 << 10),
        ("reason_bytes", raw.reason_bytes, 1..=1 << 20),
        ("model_bytes", raw.model_bytes, 1..=64 << 10),
        ("prompt_bytes", raw.prompt_bytes, 1..=MAX_PAYLOAD_BYTES),
        ("payload_bytes", raw.payload_bytes, 1..=MAX_PAYLOAD_BYTES),
        ("tools", raw.tools, 1..=10_000),
        ("metadata_entries", raw.metadata_entries, 1..=10_000),
        ("metadata_bytes", raw.metadata_bytes, 1..=1 << 20),
        ("command_bytes", raw.command_bytes, 1..=MAX_PAYLOAD_BYTES),
    ];
    for (field, value, range) in ranges {
        in_range(value, range, &format!("kernel.limits.{field}"), issues);
    }
    InputLimits {
        type_bytes: raw.type_bytes,
        reason_bytes: raw.reason_bytes,
        model_bytes: raw.model_bytes,
        prompt_bytes: raw.prompt_bytes,
        payload_bytes: raw.payload_bytes,
        tools: raw.tools,
        metadata_entries: raw.metadata_entries,
        metadata_bytes: raw.metadata_bytes,
        command_bytes: raw.command_bytes,
    }
}
