//! End-to-end tests of the `hivekernel` binary: `hivekernel start` in a child
//! process on 127.0.0.1:0 with a fresh data directory, driven by the client
//! commands exactly as a user would run them.

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{CONFIG, Kernel, find, hivekernel, hivekernel_with, write_config};

#[test]
fn config_check_accepts_a_valid_config() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), CONFIG);
    let run = hivekernel(&["config", "check", config.to_str().unwrap()]);
    let out = run.ok();
    assert!(
        out.starts_with("ok: ") && out.contains("2 agents"),
        "{run:#?}"
    );
}

#[test]
fn config_check_shows_what_each_agent_may_do_and_warns_about_risky_grants() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        r#"{ "roles": { "worker": { "capabilities": ["file_read", "shell_exec", "manage_cron"] },
                       "lead": { "capabilities": "all" } },
             "agents": [ { "name": "t", "role": "task", "runtime": "echo" },
                         { "name": "w", "role": "worker", "runtime": "echo" },
                         { "name": "boss", "role": "lead", "runtime": "echo" } ] }"#,
    );
    let run = hivekernel(&["config", "check", config.to_str().unwrap()]);
    let out = run.ok();
    let line = |name: &str| {
        out.lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("no line for {name}: {run:#?}"))
            .to_owned()
    };
    // A task in a config that does not list its role holds its default only.
    assert!(
        line("t (task)").ends_with("send_message, write_artifact, file_read"),
        "{run:#?}"
    );
    assert!(
        line("w (worker)").ends_with("shell_exec, file_read, manage_cron"),
        "{run:#?}"
    );
    assert!(
        line("boss (lead)").ends_with("every capability"),
        "{run:#?}"
    );
    let warnings: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.starts_with("warning:"))
        .collect();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("role worker grants shell_exec, manage_cron")
                && w.contains("roles.worker.capabilities")
                && w.contains("w and processes spawned as worker")),
        "{run:#?}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("role lead grants shell_exec, network_access, manage_cron")),
        "{run:#?}"
    );
    assert_eq!(warnings.len(), 2, "{run:#?}");

    // A tool its role's default does not grant is a config error.
    let config = write_config(
        dir.path(),
        r#"{ "agents": [ { "name": "t", "role": "task", "runtime": "echo", "tools": ["shell_exec"] } ] }"#,
    );
    let run = hivekernel(&["config", "check", config.to_str().unwrap()]);
    let stderr = run.failed(2);
    assert!(
        stderr.contains("tool \"shell_exec\" needs capability shell_exec")
            && stderr.contains("roles.task.capabilities"),
        "{stderr}"
    );
}

#[test]
fn config_check_reports_every_issue_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        r#"{ "kernel": { "max_depth": 0 },
             "agents": [ { "name": "x", "role": "overlord", "cognitive_tier": "tactical" } ] }"#,
    );
    let run = hivekernel(&["config", "check", config.to_str().unwrap()]);
    let stderr = run.failed(2);
    let issues: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(issues.len(), 2, "{run:#?}");
    assert!(
        issues.iter().any(|l| l.contains("kernel.max_depth")),
        "{run:#?}"
    );
    assert!(
        issues
            .iter()
            .any(|l| l.contains("role") && l.contains("overlord")),
        "{run:#?}"
    );
    assert!(run.stdout.is_empty());
}

#[test]
fn config_check_finds_what_start_would_refuse_in_this_environment() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        r#"{ "kernel": { "listen": "0.0.0.0:0" }, "llm": { "provider": "openai", "api_key_env": "HK_TEST_NO_SUCH_KEY" } }"#,
    );
    let path = config.to_str().unwrap();
    let run = hivekernel(&["config", "check", path]);
    let stderr = run.failed(2);
    assert!(
        stderr.contains("llm: the openai provider")
            && stderr.contains("HK_TEST_NO_SUCH_KEY")
            && stderr.contains("read from this environment"),
        "{stderr}"
    );
    assert!(
        stderr.contains("kernel.listen: refusing to listen on 0.0.0.0:0"),
        "{stderr}"
    );
    // And start refuses the same config the same way.
    let start = hivekernel(&[
        "start",
        path,
        "--data-dir",
        dir.path().join("data").to_str().unwrap(),
    ]);
    assert!(
        start.failed(2).contains("HK_TEST_NO_SUCH_KEY"),
        "{start:#?}"
    );
}

/// Writes `skills/<dir>/SKILL.md` under `root`.
fn write_skill(root: &Path, dir: &str, text: &str) -> PathBuf {
    let dir = root.join(dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("SKILL.md"), text).unwrap();
    dir
}

#[test]
fn skills_check_lists_every_issue_with_its_file_and_field_and_exits_2() {
    // The shipped skills keep every rule of the format.
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/skills");
    let run = hivekernel(&["skills", "check", shipped.to_str().unwrap()]);
    assert!(run.ok().contains("(triage-build)"), "{run:#?}");

    let root = tempfile::tempdir().unwrap();
    let good = write_skill(
        root.path(),
        "deploy-service",
        "---\nname: deploy-service\ndescription: How we deploy. Use when asked to ship.\n---\n# Steps\n",
    );
    // A skill alone passes, naming it.
    let run = hivekernel(&["skills", "check", good.to_str().unwrap()]);
    assert_eq!(
        run.ok().trim(),
        format!("ok: {} (deploy-service)", good.display()),
        "{run:#?}"
    );

    write_skill(
        root.path(),
        "Triage",
        "---\nname: Triage\ndescription: d\nversion: 2\n---\nbody",
    );
    write_skill(root.path(), "no-desc", "---\nname: no-desc\n---\nbody");
    std::fs::create_dir_all(root.path().join("notes")).unwrap();
    let run = hivekernel(&["skills", "check", root.path().to_str().unwrap()]);
    let stderr = run.failed(2);
    assert!(
        stderr.contains("2 of 3 skills in") && stderr.contains("break the Agent Skills format"),
        "{run:#?}"
    );
    let triage = root.path().join("Triage/SKILL.md");
    let no_desc = root.path().join("no-desc/SKILL.md");
    for expected in [
        format!(
            "{}: error: version: not a field of the format",
            triage.display()
        ),
        format!(
            "{}: error: name: \"Triage\" must be lowercase",
            triage.display()
        ),
        format!("{}: error: description: missing", no_desc.display()),
        format!("ok: {} (deploy-service)", good.display()),
    ] {
        assert!(
            run.stdout.lines().any(|l| l.starts_with(&expected)),
            "{expected} not in {run:#?}"
        );
    }

    let run = hivekernel(&["skills", "check", "--json", root.path().to_str().unwrap()]);
    run.failed(2);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    let oks: Vec<bool> = report
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["ok"].as_bool().unwrap())
        .collect();
    // By name, bytewise: "Triage" sorts first.
    assert_eq!(oks, [false, true, false], "{report:#}");
    assert_eq!(report[2]["findings"][0]["field"], "description");

    let run = hivekernel(&[
        "skills",
        "check",
        root.path().join("notes").to_str().unwrap(),
    ]);
    assert!(run.failed(2).contains("no skills in"), "{run:#?}");
}

#[test]
fn ps_json_lists_the_kernel_and_the_config_agents() {
    let kernel = Kernel::start();
    let procs = kernel.ps();
    let init = find(&procs, 1).unwrap();
    assert_eq!(init["role"], "kernel");
    assert_eq!(init["ppid"], 0);

    let queen = procs.iter().find(|p| p["name"] == "queen").unwrap();
    assert_eq!(queen["ppid"], 1);
    assert_eq!(queen["role"], "daemon");
    assert_eq!(queen["tier"], "tactical");
    assert_eq!(queen["state"], "idle");
    assert_eq!(queen["model"], "sonnet");
    assert_eq!(queen["runtime"], "echo");
    assert_eq!(
        queen["tools"],
        serde_json::json!(["spawn_child", "read_file"])
    );
    assert_eq!(queen["depth"], 1);
    assert_eq!(queen["children"], 0);
    assert_eq!(queen["mailbox_len"], 0);
    assert_eq!(queen["metadata"]["purpose"], "coordinator");
    assert!(queen["exit"].is_null());

    let helper = procs.iter().find(|p| p["name"] == "helper").unwrap();
    assert_eq!(
        (helper["role"].as_str(), helper["tier"].as_str()),
        (Some("agent"), Some("operational"))
    );
    assert_eq!(helper["runtime"], "echo", "the configured default runtime");
}

#[test]
fn the_shipped_config_runs_offline_and_orchestrates_with_no_worker_left() {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/startup.json");
    let kernel = Kernel::start_with(
        tempfile::tempdir().unwrap(),
        &config,
        &["--listen", "127.0.0.1:0"],
    );
    assert!(
        kernel.log().contains("provider=scripted"),
        "{}",
        kernel.log()
    );
    let queen = kernel.pid_of("queen").to_string();
    let run = kernel.cli(&["exec", &queen, "check the logs; review the config"]);
    let out = run.ok();
    assert!(out.contains("Summary:"), "{out}");
    assert!(out.contains("queen-w1 handled: check the logs"), "{out}");
    assert!(out.contains("queen-w2 handled: review the config"), "{out}");

    let procs = kernel.ps();
    let workers: Vec<_> = procs
        .iter()
        .filter(|p| p["name"].as_str().unwrap().starts_with("queen-w"))
        .collect();
    assert!(workers.is_empty(), "workers left: {workers:?}");
    let queen = procs.iter().find(|p| p["name"] == "queen").unwrap();
    // Two turns of the queen's loop, plus planning and combining.
    assert_eq!(queen["usage"]["calls"], 4, "{queen}");
    assert!(
        queen["usage"]["total_tokens"].as_u64().unwrap() > 0,
        "{queen}"
    );
}

#[test]
fn ps_tree_and_table_show_the_agents() {
    let kernel = Kernel::start();
    let (queen, helper) = (kernel.pid_of("queen"), kernel.pid_of("helper"));
    let tree = kernel.cli(&["ps", "--tree"]);
    let text = tree.ok();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].contains("(1) kernel/"), "{text}");
    let first = format!("├─ queen ({queen}) daemon/tactical idle");
    let last = format!("└─ helper ({helper}) agent/operational idle");
    assert!(lines.contains(&first.as_str()), "{text}");
    assert!(lines.contains(&last.as_str()), "{text}");

    let table = kernel.cli(&["ps"]);
    let text = table.ok();
    let header: Vec<&str> = text.lines().next().unwrap().split_whitespace().collect();
    let expected = [
        "PID", "PPID", "NAME", "ROLE", "TIER", "STATE", "AGE", "RESTARTS", "CHILDREN", "MAILBOX",
        "TOKENS", "MODEL", "RUNTIME",
    ];
    assert_eq!(header, expected);
    let row = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.get(2) == Some(&"queen"))
        .unwrap();
    // The age depends on when this runs: it is a duration.
    assert!(row[6].ends_with('s'), "{row:?}");
    let rest: Vec<&str> = row
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 6)
        .map(|(_, c)| *c)
        .collect();
    assert_eq!(
        rest,
        [
            queen.to_string().as_str(),
            "1",
            "queen",
            "daemon",
            "tactical",
            "idle",
            "0",
            "0",
            "0",
            "0",
            "sonnet",
            "echo"
        ],
        "{text}"
    );

    // Without --addr, the client finds the kernel through <data-dir>/kernel.addr.
    let data = kernel.data_dir();
    let found = hivekernel(&["ps", "--data-dir", data.to_str().unwrap()]);
    assert!(found.ok().contains("helper"));
}

#[test]
fn spawn_prints_a_pid_that_ps_shows_under_its_parent() {
    let kernel = Kernel::start();
    let queen = kernel.pid_of("queen");
    let parent = queen.to_string();
    let pid = kernel.spawn(&[
        "--parent",
        &parent,
        "--name",
        "w1",
        "--role",
        "lead",
        "--tools",
        "read_file,spawn_child",
    ]);
    let json = kernel
        .cli(&["spawn", "--parent", &parent, "--name", "w2", "--json"])
        .json();
    let pid2 = json["pid"].as_u64().unwrap();
    assert!(pid2 > pid);

    let procs = kernel.ps();
    let w1 = find(&procs, pid).unwrap();
    assert_eq!(w1["ppid"], queen);
    assert_eq!(w1["name"], "w1");
    assert_eq!(w1["role"], "lead");
    assert_eq!(
        w1["tier"], "operational",
        "the CLI's default, not the parent's"
    );
    assert_eq!(w1["tools"], serde_json::json!(["read_file", "spawn_child"]));
    // A child only gets tools its parent has.
    let greedy = kernel.cli(&[
        "spawn",
        "--parent",
        &parent,
        "--name",
        "w4",
        "--tools",
        "shell_exec",
    ]);
    let stderr = greedy.failed(1);
    assert!(
        stderr.contains("permission denied") && stderr.contains("shell_exec not among the tools"),
        "{stderr}"
    );
    assert_eq!(find(&procs, pid2).unwrap()["role"], "agent");
    assert_eq!(find(&procs, queen).unwrap()["children"], 2);

    let bad = kernel.cli(&[
        "spawn", "--parent", &parent, "--name", "w3", "--role", "boss",
    ]);
    let stderr = bad.failed(2);
    assert!(
        stderr.contains("worker") && stderr.contains("daemon"),
        "{bad:#?}"
    );
}

#[test]
fn exec_prints_the_echo_and_send_prints_an_id() {
    let kernel = Kernel::start();
    let helper = kernel.pid_of("helper").to_string();
    let run = kernel.cli(&["exec", &helper, "hello, world"]);
    assert_eq!(run.ok(), "hello, world\n");

    let json = kernel
        .cli(&["exec", &helper, "again", "--json", "--timeout", "5"])
        .json();
    assert_eq!(json["success"], true);
    assert_eq!(json["output"], "again");
    assert!(json["request_id"].as_u64().is_some());
    // A call that fails still answers JSON on stdout, with the exit code it exits with.
    let missing = kernel.cli(&["exec", "999", "anyone?", "--json"]);
    let error = missing.failed(1);
    let printed: Value = serde_json::from_str(&missing.stdout).unwrap();
    assert_eq!(printed["success"], false);
    assert_eq!(printed["exit_code"], 1);
    assert!(
        printed["error"].as_str().unwrap().contains("999"),
        "{printed}"
    );
    assert!(error.contains("999"));

    let send = kernel.cli(&[
        "send",
        &helper,
        "note",
        "--priority",
        "high",
        "--ttl-ms",
        "60000",
    ]);
    let id: u64 = send
        .ok()
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{send:#?}"));
    assert!(id > 0);
}

#[test]
fn kill_takes_the_subtree_and_wait_collects_the_zombie() {
    let kernel = Kernel::start();
    let top = kernel.spawn(&["--parent", "1", "--name", "top"]);
    let leaf = kernel.spawn(&["--parent", &top.to_string(), "--name", "leaf"]);

    let run = kernel.cli(&["kill", &top.to_string(), "--recursive", "--reason", "test"]);
    let killed: Vec<u64> = run.ok().lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(killed, [leaf, top], "leaves first");

    let procs = kernel.ps();
    assert!(find(&procs, leaf).is_none(), "{procs:?}");
    if let Some(zombie) = find(&procs, top) {
        assert_eq!(zombie["state"], "zombie");
        assert_eq!(zombie["exit"]["exit_code"], 137);
    }

    let exit = kernel
        .cli(&["wait", &top.to_string(), "--json", "--timeout", "5"])
        .json();
    assert_eq!(exit["pid"], top);
    assert_eq!(exit["exit_code"], 137);
    assert!(find(&kernel.ps(), top).is_none());
}

#[test]
fn failures_map_to_exit_codes() {
    let kernel = Kernel::start();

    let missing = kernel.cli(&["kill", "9999"]);
    assert!(missing.failed(1).contains("9999"), "{missing:#?}");
    kernel.cli(&["exec", "9999", "hi"]).failed(1);

    let refused = kernel.cli(&["ps", "--token", "not-the-token"]);
    assert!(refused.failed(1).contains("--token"), "{refused:#?}");

    let empty = tempfile::tempdir().unwrap();
    let no_token = hivekernel(&[
        "ps",
        "--addr",
        &kernel.addr,
        "--data-dir",
        empty.path().to_str().unwrap(),
    ]);
    let stderr = no_token.failed(2);
    assert!(
        stderr.contains("admin.token") && stderr.contains("hivekernel start"),
        "{no_token:#?}"
    );

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let nobody = format!("127.0.0.1:{port}");
    let down = hivekernel(&["ps", "--addr", &nobody, "--token", "x"]);
    assert!(down.failed(3).contains("cannot connect"), "{down:#?}");
}

#[test]
fn a_token_file_works_and_a_token_on_the_command_line_is_warned_of() {
    let kernel = Kernel::start();
    let token = kernel.token();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hk.token");
    std::fs::write(&file, format!("{token}\n")).unwrap();
    let file = file.to_str().unwrap();
    // A data directory without admin.token: the token comes from the file or nowhere.
    let empty = dir.path().to_str().unwrap();
    let client = |args: &[&str], env: &[(&str, &str)]| {
        let mut all = args.to_vec();
        all.extend(["--addr", &kernel.addr, "--data-dir", empty]);
        hivekernel_with(&all, env)
    };
    let warned = |run: &crate::support::Run| run.stderr.lines().any(|l| l.starts_with("warning:"));

    let by_flag = client(&["ps", "--json", "--token-file", file], &[]);
    assert!(find(by_flag.json().as_array().unwrap(), 1).is_some());
    assert!(!warned(&by_flag), "{by_flag:#?}");
    let by_env = client(&["ps", "--json"], &[("HIVEKERNEL_TOKEN_FILE", file)]);
    assert!(find(by_env.json().as_array().unwrap(), 1).is_some());

    let absent = dir.path().join("absent.token");
    let missing = client(&["ps", "--token-file", absent.to_str().unwrap()], &[]);
    let stderr = missing.failed(2);
    assert!(
        stderr.contains("no token file at") && stderr.contains("absent.token"),
        "{missing:#?}"
    );
    std::fs::write(dir.path().join("blank.token"), "\n").unwrap();
    let blank = dir.path().join("blank.token");
    let empty_file = client(&["ps", "--token-file", blank.to_str().unwrap()], &[]);
    assert!(
        empty_file.failed(2).contains("blank.token") && empty_file.stderr.contains("is empty"),
        "{empty_file:#?}"
    );
    let both = client(&["ps", "--token", "x", "--token-file", file], &[]);
    assert_eq!(both.code, 2, "{both:#?}");
    assert!(both.stderr.contains("give one of them"), "{both:#?}");
    // A token exported in the shell does not stand in the way of a file.
    let exported = client(
        &["ps", "--json", "--token-file", file],
        &[("HIVEKERNEL_TOKEN", "o1.an-old-token")],
    );
    assert!(
        find(exported.json().as_array().unwrap(), 1).is_some(),
        "{exported:#?}"
    );

    // On the command line it works, and says once, without the token,
    // that others can read it.
    let by_argv = client(&["ps", "--json", "--token", &token], &[]);
    assert!(find(by_argv.json().as_array().unwrap(), 1).is_some());
    let warnings: Vec<&str> = by_argv
        .stderr
        .lines()
        .filter(|l| l.starts_with("warning:"))
        .collect();
    assert_eq!(warnings.len(), 1, "{by_argv:#?}");
    assert!(
        warnings[0].contains("/proc/PID/cmdline") && warnings[0].contains("--token-file"),
        "{by_argv:#?}"
    );
    assert!(!by_argv.stderr.contains(&token), "{by_argv:#?}");
    // A refused token is warned of all the same, and not shown either.
    let wrong = client(&["ps", "--token", "o1.not-the-token"], &[]);
    assert!(wrong.failed(1).contains("warning:"), "{wrong:#?}");
    assert!(!wrong.stderr.contains("o1.not-the-token"), "{wrong:#?}");
    // From the environment it is not on the command line: no warning.
    let by_env = client(&["ps", "--json"], &[("HIVEKERNEL_TOKEN", &token)]);
    assert!(find(by_env.json().as_array().unwrap(), 1).is_some());
    assert!(!warned(&by_env), "{by_env:#?}");
}

#[test]
fn events_replay_in_sequence_order() {
    let kernel = Kernel::start();
    let pid = kernel.spawn(&["--parent", "1", "--name", "late"]);

    let run = kernel.cli(&["events", "--json", "--since", "0"]);
    let events: Vec<Value> = run
        .ok()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let spawned: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "spawned")
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(spawned, ["queen", "helper", "late"], "{run:#?}");
    let late = events.iter().find(|e| e["name"] == "late").unwrap();
    assert_eq!(late["pid"], pid);
    assert!(late["at_unix_ms"].as_u64().unwrap() > 0);

    let since = seqs[1].to_string();
    let text = kernel.cli(&["events", "--since", &since]);
    let first = text.ok().lines().next().unwrap_or_default().to_owned();
    assert!(first.starts_with(&format!("{} ", seqs[2])), "{text:#?}");
    assert!(first.contains(&format!("pid={pid} spawned ")), "{first}");
    assert!(
        first.contains(" name=late ") && first.contains(" ppid=1 "),
        "{first}"
    );
}

#[test]
fn sigterm_stops_the_kernel_cleanly() {
    let mut kernel = Kernel::start();
    kernel.stop();
    assert!(!kernel.data_dir().join("kernel.addr").exists());
    kernel.cli(&["ps", "--token", "x"]).failed(3);
}

/// Whether OS process `pid` exists and is not a zombie.
fn os_alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let rest = &stat[stat.rfind(')')? + 1..];
            rest.split_whitespace().next().map(|state| state != "Z")
        })
        .unwrap_or(false)
}

#[test]
fn exec_agents_log_to_files_shown_by_ps_and_end_with_the_kernel() {
    use std::os::unix::fs::PermissionsExt;

    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("agent.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\necho \"os_pid=$$ as $HIVEKERNEL_PID\" >&2\nexec sleep 600\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = write_config(
        dir.path(),
        r#"{ "kernel": { "listen": "127.0.0.1:0", "shutdown_grace_ms": 500, "default_runtime": "echo" },
             "agents": [ { "name": "shell", "runtime": "exec", "command": ["./agent.sh"] } ] }"#,
    );
    let mut kernel = Kernel::start_with(dir, &config, &[]);
    // The command comes last, after `--`; the connection flags go before it.
    let data = kernel.data_dir();
    let run = hivekernel(&[
        "spawn",
        "--parent",
        "1",
        "--name",
        "cli-sh",
        "--addr",
        &kernel.addr,
        "--data-dir",
        data.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "echo \"os_pid=$$ as $HIVEKERNEL_PID\" >&2; exec sleep 600",
    ]);
    let spawned: u64 = run.ok().trim().parse().unwrap();
    let logs = kernel.data_dir().join("logs");
    let mut os_pids = Vec::new();
    for name in ["shell", "cli-sh"] {
        let pid = kernel.pid_of(name);
        if name == "cli-sh" {
            assert_eq!(pid, spawned);
        }
        let procs = kernel.ps();
        let entry = find(&procs, pid).unwrap();
        assert_eq!(entry["runtime"], "exec");
        let log = PathBuf::from(entry["log_path"].as_str().unwrap());
        assert_eq!(log, logs.join(format!("{pid}-{name}.log")));
        let deadline = Instant::now() + Duration::from_secs(20);
        let text = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("os_pid=") {
                break text;
            }
            assert!(Instant::now() < deadline, "nothing in {log:?}");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(text.contains(&format!(" as {pid}")), "{text}");
        // `logs` shows an exec agent's log file, by name.
        let shown = kernel.cli(&["logs", name]);
        let shown = shown.ok();
        assert!(
            shown.contains(&format!("==> {} <==\n", log.display())) && shown.contains(&text),
            "{shown}"
        );
        let os_pid: String = text["os_pid=".len() + text.find("os_pid=").unwrap()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        assert!(os_alive(&os_pid));
        os_pids.push(os_pid);
    }
    let queen = find(&kernel.ps(), 1).unwrap().clone();
    assert!(queen["log_path"].is_null(), "{queen}");

    kernel.stop();
    for os_pid in os_pids {
        assert!(
            !os_alive(&os_pid),
            "OS process {os_pid} outlived the kernel"
        );
    }
}

#[test]
fn artifacts_put_ls_get_rm_survive_kill_9() {
    let mut kernel = Kernel::start();
    let queen = kernel.pid_of("queen").to_string();
    let file = kernel.dir.path().join("report.bin");
    let bytes: Vec<u8> = vec![0, 159, 146, 150, b'\n', 255];
    std::fs::write(&file, &bytes).unwrap();
    let put = kernel.cli(&[
        "artifacts",
        "put",
        "report.bin",
        file.to_str().unwrap(),
        "--owner",
        &queen,
        "--type",
        "application/octet-stream",
        "--visibility",
        "subtree",
    ]);
    let report: u64 = put.ok().trim().parse().unwrap();

    // `-` reads stdin.
    let data = kernel.data_dir();
    let mut child = Command::new(crate::support::binary())
        .args(["artifacts", "put", "notes.txt", "-", "--addr", &kernel.addr])
        .arg("--data-dir")
        .arg(&data)
        .env_remove("HIVEKERNEL_TOKEN")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"hello, artifacts\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let notes: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();

    let listed = kernel.cli(&["artifacts", "ls", "--json"]).json();
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(listed[0]["id"], notes, "newest first");
    assert_eq!(listed[0]["owner"], 1);
    assert_eq!(listed[0]["content_type"], "text/plain");
    assert_eq!(listed[0]["visibility"], "user");
    assert_eq!(listed[1]["owner_name"], "queen");
    assert_eq!(listed[1]["visibility"], "subtree");
    assert_eq!(listed[1]["size"], bytes.len());
    let table = kernel.cli(&["artifacts", "ls", "--owner", &queen]);
    let text = table.ok();
    assert!(text.starts_with("ID "), "{text}");
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(
        text.contains("report.bin") && !text.contains("notes.txt"),
        "{text}"
    );

    assert_eq!(
        kernel.cli(&["artifacts", "get", &notes.to_string()]).ok(),
        "hello, artifacts\n"
    );
    let copy = kernel.dir.path().join("copy.bin");
    kernel
        .cli(&[
            "artifacts",
            "get",
            &report.to_string(),
            "-o",
            copy.to_str().unwrap(),
        ])
        .ok();
    assert_eq!(std::fs::read(&copy).unwrap(), bytes, "byte for byte");

    // Acknowledged means committed: a kill -9 loses nothing.
    kernel.kill_9();
    kernel.restart();
    assert_eq!(kernel.pid_of("queen").to_string(), queen);
    assert_eq!(
        kernel.cli(&["artifacts", "get", &notes.to_string()]).ok(),
        "hello, artifacts\n"
    );

    kernel.cli(&["artifacts", "rm", &report.to_string()]).ok();
    let gone = kernel.cli(&["artifacts", "get", &report.to_string()]);
    assert!(gone.failed(1).contains("not found"), "{gone:#?}");
    kernel.cli(&["artifacts", "rm", "999999"]).failed(1);
    let listed = kernel.cli(&["artifacts", "ls", "--json"]).json();
    assert_eq!(listed.as_array().unwrap().len(), 1);

    let missing = kernel.cli(&["artifacts", "put", "x", "/no/such/file"]);
    assert!(missing.failed(2).contains("/no/such/file"), "{missing:#?}");
    let bad = kernel.cli(&[
        "artifacts",
        "put",
        "x",
        file.to_str().unwrap(),
        "--visibility",
        "everyone",
    ]);
    assert!(
        bad.failed(2).contains("private, user, subtree, global"),
        "{bad:#?}"
    );
}

#[test]
fn usage_shows_tokens_cost_and_budget_per_process_and_subtree() {
    let kernel = Kernel::start();
    let queen = kernel.pid_of("queen");
    let run = kernel.cli(&["usage"]);
    let table = run.ok();
    assert!(table.starts_with("PID  NAME"), "{table}");
    assert!(
        table.contains("SUBTREE_COST") && table.contains("queen"),
        "{table}"
    );
    let rows = kernel.cli(&["usage", &queen.to_string(), "--json"]).json();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 1, "only the subtree under the queen: {rows:?}");
    assert_eq!(rows[0]["pid"], queen);
    assert_eq!(rows[0]["usage"]["cost_usd"], 0.0);
    assert_eq!(rows[0]["subtree_usage"]["total_tokens"], 0);
    assert!(rows[0]["budget"].is_null(), "no budget given: unlimited");
    let missing = kernel.cli(&["usage", "999"]);
    assert!(missing.failed(1).contains("999"));
}

#[test]
fn logs_follow_a_turn_live_then_show_it_as_text_and_json() {
    use std::io::{BufRead, BufReader};
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/startup.json");
    let kernel = Kernel::start_with(
        tempfile::tempdir().unwrap(),
        &config,
        &["--listen", "127.0.0.1:0"],
    );
    let queen = kernel.pid_of("queen").to_string();
    let data = kernel.data_dir();
    // Following before the turn exists: what it prints arrives live.
    let mut follow = Command::new(crate::support::binary())
        .args(["logs", &queen, "-f", "--addr", &kernel.addr])
        .args(["--data-dir", data.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(follow.stdout.take().unwrap()).lines();
    let reader = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for line in lines {
            let line = line.unwrap();
            let done = line.ends_with(" answer");
            seen.push(line);
            if done {
                break;
            }
        }
        seen
    });
    // Let the watch start before the turn does.
    std::thread::sleep(Duration::from_millis(300));
    kernel
        .cli(&["exec", &queen, "check the logs; review the config"])
        .ok();
    let followed = reader.join().unwrap();
    let _ = follow.kill();
    let _ = follow.wait();
    let text = followed.join("\n");
    assert!(
        followed[0].starts_with("--- turn ") && followed[0].contains(&format!("of pid {queen}")),
        "{text}"
    );
    assert!(
        text.contains(" input\n    check the logs; review the config"),
        "{text}"
    );
    assert!(text.contains("call orchestrate {"), "{text}");
    assert!(text.contains(" tool orchestrate ok in "), "{text}");
    assert!(text.contains("queen-w1 handled: check the logs"), "{text}");

    // The same turn afterwards, as text and as JSON lines.
    let shown = kernel.cli(&["logs", &queen]);
    let shown = shown.ok();
    for line in &followed {
        assert!(shown.contains(line.as_str()), "{line:?} not in:\n{shown}");
    }
    let json = kernel.cli(&["logs", &queen, "--json", "--tail", "1"]);
    let entries: Vec<serde_json::Value> = json
        .ok()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(entries.first().unwrap()["type"], "input");
    assert_eq!(entries.last().unwrap()["type"], "answer");
    let tokens: u64 = entries
        .iter()
        .filter(|e| e["type"] == "response")
        .map(|e| e["prompt_tokens"].as_u64().unwrap() + e["completion_tokens"].as_u64().unwrap())
        .sum();
    assert!(tokens > 0, "{entries:?}");
    assert!(kernel.cli(&["logs", "999"]).failed(1).contains("999"));
    let bad = kernel.cli(&["logs", &queen, "--since", "yesterday"]);
    assert!(bad.failed(2).contains("90s, 10m, 2h or 1d"), "{bad:#?}");
}

#[test]
fn processes_are_named_by_name_or_path_and_an_ambiguous_name_lists_its_candidates() {
    let kernel = Kernel::start();
    let queen = kernel.pid_of("queen");
    assert_eq!(kernel.cli(&["exec", "queen", "hello"]).ok().trim(), "hello");
    let under_queen = kernel.spawn(&["--parent", "queen", "--name", "twin", "--runtime", "echo"]);
    let under_kernel = kernel.spawn(&["--parent", "1", "--name", "twin", "--runtime", "echo"]);
    assert_eq!(
        kernel.cli(&["exec", "queen/twin", "by path"]).ok().trim(),
        "by path"
    );
    let tree = kernel.cli(&["ps", "--root", "queen", "--json"]).json();
    let pids: Vec<u64> = tree
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(pids, [queen, under_queen]);

    let ambiguous = kernel.cli(&["exec", "twin", "which?"]);
    let text = ambiguous.failed(1);
    assert!(
        text.contains(&format!(
            "\"twin\" names 2 processes: {under_queen} (queen/twin), {under_kernel} (twin)"
        )),
        "{text}"
    );
    let unknown = kernel.cli(&["kill", "nobody"]);
    assert!(
        unknown.failed(1).contains("no process named \"nobody\""),
        "{unknown:#?}"
    );
    let bad_path = kernel.cli(&["send", "queen/nobody", "hi"]);
    assert!(
        bad_path
            .failed(1)
            .contains(&format!("no child named \"nobody\" under queen ({queen})")),
        "{bad_path:#?}"
    );
    // Killed, the queen's twin is a zombie: the live one answers to the name.
    kernel.cli(&["kill", "queen/twin"]).ok();
    assert_eq!(
        kernel.cli(&["exec", "twin", "the live one"]).ok().trim(),
        "the live one"
    );
    let empty = kernel.cli(&["exec", "", "x"]);
    assert!(
        empty.failed(2).contains("a process name or a path"),
        "{empty:#?}"
    );
}

#[test]
fn completion_scripts_are_generated_for_each_shell() {
    let bash = hivekernel(&["completion", "bash"]);
    let bash = bash.ok();
    assert!(
        bash.contains("_hivekernel()") && bash.contains("logs"),
        "{bash}"
    );
    // The script parses as bash.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hivekernel.bash");
    std::fs::write(&file, bash).unwrap();
    let checked = Command::new("bash").arg("-n").arg(&file).status().unwrap();
    assert!(checked.success());
    assert!(
        hivekernel(&["completion", "zsh"])
            .ok()
            .starts_with("#compdef hivekernel")
    );
    let fish = hivekernel(&["completion", "fish"]);
    assert!(
        fish.ok().contains(
            "complete -c hivekernel -n \"__fish_hivekernel_needs_command\" -f -a \"logs\""
        ),
        "{fish:#?}"
    );
    assert!(
        hivekernel(&["completion", "tcsh"])
            .failed(2)
            .contains("bash, elvish, fish, powershell, zsh")
    );
}

#[test]
fn describe_shows_a_process_in_sections_with_its_children_and_cron_entries() {
    let kernel = Kernel::start();
    let queen = kernel.pid_of("queen");
    let child = kernel.spawn(&["--parent", "queen", "--name", "scout", "--runtime", "echo"]);
    kernel
        .cli(&[
            "cron",
            "add",
            "nightly",
            "0 3 * * *",
            "tidy up",
            "--target",
            "queen",
        ])
        .ok();
    let run = kernel.cli(&["describe", "queen"]);
    let text = run.ok();
    for expected in [
        "Name:         queen\n".to_owned(),
        format!("PID:          {queen} (parent 1)\n"),
        "Role:         daemon (tier tactical)\n".to_owned(),
        "Tools:        spawn_child, read_file\n".to_owned(),
        "Metadata:     purpose=coordinator\n".to_owned(),
        "  max_children          8\n".to_owned(),
        "  own      0 calls, 0 tokens (0 prompt + 0 completion), $0.0000\n".to_owned(),
        "Budget:       unlimited\n".to_owned(),
        "Cron:\n  nightly \"0 3 * * *\" execute \"tidy up\", next in ".to_owned(),
    ] {
        assert!(text.contains(&expected), "{expected:?} not in:\n{text}");
    }
    assert!(
        text.contains(&format!("\n  {child}  ")) && text.contains("scout"),
        "{text}"
    );
    let json = kernel
        .cli(&["describe", &queen.to_string(), "--json"])
        .json();
    assert_eq!(json["children"][0]["pid"], child);
    assert_eq!(json["cron"][0]["name"], "nightly");
    assert_eq!(json["strategy"], "one_for_one");
    assert_eq!(json["restart"]["policy"], "temporary");
    assert!(
        kernel
            .cli(&["describe", "nobody"])
            .failed(1)
            .contains("nobody")
    );
}

#[test]
fn ps_filters_by_state_role_name_and_label_and_watch_redraws_on_events() {
    use std::io::Read;
    let kernel = Kernel::start();
    let gone = kernel.spawn(&["--parent", "1", "--name", "gone-1", "--runtime", "echo"]);
    kernel.cli(&["kill", &gone.to_string()]).ok();
    let names = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["ps", "--json"];
        all.extend(args);
        let listed = kernel.cli(&all).json();
        listed
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        names(&[]),
        ["kernel", "queen", "helper"],
        "zombies hidden by default"
    );
    assert_eq!(names(&["-a"]), ["kernel", "queen", "helper", "gone-1"]);
    assert_eq!(names(&["--state", "zombie"]), ["gone-1"]);
    assert_eq!(names(&["--role", "daemon,agent"]), ["queen", "helper"]);
    assert_eq!(names(&["--name", "h*r"]), ["helper"]);
    assert_eq!(names(&["--label", "purpose=coordinator"]), ["queen"]);
    assert!(names(&["--label", "purpose=other"]).is_empty());
    let bad = kernel.cli(&["ps", "--state", "sleepy"]);
    assert!(bad.failed(2).contains("idle"), "{bad:#?}");
    let table = kernel.cli(&["ps"]);
    assert!(
        table.ok().lines().next().unwrap().contains("STATE  AGE"),
        "{table:#?}"
    );

    // --watch draws, then draws again when something happens.
    let data = kernel.data_dir();
    let mut watch = Command::new(crate::support::binary())
        .args(["ps", "--watch", "--addr", &kernel.addr])
        .args(["--data-dir", data.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = watch.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut seen = String::new();
        let mut buf = [0u8; 4096];
        while !seen.contains("watched-1") {
            let n = out.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        seen
    });
    std::thread::sleep(Duration::from_millis(500));
    kernel.spawn(&["--parent", "1", "--name", "watched-1", "--runtime", "echo"]);
    let seen = reader.join().unwrap();
    let _ = watch.kill();
    let _ = watch.wait();
    let draws: Vec<&str> = seen
        .split("\x1b[H\x1b[2J")
        .filter(|d| !d.is_empty())
        .collect();
    assert!(draws.len() >= 2, "{seen}");
    assert!(!draws[0].contains("watched-1") && draws.last().unwrap().contains("watched-1"));
}

#[test]
fn events_filter_by_process_subtree_and_type_and_tail_the_newest() {
    let kernel = Kernel::start();
    let queen = kernel.pid_of("queen");
    let scout = kernel.spawn(&["--parent", "queen", "--name", "scout", "--runtime", "echo"]);
    let other = kernel.spawn(&["--parent", "1", "--name", "other", "--runtime", "echo"]);
    kernel.cli(&["exec", "scout", "one"]).ok();
    kernel.cli(&["exec", "other", "two"]).ok();
    let lines = |args: &[&str]| -> Vec<Value> {
        let mut all = vec!["events", "--json"];
        all.extend(args);
        kernel
            .cli(&all)
            .ok()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let pids = |events: &[Value]| -> HashSet<u64> {
        events.iter().map(|e| e["pid"].as_u64().unwrap()).collect()
    };
    let of_scout = lines(&["--pid", "scout"]);
    assert_eq!(pids(&of_scout), HashSet::from([scout]));
    let subtree = lines(&["--pid", "queen", "--subtree"]);
    assert_eq!(pids(&subtree), HashSet::from([queen, scout]));
    let finished = lines(&["--type", "task_finished"]);
    assert_eq!(pids(&finished), HashSet::from([scout, other]));
    let newest = lines(&["--tail", "2"]);
    assert_eq!(newest.len(), 2);
    let all = lines(&[]);
    assert_eq!(newest[..], all[all.len() - 2..]);
    // The text form: no `type` repeated in the detail, human durations.
    let text = kernel.cli(&["events", "--pid", "other", "--type", "task_finished"]);
    let line = text.ok().trim().to_owned();
    assert!(
        line.contains(&format!("pid={other} task_finished ")),
        "{line}"
    );
    assert!(!line.contains("\"type\""), "{line}");
    assert!(
        line.contains(" duration=") && line.contains("ms") && !line.contains("duration_ms"),
        "{line}"
    );
    // One trace: what `exec --json` started, and nothing else.
    let traced = kernel.cli(&["exec", "other", "three", "--json"]).json();
    let trace = traced["trace_id"].as_str().unwrap().to_owned();
    assert_eq!(trace.len(), 32, "{traced}");
    let of_trace = lines(&["--trace", &trace]);
    assert!(!of_trace.is_empty());
    assert!(
        of_trace
            .iter()
            .all(|e| e["trace_id"] == trace.as_str() && e["pid"] == other),
        "{of_trace:?}"
    );
    assert!(
        of_trace.iter().any(|e| e["type"] == "task_finished"),
        "{of_trace:?}"
    );
    let bad = kernel.cli(&["events", "--trace", "xyz"]);
    assert!(bad.failed(2).contains("not a trace id"), "{bad:#?}");
}

/// `spawn -- CMD` runs the command in the directory it was typed in (or
/// `--cwd`), so relative paths, the program's too, mean what they mean in
/// the shell; the log says where it ran.
#[test]
fn spawn_runs_an_exec_command_where_it_was_typed() {
    let kernel = Kernel::start();
    let here = tempfile::tempdir().unwrap();
    std::fs::write(here.path().join("note.txt"), "from the shell's directory\n").unwrap();
    let script = here.path().join("agent.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\necho \"pwd=$(pwd)\" >&2\ncat note.txt >&2\nexec sleep 600\n",
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let data = kernel.data_dir();
    let spawn = |dir: &Path, extra: &[&str], name: &str| -> u64 {
        let mut args = vec!["spawn", "--parent", "1", "--name", name];
        args.extend(extra);
        args.extend(["--addr", &kernel.addr, "--data-dir", data.to_str().unwrap()]);
        args.extend(["--", "./agent.sh"]);
        let output = Command::new(crate::support::binary())
            .args(&args)
            .current_dir(dir)
            .env_remove("HIVEKERNEL_ADDR")
            .env_remove("HIVEKERNEL_TOKEN")
            .env_remove("HIVEKERNEL_DATA_DIR")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        stdout
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{stdout} {}", String::from_utf8_lossy(&output.stderr)))
    };
    let log_of = |pid: u64| -> String {
        let info = kernel.cli(&["describe", &pid.to_string(), "--json"]).json();
        let path = PathBuf::from(info["log_path"].as_str().unwrap());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let log = std::fs::read_to_string(&path).unwrap_or_default();
            if log.contains("from the shell") {
                return log;
            }
            assert!(Instant::now() < deadline, "{}: {log}", path.display());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let pid = spawn(here.path(), &[], "typed-here");
    let real = here.path().canonicalize().unwrap();
    assert!(log_of(pid).contains(&format!("pwd={}", real.display())));

    // --cwd, relative to where it is typed.
    let parent = here.path().parent().unwrap();
    let name = here.path().file_name().unwrap().to_str().unwrap();
    let pid = spawn(parent, &["--cwd", name], "told-where");
    assert!(log_of(pid).contains(&format!("pwd={}", real.display())));

    // --cwd without a command is a usage error.
    let refused = hivekernel(&["spawn", "--parent", "1", "--cwd", "x"]);
    assert!(refused.failed(2).contains("--cwd"), "{refused:?}");
}
