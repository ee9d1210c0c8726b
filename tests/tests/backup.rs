//! `hivekernel backup` of a running kernel while 64 clients send messages,
//! and `hivekernel restore` of the copy: a kernel started on it hands over
//! every message acknowledged before the backup began.

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hivekernel_proto::v1 as pb;
use hivekernel_proto::v1::kernel_client::KernelClient;
use hivekernel_tests::binary::Binary;
use hivekernel_tests::llm_server::{LlmServer, Scripted, last_message};
use hivekernel_tests::served::{Bearer, Client};
use parking_lot::Mutex;

const WRITERS: usize = 64;

fn config(base_url: &str) -> String {
    serde_json::json!({
        "kernel": { "listen": "127.0.0.1:0", "shutdown_grace_ms": 0,
                    "mailbox_capacity": 100000 },
        "llm": { "provider": "openai", "base_url": base_url,
                 "api_key_env": "HIVEKERNEL_TEST_NO_KEY", "max_retries": 0 },
        "agents": [{
            "name": "sink", "role": "agent", "runtime": "tool_agent", "model": "test-model",
            "system_prompt": "You read notes.", "limits": { "max_concurrent_tasks": 1 }
        }]
    })
    .to_string()
}

async fn client(kernel: &Binary) -> Client {
    let token = std::fs::read_to_string(kernel.dir.join("data/admin.token")).unwrap();
    let addr = match kernel.addr.starts_with("http") {
        true => kernel.addr.clone(),
        false => format!("http://{}", kernel.addr),
    };
    let channel = tonic::transport::Channel::from_shared(addr)
        .unwrap()
        .connect()
        .await
        .unwrap();
    KernelClient::with_interceptor(channel, Bearer::new(token.trim()))
}

fn pid_of(kernel: &Binary, name: &str) -> u64 {
    let ps = kernel.json(&["ps", "--json"]);
    ps.as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {ps}"))["pid"]
        .as_u64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_under_64_writers_restores_every_message_acknowledged_before_it() {
    let bin = match hivekernel_tests::build_hivekernel() {
        Ok(bin) => bin,
        Err((bin, why)) => panic!("cannot build {}: {why}", bin.display()),
    };
    let dir = tempfile::tempdir().unwrap();
    // The sink is kept busy by a task whose answer never comes in time, so
    // every message waits in its mailbox, that is, in the store.
    let held =
        LlmServer::answering(|_| Scripted::content("later").after(Duration::from_secs(3600))).await;
    std::fs::write(dir.path().join("config.json"), config(&held.base_url())).unwrap();
    let mut kernel = Binary::start(&bin, dir.path());
    let sink = pid_of(&kernel, "sink");
    let mut busy = kernel
        .command(&["exec", "sink", "hold on"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    hivekernel_tests::wait_until(
        "the sink's task reaches the model",
        Duration::from_secs(10),
        || async { held.request_count() == 1 },
    )
    .await;

    // 64 writers, each sending until told to stop; every acknowledged id kept.
    let acked: Arc<Mutex<Vec<u64>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let mut client = client(&kernel).await;
        let (acked, stop) = (acked.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let mut seq = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let sent = client
                    .send_message(pb::SendMessageRequest {
                        to: sink,
                        from: 1,
                        payload: format!("note w{writer} n{seq}"),
                        ..Default::default()
                    })
                    .await
                    .unwrap()
                    .into_inner();
                acked.lock().push(sent.message_id);
                seq += 1;
            }
        }));
    }
    hivekernel_tests::wait_until(
        "1000 messages acknowledged",
        Duration::from_secs(60),
        || async { acked.lock().len() >= 1000 },
    )
    .await;

    // Everything acknowledged so far precedes the backup; the writers go on.
    let before: HashSet<u64> = acked.lock().iter().copied().collect();
    let copy = dir.path().join("backup.db");
    let data = kernel.dir.join("data");
    let out = std::process::Command::new(&bin)
        .arg("backup")
        .arg(&copy)
        .arg("--json")
        .arg("--data-dir")
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let during = acked.lock().len();
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.await.unwrap();
    }
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["bytes"].as_u64().unwrap() > 0, "{report}");
    assert!(
        during > before.len(),
        "the writers kept writing during the backup ({during} acknowledged after it, {} before)",
        before.len()
    );

    // The copy opens, is sound, and holds every message acknowledged before.
    let conn = rusqlite::Connection::open(&copy).unwrap();
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");
    let mut query = conn
        .prepare("SELECT id FROM messages WHERE to_pid = ?1")
        .unwrap();
    let kept: HashSet<u64> = query
        .query_map([sink as i64], |row| row.get::<_, i64>(0))
        .unwrap()
        .map(|id| id.unwrap() as u64)
        .collect();
    drop(query);
    drop(conn);
    let missing: Vec<_> = before.difference(&kept).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged messages missing",
        missing.len()
    );

    // Restoring onto a running kernel's directory is refused and changes nothing.
    let refused = std::process::Command::new(&bin)
        .arg("restore")
        .arg(&copy)
        .arg("--data-dir")
        .arg(&data)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("in use by another kernel"), "{stderr}");
    kernel.child.kill().unwrap();
    kernel.child.wait().unwrap();
    // The client waiting on the held task ends with its kernel.
    let _ = busy.wait();

    // Restored into a new data directory, under a model that answers at
    // once: the sink hands every one of those messages to its model.
    let answering = LlmServer::answering(|_| Scripted::content("noted")).await;
    let fresh = tempfile::tempdir().unwrap();
    std::fs::write(
        fresh.path().join("config.json"),
        config(&answering.base_url()),
    )
    .unwrap();
    let restore = std::process::Command::new(&bin)
        .arg("restore")
        .arg(&copy)
        .arg("--data-dir")
        .arg(fresh.path().join("data"))
        .output()
        .unwrap();
    assert!(
        restore.status.success(),
        "{}",
        String::from_utf8_lossy(&restore.stderr)
    );
    assert!(String::from_utf8_lossy(&restore.stdout).contains("restored"));
    let restarted = Binary::start(&bin, fresh.path());
    assert_eq!(pid_of(&restarted, "sink"), sink);
    let seen = || -> HashSet<String> {
        answering
            .requests()
            .iter()
            .map(last_message)
            .filter(|text| text.contains("note w"))
            .collect()
    };
    hivekernel_tests::wait_until(
        "every message handed over",
        Duration::from_secs(120),
        || async { seen().len() >= kept.len() },
    )
    .await;
    assert_eq!(seen().len(), kept.len(), "each message handed over once");
    drop(restarted);
}
