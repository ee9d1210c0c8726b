//! Approval rules against calls that change only the case of what a rule
//! names (the glob holds them all), and against a process that asks
//! another to make the call for it (the call waits for the same approval).

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hivekernel_agents::approval::{ApprovalRule, OnTimeout};
use hivekernel_tests::binary::Binary;
use hivekernel_tests::llm_server::{LlmServer, Scripted, system_message, tool_results};
use parking_lot::Mutex;
use serde_json::{Value, json};

fn rule(tool: &str, glob: &str) -> ApprovalRule {
    ApprovalRule {
        tool: tool.to_owned(),
        arguments: Some(glob.to_owned()),
        timeout_seconds: 60,
        on_timeout: OnTimeout::Deny,
    }
}

#[test]
fn an_arguments_glob_holds_every_case_of_what_it_names() {
    let curl = rule("shell_exec", "*curl *");
    for command in [
        "curl http://x",
        "CURL http://x",
        "Curl http://x",
        "/usr/bin/cUrL x",
    ] {
        assert!(
            curl.covers("shell_exec", &json!({ "command": command })),
            "{command}"
        );
    }
    assert!(!curl.covers("shell_exec", &json!({ "command": "ls -l" })));
    let upload = rule("mcp:files/write", "*\"path\":\"/etc/*");
    assert!(upload.covers("mcp:files/write", &json!({ "path": "/ETC/passwd" })));
    assert!(upload.covers("mcp:files/write", &json!({ "PATH": "/etc/passwd" })));
    assert!(!upload.covers("mcp:files/write", &json!({ "path": "/tmp/x" })));
}

/// What a turn asks the model: the last user message's text, and the tool
/// results given since (a daemon's earlier turns stay in its history).
fn turn(body: &Value) -> (String, Vec<String>) {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let start = messages
        .iter()
        .rposition(|m| m["role"] == "user")
        .unwrap_or(0);
    let text = messages
        .get(start)
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned();
    let results = messages[start..]
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect();
    (text, results)
}

/// The marker a text asks to make: `marker-<word>` after `run `.
fn marker(text: &str) -> Option<String> {
    let at = text.find("run marker-")? + "run ".len();
    Some(
        text[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect(),
    )
}

/// Whether a file named `name` exists anywhere under `dir`.
fn exists_under(dir: &Path, name: &str) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|entry| {
        let path = entry.path();
        path.file_name().is_some_and(|n| n == name)
            || (path.is_dir() && !path.is_symlink() && exists_under(&path, name))
    })
}

/// A process the requester names by PID.
type Pids = Arc<Mutex<HashMap<&'static str, u64>>>;

/// The model behind every agent of the chain test, by the agent's prompt:
/// `cautious` asks the others for work by the flow its task names;
/// `helper` and `sub` run the marker they are asked for with
/// `shell_exec`; `helper` spawns `sub` when asked to.
fn chain_model(body: &Value, pids: &Pids) -> Scripted {
    let system = system_message(body);
    let (text, results) = turn(body);
    let pid = |name: &str| pids.lock().get(name).copied().unwrap_or(0);
    let call = |tool: &str, args: Value| Scripted::tool_calls(&[("c1", tool, &args.to_string())]);
    if system.contains("You are CAUTIOUS") {
        if !results.is_empty() {
            return Scripted::content("cautious done");
        }
        let helper = pid("helper");
        return match text.split_whitespace().find(|w| w.starts_with("FLOW-")) {
            Some("FLOW-direct") => call(
                "execute_task",
                json!({"pid": helper, "task": "run marker-direct"}),
            ),
            Some("FLOW-delegate") => call(
                "delegate_async",
                json!({"pid": helper, "task": "run marker-delegate"}),
            ),
            Some("FLOW-message") => call(
                "send_message",
                json!({"pid": helper, "message": "run marker-message"}),
            ),
            Some("FLOW-spawn") => call(
                "execute_task",
                json!({"pid": helper, "task": "start a child and have it run marker-child"}),
            ),
            Some("FLOW-cron") => call(
                "execute_task",
                json!({"pid": helper, "task": "schedule marker-cron"}),
            ),
            Some("FLOW-relay") => call(
                "send_message",
                json!({"pid": pid("relay"), "message": "go"}),
            ),
            _ => Scripted::content("noted"),
        };
    }
    if text.contains("schedule marker-cron") {
        return match results.len() {
            0 => call(
                "schedule_cron",
                json!({"name": "later", "expression": "@yearly", "action": "execute",
                       "task": "run marker-cron"}),
            ),
            _ => Scripted::content("scheduled"),
        };
    }
    if text.contains("start a child") {
        return match results.len() {
            0 => call(
                "spawn_child",
                json!({"name": "sub", "role": "worker", "prompt": "You are SUB.", "model": "m",
                       "tools": ["shell_exec"]}),
            ),
            1 => {
                let child = results[0]
                    .rsplit("pid ")
                    .next()
                    .and_then(|n| n.trim().parse::<u64>().ok())
                    .unwrap_or(0);
                call(
                    "execute_task",
                    json!({"pid": child, "task": "run marker-child"}),
                )
            }
            _ => Scripted::content("child done"),
        };
    }
    match (marker(&text), results.is_empty()) {
        (Some(marker), true) => call(
            "shell_exec",
            json!({ "command": format!("touch {marker}") }),
        ),
        _ => Scripted::content("ran"),
    }
}

/// The one pending request, once there is one; none after `wait`.
fn pending(kernel: &Binary, wait: Duration) -> Option<Value> {
    let deadline = Instant::now() + wait;
    loop {
        let listed = kernel.json(&["inbox", "--json"]);
        if let Some(request) = listed.as_array().and_then(|a| a.first()) {
            return Some(request.clone());
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A sibling, a child spawned for a requester, a daemon sent a message,
/// a cron entry added for a requester and an `exec` agent handed work all
/// run what they are asked under the requester's approval rules: each `shell_exec` call waits in the inbox
/// as the requester's own would; denied, it never runs. The same call
/// asked by an operator, whose work carries no rule, runs at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_asked_by_a_process_runs_under_its_approval_rules() {
    let bin = match hivekernel_tests::build_hivekernel() {
        Ok(bin) => bin,
        Err((bin, why)) => panic!("cannot build {}: {why}", bin.display()),
    };
    let pids: Pids = Arc::default();
    let server = LlmServer::answering({
        let pids = pids.clone();
        move |body| chain_model(body, &pids)
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let go = dir.path().join("go");
    // The exec agent waits for its cue, then asks helper for work with its
    // own token.
    let relay = format!(
        "while [ ! -e '{go}' ]; do sleep 0.05; done; '{bin}' exec helper 'run marker-relay'; \
         sleep 3600",
        go = go.display(),
        bin = bin.display()
    );
    let config = json!({
        "kernel": { "listen": "127.0.0.1:0", "workspace": ws },
        "llm": { "provider": "openai", "base_url": server.base_url(),
                 "api_key_env": "HIVEKERNEL_TEST_NO_KEY", "max_retries": 0 },
        "roles": {
            "lead": { "capabilities": ["send_message"] },
            "daemon": { "capabilities": ["send_message", "spawn_children", "shell_exec",
                                         "manage_cron"] },
            "worker": { "capabilities": ["send_message", "shell_exec"] }
        },
        "agents": [
            { "name": "cautious", "role": "lead", "runtime": "tool_agent", "model": "m",
              "system_prompt": "You are CAUTIOUS.",
              "tools": ["execute_task", "delegate_async", "send_message"],
              "approval": [{ "tool": "shell_exec", "timeout_seconds": 3600 }] },
            { "name": "helper", "role": "daemon", "runtime": "tool_agent", "model": "m",
              "system_prompt": "You are HELPER.",
              "tools": ["shell_exec", "spawn_child", "execute_task", "schedule_cron"] },
            { "name": "relay", "role": "lead", "runtime": "exec",
              "command": ["sh", "-c", relay] }
        ]
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let kernel = Binary::start(&bin, dir.path());
    for name in ["helper", "relay"] {
        let pid = kernel.json(&["describe", name, "--json"])["pid"]
            .as_u64()
            .unwrap();
        pids.lock().insert(name, pid);
    }
    let helper = pids.lock()["helper"];

    // Asked by the operator, helper runs it at once: no rule of its own.
    assert_eq!(
        kernel.cli(&["exec", "helper", "run marker-free"]).trim(),
        "ran"
    );
    assert!(exists_under(&ws, "marker-free"));
    assert!(pending(&kernel, Duration::ZERO).is_none());

    // Each flow: the call waits in the inbox as the process that would
    // run it; denied, it does not run.
    for (flow, marker) in [
        ("FLOW-direct", "marker-direct"),
        ("FLOW-delegate", "marker-delegate"),
        ("FLOW-message", "marker-message"),
        ("FLOW-spawn", "marker-child"),
        ("FLOW-cron", "marker-cron"),
        ("FLOW-relay", "marker-relay"),
    ] {
        let mut asking = kernel
            .command(&["exec", "cautious", flow])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        if flow == "FLOW-cron" {
            // Scheduled by helper for cautious; fired by an operator.
            assert!(asking.wait().unwrap().success());
            kernel.cli(&["cron", "run", "later"]);
        }
        if flow == "FLOW-relay" {
            // Handed to the exec agent first (out of its mailbox, which
            // it never reads), then its cue.
            assert!(asking.wait().unwrap().success());
            let deadline = Instant::now() + Duration::from_secs(30);
            while kernel.json(&["describe", "relay", "--json"])["mailbox_len"] != 0 {
                assert!(
                    Instant::now() < deadline,
                    "relay was not handed the message"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            std::thread::sleep(Duration::from_millis(200));
            std::fs::write(&go, "").unwrap();
        }
        let request = pending(&kernel, Duration::from_secs(30)).unwrap_or_else(|| {
            let seen: Vec<Vec<String>> = server.requests().iter().map(tool_results).collect();
            let logs: Vec<String> = std::fs::read_dir(dir.path().join("data/logs"))
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
                .collect();
            let log = kernel.log();
            panic!("{flow}: nobody was asked for {marker}; the model saw {seen:?}; logs {logs:?}; kernel {log}")
        });
        assert_eq!(request["tool"], "shell_exec", "{flow}: {request}");
        assert!(
            request["arguments"].as_str().unwrap().contains(marker),
            "{flow}: {request}"
        );
        if flow == "FLOW-spawn" {
            assert_eq!(request["name"], "sub", "{flow}: {request}");
        } else {
            assert_eq!(request["pid"], helper, "{flow}: {request}");
        }
        kernel.cli(&["deny", &request["id"].to_string(), "--reason", "no"]);
        // (Waited for already in the relay and cron flows: the same status.)
        let status = asking.wait().unwrap();
        assert!(status.success(), "{flow}: {status}");
        assert!(!exists_under(&ws, marker), "{flow}: {marker} ran");
    }
}
