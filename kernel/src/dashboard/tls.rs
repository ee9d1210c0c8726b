//! The dashboard over TLS: a listener whose connections have finished
//! their handshake, with the control plane's certificate (and, for mutual
//! TLS, its client CA: a browser then presents a client certificate too).
//!
//! Connections come through the dashboard's gate (gate.rs) first, which
//! closes them when no request head has arrived whole in time, handshake
//! included. Handshakes run in their own tasks, at most [`HANDSHAKES`] at
//! once and each within [`HANDSHAKE_TIMEOUT`], so a client that opens a
//! connection and says nothing holds up no one.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::task::AbortOnDropHandle;

use crate::gate::{self, Admission, GateSettings, Gated};

/// Handshakes in progress at most; a connection past it is closed.
const HANDSHAKES: usize = 64;
/// How long a handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections that finished their handshake, for `axum::serve`.
#[derive(Debug)]
pub(super) struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<Gated>, SocketAddr)>,
    local: SocketAddr,
    /// The accepting task, with every handshake under way; ended on drop.
    _accepting: AbortOnDropHandle<()>,
}

impl TlsListener {
    /// Starts accepting on `listener` with `config`.
    pub(super) fn new(
        listener: TcpListener,
        settings: GateSettings,
        config: Arc<rustls::ServerConfig>,
    ) -> io::Result<Self> {
        let listener = gate::Listener::open(listener, settings)?;
        let local = axum::serve::Listener::local_addr(&listener)?;
        let (tx, ready) = mpsc::channel(HANDSHAKES);
        let accepting = tokio::spawn(accept(listener, TlsAcceptor::from(config), tx));
        Ok(TlsListener {
            ready,
            local,
            _accepting: AbortOnDropHandle::new(accepting),
        })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<Gated>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accepting task is gone only once this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

async fn accept(
    mut listener: gate::Listener,
    acceptor: TlsAcceptor,
    ready: mpsc::Sender<(TlsStream<Gated>, SocketAddr)>,
) {
    let mut handshakes = JoinSet::new();
    loop {
        tokio::select! {
            stream = listener.next() => {
                let peer = stream.peer();
                if handshakes.len() >= HANDSHAKES {
                    tracing::warn!(%peer, "dashboard: too many TLS handshakes at once; connection closed");
                    continue;
                }
                let acceptor = acceptor.clone();
                let ready = ready.clone();
                handshakes.spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = ready.send((tls, peer)).await;
                        }
                        Ok(Err(err)) => tracing::debug!(%peer, error = %err, "dashboard: TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "dashboard: TLS handshake timed out"),
                    }
                });
            }
            Some(_) = handshakes.join_next(), if !handshakes.is_empty() => {}
        }
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TlsListener>>
    for Admission
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, TlsListener>) -> Self {
        stream.io().get_ref().0.admission().clone()
    }
}
