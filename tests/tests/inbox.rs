//! The inbox end to end: a `tool_agent` (driven by a chat-completions
//! server on loopback) whose `shell_exec` call an approval rule covers
//! waits for a person; approving runs it, denying and the timeout refuse it;
//! `ask_human` is answered through the `hivekernel` binary over the real
//! gRPC server; a killed process withdraws what it asked.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use hivekernel_agents::tool_agent::AgentSettings;
use hivekernel_agents::tools::ToolSettings;
use hivekernel_agents::{
    ApprovalRule, Capabilities, OnTimeout, Pid, ProcessState, Role, SpawnRequest,
};
use hivekernel_kernel::config::{KernelSettings, RoleSettings};
use hivekernel_kernel::events::EventKind;
use hivekernel_kernel::inbox::{Decision, InboxRequest};
use hivekernel_kernel::notify::NotifySettings;
use hivekernel_kernel::{Caller, Kernel, KernelError};
use hivekernel_tests::binary::Binary;
use hivekernel_tests::llm_server::{LlmServer, Scripted, tool_results};
use hivekernel_tests::served::{Served, TOKEN};
use hivekernel_tests::web_server::{Page, WebServer};
use hivekernel_tests::{agent_kernel, run_task, test_settings, wait_until};

fn rule(tool: &str, arguments: Option<&str>, timeout_seconds: u64) -> ApprovalRule {
    ApprovalRule {
        tool: tool.into(),
        arguments: arguments.map(str::to_owned),
        timeout_seconds,
        on_timeout: OnTimeout::Deny,
    }
}

/// A kernel whose agents (every capability) need approval under `rules`.
async fn kernel_with(
    server: &LlmServer,
    dir: &std::path::Path,
    rules: Vec<ApprovalRule>,
) -> Kernel {
    kernel_notifying(server, dir, rules, None).await
}

/// [`kernel_with`], calling the `notify` webhook.
async fn kernel_notifying(
    server: &LlmServer,
    dir: &std::path::Path,
    rules: Vec<ApprovalRule>,
    notify: Option<NotifySettings>,
) -> Kernel {
    let mut settings = KernelSettings {
        workspace: Some(dir.to_owned()),
        default_runtime: "tool_agent".into(),
        notify,
        ..test_settings()
    };
    settings.roles.insert(
        Role::Agent,
        RoleSettings {
            capabilities: Some(Capabilities::ALL),
            approval: rules,
            ..RoleSettings::default()
        },
    );
    let provider = Arc::new(server.provider());
    let tools = ToolSettings {
        shell: hivekernel_tests::shell_settings(settings.keep_out()),
        ..ToolSettings::default()
    };
    agent_kernel(settings, provider, AgentSettings::default(), &tools)
        .await
        .0
}

async fn spawn_agent(kernel: &Kernel, name: &str, tools: &[&str]) -> Pid {
    let mut request = SpawnRequest::new(Pid::KERNEL, name);
    request.model = "test-model".into();
    request.runtime = Some("tool_agent".into());
    request.system_prompt = format!("You are {name}.");
    request.tools = tools.iter().map(|t| (*t).to_owned()).collect();
    kernel.spawn(Caller::Admin, request).await.unwrap()
}

/// The one pending request, once there is one.
async fn pending(kernel: &Kernel) -> Arc<InboxRequest> {
    wait_until("a pending request", Duration::from_secs(20), || async {
        !kernel.inbox().pending(Caller::Admin).is_empty()
    })
    .await;
    let mut requests = kernel.inbox().pending(Caller::Admin);
    assert_eq!(requests.len(), 1, "{requests:?}");
    requests.remove(0)
}

fn shell(command: &str) -> Scripted {
    let args = serde_json::json!({ "command": command }).to_string();
    Scripted::tool_calls(&[("c1", "shell_exec", &args)])
}

#[tokio::test]
async fn an_approved_call_runs_after_the_agent_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let server =
        LlmServer::start(vec![shell("echo approved-run"), Scripted::content("done")]).await;
    let kernel = kernel_with(&server, dir.path(), vec![rule("shell_exec", None, 600)]).await;
    let agent = spawn_agent(&kernel, "ops", &["shell_exec"]).await;
    let task = tokio::spawn({
        let kernel = kernel.clone();
        async move { run_task(&kernel, agent, "say it").await }
    });

    let request = pending(&kernel).await;
    assert_eq!(request.pid, agent);
    let shown = serde_json::to_value(&*request).unwrap();
    assert_eq!(shown["kind"], "approval");
    assert_eq!(shown["tool"], "shell_exec");
    assert!(
        shown["arguments"]
            .as_str()
            .unwrap()
            .contains("echo approved-run"),
        "{shown}"
    );
    let info = kernel.get_process(Caller::Admin, agent).await.unwrap();
    assert_eq!(info.state, ProcessState::Waiting);
    assert_eq!(server.requests().len(), 1, "the model waits too");

    kernel
        .inbox()
        .resolve(
            Caller::Admin,
            request.id,
            Decision::Approved { note: "ok".into() },
        )
        .await
        .unwrap();
    assert_eq!(task.await.unwrap().unwrap(), "done");
    let results = tool_results(&server.requests()[1]);
    assert!(results[0].contains("approved-run"), "{results:?}");

    // Resolved once: a second decision and an unknown id are refused.
    let again = kernel
        .inbox()
        .resolve(
            Caller::Admin,
            request.id,
            Decision::Denied {
                reason: String::new(),
            },
        )
        .await
        .unwrap_err();
    assert!(
        again
            .to_string()
            .contains("already resolved: approved by admin"),
        "{again}"
    );
    let unknown = kernel
        .inbox()
        .resolve(
            Caller::Admin,
            999,
            Decision::Approved {
                note: String::new(),
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(unknown, KernelError::NoSuchRequest(999)),
        "{unknown}"
    );

    // Both ends are events of the agent, the decision with who made it.
    let events: Vec<String> = kernel
        .subscribe(Some(0))
        .replay
        .iter()
        .filter(|event| event.pid == agent)
        .filter_map(|event| match &event.kind {
            EventKind::ApprovalRequested { id, tool, .. } => Some(format!(
                "requested {id} {}",
                tool.clone().unwrap_or_default()
            )),
            EventKind::ApprovalResolved {
                id,
                decision,
                by,
                text,
            } => Some(format!("{decision} {id} by {by}: {text}")),
            _ => None,
        })
        .collect();
    assert_eq!(
        events,
        [
            format!("requested {} shell_exec", request.id),
            format!("approved {} by admin: ok", request.id)
        ]
    );
    kernel.shutdown().await;
}

#[tokio::test]
async fn a_denied_or_timed_out_call_never_runs_and_the_model_is_told_why() {
    let dir = tempfile::tempdir().unwrap();
    let server = LlmServer::start(vec![
        shell("touch denied-ran"),
        Scripted::content("gave up"),
        shell("touch timed-out-ran"),
        Scripted::content("gave up again"),
        shell("echo harmless"),
        Scripted::content("fine"),
    ])
    .await;
    let rules = vec![rule("shell_exec", Some("touch *"), 1)];
    let kernel = kernel_with(&server, dir.path(), rules).await;
    let agent = spawn_agent(&kernel, "ops", &["shell_exec"]).await;
    let task = tokio::spawn({
        let kernel = kernel.clone();
        async move { run_task(&kernel, agent, "first").await }
    });
    let request = pending(&kernel).await;
    let denied = Decision::Denied {
        reason: "not on prod".into(),
    };
    kernel
        .inbox()
        .resolve(Caller::Admin, request.id, denied)
        .await
        .unwrap();
    assert_eq!(task.await.unwrap().unwrap(), "gave up");
    let results = tool_results(&server.requests()[1]);
    assert!(
        results[0].contains("shell_exec was denied by admin: not on prod"),
        "{results:?}"
    );

    // Nobody decides: after its timeout the rule's on_timeout (deny) applies.
    assert_eq!(
        run_task(&kernel, agent, "second").await.unwrap(),
        "gave up again"
    );
    let results = tool_results(&server.requests()[3]);
    assert!(
        results[0].contains("nobody gave it within 1 seconds"),
        "{results:?}"
    );

    // A command the rule's glob does not match runs without asking.
    assert_eq!(run_task(&kernel, agent, "third").await.unwrap(), "fine");
    let results = tool_results(&server.requests()[5]);
    assert!(results[0].contains("harmless"), "{results:?}");
    assert!(kernel.inbox().pending(Caller::Admin).is_empty());
    let workspace = dir.path().join("ops");
    assert!(!workspace.join("denied-ran").exists() && !workspace.join("timed-out-ran").exists());
    kernel.shutdown().await;
}

// Several threads: the test blocks on the CLI while the server answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_human_is_answered_through_the_cli_and_a_killed_asker_withdraws() {
    let bin = match hivekernel_tests::build_hivekernel() {
        Ok(bin) => bin,
        Err((bin, why)) => panic!("cannot build {}: {why}", bin.display()),
    };
    let dir = tempfile::tempdir().unwrap();
    let question = serde_json::json!({
        "question": "Which region?",
        "choices": ["eu-west", "us-east"]
    })
    .to_string();
    let server = LlmServer::start(vec![
        Scripted::tool_calls(&[("c1", "ask_human", &question)]),
        Scripted::content("deploying"),
        Scripted::tool_calls(&[("c1", "ask_human", r#"{"question": "Anyone there?"}"#)]),
    ])
    .await;
    let kernel = kernel_with(&server, dir.path(), Vec::new()).await;
    let served = Served::start(&kernel).await;
    let agent = spawn_agent(&kernel, "deployer", &["ask_human"]).await;
    let task = tokio::spawn({
        let kernel = kernel.clone();
        async move { run_task(&kernel, agent, "deploy").await }
    });
    let request = pending(&kernel).await;
    let cli = |args: &[&str]| {
        let addr = format!("http://{}", served.addr);
        let out = std::process::Command::new(&bin)
            .args(args)
            .args(["--addr", &addr, "--token", TOKEN])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let id = request.id.to_string();
    let (code, listed, _) = cli(&["inbox"]);
    assert_eq!(code, Some(0));
    assert!(
        listed.contains("Which region? [eu-west | us-east]") && listed.contains("deployer"),
        "{listed}"
    );
    let (code, _, err) = cli(&["answer", &id, "mars"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("eu-west, us-east") && err.contains("\"mars\""),
        "{err}"
    );
    let (code, _, err) = cli(&["approve", &id]);
    assert_eq!(code, Some(1));
    assert!(err.contains("is a question: answer it"), "{err}");
    let (code, out, err) = cli(&["answer", &id, "eu-west"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(&format!("answered request {id} of process {agent}")),
        "{out}"
    );
    assert_eq!(task.await.unwrap().unwrap(), "deploying");
    assert_eq!(tool_results(&server.requests()[1]), ["eu-west"]);
    let (code, _, err) = cli(&["answer", &id, "us-east"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("already resolved: answered by admin"), "{err}");

    // Asked again, then killed while it waits: the request is withdrawn.
    let task = tokio::spawn({
        let kernel = kernel.clone();
        async move {
            let task = hivekernel_agents::TaskSpec::new(agent, "again");
            match kernel.execute_task(Caller::Admin, task).await {
                Ok((_, reply)) => reply,
                Err(err) => Err(err.to_string()),
            }
        }
    });
    let request = pending(&kernel).await;
    kernel.kill(Caller::Admin, agent, "enough").await.unwrap();
    let outcome = task.await.unwrap().unwrap_err();
    assert!(outcome.contains("exited"), "{outcome}");
    wait_until("the request withdrawn", Duration::from_secs(10), || async {
        kernel.inbox().pending(Caller::Admin).is_empty()
    })
    .await;
    let withdrawn = kernel.subscribe(Some(0)).replay.iter().any(|event| {
        matches!(&event.kind, EventKind::ApprovalResolved { id, decision, .. }
            if *id == request.id && decision == "withdrawn")
    });
    assert!(withdrawn);
    let (code, _, err) = cli(&["deny", &request.id.to_string()]);
    assert_eq!(code, Some(1));
    assert!(err.contains("already resolved: withdrawn"), "{err}");
    kernel.shutdown().await;
    served.stopped().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_approval_survives_kill_9_and_a_clean_stop_and_is_approved_after() {
    let bin = match hivekernel_tests::build_hivekernel() {
        Ok(bin) => bin,
        Err((bin, why)) => panic!("cannot build {}: {why}", bin.display()),
    };
    let dir = tempfile::tempdir().unwrap();
    let server = LlmServer::answering(|request| {
        let last = request["messages"].as_array().unwrap().last().unwrap();
        if last["role"] == "tool" {
            Scripted::content(&format!("ran: {}", last["content"].as_str().unwrap()))
        } else {
            shell("echo resumed > marker.txt && echo wrote-it")
        }
    })
    .await;
    let config = serde_json::json!({
        "kernel": { "listen": "127.0.0.1:0", "shutdown_grace_ms": 30000,
                    "workspace": dir.path().join("ws") },
        "llm": { "provider": "openai", "base_url": server.base_url(),
                 "api_key_env": "HIVEKERNEL_TEST_NO_KEY", "max_retries": 0 },
        "roles": { "daemon": { "capabilities": ["shell_exec"] } },
        "agents": [{
            "name": "ops", "role": "daemon", "runtime": "tool_agent", "model": "test-model",
            "system_prompt": "You run commands.", "tools": ["shell_exec"],
            "approval": [{ "tool": "shell_exec", "timeout_seconds": 3600 }]
        }]
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let mut kernel = Binary::start(&bin, dir.path());
    let ps = kernel.json(&["ps", "--json"]);
    let ops = ps
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "ops")
        .unwrap()["pid"]
        .as_u64()
        .unwrap();
    // The requester blocks in `exec`; the kernel dies under it.
    let mut exec = kernel
        .command(&["exec", &ops.to_string(), "write the marker"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pending = |kernel: &Binary| -> Vec<serde_json::Value> {
        kernel
            .json(&["inbox", "--json"])
            .as_array()
            .unwrap()
            .clone()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while pending(&kernel).is_empty() {
        assert!(std::time::Instant::now() < deadline, "nothing in the inbox");
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = pending(&kernel).remove(0);
    assert_eq!(before["tool"], "shell_exec", "{before}");
    let id = before["id"].as_u64().unwrap();

    let state = |kernel: &Binary| {
        let info = kernel.json(&["describe", &ops.to_string(), "--json"]);
        info["state"].as_str().unwrap_or_default().to_owned()
    };
    let waiting_again = |kernel: &Binary| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while state(kernel) != "waiting" {
            assert!(std::time::Instant::now() < deadline, "{}", state(kernel));
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    waiting_again(&kernel);

    // kill -9: the request and the turn that waits for it come back.
    kernel.child.kill().unwrap();
    kernel.child.wait().unwrap();
    let _ = exec.wait();
    drop(kernel);
    let mut kernel = Binary::start(&bin, dir.path());
    let after = pending(&kernel);
    assert_eq!(after.len(), 1, "{after:?}");
    for field in [
        "id",
        "pid",
        "tool",
        "arguments",
        "created_ms",
        "deadline_ms",
    ] {
        assert_eq!(after[0][field], before[field], "{field}");
    }
    waiting_again(&kernel);
    assert_eq!(server.requests().len(), 1, "the model is not asked again");

    // A clean stop does not wait out the grace period for a parked turn,
    // and keeps it too.
    let stopping = std::time::Instant::now();
    let term = std::process::Command::new("kill")
        .args(["-TERM", &kernel.child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let status = kernel.child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(
        stopping.elapsed() < Duration::from_secs(15),
        "the stop took {:?}",
        stopping.elapsed()
    );
    drop(kernel);
    let kernel = Binary::start(&bin, dir.path());
    assert_eq!(pending(&kernel)[0]["id"], id);
    waiting_again(&kernel);
    assert!(!dir.path().join("ws/ops/marker.txt").exists());

    let out = kernel.cli(&["approve", &id.to_string(), "--note", "go ahead"]);
    assert!(out.contains(&format!("request {id}")), "{out}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while server.requests().len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the turn did not go on"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        tool_results(&server.requests()[1]),
        ["exit code: 0\nwrote-it\n"]
    );
    let marker = std::fs::read_to_string(dir.path().join("ws/ops/marker.txt")).unwrap();
    assert_eq!(marker, "resumed\n");
    assert!(pending(&kernel).is_empty());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while state(&kernel) == "waiting" {
        assert!(std::time::Instant::now() < deadline, "still waiting");
        std::thread::sleep(Duration::from_millis(50));
    }
    let events = kernel.cli(&["events", "--json"]);
    let resolved = events
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|event| event["type"] == "approval_resolved")
        .collect::<Vec<_>>();
    assert_eq!(resolved.len(), 1, "{resolved:?}");
    assert_eq!(resolved[0]["id"], id, "{resolved:?}");
    assert_eq!(resolved[0]["decision"], "approved", "{resolved:?}");
    assert_eq!(resolved[0]["by"], "admin", "{resolved:?}");
}

/// Webhook settings for `url` on loopback.
fn hook(url: &str, retries: u32) -> NotifySettings {
    NotifySettings {
        url: url.parse().unwrap(),
        headers: vec![("Authorization".into(), "Bearer hook-secret".into())],
        allow_private_networks: true,
        allow_addresses: Vec::new(),
        timeout: Duration::from_secs(2),
        retries,
    }
}

#[tokio::test]
async fn the_notify_webhook_hears_of_each_request_and_a_failing_one_holds_nothing_up() {
    let dir = tempfile::tempdir().unwrap();
    let empty = |status| Page::Body {
        status,
        content_type: None,
        body: Vec::new(),
    };
    let hooks = WebServer::start(vec![("/hook", empty(204)), ("/broken", empty(500))]).await;
    let server = LlmServer::start(vec![
        shell("echo told"),
        Scripted::content("done"),
        shell("echo untold"),
        Scripted::content("done anyway"),
    ])
    .await;

    // A working webhook gets the request as JSON, with its header.
    let notify = hook(&hooks.url("/hook"), 0);
    let rules = vec![rule("shell_exec", None, 600)];
    let kernel = kernel_notifying(&server, dir.path(), rules.clone(), Some(notify)).await;
    let agent = spawn_agent(&kernel, "ops", &["shell_exec"]).await;
    let task = tokio::spawn({
        let kernel = kernel.clone();
        async move { run_task(&kernel, agent, "tell them").await }
    });
    let request = pending(&kernel).await;
    wait_until("the webhook called", Duration::from_secs(20), || async {
        !hooks.received().is_empty()
    })
    .await;
    let call = hooks.received().remove(0);
    assert_eq!(
        (call.method.as_str(), call.path.as_str()),
        ("POST", "/hook")
    );
    assert_eq!(call.authorization.as_deref(), Some("Bearer hook-secret"));
    let body: serde_json::Value = serde_json::from_str(&call.body).unwrap();
    assert_eq!(body["type"], "inbox_request", "{body}");
    assert_eq!(body["request"]["id"], request.id, "{body}");
    assert_eq!(body["request"]["pid"], agent.0, "{body}");
    assert_eq!(body["request"]["tool"], "shell_exec", "{body}");
    assert!(
        body["request"]["arguments"]
            .as_str()
            .unwrap()
            .contains("echo told"),
        "{body}"
    );
    kernel
        .inbox()
        .resolve(
            Caller::Admin,
            request.id,
            Decision::Approved {
                note: String::new(),
            },
        )
        .await
        .unwrap();
    assert_eq!(task.await.unwrap().unwrap(), "done");
    kernel.shutdown().await;

    // A failing one is retried, then reported; the request waits as usual.
    let notify = hook(&hooks.url("/broken"), 1);
    let kernel = kernel_notifying(&server, dir.path(), rules, Some(notify)).await;
    let agent = spawn_agent(&kernel, "ops2", &["shell_exec"]).await;
    let task = tokio::spawn({
        let kernel = kernel.clone();
        async move { run_task(&kernel, agent, "tell nobody").await }
    });
    let request = pending(&kernel).await;
    let failed = || {
        kernel
            .subscribe(Some(0))
            .replay
            .iter()
            .find_map(|event| match &event.kind {
                EventKind::NotifyFailed {
                    id,
                    error,
                    attempts,
                } if *id == request.id => Some((event.pid, error.clone(), *attempts)),
                _ => None,
            })
    };
    wait_until("the failure reported", Duration::from_secs(20), || async {
        failed().is_some()
    })
    .await;
    let (pid, error, attempts) = failed().unwrap();
    assert_eq!((pid, attempts), (agent, 2));
    assert!(error.contains("HTTP 500"), "{error}");
    assert!(!error.contains("/broken"), "the path stays out: {error}");
    let broken = hooks
        .received()
        .iter()
        .filter(|c| c.path == "/broken")
        .count();
    assert_eq!(broken, 2);
    kernel
        .inbox()
        .resolve(
            Caller::Admin,
            request.id,
            Decision::Approved {
                note: String::new(),
            },
        )
        .await
        .unwrap();
    assert_eq!(task.await.unwrap().unwrap(), "done anyway");
    kernel.shutdown().await;
}
