//! A TCP link on loopback that a test can cut and mend: a relay from a
//! port of its own to one upstream address. Cut, it stops carrying bytes
//! either way but keeps every connection open, so the peers see a network
//! that went silent (a partition), not a closed socket they would recover
//! from at once; mended, it carries what waited, in order. Taken down, it
//! closes every connection and refuses new ones until it is up again: the
//! peers see their connection drop and cannot reconnect. Dropping the
//! link closes its connections and ends its threads.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often a waiting relay thread looks at the link again.
const POLL: Duration = Duration::from_millis(10);

/// A relay to one upstream address; see the module docs.
#[derive(Debug)]
pub struct Link {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct Shared {
    cut: AtomicBool,
    down: AtomicBool,
    closed: AtomicBool,
    /// Every socket of the relayed connections, to close them at drop.
    sockets: Mutex<Vec<TcpStream>>,
    relays: Mutex<Vec<JoinHandle<()>>>,
}

impl Link {
    /// A link to `upstream` (`host:port`), listening on a free loopback port.
    pub fn to(upstream: &str) -> Link {
        let upstream: SocketAddr = upstream
            .parse()
            .unwrap_or_else(|err| panic!("link upstream {upstream}: {err}"));
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port for a link");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let addr = listener.local_addr().expect("the link's address");
        let shared = Arc::new(Shared::default());
        let accepting = shared.clone();
        let acceptor = std::thread::spawn(move || accept(&listener, upstream, &accepting));
        Link {
            addr,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// Where clients connect: `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where clients connect: `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    /// Stops carrying bytes, leaving the connections open.
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::SeqCst);
    }

    /// Carries bytes again, what waited first.
    pub fn mend(&self) {
        self.shared.cut.store(false, Ordering::SeqCst);
    }

    /// Closes every connection and refuses new ones until [`Link::up`].
    pub fn down(&self) {
        self.shared.down.store(true, Ordering::SeqCst);
        self.close_all();
    }

    /// Takes connections again.
    pub fn up(&self) {
        self.shared.down.store(false, Ordering::SeqCst);
    }

    /// Closes every connection it carries.
    fn close_all(&self) {
        let sockets: Vec<TcpStream> = self
            .shared
            .sockets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
            .collect();
        for socket in sockets {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        // No connection is added once the acceptor has ended.
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        self.close_all();
        let relays: Vec<_> = self
            .shared
            .relays
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
            .collect();
        for relay in relays {
            let _ = relay.join();
        }
    }
}

/// Takes connections until the link is dropped, relaying each to `upstream`.
fn accept(listener: &TcpListener, upstream: SocketAddr, shared: &Arc<Shared>) {
    while !shared.closed.load(Ordering::SeqCst) {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(err) if err.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(POLL);
                continue;
            }
            Err(_) => return,
        };
        // Refused: closed as it comes.
        if shared.down.load(Ordering::SeqCst) {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let Ok(server) = TcpStream::connect(upstream) else {
            continue;
        };
        if client.set_nonblocking(false).is_err() {
            continue;
        }
        let clones = (
            client.try_clone(),
            server.try_clone(),
            client.try_clone(),
            server.try_clone(),
        );
        let (Ok(to_client), Ok(to_server), Ok(client_kept), Ok(server_kept)) = clones else {
            continue;
        };
        shared
            .sockets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend([client_kept, server_kept]);
        let mut relays = shared.relays.lock().unwrap_or_else(PoisonError::into_inner);
        for (from, to) in [(client, to_server), (server, to_client)] {
            let shared = shared.clone();
            relays.push(std::thread::spawn(move || relay(from, to, &shared)));
        }
    }
}

/// Copies `from` to `to` until either closes, holding what it read while
/// the link is cut.
fn relay(mut from: TcpStream, mut to: TcpStream, shared: &Shared) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        while shared.cut.load(Ordering::SeqCst) {
            if shared.closed.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(POLL);
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
