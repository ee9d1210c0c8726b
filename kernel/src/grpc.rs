//! The gRPC control plane: the `hivekernel.v1.Kernel` service, the standard
//! health service and server reflection, all behind one authentication layer.
//!
//! Every request but a health check (reflection included) must carry
//! `authorization: Bearer <token>`. The standard `grpc.health.v1.Health`
//! service answers anyone: it says only whether the kernel serves, and load
//! balancers and Kubernetes' gRPC probes send no credentials. It is
//! `SERVING` once the store is open and the config's agents are up (the
//! server starts only then) and `NOT_SERVING` from the moment a stop begins.
//! The layer turns the token into a
//! [`Caller`] and stores it in the request's extensions; handlers act as that
//! caller and nothing else in the request can change who it is. The same
//! layer refuses a call the caller's scope does not cover
//! ([`crate::auth::check_scope`]), before any handler runs.
//!
//! Layout: `service` (the Kernel service handlers), `streams` (producers of
//! the streaming RPCs), `attach` (Attach and CompleteTask, for external agents), `convert` (proto <-> kernel types and argument
//! checks), `status` (`KernelError` -> `tonic::Status`), `reload` (the
//! ReloadConfig answer), `local` (the service called in-process, by the
//! dashboard).

mod attach;
mod convert;
mod cron;
mod decode;
pub(crate) mod enums;
mod inbox;
mod local;
mod mcp;
mod measure;
mod reload;
pub use crate::gate::raise_open_file_limit;
pub use local::{Answer, LocalService};
pub(crate) use measure::code_name;
mod service;
mod skills;
mod standing;
mod status;
mod streams;
mod tokens;
mod transcript;

use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;

use hivekernel_proto::v1::kernel_server::{KernelServer, SERVICE_NAME};
use tokio::net::TcpListener;
use tokio_stream::StreamExt as _;
use tokio_util::sync::CancellationToken;
use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;
use tonic::service::InterceptorLayer;
use tonic::transport::{Server, ServerTlsConfig};
use tonic::{Request, Status};
use tonic_health::ServingStatus;

use crate::auth::Authenticator;
use crate::kernel::{Caller, Kernel};
use crate::reload::ConfigReload;
use service::KernelService;

/// How long open calls may take to finish once shutdown is asked for.
const DRAIN_GRACE: Duration = Duration::from_secs(5);

/// Serves the control plane in plain text on `listener` until `shutdown`
/// resolves, then lets open calls finish for a short grace period.
pub async fn serve(
    kernel: Kernel,
    listener: TcpListener,
    auth: Authenticator,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    serve_with_tls(kernel, listener, auth, None, None, shutdown).await
}

/// [`serve`], over TLS when `tls` is given (see [`crate::tls::ServerTls`]),
/// answering `ReloadConfig` through `reload` when given (without it,
/// `ReloadConfig` is FAILED_PRECONDITION: no config file to read again).
pub async fn serve_with_tls(
    kernel: Kernel,
    listener: TcpListener,
    auth: Authenticator,
    tls: Option<ServerTlsConfig>,
    reload: Option<Arc<dyn ConfigReload>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let (mut health, health_service) = tonic_health::server::health_reporter();
    set_health(&mut health, ServingStatus::Serving).await;

    let auth = auth.with_operators(kernel.tokens().registry());
    let drain = CancellationToken::new();
    let connections = kernel.settings().connections;
    let mut server = Server::builder();
    if let Some(tls) = tls {
        // Handshakes run in tonic's own tasks, so a slow client never holds up accepting.
        server = server.tls_config(tls)?;
    }
    let router = server
        // Idle connections are pinged, so dead clients' streams end.
        .http2_keepalive_interval(Some(connections.keepalive_interval()))
        .http2_keepalive_timeout(Some(connections.keepalive_timeout()))
        // Outermost: it sees every answer, the auth layer's refusals too.
        .layer(measure::MeasureLayer(kernel.metrics()))
        // The interceptor below reads the method this notes.
        .layer(tower::util::MapRequestLayer::new(note_method))
        .layer(InterceptorLayer::new(move |request| {
            authenticate(&auth, request)
        }))
        // After authentication: a stranger learns nothing of the node's standing.
        .layer(standing::StandingLayer(kernel.clone()))
        .layer(decode::DecodeErrorsLayer)
        .add_service(health_service)
        .add_service(
            KernelServer::new(KernelService::new(kernel.clone(), drain.clone(), reload))
                .max_decoding_message_size(max_request_bytes(&kernel)),
        )
        .add_service(OnFirstCall::new(reflection_v1))
        .add_service(OnFirstCall::new(reflection_v1alpha));

    // Owns the accept loop: it ends, with every connection still silent, with this function.
    let gate = crate::gate::open(
        listener,
        crate::gate::GateSettings::control_plane(&connections),
    );
    let incoming = tokio_stream::wrappers::ReceiverStream::new(gate.incoming)
        .map(Ok::<_, std::convert::Infallible>);
    let _accepting = gate.accepting;
    let server = router.serve_with_incoming_shutdown(incoming, drain.clone().cancelled_owned());
    tokio::pin!(server);
    let stopping = kernel.stopping_token();
    let mut shutdown = std::pin::pin!(shutdown);
    tokio::select! {
        result = &mut server => return result,
        () = stopping.cancelled() => {
            // Probes see NOT_SERVING while the processes stop; calls are
            // still answered until the server drains.
            set_health(&mut health, ServingStatus::NotServing).await;
            tokio::select! {
                result = &mut server => return result,
                () = &mut shutdown => {}
            }
        }
        () = &mut shutdown => {}
    }

    // Watchers see NOT_SERVING, then their streams end as the statuses go:
    // open streams would otherwise hold the drain open.
    set_health(&mut health, ServingStatus::NotServing).await;
    for service in ["", SERVICE_NAME] {
        health.clear_service_status(service).await;
    }
    drain.cancel();
    match tokio::time::timeout(DRAIN_GRACE, server).await {
        Ok(result) => result,
        Err(_) => {
            // tonic runs connections as their own tasks; those still open
            // end when the runtime does.
            tracing::warn!(
                grace_ms = DRAIN_GRACE.as_millis() as u64,
                "gRPC calls still open after the grace period; not waiting for them"
            );
            Ok(())
        }
    }
}

/// Sets the status of the server as a whole and of the kernel service.
async fn set_health(health: &mut tonic_health::server::HealthReporter, status: ServingStatus) {
    for service in ["", SERVICE_NAME] {
        health.set_service_status(service, status).await;
    }
}

/// Largest request the server decodes: tonic's 4 MiB default, or more when
/// the largest artifact, payload or spawn `kernel.limits` allow (plus room
/// for the other fields) needs it. Anything past a limit inside that is
/// refused by the limit, with its name.
pub(crate) fn max_request_bytes(kernel: &Kernel) -> usize {
    const DEFAULT: usize = 4 << 20;
    let settings = kernel.settings();
    let artifact = usize::try_from(settings.artifacts.max_bytes).unwrap_or(usize::MAX);
    let limits = &settings.limits;
    let spawn = limits.prompt_bytes.saturating_add(limits.command_bytes);
    artifact
        .max(limits.payload_bytes)
        .max(spawn)
        .saturating_add(64 << 10)
        .max(DEFAULT)
}

/// The gRPC method a request calls (`/package.Service/Method`): what the
/// scope check needs, and the interceptor cannot see.
#[derive(Debug, Clone)]
struct MethodPath(Arc<str>);

fn note_method(mut request: http::Request<Body>) -> http::Request<Body> {
    let path = MethodPath(Arc::from(request.uri().path()));
    request.extensions_mut().insert(path);
    request
}

/// The authentication layer's check: replaces the credential with the
/// caller it names, and refuses a method the caller's scope does not cover.
fn authenticate(auth: &Authenticator, mut request: Request<()>) -> Result<Request<()>, Status> {
    let path = request
        .extensions()
        .get::<MethodPath>()
        .map(|p| p.0.clone());
    if path.as_deref().is_some_and(is_health_check) {
        // Answered, but the connection is not admitted: one that only
        // checks health is closed after the handshake timeout like any
        // other that never authenticated (probes open one per check), so
        // health checks cannot hold connection slots.
        request.metadata_mut().remove("authorization");
        return Ok(request);
    }
    let caller: Caller = {
        let mut values = request.metadata().get_all("authorization").iter();
        let first = values.next();
        let header = match (first, values.next()) {
            // Two credentials are ambiguous: refuse them as a bad one.
            (Some(_), Some(_)) => Some(""),
            (first, None) => first.map(|v| v.to_str().unwrap_or("")),
            (None, Some(_)) => None,
        };
        auth.authenticate(header)?
    };
    // Without a path (never, with the layer above) the call needs the most:
    // an unknown method of the kernel service needs the admin scope.
    crate::auth::check_scope(caller, path.as_deref().unwrap_or("/hivekernel.v1.Kernel/?"))?;
    // Handlers never see the token, so it cannot end up in a log by accident.
    request.metadata_mut().remove("authorization");
    // The connection has proved itself: the gate stops timing it.
    if let Some(admission) = request.extensions().get::<crate::gate::Admission>() {
        admission.admit();
    }
    request.extensions_mut().insert(caller);
    Ok(request)
}

/// Whether `path` is a method of the standard health service (`Check`,
/// `Watch`, or one a newer client knows: the service answers UNIMPLEMENTED).
fn is_health_check(path: &str) -> bool {
    path.strip_prefix("/grpc.health.v1.Health/")
        .is_some_and(|method| !method.contains('/'))
}

/// A service made on its first call, and shared by every call after it.
///
/// Making a reflection service decodes every descriptor it describes, the
/// largest piece of CPU between `kernel.addr` and the first answered RPC,
/// for a service most clients never call. A service that cannot be made
/// answers UNIMPLEMENTED, as if it were not there.
struct OnFirstCall<S, F> {
    made: Arc<OnceLock<Option<S>>>,
    make: F,
}

impl<S, F: Fn() -> Option<S>> OnFirstCall<S, F> {
    fn new(make: F) -> Self {
        OnFirstCall {
            made: Arc::new(OnceLock::new()),
            make,
        }
    }
}

impl<S, F: Clone> Clone for OnFirstCall<S, F> {
    fn clone(&self) -> Self {
        OnFirstCall {
            made: self.made.clone(),
            make: self.make.clone(),
        }
    }
}

impl<S: NamedService, F> NamedService for OnFirstCall<S, F> {
    const NAME: &'static str = S::NAME;
}

impl<S, F, B> Service<http::Request<B>> for OnFirstCall<S, F>
where
    S: Service<http::Request<B>, Response = http::Response<Body>, Error = Infallible>
        + NamedService
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    F: Fn() -> Option<S>,
    B: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let Some(service) = self.made.get_or_init(&self.make) else {
            let status = Status::unimplemented(format!("{} is unavailable", S::NAME));
            return Box::pin(std::future::ready(Ok(status.into_http())));
        };
        let mut service = service.clone();
        Box::pin(async move {
            std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
            service.call(request).await
        })
    }
}

/// Every service this server describes: the kernel's, health and reflection itself.
fn reflection_builder() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(hivekernel_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET)
}

fn reflection_v1() -> Option<
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
> {
    reflection_builder()
        .build_v1()
        .inspect_err(|err| tracing::error!(error = %err, "reflection v1 disabled"))
        .ok()
}

fn reflection_v1alpha() -> Option<
    tonic_reflection::server::v1alpha::ServerReflectionServer<
        impl tonic_reflection::server::v1alpha::ServerReflection,
    >,
> {
    reflection_builder()
        .build_v1alpha()
        .inspect_err(|err| tracing::error!(error = %err, "reflection v1alpha disabled"))
        .ok()
}
