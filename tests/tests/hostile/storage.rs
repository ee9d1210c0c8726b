//! Filling the disk with one process token, on the real binary.
//!
//! Once, quotas were per owner only and a killed child's artifacts stayed:
//! an agent that spawned children, had each store 64 MiB, killed them and
//! spawned more grew the store without end, and deleted data never gave
//! its space back. Now a subtree's quota counts everything its processes
//! keep, alive or gone, the store has a ceiling, and deleted data's pages
//! go back to the file system.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hivekernel_proto::v1 as pb;
use hivekernel_tests::binary::Binary;
use hivekernel_tests::served::{Bearer, Client};
use serde_json::{Value, json};

/// The most one artifact may hold here, and what each store sends.
const ARTIFACT: usize = 1 << 20;

fn binary() -> PathBuf {
    match hivekernel_tests::build_hivekernel() {
        Ok(bin) => bin,
        Err((bin, why)) => panic!("cannot build {}: {why}", bin.display()),
    }
}

fn start(dir: &Path, kernel: Value) -> Binary {
    let mut settings = json!({
        "listen": "127.0.0.1:0",
        "default_runtime": "echo",
        "artifacts": {"max_bytes": ARTIFACT, "max_bytes_per_owner": 64 * ARTIFACT},
    });
    if let (Some(settings), Some(extra)) = (settings.as_object_mut(), kernel.as_object()) {
        settings.extend(extra.clone());
    }
    let config = json!({ "kernel": settings });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    Binary::start(&binary(), dir)
}

/// A command that writes its process token to `file` and waits.
fn hand_over_token(file: &Path) -> Vec<String> {
    let script = format!(
        "printf %s \"$HIVEKERNEL_TOKEN\" > {0}.tmp && mv {0}.tmp {0}; exec sleep 600",
        file.display()
    );
    vec!["sh".into(), "-c".into(), script]
}

/// The token an exec agent wrote to `file`.
fn token_in(file: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(token) = std::fs::read_to_string(file)
            && !token.trim().is_empty()
        {
            return token.trim().to_owned();
        }
        assert!(Instant::now() < deadline, "no token in {}", file.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The attacker: an exec agent under PID 1, started by the operator,
/// whose token the test holds.
fn attacker(kernel: &Binary, dir: &Path) -> (u64, String) {
    let file = dir.join("attacker.token");
    let argv = hand_over_token(&file);
    let mut args = vec!["spawn", "--parent", "1", "--name", "attacker", "--"];
    args.extend(argv.iter().map(String::as_str));
    kernel.cli(&args);
    let token = token_in(&file);
    let ps = kernel.json(&["ps", "--json"]);
    let pid = ps
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "attacker")
        .and_then(|p| p["pid"].as_u64())
        .unwrap_or_else(|| panic!("no attacker in {ps}"));
    (pid, token)
}

async fn connect(addr: &str, token: &str) -> Client {
    let addr = match addr.contains("://") {
        true => addr.to_owned(),
        false => format!("http://{addr}"),
    };
    let channel = tonic::transport::Endpoint::from_shared(addr)
        .unwrap()
        .connect()
        .await
        .unwrap();
    pb::kernel_client::KernelClient::with_interceptor(channel, Bearer::new(token))
}

/// `parent` (the client's process) spawns an exec child that hands its
/// token to `dir/NAME.token`; its PID and a client with its token.
async fn child(
    parent: &mut Client,
    parent_pid: u64,
    addr: &str,
    dir: &Path,
    name: &str,
    limits: Option<pb::Limits>,
) -> (u64, Client) {
    let file = dir.join(format!("{name}.token"));
    let pid = parent
        .spawn(pb::SpawnRequest {
            parent: parent_pid,
            name: name.into(),
            command: hand_over_token(&file),
            limits,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|status| panic!("spawn {name}: {status:?}"))
        .into_inner()
        .pid;
    (pid, connect(addr, &token_in(&file)).await)
}

async fn store(client: &mut Client, name: &str, bytes: usize) -> Result<u64, tonic::Status> {
    let request = pb::StoreArtifactRequest {
        name: name.into(),
        content: vec![b'x'; bytes],
        ..Default::default()
    };
    Ok(client.store_artifact(request).await?.into_inner().id)
}

fn refused(result: Result<u64, tonic::Status>, what: &str, names: &[&str]) {
    let status = match result {
        Ok(id) => panic!("{what}: stored as artifact {id}"),
        Err(status) => status,
    };
    for name in names {
        assert!(
            status.message().contains(name),
            "{what}: {:?} does not name {name}",
            status.message()
        );
    }
}

#[test]
fn a_subtree_keeps_its_quota_after_its_children_exit() {
    let dir = tempfile::tempdir().unwrap();
    let kernel = start(
        dir.path(),
        json!({"storage": {"max_bytes_per_subtree": 3 * ARTIFACT}}),
    );
    let (attacker_pid, token) = attacker(&kernel, dir.path());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut me = connect(&kernel.addr, &token).await;
        // A child fills two thirds of the subtree's quota and is killed:
        // what it stored stays, and still counts.
        let (first, mut first_client) = child(
            &mut me,
            attacker_pid,
            &kernel.addr,
            dir.path(),
            "first",
            None,
        )
        .await;
        let kept = store(&mut first_client, "a", ARTIFACT).await.unwrap();
        store(&mut first_client, "b", ARTIFACT).await.unwrap();
        me.kill(pb::KillRequest {
            pid: first,
            reason: "done".into(),
        })
        .await
        .unwrap();
        let (_, mut second) = child(
            &mut me,
            attacker_pid,
            &kernel.addr,
            dir.path(),
            "second",
            None,
        )
        .await;
        store(&mut second, "c", ARTIFACT).await.unwrap();
        refused(
            store(&mut second, "d", ARTIFACT).await,
            "a store past the subtree's quota",
            &[
                &format!("storage quota of process {attacker_pid} (attacker)"),
                "kernel.storage.max_bytes_per_subtree",
            ],
        );
        refused(
            store(&mut me, "e", 1).await,
            "a store by the subtree's root itself",
            &["kernel.storage.max_bytes_per_subtree"],
        );
        // Deleting the gone child's data (its ancestor may) frees the quota.
        me.delete_artifact(pb::DeleteArtifactRequest { id: kept })
            .await
            .unwrap();
        store(&mut second, "d", ARTIFACT).await.unwrap();

        // A child's own, smaller quota holds inside the subtree's.
        let small = pb::Limits {
            max_storage_bytes: 100_000,
            ..Default::default()
        };
        let (third, mut third_client) = child(
            &mut me,
            attacker_pid,
            &kernel.addr,
            dir.path(),
            "third",
            Some(small),
        )
        .await;
        refused(
            store(&mut third_client, "f", 100_001).await,
            "a store past the child's own quota",
            &[
                &format!("storage quota of process {third} (third)"),
                "max_storage_bytes (100000 bytes)",
            ],
        );
    });
}

#[test]
fn the_store_has_a_ceiling_and_deleted_data_gives_its_space_back() {
    let dir = tempfile::tempdir().unwrap();
    let kernel = start(
        dir.path(),
        json!({"storage": {"max_bytes": 12 * ARTIFACT, "max_bytes_per_subtree": 64 * ARTIFACT}}),
    );
    let (_, token) = attacker(&kernel, dir.path());
    let db = dir.path().join("data/hivekernel.db");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut me = connect(&kernel.addr, &token).await;
        let mut ids = Vec::new();
        let refusal = loop {
            match store(&mut me, &format!("fill-{}", ids.len()), ARTIFACT).await {
                Ok(id) => ids.push(id),
                Err(status) => break status,
            }
            assert!(
                ids.len() <= 12,
                "stored {} MiB under a 12 MiB ceiling",
                ids.len()
            );
        };
        assert!(
            refusal
                .message()
                .contains("kernel.storage.max_bytes (12582912 bytes)"),
            "{}",
            refusal.message()
        );
        assert!(ids.len() >= 8, "only {} MiB fitted", ids.len());
        let full = file_bytes(&db);
        for id in ids {
            me.delete_artifact(pb::DeleteArtifactRequest { id })
                .await
                .unwrap();
        }
        // The freed pages leave the file, not just the tables.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let now = file_bytes(&db);
            if now < 4 * ARTIFACT as u64 {
                eprintln!(
                    "store file: {} KiB full, {} KiB after deletes",
                    full >> 10,
                    now >> 10
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the store file stayed at {now} bytes (it was {full} full)"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        store(&mut me, "again", ARTIFACT).await.unwrap();
    });
}

fn file_bytes(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |meta| meta.len())
}
