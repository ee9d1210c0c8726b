//! `kernel.tls`, both phases: the control plane's certificate, key and
//! trust roots, each path relative to the config file.
//!
//! ```json
//! "kernel": {
//!   "tls": { "cert": "tls/server.pem", "key": "tls/server.key", "client_ca": "tls/clients.pem" }
//! }
//! ```

use serde::Deserialize;
use serde_json::Value;

use super::ConfigIssue;
use super::parse::section;
use super::validate::Context;
use crate::tls::{self, TlsFiles};

/// `kernel.tls` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawTls {
    cert: Option<String>,
    key: Option<String>,
    client_ca: Option<String>,
    ca: Option<String>,
}

/// Parses and checks `kernel.tls`: `cert` and `key` together, the CAs only
/// with them, and every file a readable PEM of the right kind.
pub(super) fn tls(
    value: Option<&Value>,
    checks: &Context<'_>,
    issues: &mut Vec<ConfigIssue>,
) -> Option<TlsFiles> {
    value?;
    let raw = section::<RawTls>(value, "kernel.tls", issues).value;
    let at = |field: &str| format!("kernel.tls.{field}");
    let path = |text: &Option<String>, field: &str, issues: &mut Vec<ConfigIssue>| {
        text.as_deref()
            .and_then(|text| checks.path_field(text, &at(field), issues))
    };
    let cert = path(&raw.cert, "cert", issues);
    let key = path(&raw.key, "key", issues);
    let client_ca = path(&raw.client_ca, "client_ca", issues);
    let ca = path(&raw.ca, "ca", issues);
    let missing = "missing: TLS needs both a certificate (cert) and its private key (key)";
    match (&raw.cert, &raw.key) {
        (Some(_), None) => issues.push(ConfigIssue::new(at("key"), missing)),
        (None, Some(_)) => issues.push(ConfigIssue::new(at("cert"), missing)),
        (None, None) => {
            for (given, field) in [(&raw.client_ca, "client_ca"), (&raw.ca, "ca")] {
                if given.is_some() {
                    let message = "needs cert and key: it only applies when the kernel serves TLS";
                    issues.push(ConfigIssue::new(at(field), message));
                }
            }
        }
        (Some(_), Some(_)) => {}
    }
    let (Some(cert), Some(key)) = (cert, key) else {
        return None;
    };
    let mut check = |field: &str, result: Result<Vec<u8>, tls::TlsError>| {
        if let Err(err) = result {
            issues.push(ConfigIssue::new(at(field), err.to_string()));
        }
    };
    check("cert", tls::read_certs(&cert, tls::CERT));
    check("key", tls::read_key(&key, tls::KEY));
    if let Some(path) = &client_ca {
        check("client_ca", tls::read_certs(path, tls::CLIENT_CA));
    }
    if let Some(path) = &ca {
        check("ca", tls::read_certs(path, tls::CA));
    }
    Some(TlsFiles {
        cert,
        key,
        client_ca,
        ca,
    })
}
