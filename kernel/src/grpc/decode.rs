//! A request that does not decode is the caller's mistake: INVALID_ARGUMENT.
//!
//! tonic answers a request message that fails to decode (a string field
//! that is not UTF-8, a truncated field) with INTERNAL, after gRPC's
//! status-code table. To a HiveKernel client that reads as a fault of the
//! kernel, and it changes nothing either way; so this layer relabels that
//! one answer INVALID_ARGUMENT, keeping tonic's message, which names the
//! field. Nothing else is touched.

use std::task::{Context, Poll};

use futures::TryFutureExt;
use futures::future::MapOk;
use tonic::codegen::http::{self, HeaderValue};
use tower::{Layer, Service};

/// The `grpc-message` tonic sends (percent-encoded) when a request does not decode.
const DECODE_FAILED: &[u8] = b"failed%20to%20decode%20Protobuf%20message";

/// Wraps a service in [`DecodeErrors`].
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct DecodeErrorsLayer;

impl<S> Layer<S> for DecodeErrorsLayer {
    type Service = DecodeErrors<S>;

    fn layer(&self, inner: S) -> DecodeErrors<S> {
        DecodeErrors(inner)
    }
}

/// `S`, with an undecodable request answered INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub(super) struct DecodeErrors<S>(S);

type Relabel<R> = fn(http::Response<R>) -> http::Response<R>;

impl<S, B, R> Service<http::Request<B>> for DecodeErrors<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = MapOk<S::Future, Relabel<R>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        self.0.call(request).map_ok(relabel::<R> as Relabel<R>)
    }
}

/// INTERNAL becomes INVALID_ARGUMENT when it says the request did not decode.
fn relabel<R>(mut response: http::Response<R>) -> http::Response<R> {
    let headers = response.headers_mut();
    let undecodable = headers.get("grpc-status").is_some_and(|code| code == "13")
        && headers
            .get("grpc-message")
            .is_some_and(|message| message.as_bytes().starts_with(DECODE_FAILED));
    if undecodable {
        headers.insert("grpc-status", HeaderValue::from_static("3"));
    }
    response
}

#[cfg(test)]
mod tests {
    use tonic::{Code, Status};

    use super::*;

    #[test]
    fn only_a_decode_failure_is_relabelled() {
        let answer = |status: Status| relabel(status.into_http::<()>());
        let code = |response: &http::Response<()>| {
            Code::from_bytes(response.headers()["grpc-status"].as_bytes())
        };
        let undecodable = Status::internal(
            "failed to decode Protobuf message: SpawnRequest.name: invalid string value",
        );
        assert_eq!(code(&answer(undecodable)), Code::InvalidArgument);
        assert_eq!(
            code(&answer(Status::internal("disk on fire"))),
            Code::Internal
        );
        assert_eq!(
            code(&answer(Status::not_found(
                "failed to decode Protobuf message"
            ))),
            Code::NotFound
        );
    }
}
