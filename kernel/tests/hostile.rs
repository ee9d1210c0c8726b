//! Hostile input against the real `hivekernel` binary, where what is
//! measured is the kernel process itself: its resident memory, its data
//! directory. The in-process cases are in `tests/tests/hostile` (the suite's `hostile::`).

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use hivekernel_proto::v1 as pb;
use hivekernel_proto::v1::kernel_client::KernelClient;
use tonic::Code;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::transport::Channel;

use crate::support::{Kernel, write_config};

/// Resident memory of `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    kib * 1024
}

/// Bytes of every file in `dir` (the database, its WAL and the rest).
fn disk(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|entry| entry.ok()?.metadata().ok())
        .filter(|meta| meta.is_file())
        .map(|meta| meta.len())
        .sum()
}

/// Sends `Bearer <token>` with every call.
#[derive(Clone)]
struct Bearer(MetadataValue<Ascii>);

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        request
            .metadata_mut()
            .insert("authorization", self.0.clone());
        Ok(request)
    }
}

type Client = KernelClient<tonic::codegen::InterceptedService<Channel, Bearer>>;

async fn client(kernel: &Kernel, token: &str) -> Client {
    let channel = Channel::from_shared(kernel.addr.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let bearer = Bearer(format!("Bearer {token}").parse().unwrap());
    KernelClient::with_interceptor(channel, bearer)
}

/// The trimmed contents of `path` once something has written them.
fn read_when_there(path: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && !text.trim().is_empty()
        {
            return text.trim().to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "{} never written",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Once, 100 `SendMessage` to PID 1 with a 4 MB `type` and 100 `Kill` of
/// the caller's own child with a 4 MB `reason` took the kernel from 13 MB to
/// 1.7 GB RSS and its database to 710 MB: both texts were kept whole in the
/// event ring and the store. Now each call is refused, naming the field and
/// its limit, and the same 200 calls leave both under 50 MB of growth.
#[tokio::test]
async fn a_process_token_cannot_exhaust_memory_or_disk() {
    let home = tempfile::tempdir().unwrap();
    let config = write_config(
        home.path(),
        r#"{"kernel": {"listen": "127.0.0.1:0", "default_runtime": "echo"}}"#,
    );
    let kernel = Kernel::start_with(home, &config, &[]);
    let data = kernel.data_dir();
    let mut admin = client(&kernel, &kernel.token()).await;

    // An exec agent hands its process token to the test, as an attacker's would.
    let token_file = kernel.dir.path().join("token");
    let script = format!(
        "printf %s \"$HIVEKERNEL_TOKEN\" > {}.tmp && mv {0}.tmp {0}; exec sleep 600",
        token_file.display()
    );
    let agent = admin
        .spawn(pb::SpawnRequest {
            parent: 1,
            name: "attacker".into(),
            command: vec!["sh".into(), "-c".into(), script],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .pid;
    let token = read_when_there(&token_file);
    let mut attacker = client(&kernel, &token).await;
    let spawn_child = |i: usize| pb::SpawnRequest {
        parent: agent,
        name: format!("victim-{i}"),
        runtime: "echo".into(),
        ..Default::default()
    };
    let mut child = attacker
        .spawn(spawn_child(0))
        .await
        .unwrap()
        .into_inner()
        .pid;

    let pid = kernel.child.id();
    let (rss_before, disk_before) = (rss(pid), disk(&data));
    let huge = "x".repeat(4_000_000);
    // Every answer, checked after the measurement (so that a kernel that
    // accepts them shows what they cost).
    let mut answers = Vec::new();
    for i in 0..100 {
        let sent = attacker
            .send_message(pb::SendMessageRequest {
                to: 1,
                r#type: huge.clone(),
                payload: "hi".into(),
                ..Default::default()
            })
            .await;
        answers.push(("type", sent.map(drop)));
        let killed = attacker
            .kill(pb::KillRequest {
                pid: child,
                reason: huge.clone(),
            })
            .await;
        if killed.is_ok() {
            child = attacker
                .spawn(spawn_child(i + 1))
                .await
                .unwrap()
                .into_inner()
                .pid;
        }
        answers.push(("reason", killed.map(drop)));
    }
    // Whatever reached the store has been written by now.
    admin
        .get_process(pb::GetProcessRequest { pid: child })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let rss_growth = rss(pid).saturating_sub(rss_before);
    let disk_growth = disk(&data).saturating_sub(disk_before);
    const LIMIT: u64 = 50 << 20;
    assert!(
        rss_growth < LIMIT,
        "RSS grew by {rss_growth} bytes over 200 calls"
    );
    assert!(
        disk_growth < LIMIT,
        "the data directory grew by {disk_growth} bytes over 200 calls"
    );
    eprintln!("200 calls: RSS +{rss_growth} B, data dir +{disk_growth} B");
    for (field, answer) in answers {
        let status = answer.expect_err(&format!("a 4 MB {field} was accepted"));
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        let (limit, setting) = if field == "type" {
            (128, "type_bytes")
        } else {
            (1024, "reason_bytes")
        };
        let says = format!("{field} is 4000000 bytes, at most {limit} (kernel.limits.{setting})");
        assert!(status.message().contains(&says), "{status:?}");
    }
    let alive = admin
        .get_process(pb::GetProcessRequest { pid: child })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(alive.exit, None, "the child was never killed");
}

/// Reads `socket` until the kernel closes it; false if it is still open after `limit`.
fn closed_within(socket: &mut std::net::TcpStream, limit: Duration) -> bool {
    use std::io::Read;
    let deadline = Instant::now() + limit;
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        socket
            .set_read_timeout(Some(
                deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1)),
            ))
            .unwrap();
        match socket.read(&mut buf) {
            Ok(0) => return true,
            // The server's own frames (HTTP/2 settings) before it closes.
            Ok(_) => {}
            Err(err)
                if matches!(
                    err.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false;
            }
            // Reset: closed as well.
            Err(_) => return true,
        }
    }
    false
}

/// Once, with the usual limit of 1,024 open files, 1,100 TCP connections
/// that never sent a byte made every new client fail (DEADLINE_EXCEEDED,
/// then UNAVAILABLE): they were never closed. Now connections without an
/// authenticated call count against `kernel.connections.max` (lowered to
/// what the open-file limit leaves room for) and the oldest of them gives
/// way to a new connection, so `ps` still answers at once.
#[test]
fn silent_sockets_cannot_lock_clients_out() {
    let limit = hivekernel_kernel::grpc::raise_open_file_limit().unwrap_or(0);
    assert!(
        limit >= 1_300,
        "this test opens 1,100 sockets; the open-file limit is {limit}"
    );
    let home = tempfile::tempdir().unwrap();
    let config = write_config(
        home.path(),
        r#"{"kernel": {"listen": "127.0.0.1:0", "default_runtime": "echo"}}"#,
    );
    let kernel = Kernel::start_limited(home, &config, &[], Some(1024));
    let addr: std::net::SocketAddr = kernel.addr.trim_start_matches("http://").parse().unwrap();
    let mut silent = Vec::new();
    for _ in 0..1_100 {
        if let Ok(socket) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            silent.push(socket);
        }
    }

    let started = Instant::now();
    let ps = kernel.cli(&["ps"]);
    let took = started.elapsed();
    assert!(ps.ok().contains("kernel"), "{ps:#?}");
    assert!(took < Duration::from_secs(2), "ps took {took:?}");
    eprintln!("1,100 silent sockets, then ps answered in {took:?}");
    assert_eq!(silent.len(), 1_100, "every socket was accepted");
    // The oldest silent socket made room for a newer one.
    assert!(closed_within(&mut silent[0], Duration::from_secs(5)));
    let log = kernel.log();
    assert!(
        log.contains("connection limit reached (kernel.connections.max)"),
        "{log}"
    );
}

/// Opens up to `count` TCP connections to `addr` that never send a byte.
fn silent_sockets(addr: std::net::SocketAddr, count: usize) -> Vec<std::net::TcpStream> {
    (0..count)
        .filter_map(|_| std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok())
        .collect()
}

/// An HTTP/1.1 GET of `path` from `addr`; the status line.
fn http_status(addr: std::net::SocketAddr, path: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    let answer = String::from_utf8_lossy(&answer);
    Ok(answer.lines().next().unwrap_or_default().to_owned())
}

/// The address in the log line `<what> http://ADDR/...`.
fn logged_addr(kernel: &Kernel, what: &str) -> std::net::SocketAddr {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = kernel.log();
        if let Some(at) = log.find(what) {
            let rest = &log[at + what.len()..];
            let rest = rest.trim_start().trim_start_matches("http://");
            let end = rest.find(['/', ' ', '\n']).unwrap_or(rest.len());
            return rest[..end].parse().unwrap();
        }
        assert!(Instant::now() < deadline, "no {what:?} in the log:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Once, 1,100 silent sockets on the dashboard's or the metrics listener's
/// port used up a kernel's 1,024 descriptors: `ps` timed out, the gRPC
/// gate notwithstanding. Now each HTTP listener has a gate of its own with
/// a sixteenth of the descriptors: the oldest silent socket gives way to a
/// new one, `ps` answers at once, and the listener itself still serves.
#[test]
fn silent_sockets_on_the_http_listeners_cannot_lock_the_control_plane_out() {
    let limit = hivekernel_kernel::grpc::raise_open_file_limit().unwrap_or(0);
    assert!(
        limit >= 2_400,
        "this test opens 2,200 sockets; the open-file limit is {limit}"
    );
    let home = tempfile::tempdir().unwrap();
    let config = write_config(
        home.path(),
        r#"{"kernel": {"listen": "127.0.0.1:0", "default_runtime": "echo",
                       "dashboard": {"listen": "127.0.0.1:0"},
                       "metrics": {"listen": "127.0.0.1:0"}}}"#,
    );
    let kernel = Kernel::start_limited(home, &config, &[], Some(1024));
    let dashboard = logged_addr(&kernel, "dashboard on ");
    let metrics = logged_addr(&kernel, "metrics on ");
    for (name, addr, path) in [
        ("dashboard", dashboard, "/"),
        ("metrics", metrics, "/healthz"),
    ] {
        let mut silent = silent_sockets(addr, 1_100);
        let started = Instant::now();
        let ps = kernel.cli(&["ps"]);
        let took = started.elapsed();
        assert!(ps.ok().contains("kernel"), "{name}: {ps:#?}");
        assert!(took < Duration::from_secs(2), "{name}: ps took {took:?}");
        eprintln!("1,100 silent sockets on the {name} listener, then ps answered in {took:?}");
        // The listener itself still answers: its oldest silent socket gave way.
        let status = http_status(addr, path).unwrap();
        assert!(status.contains(" 200"), "{name}: {status}");
        assert!(
            closed_within(&mut silent[0], Duration::from_secs(5)),
            "{name}: the oldest silent socket is still open"
        );
    }
    let log = kernel.log();
    assert!(
        log.contains("connection limit reached (kernel.connections.http_max)"),
        "{log}"
    );
}

/// An HTTP connection that sends no whole request head within
/// `kernel.connections.http_header_timeout_ms`, or sits idle after its
/// requests past `http_idle_timeout_ms`, is closed.
#[test]
fn http_connections_that_dawdle_are_closed() {
    use std::io::Write;
    let home = tempfile::tempdir().unwrap();
    let config = write_config(
        home.path(),
        r#"{"kernel": {"listen": "127.0.0.1:0", "default_runtime": "echo",
                       "metrics": {"listen": "127.0.0.1:0"},
                       "connections": {"http_header_timeout_ms": 300,
                                       "http_idle_timeout_ms": 500}}}"#,
    );
    let kernel = Kernel::start_with(home, &config, &[]);
    let metrics = logged_addr(&kernel, "metrics on ");
    let mut silent = std::net::TcpStream::connect(metrics).unwrap();
    let mut partial = std::net::TcpStream::connect(metrics).unwrap();
    partial
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let mut idle = std::net::TcpStream::connect(metrics).unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert!(closed_within(&mut silent, Duration::from_secs(10)));
    assert!(closed_within(&mut partial, Duration::from_secs(10)));
    // Its answer first, then the close once it has been idle.
    assert!(closed_within(&mut idle, Duration::from_secs(10)));
    assert!(http_status(metrics, "/healthz").unwrap().contains(" 200"));
}

/// A connection that makes no authenticated call within
/// `kernel.connections.handshake_timeout_ms` is closed: one that says
/// nothing, and one that sends the HTTP/2 preface and stops there.
#[test]
fn a_connection_without_an_authenticated_call_is_closed_at_the_handshake_timeout() {
    let home = tempfile::tempdir().unwrap();
    let config = write_config(
        home.path(),
        r#"{"kernel": {"listen": "127.0.0.1:0", "default_runtime": "echo",
                       "connections": {"handshake_timeout_ms": 300}}}"#,
    );
    let kernel = Kernel::start_with(home, &config, &[]);
    let addr: std::net::SocketAddr = kernel.addr.trim_start_matches("http://").parse().unwrap();
    let mut silent = std::net::TcpStream::connect(addr).unwrap();
    let mut preface = std::net::TcpStream::connect(addr).unwrap();
    std::io::Write::write_all(&mut preface, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    assert!(closed_within(&mut silent, Duration::from_secs(10)));
    assert!(closed_within(&mut preface, Duration::from_secs(10)));
    // An authenticated client is served as before.
    assert!(kernel.cli(&["ps"]).ok().contains("kernel"));
}

/// The Python interpreter with grpcio (`$HIVEKERNEL_PYTHON`, else the venv
/// `target/py-venv`), with the examples' stubs generated; `None` when
/// `HIVEKERNEL_SKIP_PYTHON_EXAMPLES=1`.
fn python() -> Option<std::path::PathBuf> {
    if std::env::var("HIVEKERNEL_SKIP_PYTHON_EXAMPLES").is_ok_and(|v| v == "1") {
        eprintln!("skipped: HIVEKERNEL_SKIP_PYTHON_EXAMPLES=1");
        return None;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = std::env::var_os("HIVEKERNEL_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root.join("target/py-venv/bin/python"));
    let generated = std::process::Command::new(&python)
        .arg("generate_stubs.py")
        .current_dir(root.join("sdk-examples/python"))
        .output();
    match generated {
        Ok(out) if out.status.success() => Some(python),
        other => panic!(
            "{} cannot generate the Python stubs ({other:?}); create the venv:\n  \
             python3 -m venv target/py-venv && target/py-venv/bin/pip install -r \
             sdk-examples/python/requirements.txt\n(or HIVEKERNEL_PYTHON=/path/to/python, \
             or HIVEKERNEL_SKIP_PYTHON_EXAMPLES=1 to skip)",
            python.display()
        ),
    }
}

/// Once, with a slow reader, 78-85% of the messages the kernel had
/// acknowledged to their senders were lost when it was killed: they had
/// left the store when handed to the attach stream. Now a message to an
/// `exec` agent leaves the store only when the agent acknowledges it:
/// 1,000 messages to the Python example agent (15 ms a message, so that it
/// falls behind and messages are in flight), the kernel killed with
/// SIGKILL three times on the way, and every message whose SendMessage
/// succeeded reaches the agent (some twice: at least once).
#[tokio::test]
async fn acknowledged_messages_to_an_exec_agent_survive_kill_9() {
    let Some(python) = python() else { return };
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk-examples/python");
    let agent = examples.join("echo_agent.py");
    let home = tempfile::tempdir().unwrap();
    let config = write_config(
        home.path(),
        &format!(
            r#"{{"kernel": {{"listen": "127.0.0.1:0", "default_runtime": "echo",
                          "mailbox_capacity": 4096, "shutdown_grace_ms": 500}},
                "agents": [{{"name": "sink", "role": "daemon", "env": {{"ECHO_DELAY_MS": "15"}},
                             "command": [{:?}, {:?}]}}]}}"#,
            python.display().to_string(),
            agent.display().to_string()
        ),
    );
    let mut kernel = Kernel::start_with(home, &config, &[]);
    let sink = kernel.pid_of("sink");
    let mut admin = client(&kernel, &kernel.token()).await;
    let log_path = admin
        .get_process(pb::GetProcessRequest { pid: sink })
        .await
        .unwrap()
        .into_inner()
        .log_path;
    // Each life of the kernel starts the agent again: wait until it is
    // attached, so that the kill finds messages on their way to it.
    let attached = |lives: usize| {
        let path = log_path.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let log = std::fs::read_to_string(&path).unwrap_or_default();
                if log.matches("attached as sink").count() >= lives {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "agent life {lives} never attached:\n{log}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    attached(1).await;
    const MESSAGES: usize = 1000;
    let mut acknowledged = Vec::new();
    for i in 0..MESSAGES {
        if i > 0 && i % 250 == 0 {
            kernel.kill_9();
            kernel.restart();
            admin = client(&kernel, &kernel.token()).await;
            assert_eq!(
                kernel.pid_of("sink"),
                sink,
                "the config agent keeps its PID"
            );
            attached(i / 250 + 1).await;
        }
        let sent = admin
            .send_message(pb::SendMessageRequest {
                to: sink,
                payload: format!("m{i}"),
                ..Default::default()
            })
            .await;
        if sent.is_ok() {
            acknowledged.push(format!("m{i}"));
        }
    }
    assert!(
        acknowledged.len() >= MESSAGES - 10,
        "{} sent",
        acknowledged.len()
    );

    // Every acknowledged message shows up in the agent's log (all its lives).
    let received = |log: &str| -> std::collections::HashMap<String, usize> {
        let mut seen = std::collections::HashMap::new();
        for line in log.lines() {
            if line.contains("message ")
                && let Some((_, payload)) = line.rsplit_once("(message): ")
            {
                *seen.entry(payload.to_owned()).or_insert(0) += 1;
            }
        }
        seen
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let (missing, seen) = loop {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        let seen = received(&log);
        let missing: Vec<&String> = acknowledged
            .iter()
            .filter(|m| !seen.contains_key(*m))
            .collect();
        if missing.is_empty() || Instant::now() > deadline {
            break (missing.len(), seen);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let twice = seen.values().filter(|n| **n > 1).count();
    eprintln!(
        "{} acknowledged, {missing} lost, {twice} delivered more than once",
        acknowledged.len()
    );
    assert_eq!(missing, 0, "acknowledged messages lost over three kill -9");
    kernel.stop();
}

/// Command lines of the live `sleep` processes that contain `marker`.
fn running_with(marker: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| std::fs::read(entry.path().join("cmdline")).ok())
        .map(|cmdline| String::from_utf8_lossy(&cmdline).replace('\0', " "))
        .filter(|cmdline| cmdline.starts_with("sleep ") && cmdline.contains(marker))
        .collect()
}

/// Waits up to 10 s for `condition`; false if it never held.
fn within_10s(mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    condition()
}

#[test]
fn a_sandboxed_exec_agent_cannot_read_the_admin_token_and_leaves_nothing_behind() {
    let home = tempfile::tempdir().unwrap();
    let data = home.path().join("data");
    let mark = format!("777.{}1", std::process::id());
    let script = format!(
        "cat {token}; echo token=$?; cat {db} >/dev/null; echo store=$?; \
         echo x > {data}/planted; echo plant=$?; \
         setsid -f sleep {mark}; (sh -c 'sleep {mark} &' &); echo ready; exec sleep {mark}",
        token = data.join("admin.token").display(),
        db = data.join("hivekernel.db").display(),
        data = data.display(),
    );
    let config = write_config(
        home.path(),
        &format!(
            r#"{{"kernel": {{"listen": "127.0.0.1:0", "default_runtime": "echo",
                          "shutdown_grace_ms": 500, "exec": {{"sandbox": true}}}},
                "agents": [{{"name": "snoop", "role": "daemon", "command": ["/bin/sh", "-c", {script:?}]}}]}}"#
        ),
    );
    let kernel = Kernel::start_with(home, &config, &[]);
    let token = kernel.token();
    let snoop = kernel.pid_of("snoop");
    let log = kernel.data_dir().join(format!("logs/{snoop}-snoop.log"));
    assert!(
        within_10s(|| read_when_there(&log).contains("ready")),
        "{}",
        read_when_there(&log)
    );
    let said = read_when_there(&log);
    assert!(!said.contains(&token), "the agent read the token:\n{said}");
    for line in ["token=1", "store=1", "plant=2"] {
        assert!(said.contains(line), "{line} not in:\n{said}");
    }
    assert!(!kernel.data_dir().join("planted").exists());
    assert!(kernel.log().contains("exec agents run in the sandbox"));
    // The agent itself and its two escapes (the double fork may still be on its way).
    assert!(
        within_10s(|| running_with(&mark).len() == 3),
        "{:?}",
        running_with(&mark)
    );

    // Killing the agent ends everything it started, setsid included.
    kernel.cli(&["kill", &snoop.to_string()]).ok();
    assert!(
        within_10s(|| running_with(&mark).is_empty()),
        "left running: {:?}",
        running_with(&mark)
    );
}

#[tokio::test]
async fn the_python_sdk_agent_runs_in_the_sandbox_with_its_paths_granted() {
    let Some(python) = python() else { return };
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk-examples/python");
    // The interpreter's own trees: the venv and the installation it comes from.
    let prefixes = std::process::Command::new(&python)
        .args([
            "-c",
            "import sys; print(sys.prefix); print(sys.base_prefix)",
        ])
        .output()
        .unwrap();
    let mut grants: Vec<String> = String::from_utf8(prefixes.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    // The SDK, and the .proto files it checks its stubs against.
    grants.push(examples.display().to_string());
    grants.push(examples.join("../../proto/proto").display().to_string());
    let home = tempfile::tempdir().unwrap();
    let config = write_config(
        home.path(),
        &format!(
            r#"{{"kernel": {{"listen": "127.0.0.1:0", "default_runtime": "echo",
                          "exec": {{"sandbox": true, "read_only": {grants:?}}}}},
                "agents": [{{"name": "echo", "role": "daemon",
                             "command": [{:?}, {:?}]}}]}}"#,
            python.display().to_string(),
            examples.join("echo_agent.py").display().to_string()
        ),
    );
    let kernel = Kernel::start_with(home, &config, &[]);
    let echo = kernel.pid_of("echo").to_string();
    let run = kernel.cli(&["exec", &echo, "hello from the sandbox", "--timeout", "30"]);
    assert!(
        run.ok().contains("hello from the sandbox"),
        "{}",
        kernel.log()
    );
}

/// A raw HTTP/1.1 POST of an MCP `initialize` to `url` (`http://host:port/mcp`)
/// with `headers`; the status line and the body.
fn mcp_initialize(url: &str, headers: &[(&str, &str)]) -> (String, String) {
    use std::io::{Read, Write};
    let host = url.trim_start_matches("http://").trim_end_matches("/mcp");
    let mut stream = std::net::TcpStream::connect(host).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"probe","version":"1"}}}"#;
    let mut request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n\
         Connection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer.lines().next().unwrap_or_default().to_owned();
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// Once, `mcp serve --http` took any `Authorization: Bearer` as a token and
/// opened an MCP session for each `initialize`: 15,000 of them with a
/// made-up token took it from 28 MB to 1.1 GB. A page on another site could
/// also call it (no `Origin` check). Now the token is checked with the kernel
/// before MCP sees the request, a foreign origin is answered 403, and
/// thousands of made-up tokens leave its memory where it was.
#[test]
fn mcp_serve_over_http_refuses_foreign_origins_and_unknown_tokens_before_mcp() {
    let kernel = Kernel::start();
    let (bridge, url) = crate::mcp_serve::serve_http_with(
        &kernel,
        &["--allow-origin", "http://localhost:6274"],
        None,
    );
    let token = kernel.token();
    let bearer = format!("Bearer {token}");
    let own_origin = url.trim_end_matches("/mcp").to_owned();

    let (status, body) = mcp_initialize(
        &url,
        &[
            ("Authorization", &bearer),
            ("Origin", "http://evil.example"),
        ],
    );
    assert!(status.contains(" 403"), "{status} {body}");
    assert!(body.contains("--allow-origin"), "{body}");
    for origin in [own_origin.as_str(), "http://localhost:6274"] {
        let (status, body) =
            mcp_initialize(&url, &[("Authorization", &bearer), ("Origin", origin)]);
        assert!(status.contains(" 200"), "{origin}: {status} {body}");
    }
    let (status, body) = mcp_initialize(&url, &[("Authorization", "Bearer made-up")]);
    assert!(status.contains(" 401"), "{status} {body}");
    assert!(body.contains("does not know this token"), "{body}");

    let pid = bridge.0.id();
    let before = rss(pid);
    for i in 0..3_000 {
        let (status, _) = mcp_initialize(&url, &[("Authorization", &format!("Bearer forged-{i}"))]);
        assert!(status.contains(" 401"), "{i}: {status}");
    }
    let growth = rss(pid).saturating_sub(before);
    eprintln!("3,000 initialize calls with made-up tokens: mcp serve RSS +{growth} B");
    assert!(
        growth < 30 << 20,
        "3,000 made-up tokens grew mcp serve by {growth} bytes"
    );
    // The real token still works.
    let (status, body) = mcp_initialize(&url, &[("Authorization", &bearer)]);
    assert!(status.contains(" 200"), "{status} {body}");
}

/// `mcp serve --http` under an open-file limit of 1,024 with 1,100 silent
/// sockets open on it still answers a client at once: its listener has the
/// same gate as the kernel's.
#[test]
fn silent_sockets_cannot_lock_mcp_serve_out() {
    let limit = hivekernel_kernel::grpc::raise_open_file_limit().unwrap_or(0);
    assert!(
        limit >= 1_300,
        "this test opens 1,100 sockets; the open-file limit is {limit}"
    );
    let kernel = Kernel::start();
    let (_bridge, url) = crate::mcp_serve::serve_http_with(&kernel, &[], Some(1024));
    let addr: std::net::SocketAddr = url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .parse()
        .unwrap();
    let mut silent = silent_sockets(addr, 1_100);
    let bearer = format!("Bearer {}", kernel.token());
    let started = Instant::now();
    let (status, body) = mcp_initialize(&url, &[("Authorization", &bearer)]);
    let took = started.elapsed();
    assert!(status.contains(" 200"), "{status} {body}");
    assert!(took < Duration::from_secs(2), "initialize took {took:?}");
    eprintln!("1,100 silent sockets on mcp serve, then initialize answered in {took:?}");
    assert!(closed_within(&mut silent[0], Duration::from_secs(5)));
}
