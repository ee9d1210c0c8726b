//! `kernel.connections`, both phases: how the control plane treats TCP
//! connections before and after they speak.
//!
//! ```json
//! "kernel": {
//!   "connections": { "max": 1024, "handshake_timeout_ms": 10000,
//!                    "keepalive_interval_seconds": 30, "keepalive_timeout_seconds": 10 }
//! }
//! ```

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::ConfigIssue;
use super::parse::section;
use super::validate::in_range;

/// How the control plane treats connections (`kernel.connections`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionSettings {
    /// Connections open at once, those that have not spoken yet included.
    pub max: usize,
    /// A connection that has made no authenticated call this long after it opens is closed.
    pub handshake_timeout: Duration,
    /// An idle connection is pinged this often (HTTP/2 keepalive).
    pub keepalive_interval: Duration,
    /// A ping unanswered this long closes the connection.
    pub keepalive_timeout: Duration,
}

impl Default for ConnectionSettings {
    fn default() -> Self {
        ConnectionSettings {
            max: 1024,
            handshake_timeout: Duration::from_secs(10),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
        }
    }
}

/// `kernel.connections` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawConnections {
    max: usize,
    handshake_timeout_ms: u64,
    keepalive_interval_seconds: u64,
    keepalive_timeout_seconds: u64,
}

impl Default for RawConnections {
    fn default() -> Self {
        let d = ConnectionSettings::default();
        RawConnections {
            max: d.max,
            handshake_timeout_ms: d.handshake_timeout.as_millis() as u64,
            keepalive_interval_seconds: d.keepalive_interval.as_secs(),
            keepalive_timeout_seconds: d.keepalive_timeout.as_secs(),
        }
    }
}

/// Parses and checks `kernel.connections`.
pub(super) fn connections(
    value: Option<&Value>,
    issues: &mut Vec<ConfigIssue>,
) -> ConnectionSettings {
    let raw = section::<RawConnections>(value, "kernel.connections", issues).value;
    let at = |field: &str| format!("kernel.connections.{field}");
    in_range(raw.max, 1..=1_000_000, &at("max"), issues);
    in_range(
        raw.handshake_timeout_ms,
        100..=600_000,
        &at("handshake_timeout_ms"),
        issues,
    );
    in_range(
        raw.keepalive_interval_seconds,
        1..=86_400,
        &at("keepalive_interval_seconds"),
        issues,
    );
    in_range(
        raw.keepalive_timeout_seconds,
        1..=3_600,
        &at("keepalive_timeout_seconds"),
        issues,
    );
    ConnectionSettings {
        max: raw.max,
        handshake_timeout: Duration::from_millis(raw.handshake_timeout_ms),
        keepalive_interval: Duration::from_secs(raw.keepalive_interval_seconds),
        keepalive_timeout: Duration::from_secs(raw.keepalive_timeout_seconds),
    }
}
