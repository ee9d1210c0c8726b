//! Shared support for HiveKernel's end-to-end tests.
//!
//! # Layout
//! - [`binary`]: a `hivekernel start` of the real binary, its CLI and its log.
//! - [`capture`]: a runtime factory that hands the test a process's real context.
//! - [`exec`]: a served kernel with the `exec` runtime, the Python examples, `/proc` checks.
//! - [`durable`]: in-process kernels on a real SQLite file, and calling tools as their processes.
//! - [`served`]: a kernel's gRPC server on loopback and an admin client.
//! - [`probe`]: the `probe` runtime, a scriptable agent that records what it receives.
//! - [`mcp`]: the MCP servers and client from npm the tests run against, and /proc checks.
//! - [`llm_server`]: a loopback HTTP server speaking the chat-completions protocol, scripted per test.
//! - [`web_server`]: a loopback HTTP server serving fixed pages by path, for `web_fetch`.
//! - this file: kernel settings for tests, an in-process kernel, and `wait_until`.

#![allow(clippy::unwrap_used)]

pub mod binary;
pub mod capture;
pub mod dashboard;
pub mod durable;
pub mod exec;
pub mod link;
pub mod llama;
pub mod llm_server;
pub mod mcp;
pub mod nats;
pub mod otlp;
pub mod probe;
pub mod served;
pub mod web_server;

use std::future::Future;
use std::time::Duration;

use hivekernel_agents::{Capability, Role};
use hivekernel_kernel::config::{KernelSettings, RoleSettings};
use hivekernel_kernel::store::{Recovered, Store, Synchronous};
use hivekernel_kernel::{Kernel, RuntimeRegistry};
pub use probe::Journal;

/// Settings with small limits and short timeouts, suitable for tests; the
/// default runtime is `echo`, so kernel tests need no model. Roles get their
/// least-privilege defaults, except `task`, which has every capability but
/// spawning (use [`granting_all`] for more).
pub fn test_settings() -> KernelSettings {
    let task = RoleSettings {
        capabilities: Some(
            Capability::ALL
                .iter()
                .copied()
                .filter(|c| *c != Capability::SpawnChildren)
                .collect(),
        ),
        ..RoleSettings::default()
    };
    KernelSettings {
        listen: "127.0.0.1:0".parse().unwrap(),
        default_runtime: "echo".into(),
        task_timeout_seconds: 10,
        zombie_timeout_seconds: 30,
        shutdown_grace_ms: 500,
        roles: [(Role::Task, task)].into(),
        ..KernelSettings::default()
    }
}

/// `settings` with every capability granted to each of `roles`, as
/// `"capabilities": "all"` in a config.
pub fn granting_all(mut settings: KernelSettings, roles: &[Role]) -> KernelSettings {
    for role in roles {
        settings.roles.insert(
            *role,
            RoleSettings {
                capabilities: Some(hivekernel_agents::Capabilities::ALL),
                ..RoleSettings::default()
            },
        );
    }
    settings
}

/// The built-in runtimes plus `probe`, whose probes record into the returned journal.
pub fn registry() -> (RuntimeRegistry, Journal) {
    let factory = probe::ProbeFactory::default();
    let journal = factory.journal.clone();
    let mut registry = RuntimeRegistry::builtin();
    registry.register("probe", std::sync::Arc::new(factory));
    (registry, journal)
}

/// Runs `task` on `pid` as the admin; the task's output or its error.
pub async fn run_task(
    kernel: &Kernel,
    pid: hivekernel_agents::Pid,
    task: &str,
) -> Result<String, String> {
    let spec = hivekernel_agents::TaskSpec::new(pid, task);
    let (_, reply) = kernel
        .execute_task(hivekernel_kernel::Caller::Admin, spec)
        .await
        .unwrap();
    reply
}

/// An in-process kernel with [`test_settings`] and [`registry`].
pub async fn kernel() -> (Kernel, Journal) {
    kernel_with(test_settings()).await
}

/// An in-process kernel with the given settings and [`registry`].
pub async fn kernel_with(settings: KernelSettings) -> (Kernel, Journal) {
    let (registry, journal) = registry();
    (
        start(Kernel::builder(settings).runtimes(registry)).await,
        journal,
    )
}

/// Starts a kernel that declares no agents, which cannot be refused.
pub async fn start(builder: hivekernel_kernel::KernelBuilder) -> Kernel {
    match builder.start().await {
        Ok(started) => started.kernel,
        Err(err) => panic!("the kernel did not start: {err}"),
    }
}

/// An in-process kernel whose `tool_agent` processes use `provider`, `agent`
/// and `tools` settings (workspaces under `settings.workspace`), plus `probe`.
pub async fn agent_kernel(
    settings: KernelSettings,
    provider: std::sync::Arc<dyn hivekernel_agents::llm::Provider>,
    agent: hivekernel_agents::tool_agent::AgentSettings,
    tools: &hivekernel_agents::tools::ToolSettings,
) -> (Kernel, Journal) {
    let (registry, journal) = agent_registry(agent, tools);
    (
        start(Kernel::builder(settings).runtimes(registry).llm(provider)).await,
        journal,
    )
}

/// The built-in runtimes with a `tool_agent` of the given settings, plus `probe`.
pub fn agent_registry(
    agent: hivekernel_agents::tool_agent::AgentSettings,
    tools: &hivekernel_agents::tools::ToolSettings,
) -> (RuntimeRegistry, Journal) {
    let factory = hivekernel_agents::tool_agent::ToolAgentFactory::new(
        hivekernel_agents::tools::ToolRegistry::configured(tools),
        agent,
    );
    let mut registry = RuntimeRegistry::with_tool_agent(factory);
    let probes = probe::ProbeFactory::default();
    let journal = probes.journal.clone();
    registry.register("probe", std::sync::Arc::new(probes));
    (registry, journal)
}

/// Opens (or reopens) the store `<dir>/hivekernel.db` off the async threads.
pub async fn open_store(dir: &std::path::Path) -> (Store, Recovered) {
    let path = dir.join(hivekernel_kernel::store::DB_FILE);
    tokio::task::spawn_blocking(move || Store::open(&path, Synchronous::Normal))
        .await
        .unwrap()
        .unwrap_or_else(|err| panic!("open store: {err}"))
}

/// Polls `condition` every 5 ms until it holds; panics naming `what` after `limit`.
pub async fn wait_until<F, Fut>(what: &str, limit: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if condition().await {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A spawn request for a `probe` process named `name` under `parent`.
pub fn probe_request(
    parent: hivekernel_agents::Pid,
    name: &str,
    role: hivekernel_agents::Role,
) -> hivekernel_agents::SpawnRequest {
    let mut request = hivekernel_agents::SpawnRequest::new(parent, name);
    request.role = role;
    request.runtime = Some("probe".into());
    request
}

/// Spawns a `probe` process as the admin; panics on refusal.
pub async fn spawn_probe(
    kernel: &Kernel,
    parent: hivekernel_agents::Pid,
    name: &str,
    role: hivekernel_agents::Role,
) -> hivekernel_agents::Pid {
    kernel
        .spawn(
            hivekernel_kernel::Caller::Admin,
            probe_request(parent, name, role),
        )
        .await
        .unwrap_or_else(|e| panic!("spawn {name} under {parent}: {e}"))
}

/// `shell_exec` settings for tests: the `hivekernel` binary (built once per
/// test process, see [`build_hivekernel`]) as the sandbox helper, with
/// `keep_out` kept out of reach.
pub fn shell_settings(
    keep_out: hivekernel_agents::sandbox::KeepOut,
) -> hivekernel_agents::tools::workspace::ShellSettings {
    static HELPER: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let helper = HELPER.get_or_init(|| {
        build_hivekernel()
            .unwrap_or_else(|(bin, why)| panic!("cannot build {}: {why}", bin.display()))
    });
    hivekernel_agents::tools::workspace::ShellSettings {
        helper: Some(helper.clone()),
        keep_out,
        ..Default::default()
    }
}

/// Builds the `hivekernel` binary beside the running test or bench executable
/// (same target directory and profile) and returns its path; `Err` carries the
/// path and why the build failed. `$HIVEKERNEL_BIN` pins a binary instead.
///
/// It builds what `cargo test --workspace` builds (every target of the
/// workspace), so the binary has the features the test build unified and,
/// after that build, costs nothing; building the binary alone would pick
/// other features and recompile much of the tree, and the next test build
/// would recompile it back. For the same reason it runs cargo without the
/// variables cargo sets for a running test (`CARGO_MANIFEST_DIR`,
/// `CARGO_PKG_*`, ...): build scripts such as ring's rerun when those
/// differ from the outer build's, which rebuilds half the tree twice.
pub fn build_hivekernel() -> Result<std::path::PathBuf, (std::path::PathBuf, String)> {
    use std::path::{Path, PathBuf};
    if let Some(bin) = std::env::var_os("HIVEKERNEL_BIN") {
        return Ok(PathBuf::from(bin));
    }
    // target/<profile>/deps/<exe> -> target/<profile>
    let exe = std::env::current_exe().expect("path of the running executable");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("executable lives in target/<profile>/deps")
        .to_owned();
    let target_dir = profile_dir.parent().expect("target dir");
    let bin = profile_dir.join("hivekernel");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = std::process::Command::new(cargo);
    build
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "--workspace", "--all-targets"])
        .arg("--target-dir")
        .arg(target_dir);
    match profile_dir.file_name().and_then(|name| name.to_str()) {
        Some("release") => {
            build.arg("--release");
        }
        Some("debug") | None => {}
        Some(profile) => {
            build.args(["--profile", profile]);
        }
    }
    for (name, _) in std::env::vars_os().filter(|(name, _)| set_for_tests(name)) {
        build.env_remove(name);
    }
    match build.status() {
        Ok(status) if status.success() && bin.exists() => Ok(bin),
        Ok(status) => Err((bin, format!("cargo build exited with {status}"))),
        Err(err) => Err((bin, format!("cannot run cargo: {err}"))),
    }
}

/// Whether cargo sets `name` for the test or bench it runs (rather than
/// the user setting it for cargo).
fn set_for_tests(name: &std::ffi::OsStr) -> bool {
    let Some(name) = name.to_str() else {
        return false;
    };
    name == "OUT_DIR"
        || name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_BIN_")
        || name.starts_with("CARGO_MANIFEST_")
        || [
            "CARGO_CRATE_NAME",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
            "CARGO_RUSTC_CURRENT_DIR",
        ]
        .contains(&name)
}
