//! Transcripts end to end: a real kernel with a real store, its gRPC
//! server, and a chat-completions server on loopback.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use hivekernel_agents::tool_agent::AgentSettings;
use hivekernel_agents::tools::ToolSettings;
use hivekernel_agents::{Pid, Role, SpawnRequest, TaskSpec};
use hivekernel_kernel::config::{KernelSettings, TranscriptSettings};
use hivekernel_kernel::{Caller, Kernel, KernelError};
use hivekernel_proto::v1 as pb;
use hivekernel_tests::llm_server::{LlmServer, Scripted};
use hivekernel_tests::served::Served;
use hivekernel_tests::{agent_registry, open_store, start, test_settings, wait_until};
use serde_json::{Value, json};
use tokio_stream::StreamExt;

/// A kernel keeping its store in `dir`, whose agents talk to `server`.
async fn kernel_for(
    server: &LlmServer,
    dir: &std::path::Path,
    transcripts: TranscriptSettings,
) -> Kernel {
    kernel_with(Arc::new(server.provider()), dir, transcripts).await
}

/// [`kernel_for`] with a provider of the test's own.
async fn kernel_with(
    provider: Arc<dyn hivekernel_agents::llm::Provider>,
    dir: &std::path::Path,
    transcripts: TranscriptSettings,
) -> Kernel {
    let settings = KernelSettings {
        workspace: Some(dir.join("work")),
        default_runtime: "tool_agent".into(),
        transcripts,
        ..test_settings()
    };
    let (registry, _) = agent_registry(AgentSettings::default(), &ToolSettings::default());
    let (store, recovered) = open_store(dir).await;
    start(
        Kernel::builder(settings)
            .runtimes(registry)
            .llm(provider)
            .store(store, recovered),
    )
    .await
}

async fn spawn_agent(kernel: &Kernel, parent: Pid, name: &str, role: Role, tools: &[&str]) -> Pid {
    let mut request = SpawnRequest::new(parent, name);
    request.role = role;
    request.model = "test-model".into();
    request.runtime = Some("tool_agent".into());
    request.system_prompt = format!("You are {name}.");
    request.tools = tools.iter().map(|t| (*t).to_owned()).collect();
    kernel.spawn(Caller::Admin, request).await.unwrap()
}

/// Every entry of `pid`'s transcript through `GetTranscript`, page by page,
/// as JSON objects (the detail plus id, turn and type).
async fn read_all(
    client: &mut hivekernel_tests::served::Client,
    pid: Pid,
    page_size: u32,
) -> Vec<Value> {
    let mut request = pb::GetTranscriptRequest {
        pid: pid.0,
        page_size,
        ..Default::default()
    };
    let mut entries = Vec::new();
    loop {
        let page = client
            .get_transcript(request.clone())
            .await
            .unwrap()
            .into_inner();
        for entry in page.entries {
            entries.push(as_json(&entry));
        }
        if page.next_page_token.is_empty() {
            return entries;
        }
        request.page_token = page.next_page_token;
    }
}

fn as_json(entry: &pb::TranscriptEntry) -> Value {
    let mut value: Value = serde_json::from_str(&entry.detail).unwrap();
    value["id"] = entry.id.into();
    value["turn"] = entry.turn.into();
    value["pid"] = entry.pid.into();
    assert_eq!(value["type"], entry.r#type.as_str());
    value
}

fn types(entries: &[Value]) -> Vec<&str> {
    entries
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_tool_turn_reads_back_exactly_with_each_message_stored_once() {
    let server = LlmServer::start(vec![
        Scripted::tool_calls(&[
            (
                "call_1",
                "write_file",
                r#"{"path":"a.txt","content":"hello"}"#,
            ),
            ("call_2", "read_file", r#"{"path":"a.txt"}"#),
        ]),
        Scripted::content_with_usage("done: hello", 40, 7),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let kernel = kernel_for(&server, dir.path(), TranscriptSettings::default()).await;
    let served = Served::start(&kernel).await;
    let pid = spawn_agent(
        &kernel,
        Pid::KERNEL,
        "scribe",
        Role::Agent,
        &["write_file", "read_file"],
    )
    .await;
    let (_, reply) = kernel
        .execute_task(
            Caller::Admin,
            TaskSpec::new(pid, "write a.txt, then read it"),
        )
        .await
        .unwrap();
    assert_eq!(reply.unwrap(), "done: hello");

    // Two entries a page: the paging is exercised too.
    let entries = read_all(&mut served.admin(), pid, 2).await;
    assert_eq!(
        types(&entries),
        [
            "input",
            "message",
            "request",
            "response",
            "tool_result",
            "tool_result",
            "request",
            "response",
            "answer"
        ]
    );
    let id = |i: usize| entries[i]["id"].as_u64().unwrap();
    let turn = entries[0]["turn"].as_u64().unwrap();
    assert!(entries.iter().all(|e| e["turn"] == turn), "one turn");
    assert!(
        entries
            .windows(2)
            .all(|w| w[0]["id"].as_u64() < w[1]["id"].as_u64())
    );

    let input = &entries[0];
    assert_eq!(input["source"]["kind"], "task");
    assert_eq!(input["source"]["from"], 1);
    assert!(
        input["text"]
            .as_str()
            .unwrap()
            .contains("write a.txt, then read it")
    );
    assert_eq!(entries[1]["role"], "system");
    assert!(
        entries[1]["content"]
            .as_str()
            .unwrap()
            .contains("You are scribe.")
    );
    assert_eq!(entries[2]["messages"], json!([id(1), id(0)]));
    assert_eq!(entries[2]["model"], "test-model");

    let first = &entries[3];
    assert_eq!(
        first["tool_calls"],
        json!([
            {"id": "call_1", "name": "write_file", "arguments": r#"{"path":"a.txt","content":"hello"}"#},
            {"id": "call_2", "name": "read_file", "arguments": r#"{"path":"a.txt"}"#},
        ])
    );
    assert_eq!(first["finish_reason"], "tool_calls");
    assert_eq!(
        (
            first["prompt_tokens"].as_u64(),
            first["completion_tokens"].as_u64()
        ),
        (Some(10), Some(5))
    );

    // The results as the model got them, byte for byte.
    let sent = &server.requests()[1]["messages"];
    let tool_messages: Vec<&Value> = sent
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    for (entry, (message, (call, tool))) in entries[4..6].iter().zip(
        tool_messages
            .iter()
            .zip([("call_1", "write_file"), ("call_2", "read_file")]),
    ) {
        assert_eq!(entry["call_id"], call);
        assert_eq!(entry["tool"], tool);
        assert_eq!(entry["ok"], true);
        assert_eq!(entry["output"], message["content"]);
    }
    assert_eq!(entries[5]["output"], "hello");

    // The second request names what was recorded already: nothing twice.
    assert_eq!(
        entries[6]["messages"],
        json!([id(1), id(0), id(3), id(4), id(5)])
    );
    assert_eq!(entries[7]["content"], "done: hello");
    assert_eq!(
        (
            entries[7]["prompt_tokens"].as_u64(),
            entries[7]["completion_tokens"].as_u64()
        ),
        (Some(40), Some(7))
    );
    assert_eq!(entries[8]["text"], "done: hello");

    // The newest turn only, and a token that does not decode.
    let tail = served
        .admin()
        .get_transcript(pb::GetTranscriptRequest {
            pid: pid.0,
            tail_turns: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(tail.entries.len(), 9);
    let bad = served
        .admin()
        .get_transcript(pb::GetTranscriptRequest {
            pid: pid.0,
            page_token: "nonsense".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    assert!(bad.message().contains("page_token"), "{}", bad.message());
    let unknown = served
        .admin()
        .get_transcript(pb::GetTranscriptRequest {
            pid: 999,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    assert!(unknown.message().contains("999"), "{}", unknown.message());
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_reads_its_childs_transcript_but_not_its_siblings() {
    let server = LlmServer::answering(|_| Scripted::content("ok")).await;
    let dir = tempfile::tempdir().unwrap();
    let kernel = kernel_for(&server, dir.path(), TranscriptSettings::default()).await;
    let served = Served::start(&kernel).await;
    let lead = spawn_agent(&kernel, Pid::KERNEL, "lead", Role::Lead, &[]).await;
    let child = spawn_agent(&kernel, lead, "child", Role::Worker, &[]).await;
    let sibling = spawn_agent(&kernel, Pid::KERNEL, "sibling", Role::Worker, &[]).await;
    for pid in [child, sibling] {
        let (_, reply) = kernel
            .execute_task(Caller::Admin, TaskSpec::new(pid, "hi"))
            .await
            .unwrap();
        assert_eq!(reply.unwrap(), "ok");
    }
    let mut as_lead = served.with_token(&served.auth.issue(lead).unwrap());
    let read = |pid: Pid| pb::GetTranscriptRequest {
        pid: pid.0,
        ..Default::default()
    };
    let own_child = as_lead
        .get_transcript(read(child))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(own_child.entries.last().unwrap().r#type, "answer");
    let denied = as_lead.get_transcript(read(sibling)).await.unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied);
    assert!(
        denied.message().contains(&format!("process {sibling}")),
        "{}",
        denied.message()
    );
    let watch = as_lead
        .watch_transcript(pb::WatchTranscriptRequest {
            pid: sibling.0,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(watch.code(), tonic::Code::PermissionDenied);
    // Its own is readable (empty: it has handled nothing).
    let own = as_lead
        .get_transcript(read(lead))
        .await
        .unwrap()
        .into_inner();
    assert!(own.entries.is_empty());
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_streams_a_turn_as_it_happens_and_ends_with_the_process() {
    let server = LlmServer::start(vec![
        Scripted::tool_calls(&[("c1", "list_dir", "{}")]),
        // The answer streams in a word every 150 ms: about a second in all,
        // so a watcher slowed by a busy machine still reads its first
        // words while the turn runs.
        Scripted::streamed(
            "listed three files: a.txt, b.txt and c.txt",
            Duration::from_millis(150),
        ),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let kernel = kernel_for(&server, dir.path(), TranscriptSettings::default()).await;
    let served = Served::start(&kernel).await;
    let pid = spawn_agent(&kernel, Pid::KERNEL, "lister", Role::Agent, &["list_dir"]).await;
    let mut stream = served
        .admin()
        .watch_transcript(pb::WatchTranscriptRequest {
            pid: pid.0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let asker = kernel.clone();
    let task = tokio::spawn(async move {
        asker
            .execute_task(Caller::Admin, TaskSpec::new(pid, "list"))
            .await
    });
    let mut seen: Vec<String> = Vec::new();
    let mut streamed = String::new();
    let mut answered = String::new();
    while let Some(entry) = stream.next().await {
        let entry = entry.unwrap();
        let detail: serde_json::Value = serde_json::from_str(&entry.detail).unwrap();
        if entry.r#type == "partial" {
            // The answer so far: its first words arrive while the turn
            // still runs (the later ones may be read after it ended).
            assert!(
                !streamed.is_empty() || !task.is_finished(),
                "partial answers arrive while the turn runs"
            );
            streamed.push_str(detail["text"].as_str().unwrap());
        }
        if entry.r#type == "response" {
            answered = detail["content"].as_str().unwrap().to_owned();
        }
        // Consecutive partials count once: how the words bunch is timing.
        if seen
            .last()
            .is_none_or(|last| *last != entry.r#type || last != "partial")
        {
            seen.push(entry.r#type.clone());
        }
        if entry.r#type == "request" && seen.len() > 4 {
            // The second request is out; its answer is still streaming.
            assert!(!task.is_finished(), "entries arrive while the turn runs");
        }
        if entry.r#type == "answer" {
            break;
        }
    }
    assert_eq!(answered, "listed three files: a.txt, b.txt and c.txt");
    assert!(
        streamed.starts_with("listed ") && answered.starts_with(&streamed),
        "the partials are the answer as it came: {streamed:?}"
    );
    // Only the whole answer is kept.
    let kept = read_all(&mut served.admin(), pid, 100).await;
    assert!(types(&kept).iter().all(|t| *t != "partial"));
    assert_eq!(
        seen,
        [
            "input",
            "message",
            "request",
            "response",
            "tool_result",
            "request",
            "partial",
            "response",
            "answer"
        ]
    );
    task.await.unwrap().unwrap().1.unwrap();
    kernel.kill(Caller::Admin, pid, "done").await.unwrap();
    let end = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .unwrap();
    assert!(
        end.is_none(),
        "the watch ends once the process has exited: {end:?}"
    );
    kernel.shutdown().await;
}

/// What `read` finds of `pid`'s transcript as the admin, in memory or in the store.
async fn admin_entries(
    kernel: &Kernel,
    pid: Pid,
) -> Result<Vec<hivekernel_kernel::transcript::Entry>, KernelError> {
    let query = hivekernel_kernel::transcript::Query {
        limit: 10_000,
        max_bytes: usize::MAX,
        ..Default::default()
    };
    Ok(kernel
        .transcripts()
        .read(Caller::Admin, pid, query)
        .await?
        .entries)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transcript_past_its_size_loses_its_oldest_turns_and_goes_with_its_process() {
    let server = LlmServer::answering(|_| Scripted::content("noted")).await;
    let dir = tempfile::tempdir().unwrap();
    let limit = 64 << 10;
    let settings = TranscriptSettings {
        max_bytes_per_process: limit,
        ..TranscriptSettings::default()
    };
    let kernel = kernel_for(&server, dir.path(), settings).await;
    let keeper = spawn_agent(&kernel, Pid::KERNEL, "keeper", Role::Agent, &[]).await;
    let mut turns = Vec::new();
    for i in 0..24 {
        let text = format!("note {i}: {}", "x".repeat(6 << 10));
        kernel
            .execute_task(Caller::Admin, TaskSpec::new(keeper, text))
            .await
            .unwrap()
            .1
            .unwrap();
        let entries = admin_entries(&kernel, keeper).await.unwrap();
        turns.push(entries.last().unwrap().turn);
    }
    // Pruned after the batch that passed the limit: wait for the writer.
    wait_until(
        "the oldest turns pruned",
        Duration::from_secs(10),
        || async {
            let entries = admin_entries(&kernel, keeper).await.unwrap();
            entries.first().is_some_and(|e| e.turn > turns[0])
        },
    )
    .await;
    let entries = admin_entries(&kernel, keeper).await.unwrap();
    let text: usize = entries
        .iter()
        .map(|e| serde_json::to_string(&e.kind).unwrap().len())
        .sum();
    assert!(text <= limit as usize, "{text} bytes kept");
    let kept_turns: std::collections::BTreeSet<u64> = entries.iter().map(|e| e.turn).collect();
    assert!(
        kept_turns.len() >= 4 && kept_turns.len() < 24,
        "{kept_turns:?}"
    );
    assert_eq!(
        entries.last().unwrap().turn,
        turns[23],
        "the newest turn is whole"
    );
    assert!(matches!(
        entries.last().unwrap().kind,
        hivekernel_kernel::transcript::EntryKind::Answer { .. }
    ));

    // Collected: its transcript goes with it.
    kernel.kill(Caller::Admin, keeper, "done").await.unwrap();
    kernel
        .wait_child(Caller::Admin, keeper, None)
        .await
        .unwrap();
    wait_until(
        "the transcript deleted with its process",
        Duration::from_secs(10),
        || async {
            matches!(
                admin_entries(&kernel, keeper).await,
                Err(KernelError::NotFound(_))
            )
        },
    )
    .await;
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_after_exit_a_transcript_outlives_its_process_and_a_restart() {
    let server = LlmServer::answering(|_| Scripted::content("kept")).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = TranscriptSettings {
        keep_after_exit: true,
        ..TranscriptSettings::default()
    };
    let kernel = kernel_for(&server, dir.path(), settings).await;
    let pid = spawn_agent(&kernel, Pid::KERNEL, "brief", Role::Agent, &[]).await;
    kernel
        .execute_task(Caller::Admin, TaskSpec::new(pid, "once"))
        .await
        .unwrap()
        .1
        .unwrap();
    kernel.kill(Caller::Admin, pid, "done").await.unwrap();
    kernel.wait_child(Caller::Admin, pid, None).await.unwrap();
    let before = admin_entries(&kernel, pid).await.unwrap();
    assert_eq!(
        before.last().unwrap().kind,
        hivekernel_kernel::transcript::EntryKind::Answer {
            text: "kept".into()
        }
    );
    kernel.shutdown().await;

    let kernel = kernel_for(&server, dir.path(), settings).await;
    let after = admin_entries(&kernel, pid).await.unwrap();
    assert_eq!(after, before);
    // New entries continue the ids: none is handed out twice.
    let next = spawn_agent(&kernel, Pid::KERNEL, "next", Role::Agent, &[]).await;
    kernel
        .execute_task(Caller::Admin, TaskSpec::new(next, "again"))
        .await
        .unwrap()
        .1
        .unwrap();
    let newer = admin_entries(&kernel, next).await.unwrap();
    assert!(newer[0].turn > before.last().unwrap().id, "{newer:?}");
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_without_a_store_keeps_a_bounded_tail_in_memory() {
    let server = LlmServer::answering(|_| Scripted::content("fine")).await;
    let settings = KernelSettings {
        default_runtime: "tool_agent".into(),
        transcripts: TranscriptSettings {
            memory_entries: 100,
            ..TranscriptSettings::default()
        },
        ..test_settings()
    };
    let (registry, _) = agent_registry(AgentSettings::default(), &ToolSettings::default());
    let kernel = start(
        Kernel::builder(settings)
            .runtimes(registry)
            .llm(Arc::new(server.provider())),
    )
    .await;
    let pid = spawn_agent(&kernel, Pid::KERNEL, "mem", Role::Agent, &[]).await;
    for i in 0..30 {
        kernel
            .execute_task(Caller::Admin, TaskSpec::new(pid, format!("turn {i}")))
            .await
            .unwrap()
            .1
            .unwrap();
    }
    let entries = admin_entries(&kernel, pid).await.unwrap();
    // input, request, response, answer per turn (the system prompt once): the newest 100.
    assert_eq!(entries.len(), 100);
    let last = &entries[96..];
    assert!(
        matches!(&last[0].kind, hivekernel_kernel::transcript::EntryKind::Input { text, .. } if text.contains("turn 29"))
    );
    assert!(
        matches!(&last[3].kind, hivekernel_kernel::transcript::EntryKind::Answer { text } if text == "fine")
    );
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_attempt_is_an_llm_call_event_a_cancelled_one_too() {
    use hivekernel_agents::llm::{OpenAiProvider, OpenAiSettings};
    use hivekernel_kernel::events::EventKind;

    let server = LlmServer::start(vec![
        Scripted::error(500, "server_error", "boom"),
        Scripted::content("recovered"),
        // Streams a little, then nothing: the task's time runs out.
        hivekernel_tests::llm_server::Scripted::stalled("half an answer"),
    ])
    .await;
    let provider = OpenAiProvider::new(OpenAiSettings {
        base_url: server.base_url(),
        max_retries: 2,
        ..OpenAiSettings::default()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kernel = kernel_with(
        Arc::new(provider),
        dir.path(),
        TranscriptSettings::default(),
    )
    .await;
    let served = Served::start(&kernel).await;
    let pid = spawn_agent(&kernel, Pid::KERNEL, "retrier", Role::Agent, &[]).await;

    let (_, answer) = kernel
        .execute_task(Caller::Admin, TaskSpec::new(pid, "first"))
        .await
        .unwrap();
    assert_eq!(answer.unwrap(), "recovered");
    let mut slow = TaskSpec::new(pid, "second");
    slow.timeout = Some(Duration::from_secs(1));
    let outcome = kernel.execute_task(Caller::Admin, slow).await;
    assert!(
        matches!(&outcome, Err(KernelError::DeadlineExceeded(_))),
        "{outcome:?}"
    );

    let calls = || -> Vec<(Option<u32>, Option<String>, u64)> {
        kernel
            .subscribe(Some(0))
            .replay
            .iter()
            .filter(|e| e.pid == pid)
            .filter_map(|e| match &e.kind {
                EventKind::LlmCall {
                    attempt,
                    error,
                    prompt_tokens,
                    completion_tokens,
                    ..
                } => Some((*attempt, error.clone(), prompt_tokens + completion_tokens)),
                _ => None,
            })
            .collect()
    };
    wait_until("three llm_call events", Duration::from_secs(10), || {
        let n = calls().len();
        async move { n == 3 }
    })
    .await;
    let calls = calls();
    // The failed attempt, then the call that answered at its second.
    assert_eq!(calls[0].0, Some(1));
    let failed = calls[0].1.as_deref().unwrap();
    assert!(
        failed.starts_with("attempt 1: provider answered HTTP 500")
            && failed.contains("trying again"),
        "{failed}"
    );
    assert_eq!(
        (calls[1].0, calls[1].1.as_deref(), calls[1].2),
        (Some(2), None, 15)
    );
    // The call the timeout cancelled is one too.
    let cancelled = calls[2].1.as_deref().unwrap();
    assert!(cancelled.starts_with("cancelled after 1."), "{cancelled}");
    assert_eq!(calls[2].0, Some(1));
    // Its connection was closed, so the server stopped generating.
    wait_until("the stream closed", Duration::from_secs(10), || {
        let n = server.hung_up();
        async move { n == 1 }
    })
    .await;

    let entries = read_all(&mut served.admin(), pid, 100).await;
    let errors: Vec<&Value> = entries
        .iter()
        .filter(|e| e["type"] == "model_error")
        .collect();
    assert_eq!(errors.len(), 2, "{entries:#?}");
    assert!(
        errors[0]["error"]
            .as_str()
            .unwrap()
            .starts_with("attempt 1:")
    );
    assert!(
        errors[1]["error"]
            .as_str()
            .unwrap()
            .starts_with("cancelled")
    );
    assert_eq!(
        errors[1]["partial"], "half an answer",
        "what had streamed in is kept"
    );
    kernel.shutdown().await;
}
