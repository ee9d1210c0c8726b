//! Forgeries on a cluster's NATS (docs/CLUSTER.md, "Signed messages"):
//! real nodes (the real binary) sharing a cluster secret, and an attacker
//! holding the NATS credentials but not the secret, as a raw NATS client.
//! An operation it publishes is refused (the command it asks for never
//! runs), a genuine operation it captured and publishes again is dropped
//! as a replay, its loss claim does not stop the node it names, and its
//! event is not shown by `hivekernel events`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use bytes::Bytes;
use futures::StreamExt;
use hivekernel_tests::binary::Binary;
use hivekernel_tests::nats::NatsCluster;
use serde_json::{Value, json};

/// The cluster secret every node of these tests holds.
const SECRET: &str = "5f0c3a9d8e7b6a5f4e3d2c1b0a99887766554433221100ffeeddccbbaa998877";

fn binary() -> PathBuf {
    match hivekernel_tests::build_hivekernel() {
        Ok(bin) => bin,
        Err((bin, why)) => panic!("cannot build {}: {why}", bin.display()),
    }
}

/// Node `name` of `nats` in `root/name`, with the cluster secret, timed for tests.
fn node(bin: &Path, root: &Path, nats: &NatsCluster, name: &str) -> Binary {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("cluster.secret");
    std::fs::write(&secret, SECRET).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let config = json!({
        "kernel": {
            "listen": "127.0.0.1:0",
            "shutdown_grace_ms": 0,
            "dashboard": { "enabled": false },
            "cluster": {
                "servers": ["nats://127.0.0.1:1"],
                "heartbeat_ms": 200,
                "node_ttl_ms": 1_500,
                "secret_file": "cluster.secret"
            }
        },
        "agents": []
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    Binary::start_with(bin, &dir, &["--cluster", &nats.urls(), "--node", name])
}

/// Waits until `kernel` sees the nodes `names`.
fn wait_for_nodes(kernel: &Binary, names: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seen: Vec<String> = kernel
            .json(&["nodes", "--json"])
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["name"].as_str().unwrap().to_owned())
            .collect();
        let mut seen = seen;
        seen.sort();
        if seen == names {
            return;
        }
        assert!(Instant::now() < deadline, "{seen:?}\n{}", kernel.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The JSON of a message a node published: after its signature line, if
/// it has one (an unsigned cluster's is the JSON itself).
fn body(payload: &[u8]) -> Value {
    let json = if payload.starts_with(b"hk1 ") {
        let end = payload.iter().position(|&b| b == b'\n').unwrap();
        &payload[end + 1..]
    } else {
        payload
    };
    serde_json::from_slice(json).unwrap()
}

/// Waits up to `limit` for `check` to hold.
fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    check()
}

/// A spawn through `a` of an `exec` process on node `b` that appends a
/// line to `marker`; its PID.
fn spawn_marker(a: &Binary, name: &str, marker: &Path) -> u64 {
    let line = format!("echo {name} >> {}", marker.display());
    let out = a
        .command(&[
            "spawn",
            "--parent",
            "1",
            "--name",
            name,
            "--node",
            "b",
            "--restart",
            "temporary",
            "--json",
            "--",
            "sh",
            "-c",
            &line,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    answer["pid"].as_u64().unwrap()
}

fn lines(marker: &Path) -> Vec<String> {
    std::fs::read_to_string(marker)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forged_operation_is_refused_and_a_replayed_one_dropped() {
    let bin = binary();
    let nats = tokio::task::spawn_blocking(|| NatsCluster::start(1))
        .await
        .unwrap();
    let root = tempfile::tempdir().unwrap();
    let marker = root.path().join("marker");
    let attacker = nats.client(0).await.unwrap();
    // Every operation sent to node b, as the attacker sees it on the wire.
    let mut wire = attacker.subscribe("hk.node.b.rpc").await.unwrap();
    attacker.flush().await.unwrap();

    let (a, b) = tokio::task::block_in_place(|| {
        let a = node(&bin, root.path(), &nats, "a");
        let b = node(&bin, root.path(), &nats, "b");
        wait_for_nodes(&a, &["a", "b"]);
        // A genuine spawn, asked of a, runs on b.
        spawn_marker(&a, "genuine", &marker);
        assert!(
            eventually(Duration::from_secs(20), || lines(&marker) == ["genuine"]),
            "{:?}\n{}",
            lines(&marker),
            b.log()
        );
        (a, b)
    });
    // The spawn as it travelled.
    let captured = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let message = wire.next().await.unwrap();
            if body(&message.payload)["op"] == "spawn" {
                return message.payload;
            }
        }
    })
    .await
    .expect("the genuine spawn was seen on the wire");

    // Forged: the same operation, asking for another command, unsigned,
    // and under a signature line made without the secret.
    let mut forged = body(&captured);
    forged["args"]["request"]["name"] = json!("forged");
    let line = format!("echo forged >> {}", marker.display());
    forged["args"]["command"]["argv"] = json!(["sh", "-c", line]);
    let unsigned = Bytes::from(forged.to_string());
    let mut with_header = b"hk1 a 1 0000000000000001 ".to_vec();
    with_header.extend_from_slice(&[b'0'; 64]);
    with_header.push(b'\n');
    with_header.extend_from_slice(&unsigned);
    for payload in [unsigned, Bytes::from(with_header)] {
        let answered = tokio::time::timeout(
            Duration::from_secs(3),
            attacker.request("hk.node.b.rpc", payload),
        )
        .await;
        assert!(
            !matches!(answered, Ok(Ok(_))),
            "node b answered a forged operation: {answered:?}"
        );
    }
    // Replayed: the genuine operation, byte for byte, after it ran.
    let replayed = tokio::time::timeout(
        Duration::from_secs(3),
        attacker.request("hk.node.b.rpc", captured.clone()),
    )
    .await;
    assert!(
        !matches!(replayed, Ok(Ok(_))),
        "node b answered a replayed operation: {replayed:?}"
    );

    tokio::task::block_in_place(|| {
        // Nothing ran: after a genuine spawn that came later has run,
        // the marker holds only the genuine lines.
        spawn_marker(&a, "later", &marker);
        assert!(
            eventually(Duration::from_secs(20), || lines(&marker).len() >= 2),
            "{}",
            b.log()
        );
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(lines(&marker), ["genuine", "later"], "{}", b.log());
        let log = b.log();
        assert!(
            log.contains("refused an operation from another node: not signed"),
            "{log}"
        );
        assert!(log.contains("signature does not match"), "{log}");
        assert!(log.contains("a replay of one seen already"), "{log}");
        // The processes b runs: the two genuine ones only.
        let listed = b.cli(&["ps", "--json"]);
        assert!(!listed.contains("\"forged\""), "{listed}");
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forged_loss_claim_does_not_stop_the_node_it_names() {
    let bin = binary();
    let nats = tokio::task::spawn_blocking(|| NatsCluster::start(1))
        .await
        .unwrap();
    let root = tempfile::tempdir().unwrap();
    let (mut a, b) = tokio::task::block_in_place(|| {
        let a = node(&bin, root.path(), &nats, "a");
        let b = node(&bin, root.path(), &nats, "b");
        wait_for_nodes(&a, &["a", "b"]);
        wait_for_nodes(&b, &["a", "b"]);
        (a, b)
    });
    let epoch = b
        .json(&["nodes", "--json"])
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "a")
        .unwrap()["epoch"]
        .as_u64()
        .unwrap();
    let attacker = jetstream::new(nats.client(0).await.unwrap());
    let claims = attacker.get_key_value("hk_claims").await.unwrap();
    claims
        .create(format!("lost.a.{epoch}"), Bytes::from_static(b"b"))
        .await
        .unwrap();

    tokio::task::block_in_place(|| {
        // Ten heartbeats and more: a reads the claims at every one.
        std::thread::sleep(Duration::from_secs(3));
        assert!(a.child.try_wait().unwrap().is_none(), "{}", a.log());
        assert!(!a.log().contains("fenced"), "{}", a.log());
        wait_for_nodes(&b, &["a", "b"]);
        assert!(
            a.log().contains("refused a value of hk_claims"),
            "{}",
            a.log()
        );
        // And it still acts as a node: a spawn asked of b runs on a.
        let spawned = b.json(&[
            "spawn",
            "--parent",
            "1",
            "--name",
            "on-a",
            "--node",
            "a",
            "--runtime",
            "echo",
            "--json",
        ]);
        let pid = spawned["pid"].as_u64().unwrap().to_string();
        assert_eq!(b.json(&["describe", &pid, "--json"])["node"], "a");
        a.terminate();
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forged_event_is_not_shown() {
    let bin = binary();
    let nats = tokio::task::spawn_blocking(|| NatsCluster::start(1))
        .await
        .unwrap();
    let root = tempfile::tempdir().unwrap();
    let (a, b) = tokio::task::block_in_place(|| {
        let a = node(&bin, root.path(), &nats, "a");
        let b = node(&bin, root.path(), &nats, "b");
        wait_for_nodes(&b, &["a", "b"]);
        a.cli(&[
            "spawn",
            "--parent",
            "1",
            "--name",
            "before",
            "--runtime",
            "echo",
        ]);
        (a, b)
    });
    let attacker = jetstream::new(nats.client(0).await.unwrap());
    let stream = attacker.get_stream("HK_EVENTS").await.unwrap();
    // A genuine event of a's, as stored, made into another.
    let genuine = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Ok(message) = stream.get_last_raw_message_by_subject("hk.events.a").await {
                return message.payload;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("a published its events");
    let mut forged = body(&genuine);
    forged["pid"] = json!(777_777);
    let ack = attacker
        .publish("hk.events.a", Bytes::from(forged.to_string()))
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(!ack.duplicate);

    tokio::task::block_in_place(|| {
        // A genuine event after it, which `events` shows once it has read past the forgery.
        a.cli(&[
            "spawn",
            "--parent",
            "1",
            "--name",
            "after-forgery",
            "--runtime",
            "echo",
        ]);
        let mut shown = String::new();
        assert!(
            eventually(Duration::from_secs(20), || {
                shown = b.cli(&["events", "--json"]);
                shown.contains("after-forgery")
            }),
            "{shown}\n{}",
            b.log()
        );
        assert!(!shown.contains("777777"), "{shown}");
        assert!(
            b.log().contains("refused an event on hk.events.a"),
            "{}",
            b.log()
        );
    });
}
