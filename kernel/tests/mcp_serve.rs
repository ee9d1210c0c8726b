//! `hivekernel mcp serve` driven by MCP clients nobody on this project
//! wrote: the MCP Inspector's CLI over stdio, and, over streamable HTTP,
//! another kernel whose `mcp_servers` names it (rmcp's client). Both
//! against a real `hivekernel start`. The Inspector comes from npm into
//! `target/mcp-peers` (`.ci/run` installs it; `$HIVEKERNEL_MCP_PEERS`
//! points elsewhere).

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Kernel, write_config};

/// The Inspector CLI, where `.ci/run` installs it.
fn inspector_bin() -> PathBuf {
    let dir = match std::env::var_os("HIVEKERNEL_MCP_PEERS") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/mcp-peers")),
    };
    let bin = dir.join("node_modules/.bin/mcp-inspector");
    assert!(
        bin.exists(),
        "{} is missing; install the MCP test peers at the repository root as README.md \
         says (npm install --prefix target/mcp-peers ...), or point HIVEKERNEL_MCP_PEERS \
         at a directory holding them",
        bin.display()
    );
    bin
}

/// The Inspector running `hivekernel mcp serve` as its stdio server against
/// `addr` with `token`; its JSON answer to `method_args`.
fn inspector(addr: &str, token: &str, method_args: &[&str]) -> Value {
    // No admin.token to fall back on: the token given is the one used.
    let empty = tempfile::tempdir().unwrap();
    let output = Command::new(inspector_bin())
        .arg("--cli")
        .arg(crate::support::binary())
        .args(["mcp", "serve"])
        .args(method_args)
        .env("HIVEKERNEL_ADDR", addr)
        .env("HIVEKERNEL_TOKEN", token)
        .env("HIVEKERNEL_DATA_DIR", empty.path())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "inspector {method_args:?}: {}\nstdout: {stdout}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|err| panic!("{err}: {stdout}"))
}

/// One `tools/call` through [`inspector`]: the text, isError, structuredContent.
fn call(addr: &str, token: &str, tool: &str, tool_args: &[&str]) -> (String, bool, Value) {
    let mut method = vec!["--method", "tools/call", "--tool-name", tool];
    for arg in tool_args {
        method.extend(["--tool-arg", arg]);
    }
    let answer = inspector(addr, token, &method);
    let text = answer["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let failed = answer["isError"].as_bool().unwrap_or(false);
    (text, failed, answer["structuredContent"].clone())
}

/// An exec agent that writes its own process token to `<dir>/token` and
/// idles; its PID and that token.
fn process_with_token(kernel: &Kernel, dir: &std::path::Path) -> (u64, String) {
    let script = dir.join("agent.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\nprintf %s \"$HIVEKERNEL_TOKEN\" > token.tmp && mv token.tmp token\nexec sleep 600\n",
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let cwd = dir.to_str().unwrap();
    let data = kernel.data_dir();
    // Connection flags before `--`: what follows is the agent's command.
    let run = crate::support::hivekernel(&[
        "spawn",
        "--parent",
        "1",
        "--name",
        "minion",
        "--role",
        "task",
        "--cwd",
        cwd,
        "--addr",
        &kernel.addr,
        "--data-dir",
        data.to_str().unwrap(),
        "--",
        "./agent.sh",
    ]);
    let pid: u64 = run.ok().trim().parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(token) = std::fs::read_to_string(dir.join("token"))
            && !token.is_empty()
        {
            return (pid, token);
        }
        assert!(Instant::now() < deadline, "no token from the exec agent");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn mcp_serve_drives_the_kernel_for_an_mcp_client_with_the_caller_s_rights() {
    let kernel = Kernel::start();
    let addr = kernel.addr.clone();
    let admin = kernel.token();

    let listed = inspector(&addr, &admin, &["--method", "tools/list"]);
    let mut names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "cron_add", "cron_ls", "cron_rm", "describe", "events", "exec", "kill", "ps", "send",
            "spawn"
        ]
    );

    let (text, failed, spawned) = call(
        &addr,
        &admin,
        "spawn",
        &["name=scout", "parent=queen", "role=worker"],
    );
    assert!(!failed, "{text}");
    let pid = spawned["pid"].as_u64().unwrap();
    let queen = kernel.pid_of("queen");
    let listed = kernel.ps();
    let scout = crate::support::find(&listed, pid).unwrap();
    assert_eq!(
        (scout["ppid"].as_u64(), scout["role"].as_str()),
        (Some(queen), Some("worker"))
    );

    let (text, failed, detail) = call(
        &addr,
        &admin,
        "exec",
        &["process=queen/scout", "task=hello there"],
    );
    assert_eq!((text.as_str(), failed), ("hello there", false));
    assert_eq!(detail["success"], true);
    assert_eq!(detail["trace_id"].as_str().map(str::len), Some(32));

    let (tree, _, _) = call(&addr, &admin, "ps", &["format=tree"]);
    assert!(tree.contains(&format!("scout ({pid})")), "{tree}");
    let (rows, _, _) = call(&addr, &admin, "ps", &["role=[\"worker\"]", "format=json"]);
    let rows: Value = serde_json::from_str(&rows).unwrap();
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{rows}");
    let (text, failed, _) = call(&addr, &admin, "describe", &["process=scout"]);
    assert!(
        !failed && text.contains("scout") && text.contains("worker"),
        "{text}"
    );

    let (text, failed, sent) = call(&addr, &admin, "send", &["process=scout", "message=note"]);
    assert!(!failed && sent["message_id"].as_u64().is_some(), "{text}");

    // Events after a sequence number, and reading on from where a page ends.
    let (text, failed, page) = call(&addr, &admin, "events", &["types=[\"spawned\"]"]);
    assert!(!failed, "{text}");
    let events = page["events"].as_array().unwrap();
    assert!(events.iter().any(|e| e["pid"] == pid), "{page}");
    assert!(events.iter().all(|e| e["type"] == "spawned"), "{page}");
    let next = page["next_since_seq"].as_u64().unwrap();
    let (_, _, later) = call(
        &addr,
        &admin,
        "events",
        &[&format!("since_seq={next}"), "types=[\"spawned\"]"],
    );
    assert_eq!(later["events"], json!([]), "{later}");
    let (_, _, first) = call(&addr, &admin, "events", &["since_seq=0", "limit=2"]);
    assert_eq!(first["events"].as_array().map(Vec::len), Some(2), "{first}");
    assert_eq!(first["more"], true);
    let (_, _, second) = call(
        &addr,
        &admin,
        "events",
        &[&format!("since_seq={}", first["next_since_seq"]), "limit=2"],
    );
    // Read on from where the page ended: nothing skipped, nothing twice.
    assert_eq!(
        second["events"][0]["seq"].as_u64(),
        first["events"][1]["seq"].as_u64().map(|seq| seq + 1),
        "{first} then {second}"
    );

    let (text, failed, _) = call(
        &addr,
        &admin,
        "cron_add",
        &[
            "name=nightly",
            "expression=@daily",
            "description=tidy up",
            "target=scout",
        ],
    );
    assert!(!failed, "{text}");
    let (listed, _, _) = call(&addr, &admin, "cron_ls", &[]);
    assert!(listed.contains("\"nightly\""), "{listed}");
    let (_, failed, _) = call(&addr, &admin, "cron_rm", &["name=nightly"]);
    assert!(!failed);
    assert_eq!(kernel.cli(&["cron", "ls", "--json"]).json(), json!([]));

    // Bad input: an error result naming what was wrong; nothing changes.
    let before = kernel.ps().len();
    let (text, failed, _) = call(&addr, &admin, "spawn", &["name=x", "role=wizard"]);
    assert!(
        failed && text.contains("unknown role") && text.contains("wizard"),
        "{text}"
    );
    let (text, failed, _) = call(&addr, &admin, "describe", &["process=nobody"]);
    assert!(failed && text.contains("nobody"), "{text}");
    let (text, failed, _) = call(&addr, &admin, "events", &["limit=0"]);
    assert!(failed && text.contains("limit"), "{text}");
    assert_eq!(kernel.ps().len(), before);

    // A process token acts as its process: refused what the process may not do.
    let dir = tempfile::tempdir().unwrap();
    let (minion, token) = process_with_token(&kernel, dir.path());
    let (text, failed, _) = call(&addr, &token, "kill", &[&format!("process={queen}")]);
    // A task holds no kill_processes by default.
    assert!(
        failed && text.contains("lacks capability kill_processes"),
        "{text}"
    );
    assert!(crate::support::find(&kernel.ps(), queen).is_some());
    let (text, failed, _) = call(&addr, "not-a-token", "ps", &[]);
    assert!(failed && text.contains("unauthenticated"), "{text}");

    let (text, failed, killed) = call(&addr, &admin, "kill", &["process=scout"]);
    assert!(!failed, "{text}");
    assert_eq!(killed["killed"], json!([pid]));
    let (_, failed, _) = call(&addr, &admin, "kill", &[&format!("process={minion}")]);
    assert!(!failed);

    // No kernel there: the server still starts, and each call says why it fails.
    let (text, failed, _) = call("http://127.0.0.1:9", &admin, "ps", &[]);
    assert!(failed && text.contains("cannot connect"), "{text}");
}

/// A running `mcp serve --http`, killed when dropped.
pub(crate) struct Bridge(pub(crate) Child);

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `mcp serve --http 127.0.0.1:0` against `kernel`, and the URL it printed.
fn serve_http(kernel: &Kernel) -> (Bridge, String) {
    serve_http_with(kernel, &[], None)
}

/// [`serve_http`] with `extra` arguments, under an open-file limit of
/// `open_files` when given.
pub(crate) fn serve_http_with(
    kernel: &Kernel,
    extra: &[&str],
    open_files: Option<u64>,
) -> (Bridge, String) {
    let empty = tempfile::tempdir().unwrap();
    let mut command = match open_files {
        None => Command::new(crate::support::binary()),
        Some(limit) => {
            let mut sh = Command::new("sh");
            sh.arg("-c")
                .arg(format!("ulimit -n {limit} && exec \"$0\" \"$@\""))
                .arg(crate::support::binary());
            sh
        }
    };
    let mut child = command
        .args([
            "mcp",
            "serve",
            "--http",
            "127.0.0.1:0",
            "--addr",
            &kernel.addr,
        ])
        .args(extra)
        .arg("--data-dir")
        .arg(empty.path())
        .env_remove("HIVEKERNEL_TOKEN")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let bridge = Bridge(child);
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "mcp serve ended early"
        );
        if let Some(url) = line.trim().strip_prefix("mcp serve: listening on ") {
            // Its later lines (warnings) go nowhere rather than fill the pipe.
            std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
            return (bridge, url.to_owned());
        }
    }
}

#[test]
fn mcp_serve_over_http_asks_every_request_for_a_token_and_serves_another_kernel() {
    let kernel = Kernel::start();
    let (_bridge, url) = serve_http(&kernel);
    let host = url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();

    // Without a token: 401 before MCP sees the request.
    let mut raw = std::net::TcpStream::connect(&host).unwrap();
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    write!(
        raw,
        "POST /mcp HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    raw.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("www-authenticate: bearer"),
        "{answer}"
    );

    // Another kernel with this one among its MCP servers, holding its admin token.
    let dir = tempfile::tempdir().unwrap();
    let config = json!({
        "kernel": { "listen": "127.0.0.1:0", "data_dir": "unused", "shutdown_grace_ms": 500,
                    "default_runtime": "echo" },
        "mcp_servers": {
            "hive": { "url": url, "headers": { "Authorization": format!("Bearer {}", kernel.token()) } },
            "forged": { "url": url, "headers": { "Authorization": "Bearer not-the-token" } }
        }
    });
    let config = write_config(dir.path(), &config.to_string());
    let client = Kernel::start_with(dir, &config, &[]);
    // The forged token is refused at the handshake: that server never gets ready.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let servers = client.cli(&["mcp", "ls", "--json"]).json();
        let server = |name: &str| {
            servers
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["name"] == name)
                .cloned()
                .unwrap()
        };
        let forged = server("forged");
        if server("hive")["state"] == "ready"
            && forged["state"] != "ready"
            && forged["last_error"]
                .as_str()
                .is_some_and(|error| error.contains("Auth required"))
        {
            break;
        }
        assert!(Instant::now() < deadline, "{servers}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let tools = client.cli(&["mcp", "tools", "hive", "--json"]).json();
    assert!(
        tools
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "spawn"),
        "{tools}"
    );
    let tree = client.cli(&[
        "mcp",
        "call",
        "hive",
        "ps",
        "--args",
        r#"{"format":"tree"}"#,
    ]);
    assert!(tree.ok().contains("queen ("), "{tree:?}");
    let refused = client.cli(&[
        "mcp",
        "call",
        "hive",
        "describe",
        "--args",
        r#"{"process":999}"#,
    ]);
    assert!(refused.failed(1).contains("999"), "{refused:?}");
    // The same server, another request's token: refused before any call.
    let forged = client.cli(&["mcp", "call", "forged", "ps"]);
    assert!(forged.failed(3).contains("Auth required"), "{forged:?}");

    // The admin restarts it: a new session, ready again, one restart counted.
    let restarted = client.cli(&["mcp", "restart", "hive"]);
    assert!(
        restarted
            .ok()
            .starts_with("restarted hive: ready, 10 tools (restart "),
        "{restarted:?}"
    );
    let unknown = client.cli(&["mcp", "restart", "nope"]);
    assert!(unknown.failed(1).contains("nope"), "{unknown:?}");
    let tree = client.cli(&[
        "mcp",
        "call",
        "hive",
        "ps",
        "--args",
        r#"{"format":"tree"}"#,
    ]);
    assert!(tree.ok().contains("queen ("), "{tree:?}");
}
