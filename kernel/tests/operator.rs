//! Operator controls on the real binary: `hivekernel restart`, `hivekernel
//! config reload` and SIGHUP.

#![allow(clippy::unwrap_used)]

mod support;

use serde_json::Value;

use support::{Kernel, find, write_config};

/// `boss`: permanent, at most one supervised restart a minute; `temp`:
/// temporary (the default); both echo agents.
const AGENTS: &str = r#"{
  "kernel": { "listen": "127.0.0.1:0", "shutdown_grace_ms": 500, "default_runtime": "echo" },
  "agents": [
    { "name": "boss", "role": "daemon", "system_prompt": "You lead.",
      "restart": { "policy": "permanent", "max_restarts": 1, "within_seconds": 60,
                   "backoff_ms": [1000, 1000] } },
    { "name": "temp", "role": "agent", "system_prompt": "You help." }
  ]
}"#;

fn start(config: &str) -> Kernel {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), config);
    Kernel::start_with(dir, &path, &[])
}

/// Every retained event of `pid` of type `kind`, as JSON objects.
fn events_of(kernel: &Kernel, pid: u64, kind: &str) -> Vec<Value> {
    let pid = pid.to_string();
    let run = kernel.cli(&["events", "--json", "--pid", &pid, "--type", kind]);
    run.ok()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[test]
fn restart_by_pid_and_by_name_keeps_the_pid_kills_the_subtree_and_spares_the_intensity() {
    let kernel = start(AGENTS);
    let boss = kernel.pid_of("boss");
    let kid = kernel.spawn(&["--parent", "boss", "--name", "kid", "--runtime", "echo"]);
    let grandkid = kernel.spawn(&["--parent", "kid", "--name", "grandkid", "--runtime", "echo"]);

    // By PID: the subtree goes, the process stays with its PID.
    let by_pid = kernel.cli(&["restart", &boss.to_string(), "--json"]).json();
    assert_eq!(by_pid["pid"], boss);
    assert_eq!(by_pid["attempt"], 1);
    let procs = kernel.ps();
    assert!(find(&procs, kid).is_none(), "kid survived: {procs:?}");
    assert!(
        find(&procs, grandkid).is_none(),
        "grandkid survived: {procs:?}"
    );
    assert_eq!(kernel.pid_of("boss"), boss);
    let boss_now = find(&procs, boss).unwrap();
    assert_eq!(boss_now["state"], "idle", "{boss_now}");
    assert_eq!(boss_now["restarts"], 1, "{boss_now}");

    // max_restarts is 1, yet manual restarts never run into it: by name, three times.
    for attempt in 2..=4 {
        let text = kernel.cli(&["restart", "boss", "--reason", "operator says so"]);
        assert_eq!(
            text.ok().trim(),
            format!("restarted {boss} (restart {attempt})")
        );
    }
    let restarted = events_of(&kernel, boss, "restarted");
    assert_eq!(restarted.len(), 4, "{restarted:?}");
    for (i, event) in restarted.iter().enumerate() {
        assert_eq!(event["manual"], true, "{event}");
        assert_eq!(event["delay_ms"], 0, "{event}");
        assert_eq!(event["attempt"], i as u64 + 1, "{event}");
    }
    // Each restart's `exited` event comes before its `restarted` one, with the reason given.
    let exited = events_of(&kernel, boss, "exited");
    assert_eq!(exited.len(), 4, "{exited:?}");
    assert_eq!(exited[3]["reason"], "operator says so");
    assert!(exited[0]["seq"].as_u64() < restarted[0]["seq"].as_u64());
    let kid_exit = events_of(&kernel, kid, "exited");
    assert_eq!(kid_exit.len(), 1, "{kid_exit:?}");

    // A temporary process restarts too, and still works afterwards.
    let temp = kernel.pid_of("temp");
    kernel.cli(&["restart", "temp"]).ok();
    assert_eq!(kernel.pid_of("temp"), temp);
    let answer = kernel.cli(&["exec", "temp", "still here"]);
    assert!(answer.ok().contains("still here"), "{answer:?}");
}

#[test]
fn restart_refuses_unknown_exited_and_kernel_pids() {
    let kernel = start(AGENTS);
    let unknown = kernel.cli(&["restart", "999"]);
    let err = unknown.failed(1);
    assert!(err.contains("999") && err.contains("not found"), "{err}");

    let gone = kernel.spawn(&["--parent", "1", "--name", "gone", "--runtime", "echo"]);
    kernel.cli(&["kill", &gone.to_string()]).ok();
    let zombie = kernel.cli(&["restart", &gone.to_string()]);
    let err = zombie.failed(1);
    assert!(
        err.contains(&format!("process {gone} has already exited")),
        "{err}"
    );

    let kernel_pid = kernel.cli(&["restart", "1"]);
    let err = kernel_pid.failed(1);
    assert!(err.contains("PID 1 is the kernel"), "{err}");

    // None of it changed anything.
    let procs = kernel.ps();
    assert_eq!(find(&procs, kernel.pid_of("boss")).unwrap()["restarts"], 0);
    assert!(events_of(&kernel, gone, "restarted").is_empty());
}
