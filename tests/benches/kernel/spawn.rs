//! Spawn latency, and memory per idle agent, each beside bare tokio tasks.
//!
//! Memory is measured in a fresh child process per figure (this binary
//! re-run with `--child`), so memory the allocator kept from earlier steps
//! cannot hide or inflate what spawning costs.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hivekernel_agents::{Pid, SpawnRequest};
use hivekernel_kernel::config::KernelSettings;
use hivekernel_kernel::{Caller, Kernel, RuntimeRegistry};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::report::{Row, Target, Unit};
use crate::stats::{median, nanos_since, rss_bytes, warm_pairs};
use crate::{Sizes, count};

pub(crate) const FLOOR: &str = "tokio::spawn of a task awaiting a bounded mpsc(1024) receiver, \
                                its sender and the name kept";
pub(crate) const MEMORY_FLOOR: &str = "as many of the spawn floor's bare tasks, RSS delta in a \
                                       fresh process";

/// The default mailbox capacity, which the floor's channels share.
pub(crate) const MAILBOX: usize = 1024;
/// Child-process names for the two memory figures.
const MEM_KERNEL: &str = "mem-kernel";
const MEM_FLOOR: &str = "mem-floor";

/// Settings that let PID 1 hold 100,000 children.
pub(crate) fn settings() -> KernelSettings {
    crate::observed(KernelSettings {
        max_children: 100_000,
        ..KernelSettings::default()
    })
}

pub(crate) async fn start_kernel() -> Kernel {
    let kernel = hivekernel_tests::start(crate::traced(
        Kernel::builder(settings()).runtimes(RuntimeRegistry::builtin()),
    ))
    .await;
    crate::watched(&kernel).await;
    kernel
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("agent-{i}")).collect()
}

/// Spawns one agent of the default runtime (`tool_agent`, no tools) under PID 1 per name; returns the time taken.
pub(crate) async fn spawn_agents(kernel: &Kernel, names: Vec<String>) -> f64 {
    let start = Instant::now();
    for name in names {
        kernel
            .spawn(Caller::Admin, SpawnRequest::new(Pid::KERNEL, name))
            .await
            .expect("spawn an agent under PID 1");
    }
    nanos_since(start)
}

/// What the floor keeps per task: its sender and its handle.
type Idle = (mpsc::Sender<String>, JoinHandle<()>);

/// The floor: one bare task per name, each awaiting its own bounded channel.
pub(crate) fn spawn_idle(names: Vec<String>, kept: &mut Vec<Idle>) {
    for name in names {
        let (tx, mut rx) = mpsc::channel::<String>(MAILBOX);
        let task = tokio::spawn(async move {
            let _name = name;
            while rx.recv().await.is_some() {}
        });
        kept.push((tx, task));
    }
}

/// Ends the floor's tasks by dropping their senders.
async fn end_idle(kept: Vec<Idle>) {
    let (senders, tasks): (Vec<_>, Vec<_>) = kept.into_iter().unzip();
    drop(senders);
    for task in tasks {
        task.await.expect("idle task ends when its sender drops");
    }
}

pub(crate) async fn spawn(sizes: &Sizes) -> Vec<Row> {
    let mut rows = Vec::new();
    for &n in sizes.spawn {
        let (ours, floor) = warm_pairs(
            sizes.runs,
            || async move {
                let names = names(n);
                let kernel = start_kernel().await;
                let spawned = spawn_agents(&kernel, names).await;
                let start = Instant::now();
                kernel.shutdown().await;
                (spawned, nanos_since(start))
            },
            || async move {
                let names = names(n);
                let mut kept = Vec::with_capacity(n);
                let start = Instant::now();
                spawn_idle(names, &mut kept);
                let ns = nanos_since(start);
                end_idle(kept).await;
                ns
            },
        )
        .await;
        let shutdown = median(ours.iter().map(|run| run.1).collect());
        let ours = median(ours.into_iter().map(|run| run.0).collect());
        let floor = median(floor);
        let per = n as f64;
        let label = format!("spawn {} agents", count(n));
        rows.push(
            Row::new(
                "spawn",
                format!("{label}: per spawn"),
                Unit::Nanos,
                ours / per,
                Some(floor / per),
            )
            .target(Target::ratio(2.0, "<= 2x floor")),
        );
        rows.push(
            Row::new(
                "spawn",
                format!("{label}: throughput"),
                Unit::PerSec,
                per * 1e9 / ours,
                Some(per * 1e9 / floor),
            )
            .note(format!(
                "then kernel.shutdown() took {}",
                Unit::Nanos.show(shutdown)
            )),
        );
    }
    rows
}

pub(crate) async fn memory(sizes: &Sizes) -> Vec<Row> {
    let n = sizes.idle;
    let ours = footprint(MEM_KERNEL, n).await;
    let floor = footprint(MEM_FLOOR, n).await;
    let per = |f: &Footprint| f.delta() / n as f64;
    let above = per(&ours) - per(&floor);
    vec![
        Row::new(
            "memory",
            format!("memory per idle agent ({})", count(n)),
            Unit::Bytes,
            per(&ours),
            Some(per(&floor)),
        )
        .target(Target::at_most(2_000.0, Unit::Bytes))
        .note(format!("{} above a bare task", Unit::Bytes.show(above))),
        Row::new(
            "memory",
            format!("RSS with {} idle agents", count(n)),
            Unit::Bytes,
            ours.after,
            Some(floor.after),
        )
        .target(Target::at_most(400e6, Unit::Bytes))
        .note("whole process"),
    ]
}

/// Resident memory before and after spawning, in bytes.
#[derive(Debug)]
struct Footprint {
    before: f64,
    after: f64,
}

impl Footprint {
    fn delta(&self) -> f64 {
        self.after - self.before
    }
}

/// Runs `--child what n` and reads the footprint it prints.
async fn footprint(what: &str, n: usize) -> Footprint {
    let exe = std::env::current_exe().expect("path of the bench binary");
    let mut child = Command::new(exe);
    child
        .args(["--child", what, &n.to_string()])
        .args(crate::child_args())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    let output = tokio::task::spawn_blocking(move || child.output())
        .await
        .expect("child runner")
        .expect("run the memory child");
    assert!(output.status.success(), "memory child {what} failed");
    let value: Value =
        serde_json::from_slice(&output.stdout).expect("memory child prints one JSON object");
    let field = |name: &str| {
        value[name]
            .as_f64()
            .unwrap_or_else(|| panic!("memory child output has no {name}: {value}"))
    };
    Footprint {
        before: field("before"),
        after: field("after"),
    }
}

/// The `--child` entry point: one memory measurement in a fresh process.
pub(crate) fn child(what: &str, n: usize) {
    let runtime = crate::runtime();
    // Names exist before the baseline in both cases: they are the caller's, not the cost of an agent.
    let names = names(n);
    let what = what.to_owned();
    let (before, after) = runtime.block_on(crate::on_worker(async move {
        match what.as_str() {
            MEM_KERNEL => {
                let kernel = start_kernel().await;
                settle().await;
                let before = rss_bytes();
                spawn_agents(&kernel, names).await;
                settle().await;
                let after = rss_bytes();
                std::mem::forget(kernel);
                (before, after)
            }
            MEM_FLOOR => {
                let mut kept = Vec::with_capacity(n);
                settle().await;
                let before = rss_bytes();
                spawn_idle(names, &mut kept);
                settle().await;
                let after = rss_bytes();
                std::mem::forget(kept);
                (before, after)
            }
            other => panic!("no memory child named {other:?}"),
        }
    }));
    println!("{}", json!({ "before": before, "after": after }));
    // Tearing down 100k tasks is no part of the measurement.
    std::process::exit(0);
}

/// Lets every new task run to its first await, so each holds what it holds when idle.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(200)).await;
}
