//! The dashboard of the real binary, as a page calls it: the files without
//! a session and nothing else, login and logout, the Kernel service's
//! methods as JSON with the caller's scope, CSRF and origin checks, and the
//! live streams as server-sent events.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use hivekernel_tests::binary::Binary;
use hivekernel_tests::dashboard::{self, Session, login, request};
use hivekernel_tests::llm_server::{LlmServer, Scripted};
use serde_json::json;

fn binary() -> std::path::PathBuf {
    match hivekernel_tests::build_hivekernel() {
        Ok(bin) => bin,
        Err((bin, why)) => panic!("cannot build {}: {why}", bin.display()),
    }
}

fn admin_token(kernel: &Binary) -> String {
    std::fs::read_to_string(kernel.dir.join("data/admin.token"))
        .unwrap()
        .trim()
        .to_owned()
}

async fn start(dir: &std::path::Path) -> (Binary, LlmServer) {
    let server =
        LlmServer::answering(|_| Scripted::content_with_usage("the figures", 120, 30)).await;
    let config = json!({
        "kernel": { "listen": "127.0.0.1:0" },
        "llm": { "provider": "openai", "base_url": server.base_url(),
                 "api_key_env": "HIVEKERNEL_TEST_NO_KEY", "max_retries": 0 },
        "agents": [{
            "name": "writer", "role": "daemon", "runtime": "tool_agent", "model": "test-model",
            "system_prompt": "You write."
        }]
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    (Binary::start(&binary(), dir), server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_page_is_served_without_a_session_and_a_login_needs_a_real_token() {
    let dir = tempfile::tempdir().unwrap();
    let (kernel, _server) = start(dir.path()).await;
    let addr = dashboard::address(&kernel);
    assert!(
        kernel
            .log()
            .contains(&format!("dashboard on http://{addr}/")),
        "{}",
        kernel.log()
    );

    let page = request(&addr, "GET", "/", &[], "").unwrap();
    assert_eq!(page.status, 200);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    let policy = page.header("content-security-policy").unwrap();
    assert!(policy.contains("default-src 'none'") && policy.contains("frame-ancestors 'none'"));
    let etag = page.header("etag").unwrap().to_owned();
    let cached = request(&addr, "GET", "/", &[("If-None-Match", &etag)], "").unwrap();
    assert_eq!(cached.status, 304);
    for asset in ["/assets/app.js", "/assets/app.css"] {
        assert_eq!(request(&addr, "GET", asset, &[], "").unwrap().status, 200);
    }

    // Nothing else without a session.
    let session = request(&addr, "GET", "/api/session", &[], "").unwrap();
    assert_eq!(session.status, 401);
    assert_eq!(session.json()["code"], "UNAUTHENTICATED");
    let anonymous = request(
        &addr,
        "POST",
        "/api/rpc/ListProcesses",
        &[("Content-Type", "application/json")],
        "{}",
    )
    .unwrap();
    assert_eq!(anonymous.status, 401, "{anonymous:?}");
    let forged = request(
        &addr,
        "POST",
        "/api/rpc/GetProcess",
        &[
            ("Content-Type", "application/json"),
            ("Cookie", "hivekernel-1=0123"),
            ("Authorization", "Bearer nothing"),
        ],
        r#"{"pid": 1}"#,
    )
    .unwrap();
    assert_eq!(forged.status, 401, "{forged:?}");

    // A wrong token is refused, and sets no cookie.
    let token = admin_token(&kernel);
    let wrong = login(&addr, &format!("{token}x")).unwrap_err();
    assert_eq!(wrong.status, 401);
    assert_eq!(wrong.json()["message"], "invalid token");
    assert!(wrong.header("set-cookie").is_none());
    let not_json = request(
        &addr,
        "POST",
        "/api/login",
        &[("Content-Type", "text/plain")],
        &token,
    )
    .unwrap();
    assert_eq!(not_json.status, 400, "{not_json:?}");

    // The admin token logs in: an HttpOnly, SameSite=Strict cookie.
    let admin = login(&addr, &token).unwrap();
    assert_eq!(admin.described["scope"], "admin");
    assert!(admin.csrf.len() >= 32);
    let reply = request(
        &addr,
        "POST",
        "/api/login",
        &[("Content-Type", "application/json")],
        &json!({ "token": token }).to_string(),
    )
    .unwrap();
    let cookie = reply.header("set-cookie").unwrap();
    assert!(
        cookie.contains("HttpOnly")
            && cookie.contains("SameSite=Strict")
            && cookie.contains("Path=/"),
        "{cookie}"
    );
    assert!(!cookie.contains(&token), "{cookie}");
    // The session key is answered at login only.
    let described = admin.get("/api/session").json();
    assert_eq!(described["scope"], "admin");
    assert!(described.get("csrf").is_none(), "{described}");

    // Logout ends the session.
    assert_eq!(admin.post("/api/logout", &json!({}), &[]).status, 204);
    assert_eq!(admin.get("/api/session").status, 401);
    assert_eq!(admin.rpc("GetProcess", &json!({ "pid": 1 })).status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_act_as_the_session_with_its_scope_and_need_the_csrf_token() {
    let dir = tempfile::tempdir().unwrap();
    let (kernel, server) = start(dir.path()).await;
    let addr = dashboard::address(&kernel);
    let admin = login(&addr, &admin_token(&kernel)).unwrap();

    // The tree, as the page loads it: every batch of ListProcesses.
    let listed = admin.rpc("ListProcesses", &json!({}));
    assert_eq!(listed.status, 200, "{listed:?}");
    let processes: Vec<serde_json::Value> = listed
        .json()
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|batch| batch["processes"].as_array().unwrap().clone())
        .collect();
    let writer = processes.iter().find(|p| p["name"] == "writer").unwrap();
    let pid = writer["pid"].as_u64().unwrap();
    assert_eq!(writer["role"], "ROLE_DAEMON");
    assert_eq!(writer["mailboxLen"], 0);

    // A task from the page is answered as from any client.
    let answer = admin.rpc(
        "ExecuteTask",
        &json!({ "pid": pid, "description": "summarise" }),
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.json()["success"], true);
    assert_eq!(answer.json()["output"], "the figures");
    assert_eq!(server.request_count(), 1);
    let info = admin.rpc("GetProcess", &json!({ "pid": pid })).json();
    assert_eq!(info["usage"]["promptTokens"], 120);

    // Without the session key, with a wrong one, as a form, or from another
    // origin: refused, and nothing done.
    let kill = json!({ "pid": pid, "reason": "forged" });
    let mut no_csrf = admin.clone();
    no_csrf.csrf = String::new();
    let refused = no_csrf.rpc("Kill", &kill);
    assert_eq!(refused.status, 401, "{refused:?}");
    assert!(
        refused.json()["message"]
            .as_str()
            .unwrap()
            .contains("X-CSRF-Token")
    );
    let mut wrong = admin.clone();
    wrong.csrf = "0".repeat(admin.csrf.len());
    assert_eq!(wrong.rpc("Kill", &kill).status, 401);
    let form = request(
        &addr,
        "POST",
        "/api/rpc/Kill",
        &[
            ("Cookie", &admin.cookie),
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("X-CSRF-Token", &admin.csrf),
        ],
        &kill.to_string(),
    )
    .unwrap();
    assert_eq!(form.status, 400, "{form:?}");
    let cross = admin.post("/api/rpc/Kill", &kill, &[("Origin", "http://evil.example")]);
    assert_eq!(cross.status, 403, "{cross:?}");
    assert_eq!(
        admin.rpc("GetProcess", &json!({ "pid": pid })).json()["state"],
        "PROCESS_STATE_IDLE"
    );

    // Bad input is refused naming what was wrong.
    let typo = admin.rpc("GetProcess", &json!({ "pdi": pid }));
    assert_eq!(typo.status, 400);
    let message = typo.json()["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("GetProcessRequest") && message.contains("pdi"),
        "{message}"
    );
    let unknown = admin.rpc("DropTables", &json!({}));
    assert_eq!(unknown.status, 404);
    let live = admin.rpc("SubscribeEvents", &json!({}));
    assert_eq!(live.status, 400);
    assert!(live.body.contains("/api/watch/SubscribeEvents"), "{live:?}");
    let missing = admin.rpc("GetProcess", &json!({ "pid": 999_999 }));
    assert_eq!(
        (missing.status, missing.json()["code"].as_str()),
        (404, Some("NOT_FOUND"))
    );

    // A read token sees everything and may do nothing: a forged action is
    // refused by the same scope table as over gRPC.
    let created = kernel.json(&[
        "token", "create", "--scope", "read", "--name", "viewer", "--json",
    ]);
    let viewer = login(&addr, created["token"].as_str().unwrap()).unwrap();
    assert_eq!(viewer.described["scope"], "read");
    assert_eq!(viewer.rpc("GetProcess", &json!({ "pid": pid })).status, 200);
    let denied = viewer.rpc("Kill", &kill);
    assert_eq!(denied.status, 403, "{denied:?}");
    assert_eq!(denied.json()["code"], "PERMISSION_DENIED");
    assert!(
        denied.json()["message"]
            .as_str()
            .unwrap()
            .contains("operate"),
        "{denied:?}"
    );
    assert_eq!(
        viewer
            .rpc("ExecuteTask", &json!({ "pid": pid, "description": "x" }))
            .status,
        403
    );
    assert_eq!(server.request_count(), 1);

    // Revoking the token ends its session at once.
    kernel.cli(&["token", "revoke", "viewer"]);
    let ended = viewer.rpc("GetProcess", &json!({ "pid": pid }));
    assert_eq!(ended.status, 401, "{ended:?}");
    assert!(ended.body.contains("revoked"), "{ended:?}");

    // The admin may act.
    let killed = admin.rpc("Kill", &json!({ "pid": pid, "reason": "from the page" }));
    assert_eq!(killed.status, 200, "{killed:?}");
    assert_eq!(killed.json()["killed"], json!([pid]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_streams_arrive_as_server_sent_events() {
    let dir = tempfile::tempdir().unwrap();
    let (kernel, _server) = start(dir.path()).await;
    let addr = dashboard::address(&kernel);
    let admin: Session = login(&addr, &admin_token(&kernel)).unwrap();

    let mut events = admin.watch("SubscribeEvents", &json!({}));
    // The answer's headers come once the subscription is made.
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while events.status.is_none() && std::time::Instant::now() < deadline {
        events.next(Duration::from_millis(100));
    }
    let spawned = kernel.cli(&["spawn", "--name", "scout", "--parent", "writer"]);
    let pid: u64 = spawned
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{spawned}"));
    // Each server-sent event carries the messages that were ready together, as an array.
    let spawned_event = |sent: &dashboard::SentEvent| {
        let batch: serde_json::Value = serde_json::from_str(&sent.data).unwrap();
        let batch = batch
            .as_array()
            .unwrap_or_else(|| panic!("{sent:?}"))
            .clone();
        batch
            .into_iter()
            .find(|event| event["type"] == "spawned" && event["pid"] == pid)
    };
    let sent = events
        .until(Duration::from_secs(20), |sent| {
            spawned_event(sent).is_some()
        })
        .unwrap_or_else(|| panic!("no spawned event for {pid}: status {:?}", events.status));
    assert_eq!(events.status, Some(200));
    let event = spawned_event(&sent).unwrap();
    assert!(event["seq"].as_u64().unwrap() > 0);
    assert!(event["atUnixMs"].as_u64().unwrap() > 0);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(event["detail"].as_str().unwrap()).unwrap()["name"],
        "scout"
    );

    // A stream the caller may not read ends with an error event; a method
    // that is not a live stream is refused before any.
    let mut transcript = admin.watch("WatchTranscript", &json!({ "pid": 999_999 }));
    let status = transcript.next(Duration::from_secs(10));
    assert_eq!(transcript.status, Some(404), "{status:?}");
    let mut bad = admin.watch("Kill", &json!({ "pid": pid }));
    bad.next(Duration::from_secs(5));
    assert_eq!(bad.status, Some(400));
    assert_eq!(
        admin.rpc("GetProcess", &json!({ "pid": pid })).json()["name"],
        "scout"
    );
}

/// The writer answers `answer: <task>` (after 3 s when the task starts with
/// `slow:`); ops asks to run a command, which its approval rule holds.
async fn browser_kernel(dir: &std::path::Path) -> (Binary, LlmServer) {
    use hivekernel_tests::llm_server::{last_message, system_message};
    let server = LlmServer::answering(|request| {
        let messages = request["messages"].as_array().unwrap();
        let last = messages.last().unwrap();
        if system_message(request).contains("You run commands") {
            if last["role"] == "tool" {
                return Scripted::content(&format!("ran: {}", last["content"].as_str().unwrap()));
            }
            let args = json!({ "command": "echo approved-run" }).to_string();
            return Scripted::tool_calls(&[("c1", "shell_exec", &args)]);
        }
        let task = last_message(request);
        let answer = Scripted::content_with_usage(&format!("answer: {task}"), 200, 40);
        if task.contains("slow:") {
            answer.after(Duration::from_secs(3))
        } else {
            answer
        }
    })
    .await;
    let config = json!({
        "kernel": { "listen": "127.0.0.1:0", "workspace": dir.join("ws") },
        "llm": { "provider": "openai", "base_url": server.base_url(),
                 "api_key_env": "HIVEKERNEL_TEST_NO_KEY", "max_retries": 0 },
        "roles": { "daemon": { "capabilities": ["shell_exec", "spawn_children"] } },
        "agents": [
            { "name": "writer", "role": "daemon", "runtime": "tool_agent", "model": "test-model",
              "system_prompt": "You write." },
            { "name": "ops", "role": "daemon", "runtime": "tool_agent", "model": "test-model",
              "system_prompt": "You run commands.", "tools": ["shell_exec"],
              "approval": [{ "tool": "shell_exec", "timeout_seconds": 600 }] }
        ]
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    (Binary::start(&binary(), dir), server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_in_a_real_browser() {
    let playwright = dashboard::playwright();
    let chromium = dashboard::chromium();
    let dir = tempfile::tempdir().unwrap();
    let (kernel, _server) = browser_kernel(dir.path()).await;
    let addr = dashboard::address(&kernel);
    let read = kernel.json(&[
        "token", "create", "--scope", "read", "--name", "viewer", "--json",
    ]);
    let shots =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/dashboard-screenshots");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("browser/dashboard.mjs");
    let run = tokio::task::spawn_blocking({
        let kernel_bin = kernel.bin.clone();
        let data = kernel.dir.join("data");
        let grpc = kernel.addr.clone();
        let admin = admin_token(&kernel);
        move || {
            std::process::Command::new("node")
                .arg(script)
                .env("DASHBOARD_URL", format!("http://{addr}/"))
                .env("ADMIN_TOKEN", admin)
                .env("READ_TOKEN", read["token"].as_str().unwrap())
                .env("HIVEKERNEL_BIN", kernel_bin)
                .env("HIVEKERNEL_DATA_DIR", data)
                .env("HIVEKERNEL_ADDR", grpc)
                .env("SHOTS", shots)
                .env("CHROMIUM", chromium)
                .env("PLAYWRIGHT", playwright)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "{stdout}\n{stderr}\n--- kernel log ---\n{}",
        kernel.log()
    );
    assert!(stdout.contains("ok   logout returns"), "{stdout}");
}
