//! Acknowledged sends on a durable kernel (each answered only after its
//! commit, removed from the store again on delivery), beside SQLite doing
//! the same inserts and deletes in transactions of the same size by hand;
//! and a restart that brings a tree of processes back from the store.

use std::time::Instant;

use hivekernel_agents::{Outgoing, Pid, SpawnRequest};
use hivekernel_kernel::config::KernelSettings;
use hivekernel_kernel::{Caller, Kernel, KernelError, RuntimeRegistry};

use crate::report::{Row, Target, Unit};
use crate::stats::{Latencies, median, nanos_since};
use crate::{Sizes, count};

pub(crate) const FLOOR: &str = "one rusqlite connection (WAL, synchronous NORMAL, same file \
                                system) inserting and then deleting the same rows, 64 per \
                                transaction";

/// Concurrent senders: how many sends a group commit can gather.
const SENDERS: usize = 64;
/// Echo agents receiving them.
const SINKS: usize = 4;

pub(crate) async fn run(sizes: &Sizes) -> Vec<Row> {
    let per = (sizes.messages / 50).max(SENDERS) / SENDERS;
    let total = per * SENDERS;
    let mut ours = Vec::new();
    let mut latencies = Latencies::with_capacity(total * sizes.runs);
    let mut floors = Vec::new();
    for run in 0..=sizes.runs {
        let (ns, lat) = durable_send(per).await;
        let floor = tokio::task::spawn_blocking(move || sqlite_floor(total))
            .await
            .expect("sqlite floor");
        // The first pair warms up.
        if run > 0 {
            ours.push(ns);
            latencies.extend(lat);
            floors.push(floor);
        }
    }
    let (ours, floor) = (median(ours), median(floors));
    let (p50, p99) = latencies.p50_p99();
    let (leads, workers) = sizes.tree;
    let kept = leads * (workers + 1);
    let restore = restore(sizes.tree, sizes.runs).await;
    vec![
        Row::new(
            "durable",
            format!(
                "restore of {} processes: store opened, every process back (start returns)",
                count(kept)
            ),
            Unit::Nanos,
            restore,
            None,
        )
        .target(Target::at_most(500e6, Unit::Nanos))
        .note(format!(
            "{leads} leads of {workers} workers each, echo runtime, after a clean stop"
        )),
        Row::new(
            "durable",
            format!(
                "send_message acknowledged after commit, {SENDERS} senders -> {SINKS} echo agents ({} msgs)",
                count(total)
            ),
            Unit::PerSec,
            total as f64 * 1e9 / ours,
            Some(total as f64 * 1e9 / floor),
        ),
        Row::new(
            "durable",
            format!("send_message ack latency p50 ({SENDERS} senders)"),
            Unit::Nanos,
            p50,
            None,
        ),
        Row::new(
            "durable",
            format!("send_message ack latency p99 ({SENDERS} senders)"),
            Unit::Nanos,
            p99,
            None,
        ),
    ]
}

/// `per` acknowledged sends from each of [`SENDERS`] tasks, until every
/// message is delivered; the time taken and each send's latency.
async fn durable_send(per: usize) -> (f64, Latencies) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, recovered) = hivekernel_tests::open_store(dir.path()).await;
    let settings = crate::observed(KernelSettings {
        mailbox_capacity: 1 << 16,
        default_runtime: "echo".into(),
        ..KernelSettings::default()
    });
    let kernel = hivekernel_tests::start(crate::traced(
        Kernel::builder(settings)
            .runtimes(RuntimeRegistry::builtin())
            .store(store.clone(), recovered),
    ))
    .await;
    let mut sinks = Vec::new();
    for i in 0..SINKS {
        let request = SpawnRequest::new(Pid::KERNEL, format!("sink-{i}"));
        sinks.push(kernel.spawn(Caller::Admin, request).await.expect("spawn"));
    }
    let start = Instant::now();
    let senders: Vec<_> = (0..SENDERS)
        .map(|i| {
            let (kernel, to) = (kernel.clone(), sinks[i % SINKS]);
            tokio::spawn(async move {
                let mut latencies = Latencies::with_capacity(per);
                for _ in 0..per {
                    let sent = Instant::now();
                    match kernel
                        .send_message(Caller::Admin, Outgoing::new(to, "x"))
                        .await
                    {
                        Ok(_) => latencies.record(sent.elapsed()),
                        Err(KernelError::MailboxFull { .. }) => tokio::task::yield_now().await,
                        Err(err) => panic!("send_message: {err}"),
                    }
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Latencies::default();
    for sender in senders {
        latencies.extend(sender.await.expect("sender"));
    }
    // Delivered: every removal committed.
    store.flush().await.expect("flush");
    loop {
        let busy = kernel
            .infos(&sinks)
            .await
            .iter()
            .any(|p| p.mailbox_len > 0 || p.state != hivekernel_agents::ProcessState::Idle);
        if !busy {
            break;
        }
        tokio::task::yield_now().await;
    }
    store.flush().await.expect("flush");
    let ns = nanos_since(start);
    kernel.shutdown().await;
    (ns, latencies)
}

/// Settings for a kernel holding the restore measurement's tree.
fn tree_settings() -> KernelSettings {
    KernelSettings {
        max_children: 100_000,
        default_runtime: "echo".into(),
        ..KernelSettings::default()
    }
}

/// A kernel on a store in a fresh directory, stopped cleanly with `leads`
/// leads of `workers` workers each alive; then the median time, over
/// `runs` runs after a warm-up, from opening that store to a started
/// kernel with every process back.
async fn restore((leads, workers): (usize, usize), runs: usize) -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, recovered) = hivekernel_tests::open_store(dir.path()).await;
    let kernel = hivekernel_tests::start(
        Kernel::builder(tree_settings())
            .runtimes(RuntimeRegistry::builtin())
            .store(store, recovered),
    )
    .await;
    for lead in 0..leads {
        let mut request = SpawnRequest::new(Pid::KERNEL, format!("lead-{lead}"));
        request.limits.max_children = Some(workers as u32);
        let parent = kernel
            .spawn(Caller::Admin, request)
            .await
            .expect("spawn a lead");
        let spawns = (0..workers).map(|worker| {
            let request = SpawnRequest::new(parent, format!("worker-{lead}-{worker}"));
            kernel.spawn(Caller::Admin, request)
        });
        for spawned in futures::future::join_all(spawns).await {
            spawned.expect("spawn a worker");
        }
    }
    kernel.shutdown().await;
    let expected = leads * (workers + 1);
    let mut times = Vec::new();
    for run in 0..=runs {
        let start = Instant::now();
        let (store, recovered) = hivekernel_tests::open_store(dir.path()).await;
        let started = Kernel::builder(tree_settings())
            .runtimes(RuntimeRegistry::builtin())
            .store(store, recovered)
            .start()
            .await
            .expect("the kernel starts again");
        let ns = nanos_since(start);
        assert_eq!(
            started.restored.processes, expected,
            "not every process came back"
        );
        started.kernel.shutdown().await;
        if run > 0 {
            times.push(ns);
        }
    }
    median(times)
}

/// The same rows inserted and deleted by hand, 64 per transaction.
fn sqlite_floor(total: usize) -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let conn = rusqlite::Connection::open(dir.path().join("floor.db")).expect("open");
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;
         CREATE TABLE messages (id INTEGER PRIMARY KEY, to_pid INTEGER NOT NULL,
             body TEXT NOT NULL, created_ms INTEGER NOT NULL, expires_ms INTEGER) STRICT;",
    )
    .expect("schema");
    let body = r#"{"id":1,"from":1,"to":2,"kind":"message","payload":"x","priority":"normal","request_id":null,"via":null}"#;
    let start = Instant::now();
    let mut conn = conn;
    for chunk in (0..total).collect::<Vec<_>>().chunks(SENDERS) {
        let tx = conn.transaction().expect("tx");
        for id in chunk {
            tx.prepare_cached(
                "INSERT INTO messages (id, to_pid, body, created_ms) VALUES (?1, 2, ?2, 0)",
            )
            .and_then(|mut s| s.execute((*id as i64, body)))
            .expect("insert");
        }
        tx.commit().expect("commit");
        let tx = conn.transaction().expect("tx");
        for id in chunk {
            tx.prepare_cached("DELETE FROM messages WHERE id = ?1")
                .and_then(|mut s| s.execute([*id as i64]))
                .expect("delete");
        }
        tx.commit().expect("commit");
    }
    nanos_since(start)
}
