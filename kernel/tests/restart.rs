//! Restarts of the real binary: `kill -9` and SIGTERM, then `hivekernel
//! start` again on the same data directory. What a call acknowledged must
//! be there after the restart, exactly once.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hivekernel_proto::v1 as pb;
use hivekernel_proto::v1::kernel_client::KernelClient;
use serde_json::{Value, json};
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

use crate::support::{Kernel, write_config};

/// One echo agent, `sink`, that works on one thing at a time, with room for
/// the messages the crash test queues.
const SINK: &str = r#"{
  "kernel": { "listen": "127.0.0.1:0", "shutdown_grace_ms": 500, "default_runtime": "echo",
              "mailbox_capacity": 4096, "max_concurrent_tasks": 1, "task_timeout_seconds": 3600 },
  "agents": [
    { "name": "sink", "role": "daemon", "system_prompt": "You echo." }
  ]
}"#;

const MESSAGES: usize = 1000;

/// A gRPC client of `kernel` with its admin token.
async fn client(kernel: &Kernel) -> KernelClient<Channel> {
    let channel = Channel::from_shared(kernel.addr.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    KernelClient::new(channel)
}

fn authed<T>(kernel: &Kernel, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let bearer: MetadataValue<_> = format!("Bearer {}", kernel.token()).parse().unwrap();
    request.metadata_mut().insert("authorization", bearer);
    request
}

/// Every stored event, replayed from sequence 0, as `(seq, type, detail)`.
async fn all_events(kernel: &Kernel) -> Vec<(u64, String, Value)> {
    let mut client = client(kernel).await;
    let request = pb::SubscribeEventsRequest {
        since_seq: 0,
        replay: true,
        ..Default::default()
    };
    let mut stream = client
        .subscribe_events(authed(kernel, request))
        .await
        .unwrap()
        .into_inner();
    let mut events = Vec::new();
    while let Some(event) = stream.message().await.unwrap() {
        if event.r#type == "replay_done" {
            break;
        }
        let detail = serde_json::from_str(&event.detail).unwrap_or(Value::Null);
        events.push((event.seq, event.r#type, detail));
    }
    events
}

/// Payloads of the `pong`s PID 1 received, in event order.
fn pongs(events: &[(u64, String, Value)]) -> Vec<String> {
    events
        .iter()
        .filter(|(_, kind, detail)| kind == "kernel_message" && detail["kind"] == "pong")
        .map(|(_, _, detail)| detail["payload"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Keeps `sink` busy with a task that never ends, so what is sent to it
/// stays queued, then sends it [`MESSAGES`] pings (`<prefix>m-0000`, ...),
/// each acknowledged; the busy task's call, to abort once the kernel is gone.
async fn queue_behind_a_busy_task(
    kernel: &Kernel,
    rpc: &mut KernelClient<Channel>,
    sink: u64,
    prefix: &str,
) -> tokio::task::JoinHandle<Result<tonic::Response<pb::ExecuteTaskResponse>, tonic::Status>> {
    let busy = pb::ExecuteTaskRequest {
        pid: sink,
        description: "hold".into(),
        params: HashMap::from([("delay_ms".to_owned(), "3600000".to_owned())]),
        ..Default::default()
    };
    let hold = tokio::spawn({
        let (mut rpc, request) = (rpc.clone(), authed(kernel, busy));
        async move { rpc.execute_task(request).await }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info = rpc
            .get_process(authed(kernel, pb::GetProcessRequest { pid: sink }))
            .await
            .unwrap()
            .into_inner();
        if info.state == pb::ProcessState::Running as i32 {
            break;
        }
        assert!(Instant::now() < deadline, "sink never started the task");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for i in 0..MESSAGES {
        let send = pb::SendMessageRequest {
            to: sink,
            r#type: "ping".into(),
            payload: format!("{prefix}m-{i:04}"),
            ..Default::default()
        };
        rpc.send_message(authed(kernel, send)).await.unwrap();
    }
    hold
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_messages_survive_kill_9_and_are_delivered_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), SINK);
    let mut kernel = Kernel::start_with(dir, &config, &[]);
    let sink = kernel.pid_of("sink");
    let mut rpc = client(&kernel).await;
    let hold = queue_behind_a_busy_task(&kernel, &mut rpc, sink, "").await;
    kernel.kill_9();
    hold.abort();

    kernel.restart();
    assert_eq!(
        kernel.pid_of("sink"),
        sink,
        "the config agent keeps its PID"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let events = loop {
        let events = all_events(&kernel).await;
        if pongs(&events).len() >= MESSAGES {
            break events;
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {MESSAGES} pongs after 60 s:\n{}",
            pongs(&events).len(),
            kernel.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    kernel.stop();

    let pongs = pongs(&events);
    let mut seen = HashMap::new();
    for payload in &pongs {
        *seen.entry(payload.as_str()).or_insert(0) += 1;
    }
    let duplicated: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(duplicated.is_empty(), "delivered twice: {duplicated:?}");
    for i in 0..MESSAGES {
        assert!(
            seen.contains_key(format!("m-{i:04}").as_str()),
            "m-{i:04} lost"
        );
    }
    let seqs: Vec<u64> = events.iter().map(|(seq, _, _)| *seq).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "sequence not increasing"
    );

    let db = rusqlite::Connection::open(kernel.data_dir().join("hivekernel.db")).unwrap();
    let check: String = db
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    let pending: i64 = db
        .query_row("SELECT count(*) FROM messages", [], |r| r.get(0))
        .unwrap();
    assert_eq!(pending, 0, "delivered messages left in the store");
}

/// Every `--json` event from sequence 0.
fn events_json(kernel: &Kernel) -> Vec<Value> {
    let run = kernel.cli(&["events", "--json", "--since", "0"]);
    run.ok()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn every_process_comes_back_with_its_pid_and_parent_after_kill_9() {
    let mut kernel = Kernel::start();
    let queen = kernel.pid_of("queen");
    let helper = kernel.pid_of("helper");
    let child = kernel.spawn(&["--parent", &queen.to_string(), "--name", "scratch"]);
    let leaf = kernel.spawn(&[
        "--parent",
        &child.to_string(),
        "--name",
        "leaf",
        "--restart",
        "permanent",
        "--model",
        "haiku",
    ]);
    let before = kernel.ps();

    // The spawns were answered: they are committed, whatever comes next.
    kernel.kill_9();
    kernel.restart();

    assert_eq!(kernel.pid_of("queen"), queen);
    assert_eq!(kernel.pid_of("helper"), helper);
    let procs = kernel.ps();
    for (pid, ppid) in [(child, queen), (leaf, child)] {
        let now = crate::support::find(&procs, pid)
            .unwrap_or_else(|| panic!("process {pid} did not come back: {procs:?}"));
        let then = crate::support::find(&before, pid).unwrap();
        assert_eq!(now["ppid"], ppid, "{now}");
        assert_eq!(
            (then["restored"].clone(), now["restored"].clone()),
            (false.into(), true.into())
        );
        for field in ["name", "role", "tier", "runtime", "model"] {
            assert_eq!(now[field], then[field], "{field} of {pid}");
        }
    }
    let fresh = kernel.spawn(&["--parent", &queen.to_string(), "--name", "fresh"]);
    assert!(fresh > leaf, "PID {fresh} reused (last was {leaf})");

    let events = events_json(&kernel);
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert!(
        !events.iter().any(|e| e["type"] == "exited"),
        "nothing exited: {events:?}"
    );
    let spawned = |pid: u64| -> Vec<&Value> {
        events
            .iter()
            .filter(|e| e["type"] == "spawned" && e["pid"] == pid)
            .collect()
    };
    // Config agents are spawned from the config each run; the rest restored.
    assert_eq!(spawned(queen).len(), 2, "queen spawned once per run");
    for pid in [child, leaf] {
        let runs = spawned(pid);
        assert_eq!(runs.len(), 2, "{pid}: {runs:?}");
        assert!(runs[0].get("restored").is_none(), "{:?}", runs[0]);
        assert_eq!(runs[1]["restored"], true, "{:?}", runs[1]);
    }

    // A clean stop is no different: nothing exits, everything comes back.
    kernel.stop();
    kernel.restart();
    let procs = kernel.ps();
    for (pid, ppid) in [(child, queen), (leaf, child), (fresh, queen)] {
        let now = crate::support::find(&procs, pid)
            .unwrap_or_else(|| panic!("process {pid} did not come back: {procs:?}"));
        assert_eq!(now["ppid"], ppid, "{now}");
    }
    let events = events_json(&kernel);
    assert!(
        !events
            .iter()
            .any(|e| e["type"] == "exited" || e["type"] == "reaped"),
        "nothing exited: {events:?}"
    );
}

#[test]
fn temporary_processes_stay_dead_when_the_config_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::support::CONFIG.replace(
        r#""default_runtime": "echo" },"#,
        r#""default_runtime": "echo", "restore_temporary": false },"#,
    );
    assert_ne!(config, crate::support::CONFIG);
    let path = write_config(dir.path(), &config);
    let mut kernel = Kernel::start_with(dir, &path, &[]);
    let queen = kernel.pid_of("queen").to_string();
    let temporary = kernel.spawn(&["--parent", &queen, "--name", "scratch"]);
    let kept = kernel.spawn(&[
        "--parent",
        &queen,
        "--name",
        "kept",
        "--restart",
        "transient",
    ]);

    kernel.kill_9();
    kernel.restart();

    let procs = kernel.ps();
    assert!(
        crate::support::find(&procs, temporary).is_none(),
        "{procs:?}"
    );
    assert!(crate::support::find(&procs, kept).is_some(), "{procs:?}");
    let events = events_json(&kernel);
    let exit = events
        .iter()
        .find(|e| e["type"] == "exited" && e["pid"] == temporary)
        .unwrap_or_else(|| panic!("no exit of {temporary}: {events:?}"));
    let reason = exit["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("kernel restart") && reason.contains("restore_temporary"),
        "{reason}"
    );
    assert_eq!(exit["ppid"].to_string(), queen);
}

#[test]
fn a_clean_restart_continues_the_event_sequence_without_a_gap() {
    let mut kernel = Kernel::start();
    let before = kernel.cli(&["events", "--json", "--since", "0"]);
    let last_before = before
        .ok()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|e| e["seq"].as_u64())
        .max()
        .unwrap();
    kernel.stop();
    kernel.restart();

    let after = kernel.cli(&["events", "--json", "--since", "0"]);
    let seqs: Vec<u64> = after
        .ok()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|e| e["seq"].as_u64())
        .collect();
    // The first run's events, its shutdown's exits, then the second run's spawns.
    assert_eq!(seqs.first(), Some(&1));
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "gap or repeat in {seqs:?}"
    );
    assert!(seqs.contains(&(last_before + 1)));
}

#[test]
fn a_second_kernel_on_the_same_data_directory_is_refused() {
    let kernel = Kernel::start();
    let config = kernel.dir.path().join("config.json");
    let data = kernel.data_dir();
    let second = crate::support::hivekernel(&[
        "start",
        config.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ]);
    let stderr = second.failed(2);
    assert!(stderr.contains("in use by another kernel"), "{stderr}");
    // The first kernel is untouched.
    assert_eq!(kernel.ps().len(), 3);
}

#[test]
fn cron_entries_added_with_the_cli_run_and_survive_kill_9() {
    let mut kernel = Kernel::start();
    let helper = kernel.pid_of("helper").to_string();
    let added = kernel
        .cli(&[
            "cron",
            "add",
            "beat",
            "* * * * * *",
            "ping",
            "--target",
            &helper,
            "--json",
        ])
        .json();
    assert_eq!(added["name"], "beat");
    assert_eq!(added["source"], "api");
    assert!(added["next_run_unix_ms"].as_u64().unwrap() > 0);

    let bad = kernel.cli(&["cron", "add", "bad", "* * *", "x", "--target", &helper]);
    assert!(bad.failed(1).contains("got 3"), "{bad:#?}");

    let runs = |kernel: &Kernel| -> Vec<Value> {
        match kernel.cli(&["cron", "ls", "--json"]).json() {
            Value::Array(entries) => entries,
            other => panic!("not an array: {other}"),
        }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let before = loop {
        let entries = runs(&kernel);
        assert_eq!(entries.len(), 1, "{entries:?}");
        let done = entries[0]["runs"].as_u64().unwrap();
        if done >= 1 {
            assert_eq!(entries[0]["history"][0]["status"], "ok");
            assert_eq!(entries[0]["history"][0]["output"], "ping");
            break done;
        }
        assert!(Instant::now() < deadline, "no run in 10 s: {entries:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let table = kernel.cli(&["cron", "ls"]);
    assert!(table.ok().starts_with("NAME"), "{table:#?}");
    assert!(table.ok().contains("beat"), "{table:#?}");

    kernel.kill_9();
    kernel.restart();
    let entries = runs(&kernel);
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert!(entries[0]["runs"].as_u64().unwrap() >= before);
    assert_eq!(entries[0]["target"].as_u64(), Some(helper.parse().unwrap()));

    // Off: it stops firing, and stays off across a restart; run now still runs it.
    let off = kernel.cli(&["cron", "disable", "beat", "--json"]).json();
    assert_eq!(
        (off["enabled"].clone(), off["next_run_unix_ms"].clone()),
        (json!(false), Value::Null)
    );
    let table = kernel.cli(&["cron", "ls"]);
    assert!(table.ok().contains("disabled"), "{table:#?}");
    kernel.stop();
    kernel.restart();
    let stopped = runs(&kernel)[0]["runs"].as_u64().unwrap();
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(
        runs(&kernel)[0]["runs"].as_u64().unwrap(),
        stopped,
        "a disabled entry fired"
    );
    kernel.cli(&["cron", "run", "beat"]).ok();
    let deadline = Instant::now() + Duration::from_secs(10);
    while runs(&kernel)[0]["runs"].as_u64().unwrap() == stopped {
        assert!(Instant::now() < deadline, "run now did not run it");
        std::thread::sleep(Duration::from_millis(50));
    }
    let on = kernel.cli(&["cron", "enable", "beat", "--json"]).json();
    assert_eq!(on["enabled"], true);
    assert!(on["next_run_unix_ms"].as_u64().unwrap() > 0);
    let unknown = kernel.cli(&["cron", "run", "nope"]);
    assert!(unknown.failed(1).contains("no cron entry"), "{unknown:#?}");

    let removed = kernel.cli(&["cron", "rm", "beat", "--json"]).json();
    assert_eq!(removed["removed"], "beat");
    assert!(runs(&kernel).is_empty());
    let again = kernel.cli(&["cron", "rm", "beat"]);
    assert!(again.failed(1).contains("no cron entry"), "{again:#?}");
}

/// `saver` (a tool agent on the offline provider) with a budget of its own.
const SAVER: &str = r#"{
  "kernel": { "listen": "127.0.0.1:0", "shutdown_grace_ms": 500, "default_runtime": "tool_agent" },
  "llm": { "provider": "scripted" },
  "agents": [
    { "name": "saver", "role": "daemon", "system_prompt": "You answer briefly.",
      "limits": { "max_tokens_total": 100000 } }
  ]
}"#;

/// `usage --json` rows by PID.
fn usage_by_pid(kernel: &Kernel) -> HashMap<u64, Value> {
    let Value::Array(rows) = kernel.cli(&["usage", "--json"]).json() else {
        panic!("usage --json is not an array");
    };
    rows.into_iter()
        .map(|row| (row["pid"].as_u64().unwrap(), row))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_usage_and_spent_budget_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), SAVER);
    let mut kernel = Kernel::start_with(dir, &config, &[]);
    let saver = kernel.pid_of("saver");
    kernel.cli(&["exec", &saver.to_string(), "say hello"]).ok();
    // A child drawing on saver's budget, and one with a budget lent from it.
    let child = kernel.spawn(&["--parent", &saver.to_string(), "--name", "scratch"]);
    let spawn = pb::SpawnRequest {
        parent: saver,
        name: "borrower".into(),
        limits: Some(pb::Limits {
            max_tokens_total: 5_000,
            ..Default::default()
        }),
        ..Default::default()
    };
    let borrower = client(&kernel)
        .await
        .spawn(authed(&kernel, spawn))
        .await
        .unwrap()
        .into_inner()
        .pid;
    for pid in [child, borrower] {
        kernel
            .cli(&["exec", &pid.to_string(), "say hello too"])
            .ok();
    }
    let before = usage_by_pid(&kernel);
    let own = before[&saver]["usage"]["total_tokens"].as_u64().unwrap();
    let subtree = before[&saver]["subtree_usage"]["total_tokens"]
        .as_u64()
        .unwrap();
    assert!(own > 0 && subtree > own, "{before:?}");
    let lent = before[&borrower]["budget"].clone();
    assert_eq!(lent["owner"], borrower, "{lent}");
    let borrowed = lent["used"].as_u64().unwrap();
    assert!(borrowed > 0, "{lent}");
    // The loan is out of saver's budget; the rest of the subtree's spending is in it.
    assert_eq!(before[&saver]["budget"]["used"], subtree - borrowed);
    assert_eq!(
        before[&saver]["budget"]["remaining"],
        100_000 - (subtree - borrowed) - 5_000
    );

    // Charged before the answer came back: nothing to flush.
    kernel.kill_9();
    kernel.restart();

    let after = usage_by_pid(&kernel);
    for pid in [saver, child, borrower] {
        let (row, then) = (&after[&pid], &before[&pid]);
        for field in ["usage", "subtree_usage", "budget"] {
            assert_eq!(row[field], then[field], "{field} of {pid}: {row}");
        }
    }
    assert_eq!(after[&1]["subtree_usage"]["total_tokens"], subtree);

    // A process recorded dead leaves nothing behind.
    kernel.cli(&["kill", &child.to_string()]).ok();
    kernel.cli(&["wait", &child.to_string()]).ok();
    kernel.stop();
    let db = rusqlite::Connection::open(kernel.data_dir().join("hivekernel.db")).unwrap();
    for table in ["usage", "process_spec"] {
        let rows: i64 = db
            .query_row(
                &format!("SELECT count(*) FROM {table} WHERE pid = ?1"),
                [child as i64],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(rows, 0, "{table} of reaped process {child} kept");
    }
}

/// A swarm: `queen`, a daemon with a model (the offline `scripted`
/// provider) that delegates, and `sink`, an echo daemon working on one
/// thing at a time, with room for the messages the test queues.
const SWARM: &str = r#"{
  "kernel": { "listen": "127.0.0.1:0", "shutdown_grace_ms": 500, "default_runtime": "echo",
              "mailbox_capacity": 4096, "max_concurrent_tasks": 1, "task_timeout_seconds": 3600,
              "max_depth": 6, "max_children": 64 },
  "llm": { "provider": "scripted" },
  "agents": [
    { "name": "queen", "role": "daemon", "runtime": "tool_agent",
      "system_prompt": "Name: queen\nYou coordinate.", "tools": ["delegate_async"] },
    { "name": "sink", "role": "daemon", "system_prompt": "You echo." }
  ]
}"#;

/// An exec agent that logs its OS pid and sleeps without attaching.
const SLEEPER: &str = r#"echo "os_pid=$$" >&2; exec sleep 600"#;

/// Whether OS process `pid` is alive (a zombie is not).
fn os_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .next()?
                .to_owned();
            Some(state != "Z")
        })
        .unwrap_or(false)
}

/// Every `os_pid=N` an exec agent logged, in order.
fn os_pids(log: &std::path::Path) -> Vec<u32> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.strip_prefix("os_pid=")?.trim().parse().ok())
        .collect()
}

/// `ps --json` as PID -> parent PID.
fn tree(kernel: &Kernel) -> HashMap<u64, u64> {
    kernel
        .ps()
        .iter()
        .map(|p| (p["pid"].as_u64().unwrap(), p["ppid"].as_u64().unwrap()))
        .collect()
}

/// Spawns `name` under `parent` over gRPC: an echo agent, or an exec one
/// running `command`, restarted after a failure.
async fn spawn_rpc(
    rpc: &mut KernelClient<Channel>,
    kernel: &Kernel,
    parent: u64,
    name: String,
    command: Option<&str>,
) -> u64 {
    let mut request = pb::SpawnRequest {
        parent,
        name,
        ..Default::default()
    };
    if let Some(command) = command {
        request.runtime = "exec".into();
        request.command = vec!["sh".into(), "-c".into(), command.into()];
        request.restart = Some(pb::RestartSpec {
            policy: pb::RestartPolicy::Transient as i32,
            ..Default::default()
        });
    }
    rpc.spawn(authed(kernel, request))
        .await
        .unwrap()
        .into_inner()
        .pid
}

/// `kill -9` under a swarm of 200 processes four levels deep (config
/// agents, run-time spawns, exec agents), with 1,000 messages queued and a
/// `delegate_async` request in flight, three times over: each time every
/// process is back with its PID and parent, every acknowledged message is
/// delivered once, the request is answered as failed to its requester, and
/// the exec agents run again, their old OS processes gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swarm_comes_back_whole_after_kill_9_three_times() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), SWARM);
    let mut kernel = Kernel::start_with(dir, &config, &[]);
    let (queen, sink) = (kernel.pid_of("queen"), kernel.pid_of("sink"));
    let mut rpc = client(&kernel).await;
    let mut sleepers = Vec::new();
    for lead in 0..4 {
        let lead = spawn_rpc(&mut rpc, &kernel, queen, format!("lead-{lead}"), None).await;
        for worker in 0..7 {
            let name = format!("worker-{lead}-{worker}");
            let worker = spawn_rpc(&mut rpc, &kernel, lead, name, None).await;
            for leaf in 0..6 {
                let name = format!("leaf-{worker}-{leaf}");
                spawn_rpc(&mut rpc, &kernel, worker, name, None).await;
            }
        }
        if lead % 2 == 0 {
            let name = format!("sleeper-{lead}");
            sleepers.push(spawn_rpc(&mut rpc, &kernel, lead, name, Some(SLEEPER)).await);
        }
    }
    let logs: Vec<std::path::PathBuf> = sleepers
        .iter()
        .map(|pid| {
            let run = kernel.cli(&["describe", &pid.to_string(), "--json"]);
            std::path::PathBuf::from(run.json()["log_path"].as_str().unwrap())
        })
        .collect();
    let mut delivered: HashMap<String, usize> = HashMap::new();

    for round in 0..3 {
        let mut rpc = client(&kernel).await;
        // Some of each round's processes are new.
        let fresh = spawn_rpc(&mut rpc, &kernel, queen, format!("fresh-{round}"), None).await;
        spawn_rpc(
            &mut rpc,
            &kernel,
            fresh,
            format!("fresh-{round}-child"),
            None,
        )
        .await;
        let before = tree(&kernel);
        assert!(before.len() > 200, "{} processes", before.len());
        for log in &logs {
            let deadline = Instant::now() + Duration::from_secs(20);
            while os_pids(log).len() <= round {
                assert!(Instant::now() < deadline, "{} not started", log.display());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let running: Vec<u32> = logs
            .iter()
            .map(|log| *os_pids(log).last().unwrap())
            .collect();

        let hold = queue_behind_a_busy_task(&kernel, &mut rpc, sink, &format!("r{round}-")).await;
        // The queen hands a sleeper a task it will never answer.
        let target = sleepers[round % sleepers.len()];
        let answer = kernel.cli(&["exec", "queen", &format!("delegate: {target} hold-{round}")]);
        assert!(answer.ok().contains("Done"), "{answer:?}");

        kernel.kill_9();
        hold.abort();
        kernel.restart();

        let after = tree(&kernel);
        for (pid, ppid) in &before {
            assert_eq!(
                after.get(pid),
                Some(ppid),
                "round {round}: process {pid} (parent {ppid}) not back as it was"
            );
        }
        assert_eq!(after.len(), before.len(), "round {round}: nothing new");
        // Each acknowledged message is delivered, once.
        let deadline = Instant::now() + Duration::from_secs(60);
        let events = loop {
            let events = all_events(&kernel).await;
            let prefix = format!("r{round}-");
            let this_round = pongs(&events)
                .iter()
                .filter(|p| p.starts_with(&prefix))
                .count();
            if this_round >= MESSAGES {
                break events;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: {this_round} of {MESSAGES} delivered after 60 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        delivered.clear();
        for payload in pongs(&events) {
            *delivered.entry(payload).or_insert(0) += 1;
        }
        let twice: Vec<_> = delivered.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            twice.is_empty(),
            "round {round}: delivered twice: {twice:?}"
        );
        assert_eq!(delivered.len(), MESSAGES * (round + 1), "round {round}");
        // The delegated task failed with the restart, and its requester heard.
        let failed = events.iter().find(|(_, kind, detail)| {
            kind == "task_finished"
                && detail["from"] == queen
                && detail["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("kernel restart"))
        });
        assert!(
            failed.is_some(),
            "round {round}: no failed task_finished for the delegation"
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        let heard = loop {
            let transcript = kernel.cli(&["logs", "queen", "--json"]).ok().to_owned();
            let entries: Vec<Value> = transcript
                .lines()
                .map(|line| serde_json::from_str(line).unwrap())
                .collect();
            // This round's: the last input saying so, and the request it led to.
            let heard = entries
                .iter()
                .rposition(|entry| {
                    entry["type"] == "input"
                        && entry["text"]
                            .as_str()
                            .is_some_and(|t| t.contains("kernel restart"))
                })
                .and_then(|at| entries[at..].iter().find(|e| e["type"] == "request"))
                .filter(|_| {
                    let told = entries.iter().filter(|entry| {
                        entry["type"] == "input"
                            && entry["text"]
                                .as_str()
                                .is_some_and(|t| t.contains("kernel restart"))
                    });
                    told.count() == round + 1
                })
                .cloned();
            if let Some(request) = heard {
                break request;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: the queen never heard:\n{transcript}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        // Mid-conversation: what it heard joins the conversation it had.
        let messages = heard["messages"].as_array().unwrap().len();
        assert!(messages >= 6 * (round + 1), "round {round}: {heard}");
        // The exec agents run again, as new OS processes; the old ones are gone.
        for (log, old) in logs.iter().zip(&running) {
            let deadline = Instant::now() + Duration::from_secs(20);
            while os_pids(log).len() <= round + 1 || os_alive(*old) {
                assert!(
                    Instant::now() < deadline,
                    "round {round}: {}: {:?}, old {old} alive: {}",
                    log.display(),
                    os_pids(log),
                    os_alive(*old)
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    kernel.stop();
    for log in &logs {
        for pid in os_pids(log) {
            assert!(!os_alive(pid), "OS process {pid} outlived the kernel");
        }
    }
}
