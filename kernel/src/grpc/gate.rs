//! The door before gRPC: every TCP connection passes here before tonic
//! sees it (`kernel.connections`).
//!
//! - A connection must make its first authenticated call within
//!   `handshake_timeout` of opening, or it is closed: silence, a partial
//!   HTTP/2 preface, a TLS handshake left hanging and calls with a bad
//!   token all end the same way. The auth layer marks the connection
//!   ([`Admission`]) when a call on it carries a valid token.
//! - At most `max` connections are open at once, those not yet admitted
//!   included. At the cap, a new connection takes the place of the oldest
//!   one not yet admitted; when every open one is admitted, the new one is
//!   closed. Either way a warning says so, at most once per interval, with
//!   how often it happened. So sockets without a token can never lock
//!   clients out, and clients with one are bounded by the cap.
//! - An accept that fails because the process is out of file descriptors
//!   waits a moment instead of spinning, and says so.
//!
//! After admission, HTTP/2 keepalive (set on the server) closes connections
//! whose peer stopped answering.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::Connected;

use crate::config::ConnectionSettings;

/// Connections accepted and not yet handed to tonic, at most.
const HANDOFF: usize = 64;
/// How long accepting pauses when the process is out of file descriptors.
const FD_BACKOFF: Duration = Duration::from_millis(100);
/// Shortest time between two warnings of the same kind.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// One open connection's place under the cap; given back when dropped.
#[derive(Debug)]
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(open: &Arc<AtomicUsize>) -> Slot {
        open.fetch_add(1, Ordering::Relaxed);
        Slot(open.clone())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Whether a connection has made an authenticated call: what every request
/// on a gated connection carries in its extensions (over TLS too), for the
/// auth layer to mark.
#[derive(Debug, Clone, Default)]
pub(crate) struct Admission(Arc<AtomicBool>);

impl Admission {
    /// A call on this connection carried a valid token.
    pub(crate) fn admit(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn is_admitted(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// A connection as tonic serves it. Until it is admitted, every read and
/// write first checks whether the gate has closed it.
pub(super) struct Gated {
    stream: TcpStream,
    admission: Admission,
    /// Cancelled by the gate (timeout, eviction), or by this value's drop.
    ended: CancellationToken,
    closing: Pin<Box<WaitForCancellationFutureOwned>>,
    _slot: Slot,
}

impl Drop for Gated {
    fn drop(&mut self) {
        // Its waiter ends now rather than at the timeout.
        self.ended.cancel();
    }
}

impl Gated {
    /// An error once the gate has closed a connection not yet admitted.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if !self.admission.is_admitted() && self.closing.as_mut().poll(cx).is_ready() {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed by the gate: no authenticated call in time",
            ));
        }
        Ok(())
    }
}

/// The connections that passed the gate, for tonic, and the task that
/// accepts them (aborted, with every waiter, when dropped).
pub(super) struct Gate {
    pub(super) incoming: mpsc::Receiver<Gated>,
    pub(super) accepting: tokio_util::task::AbortOnDropHandle<()>,
}

/// Starts accepting on `listener`, with `settings.max` lowered to what the
/// open-file limit allows (three quarters of it: the store, logs and
/// `exec` agents need descriptors too).
pub(super) fn open(listener: TcpListener, mut settings: ConnectionSettings) -> Gate {
    if let Some(fds) = open_file_limit() {
        let room = usize::try_from(fds / 4 * 3).unwrap_or(usize::MAX).max(1);
        if settings.max > room {
            tracing::warn!(
                configured = settings.max,
                open_file_limit = fds,
                using = room,
                "kernel.connections.max is more than the open-file limit leaves room for"
            );
            settings.max = room;
        }
    }
    let (tx, incoming) = mpsc::channel(HANDOFF);
    let accepting = tokio::spawn(accept(listener, settings, tx));
    Gate {
        incoming,
        accepting: tokio_util::task::AbortOnDropHandle::new(accepting),
    }
}

/// This process's soft limit on open files, when it has one.
fn open_file_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// Raises this process's soft limit on open files to its hard limit, as
/// servers do: the default soft limit (often 1,024) is a compatibility
/// setting for `select()`, which nothing here uses. Returns the new limit.
pub fn raise_open_file_limit() -> Option<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        if let Err(err) = setrlimit(Resource::Nofile, limit) {
            tracing::debug!(error = %err, "cannot raise the open-file limit");
        }
    }
    open_file_limit()
}

/// A warning that is logged at most once per [`WARN_EVERY`], with how many
/// times its cause happened since the last one.
struct Throttled {
    last: Option<Instant>,
    since: u64,
}

impl Throttled {
    fn new() -> Self {
        Throttled {
            last: None,
            since: 0,
        }
    }

    /// Counts one; `Some(count)` when it is time to say so.
    fn hit(&mut self) -> Option<u64> {
        self.since += 1;
        let now = Instant::now();
        if self.last.is_some_and(|at| now < at + WARN_EVERY) {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.since))
    }
}

/// A connection not yet admitted, as the accept loop keeps it.
struct Waiting {
    admission: Admission,
    ended: CancellationToken,
}

/// The accept loop: ends when tonic stops taking connections.
async fn accept(listener: TcpListener, settings: ConnectionSettings, tx: mpsc::Sender<Gated>) {
    let open = Arc::new(AtomicUsize::new(0));
    // Connections not known to be admitted, oldest first.
    let mut waiting: BTreeMap<u64, Waiting> = BTreeMap::new();
    let mut waiters: JoinSet<u64> = JoinSet::new();
    let mut next_id = 0u64;
    let mut evicted = Throttled::new();
    let mut refused = Throttled::new();
    let mut out_of_fds = Throttled::new();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    if is_out_of_fds(&err) {
                        if let Some(count) = out_of_fds.hit() {
                            tracing::warn!(
                                error = %err, count,
                                "cannot accept connections: out of file descriptors \
                                 (raise the open-file limit, or lower kernel.connections.max)"
                            );
                        }
                        tokio::time::sleep(FD_BACKOFF).await;
                    } else {
                        tracing::debug!(error = %err, "accept failed");
                    }
                    continue;
                }
            },
            Some(done) = waiters.join_next(), if !waiters.is_empty() => {
                if let Ok(id) = done {
                    waiting.remove(&id);
                }
                continue;
            }
            () = tx.closed() => return,
        };
        if open.load(Ordering::Relaxed) >= settings.max {
            if evict_oldest(&mut waiting) {
                if let Some(count) = evicted.hit() {
                    tracing::warn!(
                        max = settings.max,
                        count,
                        "connection limit reached (kernel.connections.max): closing the \
                         oldest connections that have made no authenticated call"
                    );
                }
            } else {
                drop(stream);
                if let Some(count) = refused.hit() {
                    tracing::warn!(
                        max = settings.max, count, %peer,
                        "connection limit reached (kernel.connections.max): every open \
                         connection is authenticated; closing new ones"
                    );
                }
                continue;
            }
        }
        // Unary calls are small request/response pairs: do not let Nagle delay them.
        let _ = stream.set_nodelay(true);
        let id = next_id;
        next_id += 1;
        let admission = Admission::default();
        let ended = CancellationToken::new();
        waiting.insert(
            id,
            Waiting {
                admission: admission.clone(),
                ended: ended.clone(),
            },
        );
        waiters.spawn(wait_for_admission(
            id,
            admission.clone(),
            ended.clone(),
            settings.handshake_timeout,
        ));
        let gated = Gated {
            stream,
            admission,
            closing: Box::pin(ended.clone().cancelled_owned()),
            ended,
            _slot: Slot::take(&open),
        };
        if tx.send(gated).await.is_err() {
            return;
        }
    }
}

/// Closes the oldest connection not yet admitted; false when there is none.
fn evict_oldest(waiting: &mut BTreeMap<u64, Waiting>) -> bool {
    while let Some((_, oldest)) = waiting.pop_first() {
        if !oldest.admission.is_admitted() && !oldest.ended.is_cancelled() {
            oldest.ended.cancel();
            return true;
        }
    }
    false
}

/// Closes the connection unless it is admitted within `timeout`; ends
/// early when the connection does. Returns `id`.
async fn wait_for_admission(
    id: u64,
    admission: Admission,
    ended: CancellationToken,
    timeout: Duration,
) -> u64 {
    tokio::select! {
        () = tokio::time::sleep(timeout) => {
            if !admission.is_admitted() {
                tracing::debug!("connection closed: no authenticated call within the handshake timeout");
                ended.cancel();
            }
        }
        () = ended.cancelled() => {}
    }
    id
}

/// EMFILE or ENFILE: this process, or the whole system, has no file descriptor left.
fn is_out_of_fds(err: &io::Error) -> bool {
    let raw = err.raw_os_error();
    raw == Some(rustix::io::Errno::MFILE.raw_os_error())
        || raw == Some(rustix::io::Errno::NFILE.raw_os_error())
}

impl Connected for Gated {
    type ConnectInfo = Admission;

    fn connect_info(&self) -> Admission {
        self.admission.clone()
    }
}

impl AsyncRead for Gated {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Gated {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
