//! MCP servers under the kernel, against the protocol's reference servers
//! from npm (`server-everything`, `server-filesystem`): tools listed and
//! called over stdio and streamable HTTP, a `tool_agent` reading files
//! through MCP, the spawn and call checks, and the faults a supervisor is
//! for: a server killed mid-call, one that never answers its handshake,
//! one that floods its output, and shutdown leaving nothing behind.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use hivekernel_agents::tool_agent::AgentSettings;
use hivekernel_agents::tools::ToolSettings;
use hivekernel_agents::{Capability, ErrorKind, Pid, Role, SpawnRequest};
use hivekernel_kernel::config::{KernelSettings, McpServerSpec, McpTransport, RoleSettings};
use hivekernel_kernel::events::EventKind;
use hivekernel_kernel::{Caller, Kernel};
use hivekernel_tests::llm_server::{LlmServer, Scripted};
use hivekernel_tests::mcp::{self, everything, wait_for_state};
use hivekernel_tests::{agent_registry, granting_all, run_task, start, test_settings, wait_until};
use serde_json::{Value, json};

const READY: Duration = Duration::from_secs(60);

/// Test settings in which agents may be given MCP tools (and everything else).
fn mcp_settings() -> KernelSettings {
    granting_all(test_settings(), &[Role::Agent])
}

/// An in-process kernel running `servers`, with `tool_agent` processes
/// talking to `llm` (when given).
async fn kernel_with(
    settings: KernelSettings,
    servers: Vec<McpServerSpec>,
    llm: Option<&LlmServer>,
) -> Kernel {
    let (registry, _) = agent_registry(AgentSettings::default(), &ToolSettings::default());
    let mut builder = Kernel::builder(settings)
        .runtimes(registry)
        .mcp_servers(servers);
    if let Some(llm) = llm {
        builder = builder.llm(Arc::new(llm.provider()));
    }
    start(builder).await
}

/// The `mcp_server` events so far, as (state, reason), without `tools_changed`.
fn server_events(kernel: &Kernel) -> Vec<(String, Option<String>)> {
    kernel
        .subscribe(Some(0))
        .replay
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::McpServer { state, reason, .. } if state != "tools_changed" => {
                Some((state.clone(), reason.clone()))
            }
            _ => None,
        })
        .collect()
}

/// The states of [`server_events`].
fn server_states(kernel: &Kernel) -> Vec<String> {
    server_events(kernel)
        .into_iter()
        .map(|(state, _)| state)
        .collect()
}

fn args(value: Value) -> serde_json::Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => panic!("arguments must be an object"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_server_s_tools_are_listed_and_called() {
    let kernel = kernel_with(mcp_settings(), vec![everything()], None).await;
    wait_for_state(&kernel, "everything", "ready", READY).await;
    let info = kernel.mcp().servers().pop().unwrap();
    assert_eq!((info.transport, info.restarts), ("stdio", 0));
    assert!(info.tools >= 10, "{info:?}");
    assert!(info.os_pid.is_some_and(mcp::alive), "{info:?}");
    assert!(
        info.server.as_deref().unwrap_or("").contains("everything"),
        "{info:?}"
    );

    let tools = kernel.mcp().server_tools("everything").unwrap();
    let echo = tools.iter().find(|t| t.name == "echo").unwrap();
    assert_eq!(echo.exposed, "mcp__everything__echo");
    assert!(echo.input_schema.contains("message"), "{echo:?}");
    let sum = tools.iter().find(|t| t.name == "get-sum").unwrap();
    assert_eq!(sum.exposed, "mcp__everything__get-sum");

    let call = |tool: &'static str, value: Value| {
        let kernel = kernel.clone();
        async move {
            kernel
                .mcp()
                .call(Caller::Admin, "everything", tool, args(value))
                .await
        }
    };
    let echoed = call("echo", json!({"message": "hi"})).await.unwrap();
    assert_eq!((echoed.text.as_str(), echoed.is_error), ("Echo: hi", false));
    let sum = call("get-sum", json!({"a": 2, "b": 3.5})).await.unwrap();
    assert!(sum.text.contains("5.5"), "{sum:?}");
    let weather = call("get-structured-content", json!({"location": "Chicago"}))
        .await
        .unwrap();
    assert!(weather.text.contains("temperature"), "{weather:?}");
    let image = call("get-tiny-image", json!({})).await.unwrap();
    assert!(image.text.contains("[image: image/png,"), "{image:?}");
    // The server's own validation: a tool error for the model, not a kernel error.
    let invalid = call("echo", json!({})).await.unwrap();
    assert!(invalid.is_error, "{invalid:?}");
    // A tool the server does not offer: refused by the kernel, naming the tools.
    let unknown = call("nope", json!({})).await.unwrap_err();
    assert_eq!(unknown.kind(), ErrorKind::InvalidArgument);
    assert!(unknown.to_string().contains("echo"), "{unknown}");
    let unknown_server = kernel
        .mcp()
        .call(Caller::Admin, "nowhere", "echo", args(json!({})))
        .await
        .unwrap_err();
    assert_eq!(unknown_server.kind(), ErrorKind::NotFound);
    assert!(
        unknown_server.to_string().contains("known: everything"),
        "{unknown_server}"
    );

    let pid = info.os_pid.unwrap();
    kernel.shutdown().await;
    assert!(
        !mcp::alive(pid),
        "shutdown left MCP server process {pid} running"
    );
    assert_eq!(kernel.mcp().servers()[0].state, "stopped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamable_http_server_is_marked_unavailable_while_gone_and_retried() {
    let mut http = mcp::HttpEverything::start().await;
    let mut spec = everything();
    spec.transport = McpTransport::Http {
        url: http.url.clone(),
        headers: [("X-Test".to_owned(), "yes".to_owned())].into(),
    };
    spec.startup_timeout = Duration::from_secs(3);
    spec.restart.max_restarts = 2;
    let kernel = kernel_with(mcp_settings(), vec![spec], None).await;
    wait_for_state(&kernel, "everything", "ready", READY).await;
    assert_eq!(kernel.mcp().servers()[0].transport, "http");
    let echoed = kernel
        .mcp()
        .call(
            Caller::Admin,
            "everything",
            "echo",
            args(json!({"message": "over http"})),
        )
        .await
        .unwrap();
    assert_eq!(echoed.text, "Echo: over http");

    // The server goes away: calls fail with a clear error, and the kernel
    // keeps trying, past its restart intensity too (at the longest backoff).
    http.kill().await;
    let gone = kernel
        .mcp()
        .call(
            Caller::Admin,
            "everything",
            "echo",
            args(json!({"message": "x"})),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            gone.kind(),
            ErrorKind::Unavailable | ErrorKind::DeadlineExceeded
        ),
        "{gone}"
    );
    wait_until("the HTTP server marked unavailable", READY, || async {
        kernel.mcp().servers()[0].state == "unavailable"
    })
    .await;
    wait_until("retries past the restart intensity", READY, || async {
        kernel.mcp().servers()[0].restarts > 4
    })
    .await;
    let port: u16 = http
        .url
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches("/mcp")
        .parse()
        .unwrap();
    let _back = mcp::HttpEverything::start_on(port).await;
    wait_for_state(&kernel, "everything", "ready", READY).await;
    let echoed = kernel
        .mcp()
        .call(
            Caller::Admin,
            "everything",
            "echo",
            args(json!({"message": "again"})),
        )
        .await
        .unwrap();
    assert_eq!(echoed.text, "Echo: again");
    let states = server_states(&kernel);
    assert_eq!(states.first().map(String::as_str), Some("ready"));
    assert_eq!(states.last().map(String::as_str), Some("ready"));
    assert!(
        states[1..states.len() - 1]
            .iter()
            .all(|s| s == "unavailable"),
        "{states:?}"
    );
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_lists_and_reads_files_through_the_filesystem_server() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    std::fs::write(root.join("notes.txt"), "the launch code is 0000\n").unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "nope").unwrap();
    let root_text = root.display().to_string();
    let fs = mcp::stdio(
        "fs",
        vec![mcp::bin("mcp-server-filesystem"), root_text.clone()],
    );
    let list = json!({ "path": root_text }).to_string();
    let read = json!({ "path": format!("{root_text}/notes.txt") }).to_string();
    let escape = json!({ "path": outside.path().join("secret.txt") }).to_string();
    let llm = LlmServer::start(vec![
        Scripted::tool_calls(&[("c1", "mcp__fs__list_directory", &list)]),
        Scripted::tool_calls(&[
            ("c2", "mcp__fs__read_text_file", &read),
            ("c3", "mcp__fs__read_text_file", &escape),
        ]),
        Scripted::content("the file holds a launch code"),
    ])
    .await;
    let kernel = kernel_with(mcp_settings(), vec![fs], Some(&llm)).await;
    wait_for_state(&kernel, "fs", "ready", READY).await;

    let mut request = SpawnRequest::new(Pid::KERNEL, "reader");
    request.role = Role::Agent;
    request.model = "test-model".into();
    request.runtime = Some("tool_agent".into());
    request.tools = vec![
        "mcp:fs/list_directory".into(),
        "mcp:fs/read_text_file".into(),
    ];
    let agent = kernel.spawn(Caller::Admin, request).await.unwrap();
    let answer = run_task(&kernel, agent, "what is in the directory?")
        .await
        .unwrap();
    assert_eq!(answer, "the file holds a launch code");

    let requests = llm.requests();
    assert_eq!(requests.len(), 3);
    let mut offered: Vec<&str> = requests[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    offered.sort_unstable();
    assert_eq!(
        offered,
        ["mcp__fs__list_directory", "mcp__fs__read_text_file"]
    );
    let results = |i: usize| hivekernel_tests::llm_server::tool_results(&requests[i]);
    assert!(
        results(1)[0].contains("[FILE] notes.txt"),
        "{:?}",
        results(1)
    );
    let second = results(2);
    assert!(second[1].contains("the launch code is 0000"), "{second:?}");
    assert!(
        second[2].starts_with("error: ") && second[2].contains("Access denied"),
        "a read outside the server's root is a tool error: {second:?}"
    );

    let events = kernel.subscribe(Some(0)).replay;
    let calls: Vec<(String, bool)> = events
        .iter()
        .filter(|e| e.pid == agent)
        .filter_map(|e| match &e.kind {
            EventKind::ToolCall { tool, ok, .. } => Some((tool.clone(), *ok)),
            _ => None,
        })
        .collect();
    assert_eq!(
        calls,
        [
            ("mcp__fs__list_directory".to_owned(), true),
            ("mcp__fs__read_text_file".to_owned(), true),
            ("mcp__fs__read_text_file".to_owned(), false),
        ]
    );
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_tools_pass_the_same_checks_as_built_in_ones() {
    let no_mcp = RoleSettings {
        capabilities: Some(
            Capability::ALL
                .iter()
                .copied()
                .filter(|c| *c != Capability::McpTools)
                .collect(),
        ),
        ..RoleSettings::default()
    };
    let mut settings = mcp_settings();
    settings.roles.insert(Role::Worker, no_mcp);
    let kernel = kernel_with(settings, vec![everything()], None).await;
    wait_for_state(&kernel, "everything", "ready", READY).await;

    let spawn = |parent: Pid, name: &str, role: Role, tools: &[&str]| {
        let mut request = SpawnRequest::new(parent, name);
        request.role = role;
        request.runtime = Some("tool_agent".into());
        request.tools = tools.iter().map(|t| (*t).to_owned()).collect();
        request
    };
    let refused = |request: SpawnRequest| {
        let kernel = kernel.clone();
        async move { kernel.spawn(Caller::Admin, request).await.unwrap_err() }
    };

    let err = refused(spawn(Pid::KERNEL, "a", Role::Agent, &["mcp:nowhere"])).await;
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("known: everything"), "{err}");
    let err = refused(spawn(
        Pid::KERNEL,
        "a",
        Role::Agent,
        &["mcp:everything/nope"],
    ))
    .await;
    assert!(err.to_string().contains("echo"), "lists the tools: {err}");
    let err = refused(spawn(Pid::KERNEL, "a", Role::Agent, &["mcp:bad name"])).await;
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    let err = refused(spawn(Pid::KERNEL, "w", Role::Worker, &["mcp:everything"])).await;
    assert!(err.to_string().contains("mcp_tools"), "{err}");

    let lead = kernel
        .spawn(
            Caller::Admin,
            spawn(Pid::KERNEL, "lead", Role::Agent, &["mcp:everything/echo"]),
        )
        .await
        .unwrap();
    // A child gets only what its parent has: one tool, not the whole server.
    let err = kernel
        .spawn(
            Caller::Process(lead),
            spawn(lead, "c", Role::Agent, &["mcp:everything"]),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied);
    kernel
        .spawn(
            Caller::Process(lead),
            spawn(lead, "c", Role::Agent, &["mcp:everything/echo"]),
        )
        .await
        .unwrap();

    // A process calls only what its tool list selects.
    let ok = kernel
        .mcp()
        .call(
            Caller::Process(lead),
            "everything",
            "echo",
            args(json!({"message": "m"})),
        )
        .await
        .unwrap();
    assert_eq!(ok.text, "Echo: m");
    let err = kernel
        .mcp()
        .call(
            Caller::Process(lead),
            "everything",
            "get-sum",
            args(json!({"a": 1, "b": 2})),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied);
    assert!(err.to_string().contains("mcp:everything/get-sum"), "{err}");
    let denied = kernel.subscribe(Some(0)).replay.into_iter().any(|e| {
        e.pid == lead && matches!(&e.kind, EventKind::Denied { action, .. } if action == "mcp_call")
    });
    assert!(denied, "a refused call is a denied event");
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_call_fails_the_call_and_comes_back() {
    let kernel = kernel_with(mcp_settings(), vec![everything()], None).await;
    wait_for_state(&kernel, "everything", "ready", READY).await;
    let first = kernel.mcp().servers()[0].os_pid.unwrap();

    let started = Instant::now();
    let long = tokio::spawn({
        let kernel = kernel.clone();
        async move {
            kernel
                .mcp()
                .call(
                    Caller::Admin,
                    "everything",
                    "trigger-long-running-operation",
                    args(json!({"duration": 15, "steps": 1})),
                )
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    std::process::Command::new("kill")
        .args(["-9", &first.to_string()])
        .status()
        .unwrap();
    let err = long.await.unwrap().unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the call failed only after {:?}",
        started.elapsed()
    );
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("everything"), "{err}");

    wait_until("a restarted server", READY, || async {
        let info = kernel.mcp().servers().pop().unwrap();
        info.state == "ready" && info.restarts == 1
    })
    .await;
    let second = kernel.mcp().servers()[0].os_pid.unwrap();
    assert_ne!(first, second);
    assert!(!mcp::alive(first));
    let echoed = kernel
        .mcp()
        .call(
            Caller::Admin,
            "everything",
            "echo",
            args(json!({"message": "back"})),
        )
        .await
        .unwrap();
    assert_eq!(echoed.text, "Echo: back");
    assert_eq!(server_states(&kernel), ["ready", "restarting", "ready"]);
    kernel.shutdown().await;
    assert!(!mcp::alive(second));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_its_handshake_is_restarted_then_given_up() {
    // A marker no other process has, to find its processes in /proc.
    let marker = format!("{}.{}", 600, std::process::id());
    let mut spec = mcp::stdio("mute", vec!["sleep".into(), marker.clone()]);
    spec.startup_timeout = Duration::from_secs(1);
    spec.restart.max_restarts = 2;
    let kernel = kernel_with(mcp_settings(), vec![spec], None).await;
    wait_for_state(&kernel, "mute", "failed", Duration::from_secs(30)).await;
    let info = kernel.mcp().servers().pop().unwrap();
    assert_eq!(info.restarts, 2);
    assert!(
        info.last_error
            .as_deref()
            .unwrap_or("")
            .contains("startup_timeout_seconds"),
        "{info:?}"
    );
    let events = server_events(&kernel);
    let states: Vec<&str> = events.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(states, ["restarting", "restarting", "failed"]);
    assert!(
        events[2]
            .1
            .as_deref()
            .unwrap_or("")
            .contains("restart intensity exceeded"),
        "{events:?}"
    );
    // A call to a failed server says so at once.
    let err = kernel
        .mcp()
        .call(Caller::Admin, "mute", "anything", args(json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::FailedPrecondition);
    assert!(err.to_string().contains("failed for good"), "{err}");
    assert_eq!(
        mcp::processes_left_with(&marker, Duration::from_secs(5)).await,
        Vec::<u32>::new(),
        "no sleep left behind"
    );
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_floods_its_output_costs_neither_memory_nor_the_session() {
    // 20 MiB of junk on one line, junk lines, 20 MiB on stderr, then the real server.
    let script = format!(
        "head -c 20000000 /dev/zero | tr '\\0' x; echo; \
         for i in 1 2 3; do echo 'not json-rpc'; done; \
         head -c 20000000 /dev/zero | tr '\\0' y >&2; \
         exec {} stdio",
        mcp::bin("mcp-server-everything")
    );
    let data = tempfile::tempdir().unwrap();
    let spec = mcp::stdio("flood", vec!["sh".into(), "-c".into(), script]);
    let settings = KernelSettings {
        data_dir: data.path().to_owned(),
        ..mcp_settings()
    };
    let (store, recovered) = hivekernel_tests::open_store(data.path()).await;
    let (registry, _) = agent_registry(AgentSettings::default(), &ToolSettings::default());
    let kernel = start(
        Kernel::builder(settings)
            .runtimes(registry)
            .store(store, recovered)
            .mcp_servers(vec![spec]),
    )
    .await;
    wait_for_state(&kernel, "flood", "ready", READY).await;
    let echoed = kernel
        .mcp()
        .call(
            Caller::Admin,
            "flood",
            "echo",
            args(json!({"message": "still here"})),
        )
        .await
        .unwrap();
    assert_eq!(echoed.text, "Echo: still here");
    assert_eq!(kernel.mcp().servers()[0].restarts, 0);
    let log = data.path().join("logs/mcp-flood.log");
    let kept = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0)
        + std::fs::metadata(data.path().join("logs/mcp-flood.log.1"))
            .map(|m| m.len())
            .unwrap_or(0);
    assert!(kept > 0, "its stderr is kept");
    assert!(
        kept <= 2 * (8 << 20) + (1 << 20),
        "the log is capped: {kept} bytes"
    );
    kernel.shutdown().await;
}

/// Stops (SIGSTOP) or resumes (SIGCONT) an OS process.
fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_server_is_found_by_a_ping_after_a_timed_out_call_and_restarted() {
    let mut spec = everything();
    spec.call_timeout = Duration::from_secs(1);
    spec.startup_timeout = Duration::from_secs(5);
    let kernel = kernel_with(mcp_settings(), vec![spec], None).await;
    wait_for_state(&kernel, "everything", "ready", READY).await;
    let hung = kernel.mcp().servers()[0].os_pid.unwrap();
    signal(hung, "-STOP");
    let err = kernel
        .mcp()
        .call(
            Caller::Admin,
            "everything",
            "echo",
            args(json!({"message": "?"})),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::DeadlineExceeded, "{err}");
    assert!(err.to_string().contains("timeout_seconds"), "{err}");
    wait_until("the hung server replaced", READY, || async {
        let info = kernel.mcp().servers().pop().unwrap();
        info.state == "ready" && info.restarts == 1
    })
    .await;
    let info = kernel.mcp().servers().pop().unwrap();
    assert!(
        info.last_error.as_deref().unwrap_or("").contains("hung"),
        "{info:?}"
    );
    assert!(!mcp::alive(hung), "the stopped server was killed");
    let echoed = kernel
        .mcp()
        .call(
            Caller::Admin,
            "everything",
            "echo",
            args(json!({"message": "ok"})),
        )
        .await
        .unwrap();
    assert_eq!(echoed.text, "Echo: ok");
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_is_not_kept_waiting_by_a_hung_server() {
    let mut spec = everything();
    spec.call_timeout = Duration::from_secs(1);
    spec.startup_timeout = Duration::from_secs(60);
    let kernel = kernel_with(mcp_settings(), vec![spec], None).await;
    wait_for_state(&kernel, "everything", "ready", READY).await;
    let hung = kernel.mcp().servers()[0].os_pid.unwrap();
    signal(hung, "-STOP");
    kernel
        .mcp()
        .call(
            Caller::Admin,
            "everything",
            "echo",
            args(json!({"message": "?"})),
        )
        .await
        .unwrap_err();
    // The supervisor is now waiting up to 60 s for a ping.
    let started = Instant::now();
    kernel.shutdown().await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "shutdown took {:?}",
        started.elapsed()
    );
    assert!(!mcp::alive(hung), "shutdown left the stopped server behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_restart_starts_a_server_again_even_one_that_failed_for_good() {
    let mut spec = everything();
    spec.restart.policy = hivekernel_agents::RestartPolicy::Temporary;
    let kernel = kernel_with(mcp_settings(), vec![spec], None).await;
    wait_for_state(&kernel, "everything", "ready", READY).await;
    let first = kernel.mcp().servers()[0].os_pid.unwrap();

    let refused = kernel
        .mcp()
        .restart_server(Caller::Process(Pid(1)), "everything")
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("only the admin"), "{refused}");
    let unknown = kernel
        .mcp()
        .restart_server(Caller::Admin, "nope")
        .await
        .unwrap_err();
    assert!(unknown.to_string().contains("nope"), "{unknown}");
    assert_eq!(kernel.mcp().servers()[0].os_pid, Some(first));

    // A ready server: closed, started again, ready by the time it answers.
    let restarted = kernel
        .mcp()
        .restart_server(Caller::Admin, "everything")
        .await
        .unwrap();
    assert_eq!((restarted.state, restarted.restarts), ("ready", 1));
    let second = restarted.os_pid.unwrap();
    assert_ne!(second, first);
    wait_until("the old server process gone", READY, || async {
        !mcp::alive(first)
    })
    .await;

    // Its restart policy is temporary: a crash fails it for good, and only a
    // restart brings it back.
    signal(second, "-KILL");
    wait_for_state(&kernel, "everything", "failed", READY).await;
    let failed = kernel
        .mcp()
        .call(
            Caller::Admin,
            "everything",
            "echo",
            args(json!({"message": "x"})),
        )
        .await
        .unwrap_err();
    assert!(failed.to_string().contains("failed for good"), "{failed}");
    let back = kernel
        .mcp()
        .restart_server(Caller::Admin, "everything")
        .await
        .unwrap();
    assert_eq!((back.state, back.restarts), ("ready", 2));
    let echoed = kernel
        .mcp()
        .call(
            Caller::Admin,
            "everything",
            "echo",
            args(json!({"message": "back"})),
        )
        .await
        .unwrap();
    assert_eq!(echoed.text, "Echo: back");
    let asked = server_events(&kernel)
        .into_iter()
        .filter(|(_, reason)| {
            reason
                .as_deref()
                .is_some_and(|r| r.contains("asked by the admin"))
        })
        .count();
    assert_eq!(asked, 2);
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_during_a_stdio_server_s_restart_waits_for_it() {
    let mut spec = everything();
    // Long enough to be seen restarting on a loaded machine.
    spec.restart.backoff_ms = [2000, 2000];
    let kernel = kernel_with(mcp_settings(), vec![spec], None).await;
    wait_for_state(&kernel, "everything", "ready", READY).await;
    let first = kernel.mcp().servers()[0].os_pid.unwrap();
    signal(first, "-KILL");
    wait_until("the server restarting", READY, || async {
        kernel.mcp().servers()[0].state == "restarting"
    })
    .await;
    // Made while it restarts: answered by the new server, not refused.
    let echoed = kernel
        .mcp()
        .call(
            Caller::Admin,
            "everything",
            "echo",
            args(json!({"message": "patient"})),
        )
        .await
        .unwrap();
    assert_eq!(echoed.text, "Echo: patient");
    let info = kernel.mcp().servers().pop().unwrap();
    assert_eq!((info.state, info.restarts), ("ready", 1));
    kernel.shutdown().await;
}
