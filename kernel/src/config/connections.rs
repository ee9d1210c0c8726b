//! `kernel.connections`, both phases: how the control plane and the HTTP
//! listeners treat TCP connections before and after they speak.
//!
//! ```json
//! "kernel": {
//!   "connections": { "max": 1024, "handshake_timeout_ms": 10000,
//!                    "keepalive_interval_seconds": 30, "keepalive_timeout_seconds": 10,
//!                    "http_max": 256, "http_header_timeout_ms": 10000,
//!                    "http_idle_timeout_ms": 60000 }
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
    /// Connections open at once on each HTTP listener (the dashboard,
    /// `/metrics`); lowered to a sixteenth of the open-file limit.
    pub http_max: usize,
    /// An HTTP connection whose first request head has not arrived whole
    /// this long after it opens is closed.
    pub http_header_timeout: Duration,
    /// An HTTP connection with no request in flight this long is closed.
    pub http_idle_timeout: Duration,
}

impl Default for ConnectionSettings {
    fn default() -> Self {
        ConnectionSettings {
            max: 1024,
            handshake_timeout: Duration::from_secs(10),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            http_max: 256,
            http_header_timeout: Duration::from_secs(10),
            http_idle_timeout: Duration::from_secs(60),
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
    http_max: usize,
    http_header_timeout_ms: u64,
    http_idle_timeout_ms: u64,
}

impl Default for RawConnections {
    fn default() -> Self {
        let d = ConnectionSettings::default();
        RawConnections {
            max: d.max,
            handshake_timeout_ms: d.handshake_timeout.as_millis() as u64,
            keepalive_interval_seconds: d.keepalive_interval.as_secs(),
            keepalive_timeout_seconds: d.keepalive_timeout.as_secs(),
            http_max: d.http_max,
            http_header_timeout_ms: d.http_header_timeout.as_millis() as u64,
            http_idle_timeout_ms: d.http_idle_timeout.as_millis() as u64,
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
    in_range(raw.http_max, 1..=1_000_000, &at("http_max"), issues);
    in_range(
        raw.http_header_timeout_ms,
        100..=600_000,
        &at("http_header_timeout_ms"),
        issues,
    );
    in_range(
        raw.http_idle_timeout_ms,
        100..=86_400_000,
        &at("http_idle_timeout_ms"),
        issues,
    );
    ConnectionSettings {
        max: raw.max,
        handshake_timeout: Duration::from_millis(raw.handshake_timeout_ms),
        keepalive_interval: Duration::from_secs(raw.keepalive_interval_seconds),
        keepalive_timeout: Duration::from_secs(raw.keepalive_timeout_seconds),
        http_max: raw.http_max,
        http_header_timeout: Duration::from_millis(raw.http_header_timeout_ms),
        http_idle_timeout: Duration::from_millis(raw.http_idle_timeout_ms),
    }
}
