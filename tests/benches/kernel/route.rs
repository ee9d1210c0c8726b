//! Routed message throughput and the `execute_task` round trip, beside raw
//! tokio channels of the same shape.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hivekernel_agents::{Outgoing, Pid, ProcessState, SpawnRequest, TaskSpec};
use hivekernel_kernel::{Caller, Kernel, KernelError};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot};

use crate::report::{Row, Target, Unit};
use crate::spawn::{MAILBOX, start_kernel};
use crate::stats::{Latencies, median, nanos_since, paired_medians, warm_pairs};
use crate::{Sizes, count};

pub(crate) const FLOOR: &str = "send: 4 tasks try_send (yield_now when full) into 4 mpsc(1024) \
                                each read by its own task; ask: an mpsc(1024) request carrying a \
                                oneshot, answered by one task";

/// Senders, and agents (one per sender) they send to.
const SENDERS: usize = 4;

pub(crate) async fn run(sizes: &Sizes) -> Vec<Row> {
    let per = sizes.messages;
    let total = (per * SENDERS) as f64;
    let retries = AtomicU64::new(0);
    let retried = &retries;
    let (ours, floor) = paired_medians(
        sizes.runs,
        || async move {
            let (ns, r) = kernel_send(per).await;
            retried.fetch_add(r, Ordering::Relaxed);
            ns
        },
        || floor_send(per),
    )
    .await;
    let runs = sizes.runs as u64 + 1;

    let asks = sizes.asks;
    let (ours_ask, floor_ask) =
        warm_pairs(sizes.runs, || kernel_ask(asks), || floor_ask(asks)).await;
    let p =
        |runs: &[(f64, f64)], pick: fn(&(f64, f64)) -> f64| median(runs.iter().map(pick).collect());
    vec![
        Row::new(
            "route",
            format!(
                "send_message, 4 senders -> 4 echo agents ({} msgs)",
                count(per * SENDERS)
            ),
            Unit::PerSec,
            total * 1e9 / ours,
            Some(total * 1e9 / floor),
        )
        .target(Target::at_least(2e6, Unit::PerSec))
        .note(format!(
            "{} MailboxFull retries per run",
            retries.load(Ordering::Relaxed) / runs
        )),
        Row::new(
            "route",
            "execute_task round trip p50 (echo, 1 caller)",
            Unit::Nanos,
            p(&ours_ask, |r| r.0),
            Some(p(&floor_ask, |r| r.0)),
        )
        .target(Target::at_most(10_000.0, Unit::Nanos)),
        Row::new(
            "route",
            "execute_task round trip p99 (echo, 1 caller)",
            Unit::Nanos,
            p(&ours_ask, |r| r.1),
            Some(p(&floor_ask, |r| r.1)),
        ),
    ]
}

/// Echo agents under PID 1, named `{prefix}-{i}`.
async fn echo_agents(kernel: &Kernel, prefix: &str, n: usize) -> Vec<Pid> {
    let mut pids = Vec::with_capacity(n);
    for i in 0..n {
        let mut request = SpawnRequest::new(Pid::KERNEL, format!("{prefix}-{i}"));
        request.runtime = Some("echo".into());
        pids.push(
            kernel
                .spawn(Caller::Admin, request)
                .await
                .expect("spawn an echo agent"),
        );
    }
    pids
}

/// Sends `per` messages from each of 4 tasks to its own echo agent, until
/// every mailbox is empty again. Returns the time taken and the retries.
async fn kernel_send(per: usize) -> (f64, u64) {
    let kernel = start_kernel().await;
    let pids = echo_agents(&kernel, "sink", SENDERS).await;
    let start = Instant::now();
    let senders: Vec<_> = pids
        .iter()
        .map(|&pid| {
            let kernel = kernel.clone();
            tokio::spawn(async move {
                let mut retries = 0;
                for _ in 0..per {
                    loop {
                        match kernel
                            .send_message(Caller::Admin, Outgoing::new(pid, "x"))
                            .await
                        {
                            Ok(_) => break,
                            Err(KernelError::MailboxFull { .. }) => {
                                retries += 1;
                                tokio::task::yield_now().await;
                            }
                            Err(err) => panic!("send_message to {pid}: {err}"),
                        }
                    }
                }
                retries
            })
        })
        .collect();
    let mut retries = 0;
    for sender in senders {
        retries += sender.await.expect("sender task");
    }
    drained(&kernel, &pids).await;
    let ns = nanos_since(start);
    kernel.shutdown().await;
    (ns, retries)
}

/// Waits until every agent in `pids` has an empty mailbox and is idle.
async fn drained(kernel: &Kernel, pids: &[Pid]) {
    loop {
        let mut idle = true;
        for &pid in pids {
            let info = kernel
                .get_process(Caller::Admin, pid)
                .await
                .expect("echo agent is alive");
            idle &= info.mailbox_len == 0 && info.state == ProcessState::Idle;
        }
        if idle {
            return;
        }
        tokio::time::sleep(Duration::from_micros(100)).await;
    }
}

/// The floor of [`kernel_send`]: the same shape over bare channels.
async fn floor_send(per: usize) -> f64 {
    let mut receivers = Vec::with_capacity(SENDERS);
    let mut senders = Vec::with_capacity(SENDERS);
    for _ in 0..SENDERS {
        let (tx, mut rx) = mpsc::channel::<String>(MAILBOX);
        receivers.push(tokio::spawn(async move {
            for _ in 0..per {
                rx.recv().await.expect("sender stays until done");
            }
        }));
        senders.push(tx);
    }
    let start = Instant::now();
    let senders: Vec<_> = senders
        .into_iter()
        .map(|tx| {
            tokio::spawn(async move {
                for _ in 0..per {
                    let mut message = "x".to_owned();
                    loop {
                        match tx.try_send(message) {
                            Ok(()) => break,
                            Err(TrySendError::Full(back)) => {
                                message = back;
                                tokio::task::yield_now().await;
                            }
                            Err(TrySendError::Closed(_)) => panic!("receiver gone"),
                        }
                    }
                }
            })
        })
        .collect();
    for task in senders.into_iter().chain(receivers) {
        task.await.expect("floor task");
    }
    nanos_since(start)
}

/// `n` closed-loop `execute_task` calls on one echo agent: (p50, p99) in ns.
async fn kernel_ask(n: usize) -> (f64, f64) {
    let kernel = start_kernel().await;
    let pid = echo_agents(&kernel, "echo", 1).await[0];
    let mut latencies = Latencies::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let (_, reply) = kernel
            .execute_task(Caller::Admin, TaskSpec::new(pid, "x"))
            .await
            .expect("execute_task on an echo agent");
        reply.expect("echo answers");
        latencies.record(start.elapsed());
    }
    kernel.shutdown().await;
    latencies.p50_p99()
}

/// The floor of [`kernel_ask`]: a request with a oneshot reply port to a task that answers.
async fn floor_ask(n: usize) -> (f64, f64) {
    let (tx, mut rx) = mpsc::channel::<(String, oneshot::Sender<String>)>(MAILBOX);
    let server = tokio::spawn(async move {
        while let Some((description, reply)) = rx.recv().await {
            let _ = reply.send(description);
        }
    });
    let mut latencies = Latencies::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let (reply, answer) = oneshot::channel();
        tx.send(("x".to_owned(), reply))
            .await
            .expect("server is running");
        answer.await.expect("server answers");
        latencies.record(start.elapsed());
    }
    drop(tx);
    server.await.expect("server task");
    latencies.p50_p99()
}
