//! `kernel.notify`: the inbox's webhook (see crate::notify).
//!
//! ```json
//! "kernel": {
//!   "notify": { "url_env": "HIVEKERNEL_NOTIFY_URL",
//!               "headers_env": { "Authorization": "HIVEKERNEL_NOTIFY_AUTH" },
//!               "timeout_seconds": 10, "retries": 3 }
//! }
//! ```
//!
//! The URL is given as `url` or read from the variable `url_env` names (a
//! chat webhook's URL is itself a secret); header values are always read
//! from the environment. Both are read when the config is loaded, and a
//! missing variable is a config error, like a URL that is not one or
//! names an address `web_fetch`'s rules refuse.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::ConfigIssue;
use super::parse::section;
use super::validate::in_range;
use crate::notify::NotifySettings;

/// `kernel.notify` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawNotify {
    url: Option<String>,
    url_env: Option<String>,
    headers_env: BTreeMap<String, String>,
    allow_private_networks: bool,
    allow_addresses: Vec<IpAddr>,
    timeout_seconds: u64,
    retries: u32,
}

impl Default for RawNotify {
    fn default() -> Self {
        RawNotify {
            url: None,
            url_env: None,
            headers_env: BTreeMap::new(),
            allow_private_networks: false,
            allow_addresses: Vec::new(),
            timeout_seconds: 10,
            retries: 3,
        }
    }
}

/// The value of the environment variable `name`, or an issue at `location`.
fn from_env(
    env: &dyn Fn(&str) -> Option<String>,
    name: &str,
    location: &str,
    issues: &mut Vec<ConfigIssue>,
) -> Option<String> {
    match env(name) {
        Some(value) if !value.trim().is_empty() => Some(value),
        Some(_) => {
            issues.push(ConfigIssue::new(
                location,
                format!("environment variable {name} is empty"),
            ));
            None
        }
        None => {
            issues.push(ConfigIssue::new(
                location,
                format!("environment variable {name} is not set"),
            ));
            None
        }
    }
}

/// Parses and checks `kernel.notify`; `env` reads the variables it names.
pub(super) fn notify(
    value: Option<&Value>,
    env: &dyn Fn(&str) -> Option<String>,
    issues: &mut Vec<ConfigIssue>,
) -> Option<NotifySettings> {
    value?;
    let before = issues.len();
    let raw = section::<RawNotify>(value, "kernel.notify", issues).value;
    in_range(
        raw.timeout_seconds,
        1..=300,
        "kernel.notify.timeout_seconds",
        issues,
    );
    in_range(raw.retries, 0..=10, "kernel.notify.retries", issues);
    let (text, location) = match (&raw.url, &raw.url_env) {
        (Some(url), None) => (Some(url.clone()), "kernel.notify.url"),
        (None, Some(name)) => (
            from_env(env, name, "kernel.notify.url_env", issues),
            "kernel.notify.url_env",
        ),
        (Some(_), Some(_)) => {
            issues.push(ConfigIssue::new(
                "kernel.notify",
                "give url or url_env, not both",
            ));
            (None, "kernel.notify.url")
        }
        (None, None) => {
            issues.push(ConfigIssue::new(
                "kernel.notify.url",
                "missing: the webhook's URL (or url_env, naming the variable that holds it)",
            ));
            (None, "kernel.notify.url")
        }
    };
    let settings = NotifySettings {
        url: reqwest::Url::parse("http://unset.invalid/").ok()?,
        headers: Vec::new(),
        allow_private_networks: raw.allow_private_networks,
        allow_addresses: raw.allow_addresses,
        timeout: Duration::from_secs(raw.timeout_seconds),
        retries: raw.retries,
    };
    let url = text.and_then(|text| match reqwest::Url::parse(text.trim()) {
        // The URL may be a secret: the message never quotes it.
        Err(err) => {
            issues.push(ConfigIssue::new(location, format!("not a URL: {err}")));
            None
        }
        Ok(url) => match settings.guard().check_url(&url) {
            Ok(()) => Some(url),
            Err(why) => {
                let hint = if raw.allow_private_networks {
                    ""
                } else {
                    " (set kernel.notify.allow_private_networks to call a loopback or private address)"
                };
                issues.push(ConfigIssue::new(location, format!("{why}{hint}")));
                None
            }
        },
    });
    let mut headers = Vec::new();
    for (name, variable) in &raw.headers_env {
        let location = format!("kernel.notify.headers_env.{name}");
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            issues.push(ConfigIssue::new(&location, "not a valid header name"));
            continue;
        }
        let Some(value) = from_env(env, variable, &location, issues) else {
            continue;
        };
        if http::HeaderValue::from_str(&value).is_err() {
            issues.push(ConfigIssue::new(
                &location,
                format!("environment variable {variable} holds a value a header cannot carry"),
            ));
            continue;
        }
        headers.push((name.clone(), value));
    }
    if issues.len() > before {
        return None;
    }
    Some(NotifySettings {
        url: url?,
        headers,
        ..settings
    })
}
