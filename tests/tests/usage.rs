//! Cost over time: usage kept per UTC day, model and role in the real
//! store, read back by `hivekernel usage --by model|day|role [--since]`
//! and `GetUsageReport`, across a restart; bad input refused.

#![allow(clippy::unwrap_used)]

use hivekernel_kernel::Kernel;
use hivekernel_proto::v1 as pb;
use hivekernel_tests::binary::Binary;
use hivekernel_tests::llm_server::{LlmServer, Scripted};
use hivekernel_tests::served::Served;
use hivekernel_tests::{start, test_settings};

/// The row of `report` whose `key` field is `value`.
fn row<'a>(report: &'a serde_json::Value, key: &str, value: &str) -> &'a serde_json::Value {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row[key] == value)
        .unwrap_or_else(|| panic!("no {key} {value} in {report:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_is_summed_by_model_day_and_role_and_survives_a_restart() {
    let bin = match hivekernel_tests::build_hivekernel() {
        Ok(bin) => bin,
        Err((bin, why)) => panic!("cannot build {}: {why}", bin.display()),
    };
    // Each model answers with its own usage.
    let server = LlmServer::answering(|body| match body["model"].as_str() {
        Some("big-model") => Scripted::content_with_usage("long answer", 1000, 200),
        _ => Scripted::content_with_usage("short answer", 100, 10),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = serde_json::json!({
        "kernel": { "listen": "127.0.0.1:0" },
        "llm": { "provider": "openai", "base_url": server.base_url(),
                 "api_key_env": "HIVEKERNEL_TEST_NO_KEY", "max_retries": 0,
                 "prices": { "big-model": { "input_per_million": 10.0, "output_per_million": 30.0 } } },
        "agents": [
            { "name": "writer", "role": "daemon", "runtime": "tool_agent", "model": "small-model",
              "system_prompt": "You write." },
            { "name": "boss", "role": "lead", "runtime": "tool_agent", "model": "big-model",
              "system_prompt": "You lead." }
        ]
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let mut kernel = Binary::start(&bin, dir.path());
    for (agent, task) in [("writer", "one"), ("writer", "two"), ("boss", "three")] {
        kernel.cli(&["exec", agent, task]);
    }

    let by_model = kernel.json(&["usage", "--by", "model", "--json"]);
    let small = row(&by_model, "model", "small-model");
    assert_eq!(small["usage"]["calls"], 2, "{by_model:#}");
    assert_eq!(small["usage"]["prompt_tokens"], 200);
    assert_eq!(small["usage"]["completion_tokens"], 20);
    let big = row(&by_model, "model", "big-model");
    assert_eq!(big["usage"]["calls"], 1);
    assert_eq!(big["usage"]["prompt_tokens"], 1000);
    // 1000 * $10/M + 200 * $30/M = $0.016.
    let cost = big["usage"]["cost_usd"].as_f64().unwrap();
    assert!((cost - 0.016).abs() < 1e-9, "{big:#}");
    assert_eq!(by_model["total"]["calls"], 3);
    assert_eq!(by_model["total"]["prompt_tokens"], 1200);

    let by_role = kernel.json(&["usage", "--by", "role", "--json"]);
    assert_eq!(row(&by_role, "role", "daemon")["usage"]["calls"], 2);
    assert_eq!(row(&by_role, "role", "lead")["usage"]["calls"], 1);

    let today = hivekernel_kernel::store::usage::utc_day(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64,
    );
    let by_day = kernel.json(&["usage", "--by", "day", "--since", "7d", "--json"]);
    assert_eq!(by_day["rows"].as_array().unwrap().len(), 1, "{by_day:#}");
    assert_eq!(row(&by_day, "day", &today)["usage"]["calls"], 3);
    // A day to come: nothing yet.
    let future = kernel.json(&["usage", "--by", "day", "--since", "2999-01-01", "--json"]);
    assert_eq!(future["rows"], serde_json::json!([]));
    assert_eq!(future["total"]["calls"], 0);

    // The table a person reads.
    let table = kernel.cli(&["usage", "--by", "model"]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("MODEL") && lines[0].contains("COST"),
        "{table}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("big-model") && l.contains("$0.0160")),
        "{table}"
    );
    assert!(lines.last().unwrap().starts_with("TOTAL"), "{table}");

    // Bad input: named, and nothing asked of the kernel.
    let bad = kernel
        .command(&["usage", "--by", "day", "--since", "yesterday"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains("--since") && stderr.contains("7d"),
        "{stderr}"
    );
    let bad = kernel
        .command(&["usage", "--by", "agent"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("model"),
        "the choices are named"
    );

    // Kept in the store: a restart reads the same.
    kernel.terminate();
    kernel = Binary::start(&bin, dir.path());
    let again = kernel.json(&["usage", "--by", "model", "--json"]);
    assert_eq!(again["total"], by_model["total"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_usage_report_refuses_bad_arguments_and_a_kernel_without_a_store() {
    let kernel: Kernel = start(Kernel::builder(test_settings())).await;
    let served = Served::start(&kernel).await;
    let ask = |by: &str, since: &str| pb::UsageReportRequest {
        by: by.into(),
        since_day: since.into(),
    };
    let mut admin = served.admin();
    let err = admin.get_usage_report(ask("agent", "")).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("model, day or role"), "{err:?}");
    let err = admin
        .get_usage_report(ask("day", "26/11/2026"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("YYYY-MM-DD"), "{err:?}");
    // In memory, nothing is kept over time.
    let err = admin.get_usage_report(ask("model", "")).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    kernel.shutdown().await;
}

/// `--model` sends every logical name as one served model: the server sees
/// only it, a price set for the logical names' usual ids no longer applies,
/// an agent that names no model gets `llm.default_model`, and the start
/// log and `config check` say what is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_served_model_for_every_name_costs_only_what_it_is_priced() {
    let bin = match hivekernel_tests::build_hivekernel() {
        Ok(bin) => bin,
        Err((bin, why)) => panic!("cannot build {}: {why}", bin.display()),
    };
    let server =
        LlmServer::answering(|_| Scripted::content_with_usage("an answer", 1000, 100)).await;
    let sent = || -> Vec<String> {
        let requests = server.requests();
        requests
            .iter()
            .map(|body| body["model"].as_str().unwrap_or("<none>").to_owned())
            .collect()
    };
    let dir = tempfile::tempdir().unwrap();
    let config = serde_json::json!({
        "kernel": { "listen": "127.0.0.1:0" },
        "llm": { "provider": "openai", "base_url": server.base_url(),
                 "api_key_env": "HIVEKERNEL_TEST_NO_KEY", "max_retries": 0,
                 "models": { "big": "gpt-4o" },
                 "default_model": "big",
                 "prices": { "gpt-4o": { "input_per_million": 10.0, "output_per_million": 30.0 } } },
        "agents": [
            { "name": "named", "role": "daemon", "runtime": "tool_agent", "model": "big",
              "system_prompt": "You answer." },
            { "name": "unnamed", "role": "daemon", "runtime": "tool_agent",
              "system_prompt": "You answer." }
        ]
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let config_path = dir.path().join("config.json");
    let check = std::process::Command::new(&bin)
        .args(["config", "check"])
        .arg(&config_path)
        .args(["--model", "local-tiny"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{listed}");
    assert!(
        listed.contains("models (every one sent as local-tiny)"),
        "{listed}"
    );
    assert!(listed.contains("unnamed  big (the default)"), "{listed}");

    // As configured first: the default model, priced by its id.
    let mut kernel = Binary::start(&bin, dir.path());
    kernel.cli(&["exec", "unnamed", "one"]);
    assert_eq!(sent(), ["gpt-4o"]);
    let report = kernel.json(&["usage", "--by", "model", "--json"]);
    // 1000 * $10/M + 100 * $30/M = $0.013.
    let cost = row(&report, "model", "big")["usage"]["cost_usd"]
        .as_f64()
        .unwrap();
    assert!((cost - 0.013).abs() < 1e-9, "{report:#}");
    kernel.terminate();

    // Every name sent as one local model: no price for it, so no cost.
    let kernel = Binary::start_with(&bin, dir.path(), &["--model", "local-tiny"]);
    kernel.cli(&["exec", "named", "two"]);
    kernel.cli(&["exec", "unnamed", "three"]);
    assert_eq!(sent(), ["gpt-4o", "local-tiny", "local-tiny"]);
    let report = kernel.json(&["usage", "--by", "model", "--json"]);
    let big = row(&report, "model", "big");
    assert_eq!(big["usage"]["calls"], 3, "{report:#}");
    assert_eq!(big["usage"]["prompt_tokens"], 3000);
    let cost = big["usage"]["cost_usd"].as_f64().unwrap();
    assert!(
        (cost - 0.013).abs() < 1e-9,
        "only the first call cost: {report:#}"
    );
    let log = kernel.log();
    assert!(
        log.lines().any(|l| l.contains("agent started")
            && l.contains("unnamed")
            && l.contains("served=local-tiny")),
        "{log}"
    );
}
