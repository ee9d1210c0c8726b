//! Trace ids end to end: a client's `traceparent` ties a task to all the
//! work it causes, across an orchestrate's workers, in events and transcripts.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use hivekernel_agents::tool_agent::AgentSettings;
use hivekernel_agents::tools::ToolSettings;
use hivekernel_agents::{Pid, Role, SpawnRequest};
use hivekernel_kernel::config::KernelSettings;
use hivekernel_kernel::{Caller, Kernel};
use hivekernel_proto::v1 as pb;
use hivekernel_tests::llm_server::{LlmServer, scripted_answer};
use hivekernel_tests::served::Served;
use hivekernel_tests::{agent_registry, open_store, start, test_settings};
use tokio_stream::StreamExt;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// The events `request` replays as the admin, up to its `replay_done`.
async fn replayed(served: &Served, request: pb::SubscribeEventsRequest) -> Vec<pb::Event> {
    let mut stream = served
        .admin()
        .subscribe_events(request)
        .await
        .unwrap()
        .into_inner();
    let mut events = Vec::new();
    while let Some(event) = stream.next().await {
        let event = event.unwrap();
        if event.r#type == "replay_done" {
            break;
        }
        events.push(event);
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orchestrate_and_all_its_workers_share_the_callers_trace() {
    let server = LlmServer::answering(scripted_answer).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = KernelSettings {
        workspace: Some(dir.path().join("work")),
        default_runtime: "tool_agent".into(),
        ..test_settings()
    };
    let mut tools = ToolSettings::default();
    tools.orchestrate.worker_prompt = Arc::from("WORKER PROMPT: do the one subtask.");
    let (registry, _) = agent_registry(AgentSettings::default(), &tools);
    let (store, recovered) = open_store(dir.path()).await;
    let kernel = start(
        Kernel::builder(settings)
            .runtimes(registry)
            .llm(Arc::new(server.provider()))
            .store(store, recovered),
    )
    .await;
    let served = Served::start(&kernel).await;
    let mut request = SpawnRequest::new(Pid::KERNEL, "lead");
    request.role = Role::Daemon;
    request.runtime = Some("tool_agent".into());
    request.model = "test-model".into();
    request.tools = vec!["orchestrate".into()];
    let lead = kernel.spawn(Caller::Admin, request).await.unwrap();
    let before = kernel.last_event_seq();

    let mut call = tonic::Request::new(pb::ExecuteTaskRequest {
        pid: lead.0,
        description: "- one\n- two\n- three\n".into(),
        ..Default::default()
    });
    call.metadata_mut().insert(
        "traceparent",
        format!("00-{TRACE}-00f067aa0ba902b7-01").parse().unwrap(),
    );
    let reply = served
        .admin()
        .execute_task(call)
        .await
        .unwrap()
        .into_inner();
    assert!(reply.success, "{reply:?}");
    assert_eq!(reply.trace_id, TRACE);

    let events = replayed(
        &served,
        pb::SubscribeEventsRequest {
            since_seq: before,
            replay: true,
            ..Default::default()
        },
    )
    .await;
    let workers: std::collections::HashSet<u64> = events
        .iter()
        .filter(|e| e.r#type == "spawned")
        .map(|e| e.pid)
        .collect();
    assert_eq!(workers.len(), 3, "{events:#?}");
    // Everything it caused carries the trace: the lead's calls, each
    // worker's spawn, task, model call, exit and reaping.
    let untraced: Vec<_> = events.iter().filter(|e| e.trace_id != TRACE).collect();
    assert!(untraced.is_empty(), "{untraced:#?}");
    for worker in &workers {
        let kinds: Vec<&str> = events
            .iter()
            .filter(|e| e.pid == *worker)
            .map(|e| e.r#type.as_str())
            .collect();
        for kind in ["spawned", "llm_call", "task_finished", "exited", "reaped"] {
            assert!(kinds.contains(&kind), "worker {worker}: {kinds:?}");
        }
    }
    // And the lead's transcript.
    let transcript = served
        .admin()
        .get_transcript(pb::GetTranscriptRequest {
            pid: lead.0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!transcript.entries.is_empty());
    assert!(transcript.entries.iter().all(|e| e.trace_id == TRACE));

    // Without a traceparent (or with a malformed one), each call starts a new trace.
    let mut bad = tonic::Request::new(pb::ExecuteTaskRequest {
        pid: lead.0,
        description: "- four".into(),
        ..Default::default()
    });
    bad.metadata_mut()
        .insert("traceparent", "nonsense".parse().unwrap());
    let fresh = served.admin().execute_task(bad).await.unwrap().into_inner();
    assert!(fresh.success);
    assert_eq!(fresh.trace_id.len(), 32);
    assert_ne!(fresh.trace_id, TRACE);

    // The kernel replays one trace's events alone: the first task's, not the new one's.
    let traced = replayed(
        &served,
        pb::SubscribeEventsRequest {
            replay: true,
            trace_id: TRACE.to_uppercase(),
            ..Default::default()
        },
    )
    .await;
    // Up to where the first read ended (a worker may be reaped after it).
    let end = events.last().unwrap().seq;
    let seqs = |events: &[pb::Event]| -> Vec<u64> {
        events
            .iter()
            .map(|e| e.seq)
            .filter(|seq| *seq <= end)
            .collect()
    };
    assert_eq!(seqs(&traced), seqs(&events), "{traced:#?}");
    assert!(traced.iter().all(|e| e.trace_id == TRACE));
    kernel.shutdown().await;
}
