//! Running under a service manager: the real binary tells systemd's
//! notification socket READY=1 once it serves, and STOPPING=1 as soon as a
//! stop begins (a path socket and an abstract one).

#![allow(clippy::unwrap_used)]

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use hivekernel_tests::binary::Binary;

/// The next notification, as text.
fn next(socket: &UnixDatagram) -> String {
    let mut buf = [0u8; 4096];
    let n = socket.recv(&mut buf).unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn config(dir: &std::path::Path) {
    let config = serde_json::json!({
        "kernel": { "listen": "127.0.0.1:0" },
        "llm": { "provider": "scripted" },
        "agents": [{ "name": "echo", "role": "daemon", "runtime": "echo" }]
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
}

fn ready_then_stopping(bin: &std::path::Path, socket: &UnixDatagram, name: &str) {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let kernel = Binary::start_with_env(bin, dir.path(), &[], &[("NOTIFY_SOCKET", name)]);
    let ready = next(socket);
    let lines: Vec<&str> = ready.lines().collect();
    assert!(lines.contains(&"READY=1"), "{ready}");
    assert!(
        lines.contains(&format!("MAINPID={}", kernel.child.id()).as_str()),
        "{ready}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("STATUS=serving on 127.0.0.1:")),
        "{ready}"
    );
    // Ready means served: the control plane answers now.
    assert!(kernel.cli(&["ps"]).contains("echo"));
    let status = std::process::Command::new("kill")
        .args(["-TERM", &kernel.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let stopping = next(socket);
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping}");
}

#[test]
fn systemd_is_told_ready_once_the_kernel_serves_and_stopping_when_a_stop_begins() {
    let bin = match hivekernel_tests::build_hivekernel() {
        Ok(bin) => bin,
        Err((bin, why)) => panic!("cannot build {}: {why}", bin.display()),
    };
    let sockets = tempfile::tempdir().unwrap();
    let path = sockets.path().join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    ready_then_stopping(&bin, &socket, path.to_str().unwrap());

    // The abstract namespace, as systemd also hands out (`@name`).
    use std::os::linux::net::SocketAddrExt;
    let name = format!("hivekernel-test-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let socket = UnixDatagram::bind_addr(&addr).unwrap();
    ready_then_stopping(&bin, &socket, &format!("@{name}"));
}
