//! The Kernel service called in-process: the same handlers, argument
//! checks and scope table a gRPC client reaches, without a socket. A door
//! that authenticates its callers its own way (the dashboard's session
//! cookie) calls the kernel through this, so nothing the kernel checks is
//! written a second time for it.
//!
//! A call is a gRPC request in all but transport: the encoded message in
//! one gRPC frame, the caller in the request's extensions where the auth
//! layer would have put it, and the answer's frames read back with the
//! call's status from the trailers.

use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use hivekernel_proto::v1::kernel_server::KernelServer;
use http_body_util::BodyExt as _;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::http;
use tower::ServiceExt as _;

use super::service::KernelService;
use crate::auth::check_scope;
use crate::kernel::{Caller, Kernel};
use crate::reload::ConfigReload;

/// The path prefix of the kernel service's methods.
const SERVICE_PATH: &str = "/hivekernel.v1.Kernel/";
/// Bytes of a gRPC frame's header: the compression flag and the length.
const FRAME_HEADER: usize = 5;

/// The Kernel service, callable in-process. Cheap to clone.
#[derive(Clone)]
pub struct LocalService {
    server: KernelServer<KernelService>,
    /// The node's cluster: calls wait for its standing as gRPC calls do
    /// (the standing layer, `standing.rs`).
    cluster: Option<Arc<crate::cluster::Cluster>>,
}

impl std::fmt::Debug for LocalService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LocalService")
    }
}

impl LocalService {
    /// The service over `kernel`; its streams end when `drain` is
    /// cancelled, and `ReloadConfig` goes through `reload` as over gRPC.
    pub fn new(
        kernel: Kernel,
        drain: CancellationToken,
        reload: Option<Arc<dyn ConfigReload>>,
    ) -> Self {
        let limit = super::max_request_bytes(&kernel);
        LocalService {
            cluster: kernel.cluster().cloned(),
            server: KernelServer::new(KernelService::new(kernel, drain, reload))
                .max_decoding_message_size(limit),
        }
    }

    /// Calls `method` (`GetProcess`) with `request` (the encoded message)
    /// as `caller`, after the scope check every gRPC call passes. The
    /// answer's messages follow, one per [`Answer::next`].
    pub async fn call(
        &self,
        caller: Caller,
        method: &str,
        request: Bytes,
    ) -> Result<Answer, Status> {
        let path = format!("{SERVICE_PATH}{method}");
        check_scope(caller, &path)?;
        if let Some(cluster) = &self.cluster {
            cluster.standing().await.map_err(Status::unavailable)?;
        }
        let mut framed = BytesMut::with_capacity(FRAME_HEADER + request.len());
        framed.extend_from_slice(&[0]);
        let len = u32::try_from(request.len())
            .map_err(|_| Status::resource_exhausted("the request is larger than 4 GiB"))?;
        framed.extend_from_slice(&len.to_be_bytes());
        framed.extend_from_slice(&request);
        let mut http_request = http::Request::builder()
            .method(http::Method::POST)
            .uri(path)
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
            .body(Body::new(http_body_util::Full::new(framed.freeze())))
            .map_err(|err| Status::internal(format!("building the call: {err}")))?;
        http_request.extensions_mut().insert(caller);
        let response = match self.server.clone().oneshot(http_request).await {
            Ok(response) => response,
            Err(never) => match never {},
        };
        let (parts, body) = response.into_parts();
        // A refusal before any message is a "trailers-only" answer: the
        // status is in the headers.
        if let Some(status) = Status::from_header_map(&parts.headers)
            && status.code() != tonic::Code::Ok
        {
            return Err(status);
        }
        Ok(Answer {
            body,
            buffer: BytesMut::new(),
            finished: false,
        })
    }
}

/// The messages of one call's answer, then its status.
#[derive(Debug)]
pub struct Answer {
    body: Body,
    buffer: BytesMut,
    finished: bool,
}

impl Answer {
    /// The next encoded message; `None` once the call ended well, an error
    /// (once) when it ended with one.
    pub async fn next(&mut self) -> Option<Result<Bytes, Status>> {
        loop {
            if let Some(message) = self.take_message() {
                return Some(message);
            }
            if self.finished {
                return None;
            }
            match self.body.frame().await {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.buffer.extend_from_slice(&data),
                    Err(frame) => {
                        self.finished = true;
                        let status = frame
                            .trailers_ref()
                            .and_then(Status::from_header_map)
                            .filter(|status| status.code() != tonic::Code::Ok);
                        if let Some(status) = status {
                            return Some(Err(status));
                        }
                    }
                },
                Some(Err(status)) => {
                    self.finished = true;
                    return Some(Err(status));
                }
                None => {
                    self.finished = true;
                    if !self.buffer.is_empty() {
                        return Some(Err(Status::internal("the answer ended inside a message")));
                    }
                }
            }
        }
    }

    /// A whole message from the buffer, if one is there.
    fn take_message(&mut self) -> Option<Result<Bytes, Status>> {
        if self.buffer.len() < FRAME_HEADER {
            return None;
        }
        if self.buffer[0] != 0 {
            self.finished = true;
            self.buffer.clear();
            return Some(Err(Status::internal("the answer came compressed")));
        }
        let len = u32::from_be_bytes([
            self.buffer[1],
            self.buffer[2],
            self.buffer[3],
            self.buffer[4],
        ]) as usize;
        if self.buffer.len() < FRAME_HEADER + len {
            return None;
        }
        self.buffer.advance(FRAME_HEADER);
        Some(Ok(self.buffer.split_to(len).freeze()))
    }
}
