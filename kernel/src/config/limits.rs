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

use serde_json::Value;

use super::ConfigIssue;
use super::parse::section;
use super::validate::in_range;
use crate::limits::InputLimits;

/// Largest payload the kernel can be told to accept: requests carry it
/// whole, so the gRPC server's request limit grows with it.
const MAX_PAYLOAD_BYTES: usize = 16 << 20;

/// Parses and checks `kernel.limits`.
pub(super) fn limits(value: Option<&Value>, issues: &mut Vec<ConfigIssue>) -> InputLimits {
    // Written as the settings are: every field a size, none a unit to convert.
    let limits = section::<InputLimits>(value, "kernel.limits", issues).value;
    let ranges = [
        ("type_bytes", limits.type_bytes, 1..=64 << 10),
        ("reason_bytes", limits.reason_bytes, 1..=1 << 20),
        ("model_bytes", limits.model_bytes, 1..=64 << 10),
        ("prompt_bytes", limits.prompt_bytes, 1..=MAX_PAYLOAD_BYTES),
        ("payload_bytes", limits.payload_bytes, 1..=MAX_PAYLOAD_BYTES),
        ("tools", limits.tools, 1..=10_000),
        ("metadata_entries", limits.metadata_entries, 1..=10_000),
        ("metadata_bytes", limits.metadata_bytes, 1..=1 << 20),
        ("command_bytes", limits.command_bytes, 1..=MAX_PAYLOAD_BYTES),
    ];
    for (field, value, range) in ranges {
        in_range(value, range, &format!("kernel.limits.{field}"), issues);
    }
    limits
}
