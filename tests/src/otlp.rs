//! An OTLP trace receiver on loopback: the OpenTelemetry protocol's own
//! messages (`opentelemetry-proto`), served over gRPC (tonic) or HTTP
//! (protobuf bodies at `/v1/traces`), keeping every span it is sent.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use parking_lot::Mutex;
use prost::Message as _;
use tokio::net::TcpListener;

/// One span as received.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    /// 16 hex digits; empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    /// The OTLP kind: 1 internal, 2 server, 3 client.
    pub kind: i32,
    /// Attributes, values as JSON (strings, numbers, booleans, arrays).
    pub attributes: BTreeMap<String, serde_json::Value>,
    /// The status code: 0 unset, 1 ok, 2 error.
    pub status: i32,
    /// `service.name` of the resource that sent it.
    pub service: String,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
}

impl ReceivedSpan {
    /// A string attribute.
    pub fn str(&self, key: &str) -> Option<&str> {
        self.attributes.get(key)?.as_str()
    }

    /// An integer attribute.
    pub fn int(&self, key: &str) -> Option<i64> {
        self.attributes.get(key)?.as_i64()
    }
}

#[derive(Debug, Default)]
struct Received {
    /// Only count spans, keeping none (a long benchmark run).
    count_only: bool,
    spans: Mutex<Vec<ReceivedSpan>>,
    counted: std::sync::atomic::AtomicUsize,
    requests: Mutex<usize>,
}

impl Received {
    fn take(&self, request: ExportTraceServiceRequest) {
        *self.requests.lock() += 1;
        if self.count_only {
            let n: usize = request
                .resource_spans
                .iter()
                .flat_map(|r| &r.scope_spans)
                .map(|s| s.spans.len())
                .sum();
            self.counted
                .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        let mut spans = Vec::new();
        for resource in request.resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref()?.value.as_ref())
                .map(json)
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            for scope in resource.scope_spans {
                for span in scope.spans {
                    spans.push(ReceivedSpan {
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent_span_id: hex(&span.parent_span_id),
                        name: span.name,
                        kind: span.kind,
                        attributes: span
                            .attributes
                            .into_iter()
                            .map(|kv| {
                                let value = kv
                                    .value
                                    .and_then(|v| v.value)
                                    .as_ref()
                                    .map_or(serde_json::Value::Null, json);
                                (kv.key, value)
                            })
                            .collect(),
                        status: span.status.map_or(0, |s| s.code),
                        service: service.clone(),
                        start_unix_nano: span.start_time_unix_nano,
                        end_unix_nano: span.end_time_unix_nano,
                    });
                }
            }
        }
        self.counted
            .fetch_add(spans.len(), std::sync::atomic::Ordering::Relaxed);
        self.spans.lock().extend(spans);
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn json(value: &Any) -> serde_json::Value {
    match value {
        Any::StringValue(s) => s.clone().into(),
        Any::BoolValue(b) => (*b).into(),
        Any::IntValue(i) => (*i).into(),
        Any::DoubleValue(d) => (*d).into(),
        Any::ArrayValue(array) => array
            .values
            .iter()
            .filter_map(|v| v.value.as_ref())
            .map(json)
            .collect::<Vec<_>>()
            .into(),
        Any::KvlistValue(_) | Any::BytesValue(_) | Any::StringValueStrindex(_) => {
            serde_json::Value::Null
        }
    }
}

/// A running receiver; stops when dropped.
#[derive(Debug)]
pub struct OtlpReceiver {
    addr: SocketAddr,
    received: Arc<Received>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Grpc(Arc<Received>);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.take(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl OtlpReceiver {
    /// OTLP/gRPC on a free loopback port.
    pub async fn grpc() -> OtlpReceiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let received = Arc::new(Received::default());
        let service = TraceServiceServer::new(Grpc(received.clone()));
        let task = tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming)
                .await;
        });
        OtlpReceiver {
            addr,
            received,
            task,
        }
    }

    /// OTLP/HTTP with protobuf bodies on a free loopback port.
    pub async fn http() -> OtlpReceiver {
        OtlpReceiver::http_with(Received::default()).await
    }

    /// [`OtlpReceiver::http`] that counts spans and keeps none.
    pub async fn http_counting() -> OtlpReceiver {
        OtlpReceiver::http_with(Received {
            count_only: true,
            ..Received::default()
        })
        .await
    }

    async fn http_with(received: Received) -> OtlpReceiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let received = Arc::new(received);
        let kept = received.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let kept = kept.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let kept = kept.clone();
                        async move { Ok::<_, Infallible>(answer(&kept, request).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        OtlpReceiver {
            addr,
            received,
            task,
        }
    }

    /// `http://127.0.0.1:PORT`: the base endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.received.spans.lock().clone()
    }

    /// How many spans arrived (kept or only counted).
    pub fn span_count(&self) -> usize {
        self.received
            .counted
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many export requests arrived.
    pub fn requests(&self) -> usize {
        *self.received.requests.lock()
    }

    /// Waits until `done` holds for the spans received (or `timeout`
    /// passes) and answers them.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        let deadline = Instant::now() + timeout;
        loop {
            let spans = self.spans();
            if done(&spans) || Instant::now() > deadline {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

async fn answer(received: &Received, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let reply = |status: u16, body: &'static str| {
        Response::builder()
            .status(status)
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap_or_default()
    };
    if request.uri().path() != "/v1/traces" || request.method() != hyper::Method::POST {
        return reply(404, "not found");
    }
    let is_protobuf = request
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == b"application/x-protobuf");
    if !is_protobuf {
        return reply(415, "expected application/x-protobuf");
    }
    let Ok(body) = request.into_body().collect().await else {
        return reply(400, "unreadable body");
    };
    match ExportTraceServiceRequest::decode(body.to_bytes()) {
        Ok(export) => {
            received.take(export);
            let body = ExportTraceServiceResponse {
                partial_success: None,
            }
            .encode_to_vec();
            Response::builder()
                .header(hyper::header::CONTENT_TYPE, "application/x-protobuf")
                .body(Full::new(Bytes::from(body)))
                .unwrap_or_default()
        }
        Err(_) => reply(400, "not an ExportTraceServiceRequest"),
    }
}
