//! MCP servers nobody on this project wrote, installed from npm into
//! `target/mcp-peers` (`.ci/run` does it; the README says how): the
//! protocol's reference `server-everything` and `server-filesystem`, and
//! the MCP Inspector's CLI as a client. `$HIVEKERNEL_MCP_PEERS` points
//! elsewhere.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use hivekernel_agents::RestartPolicy;
use hivekernel_agents::RestartSpec;
use hivekernel_kernel::Kernel;
use hivekernel_kernel::config::{McpServerSpec, McpToolFilter, McpTransport};

/// The directory holding `node_modules/.bin`.
pub fn peers() -> PathBuf {
    let dir = match std::env::var_os("HIVEKERNEL_MCP_PEERS") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/mcp-peers"),
    };
    let probe = dir.join("node_modules/.bin/mcp-server-everything");
    assert!(
        probe.exists(),
        "{} is missing; install the MCP test peers at the repository root:\n  \
         npm install --prefix target/mcp-peers {}\n\
         (or point HIVEKERNEL_MCP_PEERS at a directory holding them; CI's .ci/run installs them)",
        probe.display(),
        PACKAGES.join(" ")
    );
    dir
}

/// `server-everything`'s program where [`peers`] looks for it, when it is
/// there; `None` when the peers are not installed (no panic).
pub fn installed() -> Option<PathBuf> {
    let dir = match std::env::var_os("HIVEKERNEL_MCP_PEERS") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/mcp-peers"),
    };
    let program = dir.join("node_modules/.bin/mcp-server-everything");
    program.exists().then_some(program)
}

/// The command that installs the peers, run at the repository root.
pub fn install_command() -> String {
    format!(
        "npm install --prefix target/mcp-peers {}",
        PACKAGES.join(" ")
    )
}

/// What `.ci/run` installs, pinned.
pub const PACKAGES: [&str; 3] = [
    "@modelcontextprotocol/server-everything@2026.8.31",
    "@modelcontextprotocol/server-filesystem@2026.8.31",
    "@modelcontextprotocol/inspector@0.15.0",
];

/// A program of the peers, e.g. `mcp-server-everything`.
pub fn bin(name: &str) -> String {
    peers()
        .join("node_modules/.bin")
        .join(name)
        .display()
        .to_string()
}

/// A stdio server running `command`, with short timeouts and a quick,
/// bounded restart policy (permanent, 3 restarts in 60 s, 50 to 200 ms).
pub fn stdio(name: &str, command: Vec<String>) -> McpServerSpec {
    McpServerSpec {
        name: name.to_owned(),
        transport: McpTransport::Stdio {
            command,
            env: Default::default(),
            cwd: None,
        },
        call_timeout: Duration::from_secs(20),
        startup_timeout: Duration::from_secs(20),
        restart: RestartSpec {
            policy: RestartPolicy::Permanent,
            max_restarts: 3,
            within_seconds: 60,
            backoff_ms: [50, 200],
        },
        tools: McpToolFilter::default(),
        enabled: true,
        max_output_bytes: 4 << 20,
    }
}

/// `server-everything` over stdio, named `everything`.
pub fn everything() -> McpServerSpec {
    stdio(
        "everything",
        vec![bin("mcp-server-everything"), "stdio".into()],
    )
}

/// Waits until server `name` is `state`, or fails the test after `limit`.
pub async fn wait_for_state(kernel: &Kernel, name: &str, state: &str, limit: Duration) {
    crate::wait_until(&format!("MCP server {name} {state}"), limit, || async {
        kernel
            .mcp()
            .servers()
            .iter()
            .any(|s| s.name == name && s.state == state)
    })
    .await;
}

/// `server-everything` serving streamable HTTP on a free loopback port;
/// killed when dropped.
#[derive(Debug)]
pub struct HttpEverything {
    child: tokio::process::Child,
    /// `http://127.0.0.1:PORT/mcp`.
    pub url: String,
}

impl HttpEverything {
    pub async fn start() -> HttpEverything {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Self::start_on(port).await
    }

    /// On `port`, e.g. the port of one that was killed.
    pub async fn start_on(port: u16) -> HttpEverything {
        let child = tokio::process::Command::new(bin("mcp-server-everything"))
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        crate::wait_until(
            "server-everything listening",
            Duration::from_secs(30),
            || async {
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_ok()
            },
        )
        .await;
        HttpEverything {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }

    /// Kills it and waits for it to be gone.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }
}

/// PIDs of live processes whose command line holds `marker`.
pub fn processes_with(marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        // A zombie has an empty command line: it is gone but not yet reaped.
        if String::from_utf8_lossy(&cmdline).contains(marker) {
            found.push(pid);
        }
    }
    found
}

/// PIDs of processes holding `marker` still alive after `wait`: a
/// SIGKILL is sent at once, but the process ends a moment later on a busy
/// machine.
pub async fn processes_left_with(marker: &str, wait: std::time::Duration) -> Vec<u32> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        let left = processes_with(marker);
        if left.is_empty() || std::time::Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Whether process `pid` is still running (not gone, not a zombie).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}
