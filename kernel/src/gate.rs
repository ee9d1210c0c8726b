//! The door before every listener: each TCP connection passes here before
//! tonic (the control plane) or axum (the dashboard, `/metrics`, `mcp serve
//! --http`) sees it. Each listener has a gate of its own ([`GateSettings`]).
//!
//! - A connection must be *admitted* within `handshake_timeout` of opening,
//!   or it is closed: silence, a partial HTTP/2 preface or request head, a
//!   TLS handshake left hanging and (on the control plane) calls with a bad
//!   token all end the same way. gRPC's auth layer admits a connection when
//!   a call on it carries a valid token; an HTTP listener admits it when a
//!   whole request head has arrived ([`Admission::begin`]).
//! - On an HTTP listener, an admitted connection with no request in flight
//!   for `idle_timeout` is closed too (keep-alive idleness, and a next
//!   request head that never ends). gRPC relies on HTTP/2 keepalive instead.
//! - At most `max` connections are open at once, those not yet admitted
//!   included. At the cap, a new connection takes the place of the oldest
//!   one not yet admitted (on an HTTP listener, else of the oldest idle
//!   one); when there is none, the new one is closed. Either way a warning
//!   says so, at most once per interval, with how often it happened. So
//!   sockets that say nothing can never lock clients out, and clients that
//!   do are bounded by the cap.
//! - `max` is lowered to the listener's share of the open-file limit:
//!   three quarters for the control plane, a sixteenth for each HTTP
//!   listener, so that no HTTP listener can take the descriptors the
//!   control plane, the store and `exec` agents need.
//! - An accept that fails because the process is out of file descriptors
//!   waits a moment instead of spinning, and says so.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::Connected;

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

/// Where a connection stands with its gate: admitted or not, and on an
/// HTTP listener its requests in flight and when the last one ended. What
/// every request on a gated connection carries in its extensions (over TLS
/// too), for the auth layer or the HTTP layer to mark.
#[derive(Debug, Clone, Default)]
pub(crate) struct Admission(Arc<Standing>);

#[derive(Debug, Default)]
struct Standing {
    admitted: AtomicBool,
    in_flight: AtomicUsize,
    /// Milliseconds since [`epoch`] when the last request ended (or the
    /// connection was admitted).
    quiet_since_ms: AtomicU64,
}

/// The clock idle times are read on.
fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl Admission {
    /// A call on this connection carried a valid token (gRPC).
    pub(crate) fn admit(&self) {
        self.0.admitted.store(true, Ordering::Relaxed);
    }

    /// A request's head arrived whole (HTTP): the connection is admitted
    /// and busy until the returned guard is dropped with the response.
    pub(crate) fn begin(&self) -> InFlight {
        self.0.in_flight.fetch_add(1, Ordering::Relaxed);
        self.admit();
        InFlight(self.clone())
    }

    fn is_admitted(&self) -> bool {
        self.0.admitted.load(Ordering::Relaxed)
    }

    /// How long the connection has had no request in flight (zero while one is).
    fn idle_for(&self) -> Duration {
        if self.0.in_flight.load(Ordering::Relaxed) > 0 {
            return Duration::ZERO;
        }
        let since = self.0.quiet_since_ms.load(Ordering::Relaxed);
        Duration::from_millis(now_ms().saturating_sub(since))
    }
}

/// A request in flight on an HTTP connection; its end starts the idle clock.
#[derive(Debug)]
pub(crate) struct InFlight(Admission);

impl Drop for InFlight {
    fn drop(&mut self) {
        let standing = &self.0.0;
        standing.quiet_since_ms.store(now_ms(), Ordering::Relaxed);
        standing.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How one listener's gate treats connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GateSettings {
    /// Connections open at once, at most (before the open-file share).
    pub(crate) max: usize,
    /// Time to admission.
    pub(crate) handshake_timeout: Duration,
    /// HTTP only: time with no request in flight before an admitted connection is closed.
    pub(crate) idle_timeout: Option<Duration>,
    /// The listener's share of the open-file limit as (numerator,
    /// denominator): the control plane takes 3/4, an HTTP listener 1/16.
    pub(crate) share: (u64, u64),
    /// The setting that sets `max`, for warnings (`kernel.connections.max`).
    pub(crate) setting: &'static str,
    /// The listener's name in warnings ("the control plane", "the dashboard").
    pub(crate) listener: &'static str,
}

impl GateSettings {
    /// The control plane's share of the open files.
    pub(crate) const CONTROL_PLANE_SHARE: (u64, u64) = (3, 4);
    /// An HTTP listener's share of the open files.
    pub(crate) const HTTP_SHARE: (u64, u64) = (1, 16);

    /// The control plane's gate, from `kernel.connections`.
    pub(crate) fn control_plane(settings: &crate::config::ConnectionSettings) -> Self {
        GateSettings {
            max: settings.max,
            handshake_timeout: settings.handshake_timeout(),
            idle_timeout: None,
            share: Self::CONTROL_PLANE_SHARE,
            setting: "kernel.connections.max",
            listener: "the control plane",
        }
    }

    /// An HTTP listener's gate, from `kernel.connections.http_*`.
    pub(crate) fn http(
        settings: &crate::config::ConnectionSettings,
        listener: &'static str,
    ) -> Self {
        GateSettings {
            max: settings.http_max,
            handshake_timeout: settings.http_header_timeout(),
            idle_timeout: Some(settings.http_idle_timeout()),
            share: Self::HTTP_SHARE,
            setting: "kernel.connections.http_max",
            listener,
        }
    }
}

/// A connection as the server sees it. Until it is admitted (and, on an
/// HTTP listener, always), every read and write first checks whether the
/// gate has closed it.
pub(crate) struct Gated {
    stream: TcpStream,
    peer: std::net::SocketAddr,
    admission: Admission,
    /// Whether the gate may close it after admission (an idle timeout).
    watched: bool,
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
    /// An error once the gate has closed the connection (not admitted in
    /// time, evicted, or idle on an HTTP listener).
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if (self.watched || !self.admission.is_admitted())
            && self.closing.as_mut().poll(cx).is_ready()
        {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed by the gate: not admitted in time, or idle",
            ));
        }
        Ok(())
    }

    /// Where this connection stands with its gate.
    pub(crate) fn admission(&self) -> &Admission {
        &self.admission
    }

    /// The peer's address.
    pub(crate) fn peer(&self) -> std::net::SocketAddr {
        self.peer
    }
}

/// The connections that passed the gate, and the task that accepts them
/// (aborted, with every waiter, when dropped).
#[derive(Debug)]
pub(crate) struct Gate {
    pub(crate) incoming: mpsc::Receiver<Gated>,
    pub(crate) accepting: tokio_util::task::AbortOnDropHandle<()>,
}

/// Starts accepting on `listener`, with `settings.max` lowered to the
/// listener's share of the open-file limit.
pub(crate) fn open(listener: TcpListener, mut settings: GateSettings) -> Gate {
    if let Some(fds) = open_file_limit() {
        let (num, den) = settings.share;
        let room = usize::try_from(fds / den * num)
            .unwrap_or(usize::MAX)
            .max(1);
        if settings.max > room {
            tracing::warn!(
                configured = settings.max,
                open_file_limit = fds,
                using = room,
                "{} is more than the open-file limit leaves room for {}",
                settings.setting,
                settings.listener
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

/// A gate as axum's listener: `axum::serve(gate::Listener::open(..), app)`.
#[derive(Debug)]
pub(crate) struct Listener {
    gate: Gate,
    local: std::net::SocketAddr,
}

impl Listener {
    /// Gates `listener` with `settings`.
    pub(crate) fn open(listener: TcpListener, settings: GateSettings) -> io::Result<Self> {
        let local = listener.local_addr()?;
        Ok(Listener {
            gate: open(listener, settings),
            local,
        })
    }

    /// The next connection past the gate; never resolves once the gate is gone.
    pub(crate) async fn next(&mut self) -> Gated {
        match self.gate.incoming.recv().await {
            Some(gated) => gated,
            None => std::future::pending().await,
        }
    }
}

impl axum::serve::Listener for Listener {
    type Io = Gated;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let gated = self.next().await;
        let peer = gated.peer;
        (gated, peer)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Listener>>
    for Admission
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, Listener>) -> Self {
        stream.io().admission.clone()
    }
}

/// Serves `app` on `listener` behind a gate until `shutdown` resolves, then
/// lets open requests finish.
pub(crate) async fn serve_http(
    listener: TcpListener,
    settings: GateSettings,
    app: axum::Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let listener = Listener::open(listener, settings)?;
    let app = app.layer(axum::middleware::from_fn(http_layer));
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<Admission>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

/// The HTTP layer of a gated listener: each request marks its connection
/// admitted and busy until its response (a stream too) is done.
pub(crate) async fn http_layer(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let Some(admission) = request
        .extensions()
        .get::<axum::extract::ConnectInfo<Admission>>()
        .map(|info| info.0.clone())
    else {
        return next.run(request).await;
    };
    let in_flight = admission.begin();
    let response = next.run(request).await;
    response.map(|body| {
        axum::body::Body::new(Busy {
            body,
            _in_flight: in_flight,
        })
    })
}

/// A response body that keeps its connection busy until it is done.
struct Busy {
    body: axum::body::Body,
    /// Held for its drop, which ends the request.
    _in_flight: InFlight,
}

impl http_body::Body for Busy {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
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

/// An open connection, as the accept loop keeps it.
struct Waiting {
    admission: Admission,
    ended: CancellationToken,
}

/// The accept loop: ends when the server stops taking connections.
async fn accept(listener: TcpListener, settings: GateSettings, tx: mpsc::Sender<Gated>) {
    let open = Arc::new(AtomicUsize::new(0));
    // Connections that may be closed to make room, oldest first: those not
    // known to be admitted (and on an HTTP listener, every open one).
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
                                listener = settings.listener,
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
            if evict_oldest(&mut waiting, settings.idle_timeout.is_some()) {
                if let Some(count) = evicted.hit() {
                    tracing::warn!(
                        max = settings.max,
                        count,
                        listener = settings.listener,
                        "connection limit reached ({}): closing the oldest connections \
                         that have made no authenticated call or are idle",
                        settings.setting
                    );
                }
            } else {
                drop(stream);
                if let Some(count) = refused.hit() {
                    tracing::warn!(
                        max = settings.max, count, %peer,
                        listener = settings.listener,
                        "connection limit reached ({}): every open connection is \
                         busy; closing new ones",
                        settings.setting
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
        waiters.spawn(watch(
            id,
            admission.clone(),
            ended.clone(),
            settings.handshake_timeout,
            settings.idle_timeout,
        ));
        let gated = Gated {
            stream,
            peer,
            watched: settings.idle_timeout.is_some(),
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

/// Closes the oldest connection not yet admitted, else the oldest idle
/// one (HTTP); false when there is none. The gRPC gate keeps only those
/// not yet admitted, so an admitted one is never taken there.
fn evict_oldest(waiting: &mut BTreeMap<u64, Waiting>, http: bool) -> bool {
    waiting.retain(|_, conn| !conn.ended.is_cancelled());
    let chosen = waiting
        .iter()
        .find(|(_, conn)| !conn.admission.is_admitted())
        .or_else(|| {
            waiting
                .iter()
                .find(|(_, conn)| http && conn.admission.idle_for() > Duration::ZERO)
        })
        .map(|(id, _)| *id);
    match chosen.and_then(|id| waiting.remove(&id)) {
        Some(conn) => {
            conn.ended.cancel();
            true
        }
        None => false,
    }
}

/// Closes the connection unless it is admitted within `timeout`, and (with
/// `idle`) once it has had no request in flight for `idle`; ends early when
/// the connection does. Returns `id`: on the control plane as soon as the
/// connection is admitted, which takes it off the list of those that may
/// be closed to make room.
async fn watch(
    id: u64,
    admission: Admission,
    ended: CancellationToken,
    timeout: Duration,
    idle: Option<Duration>,
) -> u64 {
    tokio::select! {
        () = tokio::time::sleep(timeout) => {}
        () = ended.cancelled() => return id,
    }
    if !admission.is_admitted() {
        tracing::debug!("connection closed: not admitted within the handshake timeout");
        ended.cancel();
        return id;
    }
    let Some(idle) = idle else {
        return id;
    };
    loop {
        let quiet = admission.idle_for();
        if quiet >= idle {
            tracing::debug!("connection closed: idle");
            ended.cancel();
            return id;
        }
        let wait = if quiet.is_zero() { idle } else { idle - quiet };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = ended.cancelled() => return id,
        }
    }
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
