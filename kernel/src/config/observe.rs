//! `kernel.metrics` and `kernel.log`, both phases: how operators watch a
//! running kernel.
//!
//! ```json
//! "kernel": {
//!   "metrics": { "listen": "127.0.0.1:9464" },
//!   "log": { "level": "info,rmcp=warn", "format": "json" }
//! }
//! ```

use std::net::SocketAddr;

use serde::Deserialize;
use serde_json::Value;

use super::ConfigIssue;
use super::parse::section;

/// The metrics listener (`kernel.metrics`): `/metrics`, `/healthz`, `/readyz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsSettings {
    /// Where it listens (plain HTTP, no credentials: bind it where only
    /// the scraper reaches).
    pub listen: SocketAddr,
}

/// What the kernel logs, and how (`kernel.log`); `RUST_LOG` overrides the
/// level, and `--log-level`/`--log-format` override both settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// A `tracing` filter: a level (`debug`) or directives
    /// (`info,hivekernel_kernel=debug`).
    pub level: String,
    /// One line of text per record, or one JSON object.
    pub format: LogFormat,
}

/// What the kernel logs unless told otherwise: the kernel at info; the MCP
/// SDK only when something goes wrong (its info lines narrate every
/// session, which the kernel already reports as `mcp_server` events).
pub const DEFAULT_LOG_LEVEL: &str = "info,rmcp=warn";

impl Default for LogSettings {
    fn default() -> Self {
        LogSettings {
            level: DEFAULT_LOG_LEVEL.to_owned(),
            format: LogFormat::Text,
        }
    }
}

/// How log records are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines; coloured only on a terminal and never with `NO_COLOR`.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!(
                "unknown log format {} (expected text or json)",
                hivekernel_agents::text::shown(other)
            )),
        }
    }
}

/// Checks a log filter as `tracing` will read it.
pub fn check_log_level(level: &str) -> Result<(), String> {
    if level.trim().is_empty() {
        return Err("must not be empty (try info, or debug)".to_owned());
    }
    // `tracing` reads a bare word as a target at every level, so a typo
    // such as `verbose` would silently log nothing: a bare word must be a
    // level here (a target is written `target=level`).
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    if let Some(word) = level.split(',').map(str::trim).find(|directive| {
        !directive.is_empty()
            && !directive.contains(['=', '['])
            && !LEVELS.contains(&directive.to_ascii_lowercase().as_str())
    }) {
        return Err(format!(
            "unknown log level {} (expected off, error, warn, info, debug or trace; a target is written target=level)",
            hivekernel_agents::text::shown(word)
        ));
    }
    tracing_subscriber::EnvFilter::builder()
        .parse(level)
        .map(drop)
        .map_err(|err| {
            format!(
                "invalid log filter {}: {err} (a level such as info or debug, or directives such as info,hivekernel_kernel=debug)",
                hivekernel_agents::text::shown(level)
            )
        })
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawMetrics {
    listen: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawLog {
    level: Option<String>,
    format: Option<String>,
}

/// Parses and checks `kernel.metrics`; `None` when absent (no listener).
pub(super) fn metrics(
    value: Option<&Value>,
    issues: &mut Vec<ConfigIssue>,
) -> Option<MetricsSettings> {
    let section = section::<RawMetrics>(value, "kernel.metrics", issues);
    if value.is_none_or(Value::is_null) || !section.is_ok("listen") {
        return None;
    }
    let Some(listen) = section.value.listen else {
        issues.push(ConfigIssue::new(
            "kernel.metrics.listen",
            "is required when kernel.metrics is given (such as 127.0.0.1:9464)",
        ));
        return None;
    };
    match listen.parse::<SocketAddr>() {
        Ok(listen) => Some(MetricsSettings { listen }),
        Err(_) => {
            issues.push(ConfigIssue::new(
                "kernel.metrics.listen",
                format!(
                    "invalid socket address {} (expected IP:PORT, such as 127.0.0.1:9464)",
                    hivekernel_agents::text::shown(&listen)
                ),
            ));
            None
        }
    }
}

/// Parses and checks `kernel.log`.
pub(super) fn log(value: Option<&Value>, issues: &mut Vec<ConfigIssue>) -> LogSettings {
    let raw = section::<RawLog>(value, "kernel.log", issues).value;
    let mut settings = LogSettings::default();
    if let Some(level) = raw.level {
        match check_log_level(&level) {
            Ok(()) => settings.level = level,
            Err(problem) => issues.push(ConfigIssue::new("kernel.log.level", problem)),
        }
    }
    if let Some(format) = raw.format {
        match format.parse() {
            Ok(format) => settings.format = format,
            Err(problem) => issues.push(ConfigIssue::new("kernel.log.format", problem)),
        }
    }
    settings
}
