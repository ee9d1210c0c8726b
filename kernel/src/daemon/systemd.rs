//! The systemd notification protocol (`sd_notify`): under `Type=notify`,
//! systemd counts the service started only once it says `READY=1`, and is
//! told `STOPPING=1` as soon as a stop begins. One datagram per state to
//! the socket `NOTIFY_SOCKET` names (a path, or `@name` in the abstract
//! namespace); nothing at all when the variable is unset.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixDatagram;

use crate::command::NOTIFY_SOCKET_ENV as NOTIFY_SOCKET;

/// Tells systemd `state` (newline-separated `KEY=value` lines), when it
/// listens. A failure is logged, never fatal: the kernel runs the same
/// whether or not anyone is told.
pub(crate) fn notify(state: &str) {
    let Some(socket) = std::env::var_os(NOTIFY_SOCKET).filter(|s| !s.is_empty()) else {
        return;
    };
    if let Err(err) = send(&socket, state) {
        tracing::warn!(socket = ?socket, error = %err, "cannot notify systemd");
    }
}

fn send(socket: &OsStr, state: &str) -> std::io::Result<()> {
    let sender = UnixDatagram::unbound()?;
    match socket.as_bytes().strip_prefix(b"@") {
        Some(name) => send_abstract(&sender, name, state),
        None => sender.send_to(state.as_bytes(), socket).map(drop),
    }
}

#[cfg(target_os = "linux")]
fn send_abstract(sender: &UnixDatagram, name: &[u8], state: &str) -> std::io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
    sender.send_to_addr(state.as_bytes(), &addr).map(drop)
}

#[cfg(not(target_os = "linux"))]
fn send_abstract(_: &UnixDatagram, _: &[u8], _: &str) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "abstract socket names are Linux's",
    ))
}
