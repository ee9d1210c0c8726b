//! The `tool_agent` runtime end to end: a real kernel, real tools, and a
//! real chat-completions server on loopback, scripted per test.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hivekernel_agents::tool_agent::AgentSettings;
use hivekernel_agents::tools::ToolSettings;
use hivekernel_agents::{Pid, Role, SpawnRequest, TaskSpec};
use hivekernel_kernel::events::EventKind;
use hivekernel_kernel::{Caller, Kernel};
use hivekernel_tests::llm_server::{
    LlmServer, Scripted, last_message, scripted_answer, system_message, tool_results,
};
use hivekernel_tests::{agent_kernel, run_task, test_settings, wait_until};
use serde_json::Value;

/// A kernel whose agents talk to `server`, with workspaces under `workspace`.
async fn kernel_for(
    server: &LlmServer,
    workspace: &std::path::Path,
    agent: AgentSettings,
    tools: ToolSettings,
) -> Kernel {
    let provider = server.provider();
    let settings = hivekernel_kernel::config::KernelSettings {
        workspace: Some(workspace.to_owned()),
        default_runtime: "tool_agent".into(),
        ..test_settings()
    };
    agent_kernel(settings, Arc::new(provider), agent, &tools)
        .await
        .0
}

/// A kernel with default agent settings and [`worker_tools`], workspaces in a fresh directory.
async fn default_kernel(server: &LlmServer) -> (Kernel, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let kernel = kernel_for(server, dir.path(), AgentSettings::default(), worker_tools()).await;
    (kernel, dir)
}

/// Spawns a `tool_agent` under PID 1 as the admin.
async fn spawn_agent(kernel: &Kernel, name: &str, role: Role, tools: &[&str]) -> Pid {
    let mut request = SpawnRequest::new(Pid::KERNEL, name);
    request.role = role;
    request.model = "test-model".into();
    request.runtime = Some("tool_agent".into());
    request.system_prompt = format!("You are {name}.");
    request.tools = tools.iter().map(|t| (*t).to_owned()).collect();
    kernel.spawn(Caller::Admin, request).await.unwrap()
}

/// Live descendants of `pid` (zombies and the process itself excluded).
async fn live_descendants(kernel: &Kernel, pid: Pid) -> Vec<String> {
    let procs = kernel
        .list_processes(Caller::Admin, pid, None)
        .await
        .unwrap();
    procs
        .into_iter()
        .filter(|p| p.pid != pid)
        .map(|p| format!("{} ({}) {:?}", p.name, p.pid, p.state))
        .collect()
}

fn worker_requests(server: &LlmServer) -> Vec<Value> {
    server
        .requests()
        .into_iter()
        .filter(|r| system_message(r).contains("WORKER PROMPT"))
        .collect()
}

/// The full `orchestrate` result, as the lead's model saw it in its tool message.
fn orchestrate_result(server: &LlmServer) -> String {
    server
        .requests()
        .iter()
        .filter_map(|r| r["messages"].as_array()?.last().cloned())
        .find(|m| m["role"] == "tool")
        .and_then(|m| m["content"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// The tool messages of a request body, in order.
fn worker_tools() -> ToolSettings {
    let mut tools = ToolSettings::default();
    tools.orchestrate.worker_prompt = Arc::from("WORKER PROMPT: do the one subtask.");
    tools
}

#[tokio::test]
async fn a_daemon_task_orchestrates_workers_end_to_end_and_leaves_none() {
    let server = LlmServer::answering(scripted_answer).await;
    let (kernel, _dir) = default_kernel(&server).await;
    let lead = spawn_agent(&kernel, "lead", Role::Daemon, &["orchestrate"]).await;

    let answer = run_task(
        &kernel,
        lead,
        "count the apples; weigh the pears; sort the plums",
    )
    .await
    .unwrap();
    assert!(answer.starts_with("Done: Summary: "), "{answer}");
    let result = orchestrate_result(&server);
    assert!(
        result.ends_with("(3 subtasks: 3 succeeded, 0 failed)"),
        "{result}"
    );
    for (i, part) in ["count the apples", "weigh the pears", "sort the plums"]
        .iter()
        .enumerate()
    {
        let handled = format!("[{}] {part} => ok: lead-w{} handled: {part}", i + 1, i + 1);
        assert!(result.contains(&handled), "{result}");
    }
    // The lead's two turns, the plan, three workers, the synthesis.
    assert_eq!(server.request_count(), 7);
    let workers = worker_requests(&server);
    assert_eq!(workers.len(), 3);
    assert!(
        workers
            .iter()
            .all(|r| r["tools"].is_null() || r["tools"] == serde_json::json!([]))
    );
    assert!(live_descendants(&kernel, lead).await.is_empty());
    // Usage: the lead's turns, the plan and the synthesis count against the lead.
    let info = kernel.get_process(Caller::Admin, lead).await.unwrap();
    assert_eq!(info.usage.calls, 4);
    assert!(info.usage.prompt_tokens > 0 && info.usage.completion_tokens > 0);
    kernel.shutdown().await;
}

#[tokio::test]
async fn a_failed_and_a_timed_out_worker_are_reported_and_every_worker_is_gone() {
    let server = LlmServer::answering(|body| {
        let last = last_message(body);
        if system_message(body).contains("WORKER PROMPT") && last.contains("broken") {
            return Scripted::error(400, "invalid_request_error", "worker model refused");
        }
        if system_message(body).contains("WORKER PROMPT") && last.contains("slow") {
            return scripted_answer(body).after(Duration::from_secs(5));
        }
        scripted_answer(body)
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut tools = worker_tools();
    tools.orchestrate.subtask_timeout_seconds = 1;
    let kernel = kernel_for(&server, dir.path(), AgentSettings::default(), tools).await;
    let lead = spawn_agent(&kernel, "lead", Role::Daemon, &["orchestrate"]).await;

    run_task(&kernel, lead, "fine work; broken work; slow work")
        .await
        .unwrap();
    let result = orchestrate_result(&server);
    assert!(
        result.contains("[1] fine work => ok: lead-w1 handled"),
        "{result}"
    );
    assert!(result.contains("[2] broken work => FAILED: "), "{result}");
    assert!(result.contains("worker model refused"), "{result}");
    assert!(result.contains("[3] slow work => FAILED: "), "{result}");
    assert!(
        result.ends_with("(3 subtasks: 1 succeeded, 2 failed)"),
        "{result}"
    );
    assert!(live_descendants(&kernel, lead).await.is_empty());
    kernel.shutdown().await;
}

#[tokio::test]
async fn an_abandoned_orchestration_kills_its_workers() {
    let server = LlmServer::answering(|body| {
        if system_message(body).contains("WORKER PROMPT") {
            return scripted_answer(body).after(Duration::from_secs(8));
        }
        scripted_answer(body)
    })
    .await;
    let (kernel, _dir) = default_kernel(&server).await;
    let lead = spawn_agent(&kernel, "lead", Role::Daemon, &["orchestrate"]).await;

    let mut spec = TaskSpec::new(lead, "first part; second part");
    spec.timeout = Some(Duration::from_millis(1500));
    let started = tokio::time::Instant::now();
    let outcome = kernel.execute_task(Caller::Admin, spec).await;
    assert!(outcome.is_err(), "{outcome:?}");
    assert_eq!(
        worker_requests(&server).len(),
        2,
        "both workers had started"
    );
    wait_until(
        "the workers to be killed",
        Duration::from_secs(5),
        || async { live_descendants(&kernel, lead).await.is_empty() },
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(7));
    kernel.shutdown().await;
}

#[tokio::test]
async fn an_unusable_plan_is_a_tool_error_and_spawns_nothing() {
    let server = LlmServer::answering(|body| {
        if system_message(body).contains("JSON array of subtasks") {
            return Scripted::content("Sure! First I would look at the apples.");
        }
        scripted_answer(body)
    })
    .await;
    let (kernel, _dir) = default_kernel(&server).await;
    let lead = spawn_agent(&kernel, "lead", Role::Daemon, &["orchestrate"]).await;
    let answer = run_task(&kernel, lead, "apples; pears").await.unwrap();
    assert!(
        answer.contains("error: the model's plan is not usable (no JSON array"),
        "{answer}"
    );
    assert!(worker_requests(&server).is_empty());
    assert!(live_descendants(&kernel, lead).await.is_empty());
    kernel.shutdown().await;
}

#[tokio::test]
async fn a_delegated_result_arrives_later_and_the_daemon_uses_it() {
    let server = LlmServer::answering(scripted_answer).await;
    let (kernel, _dir) = default_kernel(&server).await;
    let boss = spawn_agent(&kernel, "boss", Role::Daemon, &["delegate_async"]).await;
    let mut request = SpawnRequest::new(boss, "helper");
    request.runtime = Some("echo".into());
    let helper = kernel.spawn(Caller::Admin, request).await.unwrap();

    let answer = run_task(
        &kernel,
        boss,
        &format!("delegate: {helper} count the stars"),
    )
    .await
    .unwrap();
    assert!(answer.starts_with("Done: "), "{answer}");
    assert!(answer.contains("request"), "{answer}");

    // The answer comes back as a task_response and becomes a new input.
    wait_until(
        "the delegated result to reach the model",
        Duration::from_secs(5),
        || async {
            server.requests().iter().any(|r| {
                let last = last_message(r);
                last.contains("Result of delegated request") && last.contains("count the stars")
            })
        },
    )
    .await;
    let result_request = server
        .requests()
        .into_iter()
        .find(|r| last_message(r).contains("Result of delegated request"))
        .unwrap();
    assert!(last_message(&result_request).contains(&format!("succeeded, from process {helper}")));
    // That turn ends (its answer joins the conversation) after the request
    // reached the server: wait for its answer in the transcript.
    wait_until(
        "the turn on the delegated result to end",
        Duration::from_secs(5),
        || async {
            let query = hivekernel_kernel::transcript::Query {
                limit: 1000,
                max_bytes: 1 << 20,
                ..Default::default()
            };
            let page = kernel
                .transcripts()
                .read(Caller::Admin, boss, query)
                .await
                .unwrap();
            let answers = page.entries.iter().filter(|e| {
                matches!(
                    e.kind,
                    hivekernel_kernel::transcript::EntryKind::Answer { .. }
                )
            });
            answers.count() == 2
        },
    )
    .await;

    // A daemon keeps its conversation: the next task sees the delegated result.
    run_task(&kernel, boss, "what came back?").await.unwrap();
    let last = server.requests().pop().unwrap();
    let history = last["messages"].to_string();
    assert!(history.contains("Result of delegated request"), "{history}");
    assert!(history.contains("count the stars"), "{history}");
    kernel.shutdown().await;
}

#[tokio::test]
async fn task_role_agents_start_every_input_fresh() {
    let server = LlmServer::answering(scripted_answer).await;
    let (kernel, _dir) = default_kernel(&server).await;
    let agent = spawn_agent(&kernel, "solo", Role::Agent, &[]).await;
    assert_eq!(
        run_task(&kernel, agent, "first").await.unwrap(),
        "solo handled: first"
    );
    assert_eq!(
        run_task(&kernel, agent, "second").await.unwrap(),
        "solo handled: second"
    );
    let last = server.requests().pop().unwrap();
    assert_eq!(
        last["messages"].as_array().unwrap().len(),
        2,
        "system + input only"
    );
    kernel.shutdown().await;
}

#[tokio::test]
async fn tools_not_on_the_list_are_refused_whatever_the_model_asks() {
    let dir = tempfile::tempdir().unwrap();
    let sentinel = dir.path().join("agent/pwned");
    let server = LlmServer::start(vec![
        Scripted::tool_calls(&[
            ("c1", "shell_exec", r#"{"command": "touch pwned"}"#),
            ("c2", "spawn_child", r#"{"name": "rogue"}"#),
            ("c3", "rm_rf", "{}"),
            ("c4", "list_children", "{}"),
        ]),
        Scripted::content("finished"),
    ])
    .await;
    let kernel = kernel_for(
        &server,
        dir.path(),
        AgentSettings::default(),
        worker_tools(),
    )
    .await;
    let agent = spawn_agent(&kernel, "agent", Role::Agent, &["list_children"]).await;
    assert_eq!(
        run_task(&kernel, agent, "try everything").await.unwrap(),
        "finished"
    );

    let requests = server.requests();
    let offered: Vec<&str> = requests[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(offered, ["list_children"]);
    let results = tool_results(&requests[1]);
    assert_eq!(results.len(), 4);
    for (result, tool) in results.iter().zip(["shell_exec", "spawn_child", "rm_rf"]) {
        assert!(
            result.starts_with(&format!(
                "error: tool \"{tool}\" is not available to this agent (available: list_children)"
            )),
            "{result}"
        );
    }
    assert_eq!(results[3], "[]");
    assert!(!sentinel.exists());
    assert!(live_descendants(&kernel, agent).await.is_empty());
    kernel.shutdown().await;
}

#[tokio::test]
async fn malformed_tool_calls_come_back_as_errors_and_the_agent_carries_on() {
    let server = LlmServer::start(vec![
        Scripted::tool_calls(&[
            ("c1", "list_dir", "{not json"),
            ("c2", "list_dir", "[1, 2]"),
            ("c3", "list_dir", r#"{"path": 7}"#),
            ("c4", "list_dir", r#"{"path": "../.."}"#),
        ]),
        Scripted::content("recovered"),
        Scripted::status(200, "this is not JSON"),
        Scripted::content("still alive"),
    ])
    .await;
    let (kernel, _dir) = default_kernel(&server).await;
    let agent = spawn_agent(&kernel, "agent", Role::Agent, &["list_dir"]).await;
    assert_eq!(
        run_task(&kernel, agent, "look around").await.unwrap(),
        "recovered"
    );
    let results = tool_results(&server.requests()[1]);
    assert!(
        results[0].starts_with("error: arguments for list_dir are not valid JSON"),
        "{results:?}"
    );
    assert_eq!(
        results[1],
        "error: arguments for list_dir must be a JSON object"
    );
    assert!(
        results[2].contains("field `path` must be a string"),
        "{results:?}"
    );
    assert!(results[3].starts_with("error: "), "{results:?}");

    // An unreadable HTTP answer fails the task, not the process.
    let failed = run_task(&kernel, agent, "again").await.unwrap_err();
    assert!(
        failed.contains("model call failed: invalid response"),
        "{failed}"
    );
    assert_eq!(
        run_task(&kernel, agent, "and again").await.unwrap(),
        "still alive"
    );
    kernel.shutdown().await;
}

#[tokio::test]
async fn the_round_limit_ends_a_task_that_never_stops_calling_tools() {
    let server =
        LlmServer::answering(|_| Scripted::tool_calls(&[("c", "list_children", "{}")])).await;
    let dir = tempfile::tempdir().unwrap();
    let agent_settings = AgentSettings {
        max_tool_iterations: 3,
        ..AgentSettings::default()
    };
    let kernel = kernel_for(&server, dir.path(), agent_settings, worker_tools()).await;
    let agent = spawn_agent(&kernel, "looper", Role::Agent, &["list_children"]).await;
    let failed = run_task(&kernel, agent, "loop").await.unwrap_err();
    assert!(
        failed.contains("no final answer after 3 rounds of tool calls"),
        "{failed}"
    );
    assert_eq!(server.request_count(), 4);
    kernel.shutdown().await;
}

#[tokio::test]
async fn a_context_length_error_shortens_the_request_and_retries() {
    let server = LlmServer::start(vec![
        Scripted::content("first answer"),
        Scripted::context_length_exceeded(),
        Scripted::context_length_exceeded(),
        Scripted::content("fits now"),
    ])
    .await;
    let (kernel, _dir) = default_kernel(&server).await;
    let daemon = spawn_agent(&kernel, "keeper", Role::Daemon, &[]).await;
    run_task(&kernel, daemon, &"old context ".repeat(2000))
        .await
        .unwrap();
    assert_eq!(run_task(&kernel, daemon, "now").await.unwrap(), "fits now");
    let sizes: Vec<usize> = server
        .requests()
        .iter()
        .map(|r| r["messages"].to_string().len())
        .collect();
    assert!(sizes[2] < sizes[1] && sizes[3] <= sizes[2], "{sizes:?}");
    assert!(last_message(&server.requests()[3]).contains("now"));
    kernel.shutdown().await;
}

#[tokio::test]
async fn context_length_errors_past_three_retries_fail_the_task_clearly() {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let server = LlmServer::answering(move |_| {
        seen.fetch_add(1, Ordering::SeqCst);
        Scripted::context_length_exceeded()
    })
    .await;
    let (kernel, _dir) = default_kernel(&server).await;
    let agent = spawn_agent(&kernel, "agent", Role::Agent, &[]).await;
    let failed = run_task(&kernel, agent, "too big").await.unwrap_err();
    assert!(failed.contains("context length exceeded"), "{failed}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        4,
        "one call and three retries"
    );
    kernel.shutdown().await;
}

#[tokio::test]
async fn usage_from_the_provider_is_recorded_against_the_process() {
    let server = LlmServer::start(vec![
        Scripted::content_with_usage("one", 120, 30),
        Scripted::content_with_usage("two", 80, 5),
    ])
    .await;
    let (kernel, _dir) = default_kernel(&server).await;
    let agent = spawn_agent(&kernel, "counted", Role::Agent, &[]).await;
    run_task(&kernel, agent, "a").await.unwrap();
    run_task(&kernel, agent, "b").await.unwrap();
    let usage = kernel
        .get_process(Caller::Admin, agent)
        .await
        .unwrap()
        .usage;
    assert_eq!(
        (usage.calls, usage.prompt_tokens, usage.completion_tokens),
        (2, 200, 35)
    );
    kernel.shutdown().await;
}

#[tokio::test]
async fn workspace_tools_work_in_the_agents_own_directory() {
    let server = LlmServer::start(vec![
        Scripted::tool_calls(&[(
            "c1",
            "write_file",
            r#"{"path": "notes/a.txt", "content": "hello"}"#,
        )]),
        Scripted::content("written"),
    ])
    .await;
    let (kernel, dir) = default_kernel(&server).await;
    let agent = spawn_agent(&kernel, "scribe", Role::Agent, &["write_file"]).await;
    assert_eq!(run_task(&kernel, agent, "write").await.unwrap(), "written");
    let written = std::fs::read_to_string(dir.path().join("scribe/notes/a.txt")).unwrap();
    assert_eq!(written, "hello");
    kernel.shutdown().await;
}

#[tokio::test]
async fn an_unknown_tool_in_a_spawn_request_is_refused_with_the_known_ones() {
    let server = LlmServer::start(Vec::new()).await;
    let (kernel, _dir) = default_kernel(&server).await;
    let mut request = SpawnRequest::new(Pid::KERNEL, "bad");
    request.runtime = Some("tool_agent".into());
    request.tools = vec!["read_file".into(), "teleport".into()];
    let err = kernel
        .spawn(Caller::Admin, request)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown tool \"teleport\""), "{err}");
    assert!(
        err.contains("orchestrate") && err.contains("shell_exec"),
        "{err}"
    );
    assert_eq!(kernel.live_count(), 1);
    kernel.shutdown().await;
}

#[tokio::test]
async fn model_and_tool_calls_are_events_of_the_process_that_made_them() {
    let server = LlmServer::start(vec![
        Scripted::tool_calls(&[("c1", "list_dir", "{}"), ("c2", "rm_rf", "{}")]),
        Scripted::content_with_usage("looked", 12, 3),
        Scripted::status(200, "this is not JSON"),
    ])
    .await;
    let (kernel, _dir) = default_kernel(&server).await;
    let agent = spawn_agent(&kernel, "agent", Role::Agent, &["list_dir"]).await;
    assert_eq!(
        run_task(&kernel, agent, "look around").await.unwrap(),
        "looked"
    );
    run_task(&kernel, agent, "again").await.unwrap_err();

    let events = kernel.subscribe(Some(0)).replay;
    let mine = || events.iter().filter(|e| e.pid == agent);
    let calls: Vec<_> = mine()
        .filter_map(|e| match &e.kind {
            EventKind::LlmCall {
                model,
                prompt_tokens,
                completion_tokens,
                error,
                ..
            } => Some((
                model.to_string(),
                *prompt_tokens,
                *completion_tokens,
                error.clone(),
            )),
            _ => None,
        })
        .collect();
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert!(calls.iter().all(|c| c.0 == "test-model"), "{calls:?}");
    assert_eq!(calls[0].3, None);
    assert_eq!((calls[1].1, calls[1].2, calls[1].3.clone()), (12, 3, None));
    let failed = calls[2].3.as_deref().unwrap_or_default();
    assert!(failed.contains("invalid response"), "{calls:?}");
    assert_eq!(
        (calls[2].1, calls[2].2),
        (0, 0),
        "a failed call charges nothing"
    );

    let tools: Vec<_> = mine()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCall {
                tool, ok, error, ..
            } => Some((tool.clone(), *ok, error.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(tools.len(), 2, "{tools:?}");
    assert_eq!(
        (tools[0].0.as_str(), tools[0].1, &tools[0].2),
        ("list_dir", true, &None)
    );
    assert_eq!((tools[1].0.as_str(), tools[1].1), ("rm_rf", false));
    let refused = tools[1].2.as_deref().unwrap_or_default();
    assert!(refused.contains("not available to this agent"), "{refused}");
    // Each event names its kind in the log's JSON.
    let json = serde_json::to_value(
        mine()
            .find(|e| matches!(e.kind, EventKind::ToolCall { .. }))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(json["type"], "tool_call", "{json}");
    kernel.shutdown().await;
}
