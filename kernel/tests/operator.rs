//! Operator controls on the real binary: `hivekernel restart`, `hivekernel
//! config reload` and SIGHUP.

#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{Kernel, find, write_config};

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

/// Waits until `check` holds, or fails naming `what`.
fn wait_until(kernel: &Kernel, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}:\n{}",
            kernel.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
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

/// Before a reload: `keep` (unchanged), `change` (its model and its cron
/// entry change), `drop` (removed, with its cron entry).
const BEFORE: &str = r#"{
  "kernel": { "listen": "127.0.0.1:0", "shutdown_grace_ms": 500, "default_runtime": "echo" },
  "agents": [
    { "name": "keep", "role": "agent", "system_prompt": "You stay." },
    { "name": "change", "role": "agent", "system_prompt": "You change.", "model": "m1",
      "cron": [{ "name": "change-tick", "expression": "0 0 * * * *", "action": "message",
                 "description": "tick" }] },
    { "name": "drop", "role": "agent", "system_prompt": "You go.",
      "cron": [{ "name": "drop-tick", "expression": "0 0 * * * *", "action": "message",
                 "description": "tick" }] }
  ]
}"#;

/// After: `change` has another model and cron expression, `drop` is gone,
/// `new` is added with a cron entry, and one setting a reload cannot apply changed.
const AFTER: &str = r#"{
  "kernel": { "listen": "127.0.0.1:0", "shutdown_grace_ms": 500, "default_runtime": "echo",
              "mailbox_capacity": 77 },
  "agents": [
    { "name": "keep", "role": "agent", "system_prompt": "You stay." },
    { "name": "change", "role": "agent", "system_prompt": "You change.", "model": "m2",
      "cron": [{ "name": "change-tick", "expression": "0 30 * * * *", "action": "message",
                 "description": "tick" }] },
    { "name": "new", "role": "agent", "system_prompt": "You are new.",
      "cron": [{ "name": "new-tick", "expression": "0 0 * * * *", "action": "message",
                 "description": "tick" }] }
  ]
}"#;

/// Cron entries by name: (expression, target).
fn cron(kernel: &Kernel) -> Vec<(String, String, u64)> {
    let Value::Array(entries) = kernel.cli(&["cron", "ls", "--json"]).json() else {
        panic!("cron ls --json is not an array");
    };
    entries
        .iter()
        .map(|e| {
            let name = e["name"].as_str().unwrap().to_owned();
            let expression = e["expression"].as_str().unwrap().to_owned();
            (name, expression, e["target"].as_u64().unwrap())
        })
        .collect()
}

/// Result per name in one section of `config reload --json`.
fn results(report: &Value, section: &str) -> Vec<(String, String)> {
    report[section]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let name = c["name"].as_str().unwrap().to_owned();
            (name, c["result"].as_str().unwrap().to_owned())
        })
        .collect()
}

fn pair(name: &str, result: &str) -> (String, String) {
    (name.to_owned(), result.to_owned())
}

#[test]
fn reload_adds_removes_and_restarts_agents_and_their_cron_entries() {
    let kernel = start(BEFORE);
    let (keep, change, drop) = (
        kernel.pid_of("keep"),
        kernel.pid_of("change"),
        kernel.pid_of("drop"),
    );
    let child = kernel.spawn(&["--parent", "change", "--name", "kid", "--runtime", "echo"]);
    let config = kernel.dir.path().join("config.json");

    // Unchanged file: nothing happens.
    let same = kernel.cli(&["config", "reload", "--json"]).json();
    assert_eq!(
        results(&same, "agents"),
        [
            pair("keep", "unchanged"),
            pair("change", "unchanged"),
            pair("drop", "unchanged")
        ]
    );
    assert_eq!(
        results(&same, "cron"),
        [
            pair("change-tick", "unchanged"),
            pair("drop-tick", "unchanged")
        ]
    );
    assert_eq!(same["needs_restart"], Value::Array(vec![]));

    std::fs::write(&config, AFTER).unwrap();
    let report = kernel.cli(&["config", "reload", "--json"]).json();
    assert_eq!(report["applied"], true);
    assert_eq!(
        results(&report, "agents"),
        [
            pair("keep", "unchanged"),
            pair("change", "restarted"),
            pair("new", "added"),
            pair("drop", "removed"),
        ]
    );
    assert_eq!(report["agents"][1]["detail"], "changed: model");
    assert_eq!(
        results(&report, "cron"),
        [
            pair("change-tick", "updated"),
            pair("drop-tick", "removed"),
            pair("new-tick", "added"),
        ]
    );
    assert_eq!(
        report["needs_restart"],
        serde_json::json!(["kernel.mailbox_capacity"])
    );

    // The changed agent kept its PID, runs the new spec, and lost its subtree;
    // the removed one is gone, collected; the unchanged one was left alone.
    let procs = kernel.ps();
    assert_eq!(kernel.pid_of("change"), change);
    assert_eq!(find(&procs, change).unwrap()["model"], "m2");
    assert!(find(&procs, child).is_none(), "kid survived: {procs:?}");
    assert!(find(&procs, drop).is_none(), "drop survived: {procs:?}");
    let all = kernel.cli(&["ps", "--all", "--json"]).json();
    assert!(
        !all.to_string().contains("\"drop\""),
        "drop left a zombie: {all}"
    );
    assert_eq!(kernel.pid_of("keep"), keep);
    assert!(events_of(&kernel, keep, "exited").is_empty());
    let new = kernel.pid_of("new");
    assert!(new > drop, "new got PID {new}");
    assert_eq!(
        cron(&kernel),
        [
            ("change-tick".to_owned(), "0 30 * * * *".to_owned(), change),
            ("new-tick".to_owned(), "0 0 * * * *".to_owned(), new),
        ]
    );

    // The human form says the same.
    let text = kernel.cli(&["config", "reload"]);
    let text = text.ok();
    assert!(text.contains("AGENT"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("change") && l.contains("unchanged")),
        "{text}"
    );
    assert!(
        text.contains("needs a restart (changed, not applied): kernel.mailbox_capacity"),
        "{text}"
    );

    // What the reload did survives a kernel restart: the new agent comes back as its PID.
    let mut kernel = kernel;
    kernel.stop();
    kernel.restart();
    assert_eq!(kernel.pid_of("new"), new);
    assert_eq!(kernel.pid_of("change"), change);
}

/// Roles before a reload: workers are restarted after a failure and may not spawn.
const ROLES_BEFORE: &str = r#"{
  "kernel": { "listen": "127.0.0.1:0", "shutdown_grace_ms": 500, "default_runtime": "echo" },
  "roles": {
    "worker": { "restart": { "policy": "transient" }, "capabilities": ["send_message"] },
    "lead": { "strategy": "one_for_all" }
  },
  "agents": [
    { "name": "boss", "role": "lead", "system_prompt": "You lead." },
    { "name": "hand", "role": "worker", "system_prompt": "You work." }
  ]
}"#;

/// After: workers are permanent and may spawn; `lead` is gone from `roles`,
/// `daemon` is new.
const ROLES_AFTER: &str = r#"{
  "kernel": { "listen": "127.0.0.1:0", "shutdown_grace_ms": 500, "default_runtime": "echo" },
  "roles": {
    "worker": { "restart": { "policy": "permanent" },
                "capabilities": ["send_message", "spawn_children"] },
    "daemon": { "restart": { "policy": "permanent" } }
  },
  "agents": [
    { "name": "boss", "role": "lead", "system_prompt": "You lead." },
    { "name": "hand", "role": "worker", "system_prompt": "You work." }
  ]
}"#;

#[test]
fn a_reload_applies_roles_to_new_spawns_and_restarts_config_agents_of_a_changed_role() {
    let kernel = start(ROLES_BEFORE);
    let (boss, hand) = (kernel.pid_of("boss"), kernel.pid_of("hand"));
    let worker = |kernel: &Kernel, name: &str| {
        kernel.spawn(&[
            "--parent",
            &boss.to_string(),
            "--name",
            name,
            "--role",
            "worker",
        ])
    };
    let early = worker(&kernel, "early");
    let policy = |pid: u64| {
        let procs = kernel.ps();
        let p = find(&procs, pid).unwrap_or_else(|| panic!("no {pid} in {procs:?}"));
        (p["restart"]["policy"].clone(), p["capabilities"].clone())
    };
    assert_eq!(policy(early).0, "transient");
    std::fs::write(kernel.dir.path().join("config.json"), ROLES_AFTER).unwrap();

    let report = kernel.cli(&["config", "reload", "--json"]).json();
    assert_eq!(report["applied"], true, "{report}");
    assert_eq!(
        results(&report, "roles"),
        [
            pair("daemon", "added"),
            pair("lead", "removed"),
            pair("worker", "updated")
        ]
    );
    assert_eq!(
        report["roles"][2]["detail"],
        "changed: restart, capabilities"
    );
    assert_eq!(report["needs_restart"], Value::Array(vec![]));
    // The config agent of the changed role is restarted with it; boss's
    // role lost its entry, so boss is restarted too; both keep their PIDs.
    assert_eq!(
        results(&report, "agents"),
        [pair("boss", "restarted"), pair("hand", "restarted")]
    );
    assert_eq!(report["agents"][1]["detail"], "changed: roles.worker");
    assert_eq!((kernel.pid_of("boss"), kernel.pid_of("hand")), (boss, hand));
    let (hand_policy, hand_caps) = policy(hand);
    assert_eq!(hand_policy, "permanent");
    assert!(
        hand_caps.to_string().contains("spawn_children"),
        "{hand_caps}"
    );
    // A worker spawned now gets the new defaults.
    let late = worker(&kernel, "late");
    assert_eq!(policy(late).0, "permanent");
    // The text form lists the roles too.
    let text = kernel.cli(&["config", "reload"]);
    assert!(text.ok().contains("ROLE"), "{text:?}");
}

#[test]
fn an_invalid_reload_changes_nothing_and_lists_every_issue() {
    let kernel = start(BEFORE);
    let before = kernel.ps();
    let cron_before = cron(&kernel);
    let config = kernel.dir.path().join("config.json");
    let broken = AFTER
        .replace(
            r#""model": "m2""#,
            r#""model": "m2", "runtime": "no-such-runtime""#,
        )
        .replace("0 30 * * * *", "61 * * * *");
    std::fs::write(&config, broken).unwrap();

    let run = kernel.cli(&["config", "reload"]);
    let err = run.failed(2);
    assert!(err.contains("no-such-runtime"), "{err}");
    assert!(
        err.contains("change-tick") || err.contains("cron[0]"),
        "{err}"
    );
    assert!(
        err.lines().filter(|l| l.starts_with("error:")).count() >= 2,
        "{err}"
    );
    assert!(run.stdout.is_empty(), "{run:?}");

    let after = kernel.ps();
    let names = |procs: &[Value]| -> Vec<(u64, String)> {
        procs
            .iter()
            .map(|p| (p["pid"].as_u64().unwrap(), p["name"].to_string()))
            .collect()
    };
    assert_eq!(names(&after), names(&before));
    assert_eq!(
        find(&after, kernel.pid_of("change")).unwrap()["model"],
        "m1"
    );
    assert_eq!(cron(&kernel), cron_before);
    assert!(events_of(&kernel, kernel.pid_of("drop"), "exited").is_empty());
}

#[test]
fn sighup_reloads_and_sigterm_still_stops_cleanly() {
    let mut kernel = start(BEFORE);
    let change = kernel.pid_of("change");
    std::fs::write(kernel.dir.path().join("config.json"), AFTER).unwrap();

    let pid = kernel.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    wait_until(&kernel, "the new agent", || {
        kernel.ps().iter().any(|p| p["name"] == "new")
    });
    assert!(
        kernel.child.try_wait().unwrap().is_none(),
        "SIGHUP ended the kernel"
    );
    assert_eq!(kernel.pid_of("change"), change);
    assert_eq!(
        find(&kernel.ps(), change).unwrap()["model"],
        "m2",
        "{}",
        kernel.log()
    );
    wait_until(&kernel, "the reload's log", || {
        kernel.log().contains("config reloaded")
    });
    let log = kernel.log();
    assert!(
        log.contains("agent=new") && log.contains("outcome=added"),
        "{log}"
    );

    // An invalid config on SIGHUP is logged, changes nothing, and the kernel runs on.
    std::fs::write(kernel.dir.path().join("config.json"), "{ not json").unwrap();
    assert!(
        Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    wait_until(&kernel, "the refusal in the log", || {
        kernel.log().contains("config reload refused")
    });
    assert!(kernel.child.try_wait().unwrap().is_none());
    assert!(kernel.ps().iter().any(|p| p["name"] == "new"));

    std::fs::write(kernel.dir.path().join("config.json"), AFTER).unwrap();
    let addr = kernel.data_dir().join("kernel.addr");
    assert!(addr.exists());
    kernel.stop();
    assert!(!addr.exists(), "kernel.addr left behind after SIGTERM");
    // The lock is released: the same data directory starts again.
    kernel.restart();
    assert_eq!(kernel.pid_of("change"), change);

    // SIGINT (Ctrl-C) stops it as cleanly.
    let pid = kernel.child.id().to_string();
    let signal = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    assert!(signal.success());
    let status = kernel.child.wait().unwrap();
    assert!(
        status.success(),
        "exit {status} after SIGINT:\n{}",
        kernel.log()
    );
    assert!(!addr.exists(), "kernel.addr left behind after SIGINT");
    assert!(kernel.log().contains("shutting down"), "{}", kernel.log());
    kernel.restart();
    assert_eq!(kernel.pid_of("change"), change);
}

#[test]
fn scoped_tokens_from_the_cli_read_or_operate_survive_kill_9_and_can_be_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), AGENTS);
    let mut kernel = Kernel::start_with(dir, &config, &[]);
    let boss = kernel.pid_of("boss").to_string();

    let run = kernel.cli(&["token", "create", "--scope", "read", "--name", "dashboard"]);
    let read = run.ok().trim().to_owned();
    assert!(read.starts_with("o1."), "{run:#?}");
    let json = kernel
        .cli(&[
            "token",
            "create",
            "--scope",
            "operate",
            "--expires",
            "30d",
            "--json",
        ])
        .json();
    assert_eq!(
        (json["name"].as_str(), json["scope"].as_str()),
        (Some("token-2"), Some("operate"))
    );
    assert!(
        json["expires_at_unix_ms"].as_u64().unwrap() > json["created_at_unix_ms"].as_u64().unwrap()
    );
    let operate = json["token"].as_str().unwrap().to_owned();

    // read lists and may not kill; operate may.
    let as_read = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--token", &read]);
        kernel.cli(&all)
    };
    assert!(as_read(&["ps"]).ok().contains("boss"));
    let refused = as_read(&["kill", "boss"]);
    let stderr = refused.failed(1);
    assert!(
        stderr.contains("Kill needs the operate scope") && stderr.contains("--scope operate"),
        "{stderr}"
    );
    let refused = kernel.cli(&["token", "ls", "--token", &operate]);
    assert!(
        refused.failed(1).contains("needs the admin scope"),
        "{refused:#?}"
    );

    // The tokens outlive the kernel: kill -9, start again.
    kernel.kill_9();
    kernel.restart();
    assert!(kernel.cli(&["ps", "--token", &read]).ok().contains("boss"));
    let table = kernel.cli(&["token", "ls"]);
    let out = table.ok();
    assert!(
        out.contains("dashboard") && out.contains("token-2") && out.contains("in 29d"),
        "{out}"
    );
    let killed = kernel.cli(&["kill", &boss, "--token", &operate]);
    assert!(killed.ok().contains(&boss), "{killed:#?}");

    // Revoked: refused, and listed as such with -a only.
    assert!(
        kernel
            .cli(&["token", "revoke", "dashboard"])
            .ok()
            .contains("revoked token 1")
    );
    let refused = kernel.cli(&["ps", "--token", &read]);
    assert!(
        refused.failed(1).contains("\"dashboard\" was revoked"),
        "{refused:#?}"
    );
    assert!(!kernel.cli(&["token", "ls"]).ok().contains("dashboard"));
    let all = kernel.cli(&["token", "ls", "-a", "--json"]).json();
    assert_eq!(all[0]["status"], "revoked");
    let again = kernel.cli(&["token", "revoke", "dashboard"]);
    assert!(again.failed(1).contains("already revoked"), "{again:#?}");
    let bad = kernel.cli(&["token", "create", "--scope", "root"]);
    assert!(bad.failed(2).contains("unknown scope \"root\""), "{bad:#?}");
}

/// Starts the kernel on `config` with `args`, RUST_LOG unset unless `env`
/// sets it, stops it with SIGTERM once it serves, and returns its stderr.
fn logged(config: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), config);
    let log = dir.path().join("kernel.log");
    let mut child = Command::new(crate::support::binary())
        .arg("start")
        .arg(&path)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("HIVEKERNEL_LLM_BASE_URL")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !dir.path().join("data/kernel.addr").exists() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(child.try_wait().unwrap().is_none(), "exited early:\n{text}");
        assert!(Instant::now() < deadline, "never served:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = child.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "exit {status}:\n{text}");
    text
}

/// Each line of `log` as a JSON object, or a panic naming the line.
fn json_lines(log: &str) -> Vec<Value> {
    log.lines()
        .map(|line| {
            let record: Value = serde_json::from_str(line)
                .unwrap_or_else(|err| panic!("not a JSON line ({err}): {line:?}\n{log}"));
            assert!(
                record["timestamp"].is_string() && record["message"].is_string(),
                "{line}"
            );
            record
        })
        .collect()
}

#[test]
fn logs_follow_the_config_then_the_flags_then_rust_log_as_text_or_json_lines() {
    // A metrics listener on every interface: the kernel warns about it.
    let config = r#"{
      "kernel": { "listen": "127.0.0.1:0", "shutdown_grace_ms": 500, "default_runtime": "echo",
                  "metrics": { "listen": "0.0.0.0:0" },
                  "log": { "level": "warn", "format": "json" } },
      "agents": [ { "name": "boss", "role": "daemon", "system_prompt": "You lead." } ]
    }"#;
    let levels = |records: &[Value]| -> Vec<String> {
        records
            .iter()
            .map(|r| r["level"].as_str().unwrap().to_owned())
            .collect()
    };
    let warned = |records: &[Value]| {
        records.iter().any(|r| {
            r["level"] == "WARN" && r["message"].as_str().unwrap().contains("non-loopback")
        })
    };

    // The config's level and format.
    let records = json_lines(&logged(config, &[], &[]));
    assert!(warned(&records), "{records:?}");
    assert!(
        !levels(&records).contains(&"INFO".to_owned()),
        "{records:?}"
    );

    // --log-level over the config's.
    let records = json_lines(&logged(config, &["--log-level", "info"], &[]));
    assert!(warned(&records), "{records:?}");
    assert!(
        records.iter().any(|r| r["level"] == "INFO"
            && r["message"]
                .as_str()
                .unwrap()
                .starts_with("metrics on http://0.0.0.0:")),
        "{records:?}"
    );

    // RUST_LOG over both.
    let records = json_lines(&logged(
        config,
        &["--log-level", "info"],
        &[("RUST_LOG", "error")],
    ));
    assert!(
        levels(&records).iter().all(|level| level == "ERROR"),
        "{records:?}"
    );

    // --log-format over the config's: text, and no colour off a terminal.
    let text = logged(config, &["--log-format", "text"], &[]);
    assert!(
        text.lines()
            .any(|line| line.contains("WARN") && line.contains("non-loopback")),
        "{text}"
    );
    assert!(
        !text.contains('\u{1b}') && !text.trim_start().starts_with('{'),
        "{text:?}"
    );

    // A bad flag is refused before anything starts.
    let bad = crate::support::hivekernel(&["--log-level", "hivekernel=loud", "ps"]);
    assert!(bad.failed(2).contains("invalid log filter"), "{bad:#?}");
    let bad = crate::support::hivekernel(&["--log-level", "verbose", "ps"]);
    assert!(
        bad.failed(2).contains("unknown log level \"verbose\""),
        "{bad:#?}"
    );
    let bad = crate::support::hivekernel(&["ps", "--log-format", "xml"]);
    assert!(bad.failed(2).contains("xml"), "{bad:#?}");
}
