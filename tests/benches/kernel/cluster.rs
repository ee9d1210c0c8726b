//! Three `hivekernel start` nodes on a 3-server NATS cluster with
//! JetStream, all on this machine: `execute_task` to a process on another
//! node against one on the node asked, sends to another node's process
//! and to a config agent (whose messages are kept in `HK_MAIL`),
//! spawns on every node at once, and how long a node's `kill -9` keeps
//! its permanent config agent from answering. The floor is a NATS
//! request/reply round trip between two clients of the same cluster.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hivekernel_proto::v1 as pb;
use hivekernel_proto::v1::kernel_client::KernelClient;
use hivekernel_tests::binary::Binary;
use hivekernel_tests::nats::NatsCluster;
use serde_json::json;

use crate::Sizes;
use crate::report::{Row, Target, Unit};
use crate::serve::{Bearer, KernelRpc, connect};
use crate::stats::Latencies;

pub(crate) const FLOOR: &str = "NATS request/reply round trip (async-nats) between two clients \
                                of the same 3-server cluster, one asking, one answering";

/// Heartbeat and TTL of the nodes: a node's death is noticed within the TTL.
const HEARTBEAT_MS: u64 = 200;
const TTL_MS: u64 = 1_500;
/// The permanent config agent's first restart delay.
const BACKOFF_MS: u64 = 100;
/// The nodes.
const NAMES: [&str; 3] = ["a", "b", "c"];
/// Client tasks sending at once.
const SENDERS: usize = 4;
/// Client tasks spawning at once on each node.
const SPAWNERS: usize = 4;

/// A node of the bench's cluster and a client of it.
struct Node {
    binary: Binary,
    client: KernelRpc,
}

pub(crate) async fn run(sizes: &Sizes) -> Vec<Row> {
    if hivekernel_tests::nats::nats_server().is_none() {
        eprintln!("bench: cluster: no nats-server (Debian's nats-server package): skipped");
        return Vec::new();
    }
    let bin = tokio::task::spawn_blocking(crate::cold::binary)
        .await
        .expect("locate the hivekernel binary");
    let root = tempfile::tempdir().expect("temp dir");
    let window = sizes.rpc_window;
    // The reference: the same config on a kernel alone, measured before
    // the cluster starts.
    let (alone, alone_kept) = {
        let mut solo = start_node(&bin, root.path(), None, "alone").await;
        let echo = spawn_echo(&mut solo.client, "echo", pb::Role::Worker, 0).await;
        let alone = sends(solo.client.clone(), echo, window).await;
        let keeper = find(&mut solo.client, "keeper").await.expect("keeper");
        (alone, sends(solo.client.clone(), keeper.0, window).await)
    };
    let nats = tokio::task::spawn_blocking(|| NatsCluster::start(3))
        .await
        .expect("start NATS");
    let mut nodes = Vec::new();
    for name in NAMES {
        nodes.push(start_node(&bin, root.path(), Some(&nats), name).await);
    }
    // An echo agent on a and one on b, each spawned through its own node.
    let near = spawn_echo(&mut nodes[0].client, "near", pb::Role::Worker, 0).await;
    let far = spawn_echo(&mut nodes[1].client, "far", pb::Role::Worker, 0).await;

    let asks = (sizes.asks / 10).max(20);
    let floor = nats_round_trips(&nats, asks).await;
    let kept_floor = jetstream_keeps(&nats, window, false).await;
    let taken_floor = jetstream_keeps(&nats, window, true).await;
    let client = nodes[0].client.clone();
    let same = round_trips(client.clone(), near, asks).await;
    let cross = round_trips(client.clone(), far, asks).await;
    let sends_same = sends(client.clone(), near, window).await;
    let sends_cross = sends(client, far, window).await;
    let (sends_kept_here, sends_kept) = match keeper(&nodes).await {
        Some((pid, holder)) => {
            let here = sends(nodes[holder].client.clone(), pid, window).await;
            let asker = (holder + 1) % nodes.len();
            let afar = sends(nodes[asker].client.clone(), pid, window).await;
            (Some(here), Some(afar))
        }
        None => (None, None),
    };
    let spawns = spawn_everywhere(&nodes, sizes.spawn[0] / 10, window, None, false).await;
    let spawns_apart = spawn_everywhere(&nodes, sizes.spawn[0] / 10, window, None, true).await;
    let permanent = Some(pb::RestartSpec {
        policy: pb::RestartPolicy::Permanent as i32,
        backoff_ms: vec![BACKOFF_MS, 1000],
        ..Default::default()
    });
    let spawns_kept = spawn_everywhere(&nodes, sizes.spawn[0] / 10, window, permanent, false).await;
    let (recovery, moved) = recovery(&mut nodes).await;

    let asked = format!("{asks} sequential calls through node a");
    let mut rows = vec![
        Row::new(
            "cluster",
            "cluster: execute_task p50, echo on the node asked",
            Unit::Nanos,
            same.0,
            Some(floor.0),
        )
        .note(asked.clone()),
        Row::new(
            "cluster",
            "cluster: execute_task p50, echo on another node",
            Unit::Nanos,
            cross.0,
            Some(floor.0),
        )
        .target(Target::at_most(2.0 * same.0, Unit::Nanos))
        .note(format!(
            "{asked}; {:.2}x the same-node p50 (target: at most 2x)",
            cross.0 / same.0
        )),
        Row::new(
            "cluster",
            "cluster: execute_task p99, echo on the node asked",
            Unit::Nanos,
            same.1,
            Some(floor.1),
        ),
        Row::new(
            "cluster",
            "cluster: execute_task p99, echo on another node",
            Unit::Nanos,
            cross.1,
            Some(floor.1),
        ),
        Row::new(
            "cluster",
            format!("cluster: SendMessage, {SENDERS} clients, a kernel alone"),
            Unit::PerSec,
            alone,
            None,
        )
        .note("the reference: one kernel without a cluster, to a spawned echo agent"),
        Row::new(
            "cluster",
            format!("cluster: SendMessage, {SENDERS} clients, a kernel alone, to a config agent"),
            Unit::PerSec,
            alone_kept,
            None,
        )
        .note("each kept in the kernel's store before it is acknowledged"),
        Row::new(
            "cluster",
            format!("cluster: SendMessage, {SENDERS} clients, to the node asked"),
            Unit::PerSec,
            sends_same,
            None,
        ),
        Row::new(
            "cluster",
            format!("cluster: SendMessage, {SENDERS} clients, to another node"),
            Unit::PerSec,
            sends_cross,
            None,
        )
        .note(format!(
            "{:.2}x the same-node rate",
            sends_cross / sends_same
        )),
    ];
    rows.extend([
        Row::new(
            "cluster",
            format!("cluster: JetStream, {SENDERS} publishers, to a 3-replica file stream"),
            Unit::PerSec,
            kept_floor,
            None,
        )
        .note(format!(
            "no kernel: each publish awaited until the stream stored it (a kept send's least \
             cost); {:.2}x a kernel alone's config agent",
            kept_floor / alone_kept
        )),
        Row::new(
            "cluster",
            format!("cluster: JetStream, {SENDERS} publishers, each taken by one deleter"),
            Unit::PerSec,
            taken_floor,
            None,
        )
        .note(format!(
            "no kernel: as above, each message then deleted by its sequence, one after the \
             other, as one process's handover does; messages deleted per second; {:.2}x a \
             kernel alone's config agent",
            taken_floor / alone_kept
        )),
    ]);
    // A movable process's rate: at least half a kernel alone's.
    let half_alone = Target::at_least(alone_kept / 2.0, Unit::PerSec);
    if let Some(kept) = sends_kept_here {
        rows.push(
            Row::new(
                "cluster",
                format!(
                    "cluster: SendMessage, {SENDERS} clients, to a config agent on the node asked"
                ),
                Unit::PerSec,
                kept,
                None,
            )
            .target(half_alone)
            .note(format!(
                "each kept in HK_MAIL (a quorum write) before it is acknowledged, and deleted \
                 from it before it is handed over; {:.2}x a kernel alone's config agent \
                 (target: at least 0.5x)",
                kept / alone_kept
            )),
        );
    }
    if let Some(kept) = sends_kept {
        rows.push(
            Row::new(
                "cluster",
                format!(
                    "cluster: SendMessage, {SENDERS} clients, to a config agent on another node"
                ),
                Unit::PerSec,
                kept,
                None,
            )
            .note(format!(
                "each kept in HK_MAIL (a quorum write) before it is acknowledged, and deleted \
                 from it before it is handed over; {:.2}x the rate to another node's process",
                kept / sends_cross
            )),
        );
    }
    rows.extend([
        Row::new(
            "cluster",
            format!("cluster: Spawn, {SPAWNERS} clients on each of 3 nodes"),
            Unit::PerSec,
            spawns,
            None,
        )
        .note("temporary processes; each spawn answered once every node can find it"),
        Row::new(
            "cluster",
            format!(
                "cluster: Spawn under a parent on another node, {SPAWNERS} clients on each of 3 \
                 nodes"
            ),
            Unit::PerSec,
            spawns_apart,
            None,
        )
        .note(format!(
            "each child placed on the next node: its parent's node lends it its grant and holds \
             its slot, then confirms the slot; {:.2}x the rate of children on their parent's node",
            spawns_apart / spawns
        )),
        Row::new(
            "cluster",
            format!("cluster: Spawn of permanent processes, {SPAWNERS} clients on each of 3 nodes"),
            Unit::PerSec,
            spawns_kept,
            None,
        )
        .note(format!(
            "each spec kept in hk_specs (a quorum write) before the spawn answers; {:.2}x the \
             rate of temporary ones",
            spawns_kept / spawns
        )),
    ]);
    // Both kills are one: each row is the time to answering again.
    let answering_again = |name: &str, took: f64, note: String| {
        Row::new("cluster", name, Unit::Nanos, took, None)
            .target(Target::at_most(
                (TTL_MS + BACKOFF_MS + 1_000) as f64 * 1e6,
                Unit::Nanos,
            ))
            .note(note)
    };
    if let Some(recovery) = recovery {
        rows.push(answering_again(
            "cluster: kill -9 of a node to its permanent agent answering elsewhere",
            recovery,
            format!(
                "one run; TTL {TTL_MS} ms, heartbeat {HEARTBEAT_MS} ms, backoff {BACKOFF_MS} ms"
            ),
        ));
    }
    if let Some(moved) = moved {
        rows.push(answering_again(
            "cluster: kill -9 of a node to its permanent spawned process answering elsewhere",
            moved,
            "the same kill; its tree started again from hk_specs by a node that judged the loss"
                .to_owned(),
        ));
    }
    drop(nodes);
    drop(nats);
    rows
}

/// Starts node `name` of `nats` (or a kernel alone) with a permanent echo
/// config agent, and a client of it.
async fn start_node(bin: &Path, root: &Path, nats: Option<&NatsCluster>, name: &str) -> Node {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).expect("a node's directory");
    let mut kernel = json!({
        "listen": "127.0.0.1:0",
        "shutdown_grace_ms": 0,
        "max_children": 100_000,
        "dashboard": { "enabled": false },
    });
    if let Some(nats) = nats {
        kernel["cluster"] = json!({
            "servers": (0..nats.servers()).map(|i| nats.url(i)).collect::<Vec<_>>(),
            "heartbeat_ms": HEARTBEAT_MS,
            "node_ttl_ms": TTL_MS
        });
    }
    let config = json!({
        "kernel": kernel,
        "agents": [{
            "name": "keeper", "role": "agent", "runtime": "echo",
            "restart": { "policy": "permanent", "backoff_ms": [BACKOFF_MS, 1000] }
        }]
    });
    std::fs::write(dir.join("config.json"), config.to_string()).expect("a node's config");
    let (bin, args) = (
        bin.to_owned(),
        nats.map(|_| ["--node".to_owned(), name.to_owned()]),
    );
    let binary = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().flatten().map(String::as_str).collect();
        Binary::start_with(&bin, &dir, &args)
    })
    .await
    .expect("start a node");
    let client = client_of(&binary).await;
    Node { binary, client }
}

async fn client_of(binary: &Binary) -> KernelRpc {
    let token = std::fs::read_to_string(binary.dir.join("data/admin.token"))
        .expect("the node's admin token");
    KernelClient::with_interceptor(connect(&binary.addr).await, Bearer::new(token.trim()))
}

/// Spawns echo agent `name` of `role` under PID 1 through `client`, with
/// room for `max_children` children (0: its role's default); its PID.
async fn spawn_echo(client: &mut KernelRpc, name: &str, role: pb::Role, max_children: u32) -> u64 {
    client
        .spawn(pb::SpawnRequest {
            parent: 1,
            name: name.to_owned(),
            role: role as i32,
            runtime: "echo".to_owned(),
            limits: Some(pb::Limits {
                max_children,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("spawn an echo agent")
        .into_inner()
        .pid
}

/// p50 and p99 of `n` sequential `execute_task` calls to `pid`.
async fn round_trips(client: KernelRpc, pid: u64, n: usize) -> (f64, f64) {
    let ask = || {
        let mut client = client.clone();
        async move {
            let answer = client
                .execute_task(pb::ExecuteTaskRequest {
                    pid,
                    description: "x".to_owned(),
                    timeout_ms: 10_000,
                    ..Default::default()
                })
                .await
                .expect("execute_task")
                .into_inner();
            assert!(answer.success, "{}", answer.error);
        }
    };
    for _ in 0..n / 10 {
        ask().await;
    }
    let mut latencies = Latencies::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        ask().await;
        latencies.record(start.elapsed());
    }
    latencies.p50_p99()
}

/// p50 and p99 of `n` request/reply round trips over `nats`.
/// Messages per second kept in a 3-replica file stream (acknowledged,
/// with a message id) by [`SENDERS`] tasks on one client for `window`:
/// what keeping a message in `HK_MAIL` costs at least. With `taken`, one
/// more task deletes each by its sequence, one after the other, as a
/// handover does, and the rate is of messages deleted within `window`
/// (the publishers held to at most 1,024 ahead, a mailbox's default).
async fn jetstream_keeps(nats: &NatsCluster, window: Duration, taken: bool) -> f64 {
    const AHEAD: usize = 1024;
    let client = nats.client(0).await.expect("connect to NATS");
    let js = async_nats::jetstream::new(client);
    let name = format!("BENCH_{taken}");
    let stream = js
        .get_or_create_stream(async_nats::jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![format!("bench.{name}.>")],
            storage: async_nats::jetstream::stream::StorageType::File,
            num_replicas: 3,
            ..Default::default()
        })
        .await
        .expect("create the bench stream");
    let start = Instant::now();
    let deadline = start + window;
    let (seqs, mut to_take) = tokio::sync::mpsc::channel::<u64>(AHEAD);
    let deleted = Arc::new(AtomicU64::new(0));
    let deleter = {
        let deleted = deleted.clone();
        tokio::spawn(async move {
            while let Some(seq) = to_take.recv().await
                && Instant::now() < deadline
            {
                stream.delete_message(seq).await.expect("delete");
                deleted.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let sent = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..SENDERS)
        .map(|i| {
            let (js, sent, seqs, name) = (js.clone(), sent.clone(), seqs.clone(), name.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    n += 1;
                    let publish = async_nats::jetstream::message::PublishMessage::build()
                        .payload("x".into())
                        .message_id(format!("{i}.{n}"));
                    let ack = js
                        .send_publish(format!("bench.{name}.{i}"), publish)
                        .await
                        .expect("publish")
                        .await
                        .expect("a stored publish");
                    if taken && seqs.send(ack.sequence).await.is_err() {
                        break;
                    }
                    sent.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    drop(seqs);
    for task in tasks {
        task.await.expect("a publisher");
    }
    deleter.await.expect("the deleter");
    let done = if taken { &deleted } else { &sent };
    done.load(Ordering::Relaxed) as f64 / window.as_secs_f64()
}

async fn nats_round_trips(nats: &NatsCluster, n: usize) -> (f64, f64) {
    let asker = nats.client(0).await.expect("connect to NATS");
    let answerer = nats.client(1).await.expect("connect to NATS");
    let mut requests = answerer.subscribe("bench.echo").await.expect("subscribe");
    answerer.flush().await.expect("flush");
    let echo = tokio::spawn(async move {
        use futures::StreamExt;
        while let Some(request) = requests.next().await {
            if let Some(reply) = request.reply {
                let _ = answerer.publish(reply, request.payload).await;
            }
        }
    });
    // The answerer's interest reaches the asker's server over the route
    // a moment after its own server has it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while asker.request("bench.echo", "x".into()).await.is_err() {
        assert!(Instant::now() < deadline, "no NATS answerer after 10 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut latencies = Latencies::with_capacity(n);
    for i in 0..n + n / 10 {
        let start = Instant::now();
        asker
            .request("bench.echo", "x".into())
            .await
            .expect("a NATS round trip");
        if i >= n / 10 {
            latencies.record(start.elapsed());
        }
    }
    echo.abort();
    latencies.p50_p99()
}

/// Sends per second to `pid` from [`SENDERS`] client tasks over `window`.
async fn sends(client: KernelRpc, pid: u64, window: Duration) -> f64 {
    let sent = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + window;
    let tasks: Vec<_> = (0..SENDERS)
        .map(|_| {
            let (mut client, sent) = (client.clone(), sent.clone());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    client
                        .send_message(pb::SendMessageRequest {
                            to: pid,
                            payload: "x".into(),
                            ..Default::default()
                        })
                        .await
                        .expect("send_message");
                    sent.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a sender");
    }
    sent.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// Spawns per second, cluster-wide, from [`SPAWNERS`] client tasks on each
/// node, each node's under a parent of its own, for `window` or `most`
/// spawns per node, each with `restart` as its restart spec.
async fn spawn_everywhere(
    nodes: &[Node],
    most: usize,
    window: Duration,
    restart: Option<pb::RestartSpec>,
    apart: bool,
) -> f64 {
    let spawned = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    let start = Instant::now();
    let deadline = start + window;
    for (n, node) in nodes.iter().enumerate() {
        let mut client = node.client.clone();
        let name = format!("spawner-{n}-{}-{apart}", restart.is_some());
        // The next node, for children apart from their parent.
        let placed = if apart {
            NAMES[(n + 1) % NAMES.len()].to_owned()
        } else {
            String::new()
        };
        let parent = spawn_echo(&mut client, &name, pb::Role::Lead, 100_000).await;
        let left = Arc::new(AtomicU64::new(most.max(SPAWNERS) as u64));
        for t in 0..SPAWNERS {
            let (mut client, spawned, left) = (client.clone(), spawned.clone(), left.clone());
            let (restart, placed) = (restart.clone(), placed.clone());
            tasks.push(tokio::spawn(async move {
                let mut seq = 0;
                while Instant::now() < deadline
                    && left
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                        .is_ok()
                {
                    client
                        .spawn(pb::SpawnRequest {
                            parent,
                            name: format!("w{t}-{seq}"),
                            runtime: "echo".to_owned(),
                            restart: restart.clone(),
                            node: placed.clone(),
                            ..Default::default()
                        })
                        .await
                        .expect("spawn");
                    seq += 1;
                    spawned.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("a spawner");
    }
    spawned.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// The PID of process `name` and the node that runs it.
async fn find(client: &mut KernelRpc, name: &str) -> Option<(u64, String)> {
    let found = client
        .find_process(pb::FindProcessRequest {
            target: name.to_owned(),
        })
        .await
        .ok()?
        .into_inner();
    Some((found.pid, found.node))
}

/// The PID of config agent `keeper`, and the index of the node that runs it.
async fn keeper(nodes: &[Node]) -> Option<(u64, usize)> {
    let (pid, node) = find(&mut nodes[0].client.clone(), "keeper").await?;
    Some((pid, NAMES.iter().position(|name| *name == node)?))
}

/// `kill -9` of the node running the permanent config agent `keeper`, to
/// the agent, and to a permanent process spawned on that node, answering
/// an `execute_task` through another node; `None` for one that did not
/// answer within a minute.
async fn recovery(nodes: &mut [Node]) -> (Option<f64>, Option<f64>) {
    let mut client = nodes[0].client.clone();
    let keeper = client
        .find_process(pb::FindProcessRequest {
            target: "keeper".to_owned(),
        })
        .await
        .expect("find the config agent")
        .into_inner();
    let Some(holder) = NAMES.iter().position(|name| *name == keeper.node) else {
        return (None, None);
    };
    let mover = nodes[holder]
        .client
        .clone()
        .spawn(pb::SpawnRequest {
            parent: 1,
            name: "mover".to_owned(),
            runtime: "echo".to_owned(),
            restart: Some(pb::RestartSpec {
                policy: pb::RestartPolicy::Permanent as i32,
                backoff_ms: vec![BACKOFF_MS, 1000],
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("spawn a permanent process")
        .into_inner()
        .pid;
    let client = nodes[(holder + 1) % nodes.len()].client.clone();
    let binary = &mut nodes[holder].binary;
    if binary.child.kill().is_err() {
        return (None, None);
    }
    let died = Instant::now();
    let _ = binary.child.wait();
    tokio::join!(
        answering(client.clone(), keeper.pid, died),
        answering(client, mover, died)
    )
}

/// Time from `died` to `pid` answering an `execute_task` through
/// `client`; `None` after a minute.
async fn answering(mut client: KernelRpc, pid: u64, died: Instant) -> Option<f64> {
    loop {
        let answered = client
            .execute_task(pb::ExecuteTaskRequest {
                pid,
                description: "x".to_owned(),
                timeout_ms: 1_000,
                ..Default::default()
            })
            .await
            .is_ok_and(|answer| answer.into_inner().success);
        if answered {
            return Some(died.elapsed().as_nanos() as f64);
        }
        if died.elapsed() > Duration::from_secs(60) {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
