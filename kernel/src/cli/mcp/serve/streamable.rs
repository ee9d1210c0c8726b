//! `mcp serve --http`: MCP's streamable HTTP transport on loopback, behind
//! the kernel's HTTP gate (gate.rs: a connection cap, a header-read and an
//! idle timeout, with `kernel.connections`' defaults).
//!
//! Before MCP sees a request, it must
//! - come from no browser origin, or from the server's own or one given
//!   with `--allow-origin` (403 otherwise, as the MCP spec asks, so a page
//!   on another site cannot drive it);
//! - carry a token the kernel takes (401 otherwise): tokens are checked
//!   with the kernel, and a checked one is remembered for a minute, so a
//!   flood of `initialize` calls with made-up tokens creates no session;
//! - find room when it opens a session: at most [`MAX_SESSIONS`] are open
//!   at once (503 past it); an idle one closes after [`SESSION_IDLE`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hivekernel_proto::v1::GetProcessRequest;
use hivekernel_proto::v1::kernel_client::KernelClient;
use parking_lot::Mutex;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tonic::Code;
use tonic::transport::Channel;

use super::{Bridge, bearer};
use crate::cli::CliError;
use crate::cli::client::connect_channel;
use crate::config::ConnectionSettings;
use crate::gate::GateSettings;

/// MCP sessions open at once, at most.
pub(super) const MAX_SESSIONS: usize = 256;
/// An MCP session with no request this long is closed.
const SESSION_IDLE: Duration = Duration::from_secs(600);
/// How long a token the kernel took is taken without asking again.
const VERIFIED_FOR: Duration = Duration::from_secs(60);
/// Tokens remembered as taken, at most.
const MAX_VERIFIED: usize = 1024;

/// What every request passes before MCP sees it.
struct Door {
    bridge: Bridge,
    /// Browser origins allowed, as `scheme://host:port`, lower case.
    origins: Vec<String>,
    sessions: Arc<LocalSessionManager>,
    /// Tokens the kernel took, and when.
    verified: Mutex<HashMap<String, Instant>>,
    /// The connection tokens are checked on.
    channel: Mutex<Option<Channel>>,
}

/// Serves `bridge` on `addr` (loopback only) until Ctrl-C.
pub(super) async fn serve(
    bridge: Bridge,
    addr: SocketAddr,
    allow_origin: Vec<String>,
) -> Result<(), CliError> {
    if !addr.ip().is_loopback() {
        return Err(CliError::Usage(format!(
            "--http {addr}: mcp serve listens on loopback only (127.0.0.1 or [::1]); \
             put a TLS-terminating proxy in front to reach it from elsewhere"
        )));
    }
    let mut extra = Vec::new();
    for origin in &allow_origin {
        extra.push(origin_key(origin).ok_or_else(|| {
            CliError::Usage(format!(
                "--allow-origin {}: an origin is scheme://host[:port], such as http://localhost:6274",
                hivekernel_agents::text::shown(origin)
            ))
        })?);
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|err| CliError::Usage(format!("cannot listen on {addr}: {err}")))?;
    let bound = listener
        .local_addr()
        .map_err(|err| CliError::Usage(format!("cannot listen on {addr}: {err}")))?;
    let mut origins = own_origins(bound);
    origins.extend(extra);

    let stop = tokio_util::sync::CancellationToken::new();
    // The default accepts only loopback Host headers (DNS rebinding).
    let config = StreamableHttpServerConfig::default().with_cancellation_token(stop.child_token());
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(SESSION_IDLE);
    let sessions = Arc::new(sessions);
    let service = StreamableHttpService::new(
        {
            let bridge = bridge.clone();
            move || Ok(bridge.clone())
        },
        sessions.clone(),
        config,
    );
    let door = Arc::new(Door {
        bridge,
        origins,
        sessions,
        verified: Mutex::new(HashMap::new()),
        channel: Mutex::new(None),
    });
    let app = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(door, admit));
    // The one line a script waits for; the address is the real one with port 0.
    eprintln!("mcp serve: listening on http://{bound}/mcp");
    let shutdown = async move {
        // Without a Ctrl-C handler the default one still ends the process.
        let _ = tokio::signal::ctrl_c().await;
        stop.cancel();
    };
    let gate = GateSettings::http(&ConnectionSettings::default(), "mcp serve");
    crate::gate::serve_http(listener, gate, app, shutdown)
        .await
        .map_err(|err| CliError::Refused(format!("mcp serve on {bound}: {err}")))
}

/// The origins a page served by this listener itself would send.
fn own_origins(bound: SocketAddr) -> Vec<String> {
    let port = bound.port();
    let mut hosts = vec![bound.ip().to_string(), "localhost".to_owned()];
    if bound.is_ipv6() {
        hosts[0] = format!("[{}]", bound.ip());
    }
    hosts
        .into_iter()
        .map(|host| format!("http://{host}:{port}"))
        .collect()
}

/// `origin` as compared: `scheme://host:port`, lower case, the scheme's
/// default port written out; `None` when it is not an origin.
fn origin_key(origin: &str) -> Option<String> {
    let origin = origin.trim().to_ascii_lowercase();
    let (scheme, rest) = origin.split_once("://")?;
    let default_port = match scheme {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    if rest.is_empty() || rest.contains(['/', '?', '#', '@']) {
        return None;
    }
    let has_port = match rest.rfind(':') {
        Some(at) => !rest[at..].contains(']'),
        None => false,
    };
    if has_port {
        let (_, port) = rest.rsplit_once(':')?;
        port.parse::<u16>().ok()?;
        Some(format!("{scheme}://{rest}"))
    } else {
        Some(format!("{scheme}://{rest}:{default_port}"))
    }
}

fn refuse(status: http::StatusCode, body: String, challenge: bool) -> axum::response::Response {
    let mut response = axum::response::Response::new(axum::body::Body::from(body));
    *response.status_mut() = status;
    if challenge {
        response.headers_mut().insert(
            http::header::WWW_AUTHENTICATE,
            http::HeaderValue::from_static("Bearer"),
        );
    }
    response
}

/// The answer to a token the kernel does not know.
fn unknown_token() -> axum::response::Response {
    refuse(
        http::StatusCode::UNAUTHORIZED,
        "mcp serve: the kernel does not know this token\n".into(),
        true,
    )
}

/// The checks before MCP: origin, token, room for a new session.
async fn admit(
    axum::extract::State(door): axum::extract::State<Arc<Door>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if let Some(origin) = request.headers().get(http::header::ORIGIN) {
        let allowed = origin
            .to_str()
            .ok()
            .and_then(origin_key)
            .is_some_and(|key| door.origins.contains(&key));
        if !allowed {
            let shown = hivekernel_agents::text::shown(&String::from_utf8_lossy(origin.as_bytes()));
            return refuse(
                http::StatusCode::FORBIDDEN,
                format!(
                    "mcp serve: requests from origin {shown} are refused; start it with \
                     --allow-origin ORIGIN to let a page there call it\n"
                ),
                false,
            );
        }
    }
    let Some(token) = bearer(request.headers()).map(str::to_owned) else {
        return refuse(
            http::StatusCode::UNAUTHORIZED,
            "mcp serve: send the kernel's admin token or a process token \
             as `Authorization: Bearer <token>`\n"
                .into(),
            true,
        );
    };
    if let Err(response) = door.verify(&token).await {
        return response;
    }
    let opens_session =
        request.method() == http::Method::POST && !request.headers().contains_key("mcp-session-id");
    if opens_session && door.sessions.sessions.read().await.len() >= MAX_SESSIONS {
        return refuse(
            http::StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "mcp serve: {MAX_SESSIONS} MCP sessions are open, the most it keeps; \
                 close one (DELETE /mcp) or wait for an idle one to end\n"
            ),
            false,
        );
    }
    next.run(request).await
}

impl Door {
    /// The one connection tokens are checked on (made on first use, made
    /// again after the kernel was unreachable), so that a flood of made-up
    /// tokens opens no connection per request.
    async fn checker(&self) -> Result<Channel, CliError> {
        if let Some(channel) = self.channel.lock().clone() {
            return Ok(channel);
        }
        let (channel, _, _) = connect_channel(&self.bridge.kernel.args).await?;
        *self.channel.lock() = Some(channel.clone());
        Ok(channel)
    }

    /// Whether the kernel takes `token`; the refusal to answer when not.
    async fn verify(&self, token: &str) -> Result<(), axum::response::Response> {
        let now = Instant::now();
        if self
            .verified
            .lock()
            .get(token)
            .is_some_and(|at| now.duration_since(*at) < VERIFIED_FOR)
        {
            return Ok(());
        }
        let unreachable = |why: String| {
            refuse(
                http::StatusCode::SERVICE_UNAVAILABLE,
                format!("mcp serve: cannot check the token with the kernel: {why}\n"),
                false,
            )
        };
        let channel = self
            .checker()
            .await
            .map_err(|err| unreachable(err.to_string()))?;
        let mut call = tonic::Request::new(GetProcessRequest { pid: 1 });
        let header = format!("Bearer {token}")
            .parse()
            .map_err(|_| unknown_token())?;
        call.metadata_mut().insert("authorization", header);
        // Any answer but UNAUTHENTICATED means the kernel knows the token
        // (a process token may be refused PID 1's details: still a token).
        match KernelClient::new(channel).get_process(call).await {
            Err(status) if status.code() == Code::Unauthenticated => return Err(unknown_token()),
            Err(status) if status.code() == Code::Unavailable => {
                *self.channel.lock() = None;
                return Err(unreachable(status.message().to_owned()));
            }
            _ => {}
        }
        let mut verified = self.verified.lock();
        if verified.len() >= MAX_VERIFIED {
            verified.retain(|_, at| now.duration_since(*at) < VERIFIED_FOR);
            if verified.len() >= MAX_VERIFIED {
                verified.clear();
            }
        }
        verified.insert(token.to_owned(), now);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn origins_compare_with_their_default_ports() {
        assert_eq!(
            origin_key("HTTP://LocalHost:6274").as_deref(),
            Some("http://localhost:6274")
        );
        assert_eq!(
            origin_key("https://example.com").as_deref(),
            Some("https://example.com:443")
        );
        assert_eq!(
            origin_key("http://[::1]").as_deref(),
            Some("http://[::1]:80")
        );
        assert_eq!(
            origin_key("http://[::1]:8765").as_deref(),
            Some("http://[::1]:8765")
        );
        for bad in [
            "null",
            "localhost:80",
            "ftp://x",
            "http://a/b",
            "http://a:99999",
            "http://",
        ] {
            assert_eq!(origin_key(bad), None, "{bad}");
        }
        let own = own_origins("127.0.0.1:8765".parse().unwrap());
        assert!(own.contains(&"http://127.0.0.1:8765".to_owned()));
        assert!(own.contains(&"http://localhost:8765".to_owned()));
    }
}
