//! The operator's HTTP listener (`kernel.metrics.listen`, `--metrics-listen`):
//! `/metrics` in the Prometheus text format, `/healthz` (the process
//! answers) and `/readyz` (the kernel serves: 503 once a stop begins).
//!
//! Behind a gate of its own (`kernel.connections.http_*`, gate.rs), so
//! silent sockets here cannot take the control plane's descriptors.
//!
//! Plain HTTP without credentials, as scrapers and probes expect: nothing
//! here reveals a token, an argument or a message, only counts. Bind it
//! where only the scraper reaches.

use std::future::Future;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;

use crate::kernel::Kernel;

/// Serves until `shutdown` resolves, then lets open requests finish.
pub async fn serve(
    kernel: Kernel,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let gate =
        crate::gate::GateSettings::http(&kernel.settings().connections, "the metrics listener");
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .with_state(kernel);
    crate::gate::serve_http(listener, gate, app, shutdown).await
}

async fn metrics(State(kernel): State<Kernel>) -> Response {
    // One pass over the process table: off the async threads, which a
    // table of 100,000 processes would hold up for milliseconds.
    let text = tokio::task::spawn_blocking(move || kernel.metrics_text()).await;
    match text {
        Ok(Some(text)) => {
            ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response()
        }
        Ok(None) => (
            StatusCode::NOT_FOUND,
            "this kernel keeps no metrics (set kernel.metrics.listen)\n",
        )
            .into_response(),
        Err(err) => {
            tracing::error!(error = %err, "metrics: the render failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "the render failed\n").into_response()
        }
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(kernel): State<Kernel>) -> Response {
    if kernel.is_stopping() {
        (StatusCode::SERVICE_UNAVAILABLE, "stopping\n").into_response()
    } else {
        "ready\n".into_response()
    }
}

async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        "not found: this listener serves /metrics, /healthz and /readyz\n",
    )
        .into_response()
}
