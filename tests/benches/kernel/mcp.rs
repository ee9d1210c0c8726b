//! MCP tools through the kernel, against the protocol's reference
//! `server-everything` over stdio: its `echo` tool called with `mcp_call`
//! as a process whose tool list selects it (the path an agent's tool call
//! takes, less the syscall handle's upgrade of its weak kernel reference),
//! beside the same call made directly with the kernel's MCP client crate
//! (rmcp, same transport and line limit) to a second instance of the
//! server that the bench starts itself; and the server's OS process
//! SIGKILLed under the kernel, timed until a call through the kernel
//! succeeds again, beside the restart's lower bound.
//!
//! The server is declared as a config entry naming only its `command`, so
//! every other field is the config's default (restart: permanent, 5 in
//! 60 s, backoff from 500 ms doubling to 30 s). Without the npm peers
//! (hivekernel_tests::mcp) the group says how to install them and
//! reports nothing.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use hivekernel_agents::{Pid, Role, SpawnRequest};
use hivekernel_kernel::config::{Config, McpServerSpec};
use hivekernel_kernel::mcp::ServerInfo;
use hivekernel_kernel::{Caller, Kernel, RuntimeRegistry};
use hivekernel_tests::mcp::{self as peers, wait_for_state};
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::{RoleClient, ServiceExt as _};
use serde_json::{Map, Value, json};

use crate::report::{Row, Target, Unit};
use crate::stats::{Latencies, median, nanos_since};
use crate::{Sizes, count};

pub(crate) const FLOOR: &str = "round trip: the same echo call made directly with rmcp (the \
                                kernel's MCP client crate, same stdio transport) to a second \
                                server-everything; crash: the first restart backoff plus a \
                                direct cold start (spawn, initialize, first echo)";

/// The server's name in `mcp_servers`.
const SERVER: &str = "everything";
const TOOL: &str = "echo";
/// What `echo` answers to `{"message": "hi"}`.
const ECHOED: &str = "Echo: hi";
/// How long a server may take to be ready, and a killed one to answer again.
const READY: Duration = Duration::from_secs(60);
/// Calls one side of the pair makes before the other takes over, so both
/// see the same machine (a shared 2-core machine drifts within seconds).
const BLOCK: usize = 50;
/// The pause after a call that failed while the server restarts.
const RETRY: Duration = Duration::from_millis(1);

pub(crate) async fn run(sizes: &Sizes) -> Vec<Row> {
    let Some(program) = peers::installed() else {
        eprintln!(
            "bench: mcp skipped: server-everything is not installed; at the repository root run\n  \
             {}\n(or point HIVEKERNEL_MCP_PEERS at a directory holding them)",
            peers::install_command()
        );
        return Vec::new();
    };
    let program = program.display().to_string();
    let spec = configured(&program);
    let mut rows = round_trip(sizes, &program, spec.clone()).await;
    rows.push(crash(sizes, &program, spec).await);
    rows
}

/// `server-everything` over stdio as a config entry that names only its
/// command declares it: every other field the config's default.
fn configured(program: &str) -> McpServerSpec {
    let text = json!({ "mcp_servers": { "everything": { "command": [program, "stdio"] } } });
    let known = RuntimeRegistry::builtin().known();
    let config = Config::from_str_at(&text.to_string(), Path::new("bench.json"), &known)
        .unwrap_or_else(|err| panic!("the bench's mcp_servers entry: {err}"));
    let spec = config
        .mcp
        .into_iter()
        .next()
        .expect("the configured server");
    assert_eq!(spec.name, SERVER);
    spec
}

/// `{"message": "hi"}`.
fn arguments() -> Map<String, Value> {
    let mut arguments = Map::new();
    arguments.insert("message".into(), "hi".into());
    arguments
}

/// An in-process kernel (no store: the server's stderr is dropped, as the
/// floor's is) running `spec`, once the server is ready; and a process of
/// the default runtime whose tool list selects its `echo`.
async fn start(spec: McpServerSpec) -> (Kernel, Pid) {
    let kernel = hivekernel_tests::start(
        Kernel::builder(hivekernel_tests::granting_all(
            hivekernel_tests::test_settings(),
            &[Role::Agent],
        ))
        .runtimes(RuntimeRegistry::builtin())
        .mcp_servers(vec![spec]),
    )
    .await;
    wait_for_state(&kernel, SERVER, "ready", READY).await;
    let mut request = SpawnRequest::new(Pid::KERNEL, "caller");
    request.role = Role::Agent;
    request.tools = vec![format!("mcp:{SERVER}/{TOOL}")];
    let caller = kernel
        .spawn(Caller::Admin, request)
        .await
        .expect("spawn the calling process");
    (kernel, caller)
}

/// One `echo` through the kernel as process `caller`: how long it took.
async fn through_kernel(kernel: &Kernel, caller: Pid, arguments: Map<String, Value>) -> Duration {
    let start = Instant::now();
    let output = kernel
        .mcp()
        .call(Caller::Process(caller), SERVER, TOOL, arguments)
        .await;
    let took = start.elapsed();
    let output = output.expect("echo through the kernel");
    assert_eq!((output.text.as_str(), output.is_error), (ECHOED, false));
    took
}

/// A `server-everything` the bench runs itself, and rmcp's client session to it.
struct Direct {
    child: tokio::process::Child,
    session: RunningService<RoleClient, ()>,
}

impl Direct {
    /// Starts the server and performs the handshake as the kernel does:
    /// the server's stdin and stdout as an rmcp transport, lines up to
    /// `max_line` bytes.
    async fn start(program: &str, max_line: usize) -> Direct {
        let mut child = tokio::process::Command::new(program)
            .arg("stdio")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start server-everything");
        let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
            panic!("server-everything's stdin and stdout");
        };
        let transport = AsyncRwTransport::new_client(stdout, stdin).with_max_line_length(max_line);
        let session = ().serve(transport).await.expect("MCP handshake with server-everything");
        Direct { child, session }
    }

    /// One `echo`: how long it took.
    async fn echo(&self, arguments: Map<String, Value>) -> Duration {
        let mut params = CallToolRequestParams::new(TOOL);
        params.arguments = Some(arguments);
        let start = Instant::now();
        let result = self.session.peer().call_tool(params).await;
        let took = start.elapsed();
        check(&result.expect("echo with rmcp"));
        took
    }

    /// Ends the session, then the server.
    async fn stop(mut self) {
        let _ = self.session.cancel().await;
        let _ = self.child.kill().await;
    }
}

/// Checks a direct `echo`'s answer.
fn check(result: &CallToolResult) {
    let text = result
        .content
        .first()
        .and_then(|block| block.as_text())
        .map(|text| text.text.as_str());
    assert_eq!(text, Some(ECHOED), "{result:?}");
    assert_ne!(result.is_error, Some(true), "{result:?}");
}

/// `echo` through the kernel beside `echo` with rmcp directly: sequential
/// calls, the two sides taking turns in blocks, the first of each pair
/// alternating; p50 and p99 per run, the median of the runs after a warm-up.
async fn round_trip(sizes: &Sizes, program: &str, spec: McpServerSpec) -> Vec<Row> {
    let max_line = spec.max_output_bytes;
    let (kernel, caller) = start(spec).await;
    let direct = Direct::start(program, max_line).await;
    let template = arguments();
    let calls = sizes.mcp_calls;
    // [kernel, direct]: p50s and p99s per run.
    let mut p50 = [Vec::new(), Vec::new()];
    let mut p99 = [Vec::new(), Vec::new()];
    for run in 0..=sizes.runs {
        let mut latencies = [0, 1].map(|_| Latencies::with_capacity(calls));
        for block in 0..calls.div_ceil(BLOCK) {
            let n = BLOCK.min(calls - block * BLOCK);
            for k in 0..2 {
                let which = (block + k) % 2;
                for _ in 0..n {
                    let arguments = template.clone();
                    let took = if which == 0 {
                        through_kernel(&kernel, caller, arguments).await
                    } else {
                        direct.echo(arguments).await
                    };
                    latencies[which].record(took);
                }
            }
        }
        if run > 0 {
            for (which, latencies) in latencies.into_iter().enumerate() {
                let (a, b) = latencies.p50_p99();
                p50[which].push(a);
                p99[which].push(b);
            }
        }
    }
    direct.stop().await;
    kernel.shutdown().await;
    let [ours_p50, floor_p50] = p50.map(median);
    let [ours_p99, floor_p99] = p99.map(median);
    let label = |p: &str| {
        format!(
            "MCP tool call round trip {p} (echo through the kernel, {} sequential calls)",
            count(calls)
        )
    };
    vec![
        Row::new("mcp", label("p50"), Unit::Nanos, ours_p50, Some(floor_p50))
            .target(Target::ratio(1.2, "<= 1.2x floor"))
            .note(format!(
                "the kernel's share: {} per call",
                Unit::Nanos.show((ours_p50 - floor_p50).max(0.0))
            )),
        Row::new("mcp", label("p99"), Unit::Nanos, ours_p99, Some(floor_p99)),
    ]
}

/// A fresh kernel per crash, so each is its server's first and its restart
/// waits the first backoff: the server's OS process SIGKILLed, then `echo`
/// through the kernel retried (a failed call, then a 1 ms pause) until one
/// succeeds; each beside a direct cold start. Medians of `sizes.crashes`.
async fn crash(sizes: &Sizes, program: &str, spec: McpServerSpec) -> Row {
    let backoff = Duration::from_millis(spec.restart.backoff_ms[0]);
    let max_line = spec.max_output_bytes;
    let template = arguments();
    let mut restarts = Vec::with_capacity(sizes.crashes);
    let mut colds = Vec::with_capacity(sizes.crashes);
    let mut failures = Vec::with_capacity(sizes.crashes);
    for _ in 0..sizes.crashes {
        let (kernel, caller) = start(spec.clone()).await;
        through_kernel(&kernel, caller, template.clone()).await;
        let killed = server(&kernel).os_pid.expect("the server's OS process");
        let status = tokio::process::Command::new("kill")
            .args(["-KILL", &killed.to_string()])
            .status()
            .await
            .expect("run kill");
        assert!(status.success(), "kill -KILL {killed}: {status}");
        let start = Instant::now();
        let mut failed = 0u32;
        loop {
            let arguments = template.clone();
            let answer = kernel
                .mcp()
                .call(Caller::Process(caller), SERVER, TOOL, arguments)
                .await;
            if answer.is_ok_and(|output| !output.is_error && output.text == ECHOED) {
                break;
            }
            failed += 1;
            assert!(
                start.elapsed() < READY,
                "no successful call {READY:?} after the server was killed"
            );
            tokio::time::sleep(RETRY).await;
        }
        restarts.push(nanos_since(start));
        failures.push(f64::from(failed));
        let info = server(&kernel);
        assert_eq!(info.restarts, 1, "{info:?}");
        assert!(info.os_pid.is_some_and(|pid| pid != killed), "{info:?}");
        kernel.shutdown().await;
        colds.push(cold_start(program, max_line).await);
    }
    let restart = median(restarts);
    let cold = median(colds);
    let floor = backoff.as_nanos() as f64 + cold;
    Row::new(
        "mcp",
        format!(
            "MCP server crash (SIGKILL) to next successful call, default restart (first backoff {} ms)",
            backoff.as_millis()
        ),
        Unit::Nanos,
        restart,
        Some(floor),
    )
    .note(format!(
        "{} crash{}, one fresh kernel per crash; direct cold start alone {}; {:.0} failed calls before (median)",
        sizes.crashes,
        if sizes.crashes == 1 { "" } else { "es" },
        Unit::Nanos.show(cold),
        median(failures)
    ))
}

/// The kernel's server as `mcp ls` shows it.
fn server(kernel: &Kernel) -> ServerInfo {
    kernel
        .mcp()
        .servers()
        .into_iter()
        .find(|info| info.name == SERVER)
        .expect("the configured server")
}

/// A restart's lower bound without its backoff: a new server process, the
/// handshake and the first `echo` answered, with rmcp directly.
async fn cold_start(program: &str, max_line: usize) -> f64 {
    let start = Instant::now();
    let direct = Direct::start(program, max_line).await;
    direct.echo(arguments()).await;
    let ns = nanos_since(start);
    direct.stop().await;
    ns
}
