//! A kernel served over gRPC on 127.0.0.1:0 with a fixed admin token, and
//! clients that carry it.

use std::net::SocketAddr;

use hivekernel_kernel::auth::Authenticator;
use hivekernel_kernel::{Kernel, grpc};
use hivekernel_proto::v1::kernel_client::KernelClient;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

/// The admin token of every [`Served`] kernel.
pub const TOKEN: &str = "0123456789abcdef0123456789abcdef";

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Debug, Clone)]
pub struct Bearer(MetadataValue<Ascii>);

impl Bearer {
    /// A bearer for `token`.
    pub fn new(token: &str) -> Self {
        Bearer(format!("Bearer {token}").parse().unwrap())
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

/// A generated client carrying one token.
pub type Client = KernelClient<InterceptedService<Channel, Bearer>>;

/// A kernel's gRPC server on loopback, until the kernel shuts down.
#[derive(Debug)]
pub struct Served {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its authenticator: issue process tokens with it.
    pub auth: Authenticator,
    channel: Channel,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Served {
    /// Serves `kernel` until its shutdown token is cancelled.
    pub async fn start(kernel: &Kernel) -> Served {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = kernel.shutdown_token();
        let auth = Authenticator::new(TOKEN.to_owned());
        let server = tokio::spawn(grpc::serve(
            kernel.clone(),
            listener,
            auth.clone(),
            async move { stop.cancelled().await },
        ));
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        Served {
            addr,
            auth,
            channel,
            server,
        }
    }

    /// A client acting as the admin; receives messages of any size.
    pub fn admin(&self) -> Client {
        let bearer = Bearer::new(TOKEN);
        KernelClient::with_interceptor(self.channel.clone(), bearer)
            .max_decoding_message_size(usize::MAX)
    }

    /// A client presenting `token` (any string: a process token, or a forged one).
    pub fn with_token(&self, token: &str) -> Client {
        KernelClient::with_interceptor(self.channel.clone(), Bearer::new(token))
    }

    /// Waits for the server to stop (after the kernel's shutdown).
    pub async fn stopped(self) {
        self.server.await.unwrap().unwrap();
    }
}
