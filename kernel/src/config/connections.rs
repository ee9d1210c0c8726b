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

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use validator::Validate;

/// How the control plane and the HTTP listeners treat connections
/// (`kernel.connections`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema, Validate)]
#[serde(default, deny_unknown_fields)]
pub struct ConnectionSettings {
    /// Connections open at once.
    #[validate(range(min = 1, max = 1_000_000))]
    pub max: usize,
    /// Time from opening to the first authenticated call.
    #[validate(range(min = 100, max = 600_000))]
    pub handshake_timeout_ms: u64,
    /// An idle connection is pinged this often (HTTP/2 keepalive), so dead
    /// clients' streams end.
    #[validate(range(min = 1, max = 86_400))]
    pub keepalive_interval_seconds: u64,
    /// A ping unanswered this long closes the connection.
    #[validate(range(min = 1, max = 3_600))]
    pub keepalive_timeout_seconds: u64,
    /// Connections open at once on each HTTP listener (the dashboard, the
    /// metrics listener); lowered to a sixteenth of the open-file limit.
    #[validate(range(min = 1, max = 1_000_000))]
    pub http_max: usize,
    /// Time from opening an HTTP connection to the end of its first request
    /// head (TLS handshake included).
    #[validate(range(min = 100, max = 600_000))]
    pub http_header_timeout_ms: u64,
    /// An HTTP connection with no request in flight this long is closed (a
    /// live event stream is a request in flight).
    #[validate(range(min = 100, max = 86_400_000))]
    pub http_idle_timeout_ms: u64,
}

impl ConnectionSettings {
    /// `handshake_timeout_ms`.
    pub fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.handshake_timeout_ms)
    }

    /// `keepalive_interval_seconds`.
    pub fn keepalive_interval(&self) -> Duration {
        Duration::from_secs(self.keepalive_interval_seconds)
    }

    /// `keepalive_timeout_seconds`.
    pub fn keepalive_timeout(&self) -> Duration {
        Duration::from_secs(self.keepalive_timeout_seconds)
    }

    /// `http_header_timeout_ms`.
    pub fn http_header_timeout(&self) -> Duration {
        Duration::from_millis(self.http_header_timeout_ms)
    }

    /// `http_idle_timeout_ms`.
    pub fn http_idle_timeout(&self) -> Duration {
        Duration::from_millis(self.http_idle_timeout_ms)
    }
}

impl Default for ConnectionSettings {
    fn default() -> Self {
        ConnectionSettings {
            max: 1024,
            handshake_timeout_ms: 10_000,
            keepalive_interval_seconds: 30,
            keepalive_timeout_seconds: 10,
            http_max: 256,
            http_header_timeout_ms: 10_000,
            http_idle_timeout_ms: 60_000,
        }
    }
}
