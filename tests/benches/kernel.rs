//! The kernel against its physical floor.
//!
//! `cargo bench -p hivekernel-tests --bench kernel [-- --json] [-- --smoke]
//! [-- --only spawn,route] [-- --metrics] [-- --traces] [-- --dashboard]`.
//! `--metrics` runs every kernel with `kernel.metrics` set, `--traces` with
//! traces exported to an OTLP receiver on loopback, `--dashboard` with the
//! dashboard served and one page watching its events (spawn and send
//! rows), to compare against a run without. Every figure is printed beside a floor measured
//! in the same run on the same runtime (raw tokio tasks and channels, an
//! empty tonic RPC, `/bin/true`), as a cost ratio, because absolute times
//! drift on shared 2-core machines. docs/PERFORMANCE.md explains each row.
//! Without the `--bench` that `cargo bench` passes (`cargo test
//! --all-targets`), it runs at smoke sizes, as criterion does.
//!
//! # Layout
//! - `report`: rows, targets, the table and the JSON document.
//! - `stats`: medians, percentiles, warm-up, RSS.
//! - `spawn`: spawn latency, and memory per idle agent (in fresh child processes).
//! - `route`: routed message throughput and the `execute_task` round trip.
//! - `grpc`: the closed-loop tonic load generator.
//! - `serve`: the kernel served over loopback, the floor's bare tonic server, clients.
//! - `tree`: kill of a 10,000-process tree, listing 100,000 processes.
//! - `cold`: exec of the `hivekernel` binary until its first RPC answers.
//! - `cluster`: 3 nodes on a 3-server NATS cluster: tasks, sends and spawns
//!   across nodes, and a node's death to its config agent answering again.
//! - `agent`: a `tool_agent` turn and `orchestrate` against a loopback model server.
//! - `durable`: acknowledged sends on a kernel with a store, beside hand-written SQLite.
//! - `mcp`: an MCP tool call through the kernel beside rmcp directly, and a server's restart.

/// The allocator the `hivekernel` binary runs with, so in-process figures
/// measure the kernel as it ships.
#[global_allocator]
static ALLOCATOR: hivekernel_kernel::Allocator = hivekernel_kernel::Allocator;

// A bench crate's root is this file, so its modules would resolve beside it
// in benches/, where Cargo would take each for a bench of its own.
#[path = "kernel/agent.rs"]
mod agent;
#[path = "kernel/cluster.rs"]
mod cluster;
#[path = "kernel/cold.rs"]
mod cold;
#[path = "kernel/durable.rs"]
mod durable;
#[path = "kernel/grpc.rs"]
mod grpc;
#[path = "kernel/mcp.rs"]
mod mcp;
#[path = "kernel/report.rs"]
mod report;
#[path = "kernel/route.rs"]
mod route;
#[path = "kernel/serve.rs"]
mod serve;
#[path = "kernel/spawn.rs"]
mod spawn;
#[path = "kernel/stats.rs"]
mod stats;
#[path = "kernel/tree.rs"]
mod tree;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hivekernel_kernel::config::{KernelSettings, MetricsSettings};
use report::{Machine, Report, Row};

const USAGE: &str = "usage: cargo bench -p hivekernel-tests --bench kernel -- \
                     [--json] [--smoke] [--only NAME[,NAME]] [--metrics] [--traces] [--dashboard]\n\
                     names: spawn, memory, route, grpc, kill, list, cold, turn, orchestrate, durable, mcp, cluster";

/// The `--only` names, in the order they run and print.
const GROUPS: [&str; 12] = [
    "spawn",
    "memory",
    "route",
    "grpc",
    "kill",
    "list",
    "cold",
    "turn",
    "orchestrate",
    "durable",
    "mcp",
    "cluster",
];

/// How much work each measurement does: the full run, or a smoke run for CI.
#[derive(Debug)]
pub(crate) struct Sizes {
    /// Measured runs (after one warm-up) whose median is reported.
    pub(crate) runs: usize,
    /// Agents spawned per spawn measurement.
    pub(crate) spawn: &'static [usize],
    /// Idle agents for the memory measurement.
    pub(crate) idle: usize,
    /// Messages each of the 4 senders sends.
    pub(crate) messages: usize,
    /// Round trips per ask run.
    pub(crate) asks: usize,
    /// How long each gRPC load runs.
    pub(crate) rpc_window: Duration,
    /// Leads under the killed root, and workers under each lead.
    pub(crate) tree: (usize, usize),
    /// Processes listed.
    pub(crate) listed: usize,
    /// Cold starts whose median is reported.
    pub(crate) cold_runs: usize,
    /// Workers of the orchestrate measurement.
    pub(crate) workers: usize,
    /// Sequential MCP tool calls per run, on each side.
    pub(crate) mcp_calls: usize,
    /// MCP server crashes whose median is reported.
    pub(crate) crashes: usize,
}

const FULL: Sizes = Sizes {
    runs: 3,
    spawn: &[10_000, 100_000],
    idle: 100_000,
    messages: 250_000,
    asks: 20_000,
    rpc_window: Duration::from_secs(2),
    tree: (100, 99),
    listed: 100_000,
    cold_runs: 5,
    workers: 1_000,
    mcp_calls: 2_000,
    crashes: 5,
};

const SMOKE: Sizes = Sizes {
    runs: 1,
    spawn: &[1_000],
    idle: 2_000,
    messages: 5_000,
    asks: 500,
    rpc_window: Duration::from_millis(300),
    tree: (10, 9),
    listed: 2_000,
    cold_runs: 1,
    workers: 20,
    mcp_calls: 20,
    crashes: 1,
};

/// `--metrics`: every kernel keeps metrics (`kernel.metrics`).
static METRICS: AtomicBool = AtomicBool::new(false);

/// `--dashboard`: every kernel the spawn and send rows start serves the
/// dashboard, and one page watches its event stream (a client on loopback
/// reading `SubscribeEvents` as server-sent events).
static DASHBOARD: AtomicBool = AtomicBool::new(false);

/// Serves the dashboard of `kernel` and watches it as a page does, when
/// the run was asked to (`--dashboard`); both end with the kernel.
pub(crate) async fn watched(kernel: &hivekernel_kernel::Kernel) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    if !DASHBOARD.load(Ordering::Relaxed) {
        return;
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a dashboard listener");
    let addr = listener.local_addr().expect("its address");
    let options = hivekernel_kernel::dashboard::Options {
        kernel: kernel.clone(),
        auth: hivekernel_kernel::auth::Authenticator::new("bench-admin".to_owned()),
        reload: None,
        addr,
        tls: None,
    };
    let stopped = kernel.shutdown_token();
    tokio::spawn(hivekernel_kernel::dashboard::serve(
        options,
        listener,
        async move {
            stopped.cancelled().await;
        },
    ));
    let request = |head: String| async move {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream.write_all(head.as_bytes()).await.expect("send");
        stream
    };
    let body = r#"{"token": "bench-admin"}"#;
    let mut login = request(format!(
        "POST /api/login HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    ))
    .await;
    let mut answer = String::new();
    login.read_to_string(&mut answer).await.expect("the login");
    let cookie = answer
        .lines()
        .find_map(|line| line.strip_prefix("set-cookie: "))
        .and_then(|cookie| cookie.split(';').next())
        .unwrap_or_else(|| panic!("no session cookie in {answer:?}"))
        .to_owned();
    let watch = request(format!(
        "GET /api/watch/SubscribeEvents?q=%7B%7D HTTP/1.0\r\nHost: {addr}\r\nCookie: {cookie}\r\n\r\n"
    ))
    .await;
    tokio::spawn(async move {
        use tokio::io::AsyncBufReadExt as _;
        // Read as a page does: every event of every batch parsed.
        let mut lines = tokio::io::BufReader::new(watch).lines();
        let (mut read, mut seen, mut lost) = (0, 0, 0);
        while let Ok(Some(line)) = lines.next_line().await {
            read += line.len() + 1;
            let Some(data) = line.strip_prefix("data: ") else {
                continue;
            };
            let Ok(serde_json::Value::Array(events)) = serde_json::from_str(data) else {
                continue;
            };
            for event in events {
                seen += 1;
                if event["type"] == "lagged" {
                    let detail: serde_json::Value =
                        serde_json::from_str(event["detail"].as_str().unwrap_or("{}"))
                            .unwrap_or_default();
                    lost += detail["missed"].as_u64().unwrap_or(0);
                }
            }
        }
        eprintln!("bench: the dashboard page read {read} bytes: {seen} events, {lost} lost");
    });
}

/// `--traces`: every kernel exports traces, to an OTLP receiver of this
/// bench's own on loopback (its own thread, counting what it is sent).
static TRACES: AtomicBool = AtomicBool::new(false);

/// `builder`, exporting traces when the run was asked to (`--traces`).
pub(crate) fn traced(
    builder: hivekernel_kernel::KernelBuilder,
) -> hivekernel_kernel::KernelBuilder {
    if !TRACES.load(Ordering::Relaxed) {
        return builder;
    }
    static RECEIVER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let endpoint = RECEIVER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the OTLP receiver");
            runtime.block_on(async {
                let receiver = hivekernel_tests::otlp::OtlpReceiver::http_counting().await;
                let _ = tx.send(receiver.endpoint());
                std::future::pending::<()>().await;
            });
        });
        rx.recv().expect("the OTLP receiver's address")
    });
    let otel = hivekernel_kernel::config::OtelSettings {
        endpoint: Some(endpoint.clone()),
        protocol: hivekernel_kernel::config::OtelProtocol::HttpProtobuf,
        capture_content: false,
    };
    let traces = hivekernel_kernel::otel::Traces::start(&otel).expect("the trace exporter");
    builder.traces(std::sync::Arc::new(traces))
}

/// `settings`, keeping metrics when the run was asked to (`--metrics`).
pub(crate) fn observed(settings: KernelSettings) -> KernelSettings {
    if !METRICS.load(Ordering::Relaxed) {
        return settings;
    }
    with_metrics(settings)
}

/// `settings` with metrics kept (an in-process kernel serves no listener).
pub(crate) fn with_metrics(settings: KernelSettings) -> KernelSettings {
    KernelSettings {
        metrics: Some(MetricsSettings {
            listen: "127.0.0.1:0".parse().expect("address"),
        }),
        ..settings
    }
}

/// Extra arguments a `--child` run needs to measure what this run does.
pub(crate) fn child_args() -> &'static [&'static str] {
    match (
        METRICS.load(Ordering::Relaxed),
        TRACES.load(Ordering::Relaxed),
    ) {
        (true, true) => &["--metrics", "--traces"],
        (true, false) => &["--metrics"],
        (false, true) => &["--traces"],
        (false, false) => &[],
    }
}

/// The command line, after `--`.
#[derive(Debug, Default)]
struct Args {
    json: bool,
    smoke: bool,
    /// `cargo bench` passes `--bench`; `cargo test --all-targets` passes nothing.
    bench: bool,
    only: Option<Vec<&'static str>>,
    /// Hidden: run one memory measurement in this (fresh) process.
    child: Option<(String, usize)>,
}

impl Args {
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
        let mut parsed = Args::default();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--json" => parsed.json = true,
                "--smoke" => parsed.smoke = true,
                "--bench" => parsed.bench = true,
                "--metrics" => METRICS.store(true, Ordering::Relaxed),
                "--traces" => TRACES.store(true, Ordering::Relaxed),
                "--dashboard" => DASHBOARD.store(true, Ordering::Relaxed),
                "--only" => {
                    let list = args.next().ok_or("--only needs a list of names")?;
                    let mut only = Vec::new();
                    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                        let group = GROUPS
                            .iter()
                            .find(|g| **g == name)
                            .ok_or_else(|| format!("unknown name {name:?} in --only"))?;
                        only.push(*group);
                    }
                    parsed.only = Some(only);
                }
                "--child" => {
                    let what = args.next().ok_or("--child needs a name")?;
                    let n = args
                        .next()
                        .and_then(|n| n.parse().ok())
                        .ok_or("--child needs a count")?;
                    parsed.child = Some((what, n));
                }
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(parsed)
    }

    fn selected(&self, group: &str) -> bool {
        self.only.as_ref().is_none_or(|only| only.contains(&group))
    }
}

/// The runtime every measurement runs on: multi-thread, 2 workers (one per core here).
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("build the tokio runtime")
}

fn main() {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(err) => {
            eprintln!("error: {err}\n{USAGE}");
            std::process::exit(2);
        }
    };
    if let Some((what, n)) = &args.child {
        spawn::child(what, *n);
        return;
    }
    // Like criterion, a run without `--bench` (`cargo test --all-targets`)
    // only checks that every measurement still works.
    let smoke = args.smoke || !args.bench;
    if !args.bench {
        eprintln!("bench: not run by `cargo bench` (no --bench): smoke sizes");
    }
    let sizes = if smoke { &SMOKE } else { &FULL };
    let mut report = Report {
        mode: if smoke { "smoke" } else { "full" },
        machine: Machine::detect(),
        rows: Vec::new(),
        floors: Vec::new(),
    };
    for group in GROUPS.into_iter().filter(|g| args.selected(g)) {
        eprintln!("bench: {group} ...");
        let started = Instant::now();
        // A fresh runtime per group: nothing one leaves behind slows the next.
        let runtime = runtime();
        let (rows, floor) = runtime.block_on(on_worker(run_group(group, sizes)));
        runtime.shutdown_timeout(Duration::from_secs(5));
        eprintln!(
            "bench: {group} done in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        report.rows.extend(rows);
        if let Some(floor) = floor {
            report.floors.push((group, floor));
        }
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report.json()).expect("serialize the report")
        );
    } else {
        print!("{}", report.table());
    }
}

/// Runs `work` on a runtime worker, as gRPC handlers and agents run: wakes
/// from there go to the worker's own queue, not through the injection queue
/// that `block_on`'s thread must use.
pub(crate) async fn on_worker<T: Send + 'static>(
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    tokio::spawn(work).await.expect("bench task panicked")
}

/// Runs one group's measurements: its rows, and what its floor is.
async fn run_group(group: &str, sizes: &'static Sizes) -> (Vec<Row>, Option<&'static str>) {
    match group {
        "spawn" => (spawn::spawn(sizes).await, Some(spawn::FLOOR)),
        "memory" => (spawn::memory(sizes).await, Some(spawn::MEMORY_FLOOR)),
        "route" => (route::run(sizes).await, Some(route::FLOOR)),
        "grpc" => (grpc::run(sizes).await, Some(grpc::FLOOR)),
        "kill" => (tree::kill(sizes).await, Some(tree::KILL_FLOOR)),
        "list" => (tree::list(sizes).await, Some(tree::LIST_FLOOR)),
        "cold" => (cold::run(sizes).await, Some(cold::FLOOR)),
        // No rows (no nats-server): no floor to explain either.
        "cluster" => {
            let rows = cluster::run(sizes).await;
            let floor = (!rows.is_empty()).then_some(cluster::FLOOR);
            (rows, floor)
        }
        "turn" => (agent::turn(sizes).await, Some(agent::FLOOR)),
        "orchestrate" => (agent::orchestrate(sizes).await, Some(agent::FLOOR)),
        "durable" => (durable::run(sizes).await, Some(durable::FLOOR)),
        // No rows (the npm peers are missing): no floor to explain either.
        "mcp" => {
            let rows = mcp::run(sizes).await;
            let floor = (!rows.is_empty()).then_some(mcp::FLOOR);
            (rows, floor)
        }
        other => unreachable!("no group {other}"),
    }
}

/// `n` for labels: 10k, 2k, 500.
pub(crate) fn count(n: usize) -> String {
    if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}
