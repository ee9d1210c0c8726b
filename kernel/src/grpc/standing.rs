//! The standing layer: a node of a cluster answers the Kernel service only
//! while it knows it is still a member (docs/CLUSTER.md, "Losing a node").
//!
//! A node paused past its TTL (SIGSTOP, a VM swapped out) or cut off from
//! NATS may have been declared lost, its processes started on another
//! node under their PIDs. Resumed, it would otherwise answer the calls
//! queued at its port as those processes before its next heartbeat tells
//! it so. While its last heartbeat's confirmation is fresh (half the TTL)
//! a call passes at the cost of one clock read; past that, it waits for
//! the next heartbeat's verdict (at most the TTL) and is refused
//! UNAVAILABLE, naming why, when the node is not a member, so the client
//! asks another node. Health checks and reflection pass: they act as no
//! process.
//!
//! A call of one of the node's own processes (its token: an `exec` agent)
//! that may move waits for the verdict however long it takes (NATS out
//! for a leader election): it is paused, as its deliveries are, rather
//! than refused, which would end the agent. One that does not move passes:
//! it runs on here whatever the cluster says.

use std::task::{Context, Poll};

use futures::future::{BoxFuture, Either};
use tonic::Status;
use tonic::codegen::{Service, http};

use crate::kernel::{Caller, Kernel};

/// The path prefix of the methods the layer guards.
const GUARDED: &str = "/hivekernel.";

/// Wraps the server's services with [`Standing`] (a no-op outside a cluster).
#[derive(Clone)]
pub(super) struct StandingLayer(pub(super) Kernel);

impl<S> tower::Layer<S> for StandingLayer {
    type Service = Standing<S>;

    fn layer(&self, inner: S) -> Standing<S> {
        Standing {
            inner,
            kernel: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub(super) struct Standing<S> {
    inner: S,
    kernel: Kernel,
}

impl<S, B, R> Service<http::Request<B>> for Standing<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
    R: Default,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = Either<S::Future, BoxFuture<'static, Result<Self::Response, Self::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let cluster = match self.kernel.cluster() {
            Some(cluster) if request.uri().path().starts_with(GUARDED) && !cluster.member_now() => {
                cluster.clone()
            }
            _ => return Either::Left(self.inner.call(request)),
        };
        // The caller, as the authentication layer put it there.
        let own = match request.extensions().get::<Caller>() {
            Some(Caller::Process(pid)) if !self.kernel.node().moves_from_here(*pid) => {
                return Either::Left(self.inner.call(request));
            }
            Some(Caller::Process(pid)) => Some(*pid),
            _ => None,
        };
        // The service made ready is the one that must take the call.
        let fresh = self.inner.clone();
        let mut ready = std::mem::replace(&mut self.inner, fresh);
        Either::Right(Box::pin(async move {
            let standing = match own {
                Some(_) if cluster.still_member().await => Ok(()),
                Some(pid) => Err(crate::kernel::moved_away(pid, cluster.node())),
                None => cluster.standing().await,
            };
            match standing {
                Ok(()) => ready.call(request).await,
                Err(why) => Ok(Status::unavailable(why).into_http()),
            }
        }))
    }
}
