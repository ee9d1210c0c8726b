//! Kernel nodes in a cluster (docs/CLUSTER.md): real `hivekernel start`
//! daemons joined through a real 3-server NATS cluster with JetStream on
//! loopback. They see each other with their load, hand out PIDs from one
//! space, declare a killed node lost, fence a paused one, refuse a second
//! node under a live name, and carry on when a NATS server dies. They
//! share a cluster secret, so all of it runs signed.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use hivekernel_proto::v1 as pb;
use hivekernel_proto::v1::kernel_client::KernelClient;
use hivekernel_tests::binary::Binary;
use hivekernel_tests::nats::NatsCluster;
use hivekernel_tests::served::Bearer;
use serde_json::{Value, json};

/// Heartbeat and TTL short enough for tests, long enough for 2 busy cores.
const HEARTBEAT_MS: u64 = 200;
const TTL_MS: u64 = 1_500;

fn binary() -> PathBuf {
    match hivekernel_tests::build_hivekernel() {
        Ok(bin) => bin,
        Err((bin, why)) => panic!("cannot build {}: {why}", bin.display()),
    }
}

/// A config with one echo agent, and `cluster` as `kernel.cluster` when given.
fn config(cluster: Option<Value>) -> String {
    let mut kernel = json!({
        "listen": "127.0.0.1:0",
        "shutdown_grace_ms": 0,
        "dashboard": { "enabled": false }
    });
    if let Some(cluster) = cluster {
        kernel["cluster"] = cluster;
    }
    json!({
        "kernel": kernel,
        "agents": [{ "name": "greeter", "role": "agent", "runtime": "echo" }]
    })
    .to_string()
}

/// The cluster secret of every node these tests start (docs/CLUSTER.md,
/// "Signed messages"): they run as a cluster should, signed.
const SECRET: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

/// A node started from `config` in a fresh directory under `root`, with
/// `extra` arguments; a config with `kernel.cluster` gets the cluster
/// secret (`secret_file`, in that directory).
fn node(bin: &Path, root: &Path, name: &str, config: &str, extra: &[&str]) -> Binary {
    let dir = root.join(name);
    write_config(&dir, config);
    Binary::start_with(bin, &dir, extra)
}

/// Writes `config` to `dir/config.json` (`dir` made first), with the
/// cluster secret when it has `kernel.cluster` and says nothing of one
/// (`"secret_file": null`: unsigned).
fn write_config(dir: &Path, config: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).unwrap();
    let mut config: Value = serde_json::from_str(config).unwrap();
    if let Some(cluster) = config["kernel"]["cluster"].as_object_mut()
        && !cluster.contains_key("secret_file")
    {
        let secret = dir.join("cluster.secret");
        std::fs::write(&secret, SECRET).unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        cluster.insert("secret_file".into(), json!("cluster.secret"));
    }
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
}

/// A node of `nats` named `name`, timed for tests, from the flags.
fn flagged(bin: &Path, root: &Path, nats: &NatsCluster, name: &str) -> Binary {
    let timing = json!({
        "servers": ["nats://127.0.0.1:1"],
        "heartbeat_ms": HEARTBEAT_MS,
        "node_ttl_ms": TTL_MS
    });
    flagged_as(bin, root, nats, name, timing)
}

/// [`flagged`] without the cluster secret: for tests that send requests
/// as a peer node would, which a signed node drops unanswered
/// (hostile/cluster_forgery.rs).
fn flagged_unsigned(bin: &Path, root: &Path, nats: &NatsCluster, name: &str) -> Binary {
    let timing = json!({
        "servers": ["nats://127.0.0.1:1"],
        "heartbeat_ms": HEARTBEAT_MS,
        "node_ttl_ms": TTL_MS,
        "secret_file": null
    });
    flagged_as(bin, root, nats, name, timing)
}

fn flagged_as(bin: &Path, root: &Path, nats: &NatsCluster, name: &str, timing: Value) -> Binary {
    let urls = nats.urls();
    node(
        bin,
        root,
        name,
        &config(Some(timing)),
        &["--cluster", &urls, "--node", name],
    )
}

/// A config of `agents` for nodes timed for tests (the servers come from
/// `--cluster`).
fn config_of(agents: Value) -> String {
    json!({
        "kernel": {
            "listen": "127.0.0.1:0",
            "shutdown_grace_ms": 0,
            "dashboard": { "enabled": false },
            "cluster": {
                "servers": ["nats://127.0.0.1:1"],
                "heartbeat_ms": HEARTBEAT_MS,
                "node_ttl_ms": TTL_MS
            }
        },
        "agents": agents
    })
    .to_string()
}

/// Node `name` of `nats`, started from `config`.
fn member(bin: &Path, root: &Path, nats: &NatsCluster, name: &str, config: &str) -> Binary {
    node(
        bin,
        root,
        name,
        config,
        &["--cluster", &nats.urls(), "--node", name],
    )
}

/// `nodes --json` as this node sees them, by name.
fn nodes(kernel: &Binary) -> Vec<Value> {
    kernel
        .json(&["nodes", "--json"])
        .as_array()
        .unwrap()
        .clone()
}

fn names(nodes: &[Value]) -> BTreeSet<String> {
    nodes
        .iter()
        .map(|n| n["name"].as_str().unwrap().to_owned())
        .collect()
}

/// `nodes --json` as this node sees them, or `None` while it refuses
/// (exit 3, unavailable): it cannot confirm it is a member, as while the
/// stream of heartbeats elects a new leader after a NATS server's loss.
fn nodes_if_standing(kernel: &Binary) -> Option<Vec<Value>> {
    let out = kernel.command(&["nodes", "--json"]).output().unwrap();
    if out.status.code() == Some(3) {
        return None;
    }
    assert!(
        out.status.success(),
        "nodes --json: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    Some(seen.as_array().unwrap().clone())
}

/// Waits until `kernel` sees exactly the nodes `expected` (through a
/// moment in which it refuses for want of standing).
fn wait_for_nodes(kernel: &Binary, expected: &[&str], limit: Duration) -> Vec<Value> {
    let expected: BTreeSet<String> = expected.iter().map(|s| s.to_string()).collect();
    let deadline = Instant::now() + limit;
    loop {
        let seen = nodes_if_standing(kernel);
        if let Some(seen) = &seen
            && names(seen) == expected
        {
            return seen.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{} sees {:?}, not {expected:?}\n{}",
            kernel.dir.display(),
            seen.as_deref().map(names),
            kernel.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The PIDs of the processes `kernel` itself holds (`ps` shows the whole
/// cluster; each process says its node).
fn pids(kernel: &Binary) -> Vec<u64> {
    let me = nodes(kernel)[0]["name"].as_str().unwrap().to_owned();
    kernel
        .json(&["ps", "--json"])
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["node"] == me.as_str())
        .map(|p| p["pid"].as_u64().unwrap())
        .filter(|&pid| pid != 1)
        .collect()
}

/// `ps --json` of the whole cluster as `kernel` sees it: PID to (name, node).
fn everyone(kernel: &Binary) -> std::collections::BTreeMap<u64, (String, String)> {
    kernel
        .json(&["ps", "--json"])
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["pid"] != 1)
        .map(|p| {
            (
                p["pid"].as_u64().unwrap(),
                (
                    p["name"].as_str().unwrap().to_owned(),
                    p["node"].as_str().unwrap_or("").to_owned(),
                ),
            )
        })
        .collect()
}

/// Spawns `name` of `role` under `parent` through `kernel`; its PID.
fn spawn(kernel: &Binary, parent: u64, name: &str, role: &str) -> u64 {
    kernel.json(&[
        "spawn",
        "--parent",
        &parent.to_string(),
        "--name",
        name,
        "--role",
        role,
        "--runtime",
        "echo",
        "--json",
    ])["pid"]
        .as_u64()
        .unwrap()
}

/// Spawns `name` under PID 1 through `kernel`: a permanent `tool_agent`
/// (so it may move, its messages kept in the cluster's mail stream) with
/// `prompt` and `tools`; its PID.
fn spawn_agent(kernel: &Binary, name: &str, prompt: &str, tools: &str) -> u64 {
    let args = [
        "spawn",
        "--parent",
        "1",
        "--name",
        name,
        "--role",
        "agent",
        "--runtime",
        "tool_agent",
        "--model",
        "test-model",
        "--prompt",
        prompt,
        "--tools",
        tools,
        "--restart",
        "permanent",
        "--json",
    ];
    kernel.json(&args)["pid"].as_u64().unwrap()
}

/// Waits until `check` holds of what `kernel`'s `ps` shows.
fn wait_for_ps(
    kernel: &Binary,
    what: &str,
    check: impl Fn(&std::collections::BTreeMap<u64, (String, String)>) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = everyone(kernel);
        if check(&seen) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {seen:?}\n{}",
            kernel.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The keys of the directory bucket now, read straight from NATS.
async fn listed(nats: &async_nats::Client) -> BTreeSet<u64> {
    let js = async_nats::jetstream::new(nats.clone());
    let bucket = js.get_key_value("hk_directory").await.unwrap();
    let keys: Vec<String> = bucket
        .keys()
        .await
        .unwrap()
        .map(|k| k.unwrap())
        .collect()
        .await;
    keys.iter().map(|k| k.parse().unwrap()).collect()
}

/// Waits for the daemon to exit by itself; its exit code.
fn exit_code(kernel: &mut Binary, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = kernel.child.try_wait().unwrap() {
            return status.code();
        }
        assert!(Instant::now() < deadline, "still running\n{}", kernel.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A `hivekernel start` expected to fail: its exit code and stderr.
fn start_fails(bin: &Path, dir: &Path, config: &str, extra: &[&str]) -> (Option<i32>, String) {
    write_config(dir, config);
    let out = Command::new(bin)
        .arg("start")
        .arg(dir.join("config.json"))
        .arg("--data-dir")
        .arg(dir.join("data"))
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn three_nodes_see_each_other_and_share_one_pid_space() {
    let bin = binary();
    let nats = NatsCluster::start(3);
    let root = tempfile::tempdir().unwrap();
    let a = flagged(&bin, root.path(), &nats, "a");
    let b = flagged(&bin, root.path(), &nats, "b");
    // The third from the config alone, with labels, listing only one server.
    let c = node(
        &bin,
        root.path(),
        "c",
        &config(Some(json!({
            "servers": [nats.url(2)],
            "node": "c",
            "labels": { "gpu": "true", "zone": "z1" },
            "heartbeat_ms": HEARTBEAT_MS,
            "node_ttl_ms": TTL_MS
        }))),
        &[],
    );
    let limit = Duration::from_secs(10);
    for kernel in [&a, &b, &c] {
        let seen = wait_for_nodes(kernel, &["a", "b", "c"], limit);
        // The node asked comes first and says so.
        assert_eq!(seen[0]["this_node"], true, "{seen:?}");
        assert_eq!(seen.iter().filter(|n| n["this_node"] == true).count(), 1);
        assert_eq!(
            seen[0]["address"].as_str().unwrap(),
            kernel.addr.trim_end_matches('/'),
            "{seen:?}"
        );
    }
    let seen = nodes(&a);
    let c_seen = seen.iter().find(|n| n["name"] == "c").unwrap();
    assert_eq!(c_seen["labels"], json!({ "gpu": "true", "zone": "z1" }));
    let epochs: BTreeSet<u64> = seen.iter().map(|n| n["epoch"].as_u64().unwrap()).collect();
    assert_eq!(epochs.len(), 3, "every start is its own epoch: {seen:?}");

    // Spawns on all three at once: no PID is handed out twice.
    let spawners: Vec<_> = [&a, &b, &c]
        .iter()
        .flat_map(|kernel| {
            (0..15).map(move |i| {
                kernel
                    .command(&[
                        "spawn",
                        "--parent",
                        "1",
                        "--name",
                        &format!("w{i}"),
                        "--role",
                        "worker",
                        "--runtime",
                        "echo",
                    ])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
        })
        .collect();
    for child in spawners {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut all = Vec::new();
    // 15 spawned on each, and the config agent on a, the first to claim it.
    for (kernel, held) in [(&a, 16), (&b, 15), (&c, 15)] {
        let mine = pids(kernel);
        assert_eq!(mine.len(), held, "{mine:?}");
        all.extend(mine);
    }
    let distinct: BTreeSet<u64> = all.iter().copied().collect();
    assert_eq!(distinct.len(), all.len(), "a PID handed out twice: {all:?}");
    assert!(all.iter().all(|&pid| pid >= 2));

    // The load each node reports reaches the others with its heartbeat.
    let deadline = Instant::now() + limit;
    loop {
        let seen = nodes(&c);
        let held = |n: &Value| if n["name"] == "a" { 16 } else { 15 };
        if seen.iter().all(|n| n["processes"] == held(n)) {
            break;
        }
        assert!(Instant::now() < deadline, "loads never reported: {seen:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = a.cli(&["nodes"]);
    assert!(text.starts_with("NODE"), "{text}");
    assert!(text.contains("a *"), "{text}");
    assert!(text.contains("gpu=true,zone=z1"), "{text}");

    // Placement, asked of a: by labels, by name, and under a parent on
    // another node (its node, wherever the spawn was asked).
    let placed_on = |kernel: &Binary, pid: u64| -> String {
        let info = kernel.json(&["describe", &pid.to_string(), "--json"]);
        info["node"].as_str().unwrap_or_default().to_owned()
    };
    let spawn_placed = |name: &str, parent: u64, placement: &[&str]| -> std::process::Output {
        let parent = parent.to_string();
        let mut args = vec!["spawn", "--parent", &parent, "--name", name, "--json"];
        args.extend_from_slice(placement);
        a.command(&args).output().unwrap()
    };
    let gpu = spawned_pid(&spawn_placed("on-gpu", 1, &["--where", "gpu=true"]));
    assert_eq!(placed_on(&b, gpu), "c");
    let named = spawned_pid(&spawn_placed("on-b", 1, &["--node", "b"]));
    assert_eq!(placed_on(&a, named), "b");
    // An exec agent's command travels with its spawn.
    let exec = spawned_pid(&spawn_placed(
        "exec-b",
        1,
        &["--node", "b", "--", "sleep", "30"],
    ));
    let info = c.json(&["describe", &exec.to_string(), "--json"]);
    assert_eq!(
        (info["node"].as_str(), info["runtime"].as_str()),
        (Some("b"), Some("exec")),
        "{info}"
    );
    let child = spawned_pid(&spawn_placed("under-b", named, &[]));
    assert_eq!(placed_on(&c, child), "b");
    assert_eq!(
        c.json(&["describe", &child.to_string(), "--json"])["ppid"],
        named
    );
    // A child may be placed on another node than its parent's.
    let apart = spawned_pid(&spawn_placed("apart", named, &["--where", "gpu=true"]));
    assert_eq!(placed_on(&a, apart), "c");
    assert_eq!(
        b.json(&["describe", &apart.to_string(), "--json"])["ppid"],
        named
    );
    // What cannot be placed is refused, saying why, and nothing starts.
    let before = everyone(&a).len();
    for (placement, parent, expected) in [
        (
            &["--where", "gpu=false"][..],
            1,
            "no live node has labels gpu=false (live: a [], b [], c [gpu=true,zone=z1])",
        ),
        (&["--node", "x"][..], 1, "no live node has node \"x\""),
    ] {
        let out = spawn_placed("refused", parent, placement);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(expected),
            "{placement:?}: {stderr}"
        );
    }
    assert_eq!(everyone(&a).len(), before);
}

#[test]
fn a_killed_node_is_declared_lost_and_a_paused_one_is_fenced() {
    let bin = binary();
    let mut nats = NatsCluster::start(3);
    let root = tempfile::tempdir().unwrap();
    let a = flagged(&bin, root.path(), &nats, "a");
    let mut b = flagged(&bin, root.path(), &nats, "b");
    let mut c = flagged(&bin, root.path(), &nats, "c");
    let limit = Duration::from_secs(10);
    wait_for_nodes(&a, &["a", "b", "c"], limit);

    // kill -9: no goodbye. Its record stops changing and it is declared lost.
    c.child.kill().unwrap();
    c.child.wait().unwrap();
    let killed = Instant::now();
    wait_for_nodes(&a, &["a", "b"], limit);
    wait_for_nodes(&b, &["a", "b"], limit);
    assert!(
        killed.elapsed() >= Duration::from_millis(TTL_MS - 2 * HEARTBEAT_MS),
        "declared lost before its TTL: {:?}",
        killed.elapsed()
    );
    let log = format!("{}{}", a.log(), b.log());
    assert!(
        log.contains("node declared lost") && log.contains("lost=c"),
        "{log}"
    );

    // Paused past its TTL (a partition, a stopped VM): declared lost; once
    // it runs again, it learns so at its next heartbeat, stops, exits 3.
    let b_epoch = nodes(&a).iter().find(|n| n["name"] == "b").unwrap()["epoch"]
        .as_u64()
        .unwrap();
    signal(&b, "STOP");
    wait_for_nodes(&a, &["a"], limit);
    signal(&b, "CONT");
    assert_eq!(exit_code(&mut b, limit), Some(3), "{}", b.log());
    let log = b.log();
    assert!(log.contains("fenced"), "{log}");
    // A paused node does not take its own pause for the others' silence.
    assert!(!log.contains("lost=a"), "{log}");
    wait_for_nodes(&a, &["a"], limit);

    // Started again under its name, it is a new epoch.
    let b = flagged(&bin, root.path(), &nats, "b");
    let seen = wait_for_nodes(&a, &["a", "b"], limit);
    let epoch = seen.iter().find(|n| n["name"] == "b").unwrap()["epoch"]
        .as_u64()
        .unwrap();
    assert!(epoch > b_epoch, "{epoch} after {b_epoch}");

    // One NATS server of three dies: the nodes carry on, PIDs still come.
    // When it led the node bucket, a node cannot confirm it is a member
    // until the bucket has a new leader, and refuses `UNAVAILABLE` until
    // then (docs/CLUSTER.md, "one NATS server of three dies").
    let before = pids(&a);
    nats.kill(0);
    // A leader election under load can take several election timeouts:
    // the bound only keeps a broken cluster from hanging the test.
    let election = Duration::from_secs(30);
    for i in 0..3 {
        let name = format!("after{i}");
        let args = [
            "spawn",
            "--parent",
            "1",
            "--name",
            &name,
            "--role",
            "worker",
            "--runtime",
            "echo",
        ];
        let deadline = Instant::now() + election;
        loop {
            let out = a.command(&args).output().unwrap();
            if out.status.success() {
                break;
            }
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains("unavailable") && Instant::now() < deadline,
                "{args:?}: {stderr}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    assert_eq!(pids(&a).len(), before.len() + 3);
    std::thread::sleep(Duration::from_millis(3 * TTL_MS));
    wait_for_nodes(&a, &["a", "b"], limit);
    wait_for_nodes(&b, &["a", "b"], limit);
}

/// A node paused past its TTL, whose processes another node took over,
/// acts on nothing once it runs again: the calls queued at its port while
/// it was stopped are refused UNAVAILABLE, naming why (not answered as
/// the processes that moved, not spawned), and its `exec` agents' OS
/// processes are killed at once when it learns of its loss, not after the
/// stop's grace period, so the old copy stops as soon as it can be told.
#[test]
fn a_paused_node_answers_nothing_once_resumed_and_kills_its_exec_agents_at_once() {
    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let pids_file = root.path().join("stubborn.pids");
    // An agent that ignores SIGTERM: only SIGKILL ends it.
    let script = format!(
        "trap '' TERM; echo $$ >> {}; while true; do sleep 0.1; done",
        pids_file.display()
    );
    let restart = json!({ "policy": "permanent", "backoff_ms": [200, 1000] });
    let config = json!({
        "kernel": {
            "listen": "127.0.0.1:0",
            // Longer than the test waits: a stop that gave the agent its
            // grace period would fail it.
            "shutdown_grace_ms": 30_000,
            "dashboard": { "enabled": false },
            "cluster": {
                "servers": ["nats://127.0.0.1:1"],
                "heartbeat_ms": HEARTBEAT_MS,
                "node_ttl_ms": TTL_MS
            }
        },
        "agents": [
            { "name": "porter", "role": "agent", "runtime": "echo", "restart": restart },
            {
                "name": "stubborn", "role": "agent", "runtime": "exec",
                "command": ["sh", "-c", script], "restart": restart
            }
        ]
    })
    .to_string();
    let started = |count: usize| {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let text = std::fs::read_to_string(&pids_file).unwrap_or_default();
            let pids: Vec<i32> = text.lines().filter_map(|l| l.parse().ok()).collect();
            if pids.len() >= count {
                return pids;
            }
            assert!(Instant::now() < deadline, "{count} starts: {pids:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // Whatever happens, no agent outlives the test (the kernels are
    // killed with SIGKILL at its end, and it ignores SIGTERM).
    struct Reap(PathBuf);
    impl Drop for Reap {
        fn drop(&mut self) {
            for pid in std::fs::read_to_string(&self.0).unwrap_or_default().lines() {
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{pid}")])
                    .status();
            }
        }
    }
    let _reap = Reap(pids_file.clone());
    let on = |all: &std::collections::BTreeMap<u64, (String, String)>, at: &str| {
        all.values()
            .filter(|(name, node)| (name == "porter" || name == "stubborn") && node == at)
            .count()
            == 2
    };
    // b starts first and claims both agents.
    let mut b = member(&bin, root.path(), &nats, "b", &config);
    wait_for_ps(&b, "agents on b", |all| on(all, "b"));
    let first = started(1)[0];
    let a = member(&bin, root.path(), &nats, "a", &config);
    wait_for_nodes(&a, &["a", "b"], Duration::from_secs(10));

    // Paused past its TTL: a takes both agents over.
    signal(&b, "STOP");
    wait_for_ps(&a, "agents on a", |all| on(all, "a"));
    let second = started(2)[1];
    assert_ne!(first, second);

    // Calls queued at b's port while it is stopped.
    let task = b
        .command(&["exec", "porter", "from the paused node"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let spawned = b
        .command(&[
            "spawn",
            "--parent",
            "1",
            "--name",
            "latecomer",
            "--runtime",
            "echo",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    signal(&b, "CONT");
    let resumed = Instant::now();

    for (what, call) in [("exec", task), ("spawn", spawned)] {
        let out = call.wait_with_output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(
            out.status.code(),
            Some(3),
            "{what}: {stdout}\n{stderr}\n{}",
            b.log()
        );
        assert!(
            stderr.contains("unavailable: node b is no longer a member of its cluster"),
            "{what}: {stderr}"
        );
        assert!(!stdout.contains("from the paused node"), "{stdout}");
    }
    // The old OS process is killed as b learns of its loss.
    let deadline = resumed + Duration::from_secs(5);
    while Path::new(&format!("/proc/{first}")).exists()
        && !std::fs::read_to_string(format!("/proc/{first}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
    {
        assert!(
            Instant::now() < deadline,
            "the old agent still runs\n{}",
            b.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!(
        "the old exec agent was gone {:?} after its node resumed",
        resumed.elapsed()
    );
    assert_eq!(
        exit_code(&mut b, Duration::from_secs(10)),
        Some(3),
        "{}",
        b.log()
    );
    assert!(b.log().contains("exec processes killed"), "{}", b.log());
    // Nothing was spawned, and the agent a runs is the one that answers.
    assert!(
        !everyone(&a).values().any(|(name, _)| name == "latecomer"),
        "{:?}",
        everyone(&a)
    );
    assert!(a.cli(&["exec", "porter", "after"]).contains("after"));
    assert!(Path::new(&format!("/proc/{second}")).exists());
}

/// `ps` over the cluster while a node is paused (within its TTL, so it is
/// still a member): the listing comes within the read's wait, not the
/// node's TTL, without that node's processes, and says on stderr which
/// node did not answer and how many processes it left out.
#[test]
fn ps_names_the_node_that_did_not_answer() {
    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let timing = json!({
        "servers": ["nats://127.0.0.1:1"],
        "heartbeat_ms": 500,
        "node_ttl_ms": 20_000
    });
    let a = flagged_as(&bin, root.path(), &nats, "a", timing.clone());
    let b = flagged_as(&bin, root.path(), &nats, "b", timing);
    wait_for_nodes(&a, &["a", "b"], Duration::from_secs(10));
    let far = spawned_pid(&spawn_on(&a, 1, "far", "b", &[]));
    wait_for_ps(&a, "far listed", |all| all.contains_key(&far));

    signal(&b, "STOP");
    let asked = Instant::now();
    let out = a.command(&["ps", "--json"]).output().unwrap();
    let took = asked.elapsed();
    signal(&b, "CONT");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    let shown: Value = serde_json::from_str(&stdout).unwrap();
    let pids: Vec<u64> = shown
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    assert!(!pids.contains(&far), "{pids:?}");
    assert!(
        stderr.contains("warning: node b did not answer; 1 process of it not shown")
            && stderr.contains("does not answer"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(5), "ps took {took:?}");

    // Answering again: listed, and no warning.
    let out = a.command(&["ps", "--json"]).output().unwrap();
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("\"pid\": {far}")));
}

/// A kill whose subtree crosses a node that does not answer (killed,
/// not yet declared lost) ends every part it can reach at once, the
/// grandchild on a third node included, and says which processes it
/// could not reach (exit 3, the rest listed as killed).
#[test]
fn a_kill_across_a_dead_middle_node_ends_what_it_reaches_and_names_the_rest() {
    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    // A long TTL: the middle node stays in the view, not yet lost, while
    // the kill runs.
    let timing = json!({
        "servers": ["nats://127.0.0.1:1"],
        "heartbeat_ms": 500,
        "node_ttl_ms": 30_000
    });
    let a = flagged_as(&bin, root.path(), &nats, "a", timing.clone());
    let mut b = flagged_as(&bin, root.path(), &nats, "b", timing.clone());
    let c = flagged_as(&bin, root.path(), &nats, "c", timing);
    wait_for_nodes(&a, &["a", "b", "c"], Duration::from_secs(10));
    let top = spawned_pid(&spawn_on(&a, 1, "top", "a", &[]));
    let middle = spawned_pid(&spawn_on(&a, top, "middle", "b", &[]));
    let leaf = spawned_pid(&spawn_on(&a, middle, "leaf", "c", &[]));
    wait_for_ps(&a, "the tree listed", |all| all.contains_key(&leaf));

    b.child.kill().unwrap();
    b.child.wait().unwrap();
    let asked = Instant::now();
    let out = a.command(&["kill", &top.to_string()]).output().unwrap();
    let took = asked.elapsed();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(
        out.status.code(),
        Some(3),
        "{stdout}\n{stderr}\n{}",
        a.log()
    );
    let killed: Vec<u64> = stdout.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(killed, vec![leaf, top], "{stderr}");
    assert!(
        stderr.contains(&format!("process {middle} on node b"))
            && stderr.contains("not reached, and may still run"),
        "{stderr}"
    );
    // The leaf ended at once, long before b's loss would have ended it.
    assert!(took < Duration::from_secs(10), "kill took {took:?}");
    let on_c = everyone(&c);
    assert!(!on_c.contains_key(&leaf), "{on_c:?}\n{}", c.log());
    assert!(!everyone(&a).contains_key(&top));
}

/// The NATS server leading `HK_MAIL` dies (kill -9) while an `exec`
/// agent acknowledges the messages sent to it: the deletes that fail are
/// tried again until they go through, so the stream is left empty and
/// the agent, started again, gets none of them a second time. Sends to
/// it are refused while the stream has no leader; the outage is printed.
#[test]
fn acknowledged_messages_stay_handled_when_the_mail_leader_dies() {
    let Some(python) = hivekernel_tests::exec::python() else {
        return;
    };
    const SENT: usize = 30;
    let bin = binary();
    let mut nats = NatsCluster::start(3);
    let root = tempfile::tempdir().unwrap();
    // Slow: messages queue, and are acknowledged while the stream has no
    // leader.
    let config = scribe_config(&python, 300);
    let a = member(&bin, root.path(), &nats, "a", &config);
    let info = a.json(&["describe", "scribe", "--json"]);
    let log = PathBuf::from(
        info["log_path"]
            .as_str()
            .unwrap_or_else(|| panic!("{info}")),
    );
    let attached = |kernel: &Binary, runs: usize| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.matches("attached as scribe").count() >= runs {
                return;
            }
            assert!(Instant::now() < deadline, "{text}\n{}", kernel.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    attached(&a, 1);
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Messages left in the stream, as server `i` answers.
    let left_in_mail = |nats: &NatsCluster, i: usize| {
        rt.block_on(async {
            let client = nats.client(i).await.unwrap();
            let js = async_nats::jetstream::new(client);
            let mut stream = js.get_stream("HK_MAIL").await.unwrap();
            stream.info().await.unwrap().state.messages
        })
    };
    let leader = rt_mail_leader(&nats);
    let other = (leader + 1) % 3;

    let mut refused_for = Duration::ZERO;
    let mut acked: Vec<String> = Vec::new();
    for i in 0..SENT {
        if i == SENT / 3 {
            nats.kill(leader);
        }
        let first = Instant::now();
        for attempt in 0.. {
            // A fresh payload per try: a refused send may have been kept
            // all the same (its answer lost), and then is handled too.
            let payload = format!("note-{i:03}-{attempt}");
            let out = a.command(&["send", "scribe", &payload]).output().unwrap();
            if out.status.success() {
                acked.push(payload);
                break;
            }
            assert!(
                first.elapsed() < Duration::from_secs(30),
                "{payload} refused for 30 s: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        refused_for = refused_for.max(first.elapsed());
    }
    eprintln!("sends to the agent refused for up to {refused_for:?} after the HK_MAIL leader died");
    // Each handled once, and each taken out of the stream at last.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let handled = acked
            .iter()
            .filter(|payload| text.contains(&format!(": {payload}\n")))
            .count();
        let left = left_in_mail(&nats, other);
        if handled == SENT && left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{handled} of {SENT} handled, {left} left in HK_MAIL\n{}",
            a.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        a.log()
            .contains("dropping a message from HK_MAIL failed; trying again"),
        "no delete failed: the test did not test the retry\n{}",
        a.log()
    );
    nats.restart(leader);

    // Started again: none of them comes back.
    let mut a = a;
    signal(&a, "TERM");
    assert_eq!(
        exit_code(&mut a, Duration::from_secs(15)),
        Some(0),
        "{}",
        a.log()
    );
    let a = Binary::start_with(
        &bin,
        &root.path().join("a"),
        &["--cluster", &nats.urls(), "--node", "a"],
    );
    attached(&a, 2);
    std::thread::sleep(Duration::from_millis(1500));
    let text = std::fs::read_to_string(&log).unwrap();
    for payload in &acked {
        let times = text.matches(&format!(": {payload}\n")).count();
        assert_eq!(
            times,
            1,
            "{payload} handled {times} times\n{text}\n{}",
            a.log()
        );
    }
}

/// Faults on a schedule, as an outside check would run them, on three
/// NATS servers and three nodes, while a sender sends sequenced messages
/// to a config agent (`exec`, acknowledging each) through whichever node
/// is up: kill -9 of the node running the agent (started again later),
/// kill -9 of the NATS server leading `HK_MAIL` (started again), and a
/// pause past the TTL of the node running the agent (which must answer
/// nothing when it resumes, and exits fenced). A checker then reads
/// every node's log of the agent: no acknowledged message is lost, none
/// is handled more than twice, and few twice (those the agent's node had
/// handled and not yet taken out of the stream when it went come again:
/// at least once, at most 16 and one more per loss),
/// and every node is back in the cluster.
#[test]
fn a_schedule_of_faults_loses_no_acknowledged_message() {
    let Some(python) = hivekernel_tests::exec::python() else {
        return;
    };
    let bin = binary();
    let mut nats = NatsCluster::start(3);
    let root = tempfile::tempdir().unwrap();
    let config = scribe_config(&python, 20);
    let names = ["a", "b", "c"];
    let urls = nats.urls();
    let start = |name: &str| -> Binary {
        let dir = root.path().join(name);
        if !dir.exists() {
            write_config(&dir, &config);
        }
        Binary::start_with(&bin, &dir, &["--cluster", &urls, "--node", name])
    };
    let mut nodes: Vec<Option<Binary>> = names.iter().map(|name| Some(start(name))).collect();
    wait_for_nodes(nodes[0].as_ref().unwrap(), &names, Duration::from_secs(10));
    // Where the agent runs now, as any running node sees it.
    let running_scribe = |nodes: &[Option<Binary>], except: Option<usize>| -> Option<usize> {
        let asker = (0..3).find(|&i| Some(i) != except && nodes[i].is_some())?;
        let all = everyone(nodes[asker].as_ref().unwrap());
        let (_, (_, node)) = all.iter().find(|(_, (name, _))| name == "scribe")?;
        names.iter().position(|name| name == node)
    };

    // Whether a node other than `i` that answers lists no node `i` now.
    let declared_lost = |nodes: &[Option<Binary>], i: usize| -> bool {
        (0..3)
            .filter(|&j| j != i)
            .filter_map(|j| nodes[j].as_ref())
            .any(|other| {
                let out = other.command(&["nodes", "--json"]).output().unwrap();
                out.status.success()
                    && serde_json::from_slice::<Value>(&out.stdout)
                        .ok()
                        .and_then(|seen| seen.as_array().cloned())
                        .is_some_and(|seen| !seen.iter().any(|n| n["name"] == names[i]))
            })
    };

    let mut acked: Vec<String> = Vec::new();
    let mut down: Option<(usize, Instant)> = None;
    let mut nats_down: Option<(usize, Instant)> = None;
    let mut paused: Option<(usize, Instant, std::process::Child)> = None;
    let mut faults = 0;
    let began = Instant::now();
    let mut next = 0;
    let mut seq = 0;
    while began.elapsed() < Duration::from_secs(24) {
        let at = began.elapsed();
        // The schedule.
        if at > Duration::from_secs(2) && faults == 0 {
            let i = running_scribe(&nodes, None).expect("scribe placed");
            let mut gone = nodes[i].take().unwrap();
            gone.child.kill().unwrap();
            gone.child.wait().unwrap();
            down = Some((i, Instant::now()));
            faults += 1;
        }
        if let Some((i, since)) = down
            && since.elapsed() > Duration::from_secs(4)
        {
            nodes[i] = Some(start(names[i]));
            down = None;
        }
        if at > Duration::from_secs(8) && faults == 1 {
            let leader = rt_mail_leader(&nats);
            nats.kill(leader);
            nats_down = Some((leader, Instant::now()));
            faults += 1;
        }
        if let Some((i, since)) = nats_down
            && since.elapsed() > Duration::from_secs(4)
        {
            nats.restart(i);
            nats_down = None;
        }
        // Once the agent is placed (not between two nodes).
        let placed = (at > Duration::from_secs(15) && faults == 2 && down.is_none())
            .then(|| running_scribe(&nodes, None))
            .flatten()
            .filter(|&i| nodes[i].is_some());
        if let Some(i) = placed {
            signal(nodes[i].as_ref().unwrap(), "STOP");
            // A send queued at its port while it is stopped.
            let queued = nodes[i]
                .as_ref()
                .unwrap()
                .command(&["send", "scribe", "from-the-paused-node"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            paused = Some((i, Instant::now(), queued));
            faults += 1;
        }
        // Resumed once past its TTL and once another node has declared it
        // lost (under load that can take longer than the TTL): a node
        // nobody declared lost is still a member, and may answer.
        let resume = paused.as_ref().is_some_and(|(i, since, _)| {
            if since.elapsed() <= Duration::from_millis(TTL_MS + 1_500) {
                return false;
            }
            assert!(
                since.elapsed() < Duration::from_secs(30),
                "node {} paused for 30 s and still listed",
                names[*i]
            );
            declared_lost(&nodes, *i)
        });
        if resume && let Some((i, _, queued)) = paused.take() {
            let mut node = nodes[i].take().unwrap();
            signal(&node, "CONT");
            let out = queued.wait_with_output().unwrap();
            assert_eq!(
                out.status.code(),
                Some(3),
                "a paused node answered: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                exit_code(&mut node, Duration::from_secs(10)),
                Some(3),
                "{}",
                node.log()
            );
            drop(node);
            nodes[i] = Some(start(names[i]));
        }
        // One send, through the next node that is up and not paused.
        let paused_now = paused.as_ref().map(|(i, _, _)| *i);
        let up: Vec<usize> = (0..3)
            .filter(|&i| nodes[i].is_some() && Some(i) != paused_now)
            .collect();
        let via = up[next % up.len()];
        next += 1;
        // A fresh payload per try: a refused send may have been kept
        // all the same (its answer lost), and then is handled too.
        let payload = format!("m-{seq:05}");
        seq += 1;
        let out = nodes[via]
            .as_ref()
            .unwrap()
            .command(&["send", "scribe", &payload])
            .output()
            .unwrap();
        if out.status.success() {
            acked.push(payload);
        }
    }
    for i in 0..3 {
        if nodes[i].is_none() {
            nodes[i] = Some(start(names[i]));
        }
    }
    if let Some((i, _)) = nats_down {
        nats.restart(i);
    }
    assert!(acked.len() > 100, "only {} sends acknowledged", acked.len());

    // The checker: every acknowledged message handled, few twice.
    let handled = || -> std::collections::HashMap<String, usize> {
        let mut seen = std::collections::HashMap::new();
        for name in names {
            let logs = root.path().join(name).join("data").join("logs");
            for file in std::fs::read_dir(&logs).into_iter().flatten().flatten() {
                let text = std::fs::read_to_string(file.path()).unwrap_or_default();
                for line in text.lines() {
                    if let Some(payload) = line.rsplit(": ").next()
                        && payload.starts_with("m-")
                        && line.contains(" message ")
                    {
                        *seen.entry(payload.to_owned()).or_insert(0) += 1;
                    }
                }
            }
        }
        seen
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let seen = loop {
        let seen = handled();
        let lost: Vec<&String> = acked.iter().filter(|p| !seen.contains_key(*p)).collect();
        if lost.is_empty() {
            break seen;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} acknowledged messages never handled: {:?}",
            lost.len(),
            acked.len(),
            &lost[..lost.len().min(20)]
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let twice: Vec<(&String, &usize)> = seen.iter().filter(|(_, n)| **n > 1).collect();
    if let Some((payload, _)) = twice.first() {
        for name in names {
            let logs = root.path().join(name).join("data").join("logs");
            for file in std::fs::read_dir(&logs).into_iter().flatten().flatten() {
                let text = std::fs::read_to_string(file.path()).unwrap_or_default();
                for line in text.lines().filter(|line| line.ends_with(payload.as_str())) {
                    eprintln!("{name} {}: {line}", file.path().display());
                }
            }
        }
    }
    eprintln!(
        "{} acknowledged, all handled; {} handled more than once: {twice:?}",
        acked.len(),
        twice.len()
    );
    // At least once: what the agent's node handled and had not yet taken
    // out of the stream when it was killed or paused comes again where the
    // agent starts next. A node hands its agents no more acknowledged mail
    // while 16 deletes wait for the stream (its leader lost), so each of
    // the two losses hands at most that many, and the one message the
    // agent had taken and not yet acknowledged, over again; the agent
    // moved twice, so none comes a third time.
    assert_eq!(faults, 3);
    assert!(
        twice.len() <= 2 * (16 + 2),
        "{} handled twice: more than two node losses leave in the stream",
        twice.len()
    );
    assert!(
        seen.values().all(|times| *times <= 2),
        "handled three times or more: {:?}",
        seen.iter().filter(|(_, n)| **n > 2).collect::<Vec<_>>()
    );
    wait_for_nodes(nodes[0].as_ref().unwrap(), &names, Duration::from_secs(15));
}

/// A config with the permanent `exec` config agent `scribe`: the Python
/// SDK's echo agent, acknowledging each message after `delay_ms`.
fn scribe_config(python: &Path, delay_ms: u64) -> String {
    let agent = hivekernel_tests::exec::python_examples().join("echo_agent.py");
    config_of(json!([{
        "name": "scribe", "role": "agent", "runtime": "exec",
        "command": [python, agent],
        "env": { "PYTHONUNBUFFERED": "1", "ECHO_DELAY_MS": delay_ms.to_string() },
        "restart": { "policy": "permanent", "backoff_ms": [200, 1000] }
    }]))
}

/// The index of the NATS server leading `HK_MAIL`.
fn rt_mail_leader(nats: &NatsCluster) -> usize {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = rt.block_on(async {
        let client = nats.client(0).await.unwrap();
        let js = async_nats::jetstream::new(client);
        let mut stream = js.get_stream("HK_MAIL").await.unwrap();
        let info = stream.info().await.unwrap();
        info.cluster
            .as_ref()
            .and_then(|c| c.leader.clone())
            .expect("HK_MAIL has a leader")
    });
    (0..nats.servers())
        .find(|&i| nats.name(i) == leader)
        .unwrap()
}

#[test]
fn a_second_node_under_a_live_name_is_refused() {
    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let a = flagged(&bin, root.path(), &nats, "a");
    let urls = nats.urls();
    let (code, stderr) = start_fails(
        &bin,
        &root.path().join("a2"),
        &config(Some(json!({
            "servers": [urls],
            "heartbeat_ms": HEARTBEAT_MS,
            "node_ttl_ms": TTL_MS
        }))),
        &["--node", "a"],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("node name \"a\" is taken by a live node")
            && stderr.contains(a.addr.trim_end_matches('/')),
        "{stderr}"
    );
    // The live node never noticed.
    assert_eq!(names(&nodes(&a)), BTreeSet::from(["a".to_owned()]));
    assert!(!a.log().contains("fenced"), "{}", a.log());
}

#[test]
fn a_restarted_node_takes_over_its_crashed_record() {
    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let mut a = flagged(&bin, root.path(), &nats, "a");
    let first = nodes(&a)[0]["epoch"].as_u64().unwrap();
    let greeter = pids(&a);
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    // Alone, nobody declares it lost: its restart waits out the TTL itself.
    let started = Instant::now();
    let a = Binary::start_with(
        &bin,
        &root.path().join("a"),
        &["--cluster", &nats.urls(), "--node", "a"],
    );
    assert!(started.elapsed() >= Duration::from_millis(TTL_MS / 2));
    let seen = nodes(&a);
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0]["epoch"].as_u64().unwrap() > first);
    assert!(a.log().contains("waiting up to the TTL"), "{}", a.log());
    // Its processes came back from its own store, under their PIDs.
    assert_eq!(pids(&a), greeter);
}

/// Only a node writes its own record, and each heartbeat counts one more
/// beat: a record written again as it stood (a lagging replica's answer,
/// a replay by a holder of NATS credentials) is no sign of life. A
/// crashed node whose record keeps being rewritten starts again after
/// the TTL instead of being refused as "taken by a live node" for good.
#[test]
fn a_record_rewritten_without_a_beat_does_not_lock_its_node_out() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let mut a = flagged(&bin, root.path(), &nats, "a");
    let first = nodes(&a)[0]["epoch"].as_u64().unwrap();
    a.child.kill().unwrap();
    a.child.wait().unwrap();

    // The dead start's record, put back as it is every 100 ms.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt.block_on(nats.client(0)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let rewrites = Arc::new(AtomicUsize::new(0));
    let rewriter = {
        let (stop, rewrites) = (stop.clone(), rewrites.clone());
        rt.spawn(async move {
            let js = async_nats::jetstream::new(client);
            let bucket = js.get_key_value("hk_nodes").await.unwrap();
            let value = bucket.get("a").await.unwrap().unwrap();
            while !stop.load(Ordering::Relaxed) {
                bucket.put("a", value.clone()).await.unwrap();
                rewrites.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let dir = root.path().join("a");
    let started = Instant::now();
    let a = Binary::start_with(&bin, &dir, &["--cluster", &nats.urls(), "--node", "a"]);
    stop.store(true, Ordering::Relaxed);
    rt.block_on(rewriter).unwrap();
    assert!(
        rewrites.load(Ordering::Relaxed) >= 5,
        "the record was rewritten only {} times",
        rewrites.load(Ordering::Relaxed)
    );
    assert!(started.elapsed() >= Duration::from_millis(TTL_MS / 2));
    let seen = nodes(&a);
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0]["epoch"].as_u64().unwrap() > first, "{seen:?}");
    assert!(!a.log().contains("taken by a live node"), "{}", a.log());
}

/// `nodes forget NAME`, through NATS with no node asked: refused while
/// the node beats; for a node gone, its start is claimed lost and its
/// record removed, so the name starts again without waiting out the TTL.
#[test]
fn nodes_forget_frees_a_gone_nodes_name_and_never_a_live_ones() {
    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let mut a = flagged(&bin, root.path(), &nats, "a");
    let b = flagged(&bin, root.path(), &nats, "b");
    wait_for_nodes(&b, &["a", "b"], Duration::from_secs(10));
    let epoch = nodes(&a)
        .iter()
        .find(|n| n["name"] == "a")
        .and_then(|n| n["epoch"].as_u64())
        .unwrap();
    let forget = |name: &str| {
        let config = root.path().join("a/config.json");
        let out = Command::new(&bin)
            .args(["nodes", "forget", name, "--config"])
            .arg(&config)
            .args(["--cluster", &nats.urls()])
            .current_dir(root.path().join("a"))
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };

    // A live node: refused, and nothing changes.
    let (code, _, stderr) = forget("b");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("node \"b\" is alive"), "{stderr}");
    // No such node.
    let (code, _, stderr) = forget("zz");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("no record"), "{stderr}");
    // Neither is bad input taken quietly.
    let out = Command::new(&bin)
        .args(["nodes", "forget", "a"])
        .env_remove("HIVEKERNEL_CLUSTER")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--cluster"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // a, paused: b judges it after the TTL... but a forget just after
    // the pause is refused by the heartbeat's age alone.
    signal(&a, "STOP");
    let (code, _, stderr) = forget("a");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("last heartbeat was"), "{stderr}");
    signal(&a, "CONT");
    drop(b);
    // b gone too; a killed: nobody judges a, and its record stays.
    wait_for_nodes(&a, &["a"], Duration::from_secs(10));
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(TTL_MS + 200));
    let (code, stdout, stderr) = forget("a");
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!("forgot node a (epoch {epoch}")),
        "{stdout}"
    );
    // The claim a's old start would find, should it run on.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let claimed = rt.block_on(async {
        let js = async_nats::jetstream::new(nats.client(0).await.unwrap());
        let claims = js.get_key_value("hk_claims").await.unwrap();
        claims.get(format!("lost.a.{epoch}")).await.unwrap()
    });
    assert!(claimed.is_some(), "no claim of a's loss");
    // Its next start registers at once.
    let a = Binary::start_with(
        &bin,
        &root.path().join("a"),
        &["--cluster", &nats.urls(), "--node", "a"],
    );
    assert!(!a.log().contains("waiting up to the TTL"), "{}", a.log());
    assert!(nodes(&a)[0]["epoch"].as_u64().unwrap() > epoch);
}

/// A `temporary` process that another node reported ended when it judged
/// its node lost stays dead when that node starts again with its data
/// directory: its `exited` event was published already, and nothing of
/// it runs again.
#[test]
fn a_temporary_process_declared_dead_stays_dead_when_its_node_returns() {
    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let mut a = flagged(&bin, root.path(), &nats, "a");
    let b = flagged(&bin, root.path(), &nats, "b");
    wait_for_nodes(&b, &["a", "b"], Duration::from_secs(10));
    let temporary = spawned_pid(&spawn_on(&a, 1, "short", "a", &["--restart", "temporary"]));
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    // b judges the loss: the temporary process ended with its node.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let ended = events_of(&b, "exited")
            .iter()
            .any(|(pid, _)| *pid == temporary);
        if ended {
            break;
        }
        assert!(Instant::now() < deadline, "{}", b.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let a = Binary::start_with(
        &bin,
        &root.path().join("a"),
        &["--cluster", &nats.urls(), "--node", "a"],
    );
    wait_for_nodes(&a, &["a", "b"], Duration::from_secs(10));
    let all = everyone(&a);
    assert!(!all.contains_key(&temporary), "{all:?}\n{}", a.log());
    assert!(
        a.log().contains("declared this node's earlier start lost"),
        "{}",
        a.log()
    );
    // One `exited` event of it in the cluster: b's, not another from a.
    let exits = events_of(&a, "exited")
        .into_iter()
        .filter(|(pid, _)| *pid == temporary)
        .count();
    assert_eq!(exits, 1, "{}", a.log());
}

/// Message ids are unique across the cluster: sends entering at either
/// node, to processes on either, never share an id (each start of a
/// node draws from its own range), so no receiver that deduplicates or
/// acknowledges by id mistakes one message for another.
#[test]
fn message_ids_are_unique_across_the_nodes() {
    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let a = flagged(&bin, root.path(), &nats, "a");
    let b = flagged(&bin, root.path(), &nats, "b");
    wait_for_nodes(&a, &["a", "b"], Duration::from_secs(10));
    let on_a = spawned_pid(&spawn_on(&a, 1, "echo-a", "a", &[]));
    let on_b = spawned_pid(&spawn_on(&a, 1, "echo-b", "b", &[]));
    let mut ids = BTreeSet::new();
    for kernel in [&a, &b] {
        for target in [on_a, on_b] {
            for i in 0..3 {
                let out = kernel.cli(&["send", &target.to_string(), &format!("m{i}")]);
                let id: u64 = out.trim().parse().unwrap_or_else(|_| panic!("{out}"));
                assert!(ids.insert(id), "id {id} given twice: {ids:?}");
            }
        }
    }
    assert_eq!(ids.len(), 12);
}

#[test]
fn bad_cluster_settings_are_refused_with_what_is_wrong() {
    let bin = binary();
    let root = tempfile::tempdir().unwrap();
    // Name, kernel.cluster, flags, exit code, what stderr says.
    type Case<'a> = (&'a str, Option<Value>, &'a [&'a str], i32, &'a str);
    let cases: [Case<'_>; 6] = [
        (
            "scheme",
            None,
            &["--cluster", "http://127.0.0.1:4222"],
            2,
            "--cluster \"http://127.0.0.1:4222\" has scheme \"http\" (expected nats:// or tls://)",
        ),
        (
            "no-port",
            None,
            &["--cluster", "nats://127.0.0.1"],
            2,
            "names no port",
        ),
        (
            "node-alone",
            None,
            &["--node", "a"],
            2,
            "--node names this kernel's node in a cluster: give --cluster",
        ),
        (
            "node-name",
            None,
            &["--cluster", "nats://127.0.0.1:4222", "--node", "a.b"],
            2,
            "may hold only ASCII letters, digits, '-' and '_'",
        ),
        (
            "heartbeat",
            Some(json!({ "servers": ["nats://127.0.0.1:4222"], "node": "a", "heartbeat_ms": 5 })),
            &[],
            2,
            "kernel.cluster.heartbeat_ms",
        ),
        (
            "unreachable",
            None,
            &["--cluster", "nats://127.0.0.1:1", "--node", "a"],
            1,
            "cannot reach NATS at nats://127.0.0.1:1",
        ),
    ];
    for (name, cluster, extra, code, expected) in cases {
        let (got, stderr) = start_fails(&bin, &root.path().join(name), &config(cluster), extra);
        assert_eq!(got, Some(code), "{name}: {stderr}");
        assert!(stderr.contains(expected), "{name}: {stderr}");
        // Nothing was started: no address published.
        assert!(!root.path().join(name).join("data/kernel.addr").exists());
    }
    // A kernel alone says so when asked for nodes.
    let alone = node(&bin, root.path(), "alone", &config(None), &[]);
    let out = alone.command(&["nodes"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a node of a cluster"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn signal(kernel: &Binary, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &kernel.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Spawns beyond a PID block on two nodes at once: every node fetches
/// blocks while the other does, by compare-and-set on one counter, and no
/// PID is handed out twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawns_racing_on_two_nodes_past_their_blocks_never_share_a_pid() {
    const SPAWNS: usize = 1_300;
    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let config = {
        let mut config: Value = serde_json::from_str(&config(Some(json!({
            "servers": [nats.urls()],
            "heartbeat_ms": HEARTBEAT_MS,
            "node_ttl_ms": 5_000
        }))))
        .unwrap();
        config["kernel"]["max_children"] = json!(5_000);
        config.to_string()
    };
    let nodes: Vec<Binary> = ["a", "b"]
        .iter()
        .map(|name| node(&bin, root.path(), name, &config, &["--node", name]))
        .collect();
    let mut clients = Vec::new();
    for kernel in &nodes {
        let token = std::fs::read_to_string(kernel.dir.join("data/admin.token")).unwrap();
        let channel = tonic::transport::Channel::from_shared(kernel.addr.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        clients.push(KernelClient::with_interceptor(
            channel,
            Bearer::new(token.trim()),
        ));
    }
    let spawn_all = |client: KernelClient<_>| async move {
        futures::stream::iter(0..SPAWNS)
            .map(|i| {
                let mut client = client.clone();
                async move {
                    client
                        .spawn(pb::SpawnRequest {
                            parent: 1,
                            name: format!("w{i}"),
                            runtime: "echo".into(),
                            ..Default::default()
                        })
                        .await
                        .unwrap()
                        .into_inner()
                        .pid
                }
            })
            .buffer_unordered(32)
            .collect::<Vec<u64>>()
            .await
    };
    let mut clients = clients.into_iter();
    let (a, b) = (clients.next().unwrap(), clients.next().unwrap());
    let (on_a, on_b) = tokio::join!(spawn_all(a), spawn_all(b));
    for (name, pids) in [("a", &on_a), ("b", &on_b)] {
        let distinct: BTreeSet<u64> = pids.iter().copied().collect();
        assert_eq!(distinct.len(), SPAWNS, "{name} handed out a PID twice");
        // More than one block of 1,024 was used.
        let span = distinct.last().unwrap() - distinct.first().unwrap();
        assert!(span >= 1_024, "{name}: {span}");
    }
    let both: BTreeSet<u64> = on_a.iter().chain(&on_b).copied().collect();
    assert_eq!(both.len(), 2 * SPAWNS, "a PID handed out on both nodes");
    // And the config agent, on the first node to claim it.
    let held: Vec<usize> = nodes.iter().map(|kernel| pids(kernel).len()).collect();
    assert_eq!(held, [SPAWNS + 1, SPAWNS], "processes per node");
}

/// One tree over three nodes: `ps`, `ps --tree`, `describe`, names and
/// paths from any node show every node's processes, each read from the
/// node holding it; a process whose spawn was answered is found from every
/// node at once; exits, a lost node and a node that stops leave nothing
/// behind in the directory; a peer's unreadable request is refused with
/// what is wrong.
#[test]
fn the_tree_spans_the_nodes_and_every_node_reads_all_of_it() {
    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    // Unsigned: requests are sent below as a peer node would send them.
    let a = flagged_unsigned(&bin, root.path(), &nats, "a");
    let mut b = flagged_unsigned(&bin, root.path(), &nats, "b");
    let mut c = flagged_unsigned(&bin, root.path(), &nats, "c");
    wait_for_nodes(&a, &["a", "b", "c"], Duration::from_secs(10));

    let lead = spawn(&b, 1, "lead-b", "lead");
    let worker = spawn(&b, lead, "worker-b", "worker");
    let solo = spawn(&c, 1, "solo-c", "worker");
    // Answered on b, found on a at once: the spawn waited for its listing.
    let described = a.cli(&["describe", &worker.to_string()]);
    assert!(
        described.contains(&format!("{worker} (parent {lead})"))
            && described.contains("Node:         b")
            && described.contains("worker-b"),
        "{described}"
    );

    // Every node's processes, from any node, each with its node.
    for kernel in [&a, &b, &c] {
        wait_for_ps(kernel, "the whole cluster", |seen| {
            seen.get(&lead) == Some(&("lead-b".into(), "b".into()))
                && seen.get(&worker) == Some(&("worker-b".into(), "b".into()))
                && seen.get(&solo) == Some(&("solo-c".into(), "c".into()))
                // A config agent runs once in the cluster: on the first
                // node to claim it.
                && seen
                    .values()
                    .filter(|(name, _)| name == "greeter")
                    .map(|(_, node)| node.as_str())
                    .collect::<Vec<_>>()
                    == ["a"]
        });
    }
    let tree = a.cli(&["ps", "--tree"]);
    let lines: Vec<&str> = tree.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains(&format!("lead-b ({lead}) lead/")))
        .unwrap_or_else(|| panic!("{tree}"));
    assert!(lines[at].ends_with("@b"), "{tree}");
    assert!(
        lines[at + 1].contains(&format!("└─ worker-b ({worker})")) && lines[at + 1].ends_with("@b"),
        "{tree}"
    );
    // PID 1 is every node's kernel: its children are every node's.
    let shown = a.json(&["ps", "--json"]);
    let kernel = shown
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == 1)
        .unwrap();
    assert_eq!(kernel["children"], 3, "{shown}");
    let table = a.cli(&["ps"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header[2..4], ["NAME", "NODE"], "{table}");
    // A subtree rooted on another node.
    let under: Vec<u64> = a
        .json(&["ps", "--root", &lead.to_string(), "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(under, [lead, worker]);
    // Names and paths are looked up across the nodes.
    assert!(a.cli(&["describe", "solo-c"]).contains("Node:         c"));
    assert!(
        a.cli(&["describe", "lead-b/worker-b"])
            .contains(&format!("PID:          {worker}"))
    );
    assert!(c.cli(&["describe", "greeter"]).contains("Node:         a"));
    let out = a.command(&["describe", "999999"]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("process 999999 not found"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    let peer = rt.block_on(nats.client(0)).unwrap();
    // A peer's request a node cannot read is refused, naming what is wrong.
    for (payload, expected) in [
        (&b"{not json"[..], "unreadable cluster request"),
        (
            &br#"{"from_node":"x","epoch":1,"op":"fly","args":{}}"#[..],
            "unknown variant `fly`",
        ),
    ] {
        let answer = rt
            .block_on(peer.request("hk.node.a.rpc", bytes::Bytes::from_static(payload)))
            .unwrap();
        let answer: Value = serde_json::from_slice(&answer.payload).unwrap();
        assert_eq!(answer["error"]["kind"], "invalid_argument", "{answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains(expected),
            "{answer}"
        );
    }
    let too_many: Vec<u64> = (1..=201).collect();
    let request = json!({"from_node": "x", "epoch": 1, "op": "get", "args": {"pids": too_many}});
    let answer = rt
        .block_on(peer.request("hk.node.a.rpc", request.to_string().into()))
        .unwrap();
    let answer: Value = serde_json::from_slice(&answer.payload).unwrap();
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 200"),
        "{answer}"
    );

    // A node this one does not see live (declared lost, or no node at
    // all) may read, but acts on nothing.
    let request =
        json!({"from_node": "x", "epoch": 1, "op": "kill", "args": {"pid": lead, "reason": ""}});
    let answer = rt
        .block_on(peer.request("hk.node.b.rpc", request.to_string().into()))
        .unwrap();
    let answer: Value = serde_json::from_slice(&answer.payload).unwrap();
    assert_eq!(answer["error"]["kind"], "failed_precondition", "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("node x (epoch 1) is not a live node"),
        "{answer}"
    );
    assert!(everyone(&b).contains_key(&lead));

    // Every process is listed in the directory, PID 1 never.
    let all = rt.block_on(listed(&peer));
    assert!(
        all.is_superset(&BTreeSet::from([lead, worker, solo])) && !all.contains(&1),
        "{all:?}"
    );
    assert_eq!(all.len(), 4, "{all:?}");

    // An operator of any node acts on any node's processes: a task, a
    // message, a kill asked of a run on b.
    let answer = a.cli(&["exec", "lead-b/worker-b", "ping from a"]);
    assert!(answer.contains("ping from a"), "{answer}");
    let answer = a.cli(&["exec", &solo.to_string(), "timed", "--timeout", "5"]);
    assert!(answer.contains("timed"), "{answer}");
    // A ping sent from a reaches worker-b, whose pong comes back to b's kernel.
    a.cli(&["send", &worker.to_string(), "ping from a", "--type", "ping"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let events = b.cli(&[
            "events",
            "--since",
            "0",
            "--json",
            "--type",
            "kernel_message",
        ]);
        if events.contains("ping from a") && events.contains("pong") {
            break;
        }
        assert!(Instant::now() < deadline, "no pong on b: {events}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A send to a PID nobody holds says so, as on one node.
    let out = a.command(&["send", "999999", "x"]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not found"),
        "{out:?}"
    );
    // A restart and a wait asked of a run on the node holding the process.
    let restarted = a.cli(&["restart", &worker.to_string()]);
    assert!(
        restarted.contains(&format!("restarted {worker} (restart 1)")),
        "{restarted}"
    );
    let out = a
        .command(&["wait", &solo.to_string(), "--timeout", "1"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains(&format!("process {solo} still running after 1000 ms")),
        "{out:?}"
    );
    // An exit on b, asked of a, leaves a's view and the directory.
    let killed = a.cli(&["kill", &lead.to_string()]);
    assert!(
        !b.json(&["ps", "--json"])
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["pid"] == lead),
        "{killed}"
    );
    wait_for_ps(&a, "the killed subtree gone", |seen| {
        !seen.contains_key(&lead) && !seen.contains_key(&worker)
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while rt.block_on(listed(&peer)).contains(&worker) {
        assert!(Instant::now() < deadline, "worker-b still listed");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Its exit record is collected from a, on b.
    let exit = a.json(&["wait", &lead.to_string(), "--json", "--timeout", "5"]);
    assert_eq!(exit["pid"], lead, "{exit}");
    assert_eq!(exit["exit_code"], 137, "{exit}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while rt.block_on(listed(&peer)).contains(&lead) {
        assert!(
            Instant::now() < deadline,
            "lead-b still listed once collected"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // kill -9 of c: once declared lost, its processes leave every view,
    // and its listings the directory.
    c.child.kill().unwrap();
    c.child.wait().unwrap();
    wait_for_nodes(&a, &["a", "b"], Duration::from_secs(10));
    assert!(everyone(&a).values().all(|(_, node)| node != "c"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while rt.block_on(listed(&peer)).contains(&solo) {
        assert!(Instant::now() < deadline, "solo-c still listed");
        std::thread::sleep(Duration::from_millis(50));
    }

    // A node that stops removes its listings as it leaves.
    assert!(b.terminate().success());
    wait_for_nodes(&a, &["a"], Duration::from_secs(10));
    let left = rt.block_on(listed(&peer));
    let mine: BTreeSet<u64> = pids(&a).into_iter().collect();
    assert_eq!(left, mine, "only a's listings are left");
}

/// How many live children `kernel`'s `ps` counts for `pid` (its node's
/// count, wherever they live).
fn live_children(kernel: &Binary, pid: u64) -> u64 {
    let shown = kernel.json(&["ps", "--json"]);
    let found = shown.as_array().unwrap().iter().find(|p| p["pid"] == pid);
    found.map_or(0, |p| p["children"].as_u64().unwrap())
}

/// Spawns `name` (echo) under `parent` on `node`, asked of `kernel`, with
/// `extra` arguments; what the CLI did.
fn spawn_on(
    kernel: &Binary,
    parent: u64,
    name: &str,
    node: &str,
    extra: &[&str],
) -> std::process::Output {
    let parent = parent.to_string();
    let mut args = vec![
        "spawn",
        "--parent",
        &parent,
        "--name",
        name,
        "--runtime",
        "echo",
        "--node",
        node,
        "--json",
    ];
    args.extend_from_slice(extra);
    kernel.command(&args).output().unwrap()
}

/// The process token an `exec` command wrote to `file`, once it is there
/// (within 10 s; `kernel`'s log otherwise).
fn written_token(file: &Path, kernel: &Binary) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match std::fs::read_to_string(file) {
            Ok(token) if !token.is_empty() => return token,
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "no token written\n{}",
            kernel.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The PID a successful `spawn --json` answered.
fn spawned_pid(out: &std::process::Output) -> u64 {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    answer["pid"].as_u64().unwrap()
}

/// A tree spread over three nodes: a parent on a with children on b and
/// c, and a grandchild on c under the child on b. The spawn rules hold
/// across the nodes (the parent's child count, its tier, its budget, each
/// refused spawn leaving nothing held); a child's exit frees its parent's
/// slot on the parent's node; a kill of the top, asked of another node,
/// ends the whole subtree on every node, leaves first, and leaves no
/// zombie anywhere.
#[test]
fn a_subtree_spans_the_nodes_and_ends_whole_leaves_first() {
    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let config = config_of(json!([
        { "name": "boss", "role": "agent", "runtime": "echo", "node": "a",
          "limits": { "max_children": 2 } },
        { "name": "banker", "role": "agent", "runtime": "echo", "node": "a",
          "limits": { "max_tokens_total": 100000 } }
    ]));
    let start = |name: &str| member(&bin, root.path(), &nats, name, &config);
    let a = start("a");
    let b = start("b");
    let c = start("c");
    wait_for_nodes(&c, &["a", "b", "c"], Duration::from_secs(10));
    wait_for_ps(&c, "the config agents on a", |seen| {
        ["boss", "banker"]
            .iter()
            .all(|name| seen.values().any(|(n, node)| n == name && node == "a"))
    });
    let pid_named = |name: &str| -> u64 {
        let seen = everyone(&c);
        *seen.iter().find(|(_, (n, _))| n == name).unwrap().0
    };
    let (boss, banker) = (pid_named("boss"), pid_named("banker"));
    let refused = |out: &std::process::Output, expected: &str| {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(expected),
            "expected {expected:?}: {stderr}\n{}",
            a.log()
        );
    };

    // A child on b, asked of c: boss on a lends it what it takes.
    let w_b = spawned_pid(&spawn_on(&c, boss, "w-b", "b", &[]));
    let info = a.json(&["describe", &w_b.to_string(), "--json"]);
    assert_eq!(
        (info["node"].as_str(), &info["ppid"]),
        (Some("b"), &json!(boss)),
        "{info}"
    );
    // Refused on c (a tier above its parent's): nothing starts, and the
    // slot a held for it is freed, so the next child fits.
    let before = everyone(&a).len();
    refused(
        &spawn_on(&b, boss, "too-high", "c", &["--tier", "strategic"]),
        "cognitive tier strategic is above the parent's tier operational",
    );
    assert_eq!(everyone(&a).len(), before);
    let w_c = spawned_pid(&spawn_on(&b, boss, "w-c", "c", &[]));
    // Its children are counted on its node, wherever they live.
    let full = format!("process {boss} has 2 live children (max_children 2)");
    refused(&spawn_on(&a, boss, "third", "b", &[]), &full);
    let boss_s = boss.to_string();
    let local = a
        .command(&[
            "spawn",
            "--parent",
            &boss_s,
            "--name",
            "third",
            "--runtime",
            "echo",
        ])
        .output()
        .unwrap();
    refused(&local, &full);
    // A budget does not reach another node.
    refused(
        &spawn_on(&a, banker, "spender", "b", &[]),
        &format!("process {banker} draws on the token budget of process {banker}"),
    );
    // A grandchild on c, under the child on b.
    let g_c = spawned_pid(&spawn_on(&a, w_b, "g-c", "c", &[]));
    for kernel in [&a, &b, &c] {
        wait_for_ps(kernel, "the tree across the nodes", |seen| {
            seen.get(&w_b) == Some(&("w-b".into(), "b".into()))
                && seen.get(&w_c) == Some(&("w-c".into(), "c".into()))
                && seen.get(&g_c) == Some(&("g-c".into(), "c".into()))
        });
    }
    let tree = b.cli(&["ps", "--tree", "--root", &boss_s]);
    let lines: Vec<&str> = tree.lines().collect();
    assert_eq!(lines.len(), 4, "{tree}");
    assert!(
        lines[0].contains(&format!("boss ({boss})")) && lines[0].ends_with("@a"),
        "{tree}"
    );
    assert!(
        lines[1].contains(&format!("w-b ({w_b})")) && lines[1].ends_with("@b"),
        "{tree}"
    );
    assert!(
        lines[2].contains(&format!("g-c ({g_c})")) && lines[2].ends_with("@c"),
        "{tree}"
    );
    assert!(
        lines[3].contains(&format!("w-c ({w_c})")) && lines[3].ends_with("@c"),
        "{tree}"
    );
    assert_eq!(live_children(&c, boss), 2);

    // The child on c exits: its notice reaches boss's node, which frees
    // its slot, and a third child fits again.
    c.cli(&["kill", &w_c.to_string()]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let third = loop {
        let out = spawn_on(&a, boss, "third", "b", &[]);
        if out.status.success() {
            break spawned_pid(&out);
        }
        refused(&out, &full);
        assert!(
            Instant::now() < deadline,
            "boss's slot never freed\n{}",
            a.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };

    // A kill of boss, asked of b, ends its subtree on every node, leaves
    // first, and leaves no zombie anywhere.
    let killed = b.cli(&["kill", &boss_s]);
    // It names every process that exited, on every node.
    for pid in [boss, w_b, g_c] {
        assert!(killed.contains(&pid.to_string()), "{pid}: {killed}");
    }
    let gone = [boss, w_b, g_c, third];
    for kernel in [&a, &b, &c] {
        wait_for_ps(kernel, "the subtree gone from every node", |seen| {
            gone.iter().all(|pid| !seen.contains_key(pid))
        });
    }
    // When each exited, from the events of every node (one clock here).
    let deadline = Instant::now() + Duration::from_secs(10);
    let exited = loop {
        let exited: std::collections::BTreeMap<u64, u64> = a
            .cli(&["events", "--since", "0", "--json", "--type", "exited"])
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter_map(|event| Some((event["pid"].as_u64()?, event["at_unix_ms"].as_u64()?)))
            .filter(|(pid, _)| gone.contains(pid))
            .collect();
        if exited.len() == gone.len() {
            break exited;
        }
        assert!(Instant::now() < deadline, "{exited:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        exited[&g_c] <= exited[&w_b]
            && exited[&w_b] <= exited[&boss]
            && exited[&third] <= exited[&boss],
        "{exited:?}"
    );
}

/// Children on another node than their parent's, when that node dies
/// (kill -9): one that may move (permanent, under a parent that moves)
/// starts again on a live node its placement admits, as the same PID and
/// still its parent's child; one that does not (temporary) ended with the
/// node, and its parent's node frees its slot. A kill of the parent then
/// reaches the moved child where it runs now.
#[test]
fn children_on_a_lost_node_move_or_end_and_their_parent_keeps_count() {
    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let plain = config_of(json!([]));
    let mut pooled: Value = serde_json::from_str(&plain).unwrap();
    pooled["kernel"]["cluster"]["labels"] = json!({ "pool": "x" });
    let pooled = pooled.to_string();
    let a = member(&bin, root.path(), &nats, "a", &plain);
    let mut pool = std::collections::BTreeMap::from([
        ("b", member(&bin, root.path(), &nats, "b", &pooled)),
        ("c", member(&bin, root.path(), &nats, "c", &pooled)),
    ]);
    wait_for_nodes(&a, &["a", "b", "c"], Duration::from_secs(10));
    let spawn = |args: &[&str]| -> u64 {
        let mut all = vec!["spawn", "--runtime", "echo", "--json"];
        all.extend_from_slice(args);
        spawned_pid(&a.command(&all).output().unwrap())
    };
    let lead = spawn(&[
        "--parent",
        "1",
        "--name",
        "lead",
        "--node",
        "a",
        "--restart",
        "permanent",
    ]);
    let lead_s = lead.to_string();
    let mover = spawn(&[
        "--parent",
        &lead_s,
        "--name",
        "mover",
        "--where",
        "pool=x",
        "--restart",
        "permanent",
    ]);
    let first = a.json(&["describe", &mover.to_string(), "--json"])["node"]
        .as_str()
        .unwrap()
        .to_owned();
    let other = if first == "b" { "c" } else { "b" };
    let stayer = spawn(&[
        "--parent",
        &lead_s,
        "--name",
        "stayer",
        "--node",
        &first,
        "--restart",
        "temporary",
    ]);
    let children = |kernel: &Binary| live_children(kernel, lead);
    assert_eq!(children(&a), 2);

    let lost = pool.get_mut(first.as_str()).unwrap();
    lost.child.kill().unwrap();
    lost.child.wait().unwrap();
    let survivor = &pool[other];
    wait_for_ps(&a, "the mover on the survivor, the stayer gone", |seen| {
        seen.get(&mover) == Some(&("mover".into(), other.into())) && !seen.contains_key(&stayer)
    });
    let info = survivor.json(&["describe", &mover.to_string(), "--json"]);
    assert_eq!(info["ppid"], lead, "{info}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while children(&a) != 1 {
        assert!(Instant::now() < deadline, "{}\n{}", children(&a), a.log());
        std::thread::sleep(Duration::from_millis(100));
    }

    // A kill of the parent, asked of the survivor, ends the moved child there.
    survivor.cli(&["kill", &lead_s]);
    for kernel in [&a, survivor] {
        wait_for_ps(kernel, "the subtree gone", |seen| {
            !seen.contains_key(&lead) && !seen.contains_key(&mover)
        });
    }
}

/// Every event of `kind` that `kernel` replays now, as (pid, node).
fn events_of(kernel: &Binary, kind: &str) -> Vec<(u64, String)> {
    kernel
        .cli(&["events", "--since", "0", "--json", "--type", kind])
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|event| {
            let node = event["node"].as_str().unwrap_or_default().to_owned();
            Some((event["pid"].as_u64()?, node))
        })
        .collect()
}

/// Supervision across nodes: a child on b that fails restarts on b, and
/// its parent's `one_for_all` strategy, on a, restarts its sibling there;
/// once the child passes its restart intensity, its parent on a fails
/// with it, and its own policy restarts it.
#[test]
fn a_parent_supervises_its_children_on_another_node() {
    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let a = flagged(&bin, root.path(), &nats, "a");
    let b = flagged(&bin, root.path(), &nats, "b");
    wait_for_nodes(&a, &["a", "b"], Duration::from_secs(10));
    let spawn = |args: &[&str]| -> u64 {
        let mut all = vec!["spawn", "--json", "--restart", "permanent"];
        all.extend_from_slice(args);
        spawned_pid(&a.command(&all).output().unwrap())
    };
    let sup = spawn(&[
        "--parent",
        "1",
        "--name",
        "sup",
        "--runtime",
        "echo",
        "--node",
        "a",
        "--strategy",
        "one_for_all",
    ]);
    let sup_s = sup.to_string();
    let sibling = spawn(&["--parent", &sup_s, "--name", "steady", "--runtime", "echo"]);
    // A command that fails as it starts, again at each restart.
    let failing = spawn(&[
        "--parent", &sup_s, "--name", "failing", "--node", "b", "--", "sh", "-c", "exit 3",
    ]);
    assert_eq!(
        a.json(&["describe", &failing.to_string(), "--json"])["node"],
        "b"
    );

    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let restarted = events_of(&a, "restarted");
        let escalated = events_of(&a, "escalated");
        let failing_restarts = restarted.iter().filter(|(pid, _)| *pid == failing).count();
        let steady_restarted = restarted.contains(&(sibling, "a".to_owned()));
        let sup_restarted = restarted.contains(&(sup, "a".to_owned()));
        if failing_restarts >= 1
            && restarted.contains(&(failing, "b".to_owned()))
            && steady_restarted
            && escalated.contains(&(sup, "b".to_owned()))
            && sup_restarted
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "restarted {restarted:?}, escalated {escalated:?}\n{}\n{}",
            a.log(),
            b.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The failed child stayed dead and its parent was told; its parent,
    // restarted, starts without its former subtree.
    let info = a.json(&["describe", &sup_s, "--json"]);
    assert!(info["restarts"].as_u64().unwrap() >= 1, "{info}");
    wait_for_ps(&a, "the former subtree gone", |seen| {
        seen.contains_key(&sup) && !seen.contains_key(&sibling)
    });
}

/// `rest_for_one` across nodes takes down the children spawned after the
/// failed one, in the order they were spawned: a child on node a spawned
/// after one on b has a lower PID (each node takes PIDs in blocks of its
/// own), yet restarts with it; one spawned before does not.
#[test]
fn rest_for_one_across_nodes_follows_spawn_order_not_pids() {
    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let a = flagged(&bin, root.path(), &nats, "a");
    let b = flagged(&bin, root.path(), &nats, "b");
    wait_for_nodes(&a, &["a", "b"], Duration::from_secs(10));
    let permanent = || {
        Some(pb::RestartSpec {
            policy: pb::RestartPolicy::Permanent as i32,
            max_restarts: Some(10),
            backoff_ms: vec![300, 300],
            ..Default::default()
        })
    };
    let chain = admin_spawn(
        &rt,
        &a,
        pb::SpawnRequest {
            parent: 1,
            name: "chain".into(),
            runtime: "echo".into(),
            node: "a".into(),
            restart: permanent(),
            strategy: pb::Strategy::RestForOne as i32,
            ..Default::default()
        },
    );
    let child = |name: &str, node: &str, command: Vec<String>| {
        admin_spawn(
            &rt,
            &a,
            pb::SpawnRequest {
                parent: chain,
                name: name.into(),
                runtime: if command.is_empty() { "echo" } else { "" }.into(),
                command,
                node: node.into(),
                restart: permanent(),
                ..Default::default()
            },
        )
    };
    let first = child("first", "a", Vec::new());
    let failing = child(
        "failing",
        "b",
        vec!["sh".into(), "-c".into(), "sleep 1; exit 3".into()],
    );
    let later = child("later", "a", Vec::new());
    assert!(
        first < later && later < failing,
        "{first} {failing} {later}"
    );

    let restarted = |pid: u64| {
        events_of(&a, "restarted")
            .iter()
            .any(|(restarted, _)| *restarted == pid)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(restarted(failing) && restarted(later)) {
        assert!(Instant::now() < deadline, "{}\n{}", a.log(), b.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!restarted(first), "the child spawned first restarted too");
}

/// A sibling on another node that a parent's strategy takes down with a
/// failed child restarts after the failed child's delay, as a sibling on
/// the same node does; a supervision request about an earlier run of the
/// parent (naming a child it no longer has) changes nothing.
#[test]
fn supervision_across_nodes_waits_out_the_delay_and_ignores_earlier_runs() {
    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Unsigned: a `fail` is sent below as node b would send it.
    let a = flagged_unsigned(&bin, root.path(), &nats, "a");
    let b = flagged_unsigned(&bin, root.path(), &nats, "b");
    wait_for_nodes(&a, &["a", "b"], Duration::from_secs(10));
    let permanent = |backoff_ms: Vec<u64>| {
        Some(pb::RestartSpec {
            policy: pb::RestartPolicy::Permanent as i32,
            max_restarts: Some(10),
            backoff_ms,
            ..Default::default()
        })
    };
    let sup = admin_spawn(
        &rt,
        &a,
        pb::SpawnRequest {
            parent: 1,
            name: "sup".into(),
            runtime: "echo".into(),
            node: "a".into(),
            restart: permanent(Vec::new()),
            strategy: pb::Strategy::OneForAll as i32,
            ..Default::default()
        },
    );
    let steady = admin_spawn(
        &rt,
        &a,
        pb::SpawnRequest {
            parent: sup,
            name: "steady".into(),
            runtime: "echo".into(),
            node: "b".into(),
            restart: permanent(Vec::new()),
            ..Default::default()
        },
    );
    // Fails a second after each start, and restarts 1.5 s later.
    const DELAY_MS: u64 = 1_500;
    admin_spawn(
        &rt,
        &a,
        pb::SpawnRequest {
            parent: sup,
            name: "failing".into(),
            command: vec!["sh".into(), "-c".into(), "sleep 1; exit 3".into()],
            node: "a".into(),
            restart: permanent(vec![DELAY_MS, DELAY_MS]),
            ..Default::default()
        },
    );
    let times = |kind: &str| -> Vec<u64> {
        a.cli(&[
            "events",
            "--since",
            "0",
            "--json",
            "--type",
            kind,
            "--pid",
            &steady.to_string(),
        ])
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|event| event["at_unix_ms"].as_u64())
        .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let (stopped, restarted) = loop {
        let (stopped, restarted) = (times("exited"), times("restarted"));
        if !stopped.is_empty() && !restarted.is_empty() {
            break (stopped[0], restarted[0]);
        }
        assert!(Instant::now() < deadline, "{}\n{}", a.log(), b.log());
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        restarted >= stopped + DELAY_MS - 200,
        "steady on b stopped at {stopped} and restarted at {restarted}: before the failed \
         child's delay of {DELAY_MS} ms"
    );

    // A `fail` as node b sends it, about an earlier run of sup: late.
    let epoch = nodes(&b)
        .iter()
        .find(|node| node["name"] == "b")
        .and_then(|node| node["epoch"].as_u64())
        .unwrap();
    let ask = |started_ms: u64| -> Value {
        rt.block_on(async {
            let peer = nats.client(0).await.unwrap();
            let request = json!({
                "from_node": "b", "epoch": epoch, "op": "fail",
                "args": { "pid": sup, "reason": "a child failed", "started_ms": started_ms }
            });
            let answer = peer
                .request("hk.node.a.rpc", request.to_string().into())
                .await
                .unwrap();
            serde_json::from_slice(&answer.payload).unwrap()
        })
    };
    let sup_runs = || {
        events_of(&a, "restarted")
            .iter()
            .filter(|(pid, _)| *pid == sup)
            .count()
    };
    let before = sup_runs();
    let run = a.json(&["describe", &sup.to_string(), "--json"])["started_at_unix_ms"]
        .as_u64()
        .unwrap();
    assert_eq!(ask(run - 1), json!({ "ok": null }));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(sup_runs(), before, "a late fail restarted sup");
    // About this run: sup fails, and its policy restarts it.
    assert_eq!(ask(run), json!({ "ok": null }));
    let deadline = Instant::now() + Duration::from_secs(10);
    while sup_runs() == before {
        assert!(Instant::now() < deadline, "{}", a.log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A token a node issued to its `exec` process is honoured by every node:
/// the process, on b, spawns its own child through a (the spawn runs on
/// b, its node), and may spawn nothing else; a forged token is refused.
#[test]
fn a_process_token_is_honoured_by_every_node() {
    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let a = flagged(&bin, root.path(), &nats, "a");
    let b = flagged(&bin, root.path(), &nats, "b");
    wait_for_nodes(&a, &["a", "b"], Duration::from_secs(10));
    let file = root.path().join("token");
    let script = format!(
        "printf %s \"$HIVEKERNEL_TOKEN\" > {}; sleep 60",
        file.display()
    );
    let agent = spawned_pid(
        &a.command(&[
            "spawn", "--parent", "1", "--name", "ex", "--node", "b", "--json", "--", "sh", "-c",
            &script,
        ])
        .output()
        .unwrap(),
    );
    let token = written_token(&file, &b);
    assert!(token.starts_with(&format!("p{agent}.")));
    let as_agent = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--token", token.as_str()]);
        a.command(&all).output().unwrap()
    };
    let agent_s = agent.to_string();
    // Its listing carries its token's digest: a honours it once a has it.
    let deadline = Instant::now() + Duration::from_secs(10);
    let kid = loop {
        let out = as_agent(&[
            "spawn",
            "--parent",
            &agent_s,
            "--name",
            "kid",
            "--runtime",
            "echo",
            "--json",
        ]);
        if out.status.success() {
            break spawned_pid(&out);
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("invalid token") && Instant::now() < deadline,
            "{stderr}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let info = b.json(&["describe", &kid.to_string(), "--json"]);
    assert_eq!(
        (info["node"].as_str(), &info["ppid"]),
        (Some("b"), &json!(agent)),
        "{info}"
    );
    let out = as_agent(&["spawn", "--parent", "1", "--name", "x", "--runtime", "echo"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && stderr.contains(&format!("process {agent} may only spawn its own children")),
        "{stderr}"
    );
    let forged = format!("p{agent}.{}", "A".repeat(43));
    let out = a
        .command(&[
            "spawn", "--parent", &agent_s, "--name", "y", "--token", &forged,
        ])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("invalid token"),
        "{out:?}"
    );
}

/// A token budget lent across nodes: a child on b of a parent on a that
/// draws on a budget needs one of its own (refused without), lent from
/// the parent's; what the child spends is charged to the parent's budget
/// once, when the child exits, and the rest comes back.
#[test]
fn a_budget_lent_to_another_node_is_charged_once() {
    use hivekernel_tests::llm_server::{LlmServer, Scripted};

    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let llm = rt.block_on(LlmServer::answering(|_| {
        Scripted::content_with_usage("spent", 100, 20)
    }));
    let mut config = model_config(&llm.base_url());
    config["agents"] = json!([{
        "name": "banker", "role": "agent", "runtime": "echo", "node": "a",
        "limits": { "max_tokens_total": 10000 }
    }]);
    let a = with_config(&bin, root.path(), &nats, "a", &config);
    let b = with_config(&bin, root.path(), &nats, "b", &config);
    wait_for_nodes(&a, &["a", "b"], Duration::from_secs(10));
    wait_for_ps(&b, "the banker on a", |seen| {
        seen.values()
            .any(|(name, node)| name == "banker" && node == "a")
    });
    let banker = *everyone(&b)
        .iter()
        .find(|(_, (name, _))| name == "banker")
        .unwrap()
        .0;
    let budget = |kernel: &Binary, pid: u64| -> (u64, u64) {
        let info = kernel.json(&["describe", &pid.to_string(), "--json"]);
        let budget = &info["budget"];
        (
            budget["used"].as_u64().unwrap_or(u64::MAX),
            budget["remaining"].as_u64().unwrap_or(u64::MAX),
        )
    };
    assert_eq!(budget(&a, banker), (0, 10_000));

    let mut client = rt.block_on(async {
        let token = std::fs::read_to_string(a.dir.join("data/admin.token")).unwrap();
        let channel = tonic::transport::Channel::from_shared(a.addr.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        KernelClient::with_interceptor(channel, Bearer::new(token.trim()))
    });
    let mut spawn = |tokens: u64| {
        rt.block_on(client.spawn(pb::SpawnRequest {
            parent: banker,
            name: "spender".into(),
            runtime: "tool_agent".into(),
            model: "test-model".into(),
            system_prompt: "You spend tokens.".into(),
            node: "b".into(),
            limits: Some(pb::Limits {
                max_tokens_total: tokens,
                ..Default::default()
            }),
            ..Default::default()
        }))
    };
    let refused = spawn(0).unwrap_err();
    assert!(
        refused.message().contains(&format!(
            "process {banker} draws on the token budget of process {banker}: a child on another \
             node needs a budget of its own (limits.max_tokens_total)"
        )),
        "{refused:?}"
    );
    let spender = spawn(1_000).unwrap().into_inner().pid;
    assert_eq!(
        a.json(&["describe", &spender.to_string(), "--json"])["node"],
        "b"
    );
    // Lent: the banker has 1,000 fewer to spend or lend.
    assert_eq!(budget(&a, banker), (0, 9_000));

    let answer = a.cli(&["exec", &spender.to_string(), "go"]);
    assert!(answer.contains("spent"), "{answer}");
    assert_eq!(budget(&b, spender), (120, 880));
    // Its exit charges the banker what it spent, once, and gives the rest back.
    a.cli(&["kill", &spender.to_string()]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while budget(&a, banker) != (120, 9_880) {
        assert!(
            Instant::now() < deadline,
            "{:?}\n{}",
            budget(&a, banker),
            a.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(budget(&a, banker), (120, 9_880));
}

/// `describe`'s budget of `pid`, as `kernel` reads it: (used, remaining).
fn budget_of(kernel: &Binary, pid: u64) -> (u64, u64) {
    let info = kernel.json(&["describe", &pid.to_string(), "--json"]);
    let budget = &info["budget"];
    (
        budget["used"].as_u64().unwrap_or(u64::MAX),
        budget["remaining"].as_u64().unwrap_or(u64::MAX),
    )
}

/// The node `kernel` says runs `pid`; `None` while it cannot say (the
/// node holding it does not answer until it is declared lost).
fn node_of(kernel: &Binary, pid: u64) -> Option<String> {
    let out = kernel
        .command(&["describe", &pid.to_string(), "--json"])
        .output()
        .unwrap();
    let info: Value = serde_json::from_slice(&out.stdout).ok()?;
    info["node"].as_str().map(str::to_owned)
}

/// Waits until `pid`'s budget, as `kernel` reads it, is `expected`.
fn wait_for_budget(kernel: &Binary, pid: u64, expected: (u64, u64), what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen = budget_of(kernel, pid);
        if seen == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {seen:?}, not {expected:?}\n{}",
            kernel.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A loan across nodes outlives either node. The lending node, stopped
/// and started again, lends its open loan again (its budget does not
/// count it as free) and charges the one repaid while it was down; a
/// child on loan whose node dies carries on elsewhere from what it had
/// spent, which is charged once when it exits. No record stays behind.
#[test]
fn a_loan_outlives_its_lenders_restart_and_its_childs_move() {
    use hivekernel_tests::llm_server::{LlmServer, Scripted};

    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let llm = rt.block_on(LlmServer::answering(|_| {
        Scripted::content_with_usage("spent", 100, 20)
    }));
    let config = model_config(&llm.base_url());
    // The spenders run where `pool=spend`: on b, then on c once b is gone.
    let mut spending = config.clone();
    spending["kernel"]["cluster"]["labels"] = json!({ "pool": "spend" });
    let mut a = with_config(&bin, root.path(), &nats, "a", &config);
    let mut b = with_config(&bin, root.path(), &nats, "b", &spending);
    wait_for_nodes(&a, &["a", "b"], Duration::from_secs(10));

    let banker = admin_spawn(&rt, &a, banker_request());
    let stays = admin_spawn(&rt, &a, spender_request(banker, "stays"));
    let leaves = admin_spawn(&rt, &a, spender_request(banker, "leaves"));
    let c = with_config(&bin, root.path(), &nats, "c", &spending);
    wait_for_nodes(&a, &["a", "b", "c"], Duration::from_secs(10));
    for pid in [stays, leaves] {
        let info = a.json(&["describe", &pid.to_string(), "--json"]);
        assert_eq!(info["node"], "b", "{info}");
        assert!(a.cli(&["exec", &pid.to_string(), "go"]).contains("spent"));
        assert_eq!(budget_of(&b, pid), (120, 880));
    }
    assert_eq!(budget_of(&a, banker), (0, 8_000));

    // The lending node stops; one child exits while it is down.
    a.terminate();
    b.cli(&["kill", &leaves.to_string()]);
    let a = Binary::start_with(
        &bin,
        &root.path().join("a"),
        &["--cluster", &nats.urls(), "--node", "a"],
    );
    // Back: 120 charged for the child that left; 1,000 still lent.
    wait_for_budget(
        &a,
        banker,
        (120, 8_880),
        "the banker after its node's restart",
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(budget_of(&a, banker), (120, 8_880), "charged once");

    // The child's node dies: it starts again on c with what it spent.
    b.child.kill().unwrap();
    b.child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while node_of(&c, stays).as_deref() != Some("c") {
        assert!(Instant::now() < deadline, "{}\n{}", a.log(), c.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    wait_for_budget(&c, stays, (120, 880), "the moved child");
    assert!(a.cli(&["exec", &stays.to_string(), "go"]).contains("spent"));
    wait_for_budget(&c, stays, (240, 760), "the moved child after a call");
    a.cli(&["kill", &stays.to_string()]);
    wait_for_budget(&a, banker, (360, 9_640), "the banker once both exited");

    // Every loan charged is closed.
    let kept = loans_kept(&rt, &nats);
    assert!(kept.is_empty(), "{kept:?}");
    drop(c);
}

/// A child on loan whose node dies, moving to its parent's node, takes
/// the loan as its budget there, with what it had spent; the cluster no
/// longer keeps the loan.
#[test]
fn a_child_on_loan_moving_to_its_parents_node_keeps_what_it_spent() {
    use hivekernel_tests::llm_server::{LlmServer, Scripted};

    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let llm = rt.block_on(LlmServer::answering(|_| {
        Scripted::content_with_usage("spent", 100, 20)
    }));
    // Both may run spenders; b, running fewer processes, gets the first.
    let mut config = model_config(&llm.base_url());
    config["kernel"]["cluster"]["labels"] = json!({ "pool": "spend" });
    let a = with_config(&bin, root.path(), &nats, "a", &config);
    let mut b = with_config(&bin, root.path(), &nats, "b", &config);
    wait_for_nodes(&a, &["a", "b"], Duration::from_secs(10));
    let banker = admin_spawn(&rt, &a, banker_request());
    let homing = admin_spawn(&rt, &a, spender_request(banker, "homing"));
    let info = a.json(&["describe", &homing.to_string(), "--json"]);
    assert_eq!(info["node"], "b", "{info}");
    assert!(
        a.cli(&["exec", &homing.to_string(), "go"])
            .contains("spent")
    );
    assert_eq!(loans_kept(&rt, &nats), vec![homing.to_string()]);
    wait_for_budget(&a, banker, (0, 9_000), "the banker, lending");

    b.child.kill().unwrap();
    b.child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while node_of(&a, homing).as_deref() != Some("a") {
        assert!(Instant::now() < deadline, "{}", a.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    wait_for_budget(
        &a,
        homing,
        (120, 880),
        "the child back on its parent's node",
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !loans_kept(&rt, &nats).is_empty() {
        assert!(Instant::now() < deadline, "{}", a.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        a.cli(&["exec", &homing.to_string(), "go"])
            .contains("spent")
    );
    a.cli(&["kill", &homing.to_string()]);
    wait_for_budget(&a, banker, (240, 9_760), "the banker once its child exited");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(budget_of(&a, banker), (240, 9_760), "charged once");
}

/// Spawns `request` through `kernel` as its operator; the new PID.
fn admin_spawn(rt: &tokio::runtime::Runtime, kernel: &Binary, request: pb::SpawnRequest) -> u64 {
    rt.block_on(async {
        let token = std::fs::read_to_string(kernel.dir.join("data/admin.token")).unwrap();
        let channel = tonic::transport::Channel::from_shared(kernel.addr.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = KernelClient::with_interceptor(channel, Bearer::new(token.trim()));
        client.spawn(request).await.unwrap().into_inner().pid
    })
}

/// A permanent echo process on node a, under PID 1, with 10,000 tokens.
fn banker_request() -> pb::SpawnRequest {
    pb::SpawnRequest {
        parent: 1,
        name: "banker".into(),
        runtime: "echo".into(),
        node: "a".into(),
        limits: Some(pb::Limits {
            max_tokens_total: 10_000,
            ..Default::default()
        }),
        restart: Some(pb::RestartSpec {
            policy: pb::RestartPolicy::Permanent as i32,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A permanent `tool_agent` under `banker` with 1,000 tokens of its own,
/// on a node labelled `pool=spend`.
fn spender_request(banker: u64, name: &str) -> pb::SpawnRequest {
    pb::SpawnRequest {
        parent: banker,
        name: name.into(),
        runtime: "tool_agent".into(),
        model: "test-model".into(),
        system_prompt: "You spend tokens.".into(),
        node: String::new(),
        node_labels: [("pool".to_owned(), "spend".to_owned())].into(),
        limits: Some(pb::Limits {
            max_tokens_total: 1_000,
            ..Default::default()
        }),
        ..banker_request()
    }
}

/// The keys of `hk_loans`: the children whose loans the cluster keeps.
fn loans_kept(rt: &tokio::runtime::Runtime, nats: &NatsCluster) -> Vec<String> {
    rt.block_on(async {
        let peer = nats.client(0).await.unwrap();
        let js = async_nats::jetstream::new(peer);
        let bucket = js.get_key_value("hk_loans").await.unwrap();
        bucket
            .keys()
            .await
            .unwrap()
            .map(|k| k.unwrap())
            .collect()
            .await
    })
}

/// A `--follow` client command's output, read line by line as it comes;
/// the command is killed when this is dropped.
struct Follower {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Follower {
    fn start(kernel: &Binary, args: &[&str]) -> Follower {
        let mut child = kernel.command(args).stdout(Stdio::piped()).spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Follower {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The next line, if one comes within `limit`.
    fn next(&mut self, limit: Duration) -> Option<String> {
        let line = self.lines.recv_timeout(limit).ok()?;
        self.seen.push(line.clone());
        Some(line)
    }

    /// Waits up to 15 s for a line holding `needle`.
    fn until(&mut self, needle: &str, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !self.seen.iter().any(|line| line.contains(needle)) {
            let left = deadline.saturating_duration_since(Instant::now());
            if self.next(left).is_none() {
                panic!("{what}: no {needle:?} in {:#?}", self.seen);
            }
        }
    }

    /// Whether the command ends by itself, successfully, within `limit`.
    fn ends(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where each of `names` runs, as `kernel`'s `ps` shows the cluster: name
/// to every (PID, node) it runs as.
fn placed(
    kernel: &Binary,
    names: &[&str],
) -> std::collections::BTreeMap<String, Vec<(u64, String)>> {
    let mut placed: std::collections::BTreeMap<String, Vec<(u64, String)>> =
        names.iter().map(|n| (n.to_string(), Vec::new())).collect();
    for (pid, (name, node)) in everyone(kernel) {
        if let Some(at) = placed.get_mut(&name) {
            at.push((pid, node));
        }
    }
    placed
}

/// Config agents are cluster-wide singletons: every node reads the same
/// config, the first to claim an agent runs it, and the others leave it.
/// When its node dies (kill -9), a survivor starts it again as the same
/// PID within the TTL and its restart backoff; a temporary one is not
/// started again. When its node stops cleanly, another takes it over at
/// once. A node started again does not bring back the agents others took.
#[test]
fn config_agents_run_once_in_the_cluster_and_move_when_their_node_goes() {
    let bin = binary();
    let nats = NatsCluster::start(3);
    let root = tempfile::tempdir().unwrap();
    let restart = |policy: &str| json!({ "policy": policy, "backoff_ms": [300, 1000] });
    let config = config_of(json!([
        { "name": "greeter", "role": "agent", "runtime": "echo", "restart": restart("permanent") },
        { "name": "porter", "role": "agent", "runtime": "echo", "restart": restart("transient") },
        { "name": "once", "role": "agent", "runtime": "echo", "restart": restart("temporary") }
    ]));
    let start = |name: &str| member(&bin, root.path(), &nats, name, &config);
    let mut a = start("a");
    let b = start("b");
    let c = start("c");
    wait_for_nodes(&c, &["a", "b", "c"], Duration::from_secs(10));
    let agents = ["greeter", "porter", "once"];

    // Once each, on a (the first to start claims them all), from any node.
    let first = placed(&c, &agents);
    for name in agents {
        assert_eq!(first[name].len(), 1, "{name}: {first:?}");
        assert_eq!(first[name][0].1, "a", "{name}: {first:?}");
    }
    for kernel in [&a, &b] {
        assert_eq!(placed(kernel, &agents), first);
    }
    assert!(
        b.log().contains("agent runs on another node"),
        "{}",
        b.log()
    );
    let greeter = first["greeter"][0].0;
    let porter = first["porter"][0].0;
    assert!(b.cli(&["exec", "greeter", "hello"]).contains("hello"));

    // kill -9 of a: the permanent and transient agents start again on b or
    // c as the same PIDs and answer; the temporary one stays gone.
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let died = Instant::now();
    let deadline = died + Duration::from_millis(TTL_MS + 300) + Duration::from_secs(10);
    let moved = loop {
        let now = placed(&c, &agents);
        let back = |name: &str, pid: u64| {
            now[name].len() == 1 && now[name][0].0 == pid && now[name][0].1 != "a"
        };
        if back("greeter", greeter) && back("porter", porter) {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "not back: {now:?}\n{}\n{}",
            b.log(),
            c.log()
        );
        std::thread::sleep(Duration::from_millis(25));
    };
    let answer = c.cli(&["exec", "greeter", "after the loss"]);
    let back_in = died.elapsed();
    assert!(answer.contains("after the loss"), "{answer}");
    eprintln!(
        "config agents answering again {back_in:?} after their node died (TTL {TTL_MS} ms, backoff 300 ms)"
    );
    assert!(
        back_in >= Duration::from_millis(TTL_MS - 2 * HEARTBEAT_MS),
        "moved before the node's TTL ran out: {back_in:?}"
    );
    let log = format!("{}{}", b.log(), c.log());
    assert!(
        log.contains("config agent taken over from a node that is gone"),
        "{log}"
    );
    // The temporary one is not started again (its listing left with a).
    std::thread::sleep(Duration::from_millis(TTL_MS));
    let now = placed(&c, &agents);
    assert!(now["once"].is_empty(), "{now:?}");
    assert_eq!(now["greeter"], moved["greeter"], "started twice: {now:?}");

    // The node running greeter stops cleanly: the other takes what it ran
    // over at once, as the same PIDs, without waiting for a TTL.
    let (mut holder, other, other_name) = if moved["greeter"][0].1 == "b" {
        (b, c, "c")
    } else {
        (c, b, "b")
    };
    assert!(holder.terminate().success());
    let stopped = Instant::now();
    loop {
        let now = placed(&other, &agents);
        if now["greeter"] == [(greeter, other_name.to_owned())]
            && now["porter"] == [(porter, other_name.to_owned())]
        {
            break;
        }
        assert!(
            stopped.elapsed() < Duration::from_millis(TTL_MS),
            "not taken over at once by {other_name}: {now:?}\n{}\n--- the stopped node\n{}",
            other.log(),
            holder.log()
        );
        std::thread::sleep(Duration::from_millis(25));
    }
    assert!(
        other.log().contains("released by its node"),
        "{}",
        other.log()
    );

    // a, started again (a new epoch), leaves what the others took; its
    // store remembers the agents, the cluster says who runs them now.
    a = start("a");
    wait_for_nodes(&other, &["a", other_name], Duration::from_secs(10));
    // Once a's mirror of the directory has caught up.
    wait_for_ps(&a, "the other node's processes", |seen| {
        seen.values().any(|(_, node)| node == other_name)
    });
    std::thread::sleep(Duration::from_millis(TTL_MS));
    let now = placed(&a, &agents);
    assert_eq!(
        now["greeter"],
        [(greeter, other_name.to_owned())],
        "{now:?}"
    );
    assert_eq!(now["porter"], [(porter, other_name.to_owned())], "{now:?}");
    assert!(a.cli(&["exec", "porter", "from a"]).contains("from a"));
    // A node's start starts what nobody runs, temporary or not, as a
    // kernel's start does.
    assert_eq!(now["once"].len(), 1, "{now:?}");
    assert_eq!(now["once"][0].1, "a", "{now:?}");
    drop(holder);
}

/// A node whose config points its models at `llm`, of the cluster `nats`.
fn with_model(bin: &Path, root: &Path, nats: &NatsCluster, name: &str, llm: &str) -> Binary {
    with_config(bin, root, nats, name, &model_config(llm))
}

/// The test config, timed for tests, with `llm` as its model server.
fn model_config(llm: &str) -> Value {
    let mut config: Value = serde_json::from_str(&config(Some(json!({
        "servers": ["nats://127.0.0.1:1"],
        "heartbeat_ms": HEARTBEAT_MS,
        "node_ttl_ms": TTL_MS
    }))))
    .unwrap();
    config["llm"] = json!({
        "provider": "openai", "base_url": llm,
        "api_key_env": "HIVEKERNEL_TEST_NO_KEY", "max_retries": 0
    });
    config
}

/// A node of `nats` named `name`, started from `config`.
fn with_config(bin: &Path, root: &Path, nats: &NatsCluster, name: &str, config: &Value) -> Binary {
    let urls = nats.urls();
    node(
        bin,
        root,
        name,
        &config.to_string(),
        &["--cluster", &urls, "--node", name],
    )
}

/// A process on one node reaches a process on another as it would on one
/// node: its task runs there and answers, its message arrives from it (the
/// pong comes back to it), its delegated task's answer comes back to its
/// mailbox; and the rules hold across the nodes (a kill of a process that
/// is not its descendant is refused, naming the node).
#[test]
fn processes_on_two_nodes_reach_each_other_by_the_routing_rules() {
    use hivekernel_tests::llm_server::{LlmServer, Scripted, last_message, tool_results};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let target = Arc::new(AtomicU64::new(0));
    let aimed = target.clone();
    let llm = rt.block_on(LlmServer::answering(move |body| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let last = messages.last().cloned().unwrap_or_default();
        if last["role"] == "tool" {
            return Scripted::content("done");
        }
        if last_message(body) != "go" {
            return Scripted::content("noted");
        }
        let pid = aimed.load(Ordering::SeqCst);
        let calls = [
            json!({"pid": pid, "task": "hello from a"}),
            json!({"pid": pid, "message": "p1", "type": "ping"}),
            json!({"pid": pid, "task": "later"}),
            json!({"pid": pid}),
        ]
        .map(|args| args.to_string());
        Scripted::tool_calls(&[
            ("c1", "execute_task", &calls[0]),
            ("c2", "send_message", &calls[1]),
            ("c3", "delegate_async", &calls[2]),
            ("c4", "kill_child", &calls[3]),
        ])
    }));
    let a = with_model(&bin, root.path(), &nats, "a", &llm.base_url());
    let b = flagged(&bin, root.path(), &nats, "b");
    wait_for_nodes(&a, &["a", "b"], Duration::from_secs(10));

    let echo = spawn(&b, 1, "echo-b", "agent");
    target.store(echo, Ordering::SeqCst);
    // It may move: its messages go through the cluster's mail stream.
    let caller = spawn_agent(
        &a,
        "caller",
        "You call other processes.",
        "execute_task,send_message,delegate_async,kill_child",
    );

    let answer = a.cli(&["exec", "caller", "go"]);
    assert!(answer.contains("done"), "{answer}\n{}", a.log());
    let requests = llm.requests();
    let shown = requests
        .iter()
        .find(|r| !tool_results(r).is_empty())
        .map(tool_results)
        .unwrap_or_else(|| panic!("no tool results in {requests:?}"));
    assert_eq!(shown.len(), 4, "{shown:?}");
    assert!(shown[0].contains("hello from a"), "{shown:?}");
    assert!(shown[1].starts_with("sent as message "), "{shown:?}");
    let request: u64 = shown[2]
        .strip_prefix("delegated as request ")
        .and_then(|rest| rest.split(';').next())
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("{shown:?}"));
    assert!(
        shown[3].contains(&format!(
            "process {caller} may only kill its descendants, and {echo} (on node b) is not one"
        )),
        "{shown:?}"
    );
    assert!(everyone(&b).contains_key(&echo));

    // The pong and the delegated answer come back across the nodes, each
    // a turn of the caller's.
    let pong = format!("Message from process {echo} (pong):\np1");
    let delegated =
        format!("Result of delegated request {request} (succeeded, from process {echo}):\nlater");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let inputs: Vec<String> = llm.requests().iter().map(last_message).collect();
        if inputs.contains(&pong) && inputs.contains(&delegated) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{inputs:?}\n{}\n{}",
            a.log(),
            b.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The newest message kept for `pid` in the cluster's mail stream, as
/// text; empty when none is.
fn last_kept(rt: &tokio::runtime::Runtime, nats: &NatsCluster, pid: u64) -> String {
    rt.block_on(async {
        let peer = nats.client(0).await.unwrap();
        let js = async_nats::jetstream::new(peer);
        let stream = js.get_stream("HK_MAIL").await.unwrap();
        let subject = format!("hk.mail.{pid}");
        match stream.get_last_raw_message_by_subject(&subject).await {
            Ok(message) => String::from_utf8_lossy(&message.payload).into_owned(),
            Err(_) => String::new(),
        }
    })
}

/// A delegated task's answer to a process that may move is kept in the
/// cluster's mail stream as its node takes it in: the worker on b answers
/// while the caller on a is busy with a slow turn, a is killed with the
/// answer still queued, and the caller, started again on b, gets the
/// answer there, once.
#[test]
fn a_delegated_answer_queued_on_a_lost_node_reaches_its_requester_where_it_starts_again() {
    use hivekernel_tests::llm_server::{LlmServer, Scripted, last_message};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let target = Arc::new(AtomicU64::new(0));
    let aimed = target.clone();
    let llm = rt.block_on(LlmServer::answering(move |body| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let last = messages.last().cloned().unwrap_or_default();
        if last["role"] == "tool" {
            // Busy while the answer arrives: it waits in the mailbox.
            return Scripted::content("done").after(Duration::from_secs(3));
        }
        // The message turn's input ends with what was sent.
        if !last_message(body).ends_with("\ngo") {
            return Scripted::content("noted");
        }
        let args = json!({"pid": aimed.load(Ordering::SeqCst), "task": "later"}).to_string();
        Scripted::tool_calls(&[("c1", "delegate_async", &args)])
    }));
    // One turn at a time: the answer waits behind the slow one.
    let mut config = model_config(&llm.base_url());
    config["kernel"]["max_concurrent_tasks"] = json!(1);
    let mut a = with_config(&bin, root.path(), &nats, "a", &config);
    let b = with_config(&bin, root.path(), &nats, "b", &config);
    wait_for_nodes(&a, &["a", "b"], Duration::from_secs(10));

    let echo = spawn(&b, 1, "echo-b", "agent");
    target.store(echo, Ordering::SeqCst);
    let caller = spawn_agent(&a, "caller", "You delegate.", "delegate_async");
    let sent = a.cli(&["send", "caller", "go"]);
    assert!(sent.trim().parse::<u64>().is_ok(), "{sent}\n{}", a.log());

    // The answer is in the stream, on the caller's subject, before a dies.
    let subject = format!("hk.mail.{caller}");
    let kept = || last_kept(&rt, &nats, caller);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !kept().contains("task_response") {
        assert!(
            Instant::now() < deadline,
            "no answer kept on {subject}\n{}\n{}",
            a.log(),
            b.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let answered = |input: &String| {
        input.starts_with("Result of delegated request")
            && input.contains(&format!("(succeeded, from process {echo})"))
            && input.ends_with("later")
    };
    let inputs: Vec<String> = llm.requests().iter().map(last_message).collect();
    assert!(
        !inputs.iter().any(answered),
        "handed over before the kill: {inputs:?}"
    );
    a.child.kill().unwrap();
    a.child.wait().unwrap();

    // Started again on b, the caller takes the answer as a turn, once.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let inputs: Vec<String> = llm.requests().iter().map(last_message).collect();
        if inputs.iter().any(answered) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{inputs:?}\n{}\n{}",
            a.log(),
            b.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        everyone(&b).get(&caller).map(|(_, node)| node.as_str()),
        Some("b"),
        "{}",
        b.log()
    );
    std::thread::sleep(Duration::from_millis(500));
    let inputs: Vec<String> = llm.requests().iter().map(last_message).collect();
    assert_eq!(
        inputs.iter().filter(|input| answered(input)).count(),
        1,
        "{inputs:?}"
    );
    // Handed over: taken out of the stream.
    assert_eq!(kept(), "", "{}", b.log());
}

/// A delegated task's answer follows its requester: the caller on a
/// delegates to a slow worker on b and a is killed before the worker
/// answers; the caller starts again on b, and the answer, which b would
/// have posted to a, reaches it there, once.
#[test]
fn a_delegated_answer_follows_its_requester_to_the_node_it_moved_to() {
    use hivekernel_tests::llm_server::{LlmServer, Scripted, last_message};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let target = Arc::new(AtomicU64::new(0));
    let aimed = target.clone();
    let llm = rt.block_on(LlmServer::answering(move |body| {
        let system = body["messages"][0]["content"].as_str().unwrap_or("");
        if system.contains("slowly") {
            return Scripted::content("later").after(Duration::from_secs(4));
        }
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let last = messages.last().cloned().unwrap_or_default();
        if last["role"] == "tool" {
            return Scripted::content("done");
        }
        if !last_message(body).ends_with("\ngo") {
            return Scripted::content("noted");
        }
        let args = json!({"pid": aimed.load(Ordering::SeqCst), "task": "slow"}).to_string();
        Scripted::tool_calls(&[("c1", "delegate_async", &args)])
    }));
    let mut a = with_model(&bin, root.path(), &nats, "a", &llm.base_url());
    let b = with_model(&bin, root.path(), &nats, "b", &llm.base_url());
    wait_for_nodes(&a, &["a", "b"], Duration::from_secs(10));
    let worker = spawn_agent(&b, "worker", "You work slowly.", "list_children");
    target.store(worker, Ordering::SeqCst);
    let caller = spawn_agent(&a, "caller", "You delegate.", "delegate_async");

    let sent = a.cli(&["send", "caller", "go"]);
    assert!(sent.trim().parse::<u64>().is_ok(), "{sent}\n{}", a.log());
    // The worker has the task: a dies before it answers.
    let working = |input: &String| input.ends_with("slow");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !llm
        .requests()
        .iter()
        .map(last_message)
        .any(|input| working(&input))
    {
        assert!(Instant::now() < deadline, "{}\n{}", a.log(), b.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    a.child.kill().unwrap();
    a.child.wait().unwrap();

    let answered = |input: &String| {
        input.starts_with("Result of delegated request")
            && input.contains(&format!("(succeeded, from process {worker})"))
            && input.ends_with("later")
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let inputs: Vec<String> = llm.requests().iter().map(last_message).collect();
        if inputs.iter().any(answered) {
            break;
        }
        assert!(Instant::now() < deadline, "{inputs:?}\n{}", b.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        everyone(&b).get(&caller).map(|(_, node)| node.as_str()),
        Some("b"),
        "{}",
        b.log()
    );
    std::thread::sleep(Duration::from_millis(500));
    let inputs: Vec<String> = llm.requests().iter().map(last_message).collect();
    assert_eq!(
        inputs.iter().filter(|i| answered(i)).count(),
        1,
        "{inputs:?}"
    );
}

/// A message the kernel makes while its receiver's node is down waits in
/// the cluster's mail stream for the receiver's next start: the caller, a
/// config agent on a, delegates to two workers on b, and a is killed. One
/// worker answers before a is declared lost (its post finds nobody
/// there), the other after, while the caller waits out its restart delay,
/// as does the `child_exited` notice of its child on b, killed then; the
/// caller, started again on b, gets both answers, once each, and the
/// notice.
#[test]
fn answers_made_while_their_requesters_node_is_down_wait_for_its_next_start() {
    use hivekernel_tests::llm_server::{LlmServer, Scripted, last_message};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let workers = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let aimed = workers.clone();
    let llm = rt.block_on(LlmServer::answering(move |body| {
        let system = body["messages"][0]["content"].as_str().unwrap_or("");
        // Before a is declared lost (TTL 1.5 s), and after it.
        if system.contains("at once") {
            return Scripted::content("soon").after(Duration::from_millis(500));
        }
        if system.contains("slowly") {
            return Scripted::content("later").after(Duration::from_millis(2_500));
        }
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let last = messages.last().cloned().unwrap_or_default();
        if last["role"] == "tool" {
            return Scripted::content("done");
        }
        if !last_message(body).ends_with("\ngo") {
            return Scripted::content("noted");
        }
        let quick = json!({"pid": aimed[0].load(Ordering::SeqCst), "task": "quick"}).to_string();
        let slow = json!({"pid": aimed[1].load(Ordering::SeqCst), "task": "slow"}).to_string();
        Scripted::tool_calls(&[
            ("c1", "delegate_async", &quick),
            ("c2", "delegate_async", &slow),
        ])
    }));
    let mut config = model_config(&llm.base_url());
    // Started again 2.5 s after a is declared lost: the slow answer comes
    // while no node holds the caller.
    config["agents"] = json!([{
        "name": "caller",
        "role": "agent",
        "runtime": "tool_agent",
        "model": "test-model",
        "system_prompt": "You delegate.",
        "tools": ["delegate_async"],
        "restart": { "policy": "permanent", "backoff_ms": [2500, 2500] }
    }]);
    let mut a = with_config(&bin, root.path(), &nats, "a", &config);
    wait_for_ps(&a, "caller on a", |all| {
        all.values()
            .any(|(name, node)| name == "caller" && node == "a")
    });
    let b = with_config(&bin, root.path(), &nats, "b", &config);
    wait_for_nodes(&b, &["a", "b"], Duration::from_secs(10));
    let quick = spawn_agent(&b, "quick", "You answer at once.", "list_children");
    let slow = spawn_agent(&b, "slow", "You work slowly.", "list_children");
    workers[0].store(quick, Ordering::SeqCst);
    workers[1].store(slow, Ordering::SeqCst);
    let caller = everyone(&a)
        .into_iter()
        .find(|(_, (name, _))| name == "caller")
        .map(|(pid, _)| pid)
        .unwrap();
    let kid = spawned_pid(&spawn_on(&b, caller, "kid", "b", &[]));

    let sent = a.cli(&["send", "caller", "go"]);
    assert!(sent.trim().parse::<u64>().is_ok(), "{sent}\n{}", a.log());
    // Both workers have their tasks: a dies before either answers.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let inputs: Vec<String> = llm.requests().iter().map(last_message).collect();
        if ["quick", "slow"]
            .iter()
            .all(|task| inputs.iter().any(|input| input.ends_with(task)))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{inputs:?}\n{}\n{}",
            a.log(),
            b.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    // Declared lost, the caller not started again yet: the kid ends.
    wait_for_nodes(&b, &["b"], Duration::from_secs(10));
    let killed = b.cli(&["kill", &kid.to_string()]);
    assert!(killed.contains(&kid.to_string()), "{killed}\n{}", b.log());

    let answered = |input: &String, worker: u64, text: &str| {
        input.starts_with("Result of delegated request")
            && input.contains(&format!("(succeeded, from process {worker})"))
            && input.ends_with(text)
    };
    let both = [(quick, "soon"), (slow, "later")];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let inputs: Vec<String> = llm.requests().iter().map(last_message).collect();
        if both
            .iter()
            .all(|(worker, text)| inputs.iter().any(|input| answered(input, *worker, text)))
        {
            break;
        }
        assert!(Instant::now() < deadline, "{inputs:?}\n{}", b.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        everyone(&b).get(&caller).map(|(_, node)| node.as_str()),
        Some("b"),
        "{}",
        b.log()
    );
    let log = b.log();
    let waited: Vec<&str> = log
        .lines()
        .filter(|line| {
            line.contains("a kernel message waits in the mail stream for its receiver's next start")
        })
        .collect();
    assert_eq!(waited.len(), 3, "{}", b.log());
    assert_eq!(
        waited
            .iter()
            .filter(|line| line.contains("child_exited"))
            .count(),
        1,
        "{waited:?}"
    );
    std::thread::sleep(Duration::from_millis(500));
    let inputs: Vec<String> = llm.requests().iter().map(last_message).collect();
    for (worker, text) in both {
        assert_eq!(
            inputs
                .iter()
                .filter(|input| answered(input, worker, text))
                .count(),
            1,
            "{inputs:?}"
        );
    }
    // The notice too was handed over: nothing waits for the caller.
    assert_eq!(last_kept(&rt, &nats, caller), "", "{}", b.log());
}

/// A kernel message to a node that is off NATS for a moment is posted
/// again until that node takes it, and handed over once. Two parents on
/// a, `exec` processes whose mailboxes the test reads (`Attach`), one
/// `temporary` (its mail stays on a) and one `permanent` (its mail is the
/// cluster's), have two children each on b, killed in pairs: one while
/// a's NATS connection is down (the post finds nobody there), one while a
/// is paused past the post's wait (a takes the first post late, and the
/// next one is the same message). Each `child_exited` notice reaches its
/// parent once, and frees its slot.
#[test]
fn a_kernel_message_to_a_node_off_nats_for_a_moment_arrives_once() {
    use std::sync::{Arc, Mutex};

    let bin = binary();
    let nats = NatsCluster::start(1);
    let link = hivekernel_tests::link::Link::to(&nats.addr(0));
    let root = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Not declared lost while away, nor paused (half the TTL).
    let timing = json!({
        "servers": ["nats://127.0.0.1:1"],
        "heartbeat_ms": HEARTBEAT_MS,
        "node_ttl_ms": 30_000
    });
    let a = node(
        &bin,
        root.path(),
        "a",
        &config(Some(timing.clone())),
        &[
            "--cluster",
            &nats.url_at(&link.addr().to_string()),
            "--node",
            "a",
        ],
    );
    let b = node(
        &bin,
        root.path(),
        "b",
        &config(Some(timing)),
        &["--cluster", &nats.url(0), "--node", "b"],
    );
    wait_for_nodes(&a, &["a", "b"], Duration::from_secs(10));
    wait_for_nodes(&b, &["a", "b"], Duration::from_secs(10));

    // Each parent: its PID, its children on b, and the children its
    // mailbox told it of, in order.
    let notices: Vec<Arc<Mutex<Vec<u64>>>> = vec![Arc::default(), Arc::default()];
    let mut parents = Vec::new();
    for (i, policy) in ["temporary", "permanent"].iter().enumerate() {
        let file = root.path().join(format!("token-{policy}"));
        let script = format!(
            "printf %s \"$HIVEKERNEL_TOKEN\" > {}; exec sleep 600",
            file.display()
        );
        let parent = spawned_pid(
            &a.command(&[
                "spawn",
                "--parent",
                "1",
                "--name",
                policy,
                "--restart",
                policy,
                "--json",
                "--",
                "sh",
                "-c",
                &script,
            ])
            .output()
            .unwrap(),
        );
        let token = written_token(&file, &a);
        let kids: Vec<u64> = ["one", "two"]
            .iter()
            .map(|name| spawned_pid(&spawn_on(&a, parent, name, "b", &[])))
            .collect();
        assert_eq!(live_children(&a, parent), 2, "{}", a.log());
        let heard = notices[i].clone();
        let addr = a.addr.clone();
        rt.block_on(async {
            let channel = tonic::transport::Channel::from_shared(addr)
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut client = KernelClient::with_interceptor(channel, Bearer::new(token.trim()));
            let mut stream = client
                .attach(pb::AttachRequest {
                    pid: 0,
                    auto_ack: true,
                })
                .await
                .unwrap()
                .into_inner();
            tokio::spawn(async move {
                let _client = client;
                while let Ok(Some(delivery)) = stream.message().await {
                    if let Some(pb::delivery::Item::Message(message)) = delivery.item
                        && message.r#type == "child_exited"
                    {
                        let record: Value = serde_json::from_str(&message.payload).unwrap();
                        heard.lock().unwrap().push(record["pid"].as_u64().unwrap());
                    }
                }
            });
        });
        parents.push((parent, kids));
    }
    let kill_on_b = |round: usize| {
        for (_, kids) in &parents {
            let killed = b.cli(&["kill", &kids[round].to_string()]);
            assert!(killed.contains(&kids[round].to_string()), "{killed}");
        }
    };
    let wait_for = |round: usize| {
        let deadline = Instant::now() + Duration::from_secs(30);
        for (i, (parent, kids)) in parents.iter().enumerate() {
            while !(notices[i].lock().unwrap().contains(&kids[round])
                && live_children(&a, *parent) == 1 - round as u64)
            {
                assert!(
                    Instant::now() < deadline,
                    "{:?}, {} children\n{}\n{}",
                    notices[i].lock().unwrap(),
                    live_children(&a, *parent),
                    a.log(),
                    b.log()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    let sent_again = || {
        b.log()
            .matches("a kernel message not taken by its receiver's node; sent again")
            .count()
    };

    // a's connection drops, and it cannot reconnect for 1.5 s.
    link.down();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !a.log().contains("disconnected from NATS") {
        assert!(Instant::now() < deadline, "{}", a.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    kill_on_b(0);
    std::thread::sleep(Duration::from_millis(1_500));
    link.up();
    wait_for(0);
    let before = sent_again();
    assert!(before >= 2, "{}", b.log());

    // a is paused past the post's wait (10 s): it takes the first posts
    // late, and each post again is the same message.
    signal(&a, "STOP");
    kill_on_b(1);
    std::thread::sleep(Duration::from_secs(12));
    signal(&a, "CONT");
    wait_for(1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while a
        .log()
        .matches("a post from another node came again; handed over once")
        .count()
        < 2
    {
        assert!(Instant::now() < deadline, "{}\n{}", a.log(), b.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(sent_again() >= before + 2, "{}", b.log());
    std::thread::sleep(Duration::from_millis(500));
    for (i, (_, kids)) in parents.iter().enumerate() {
        assert_eq!(
            *notices[i].lock().unwrap(),
            *kids,
            "{}\n{}",
            a.log(),
            b.log()
        );
    }
    drop(rt);
}

/// A process's transcript reads the same from every node: an agent on b
/// answers a task, and `logs` asked of a shows the turn (its input and
/// its answer) as b's `logs` does.
#[test]
fn a_transcript_reads_the_same_from_every_node() {
    use hivekernel_tests::llm_server::{LlmServer, Scripted};

    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let llm = rt.block_on(LlmServer::answering(|_| {
        Scripted::content("the tide turns")
    }));
    let a = with_model(&bin, root.path(), &nats, "a", &llm.base_url());
    let b = with_model(&bin, root.path(), &nats, "b", &llm.base_url());
    wait_for_nodes(&a, &["a", "b"], Duration::from_secs(10));
    let pid = spawn_agent(&b, "scribe", "You answer.", "list_children").to_string();
    let answer = a.cli(&["exec", &pid, "when does the tide turn?"]);
    assert!(answer.contains("the tide turns"), "{answer}\n{}", b.log());

    let here = b.cli(&["logs", &pid, "--json"]);
    let there = a.cli(&["logs", &pid, "--json"]);
    for shown in [&here, &there] {
        assert!(shown.contains("when does the tide turn?"), "{shown}");
        assert!(shown.contains("the tide turns"), "{shown}");
    }
    assert_eq!(here, there);
    // A PID nobody holds is not found, whichever node is asked.
    let out = a.command(&["logs", "999999"]).output().unwrap();
    assert!(!out.status.success(), "{out:?}");
}

/// `logs --follow` of a process on another node prints its turns as they
/// come and ends when it exits; an `exec` agent's log file reads and
/// follows from another node too.
#[test]
fn a_transcript_and_an_exec_log_follow_live_from_another_node() {
    use hivekernel_tests::llm_server::{LlmServer, Scripted};

    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let llm = rt.block_on(LlmServer::answering(|_| Scripted::content("noted")));
    let a = with_model(&bin, root.path(), &nats, "a", &llm.base_url());
    let b = with_model(&bin, root.path(), &nats, "b", &llm.base_url());
    wait_for_nodes(&a, &["a", "b"], Duration::from_secs(10));
    let scribe = spawn_agent(&b, "scribe", "You take notes.", "list_children").to_string();
    a.cli(&["exec", &scribe, "the first note"]);

    let mut follow = Follower::start(&a, &["logs", &scribe, "--follow"]);
    follow.until("the first note", "the turn before the follow began");
    a.cli(&["exec", &scribe, "the second note"]);
    follow.until("the second note", "a turn made while following");
    b.cli(&["kill", &scribe]);
    assert!(
        follow.ends(Duration::from_secs(10)),
        "the follow outlived its process: {:#?}",
        follow.seen
    );

    let printer = spawned_pid(
        &b.command(&[
            "spawn",
            "--json",
            "--parent",
            "1",
            "--name",
            "printer",
            "--",
            "sh",
            "-c",
            "echo printed on b; sleep 1; echo printed later; sleep 60",
        ])
        .output()
        .unwrap(),
    )
    .to_string();
    let mut follow = Follower::start(&a, &["logs", &printer, "--follow"]);
    follow.until("printed on b", "an exec log's first line, from a");
    follow.until("printed later", "an exec log's next line, from a");
    let read = a.cli(&["logs", &printer]);
    assert!(read.contains("printed on b\nprinted later"), "{read}");
    a.cli(&["kill", &printer]);
    assert!(follow.ends(Duration::from_secs(10)), "{:#?}", follow.seen);
}

/// Each slot of a cron entry is leased to one node: three nodes, each on
/// its own NATS server of three, claim the same slots at the same moment,
/// and for every slot exactly one wins while the others are told which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cron_slot_is_leased_to_one_node_however_many_race_for_it() {
    use hivekernel_agents::Pid;
    use hivekernel_kernel::cluster::{Cluster, Lease};
    use hivekernel_kernel::config::ClusterSettings;
    const SLOTS: u64 = 40;
    let nats = NatsCluster::start(3);
    let mut nodes = Vec::new();
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        let settings = ClusterSettings::new(vec![nats.url(i)], name.to_owned());
        let address = format!("127.0.0.1:{}", 9_000 + i);
        nodes.push(Cluster::join(settings, address, 0, 1_000).await.unwrap());
    }
    let base = 1_700_000_000_000;
    let race = |slot: u64| {
        let nodes = nodes.clone();
        async move {
            let claims = nodes
                .iter()
                .map(|node| node.lease_slot((Pid(7), None), "nightly report", slot));
            futures::future::join_all(claims).await
        }
    };
    let outcomes = futures::stream::iter((0..SLOTS).map(|i| race(base + i * 1_000)))
        .buffer_unordered(SLOTS as usize)
        .collect::<Vec<_>>()
        .await;
    for leases in outcomes {
        let leases: Vec<Lease> = leases.into_iter().map(Result::unwrap).collect();
        let winners: Vec<usize> = (0..3).filter(|i| leases[*i] == Lease::Won).collect();
        assert_eq!(winners.len(), 1, "{leases:?}");
        let winner = ["a", "b", "c"][winners[0]];
        for (i, lease) in leases.iter().enumerate() {
            if i != winners[0] {
                assert_eq!(*lease, Lease::Taken(winner.to_owned()), "{leases:?}");
            }
        }
    }
    // A slot claimed before is the first claimant's, whoever asks again.
    let again = nodes[2]
        .lease_slot((Pid(7), None), "nightly report", base)
        .await
        .unwrap();
    assert_ne!(again, Lease::Won);
    for node in &nodes {
        node.leave().await;
    }
}

/// A config agent's cron entries run on the node that runs the agent, and
/// move with it: after that node's kill -9 they fire on the node that took
/// the agent over, at the same PID, each slot once.
#[test]
fn cron_entries_run_where_their_agent_runs_and_move_with_it() {
    let bin = binary();
    let nats = NatsCluster::start(3);
    let root = tempfile::tempdir().unwrap();
    let config = config_of(json!([{
        "name": "ticker",
        "role": "agent",
        "runtime": "echo",
        "restart": { "policy": "permanent", "backoff_ms": [200, 1000] },
        "cron": [{
            "name": "tick",
            "expression": "* * * * * *",
            "action": "execute",
            "description": "tick"
        }]
    }]));
    let start = |name: &str| member(&bin, root.path(), &nats, name, &config);
    let mut a = start("a");
    let b = start("b");
    wait_for_nodes(&b, &["a", "b"], Duration::from_secs(10));
    let tick = |kernel: &Binary| -> Option<Value> {
        let entries = kernel.json(&["cron", "ls", "--json"]);
        entries
            .as_array()
            .unwrap()
            .iter()
            .find(|entry| entry["name"] == "tick")
            .cloned()
    };
    // The runs of `entry` that went well, at their slots (Unix ms).
    let ok_slots = |entry: &Value| -> Vec<u64> {
        entry["history"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|run| run["status"] == "ok")
            .map(|run| run["at_unix_ms"].as_u64().unwrap())
            .collect()
    };
    let wait_for_runs = |kernel: &Binary, after_ms: u64, what: &str| -> Value {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(entry) = tick(kernel)
                && ok_slots(&entry).iter().filter(|at| **at > after_ms).count() >= 2
            {
                return entry;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {:?}\n{}",
                tick(kernel),
                kernel.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };

    // On a, which runs ticker (the first to start claims it); b holds no
    // entry, and lists a's.
    let on_a = wait_for_runs(&a, 0, "no runs on a");
    let ticker = placed(&b, &["ticker"])["ticker"][0].0;
    assert_eq!(on_a["target"], ticker);
    assert_eq!(on_a["node"], "a");
    let seen_from_b = tick(&b).unwrap();
    assert_eq!(seen_from_b["node"], "a", "{seen_from_b}");

    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let died_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let on_b = wait_for_runs(&b, died_ms, "the entry did not move to b");
    assert_eq!(on_b["target"], ticker);
    assert_eq!(on_b["owner"], ticker);
    // Each slot once, in order; none fired twice.
    let slots = ok_slots(&on_b);
    assert!(slots.windows(2).all(|w| w[0] < w[1]), "{slots:?}");
    assert!(
        b.log()
            .contains("config agent taken over from a node that is gone"),
        "{}",
        b.log()
    );
}

/// Messages acknowledged to a config agent wait for it in the cluster's
/// mail stream: when its node is killed (kill -9) with messages queued
/// behind a slow turn, the node that takes the agent over delivers every
/// one it had not handed over, and none twice.
#[test]
fn acknowledged_messages_follow_their_agent_when_its_node_dies() {
    messages_follow_their_agent(Gone::Killed);
}

/// As above, with the node paused (SIGSTOP) past its TTL and resumed while
/// the node that took the agent over still holds the messages: both hold
/// them for a moment, and each is handed over by the one node whose delete
/// took it from the stream.
#[test]
fn acknowledged_messages_are_handed_over_once_when_a_paused_node_resumes() {
    messages_follow_their_agent(Gone::Paused);
}

/// How the node running the agent goes.
#[derive(Clone, Copy, PartialEq)]
enum Gone {
    Killed,
    Paused,
}

fn messages_follow_their_agent(gone: Gone) {
    use hivekernel_tests::llm_server::{LlmServer, Scripted, last_message};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const SENT: usize = 24;
    /// Turns a `tool_agent` runs at once (the default).
    const TURNS_AT_ONCE: usize = 4;
    let bin = binary();
    let nats = NatsCluster::start(3);
    let root = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Each turn takes 250 ms, so messages queue behind it. Killed, a's
    // first turns (four at a time) wait for their answers until a dies:
    // a turn hands its message over just before its model call leaves,
    // and a node killed in between loses that message (docs/CLUSTER.md,
    // "Known limits"), so a is killed only once every turn it began has
    // called the model and it begins no more.
    let asked = Arc::new(AtomicUsize::new(0));
    let llm = rt.block_on(LlmServer::answering({
        let asked = asked.clone();
        move |_| {
            let first = asked.fetch_add(1, Ordering::SeqCst) < TURNS_AT_ONCE;
            let wait = if gone == Gone::Killed && first {
                Duration::from_secs(60)
            } else {
                Duration::from_millis(250)
            };
            Scripted::content("noted").after(wait)
        }
    }));
    let mut config: Value = serde_json::from_str(&config_of(json!([{
        "name": "sink",
        "role": "agent",
        "runtime": "tool_agent",
        "model": "test-model",
        "system_prompt": "You take notes.",
        // Four turns at a time (the default): a message whose turn has
        // not called the model yet is not handed over, and follows the
        // agent when its node goes.
        "restart": { "policy": "permanent", "backoff_ms": [200, 1000] }
    }])))
    .unwrap();
    config["llm"] = json!({
        "provider": "openai", "base_url": llm.base_url(),
        "api_key_env": "HIVEKERNEL_TEST_NO_KEY", "max_retries": 0
    });
    let config = config.to_string();
    let start = |name: &str| member(&bin, root.path(), &nats, name, &config);
    let mut a = start("a");
    wait_for_ps(&a, "sink on a", |all| {
        all.values()
            .any(|(name, node)| name == "sink" && node == "a")
    });
    let b = start("b");
    let c = start("c");
    wait_for_nodes(&b, &["a", "b", "c"], Duration::from_secs(10));

    // Sent through b, held on a: each acknowledged with its id.
    let payloads: Vec<String> = (0..SENT).map(|i| format!("note-{i:03}")).collect();
    for payload in &payloads {
        let id = b.cli(&["send", "sink", payload]);
        assert!(
            id.trim().parse::<u64>().is_ok(),
            "{payload}: {id}\n{}",
            b.log()
        );
    }
    let seen_on_a = llm.request_count();
    assert!(seen_on_a < SENT, "a took every message first: {seen_on_a}");
    let taken_over = |kernel: &Binary| kernel.log().contains("config agent taken over");
    match gone {
        Gone::Killed => {
            let deadline = Instant::now() + Duration::from_secs(10);
            while llm.request_count() < TURNS_AT_ONCE {
                assert!(
                    Instant::now() < deadline,
                    "no {TURNS_AT_ONCE} turns on a\n{}",
                    a.log()
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            a.child.kill().unwrap();
            a.child.wait().unwrap();
        }
        Gone::Paused => {
            // Stopped as a turn's model call arrives: the message it
            // answers is delivered; the other turns under way have not
            // called the model yet, and a, resumed, finds itself fenced
            // before they do, leaving their messages to the taker.
            let before = llm.request_count();
            let deadline = Instant::now() + Duration::from_secs(10);
            while llm.request_count() == before {
                assert!(Instant::now() < deadline, "no turn on a\n{}", a.log());
                std::thread::sleep(Duration::from_millis(1));
            }
            signal(&a, "STOP");
            let deadline = Instant::now() + Duration::from_secs(15);
            while !taken_over(&b) && !taken_over(&c) {
                assert!(Instant::now() < deadline, "{}\n{}", b.log(), c.log());
                std::thread::sleep(Duration::from_millis(20));
            }
            // Resumed while the taker still works through what it read.
            signal(&a, "CONT");
        }
    }

    // Each payload is the new input of exactly one turn, on a or on the
    // node that took the agent over.
    let delivered = |inputs: &[String], payload: &str| {
        inputs
            .iter()
            .filter(|input| input.ends_with(payload))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let inputs: Vec<String> = llm.requests().iter().map(last_message).collect();
        let reached = payloads
            .iter()
            .filter(|payload| delivered(&inputs, payload) > 0)
            .count();
        if reached == SENT {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{reached} of {SENT} delivered: {inputs:?}\n{}\n{}\n{}",
            a.log(),
            b.log(),
            c.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Late copies would come within a turn or two.
    std::thread::sleep(Duration::from_millis(600));
    let inputs: Vec<String> = llm.requests().iter().map(last_message).collect();
    for payload in &payloads {
        let times = delivered(&inputs, payload);
        assert_eq!(times, 1, "{payload} delivered {times} times: {inputs:?}");
    }
    let taker = if taken_over(&b) { &b } else { &c };
    assert!(
        taker
            .log()
            .contains("messages that waited for the agent delivered"),
        "{}",
        taker.log()
    );
    if gone == Gone::Paused {
        assert_eq!(
            exit_code(&mut a, Duration::from_secs(10)),
            Some(3),
            "{}",
            a.log()
        );
    }
}

/// A node cut off from NATS stops acting for the processes that may move
/// once it cannot know it is still a member: a's config agent, in a long
/// loop of model calls, makes none once a's link to NATS has been silent
/// past half the TTL, while b takes the agent over; when the link comes
/// back a finds itself declared lost and exits, and the loop never
/// resumed.
#[test]
fn a_node_cut_off_from_nats_pauses_its_moving_processes_and_is_fenced() {
    use hivekernel_tests::llm_server::{LlmServer, Scripted};

    let bin = binary();
    let nats = NatsCluster::start(1);
    let link = hivekernel_tests::link::Link::to(&nats.addr(0));
    let root = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // a's model server: every answer is one more tool call.
    let on_a = rt.block_on(LlmServer::answering(|_| {
        Scripted::tool_calls(&[("c1", "list_children", "{}")]).after(Duration::from_millis(100))
    }));
    let elsewhere = rt.block_on(LlmServer::answering(|_| Scripted::content("noted")));
    let config = |llm: &str| {
        let mut config: Value = serde_json::from_str(&config_of(json!([{
            "name": "looper",
            "role": "agent",
            "runtime": "tool_agent",
            "model": "test-model",
            "system_prompt": "You look at your children, again and again.",
            "tools": ["list_children"],
            "restart": { "policy": "permanent", "backoff_ms": [200, 1000] }
        }])))
        .unwrap();
        config["llm"] = json!({
            "provider": "openai", "base_url": llm,
            "api_key_env": "HIVEKERNEL_TEST_NO_KEY", "max_retries": 0
        });
        config["tool_agent"] = json!({ "max_tool_iterations": 1000 });
        config.to_string()
    };
    // a reaches NATS through the link only.
    let mut a = node(
        &bin,
        root.path(),
        "a",
        &config(&on_a.base_url()),
        &[
            "--cluster",
            &nats.url_at(&link.addr().to_string()),
            "--node",
            "a",
        ],
    );
    wait_for_ps(&a, "looper on a", |all| {
        all.values()
            .any(|(name, node)| name == "looper" && node == "a")
    });
    let b = node(
        &bin,
        root.path(),
        "b",
        &config(&elsewhere.base_url()),
        &["--cluster", &nats.url(0), "--node", "b"],
    );
    wait_for_nodes(&b, &["a", "b"], Duration::from_secs(10));

    let sent = a.cli(&["send", "looper", "look"]);
    assert!(sent.trim().parse::<u64>().is_ok(), "{sent}\n{}", a.log());
    let deadline = Instant::now() + Duration::from_secs(10);
    while on_a.request_count() < 3 {
        assert!(Instant::now() < deadline, "no loop on a\n{}", a.log());
        std::thread::sleep(Duration::from_millis(20));
    }

    link.cut();
    let cut = Instant::now();
    // Past half the TTL a knows nothing of its membership: a call under
    // way ends, and no other starts.
    std::thread::sleep(Duration::from_millis(TTL_MS));
    let paused_at = on_a.request_count();
    let deadline = cut + Duration::from_secs(30);
    while !b.log().contains("config agent taken over") {
        assert!(
            Instant::now() < deadline,
            "not taken over\n{}\n{}",
            a.log(),
            b.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(TTL_MS));
    assert_eq!(
        on_a.request_count(),
        paused_at,
        "a's copy went on calling its model while cut off\n{}",
        a.log()
    );

    // Back in touch, a learns it was declared lost and exits; its copy
    // called no model meanwhile.
    link.mend();
    assert_eq!(
        exit_code(&mut a, Duration::from_secs(20)),
        Some(3),
        "{}",
        a.log()
    );
    assert_eq!(on_a.request_count(), paused_at, "{}", a.log());
    assert!(a.log().contains("fenced"), "{}", a.log());
}

/// A config agent's `node` and `where` choose the nodes it may run on: a
/// node they rule out neither starts it nor takes it over, and a node
/// they admit does, at its start or after the agent's node dies. A kernel
/// alone refuses to start a placed agent, saying why.
#[test]
fn config_agents_run_only_on_the_nodes_their_placement_admits() {
    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let agents = json!([
        { "name": "pinned", "role": "agent", "runtime": "echo", "node": "b",
          "restart": { "policy": "permanent", "backoff_ms": [100, 1000] } },
        { "name": "labelled", "role": "agent", "runtime": "echo", "where": { "gpu": "true" },
          "restart": { "policy": "permanent", "backoff_ms": [100, 1000] } },
        { "name": "free", "role": "agent", "runtime": "echo" }
    ]);
    let with_labels = |labels: Value| -> String {
        let mut config: Value = serde_json::from_str(&config_of(agents.clone())).unwrap();
        config["kernel"]["cluster"]["labels"] = labels;
        config.to_string()
    };
    let start =
        |name: &str, labels: Value| member(&bin, root.path(), &nats, name, &with_labels(labels));
    let a = start("a", json!({}));
    wait_for_ps(&a, "free on a", |all| {
        all.values()
            .any(|(name, node)| name == "free" && node == "a")
    });
    assert!(
        a.log().contains("none yet: it wants node \"b\""),
        "{}",
        a.log()
    );
    let mut b = start("b", json!({ "gpu": "true" }));
    wait_for_ps(&a, "pinned and labelled on b", |all| {
        ["pinned", "labelled"].iter().all(|agent| {
            all.values()
                .any(|(name, node)| name == agent && node == "b")
        })
    });

    // b dies: a, which neither admits, leaves both.
    b.child.kill().unwrap();
    b.child.wait().unwrap();
    wait_for_nodes(&a, &["a"], Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(TTL_MS));
    let now = placed(&a, &["pinned", "labelled", "free"]);
    assert!(
        now["pinned"].is_empty() && now["labelled"].is_empty(),
        "{now:?}"
    );
    assert_eq!(now["free"].len(), 1, "{now:?}");

    // c has the label: it takes the labelled one over, not the pinned one.
    let c = start("c", json!({ "gpu": "true" }));
    wait_for_ps(&a, "labelled on c", |all| {
        all.values()
            .any(|(name, node)| name == "labelled" && node == "c")
    });
    std::thread::sleep(Duration::from_millis(500));
    let now = placed(&c, &["pinned", "labelled"]);
    assert!(now["pinned"].is_empty(), "{now:?}\n{}", c.log());
    assert_eq!(now["labelled"].len(), 1, "{now:?}");

    // Alone, a placed agent is refused at start.
    let alone = json!({
        "kernel": { "listen": "127.0.0.1:0", "dashboard": { "enabled": false } },
        "agents": [{ "name": "pinned", "role": "agent", "runtime": "echo", "node": "b" }]
    });
    let (code, stderr) = start_fails(&bin, &root.path().join("alone"), &alone.to_string(), &[]);
    assert_ne!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("is placed (node \"b\")") && stderr.contains("this kernel runs alone"),
        "{stderr}"
    );
}

/// A spawned tree that would come back after a restart (permanent
/// processes) moves when its node dies: kill -9 of its node with messages
/// queued behind the root's slow turns, and the node that takes it over
/// starts the root and its permanent child as the PIDs they had, delivers
/// every acknowledged message the dead node had not handed over, none
/// twice, and reports the temporary child
/// exited (`node_lost`). A task in flight on the dead node fails at once
/// for its requester on another node, saying so. The dead node, started
/// again, leaves the tree where it runs now.
#[test]
fn spawned_processes_move_with_their_messages_when_their_node_dies() {
    use hivekernel_tests::llm_server::{LlmServer, Scripted, last_message};

    const SENT: usize = 16;
    let bin = binary();
    let nats = NatsCluster::start(3);
    let root = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let llm = rt.block_on(LlmServer::answering(|_| {
        Scripted::content("noted").after(Duration::from_millis(250))
    }));
    let start = |name: &str| with_model(&bin, root.path(), &nats, name, &llm.base_url());
    let mut a = start("a");
    let b = start("b");
    let c = start("c");
    wait_for_nodes(&b, &["a", "b", "c"], Duration::from_secs(10));

    let lead = a.json(&[
        "spawn",
        "--parent",
        "1",
        "--name",
        "lead",
        "--role",
        "lead",
        "--runtime",
        "tool_agent",
        "--model",
        "test-model",
        "--prompt",
        "You take notes.",
        "--restart",
        "permanent",
        "--json",
    ])["pid"]
        .as_u64()
        .unwrap();
    // Spawned through b: forwarded to the parent's node.
    let worker = b.json(&[
        "spawn",
        "--parent",
        &lead.to_string(),
        "--name",
        "worker",
        "--role",
        "worker",
        "--runtime",
        "echo",
        "--restart",
        "permanent",
        "--json",
    ])["pid"]
        .as_u64()
        .unwrap();
    let scratch = spawn(&a, lead, "scratch", "worker");
    // A tree that does not move: a temporary root and its child.
    let loner = spawn(&a, 1, "loner", "lead");
    let loner_kid = spawn(&a, loner, "loner-kid", "worker");
    wait_for_ps(&b, "the tree on a", |all| {
        [lead, worker, scratch, loner, loner_kid]
            .iter()
            .all(|pid| all.get(pid).is_some_and(|(_, node)| node == "a"))
    });

    let payloads: Vec<String> = (0..SENT).map(|i| format!("memo-{i:03}")).collect();
    for payload in &payloads {
        let id = b.cli(&["send", &lead.to_string(), payload]);
        assert!(
            id.trim().parse::<u64>().is_ok(),
            "{payload}: {id}\n{}",
            b.log()
        );
    }
    assert!(llm.request_count() < SENT, "a took every message first");
    // A task queued behind them, asked through b: in flight when a dies.
    let task = b
        .command(&["exec", &lead.to_string(), "summarize the memos"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    // Its requester is told the node was lost, not left to its timeout.
    let told = task.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&told.stderr);
    assert!(
        !told.status.success() && said.contains("node_lost"),
        "{said}"
    );

    let delivered = |inputs: &[String], payload: &str| {
        inputs
            .iter()
            .filter(|input| input.ends_with(payload))
            .count()
    };
    // Every message a had not handed over is delivered where the tree
    // runs now. The one its runner had just taken out of the stream when
    // it died (the kill may land before that turn's model call) is lost
    // with the turn, as a crash loses the turn it runs: at most one.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let inputs: Vec<String> = llm.requests().iter().map(last_message).collect();
        let reached = payloads
            .iter()
            .filter(|payload| delivered(&inputs, payload) > 0)
            .count();
        let last = payloads.last().is_some_and(|p| delivered(&inputs, p) > 0);
        if reached == SENT || (reached == SENT - 1 && last) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{reached} of {SENT} delivered: {inputs:?}\n{}\n{}\n{}",
            a.log(),
            b.log(),
            c.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(600));
    let inputs: Vec<String> = llm.requests().iter().map(last_message).collect();
    let mut missing = Vec::new();
    for payload in &payloads {
        let times = delivered(&inputs, payload);
        assert!(times <= 1, "{payload} delivered {times} times: {inputs:?}");
        if times == 0 {
            missing.push(payload.clone());
        }
    }
    assert!(missing.len() <= 1, "not delivered: {missing:?}: {inputs:?}");

    // Both permanent processes on one live node, as the PIDs they had; the
    // temporary one gone, reported exited by the node that took the tree.
    let now = everyone(&b);
    let (lead_node, worker_node) = (&now[&lead].1, &now[&worker].1);
    assert!(lead_node == "b" || lead_node == "c", "{now:?}");
    assert_eq!(lead_node, worker_node, "{now:?}");
    assert_eq!(now[&lead].0, "lead");
    assert!(!now.contains_key(&scratch), "{now:?}");
    let taker = if lead_node == "b" { &b } else { &c };
    assert!(
        taker
            .log()
            .contains("processes taken over from a node that is gone"),
        "{}",
        taker.log()
    );
    // The events come through the cluster's stream, a moment after: the
    // temporary child's, and those of the tree that does not move, once
    // each, from the node that judged the loss.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = taker.cli(&["events", "--json", "--type", "exited"]);
        let ended = |pid: u64| {
            text.lines()
                .filter(|line| {
                    line.contains(&format!("\"pid\":{pid},")) && line.contains("node_lost")
                })
                .count()
        };
        let counts = [ended(scratch), ended(loner), ended(loner_kid)];
        if counts == [1, 1, 1] {
            break;
        }
        assert!(
            Instant::now() < deadline && counts.iter().all(|n| *n <= 1),
            "{counts:?}\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!everyone(&b).contains_key(&loner_kid));
    // The moved child still answers, on its new node.
    assert!(
        b.cli(&["exec", &worker.to_string(), "still here"])
            .contains("still here")
    );

    // a, started again from its store, leaves the tree where it runs.
    let a = start("a");
    wait_for_nodes(&b, &["a", "b", "c"], Duration::from_secs(15));
    std::thread::sleep(Duration::from_millis(500));
    let now = everyone(&b);
    assert_eq!(&now[&lead].1, lead_node, "{now:?}\n{}", a.log());
    assert_eq!(&now[&worker].1, lead_node, "{now:?}");
    assert!(a.log().contains("process not brought back"), "{}", a.log());
}

/// A lost node's tree placed by labels moves only to a node with them:
/// here the one node that judges the loss (b, whose TTL is the shortest)
/// lacks them, so it offers the tree to c, which has them, while it takes
/// an unplaced tree itself.
#[test]
fn a_lost_tree_moves_only_to_a_node_its_placement_admits() {
    let bin = binary();
    let nats = NatsCluster::start(3);
    let root = tempfile::tempdir().unwrap();
    let settings = |gpu: bool, ttl_ms: u64| {
        let labels = if gpu {
            json!({ "gpu": "true" })
        } else {
            json!({})
        };
        config(Some(json!({
            "servers": ["nats://127.0.0.1:1"],
            "heartbeat_ms": HEARTBEAT_MS,
            "node_ttl_ms": ttl_ms,
            "labels": labels
        })))
    };
    let mut a = member(&bin, root.path(), &nats, "a", &settings(true, TTL_MS));
    let b = member(&bin, root.path(), &nats, "b", &settings(false, TTL_MS));
    // c judges a node only after 6 s: b has claimed the loss by then.
    let c = member(&bin, root.path(), &nats, "c", &settings(true, 6_000));
    wait_for_nodes(&b, &["a", "b", "c"], Duration::from_secs(10));

    // c busier than a, so the placed spawn picks a.
    for i in 0..3 {
        b.cli(&[
            "spawn",
            "--parent",
            "1",
            "--name",
            &format!("filler{i}"),
            "--runtime",
            "echo",
            "--node",
            "c",
        ]);
    }
    std::thread::sleep(Duration::from_millis(4 * HEARTBEAT_MS));
    let permanent = |kernel: &Binary, name: &str, extra: &[&str]| -> u64 {
        let mut args = vec![
            "spawn",
            "--parent",
            "1",
            "--name",
            name,
            "--runtime",
            "echo",
            "--restart",
            "permanent",
            "--json",
        ];
        args.extend_from_slice(extra);
        kernel.json(&args)["pid"].as_u64().unwrap()
    };
    let placed = permanent(&b, "trainer", &["--where", "gpu=true"]);
    let plain = permanent(&a, "plain", &[]);
    let placed_child = spawn(&b, placed, "shard", "worker");
    wait_for_ps(&b, "both roots on a", |all| {
        [placed, plain, placed_child]
            .iter()
            .all(|pid| all.get(pid).is_some_and(|(_, node)| node == "a"))
    });

    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = everyone(&b);
        let on = |pid: u64| now.get(&pid).map(|(_, node)| node.clone());
        if on(placed).as_deref() == Some("c") && on(plain).as_deref() == Some("b") {
            // The temporary child did not move with its root.
            assert!(!now.contains_key(&placed_child), "{now:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{now:?}\n{}\n{}",
            b.log(),
            c.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        b.log().contains("offered to a node its placement admits"),
        "{}",
        b.log()
    );
    assert!(
        c.log()
            .contains("processes taken over from a node that is gone"),
        "{}",
        c.log()
    );
    // It runs there: a task answers through b.
    assert!(
        b.cli(&["exec", &placed.to_string(), "hello"])
            .contains("hello")
    );
}

/// One event as `events --json` prints it: (seq, node, pid, type).
type EventKey = (u64, String, u64, String);

/// The key of one line of `events --json`.
fn event_key(line: &str) -> EventKey {
    let event: Value = serde_json::from_str(line).unwrap_or_else(|err| panic!("{err}: {line}"));
    (
        event["seq"].as_u64().unwrap(),
        event["node"].as_str().unwrap_or("").to_owned(),
        event["pid"].as_u64().unwrap(),
        event["type"].as_str().unwrap().to_owned(),
    )
}

/// Every event `kernel` replays now, in order.
fn replayed_events(kernel: &Binary, extra: &[&str]) -> Vec<EventKey> {
    let mut args = vec!["events", "--since", "0", "--json"];
    args.extend_from_slice(extra);
    kernel.cli(&args).lines().map(event_key).collect()
}

/// Every node's events come in one sequence (`HK_EVENTS`'s), the same
/// replayed from any node, each event with its node; a follower on one
/// node sees the others' events as they happen, and a peer's entry on the
/// events subjects that is no event is skipped.
#[test]
fn every_nodes_events_come_in_one_order_from_any_node() {
    let bin = binary();
    let nats = NatsCluster::start(3);
    let root = tempfile::tempdir().unwrap();
    let a = flagged(&bin, root.path(), &nats, "a");
    let b = flagged(&bin, root.path(), &nats, "b");
    let c = flagged(&bin, root.path(), &nats, "c");
    wait_for_nodes(&a, &["a", "b", "c"], Duration::from_secs(10));

    // A follower on c, from the start of the stream on.
    let mut follower = Follower::start(&c, &["events", "--follow", "--since", "0", "--json"]);
    let mut seen = Vec::new();
    let mut follow_until = |what: &str, done: &dyn Fn(&[EventKey]) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !done(&seen) {
            let left = deadline.saturating_duration_since(Instant::now());
            match follower.next(left) {
                Some(line) => seen.push(event_key(&line)),
                None => panic!("{what}: followed on c {seen:?}\n{}", c.log()),
            }
        }
        seen.clone()
    };

    let on_a = spawn(&a, 1, "on-a", "worker");
    let on_b = spawn(&b, 1, "on-b", "worker");
    // Killed through a: the kill is forwarded, the exit is b's event.
    a.cli(&["kill", &on_b.to_string()]);
    let has = |seen: &[EventKey], node: &str, pid: u64, kind: &str| {
        seen.iter()
            .any(|(_, n, p, k)| n == node && *p == pid && k == kind)
    };
    let seen_now = follow_until("both spawns and b's exit", &|seen| {
        has(seen, "a", on_a, "spawned")
            && has(seen, "b", on_b, "spawned")
            && has(seen, "b", on_b, "exited")
    });
    // The config agent started on a, before anything else happened.
    let greeter = everyone(&a)
        .into_iter()
        .find(|(_, (name, _))| name == "greeter")
        .unwrap()
        .0;
    assert!(has(&seen_now, "a", greeter, "spawned"), "{seen_now:?}");
    assert!(
        seen_now.windows(2).all(|w| w[0].0 < w[1].0),
        "one ascending sequence: {seen_now:?}"
    );

    // Replayed from any node: the same events under the same numbers.
    let replays = [&a, &b, &c].map(|kernel| replayed_events(kernel, &[]));
    let common = replays.iter().map(|r| r.last().unwrap().0).min().unwrap();
    let upto = |replay: &[EventKey]| -> Vec<_> {
        replay.iter().filter(|e| e.0 <= common).cloned().collect()
    };
    assert_eq!(upto(&replays[0]), upto(&replays[1]));
    assert_eq!(upto(&replays[0]), upto(&replays[2]));
    for event in &seen_now {
        assert!(
            replays[0].contains(event),
            "{event:?} not replayed: {:?}",
            replays[0]
        );
    }
    // The sequence has no gaps, and --since N starts right after N.
    assert!(
        replays[0].windows(2).all(|w| w[1].0 == w[0].0 + 1),
        "{:?}",
        replays[0]
    );
    let middle = replays[0][replays[0].len() / 2].0;
    let after = b.cli(&["events", "--since", &middle.to_string(), "--json"]);
    assert_eq!(
        after.lines().next().map(|line| event_key(line).0),
        Some(middle + 1),
        "{after}"
    );

    // One process's events, from a node that never held it.
    let only_b = replayed_events(&c, &["--pid", &on_b.to_string()]);
    assert!(
        !only_b.is_empty()
            && only_b
                .iter()
                .all(|(_, node, pid, _)| node == "b" && *pid == on_b),
        "{only_b:?}"
    );
    assert!(has(&only_b, "b", on_b, "exited"), "{only_b:?}");
    // The newest N, whichever nodes they came from.
    let tail = c.cli(&["events", "--tail", "2", "--json"]);
    let tail: Vec<_> = tail.lines().map(event_key).collect();
    assert_eq!(tail.len(), 2, "{tail:?}");
    assert_eq!(tail[1].0, tail[0].0 + 1, "{tail:?}");
    // The text form says the node after the process.
    let text = c.cli(&["events", "--pid", &on_a.to_string(), "--type", "spawned"]);
    assert!(
        text.contains(&format!("pid={on_a} node=a spawned")),
        "{text}"
    );

    // Something on the events subjects that is no event is skipped; the
    // follower goes on.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let peer = nats.client(1).await.unwrap();
        let js = async_nats::jetstream::new(peer);
        js.publish("hk.events.x", "{not an event".into())
            .await
            .unwrap()
            .await
            .unwrap();
    });
    let on_c = spawn(&c, 1, "on-c", "worker");
    follow_until("c's spawn after a stray entry", &|seen| {
        has(seen, "c", on_c, "spawned")
    });
    assert!(
        c.log()
            .contains("was refused: not signed with the cluster secret"),
        "{}",
        c.log()
    );

    // An event deleted from the stream (by an operator) is a `pruned`
    // marker where it was; a replay whose last event was deleted still ends.
    let last = rt.block_on(async {
        let peer = nats.client(2).await.unwrap();
        let js = async_nats::jetstream::new(peer);
        let stream = js.get_stream("HK_EVENTS").await.unwrap();
        let last = stream.get_info().await.unwrap().state.last_sequence;
        assert!(stream.delete_message(middle).await.unwrap());
        assert!(stream.delete_message(last).await.unwrap());
        last
    });
    let text = a.cli(&["events", "--since", &(middle - 1).to_string(), "--json"]);
    let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(
        (&first["type"], &first["missed"]),
        (&json!("pruned"), &json!(1)),
        "{text}"
    );
    let seqs: Vec<u64> = text.lines().skip(1).map(|line| event_key(line).0).collect();
    assert_eq!(seqs.first(), Some(&(middle + 1)), "{text}");
    assert!(!seqs.contains(&last), "{text}");
}

/// One node's dashboard shows the whole cluster, in a real browser
/// (tests/browser/cluster.mjs): which node it is, every node's processes
/// with their node, the nodes with their labels, and every node's events.
#[test]
fn one_nodes_dashboard_shows_the_whole_cluster_in_a_real_browser() {
    let playwright = hivekernel_tests::dashboard::playwright();
    let chromium = hivekernel_tests::dashboard::chromium();
    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let with = |dashboard: bool, labels: Value| {
        let mut config: Value = serde_json::from_str(&config(Some(json!({
            "servers": ["nats://127.0.0.1:1"],
            "heartbeat_ms": HEARTBEAT_MS,
            "node_ttl_ms": TTL_MS,
            "labels": labels
        }))))
        .unwrap();
        config["kernel"]["dashboard"] = json!({ "enabled": dashboard });
        config.to_string()
    };
    let a = member(&bin, root.path(), &nats, "a", &with(true, json!({})));
    let b = member(
        &bin,
        root.path(),
        &nats,
        "b",
        &with(false, json!({ "gpu": "true" })),
    );
    wait_for_nodes(&a, &["a", "b"], Duration::from_secs(10));
    let on_b = spawn(&b, 1, "on-b", "worker");

    let addr = hivekernel_tests::dashboard::address(&a);
    let admin = std::fs::read_to_string(a.dir.join("data/admin.token")).unwrap();
    let shots =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/dashboard-screenshots");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("browser/cluster.mjs");
    let run = Command::new("node")
        .arg(script)
        .env("DASHBOARD_URL", format!("http://{addr}/"))
        .env("ADMIN_TOKEN", admin.trim())
        .env("ON_B", on_b.to_string())
        .env("SHOTS", shots)
        .env("CHROMIUM", chromium)
        .env("PLAYWRIGHT", playwright)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}\n{}\n--- node a ---\n{}",
        String::from_utf8_lossy(&run.stderr),
        a.log()
    );
    assert!(stdout.contains("ok   the events view shows"), "{stdout}");
}

/// The `cron_run` events of `pid` as `kernel` replays them: each run's node.
fn cron_runs_of(kernel: &Binary, pid: u64) -> Vec<String> {
    kernel
        .cli(&[
            "events",
            "--json",
            "--type",
            "cron_run",
            "--pid",
            &pid.to_string(),
        ])
        .lines()
        .map(|line| event_key(line).1)
        .collect()
}

/// An operator's cron entries reach every node from any node: one aimed
/// at a process on another node is added there (and runs there); `cron
/// ls` lists every node's entries, each with its node; `disable` and `rm`
/// of a name another node holds act there; a node that does not answer is
/// named.
#[test]
fn cron_entries_are_reached_on_every_node_from_any_node() {
    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let a = flagged(&bin, root.path(), &nats, "a");
    let b = flagged(&bin, root.path(), &nats, "b");
    wait_for_nodes(&a, &["a", "b"], Duration::from_secs(10));
    let ticker = spawned_pid(&spawn_on(&a, 1, "ticker", "b", &[]));
    let target = ticker.to_string();
    let added = a.cli(&[
        "cron",
        "add",
        "--target",
        &target,
        "tick",
        "* * * * * *",
        "tick",
    ]);
    assert!(added.contains("tick") && added.contains(" b "), "{added}");
    let wait_for_run = || {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cron_runs_of(&a, ticker).iter().any(|node| node == "b") {
            assert!(Instant::now() < deadline, "no run on b\n{}", b.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait_for_run();

    let tick_of = |kernel: &Binary| {
        let listed = kernel.json(&["cron", "ls", "--json"]);
        listed
            .as_array()
            .unwrap()
            .iter()
            .find(|entry| entry["name"] == "tick")
            .cloned()
    };
    for kernel in [&a, &b] {
        let tick = tick_of(kernel).expect("tick listed");
        assert_eq!(tick["node"], "b", "{tick}");
        assert_eq!(tick["target"], ticker, "{tick}");
    }
    let table = a.cli(&["cron", "ls"]);
    assert!(table.lines().next().unwrap().contains("NODE"), "{table}");

    a.cli(&["cron", "disable", "tick"]);
    assert_eq!(tick_of(&b).unwrap()["enabled"], false);
    a.cli(&["cron", "rm", "tick"]);
    assert!(tick_of(&a).is_none() && tick_of(&b).is_none());
    let out = a.command(&["cron", "rm", "tick"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no cron entry named"));

    // b paused: a lists its own entries and names b.
    signal(&b, "STOP");
    let out = a.command(&["cron", "ls"]).output().unwrap();
    signal(&b, "CONT");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: node b did not answer; its cron entries are not shown"),
        "{stderr}"
    );
}

/// An operator's cron entry aimed at a permanent spawned process follows
/// it when its node dies: it runs on the node that took the process over,
/// kept in `hk_cron`; removed there, it is gone from the cluster too.
#[test]
fn cron_entries_follow_their_target_when_its_node_dies() {
    let bin = binary();
    let nats = NatsCluster::start(1);
    let root = tempfile::tempdir().unwrap();
    let mut a = flagged(&bin, root.path(), &nats, "a");
    let b = flagged(&bin, root.path(), &nats, "b");
    wait_for_nodes(&b, &["a", "b"], Duration::from_secs(10));
    let ticker = a.json(&[
        "spawn",
        "--parent",
        "1",
        "--name",
        "ticker",
        "--role",
        "worker",
        "--runtime",
        "echo",
        "--restart",
        "permanent",
        "--json",
    ])["pid"]
        .as_u64()
        .unwrap();
    let added = a.cli(&[
        "cron",
        "add",
        "--target",
        &ticker.to_string(),
        "tick",
        "* * * * * *",
        "tick",
    ]);
    assert!(added.contains("tick"), "{added}");
    let wait_for = |what: &str, done: &dyn Fn(&[String]) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let runs = cron_runs_of(&b, ticker);
            if done(&runs) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: {runs:?}\n{}", b.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait_for("a run on a", &|runs| runs.iter().any(|node| node == "a"));

    a.child.kill().unwrap();
    a.child.wait().unwrap();
    wait_for("a run on b after a died", &|runs| {
        runs.iter().any(|node| node == "b")
    });
    let listed = b.json(&["cron", "ls", "--json"]);
    let tick = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|entry| entry["name"] == "tick")
        .unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(tick["target"], ticker, "{listed}");
    assert!(
        b.log().contains("cron entry taken over with its target"),
        "{}",
        b.log()
    );

    // Removed on its new node: gone from the cluster's bucket too.
    b.cli(&["cron", "rm", "tick"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let left = rt.block_on(async {
        let peer = nats.client(0).await.unwrap();
        let js = async_nats::jetstream::new(peer);
        let crons = js.get_key_value("hk_cron").await.unwrap();
        crons.get(format!("{ticker}.tick")).await.unwrap()
    });
    assert!(left.is_none(), "{left:?}");
}
