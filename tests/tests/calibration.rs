//! Token estimates calibrated by what the server counts: a loopback server
//! that counts 1.3 tokens per estimated one; the kernel learns the ratio
//! from the first answer, estimates later requests within 10% of the
//! server's count, fits a daemon's growing conversation to the window as
//! the server counts it, and keeps the ratio across a restart.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use hivekernel_agents::llm::estimate_request_tokens;
use hivekernel_agents::tool_agent::AgentSettings;
use hivekernel_agents::tools::ToolSettings;
use hivekernel_agents::{Pid, Role, SpawnRequest, TaskSpec};
use hivekernel_kernel::config::KernelSettings;
use hivekernel_kernel::transcript::{EntryKind, Query};
use hivekernel_kernel::{Caller, Kernel};
use hivekernel_tests::llm_server::{LlmServer, Scripted, request_of};
use hivekernel_tests::{agent_registry, open_store, start, test_settings};

/// The server's count of a request: 1.3 per estimated token.
fn counted(estimated: u64) -> u64 {
    estimated * 13 / 10
}

const WINDOW: u64 = 2048;
const ANSWER: u32 = 256;

async fn kernel(server: &LlmServer, dir: &std::path::Path) -> Kernel {
    let settings = KernelSettings {
        workspace: Some(dir.join("work")),
        default_runtime: "tool_agent".into(),
        ..test_settings()
    };
    let agent = AgentSettings {
        default_context_tokens: WINDOW,
        max_completion_tokens: ANSWER,
        ..AgentSettings::default()
    };
    let (registry, _) = agent_registry(agent, &ToolSettings::default());
    let (store, recovered) = open_store(dir).await;
    start(
        Kernel::builder(settings)
            .runtimes(registry)
            .llm(Arc::new(server.provider()))
            .store(store, recovered),
    )
    .await
}

async fn daemon(kernel: &Kernel, name: &str) -> Pid {
    let mut request = SpawnRequest::new(Pid::KERNEL, name);
    request.role = Role::Daemon;
    request.model = "local".into();
    request.runtime = Some("tool_agent".into());
    request.system_prompt = "You take notes.".into();
    kernel.spawn(Caller::Admin, request).await.unwrap()
}

/// Each request's calibrated estimate with the server's count of it.
async fn estimates(kernel: &Kernel, pid: Pid) -> Vec<(u64, u64)> {
    let page = kernel
        .transcripts()
        .read(
            Caller::Admin,
            pid,
            Query {
                limit: 10_000,
                max_bytes: 16 << 20,
                ..Query::default()
            },
        )
        .await
        .unwrap();
    let mut pairs = Vec::new();
    let mut estimate = None;
    for entry in page.entries {
        match entry.kind {
            EntryKind::Request {
                estimated_tokens, ..
            } => estimate = estimated_tokens,
            EntryKind::Response { prompt_tokens, .. } => {
                pairs.push((estimate.take().unwrap(), prompt_tokens));
            }
            _ => {}
        }
    }
    pairs
}

fn within_ten_percent((estimated, counted): (u64, u64)) -> bool {
    estimated.abs_diff(counted) * 10 <= counted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn estimates_follow_the_servers_count_and_survive_a_restart() {
    let server = LlmServer::answering(|body| {
        let estimated = estimate_request_tokens(&request_of(body));
        Scripted::content_with_usage("noted", counted(estimated), 5)
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let kernel = kernel(&server, dir.path()).await;
    let pid = daemon(&kernel, "notes").await;

    // A note of about 400 estimated tokens each time: the conversation
    // outgrows the window and is shortened.
    for n in 0..6 {
        let note = format!("note {n}: {}", "lorem ipsum dolor sit amet ".repeat(60));
        let (_, reply) = kernel
            .execute_task(Caller::Admin, TaskSpec::new(pid, note))
            .await
            .unwrap();
        assert_eq!(reply.unwrap(), "noted");
    }
    let pairs = estimates(&kernel, pid).await;
    assert_eq!(pairs.len(), 6);
    // The first is the bare estimate; every later one is calibrated.
    assert!(!within_ten_percent(pairs[0]), "{pairs:?}");
    assert!(
        pairs[1..].iter().all(|p| within_ten_percent(*p)),
        "{pairs:?}"
    );
    // Fitted as the server counts: never past the window less the answer,
    // though the uncalibrated estimate would have let it grow 30% past.
    let budget = WINDOW - u64::from(ANSWER);
    assert!(
        pairs.iter().all(|(_, counted)| *counted <= budget),
        "{pairs:?}"
    );
    assert!(
        pairs.iter().any(|(_, counted)| *counted > budget * 3 / 4),
        "the conversation filled the window: {pairs:?}"
    );
    kernel.shutdown().await;

    // Learned once: a new kernel on the same store estimates right at once.
    let kernel = self::kernel(&server, dir.path()).await;
    let pid = daemon(&kernel, "again").await;
    let note = "a first note ".repeat(100);
    kernel
        .execute_task(Caller::Admin, TaskSpec::new(pid, note))
        .await
        .unwrap()
        .1
        .unwrap();
    let pairs = estimates(&kernel, pid).await;
    assert!(within_ten_percent(pairs[0]), "{pairs:?}");
    kernel.shutdown().await;
}
