//! Whole-tree operations: kill of a 10,000-process tree to quiescence, and
//! listing 100,000 processes in-process and over a gRPC stream.

use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use hivekernel_agents::{Outgoing, Pid, SpawnRequest};
use hivekernel_kernel::{Caller, Kernel};
use hivekernel_proto::v1 as pb;

use crate::report::{Row, Target, Unit};
use crate::serve::Served;
use crate::spawn::{spawn_agents, spawn_idle, start_kernel};
use crate::stats::{nanos_since, paired_medians, warm_median};
use crate::{Sizes, count};

pub(crate) const KILL_FLOOR: &str = "abort, then await, as many bare tokio tasks (each awaiting \
                                     an mpsc receiver)";
pub(crate) const LIST_FLOOR: &str = "iterate a HashMap of as many small structs (a String and 4 \
                                     numbers) and clone them into a Vec";

pub(crate) async fn kill(sizes: &Sizes) -> Vec<Row> {
    let (leads, workers) = sizes.tree;
    let total = 1 + leads + leads * workers;
    let mut rows = Vec::new();
    for busy in [false, true] {
        let (ours, floor) = paired_medians(
            sizes.runs,
            || kill_tree(leads, workers, busy),
            || abort_tasks(total),
        )
        .await;
        let what = if busy {
            "echo processes that each handled a message"
        } else {
            "idle processes"
        };
        rows.push(
            Row::new(
                "kill",
                format!(
                    "kill a {}-process tree ({leads} x {workers}) of {what}",
                    count(total)
                ),
                Unit::Nanos,
                ours,
                Some(floor),
            )
            .target(Target::at_most(30e6, Unit::Nanos))
            .note(if busy {
                "a runner task per process, aborted and awaited"
            } else {
                "never sent anything: no runner task to stop"
            }),
        );
    }
    rows
}

/// Builds root -> `leads` -> `workers` each, then times `kill(root)` until
/// it returns, when none of the tree's runners runs any more. With `busy`,
/// the processes are echo agents that have each handled one message first,
/// so each has its runner task.
async fn kill_tree(leads: usize, workers: usize, busy: bool) -> f64 {
    let kernel = start_kernel().await;
    let spawn = |parent: Pid, name: String, max_children: usize| {
        let mut request = SpawnRequest::new(parent, name);
        request.limits.max_children = Some(max_children as u32);
        if busy {
            request.runtime = Some("echo".into());
        }
        let kernel = kernel.clone();
        async move {
            let pid = kernel
                .spawn(Caller::Admin, request)
                .await
                .expect("spawn a tree process");
            if busy {
                kernel
                    .send_message(Caller::Admin, Outgoing::new(pid, "x"))
                    .await
                    .expect("a message to a tree process");
            }
            pid
        }
    };
    let root = spawn(Pid::KERNEL, "root".into(), leads).await;
    for lead in 0..leads {
        let lead_pid = spawn(root, format!("lead-{lead}"), workers).await;
        for worker in 0..workers {
            spawn(lead_pid, format!("worker-{lead}-{worker}"), workers).await;
        }
    }
    quiet().await;
    let start = Instant::now();
    let killed = kernel
        .kill(Caller::Admin, root, "bench")
        .await
        .expect("kill the tree");
    let ns = nanos_since(start);
    assert_eq!(
        killed.exited.len(),
        1 + leads + leads * workers,
        "whole tree killed"
    );
    kernel.shutdown().await;
    ns
}

/// The floor of [`kill_tree`]: abort `n` idle bare tasks and await them all.
async fn abort_tasks(n: usize) -> f64 {
    let names = (0..n).map(|i| format!("task-{i}")).collect();
    let mut kept = Vec::with_capacity(n);
    spawn_idle(names, &mut kept);
    quiet().await;
    let (senders, tasks): (Vec<_>, Vec<_>) = kept.into_iter().unzip();
    let start = Instant::now();
    for task in &tasks {
        task.abort();
    }
    for task in tasks {
        let _ = task.await;
    }
    let ns = nanos_since(start);
    drop(senders);
    ns
}

/// Lets freshly spawned tasks reach their first await, so the timed step finds them idle.
async fn quiet() {
    tokio::time::sleep(Duration::from_millis(20)).await;
}

pub(crate) async fn list(sizes: &Sizes) -> Vec<Row> {
    let n = sizes.listed;
    // With metrics kept, for the /metrics row; listing never touches them.
    let settings = crate::with_metrics(crate::spawn::settings());
    let kernel = hivekernel_tests::start(
        Kernel::builder(settings).runtimes(hivekernel_kernel::RuntimeRegistry::builtin()),
    )
    .await;
    let names = (0..n).map(|i| format!("agent-{i}")).collect();
    spawn_agents(&kernel, names).await;
    let listed = n + 1;

    let in_process = warm_median(sizes.runs, || list_in_process(&kernel, listed)).await;
    let rendered = warm_median(sizes.runs, || async {
        let start = Instant::now();
        let text = kernel.metrics_text().expect("the kernel keeps metrics");
        let ns = nanos_since(start);
        assert!(text.contains("hivekernel_processes{"), "{text}");
        black_box(text);
        ns
    })
    .await;
    let served = Served::start(kernel).await;
    let client = served.client().await;
    let streamed = warm_median(sizes.runs, || {
        let client = client.clone();
        async move { list_streamed(client, listed).await }
    })
    .await;
    drop(client);
    served.stop().await;

    let table = small_table(listed);
    let floor = warm_median(sizes.runs, || async {
        let start = Instant::now();
        let copy: Vec<(u64, Small)> = table.iter().map(|(k, v)| (*k, v.clone())).collect();
        let ns = nanos_since(start);
        black_box(copy);
        ns
    })
    .await;
    let label = count(listed - 1);
    vec![
        Row::new(
            "list",
            format!("list {label} processes in-process (list_processes)"),
            Unit::Nanos,
            in_process,
            Some(floor),
        ),
        Row::new(
            "list",
            format!("list {label} processes over gRPC (ListProcesses stream)"),
            Unit::Nanos,
            streamed,
            Some(floor),
        )
        .note("batches of 1000"),
        Row::new(
            "list",
            format!("render /metrics with {label} processes"),
            Unit::Nanos,
            rendered,
            Some(floor),
        )
        .target(Target::at_most(10e6, Unit::Nanos))
        .note("census of the table, then the text encoding"),
    ]
}

async fn list_in_process(kernel: &Kernel, expected: usize) -> f64 {
    let start = Instant::now();
    let infos = kernel
        .list_processes(Caller::Admin, Pid::KERNEL, None)
        .await
        .expect("list from PID 1");
    let ns = nanos_since(start);
    assert_eq!(infos.len(), expected, "every process listed");
    ns
}

/// Time until the last batch of a whole-tree `ListProcesses` has arrived.
async fn list_streamed(mut client: crate::serve::KernelRpc, expected: usize) -> f64 {
    let start = Instant::now();
    let mut stream = client
        .list_processes(pb::ListProcessesRequest::default())
        .await
        .expect("ListProcesses")
        .into_inner();
    let mut received = 0;
    while let Some(batch) = stream.message().await.expect("a batch") {
        received += batch.processes.len();
    }
    let ns = nanos_since(start);
    assert_eq!(received, expected, "every process streamed");
    ns
}

/// The floor's stand-in for a process table entry.
#[derive(Debug, Clone)]
#[expect(dead_code, reason = "only cloned, as the kernel clones its entries")]
struct Small {
    name: String,
    ppid: u64,
    depth: u32,
    children: u32,
    started_at_unix_ms: u64,
}

fn small_table(n: usize) -> HashMap<u64, Small> {
    (0..n as u64)
        .map(|pid| {
            let small = Small {
                name: format!("agent-{pid}"),
                ppid: 1,
                depth: 1,
                children: 0,
                started_at_unix_ms: pid,
            };
            (pid, small)
        })
        .collect()
}
