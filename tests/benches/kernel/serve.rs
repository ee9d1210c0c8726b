//! The servers the bench talks to over loopback, and its clients: the
//! kernel as `hivekernel start` serves it, and the floor's bare tonic server.

use std::net::SocketAddr;
use std::time::Duration;

use hivekernel_kernel::auth::Authenticator;
use hivekernel_kernel::{Kernel, grpc};
use hivekernel_proto::v1::kernel_client::KernelClient;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Status};

/// The admin token of the bench's servers.
pub(crate) const TOKEN: &str = "bench-0123456789abcdef0123456789abcdef";

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Debug, Clone)]
pub(crate) struct Bearer(MetadataValue<Ascii>);

impl Bearer {
    pub(crate) fn new(token: &str) -> Bearer {
        Bearer(
            format!("Bearer {token}")
                .parse()
                .expect("a token is valid ASCII metadata"),
        )
    }
}

impl Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        request
            .metadata_mut()
            .insert("authorization", self.0.clone());
        Ok(request)
    }
}

pub(crate) type KernelRpc = KernelClient<InterceptedService<Channel, Bearer>>;

/// An HTTP/2 channel to `addr` (`http://host:port`).
pub(crate) async fn connect(addr: &str) -> Channel {
    Endpoint::from_shared(addr.to_owned())
        .expect("a valid URI")
        .tcp_nodelay(true)
        .connect()
        .await
        .unwrap_or_else(|err| panic!("connect to {addr}: {err}"))
}

/// A kernel served over gRPC on 127.0.0.1:0, as `grpc::serve` serves it in `hivekernel start`.
pub(crate) struct Served {
    pub(crate) kernel: Kernel,
    pub(crate) addr: String,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Served {
    pub(crate) async fn start(kernel: Kernel) -> Served {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = format!("http://{}", local(&listener));
        let stop = kernel.shutdown_token();
        let server = tokio::spawn(grpc::serve(
            kernel.clone(),
            listener,
            Authenticator::new(TOKEN.to_owned()),
            async move { stop.cancelled().await },
        ));
        Served {
            kernel,
            addr,
            server,
        }
    }

    pub(crate) async fn client(&self) -> KernelRpc {
        KernelClient::with_interceptor(connect(&self.addr).await, Bearer::new(TOKEN))
    }

    pub(crate) async fn stop(self) {
        self.kernel.shutdown().await;
        tokio::time::timeout(Duration::from_secs(10), self.server)
            .await
            .expect("server stops within 10 s")
            .expect("server task")
            .expect("server ends cleanly");
    }
}

fn local(listener: &TcpListener) -> SocketAddr {
    listener.local_addr().expect("bound address")
}

/// The floor's server: the health service alone, no auth layer.
pub(crate) struct Empty {
    pub(crate) addr: String,
    stop: oneshot::Sender<()>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Empty {
    pub(crate) async fn start() -> Empty {
        let (_reporter, health) = tonic_health::server::health_reporter();
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = format!("http://{}", local(&listener));
        // The kernel's server turns Nagle off too.
        let incoming = TcpListenerStream::new(listener).map(|conn| {
            conn.inspect(|stream| {
                let _ = stream.set_nodelay(true);
            })
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(
            Server::builder()
                .add_service(health)
                .serve_with_incoming_shutdown(incoming, async move {
                    let _ = stopped.await;
                }),
        );
        Empty { addr, stop, server }
    }

    pub(crate) async fn stop(self) {
        let _ = self.stop.send(());
        self.server
            .await
            .expect("server task")
            .expect("server ends cleanly");
    }
}
