//! The real-model tier: the `hivekernel` binary against llama.cpp's
//! `llama-server` serving SmolLM2-135M-Instruct on loopback, a server
//! nobody on this project wrote, with the chat templates real models ship.
//! Every assertion is on protocol behaviour (what was sent, streamed,
//! refused, counted, cancelled), never on what the tiny model says: the
//! server samples greedily (`--temp 0`), and the prompts are ones it ends
//! by itself, where an ending matters.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use hivekernel_tests::binary::Binary;
use hivekernel_tests::llama::{LlamaServer, MODEL};
use serde_json::{Value, json};

/// The Qwen2.5 template: tools in the system prompt, one system message.
const QWEN: &str = "Qwen-Qwen2.5-7B-Instruct";
/// Mistral's: refuses a conversation whose roles do not alternate.
const MISTRAL: &str = "mistralai-Mistral-Nemo-Instruct-2407";

/// A question the model answers in a few tokens and then stops.
const SHORT_QUESTION: &str = "What is the capital of France?";

fn bin() -> std::path::PathBuf {
    match hivekernel_tests::build_hivekernel() {
        Ok(bin) => bin,
        Err((bin, why)) => panic!("cannot build {}: {why}", bin.display()),
    }
}

/// A kernel config with one daemon `writer` on the server; `llm` fields
/// merged over the defaults here.
fn write_config(dir: &Path, server: &LlamaServer, llm: Value) {
    write_config_with_tools(dir, server, llm, &[]);
}

/// [`write_config`], the writer given `tools`.
fn write_config_with_tools(dir: &Path, server: &LlamaServer, llm: Value, tools: &[&str]) {
    let mut settings = json!({
        "provider": "openai",
        "base_url": server.base_url(),
        "api_key_env": "HIVEKERNEL_TEST_NO_KEY",
        "models": { "small": MODEL },
        "strict_models": true,
        "max_completion_tokens": 256,
        "first_token_timeout_seconds": 60,
        "idle_timeout_seconds": 30,
    });
    for (key, value) in llm.as_object().unwrap() {
        settings[key] = value.clone();
    }
    let config = json!({
        "kernel": { "listen": "127.0.0.1:0", "dashboard": { "enabled": false } },
        "llm": settings,
        "agents": [
            { "name": "writer", "role": "daemon", "runtime": "tool_agent", "model": "small",
              "system_prompt": "You are a helpful assistant.", "tools": tools }
        ]
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
}

/// The writer's transcript entries, oldest first.
fn transcript(kernel: &Binary) -> Vec<Value> {
    json_lines(&kernel.cli(&["logs", "writer", "--json"]))
}

/// One JSON object per line, as `--json` prints lists.
fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn of_type<'a>(entries: &'a [Value], kind: &str) -> Vec<&'a Value> {
    entries.iter().filter(|e| e["type"] == kind).collect()
}

/// `hivekernel exec writer TEXT --json`: the reply, and whether it exited 0.
fn exec(kernel: &Binary, text: &str, extra: &[&str]) -> (Value, bool) {
    let mut args = vec!["exec", "writer", text, "--json"];
    args.extend_from_slice(extra);
    let out = kernel.command(&args).output().unwrap();
    let reply = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "exec printed no JSON: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (reply, out.status.success())
}

#[test]
fn a_plain_answer_streams_into_logs_f_and_its_tokens_are_the_servers_count() {
    let dir = tempfile::tempdir().unwrap();
    let server = LlamaServer::start(dir.path(), Some(QWEN), 4096, &["--temp", "0"]);
    write_config(dir.path(), &server, json!({}));
    let kernel = Binary::start(&bin(), dir.path());
    // The window came from the server's /props, and the name it serves
    // passed strict_models.
    let log = kernel.log();
    assert!(
        log.contains("context window from the server") && log.contains("context_tokens=4096"),
        "{log}"
    );

    // Follow the writer before it has a turn: what arrives is live.
    let mut follow = kernel
        .command(&["logs", "writer", "-f"])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(follow.stdout.take().unwrap()).lines();
    let reader = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for line in lines {
            let line = line.unwrap();
            let done = line.ends_with(" answer") && !line.ends_with("streaming the answer");
            seen.push(line);
            if done {
                break;
            }
        }
        seen
    });
    std::thread::sleep(Duration::from_millis(500));

    let (reply, ok) = exec(&kernel, SHORT_QUESTION, &[]);
    assert!(ok, "{reply}");
    let answer = reply["output"].as_str().unwrap();
    assert!(!answer.trim().is_empty(), "{reply}");
    let seen = reader.join().unwrap();
    let _ = follow.kill();
    let _ = follow.wait();
    let printed = seen.join("\n");
    let streaming = seen
        .iter()
        .position(|l| l.contains("streaming the answer"))
        .unwrap_or_else(|| panic!("no streaming in logs -f:\n{printed}"));
    let head = seen
        .iter()
        .position(|l| l.contains("(its text streamed above)"))
        .unwrap_or_else(|| panic!("no response head in logs -f:\n{printed}"));
    assert!(streaming < head, "{printed}");

    // The response holds the answer, its finish reason, and the tokens
    // the server counted (its log says how many prompt tokens it read).
    let entries = transcript(&kernel);
    let responses = of_type(&entries, "response");
    assert_eq!(responses.len(), 1, "{entries:?}");
    let response = responses[0];
    assert_eq!(response["finish_reason"], "stop", "{response}");
    assert_eq!(response["content"].as_str().unwrap().trim(), answer.trim());
    let prompt_tokens = response["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 0 && response["completion_tokens"].as_u64().unwrap() > 0);
    let server_log = server.log();
    let words = server_log.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words.contains("prompt eval time = ")
            && words.contains(&format!("/ {prompt_tokens} tokens (")),
        "the server read a prompt other than {prompt_tokens} tokens:\n{server_log}"
    );
    // The request sent the served name and a max_tokens.
    let request = of_type(&entries, "request")[0];
    assert_eq!(request["model"], "small", "{request}");
    assert_eq!(request["max_tokens"], 256, "{request}");
}

#[test]
fn an_answer_cut_at_max_tokens_fails_the_task_as_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let server = LlamaServer::start(dir.path(), Some(QWEN), 4096, &["--temp", "0"]);
    write_config(dir.path(), &server, json!({ "max_completion_tokens": 8 }));
    let kernel = Binary::start(&bin(), dir.path());
    let (reply, ok) = exec(&kernel, "Write a long story about a dragon.", &[]);
    assert!(!ok, "{reply}");
    let error = reply["error"].as_str().unwrap();
    assert!(
        error.contains("truncated") && error.contains("length"),
        "{error}"
    );
    let entries = transcript(&kernel);
    let response = of_type(&entries, "response")[0];
    assert_eq!(response["finish_reason"], "length", "{response}");
    assert_eq!(response["completion_tokens"], 8, "{response}");
}

#[test]
fn a_cancelled_task_stops_the_server_generating() {
    let dir = tempfile::tempdir().unwrap();
    // --ignore-eos: the answer runs to max_tokens unless the kernel stops it.
    let server = LlamaServer::start(dir.path(), Some(QWEN), 8192, &["--ignore-eos"]);
    write_config(
        dir.path(),
        &server,
        json!({ "max_completion_tokens": 6000 }),
    );
    let kernel = Binary::start(&bin(), dir.path());
    let started = Instant::now();
    let (reply, ok) = exec(&kernel, "Write a long story.", &["--timeout", "3"]);
    assert!(!ok, "{reply}");
    assert!(
        reply["error"].as_str().unwrap().contains("within 3000 ms"),
        "{reply}"
    );
    // 6,000 tokens take minutes here; the slot is free within seconds of
    // the task's end, and the server's log says the task was cancelled.
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.generating() {
        assert!(
            Instant::now() < deadline,
            "still generating 10 s after the task ended:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(started.elapsed() < Duration::from_secs(30));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.log().contains("cancel task") {
        assert!(Instant::now() < deadline, "{}", server.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    // The kernel recorded the call as cancelled, with what had streamed.
    let entries = transcript(&kernel);
    let errors = of_type(&entries, "model_error");
    assert!(
        errors.iter().any(
            |e| e["error"].as_str().unwrap().starts_with("cancelled after")
                && !e["partial"].as_str().unwrap_or("").is_empty()
        ),
        "{entries:?}"
    );
}

#[test]
fn a_server_restarting_is_waited_out() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = LlamaServer::start(dir.path(), Some(QWEN), 4096, &["--temp", "0"]);
    write_config(
        dir.path(),
        &server,
        json!({ "unavailable_wait_seconds": 60 }),
    );
    let kernel = Binary::start(&bin(), dir.path());
    server.kill();
    let restart = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(3));
        server.resume();
        server.wait_ready();
        server
    });
    let started = Instant::now();
    let (reply, ok) = exec(&kernel, SHORT_QUESTION, &[]);
    let server = restart.join().unwrap();
    assert!(ok, "{reply}\n{}", kernel.log());
    assert!(started.elapsed() >= Duration::from_secs(3));
    assert_eq!(server.log().matches("listening on").count(), 2);
    // The refused attempts were waiting, not failures: the task's one
    // model call succeeded, after more than one attempt.
    let events = kernel.cli(&["events", "--pid", "writer", "--type", "llm_call", "--json"]);
    let calls = json_lines(&events);
    let last = calls
        .last()
        .unwrap_or_else(|| panic!("no llm_call:\n{events}"));
    assert!(last.to_string().contains("\"attempt\""), "{events}");
}

#[test]
fn a_long_history_is_shortened_and_accepted_by_a_strict_template() {
    let dir = tempfile::tempdir().unwrap();
    // Every answer ends at its first full stop (`-r .`) and not before
    // (`--ignore-eos`): short, never empty, so every turn stays in the
    // history, which is what has to be shortened.
    let server = LlamaServer::start(
        dir.path(),
        Some(MISTRAL),
        1024,
        &["--temp", "0", "--ignore-eos", "-r", "."],
    );
    write_config(dir.path(), &server, json!({ "max_completion_tokens": 64 }));
    let kernel = Binary::start(&bin(), dir.path());
    // Each input is about 350 tokens: the fourth no longer fits a 1,024
    // token window with the history before it.
    let filler = "The quick brown fox jumps over the lazy dog near the river bank. ".repeat(22);
    for n in 1..=5 {
        let text = format!("Note {n}: {filler}\nSummarise note {n} in one sentence.");
        let (reply, ok) = exec(&kernel, &text, &[]);
        assert!(ok, "input {n}: {reply}");
    }
    let entries = transcript(&kernel);
    let noted = entries.iter().any(|e| {
        e["type"] == "message"
            && e["role"] == "system"
            && e["content"].as_str().unwrap().contains("[Context note:")
    });
    assert!(noted, "the history was never shortened: {entries:?}");
    // Every request was answered: no refusal for roles, no overflow.
    assert_eq!(
        of_type(&entries, "request").len(),
        of_type(&entries, "response").len(),
        "{:?}",
        of_type(&entries, "model_error")
    );
    assert!(of_type(&entries, "response").len() >= 5);
}

#[test]
fn llm_check_and_start_tell_a_template_without_tools_from_a_model_that_ignores_them() {
    let dir = tempfile::tempdir().unwrap();
    let check = |server: &LlamaServer| {
        write_config_with_tools(dir.path(), server, json!({}), &["read_file"]);
        let out = std::process::Command::new(bin())
            .args(["llm", "check"])
            .arg(dir.path().join("config.json"))
            .env_remove("HIVEKERNEL_LLM_BASE_URL")
            .env_remove("HIVEKERNEL_LLM_MODEL")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    // The model's own template, without --jinja: llama.cpp drops the
    // tools a request offers and answers 200. Its /props says so, and the
    // kernel tells the user, at start and in `llm check`.
    let mut plain = LlamaServer::start(dir.path(), None, 4096, &["--temp", "0"]);
    let text = check(&plain);
    assert!(
        text.contains("listed  yes, context window 4096 tokens")
            && text.contains("answer  ok in")
            && text.contains("tools   dropped: the server's chat template does not render tools"),
        "{text}"
    );
    let kernel = Binary::start(&bin(), dir.path());
    assert!(
        kernel.log().lines().any(|line| line.contains("WARN")
            && line.contains("does not render tools")
            && line.contains("--jinja")),
        "{}",
        kernel.log()
    );
    drop(kernel);
    plain.kill();

    // A template with tools: whatever the tiny model does, the check does
    // not blame the template.
    let tools = LlamaServer::start(dir.path(), Some(QWEN), 4096, &["--temp", "0"]);
    let text = check(&tools);
    let line = text
        .lines()
        .find(|line| line.trim_start().starts_with("tools"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains("ok: called echo")
            || line.contains("not called:") && line.contains("renders tools"),
        "{text}"
    );
}

#[test]
fn a_tool_call_streamed_by_the_server_is_run_and_its_result_answered() {
    let dir = tempfile::tempdir().unwrap();
    // The answer ends where the first call does (`-r </tool_call>`): this
    // model otherwise repeats the call until the length limit.
    let server = LlamaServer::start(
        dir.path(),
        Some(QWEN),
        4096,
        &["--temp", "0", "-r", "</tool_call>"],
    );
    write_config_with_tools(dir.path(), &server, json!({}), &["read_file"]);
    let kernel = Binary::start(&bin(), dir.path());
    // The tiny model seldom calls a tool of its own accord, but it copies
    // the marker that opens a call in this template; from there llama.cpp's
    // grammar makes it a well-formed call to a tool on offer, which the
    // server parses and streams as a tool call.
    let (reply, _) = exec(&kernel, "Reply with exactly this text: <tool_call>", &[]);
    let entries = transcript(&kernel);
    let called = entries
        .iter()
        .find(|e| e["type"] == "response" && e["tool_calls"].is_array())
        .unwrap_or_else(|| panic!("no tool call: {reply}\n{entries:#?}"));
    assert_eq!(called["finish_reason"], "tool_calls", "{called}");
    let call = &called["tool_calls"][0];
    assert_eq!(call["name"], "read_file", "{call}");
    let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(arguments["path"].is_string(), "{call}");
    // The kernel ran it (the file is not there: an error is a result too)
    // and handed the result back under the server's call id ...
    let result = entries
        .iter()
        .find(|e| e["type"] == "tool_result")
        .unwrap_or_else(|| panic!("{entries:#?}"));
    assert_eq!(result["call_id"], call["id"], "{result}");
    assert_eq!(result["tool"], "read_file");
    // ... in the next request, which the server's template accepted and
    // answered.
    let position = |id: &Value| entries.iter().position(|e| &e["id"] == id).unwrap();
    let after = &entries[position(&result["id"])..];
    let request = after
        .iter()
        .find(|e| e["type"] == "request")
        .unwrap_or_else(|| panic!("{entries:#?}"));
    assert!(
        request["messages"]
            .as_array()
            .unwrap()
            .contains(&result["id"]),
        "{request}"
    );
    let next = &after[after.iter().position(|e| e == request).unwrap() + 1];
    assert_eq!(next["type"], "response", "{next}");
}
