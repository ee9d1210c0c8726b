//! gRPC over loopback: a closed-loop tonic load generator against the
//! kernel's server, beside an empty unary RPC served the same way.
//!
//! Each client task sends its next call as soon as the last one answers.
//! Tasks share HTTP/2 channels, one per 16 tasks. Client and server share
//! the bench's 2-worker runtime, for the kernel and the floor alike.

use std::time::{Duration, Instant};

use hivekernel_agents::{Pid, SpawnRequest};
use hivekernel_kernel::{Caller, Kernel};
use hivekernel_proto::v1 as pb;
use hivekernel_proto::v1::kernel_client::KernelClient;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::report::{Row, Target, Unit};
use crate::serve::{Bearer, Empty, KernelRpc, Served, TOKEN, connect};
use crate::spawn::start_kernel;
use crate::stats::Latencies;

pub(crate) const FLOOR: &str = "empty unary RPC: grpc.health.v1.Health/Check (tonic-health) on \
                                its own tonic server without auth, same channels and client tasks";

/// Client tasks per load.
const CONCURRENCY: [usize; 3] = [1, 16, 64];
/// Client tasks per HTTP/2 channel.
const TASKS_PER_CHANNEL: usize = 16;

/// The calls the load generator makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rpc {
    Empty,
    GetProcess,
    SendMessage,
    Spawn,
}

impl Rpc {
    const MEASURED: [Rpc; 3] = [Rpc::GetProcess, Rpc::SendMessage, Rpc::Spawn];

    fn name(self) -> &'static str {
        match self {
            Rpc::Empty => "Health/Check",
            Rpc::GetProcess => "GetProcess",
            Rpc::SendMessage => "SendMessage",
            Rpc::Spawn => "Spawn",
        }
    }
}

#[derive(Debug, Clone)]
enum Client {
    Health(HealthClient<Channel>),
    Kernel(KernelRpc),
}

/// What the kernel-side calls act on.
#[derive(Debug, Clone, Copy)]
struct Pids {
    /// The echo agent that GetProcess reads and SendMessage writes to.
    echo: u64,
    /// The parent of every Spawn, with room for 100,000 children.
    parent: u64,
}

/// One call; `task` and `seq` make spawn names unique.
async fn call(
    client: &mut Client,
    rpc: Rpc,
    pids: Pids,
    task: usize,
    seq: u64,
) -> Result<(), Status> {
    match (client, rpc) {
        (Client::Health(health), Rpc::Empty) => health
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .map(drop),
        (Client::Kernel(kernel), Rpc::GetProcess) => kernel
            .get_process(pb::GetProcessRequest { pid: pids.echo })
            .await
            .map(drop),
        (Client::Kernel(kernel), Rpc::SendMessage) => kernel
            .send_message(pb::SendMessageRequest {
                to: pids.echo,
                payload: "x".into(),
                ..Default::default()
            })
            .await
            .map(drop),
        (Client::Kernel(kernel), Rpc::Spawn) => kernel
            .spawn(pb::SpawnRequest {
                parent: pids.parent,
                name: format!("w{task}-{seq}"),
                ..Default::default()
            })
            .await
            .map(drop),
        (_, rpc) => unreachable!("{rpc:?} on the wrong client"),
    }
}

/// What one load window measured.
#[derive(Debug, Default)]
struct Load {
    ok: u64,
    exhausted: u64,
    failed: u64,
    first_error: Option<Status>,
    elapsed: Duration,
    latencies: Latencies,
}

impl Load {
    fn rps(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64()
    }

    fn merge(&mut self, other: Load) {
        self.ok += other.ok;
        self.exhausted += other.exhausted;
        self.failed += other.failed;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.latencies.extend(other.latencies);
    }
}

/// `concurrency` client tasks calling `rpc` in a closed loop for `window`.
async fn drive(
    clients: &[Client],
    rpc: Rpc,
    pids: Pids,
    concurrency: usize,
    window: Duration,
) -> Load {
    let start = Instant::now();
    let deadline = start + window;
    let tasks: Vec<_> = (0..concurrency)
        .map(|task| {
            let mut client = clients[task % clients.len()].clone();
            tokio::spawn(async move {
                let mut load = Load::default();
                let mut seq = 0;
                while Instant::now() < deadline {
                    let sent = Instant::now();
                    let result = call(&mut client, rpc, pids, task, seq).await;
                    seq += 1;
                    match result {
                        Ok(()) => {
                            load.ok += 1;
                            load.latencies.record(sent.elapsed());
                        }
                        Err(status) if status.code() == Code::ResourceExhausted => {
                            load.exhausted += 1
                        }
                        Err(status) => {
                            load.failed += 1;
                            load.first_error.get_or_insert(status);
                        }
                    }
                }
                load
            })
        })
        .collect();
    let mut total = Load::default();
    for task in tasks {
        total.merge(task.await.expect("client task"));
    }
    total.elapsed = start.elapsed();
    total
}

/// What a window comes to: calls/s and latency percentiles of the calls that succeeded.
#[derive(Debug)]
struct Summary {
    rps: f64,
    p50: f64,
    p99: f64,
    exhausted: u64,
    failed: u64,
}

/// A warm-up of a tenth of the window, then the measured window.
async fn measure(
    clients: &[Client],
    rpc: Rpc,
    pids: Pids,
    concurrency: usize,
    window: Duration,
) -> Summary {
    drive(clients, rpc, pids, concurrency, window / 10).await;
    let load = drive(clients, rpc, pids, concurrency, window).await;
    if let Some(status) = &load.first_error {
        eprintln!(
            "bench: {} at concurrency {concurrency}: {} calls failed, first: {status}",
            rpc.name(),
            load.failed
        );
    }
    assert!(load.ok > 0, "no {} call succeeded", rpc.name());
    let rps = load.rps();
    let (p50, p99) = load.latencies.p50_p99();
    Summary {
        rps,
        p50,
        p99,
        exhausted: load.exhausted,
        failed: load.failed,
    }
}

/// Channels for `concurrency` tasks, one per [`TASKS_PER_CHANNEL`].
async fn channels(addr: &str, concurrency: usize) -> Vec<Channel> {
    let mut channels = Vec::new();
    for _ in 0..concurrency.div_ceil(TASKS_PER_CHANNEL) {
        channels.push(connect(addr).await);
    }
    channels
}

pub(crate) async fn run(sizes: &crate::Sizes) -> Vec<Row> {
    let window = sizes.rpc_window;
    let empty = Empty::start().await;
    // Rows by RPC, then by concurrency.
    let mut rows: Vec<(usize, usize, Vec<Row>)> = Vec::new();
    for (level, &concurrency) in CONCURRENCY.iter().enumerate() {
        let health: Vec<Client> = channels(&empty.addr, concurrency)
            .await
            .into_iter()
            .map(|channel| Client::Health(HealthClient::new(channel)))
            .collect();
        // A fresh kernel per level: Spawn leaves its children behind.
        let kernel = start_kernel().await;
        let pids = kernel_pids(&kernel).await;
        let served = Served::start(kernel).await;
        let clients: Vec<Client> = channels(&served.addr, concurrency)
            .await
            .into_iter()
            .map(|channel| {
                Client::Kernel(KernelClient::with_interceptor(channel, Bearer::new(TOKEN)))
            })
            .collect();
        for (index, rpc) in Rpc::MEASURED.into_iter().enumerate() {
            // The floor's window right before each RPC's, so drift weighs on both alike.
            let floor = measure(&health, Rpc::Empty, pids, concurrency, window).await;
            let ours = measure(&clients, rpc, pids, concurrency, window).await;
            rows.push((index, level, load_rows(rpc, concurrency, ours, &floor)));
        }
        drop((health, clients));
        served.stop().await;
    }
    empty.stop().await;
    rows.sort_by_key(|(rpc, level, _)| (*rpc, *level));
    rows.into_iter().flat_map(|(_, _, rows)| rows).collect()
}

/// The echo agent and the spawn parent of a fresh kernel.
async fn kernel_pids(kernel: &Kernel) -> Pids {
    let mut echo = SpawnRequest::new(Pid::KERNEL, "echo");
    echo.runtime = Some("echo".into());
    let echo = kernel
        .spawn(Caller::Admin, echo)
        .await
        .expect("spawn the echo agent");
    let mut parent = SpawnRequest::new(Pid::KERNEL, "spawner");
    parent.limits.max_children = Some(100_000);
    let parent = kernel
        .spawn(Caller::Admin, parent)
        .await
        .expect("spawn the spawn parent");
    Pids {
        echo: echo.0,
        parent: parent.0,
    }
}

/// Calls/s, p50 and p99 of one RPC at one concurrency, beside the empty RPC's.
fn load_rows(rpc: Rpc, concurrency: usize, ours: Summary, floor: &Summary) -> Vec<Row> {
    let label = format!("{} c={concurrency}", rpc.name());
    let mut notes = Vec::new();
    if ours.exhausted > 0 {
        notes.push(format!("{} RESOURCE_EXHAUSTED", ours.exhausted));
    }
    if ours.failed > 0 {
        notes.push(format!("{} failed", ours.failed));
    }
    let mut throughput = Row::new(
        "grpc",
        format!("{label}: calls/s"),
        Unit::PerSec,
        ours.rps,
        Some(floor.rps),
    )
    .note(notes.join(", "));
    if rpc == Rpc::GetProcess && concurrency == 64 {
        throughput = throughput.target(Target::ratio(1.25, ">= 0.8x empty RPC"));
    }
    vec![
        throughput,
        Row::new(
            "grpc",
            format!("{label}: p50"),
            Unit::Nanos,
            ours.p50,
            Some(floor.p50),
        ),
        Row::new(
            "grpc",
            format!("{label}: p99"),
            Unit::Nanos,
            ours.p99,
            Some(floor.p99),
        ),
    ]
}
