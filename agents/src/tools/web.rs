//! `web_fetch`: one http or https URL, fetched as text for the model.
//!
//! A model chooses the URL, so the tool must not become a way into the
//! kernel's own network (SSRF). Every address is judged by what the host
//! *resolves to*, never by its name:
//!
//! 1. **URL check** (`guard::check_url`) before any request: http or https
//!    only, a host, no `user:password@`, and an IP-literal host (in any
//!    spelling the URL parser normalises, such as `2130706433` or `0x7f.1`)
//!    must be an allowed address. IP literals never reach DNS, so this is
//!    their only check.
//! 2. **Resolver** (`guard::GuardedResolver`): the HTTP client resolves names
//!    through it, and it hands back only allowed addresses, failing when none
//!    is left. The client connects to exactly what it returned, so there is
//!    no gap between check and connect for DNS rebinding to use.
//! 3. **Redirects** are not followed by the client; `fetch` follows them
//!    itself, up to the cap, putting every hop through steps 1 and 2.
//!
//! Proxies from the environment are ignored (a proxy would resolve the name
//! itself, past the resolver). Loopback, private, link-local and similar
//! internal ranges are refused unless `allow_private_networks` is set, or
//! the address is one of `allow_addresses` (an intranet service, say);
//! unspecified, broadcast, multicast, reserved and cloud metadata addresses
//! are refused always.
//!
//! The answer starts with `HTTP <status> <final url>` and the content type;
//! a 404 or 500 is an answer, not an error. Bodies are read as UTF-8 (bad
//! sequences replaced), stopping at the byte cap; HTML is reduced to text;
//! content that is not text (images, archives, `application/octet-stream`)
//! is refused before its body is read. One deadline covers the whole fetch,
//! redirects and body included.
//!
//! # Layout
//! - `guard`: the address classes, the URL and redirect-hop checks, the resolver.
//! - `fetch`: the request loop, body reading, content types and the answer.
//! - `html`: HTML to readable text.
//! - this file: settings, the tool, its arguments, registration.

mod fetch;
mod guard;
mod html;

use crate::capability::Capability;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Url;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::args::invalid;
use super::{Tool, ToolContext, ToolError, ToolRegistry, decode};
use fetch::Limits;
use guard::{GuardedResolver, Reach};

/// Longest URL accepted, in bytes.
const MAX_URL_BYTES: usize = 8 * 1024;

/// What `web_fetch` may do (`tool_agent.web`).
#[derive(
    Debug, Clone, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema, validator::Validate,
)]
#[serde(default, deny_unknown_fields)]
pub struct WebSettings {
    /// Let `web_fetch` reach loopback, private (RFC 1918, fc00::/7),
    /// link-local and CGNAT addresses. Off, they are refused by resolved
    /// IP, on every redirect hop. Unspecified, broadcast, multicast and
    /// cloud metadata addresses are refused either way.
    pub allow_private_networks: bool,
    /// Internal addresses `web_fetch` may reach even with
    /// `allow_private_networks` off, one by one (an intranet service,
    /// say); `::ffff:a.b.c.d` counts as `a.b.c.d`. Cloud metadata and the
    /// other always-refused addresses stay refused.
    pub allow_addresses: Vec<IpAddr>,
    /// Most body bytes read per fetch (also the cap on the `max_bytes`
    /// argument); the rest is cut with a note.
    #[validate(range(min = 1, max = 268_435_456))]
    pub max_bytes: usize,
    /// Deadline of a whole fetch, redirects included (also the cap on the
    /// `timeout_seconds` argument).
    #[validate(range(min = 1, max = 3600))]
    pub timeout_seconds: u64,
    /// Redirects followed per fetch.
    #[validate(range(min = 0, max = 20))]
    pub max_redirects: u32,
    /// The `User-Agent` header sent.
    #[serde(skip)]
    pub user_agent: String,
}

impl WebSettings {
    /// `timeout_seconds`.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_seconds)
    }
}

impl Default for WebSettings {
    fn default() -> Self {
        WebSettings {
            allow_private_networks: false,
            allow_addresses: Vec::new(),
            max_bytes: 2 * 1024 * 1024,
            timeout_seconds: 30,
            max_redirects: 5,
            user_agent: concat!("hivekernel/", env!("CARGO_PKG_VERSION")).to_owned(),
        }
    }
}

/// Fetches a URL and answers its status and text.
#[derive(Debug)]
pub struct WebFetch {
    settings: WebSettings,
    /// Built on first use (loading TLS roots costs milliseconds at kernel
    /// start otherwise), then kept; an error (such as a user agent that is
    /// not a valid header) is reported by every call.
    client: std::sync::OnceLock<Result<reqwest::Client, String>>,
}

impl WebFetch {
    /// The tool under `settings`.
    pub fn new(settings: WebSettings) -> Self {
        WebFetch {
            settings,
            client: std::sync::OnceLock::new(),
        }
    }

    fn client(&self) -> &Result<reqwest::Client, String> {
        self.client.get_or_init(|| {
            crate::http::client_builder()
                .user_agent(self.settings.user_agent.as_str())
                .redirect(reqwest::redirect::Policy::none())
                .no_proxy()
                .dns_resolver(Arc::new(GuardedResolver {
                    reach: self.reach(),
                }))
                .build()
                .map_err(|err| format!("web_fetch cannot build its HTTP client: {err}"))
        })
    }

    /// Which internal addresses the settings open.
    fn reach(&self) -> Reach {
        Reach {
            private: self.settings.allow_private_networks,
            addresses: Arc::from(self.settings.allow_addresses.as_slice()),
        }
    }

    /// The settings it runs under.
    pub fn settings(&self) -> &WebSettings {
        &self.settings
    }
}

/// The address rules of `web_fetch` (see the module docs) for an outbound
/// call the kernel makes itself, such as the inbox's webhook: loopback,
/// private and similar ranges only when `allow_private_networks` (or
/// listed in `allow_addresses`), never the never-fetched ones.
#[derive(Debug, Clone)]
pub struct Guard {
    reach: Reach,
}

impl Guard {
    /// The rules `settings` open (their `allow_private_networks` and
    /// `allow_addresses`).
    pub fn new(allow_private_networks: bool, allow_addresses: &[IpAddr]) -> Self {
        Guard {
            reach: Reach {
                private: allow_private_networks,
                addresses: Arc::from(allow_addresses),
            },
        }
    }

    /// Refuses a URL that is not http or https, has no host, carries
    /// credentials, or names an address the rules refuse.
    pub fn check_url(&self, url: &Url) -> Result<(), String> {
        guard::check_url(url, &self.reach)
    }

    /// An HTTP client that resolves names only to addresses the rules
    /// allow, follows no redirect and uses no proxy, with `timeout` per
    /// request.
    pub fn client(&self, timeout: Duration) -> Result<reqwest::Client, String> {
        crate::http::client_builder()
            .user_agent(concat!("hivekernel/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(timeout)
            .dns_resolver(Arc::new(GuardedResolver {
                reach: self.reach.clone(),
            }))
            .build()
            .map_err(|err| format!("cannot build an HTTP client: {err}"))
    }
}

/// Adds `web_fetch` under `settings`.
pub fn register(registry: &mut ToolRegistry, settings: WebSettings) {
    registry.register(Arc::new(WebFetch::new(settings)));
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    url: String,
    max_bytes: Option<u64>,
    timeout_seconds: Option<u64>,
}

#[async_trait]
impl Tool for WebFetch {
    fn name(&self) -> &'static str {
        "web_fetch"
    }

    fn capability(&self) -> Option<Capability> {
        Some(Capability::NetworkAccess)
    }

    fn description(&self) -> &'static str {
        "Fetch an http or https URL and answer its status and text (HTML reduced to readable text). Public addresses only; size and time are capped."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "url": { "type": "string", "description": "The http:// or https:// URL to fetch." },
                "max_bytes": {
                    "type": "integer", "minimum": 1, "maximum": self.settings.max_bytes,
                    "description": "Most body bytes to read (default and cap: the configured limit)."
                },
                "timeout_seconds": {
                    "type": "integer", "minimum": 1, "maximum": self.settings.timeout_seconds.max(1),
                    "description": "Give up after this many seconds (default and cap: the configured limit)."
                }
            },
            "required": ["url"],
            "additionalProperties": false
        })
    }

    async fn call(&self, _ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let args: Args = decode(self, args)?;
        let max_bytes = match args.max_bytes {
            None => self.settings.max_bytes,
            Some(0) => return Err(invalid(self, "field `max_bytes` must be at least 1")),
            Some(n) => usize::try_from(n)
                .unwrap_or(usize::MAX)
                .min(self.settings.max_bytes),
        };
        let timeout = match args.timeout_seconds {
            None => self.settings.timeout(),
            Some(0) => return Err(invalid(self, "field `timeout_seconds` must be at least 1")),
            Some(s) => Duration::from_secs(s).min(self.settings.timeout()),
        };
        let url = parse(self, &args.url)?;
        let reach = self.reach();
        guard::check_url(&url, &reach).map_err(|why| ToolError::new(format!("refused: {why}")))?;
        let client = self.client().as_ref().map_err(ToolError::new)?;
        let limits = Limits {
            max_bytes,
            max_redirects: self.settings.max_redirects,
            reach,
        };
        let fetched = async { fetch::fetch(client, &url, limits).await?.render() };
        tokio::time::timeout(timeout, fetched).await.map_err(|_| {
            ToolError::new(format!(
                "timed out after {}s fetching {url}",
                timeout.as_secs_f64()
            ))
        })?
    }
}

/// The `url` argument, parsed.
fn parse(tool: &dyn Tool, text: &str) -> Result<Url, ToolError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(invalid(tool, "field `url` is empty"));
    }
    if text.len() > MAX_URL_BYTES {
        return Err(invalid(
            tool,
            format!(
                "field `url` is {} bytes; at most {MAX_URL_BYTES}",
                text.len()
            ),
        ));
    }
    Url::parse(text).map_err(|err| {
        invalid(
            tool,
            format!("field `url` is not a valid URL ({text:?}): {err}"),
        )
    })
}
