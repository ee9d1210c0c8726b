//! The dashboard over TLS: a listener whose connections have finished
//! their handshake, with the control plane's certificate (and, for mutual
//! TLS, its client CA: a browser then presents a client certificate too).
//!
//! Handshakes run in their own tasks, at most [`HANDSHAKES`] at once and
//! each within [`HANDSHAKE_TIMEOUT`], so a client that opens a connection
//! and says nothing holds up no one.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::task::AbortOnDropHandle;

/// Handshakes in progress at most; a connection past it is closed.
const HANDSHAKES: usize = 64;
/// How long a handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long accepting pauses after an error (out of file descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Connections that finished their handshake, for `axum::serve`.
#[derive(Debug)]
pub(super) struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    /// The accepting task, with every handshake under way; ended on drop.
    _accepting: AbortOnDropHandle<()>,
}

impl TlsListener {
    /// Starts accepting on `listener` with `config`.
    pub(super) fn new(
        listener: TcpListener,
        config: Arc<rustls::ServerConfig>,
    ) -> io::Result<Self> {
        let local = listener.local_addr()?;
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
    type Io = TlsStream<TcpStream>;
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
    listener: TcpListener,
    acceptor: TlsAcceptor,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let mut handshakes = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
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
                Err(err) => {
                    tracing::warn!(error = %err, "dashboard: accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            Some(_) = handshakes.join_next(), if !handshakes.is_empty() => {}
        }
    }
}
