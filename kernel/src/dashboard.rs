//! The web dashboard (`kernel.dashboard`): a page served by the kernel
//! binary itself, on its own listener beside the control plane, that
//! watches and steers the swarm.
//!
//! It is a client of the Kernel service and nothing else: every call the
//! page makes (`POST /api/rpc/<Method>`, `GET /api/watch/<Method>` for the
//! live streams as server-sent events) goes through
//! [`crate::grpc::LocalService`], the same handlers and scope table a gRPC
//! client reaches, with the session's caller. Messages are the service's
//! own in their canonical JSON form ([`json`]).
//!
//! Why its own listener: the control plane's port speaks HTTP/2 only and
//! closes a connection that makes no call with a bearer token in time
//! (`kernel.connections`); a browser speaks HTTP/1.1 and logs in once.
//!
//! Security: nothing but the page, its script and style is served without
//! a session ([`session`]), and a session is the HttpOnly, SameSite=Strict
//! (and, under TLS, Secure) cookie together with the session key the page
//! sends in `X-CSRF-Token` (or, for a live stream, a single-use ticket):
//! the cookie alone authenticates nothing. Only requests that name the
//! dashboard as their `Host` are answered, and only the page's own origin
//! may call the API ([`origin`]); every POST must be JSON; the page may
//! load nothing from elsewhere (Content-Security-Policy), nor be framed.

mod api;
pub mod assets;
pub mod json;
mod origin;
pub mod session;
mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::Authenticator;
use crate::grpc::LocalService;
use crate::kernel::Kernel;
use crate::reload::ConfigReload;

/// What the page may load: only from itself.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'";

/// The dashboard's shared state.
#[derive(Debug)]
struct Dashboard {
    service: LocalService,
    schema: json::Schema,
    sessions: session::Sessions,
    /// The session cookie's name: per port, as browsers share cookies
    /// between the ports of one host.
    cookie: String,
    /// Whether it is served over TLS (the cookie is then Secure).
    secure: bool,
    etags: Vec<HeaderValue>,
    /// This kernel's node name, when it is a node of a cluster.
    node: Option<String>,
    /// Host names it answers to besides IP addresses and `localhost`.
    hosts: Vec<String>,
}

/// How to serve the dashboard.
#[derive(Clone)]
pub struct Options {
    pub kernel: Kernel,
    pub auth: Authenticator,
    pub reload: Option<Arc<dyn ConfigReload>>,
    /// Where it listens (for the cookie's name).
    pub addr: SocketAddr,
    /// Served over TLS with these settings (the control plane's
    /// certificate), else plain HTTP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("addr", &self.addr)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

/// The dashboard as an axum service, its streams ending when `drain` is
/// cancelled.
pub fn router(options: Options, drain: CancellationToken) -> Router {
    let Options {
        kernel,
        auth,
        reload,
        addr,
        tls,
    } = options;
    let body_limit = crate::grpc::max_request_bytes(&kernel);
    let auth = auth.with_operators(kernel.tokens().registry());
    let node = kernel.cluster().map(|cluster| cluster.node().to_owned());
    let hosts = kernel.settings().dashboard.hosts.clone();
    let dashboard = Arc::new(Dashboard {
        service: LocalService::new(kernel, drain, reload),
        schema: json::Schema::default(),
        sessions: session::Sessions::new(auth),
        cookie: format!("hivekernel-{}", addr.port()),
        secure: tls.is_some(),
        etags: assets::ASSETS.iter().map(assets::Asset::etag).collect(),
        node,
        hosts,
    });
    Router::new()
        .route("/", get(api::asset))
        .route("/assets/{file}", get(api::asset))
        .route("/api/session", get(api::session))
        .route("/api/login", post(api::login))
        .route("/api/logout", post(api::logout))
        .route("/api/rpc/{method}", post(api::rpc))
        .route("/api/ticket", post(api::ticket))
        .route("/api/watch/{method}", get(api::watch))
        .fallback(api::not_found)
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(dashboard.clone(), guard))
        .layer(middleware::from_fn(security_headers))
        .with_state(dashboard)
}

/// Serves the dashboard on `listener` until `shutdown` resolves; its live
/// streams end then too, so open pages do not hold the stop up.
pub async fn serve(
    options: Options,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let drain = CancellationToken::new();
    let tls = options.tls.clone();
    let gate =
        crate::gate::GateSettings::http(&options.kernel.settings().connections, "the dashboard");
    let app = router(options, drain.clone());
    let stop = async move {
        shutdown.await;
        drain.cancel();
    };
    match tls {
        Some(config) => {
            let listener = tls::TlsListener::new(listener, gate, config)?;
            let app = app.layer(middleware::from_fn(crate::gate::http_layer));
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<crate::gate::Admission>(),
            )
            .with_graceful_shutdown(stop)
            .await
        }
        None => crate::gate::serve_http(listener, gate, app, stop).await,
    }
}

/// Refuses a request for another host, and an API call from another
/// origin ([`origin`]).
async fn guard(State(dashboard): Shared, request: Request, next: Next) -> Response {
    let api = request.uri().path().starts_with("/api/");
    match origin::refusal(request.headers(), api, &dashboard.hosts) {
        None => next.run(request).await,
        Some(why) => {
            tracing::debug!(%why, "dashboard: request refused");
            api::forbidden(why)
        }
    }
}

async fn security_headers(request: Request, next: Next) -> Response {
    let api = request.uri().path().starts_with("/api/");
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if api {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

/// What every handler is given.
type Shared = State<Arc<Dashboard>>;
