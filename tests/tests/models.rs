//! What the model server serves, asked at start: the names the config
//! sends checked against its `/v1/models` list (a warning, or with
//! `llm.strict_models` a refusal), and the context window taken from the
//! server (llama.cpp's `/props`) over the config's. The real binary
//! against a loopback server that describes itself as llama.cpp does.

#![allow(clippy::unwrap_used)]

use hivekernel_tests::binary::Binary;
use hivekernel_tests::llm_server::{LlmServer, Scripted};
use serde_json::json;

fn config(server: &LlmServer, strict: bool) -> serde_json::Value {
    json!({
        "kernel": { "listen": "127.0.0.1:0" },
        "llm": { "provider": "openai", "base_url": server.base_url(),
                 "api_key_env": "HIVEKERNEL_TEST_NO_KEY", "max_retries": 0,
                 "models": { "small": "tiny-1", "big": "huge-9" },
                 "context_tokens": { "small": 128000 },
                 "max_completion_tokens": 512,
                 "strict_models": strict },
        "agents": [
            { "name": "writer", "role": "daemon", "runtime": "tool_agent", "model": "small",
              "system_prompt": "You write." }
        ]
    })
}

/// Whether the start log has a line taking a context window from the
/// server that says each of `parts`.
fn window_from_server(log: &str, parts: &[&str]) -> bool {
    log.lines().any(|line| {
        line.contains("context window from the server") && parts.iter().all(|p| line.contains(p))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_is_asked_what_it_serves_and_its_context_window_is_used() {
    let bin = match hivekernel_tests::build_hivekernel() {
        Ok(bin) => bin,
        Err((bin, why)) => panic!("cannot build {}: {why}", bin.display()),
    };
    let server = LlmServer::answering(|_| Scripted::content("an answer")).await;
    let dir = tempfile::tempdir().unwrap();
    let write = |strict| {
        std::fs::write(
            dir.path().join("config.json"),
            config(&server, strict).to_string(),
        )
        .unwrap()
    };

    // A server that lists no models: nothing is checked, the kernel starts.
    write(true);
    let kernel = Binary::start(&bin, dir.path());
    assert!(
        kernel.log().contains("the model server lists no models"),
        "{}",
        kernel.log()
    );
    drop(kernel);

    // llama.cpp: one model listed, its slot's context in /props.
    server.serve_page(
        "/v1/models",
        json!({ "object": "list", "data": [{ "id": "tiny-1", "object": "model" }] }),
    );
    server.serve_page(
        "/props",
        json!({ "default_generation_settings": { "n_ctx": 2048 }, "total_slots": 1 }),
    );
    write(false);
    let kernel = Binary::start(&bin, dir.path());
    let log = kernel.log();
    assert!(
        window_from_server(&log, &["model=small", "context_tokens=2048"]),
        "{log}"
    );
    // `big` is sent as a model the server does not list.
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains(r#"does not list "huge-9" (for big)"#)
            && l.contains("it lists: tiny-1")),
        "{log}"
    );
    assert!(
        kernel
            .cli(&["exec", "writer", "hello"])
            .contains("an answer")
    );
    drop(kernel);

    // strict_models: the same config is refused, naming the model.
    write(true);
    let out = std::process::Command::new(&bin)
        .arg("start")
        .arg(dir.path().join("config.json"))
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env_remove("HIVEKERNEL_LLM_BASE_URL")
        .env_remove("HIVEKERNEL_LLM_MODEL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("llm.strict_models")
            && stderr.contains("huge-9")
            && stderr.contains("start with --model NAME or set HIVEKERNEL_LLM_MODEL"),
        "{stderr}"
    );

    // Every name sent as the one listed model: nothing unknown, and the
    // window applies to every name.
    let kernel = Binary::start_with(&bin, dir.path(), &["--model", "tiny-1"]);
    let log = kernel.log();
    assert!(
        window_from_server(&log, &["model=big", "served=tiny-1"]),
        "{log}"
    );
    drop(kernel);
}

/// Ollama lists its models without windows; `/api/show` tells the
/// `num_ctx` a model's Modelfile sets, which is what it runs with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ollama_is_asked_the_context_it_runs_a_model_with() {
    let bin = match hivekernel_tests::build_hivekernel() {
        Ok(bin) => bin,
        Err((bin, why)) => panic!("cannot build {}: {why}", bin.display()),
    };
    let server = LlmServer::answering(|_| Scripted::content("an answer")).await;
    server.serve_page(
        "/v1/models",
        json!({ "object": "list", "data": [
            { "id": "tiny-1", "object": "model", "owned_by": "library" },
            { "id": "huge-9", "object": "model", "owned_by": "library" },
        ]}),
    );
    server.serve_page("/api/version", json!({ "version": "0.12.6" }));
    server.serve_page(
        "/api/show",
        json!({ "parameters": "num_ctx                        6144",
                "model_info": { "general.architecture": "qwen2", "qwen2.context_length": 32768 } }),
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        config(&server, true).to_string(),
    )
    .unwrap();

    let kernel = Binary::start(&bin, dir.path());

    let log = kernel.log();
    assert!(
        window_from_server(&log, &["model=small", "context_tokens=6144"]),
        "{log}"
    );
    drop(kernel);
}

/// `hivekernel llm check` against a server that lists its model, answers,
/// and either calls the required tool or (a template without tools)
/// answers in text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llm_check_says_what_works_and_fails_when_tools_are_dropped() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let bin = match hivekernel_tests::build_hivekernel() {
        Ok(bin) => bin,
        Err((bin, why)) => panic!("cannot build {}: {why}", bin.display()),
    };
    let tools_work = Arc::new(AtomicBool::new(true));
    let works = tools_work.clone();
    let server = LlmServer::answering(move |body| {
        let required = body["tool_choice"] == "required" && body["tools"].is_array();
        match required && works.load(Ordering::SeqCst) {
            true => Scripted::tool_calls(&[("call_1", "echo", r#"{"text":"ping"}"#)]),
            false => Scripted::content("I am ready."),
        }
    })
    .await;
    server.serve_page(
        "/v1/models",
        json!({ "data": [{ "id": "tiny-1" }, { "id": "other" }] }),
    );
    server.serve_page(
        "/props",
        json!({ "default_generation_settings": { "n_ctx": 4096 } }),
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, config(&server, false).to_string()).unwrap();
    let check = |args: &[&str]| {
        std::process::Command::new(&bin)
            .args(["llm", "check"])
            .arg(&path)
            .args(args)
            .env_remove("HIVEKERNEL_LLM_BASE_URL")
            .env_remove("HIVEKERNEL_LLM_MODEL")
            .output()
            .unwrap()
    };

    // Every name sent as the listed model: it answers and calls the tool.
    let out = check(&["--model", "tiny-1"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("models the server lists: tiny-1, other"),
        "{text}"
    );
    assert!(text.contains("tiny-1 (for small, big)"), "{text}");
    assert!(text.contains("answer  ok in"), "{text}");
    assert!(
        text.contains(r#"tools   ok: called echo({"text":"ping"})"#),
        "{text}"
    );
    // Two servers listed: /props is not asked, the window is not known.
    assert!(
        text.contains("listed  yes (the server does not say"),
        "{text}"
    );
    let requests = server.requests();
    let asked = requests.last().unwrap();
    assert_eq!(asked["tool_choice"], "required", "{asked:#}");
    assert_eq!(asked["model"], "tiny-1");

    // As configured: `huge-9` (for big) is not listed.
    let out = check(&["--json"]);
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], false, "{report:#}");
    let huge = report["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["served"] == "huge-9")
        .unwrap();
    assert_eq!(huge["listed"]["ok"], false, "{report:#}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("1 of 2 models"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A template that drops tools: the model answers in text.
    tools_work.store(false, Ordering::SeqCst);
    let out = check(&["--model", "tiny-1"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("tools   dropped or ignored: asked to call a tool"),
        "{text}"
    );

    // A llama.cpp server that says its template renders no tools: the
    // tools were dropped, and the check says so and how to start it.
    server.serve_page("/v1/models", json!({ "data": [{ "id": "tiny-1" }] }));
    server.serve_page(
        "/props",
        json!({ "default_generation_settings": { "n_ctx": 4096 },
                "chat_template_caps": { "supports_tools": false } }),
    );
    let out = check(&["--model", "tiny-1"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("tools   dropped: the server's chat template does not render tools")
            && text.contains("--jinja"),
        "{text}"
    );
}
