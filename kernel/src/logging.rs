//! Where log records go and how they read: stderr, as text or as one JSON
//! object per line.
//!
//! The filter is, first that is set: `RUST_LOG`, `--log-level`, the
//! config's `kernel.log.level` (for `start`), then
//! [`DEFAULT_LOG_LEVEL`](crate::config::DEFAULT_LOG_LEVEL). The format: `--log-format`, `kernel.log.format`,
//! then text. Text is coloured only when stderr is a terminal and
//! `NO_COLOR` is unset or empty (<https://no-color.org>).

use std::io::IsTerminal;
use std::path::Path;

use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, LogSettings};

/// Installs the global subscriber: `level` and `format` as the command
/// line gives them, else as the config at `config` sets them (`start`).
pub fn init(level: Option<&str>, format: Option<&str>, config: Option<&Path>) {
    let configured = config.map(configured).unwrap_or_default();
    let level = level.map_or(configured.level, str::to_owned);
    let format = format
        .and_then(|format| format.parse().ok())
        .unwrap_or(configured.format);
    let filter = match std::env::var("RUST_LOG") {
        Ok(value) if !value.trim().is_empty() => EnvFilter::try_new(&value).unwrap_or_else(|err| {
            eprintln!("warning: RUST_LOG={value:?} is not a log filter ({err}); using {level:?}");
            EnvFilter::new(&level)
        }),
        _ => EnvFilter::new(&level),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(colour()).init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .init(),
    }
}

/// The config's `kernel.log`, read on its own before anything else (so
/// the start is logged as configured); a config that cannot be read gives
/// the defaults here, and its problem is reported when `start` loads it.
fn configured(path: &Path) -> LogSettings {
    crate::files::read_capped(path, crate::config::MAX_CONFIG_BYTES)
        .ok()
        .and_then(|bytes| crate::config::log_settings(&bytes))
        .unwrap_or_default()
}

/// Whether text may carry colour codes.
fn colour() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_default_filter_is_valid() {
        assert!(crate::config::check_log_level(crate::config::DEFAULT_LOG_LEVEL).is_ok());
    }
}
