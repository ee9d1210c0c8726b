//! `kernel.metrics`, `kernel.log`, `kernel.otel` and `kernel.dashboard`,
//! both phases: how operators watch a running kernel.
//!
//! ```json
//! "kernel": {
//!   "metrics": { "listen": "127.0.0.1:9464" },
//!   "dashboard": { "enabled": true, "listen": "127.0.0.1:50052", "hosts": ["kernel.example"] },
//!   "log": { "level": "info,rmcp=warn", "format": "json" },
//!   "otel": { "endpoint": "http://127.0.0.1:4318", "capture_content": false }
//! }
//! ```

use std::net::SocketAddr;

use serde::Deserialize;
use serde_json::Value;

use super::ConfigIssue;
use super::parse::section;
use validator::{Validate, ValidationError};

/// The metrics listener (`kernel.metrics`): `/metrics`, `/healthz`, `/readyz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsSettings {
    /// Where it listens (plain HTTP, no credentials: bind it where only
    /// the scraper reaches).
    pub listen: SocketAddr,
}

/// The web dashboard (`kernel.dashboard`, `--dashboard`, `--no-dashboard`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DashboardSettings {
    /// `None`: on when the control plane listens on loopback.
    pub enabled: Option<bool>,
    /// Where it listens; `None`: the control plane's address with the
    /// next port (50051 -> 50052; port 0 stays 0, any free port).
    #[serde(deserialize_with = "dashboard_address")]
    pub listen: Option<SocketAddr>,
    /// Host names it answers to besides IP addresses and `localhost`
    /// (lower case): a request naming another host in `Host` is refused,
    /// so that a web page cannot reach it through a name of its own that
    /// resolves to the dashboard's address (DNS rebinding).
    pub hosts: Vec<String>,
}

impl DashboardSettings {
    /// Where the dashboard listens beside a control plane on `control`,
    /// and whether it was asked for (a default address that is taken
    /// only warns); `None` when it is off.
    pub fn address(&self, control: SocketAddr) -> Option<(SocketAddr, bool)> {
        let asked = self.enabled == Some(true) || self.listen.is_some();
        let on = self
            .enabled
            .unwrap_or(self.listen.is_some() || control.ip().is_loopback());
        if !on {
            return None;
        }
        let listen = self.listen.unwrap_or_else(|| {
            let port = match control.port() {
                0 => 0,
                port => port.checked_add(1).unwrap_or(0),
            };
            SocketAddr::new(control.ip(), port)
        });
        Some((listen, asked))
    }
}

/// What the kernel logs, and how (`kernel.log`); `RUST_LOG` overrides the
/// level, and `--log-level`/`--log-format` override both settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Validate)]
#[serde(default, deny_unknown_fields)]
pub struct LogSettings {
    /// A `tracing` filter: a level (`debug`) or directives
    /// (`info,hivekernel_kernel=debug`).
    #[validate(custom(function = "log_level_check"))]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(try_from = "String")]
pub enum LogFormat {
    /// Human-readable lines; coloured only on a terminal and never with `NO_COLOR`.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

impl TryFrom<String> for LogFormat {
    type Error = String;

    fn try_from(name: String) -> Result<Self, String> {
        name.parse()
    }
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

fn log_level_check(level: &str) -> Result<(), ValidationError> {
    check_log_level(level)
        .map_err(|problem| ValidationError::new("log_level").with_message(problem.into()))
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

/// `kernel.listen`, or the error naming what an address looks like.
pub(super) fn grpc_address<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<SocketAddr, D::Error> {
    let text = String::deserialize(deserializer)?;
    parse_address(&text, "127.0.0.1:50051").map_err(serde::de::Error::custom)
}

/// A dashboard's `listen`, or the error naming what an address looks like.
fn dashboard_address<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<SocketAddr>, D::Error> {
    let text = String::deserialize(deserializer)?;
    parse_address(&text, "127.0.0.1:50052")
        .map(Some)
        .map_err(serde::de::Error::custom)
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
    let listen = socket_address("kernel.metrics.listen", &listen, "127.0.0.1:9464", issues)?;
    Some(MetricsSettings { listen })
}

/// `text` as an IP:PORT, or an issue at `location` naming it and `example`.
fn socket_address(
    location: &str,
    text: &str,
    example: &str,
    issues: &mut Vec<ConfigIssue>,
) -> Option<SocketAddr> {
    parse_address(text, example)
        .map_err(|problem| issues.push(ConfigIssue::new(location, problem)))
        .ok()
}

/// `text` as an IP:PORT, or what is wrong, naming it and `example`.
fn parse_address(text: &str, example: &str) -> Result<SocketAddr, String> {
    text.parse::<SocketAddr>().map_err(|_| {
        format!(
            "invalid socket address {} (expected IP:PORT, such as {example})",
            hivekernel_agents::text::shown(text)
        )
    })
}

/// Checks `kernel.dashboard` beyond its types: `listen` only while it is
/// on, and `hosts` host names (lowercased).
pub(super) fn check_dashboard(dashboard: &mut DashboardSettings, issues: &mut Vec<ConfigIssue>) {
    if dashboard.enabled == Some(false) && dashboard.listen.is_some() {
        issues.push(ConfigIssue::new(
            "kernel.dashboard.listen",
            "is given while kernel.dashboard.enabled is false: drop one of them",
        ));
    }
    for (at, host) in dashboard.hosts.iter_mut().enumerate() {
        let valid = !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
        if valid {
            host.make_ascii_lowercase();
        } else {
            issues.push(ConfigIssue::new(
                format!("kernel.dashboard.hosts[{at}]"),
                format!(
                    "{} is not a host name: give a name such as \"kernel.example\" (letters, digits, '-', '.', no port)",
                    hivekernel_agents::text::shown(host)
                ),
            ));
        }
    }
}

/// OpenTelemetry trace export (`kernel.otel`, or the standard
/// `OTEL_EXPORTER_OTLP_*` variables, which win as `RUST_LOG` does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtelSettings {
    /// The collector's base URL (`/v1/traces` is added for OTLP/HTTP);
    /// `None`: the exporter reads `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` itself.
    pub endpoint: Option<String>,
    /// How spans are sent.
    pub protocol: OtelProtocol,
    /// Whether spans carry message contents (prompts, answers, tool
    /// results): off unless asked for, as they may hold anything.
    pub capture_content: bool,
}

/// The OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OtelProtocol {
    /// Protobuf over HTTP (port 4318), the OpenTelemetry default.
    #[default]
    HttpProtobuf,
    /// gRPC (port 4317).
    Grpc,
}

impl OtelProtocol {
    /// As `OTEL_EXPORTER_OTLP_PROTOCOL` writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            OtelProtocol::HttpProtobuf => "http/protobuf",
            OtelProtocol::Grpc => "grpc",
        }
    }
}

impl std::str::FromStr for OtelProtocol {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "http/protobuf" => Ok(OtelProtocol::HttpProtobuf),
            "grpc" => Ok(OtelProtocol::Grpc),
            "http/json" => Err("http/json is not supported (use http/protobuf or grpc)".to_owned()),
            other => Err(format!(
                "unknown OTLP protocol {} (expected http/protobuf or grpc)",
                hivekernel_agents::text::shown(other)
            )),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawOtel {
    endpoint: Option<String>,
    protocol: Option<String>,
    capture_content: Option<bool>,
}

const ENDPOINT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];
const PROTOCOL_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
];

/// Parses `kernel.otel` with the standard variables; `None` when traces
/// are not exported (neither names an endpoint, or `OTEL_SDK_DISABLED=true`
/// or `OTEL_TRACES_EXPORTER=none`).
pub(super) fn otel(
    value: Option<&Value>,
    env: &dyn Fn(&str) -> Option<String>,
    issues: &mut Vec<ConfigIssue>,
) -> Option<OtelSettings> {
    let section = section::<RawOtel>(value, "kernel.otel", issues);
    let raw = section.value;
    let set = |name: &str| env(name).filter(|value| !value.trim().is_empty());
    if set("OTEL_SDK_DISABLED").is_some_and(|value| value.trim().eq_ignore_ascii_case("true")) {
        return None;
    }
    match set("OTEL_TRACES_EXPORTER").map(|value| value.trim().to_ascii_lowercase()) {
        Some(value) if value == "none" => return None,
        Some(value) if value != "otlp" => {
            issues.push(ConfigIssue::new(
                "OTEL_TRACES_EXPORTER",
                format!(
                    "unsupported exporter {} (hivekernel exports traces over otlp, or none)",
                    hivekernel_agents::text::shown(&value)
                ),
            ));
            return None;
        }
        _ => {}
    }
    let from_env = ENDPOINT_VARS
        .iter()
        .find_map(|name| set(name).map(|value| (*name, value)));
    let mut ok = true;
    let endpoint = match (&from_env, raw.endpoint) {
        (Some((name, url)), _) => {
            ok &= check_endpoint(name, url, issues);
            None
        }
        (None, Some(url)) => {
            ok &= check_endpoint("kernel.otel.endpoint", &url, issues);
            Some(url)
        }
        (None, None) => {
            if value.is_some_and(|value| !value.is_null()) {
                issues.push(ConfigIssue::new(
                    "kernel.otel.endpoint",
                    "is required when kernel.otel is given (such as http://127.0.0.1:4318), \
                     unless OTEL_EXPORTER_OTLP_ENDPOINT is set",
                ));
            }
            return None;
        }
    };
    let protocol = match PROTOCOL_VARS
        .iter()
        .find_map(|name| set(name).map(|value| (*name, value)))
    {
        Some((name, value)) => parse_protocol(name, &value, issues),
        None => match raw.protocol {
            Some(value) => parse_protocol("kernel.otel.protocol", &value, issues),
            None => Some(OtelProtocol::default()),
        },
    };
    let capture_content = raw.capture_content.unwrap_or_else(|| {
        set("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
            .is_some_and(|value| value.trim().eq_ignore_ascii_case("true"))
    });
    let protocol = protocol?;
    ok.then_some(OtelSettings {
        endpoint,
        protocol,
        capture_content,
    })
}

fn parse_protocol(name: &str, value: &str, issues: &mut Vec<ConfigIssue>) -> Option<OtelProtocol> {
    value
        .parse()
        .inspect_err(|problem: &String| issues.push(ConfigIssue::new(name, problem.clone())))
        .ok()
}

/// An endpoint is an http or https URL with a host.
fn check_endpoint(name: &str, url: &str, issues: &mut Vec<ConfigIssue>) -> bool {
    let parsed = reqwest::Url::parse(url.trim());
    let ok = parsed
        .as_ref()
        .is_ok_and(|url| matches!(url.scheme(), "http" | "https") && url.host().is_some());
    if !ok {
        issues.push(ConfigIssue::new(
            name,
            format!(
                "invalid endpoint {} (expected an http or https URL, such as http://127.0.0.1:4318)",
                hivekernel_agents::text::shown(url)
            ),
        ));
    }
    ok
}
