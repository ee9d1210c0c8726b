//! The metrics layer: counts every call by service, method and status
//! code, and times it to its answer, when the kernel keeps metrics.
//!
//! The code is read from the response headers: a refusal (by the auth
//! layer or a handler) is a trailers-only answer that carries it there; an
//! answer without it began well (`OK`): a unary call's status then comes in
//! the trailers and is `OK`, a stream's may still end with an error, which
//! this layer does not wait for.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use futures::future::{BoxFuture, Either};
use tonic::codegen::{Service, http};

use crate::metrics::Metrics;

/// Wraps the server's services with [`Measured`].
#[derive(Debug, Clone)]
pub(super) struct MeasureLayer(pub(super) Option<Arc<Metrics>>);

impl<S> tower::Layer<S> for MeasureLayer {
    type Service = Measured<S>;

    fn layer(&self, inner: S) -> Measured<S> {
        Measured {
            inner,
            metrics: self.0.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Measured<S> {
    inner: S,
    metrics: Option<Arc<Metrics>>,
}

impl<S, B, R> Service<http::Request<B>> for Measured<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = Either<S::Future, BoxFuture<'static, Result<Self::Response, Self::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let Some(metrics) = self.metrics.clone() else {
            return Either::Left(self.inner.call(request));
        };
        let method =
            crate::auth::known_method(request.uri().path()).unwrap_or(("unknown", "unknown"));
        let started = Instant::now();
        let answer = self.inner.call(request);
        Either::Right(Box::pin(async move {
            let answer = answer.await;
            let code = match &answer {
                Ok(response) => response
                    .headers()
                    .get("grpc-status")
                    .and_then(|value| value.to_str().ok())
                    .and_then(|value| value.parse::<i32>().ok())
                    .map_or("OK", code_name),
                Err(_) => "UNKNOWN",
            };
            metrics.grpc_call(method, code, started.elapsed());
            answer
        }))
    }
}

/// The canonical name of a gRPC status code (`UNAUTHENTICATED`).
pub(crate) fn code_name(code: i32) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|code| NAMES.get(code))
        .copied()
        .unwrap_or("UNKNOWN")
}
