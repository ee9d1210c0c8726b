//! The `tool_agent` against a zero-latency loopback chat-completions server:
//! the kernel's overhead per agent turn, and `orchestrate` with many workers,
//! each with transcripts recorded (the default) and with them off, measured
//! in alternation (blocks of turns, single orchestrations) so the pair sees
//! the same machine.
//!
//! The floor for both is the model calls alone: the same provider (same HTTP
//! client, same admission cap) making the same requests to the same server,
//! so what is left is the kernel and the agent loop.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::{StreamExt, stream};
use hivekernel_agents::llm::{
    ChatMessage, ChatRequest, ChatResponse, LlmError, OpenAiProvider, OpenAiSettings, Provider,
    Watch,
};
use hivekernel_agents::tool_agent::AgentSettings;
use hivekernel_agents::tools::ToolSettings;
use hivekernel_agents::{LimitOverrides, Pid, Role, SpawnRequest, TaskSpec};
use hivekernel_kernel::config::{KernelSettings, TranscriptSettings};
use hivekernel_kernel::{Caller, Kernel};
use hivekernel_tests::llm_server::{LlmServer, scripted_answer};

use crate::report::{Row, Target, Unit};
use crate::stats::{Latencies, median};
use crate::{Sizes, count};

pub(crate) const FLOOR: &str = "the same model calls made directly with the same provider \
                                (HTTP client, admission cap) against the same loopback server";

/// Requests in flight to the loopback server at once.
const IN_FLIGHT: usize = 64;

/// A provider that adds up the time spent inside the HTTP provider.
#[derive(Debug)]
struct Timed {
    inner: OpenAiProvider,
    nanos: AtomicU64,
}

#[async_trait]
impl Provider for Timed {
    fn name(&self) -> &str {
        "openai"
    }

    async fn call(
        &self,
        request: &ChatRequest,
        watch: &dyn Watch,
    ) -> Result<ChatResponse, LlmError> {
        let start = Instant::now();
        let answer = self.inner.call(request, watch).await;
        self.nanos
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        answer
    }
}

fn provider(server: &LlmServer) -> OpenAiProvider {
    OpenAiProvider::new(OpenAiSettings {
        base_url: server.base_url(),
        request_timeout: Duration::from_secs(30),
        max_retries: 0,
        max_in_flight: IN_FLIGHT,
        ..OpenAiSettings::default()
    })
    .expect("provider settings")
}

/// A kernel as `hivekernel start` runs it: with its store, which every
/// model call's usage is committed to (and, with `transcripts`, every
/// turn's transcript). The store lives in the returned directory.
async fn start(
    provider: Arc<dyn Provider>,
    max_children: u32,
    max_workers: u32,
    transcripts: bool,
) -> (Kernel, tempfile::TempDir) {
    let settings = crate::observed(KernelSettings {
        listen: "127.0.0.1:0".parse().expect("address"),
        max_children,
        task_timeout_seconds: 600,
        mailbox_capacity: 4096,
        workspace: Some(std::env::temp_dir().join("hivekernel-bench-ws")),
        transcripts: TranscriptSettings {
            enabled: transcripts,
            ..TranscriptSettings::default()
        },
        ..KernelSettings::default()
    });
    let mut tools = ToolSettings::default();
    tools.orchestrate.max_workers = max_workers;
    tools.orchestrate.subtask_timeout_seconds = 600;
    let dir = tempfile::tempdir().expect("a directory for the store");
    let (registry, _) = hivekernel_tests::agent_registry(AgentSettings::default(), &tools);
    let (store, recovered) = hivekernel_tests::open_store(dir.path()).await;
    let kernel = hivekernel_tests::start(crate::traced(
        Kernel::builder(settings)
            .runtimes(registry)
            .llm(provider)
            .store(store, recovered),
    ))
    .await;
    (kernel, dir)
}

async fn spawn_agent(kernel: &Kernel, name: &str, tools: &[&str], max_children: u32) -> Pid {
    let mut request = SpawnRequest::new(Pid::KERNEL, name);
    request.role = Role::Daemon;
    request.runtime = Some("tool_agent".into());
    request.model = "bench".into();
    request.system_prompt = "You coordinate.".into();
    request.tools = tools.iter().map(|t| (*t).to_owned()).collect();
    request.limits = LimitOverrides {
        max_children: Some(max_children),
        ..LimitOverrides::default()
    };
    kernel
        .spawn(Caller::Admin, request)
        .await
        .expect("spawn the agent")
}

/// Turns one kernel of a pair runs before the other takes over, so both
/// see the same machine (a shared 2-core machine drifts within seconds).
const BLOCK: usize = 50;

/// One turn of a tool-less agent (a task in, one model call, the answer out),
/// beside the model call alone; with transcripts on and off, in alternating blocks.
pub(crate) async fn turn(sizes: &Sizes) -> Vec<Row> {
    let server = LlmServer::answering(scripted_answer).await;
    let timed = Arc::new(Timed {
        inner: provider(&server),
        nanos: AtomicU64::new(0),
    });
    let mut kernels = Vec::new();
    for transcripts in [true, false] {
        let (kernel, store) = start(timed.clone(), 32, 8, transcripts).await;
        // A task-role agent: every turn starts fresh, so each does the same work.
        let mut request = SpawnRequest::new(Pid::KERNEL, "solo");
        request.role = Role::Agent;
        request.runtime = Some("tool_agent".into());
        request.model = "bench".into();
        request.system_prompt = "You answer.".into();
        let agent = kernel
            .spawn(Caller::Admin, request)
            .await
            .expect("spawn the agent");
        kernels.push((kernel, agent, store));
    }
    let turns = sizes.asks.min(2_000);
    // [on, off]: overheads and p50s per run.
    let mut overheads = [Vec::new(), Vec::new()];
    let mut turn_p50 = [Vec::new(), Vec::new()];
    let mut call_p50 = Vec::with_capacity(sizes.runs);
    for run in 0..=sizes.runs {
        let mut latencies = [0, 1].map(|_| Latencies::with_capacity(turns));
        let mut outside_http = [0.0; 2];
        // The two take turns in blocks, the first of each pair alternating.
        for block in 0..turns.div_ceil(BLOCK) {
            for k in 0..2 {
                let which = (block + k) % 2;
                let (kernel, agent, _) = &kernels[which];
                let before = timed.nanos.load(Ordering::Relaxed);
                let started = Instant::now();
                for i in block * BLOCK..((block + 1) * BLOCK).min(turns) {
                    let t = Instant::now();
                    let (_, reply) = kernel
                        .execute_task(
                            Caller::Admin,
                            TaskSpec::new(*agent, format!("question {i}")),
                        )
                        .await
                        .expect("execute_task");
                    reply.expect("the turn succeeds");
                    latencies[which].record(t.elapsed());
                }
                let in_http = (timed.nanos.load(Ordering::Relaxed) - before) as f64;
                outside_http[which] += started.elapsed().as_nanos() as f64 - in_http;
            }
        }
        if run > 0 {
            for (which, latencies) in latencies.into_iter().enumerate() {
                overheads[which].push(outside_http[which] / turns as f64);
                turn_p50[which].push(latencies.p50_p99().0);
            }
        }
        // The same request the agent sends, made directly.
        let direct = direct_calls(&timed.inner, turns).await;
        if run > 0 {
            call_p50.push(direct);
        }
    }
    for (kernel, ..) in &kernels {
        kernel.shutdown().await;
    }
    // The store after the stop's checkpoint, per 1,000 of the turns it kept.
    let turns_run = (turns * (sizes.runs + 1)) as f64;
    let growth = |store: &tempfile::TempDir| {
        let db = store.path().join(hivekernel_kernel::store::DB_FILE);
        let bytes = std::fs::metadata(db).map_or(0, |meta| meta.len());
        format!("{:.0} KiB", bytes as f64 / 1024.0 / turns_run * 1000.0)
    };
    let [grown_on, grown_off] = [0, 1].map(|which| growth(&kernels[which].2));
    let floor = median(call_p50);
    let [on, off] = turn_p50.map(median);
    let [overhead_on, overhead_off] = overheads.map(median);
    let label = format!("tool_agent turn, p50 of {} (one model call)", count(turns));
    vec![
        Row::new("turn", label.clone(), Unit::Nanos, on, Some(floor)).note(format!(
            "kernel + loop time outside the HTTP call: {} per turn; transcripts {}; \
             store: {grown_on} per 1,000 turns",
            Unit::Nanos.show(overhead_on),
            against(on, off)
        )),
        Row::new(
            "turn",
            format!("{label}, transcripts off"),
            Unit::Nanos,
            off,
            Some(floor),
        )
        .note(format!(
            "kernel + loop time outside the HTTP call: {} per turn; \
             store: {grown_off} per 1,000 turns",
            Unit::Nanos.show(overhead_off)
        )),
    ]
}

/// What recording costs: `on` against `off`, as a signed percentage.
fn against(on: f64, off: f64) -> String {
    format!("{:+.1}% against off", (on / off - 1.0) * 100.0)
}

/// p50 of `n` direct model calls shaped like an agent's turn.
async fn direct_calls(provider: &OpenAiProvider, n: usize) -> f64 {
    let mut latencies = Latencies::with_capacity(n);
    for i in 0..n {
        let request = ChatRequest::new(
            "bench",
            vec![
                ChatMessage::system("You answer.\n\n## Identity\n- Name: solo\n"),
                ChatMessage::user(format!("question {i}")),
            ],
        );
        let t = Instant::now();
        provider.chat(&request).await.expect("direct call");
        latencies.record(t.elapsed());
    }
    latencies.p50_p99().0
}

/// `orchestrate` with `workers` subtasks: makespan, beside the same model
/// calls (plan, one per worker, synthesis) made directly at the same concurrency.
pub(crate) async fn orchestrate(sizes: &Sizes) -> Vec<Row> {
    let workers = sizes.workers;
    let server = LlmServer::answering(scripted_answer).await;
    let timed = Arc::new(Timed {
        inner: provider(&server),
        nanos: AtomicU64::new(0),
    });
    let n = u32::try_from(workers).expect("worker count");
    let mut kernels = Vec::new();
    for transcripts in [true, false] {
        let (kernel, store) = start(timed.clone(), n + 8, n, transcripts).await;
        let lead = spawn_agent(&kernel, "lead", &["orchestrate"], n).await;
        kernels.push((kernel, lead, store));
    }
    let task: String = (1..=workers).map(|i| format!("- subtask {i}\n")).collect();
    // [on, off]; one makespan is short and noisy, so three times the runs.
    let mut makespans = [Vec::new(), Vec::new()];
    let mut floors = Vec::new();
    for run in 0..=3 * sizes.runs {
        // The first of each pair alternates.
        for k in 0..2 {
            let which = (run + k) % 2;
            let (kernel, lead, _) = &kernels[which];
            let started = Instant::now();
            let (_, reply) = kernel
                .execute_task(Caller::Admin, TaskSpec::new(*lead, task.clone()))
                .await
                .expect("execute_task");
            let answer = reply.expect("orchestrate succeeds");
            let makespan = started.elapsed().as_nanos() as f64;
            assert!(
                answer.starts_with("Done: Summary: "),
                "unexpected answer: {answer}"
            );
            let left = kernel
                .list_processes(Caller::Admin, *lead, None)
                .await
                .expect("list")
                .len();
            assert_eq!(left, 1, "workers left behind");
            if run > 0 {
                makespans[which].push(makespan);
            }
        }
        let floor = direct_fan_out(&timed.inner, workers).await;
        if run > 0 {
            floors.push(floor);
        }
    }
    for (kernel, ..) in &kernels {
        kernel.shutdown().await;
    }
    // The gap is judged pair by pair: the two makespans of a pair ran back
    // to back, so load that comes and goes on a shared machine touches both.
    let gap = median(
        makespans[0]
            .iter()
            .zip(&makespans[1])
            .map(|(on, off)| on / off)
            .collect(),
    );
    let pairs = makespans[0].len();
    let [on, off] = makespans.map(median);
    let floor = median(floors);
    let label = format!("orchestrate {} workers (makespan)", count(workers));
    let per_worker = |ours: f64| {
        format!(
            "kernel overhead per worker: {}",
            Unit::Nanos.show((ours - floor).max(0.0) / workers as f64)
        )
    };
    vec![
        Row::new("orchestrate", label.clone(), Unit::Nanos, on, Some(floor))
            .target(Target::at_most(1e9, Unit::Nanos))
            .note(format!(
                "{}; transcripts {} (median of {pairs} back-to-back pairs)",
                per_worker(on),
                against(gap, 1.0)
            )),
        Row::new(
            "orchestrate",
            format!("{label}, transcripts off"),
            Unit::Nanos,
            off,
            Some(floor),
        )
        .target(Target::at_most(1e9, Unit::Nanos))
        .note(per_worker(off)),
    ]
}

/// The model calls of one orchestration, made directly: the two lead turns,
/// the plan and the synthesis in sequence, the workers' calls at once.
async fn direct_fan_out(provider: &OpenAiProvider, workers: usize) -> f64 {
    let one = |text: String| {
        ChatRequest::new(
            "bench",
            vec![
                ChatMessage::system("You do one subtask.\n\n## Identity\n- Name: w\n"),
                ChatMessage::user(text),
            ],
        )
    };
    let started = Instant::now();
    for step in ["turn", "plan"] {
        provider.chat(&one(step.into())).await.expect("direct call");
    }
    stream::iter(0..workers)
        .map(|i| {
            let request = one(format!("subtask {i}"));
            async move { provider.chat(&request).await.expect("direct call") }
        })
        .buffer_unordered(workers.max(1))
        .collect::<Vec<_>>()
        .await;
    for step in ["synthesis", "turn"] {
        provider.chat(&one(step.into())).await.expect("direct call");
    }
    started.elapsed().as_nanos() as f64
}
