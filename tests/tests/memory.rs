//! Agent memory end to end: a durable in-process kernel on a real SQLite
//! file; ranking, namespaces, hostile queries and limits through the kernel
//! API, the tools as a real process, and a `tool_agent` that remembers
//! through the loopback model server.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use hivekernel_agents::tool_agent::AgentSettings;
use hivekernel_agents::tools::ToolSettings;
use hivekernel_agents::{ErrorKind, MemoryHit, NewMemory, Pid, Role, SpawnRequest, TaskSpec};
use hivekernel_kernel::config::KernelSettings;
use hivekernel_kernel::{Caller, Kernel, MemorySettings};
use hivekernel_tests::durable::{Durable, call_tool};
use hivekernel_tests::llm_server::{LlmServer, Scripted};
use hivekernel_tests::{agent_registry, open_store, spawn_probe, test_settings};
use serde_json::{Value, json};

fn note(text: &str) -> NewMemory {
    NewMemory {
        text: text.into(),
        ..NewMemory::default()
    }
}

async fn remember(kernel: &Kernel, pid: Pid, entry: NewMemory) -> u64 {
    kernel
        .memory()
        .store(Caller::Process(pid), entry)
        .await
        .unwrap()
        .id
}

async fn recall(kernel: &Kernel, pid: Pid, query: &str) -> Vec<MemoryHit> {
    kernel
        .memory()
        .recall(Caller::Process(pid), query, None)
        .await
        .unwrap_or_else(|err| panic!("recall {query:?}: {err}"))
}

fn texts(hits: &[MemoryHit]) -> Vec<&str> {
    hits.iter().map(|h| h.entry.text.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recall_ranks_by_relevance_within_the_callers_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let hive = Durable::start(dir.path(), test_settings()).await;
    let kernel = &hive.kernel;
    let me = spawn_probe(kernel, Pid::KERNEL, "me", Role::Agent).await;
    let other = spawn_probe(kernel, Pid::KERNEL, "other", Role::Agent).await;

    remember(kernel, me, note("The deploy is at 5pm.")).await;
    remember(
        kernel,
        me,
        note("Deploying on Friday went badly; deploy on Mondays."),
    )
    .await;
    remember(
        kernel,
        me,
        note("Apricot jam recipe: apricots, sugar, lemon."),
    )
    .await;
    let tagged = NewMemory {
        text: "Ask the operator first.".into(),
        key: None,
        tags: vec!["friday".into(), "process".into()],
    };
    remember(kernel, me, tagged).await;
    remember(kernel, other, note("deploy secrets of another agent")).await;

    let hits = recall(kernel, me, "deploy friday").await;
    let found = texts(&hits);
    assert_eq!(found.len(), 3, "{found:?}");
    let rank = |text: &str| found.iter().position(|t| *t == text).unwrap();
    assert!(
        rank("Deploying on Friday went badly; deploy on Mondays.") < rank("The deploy is at 5pm."),
        "both words (stemmed) before one: {found:?}"
    );
    assert!(
        hits.windows(2).all(|w| w[0].score >= w[1].score),
        "{hits:?}"
    );
    assert!(hits.iter().all(|h| h.score > 0.0));
    let by_tag = recall(kernel, me, "process").await;
    assert_eq!(
        texts(&by_tag),
        ["Ask the operator first."],
        "tags are searched"
    );
    assert_eq!(by_tag[0].entry.tags, ["friday", "process"]);
    assert_eq!(
        texts(&recall(kernel, me, "APRICOT").await).len(),
        1,
        "case folds"
    );
    assert!(
        recall(kernel, me, "secrets").await.is_empty(),
        "not my namespace"
    );
    assert_eq!(
        texts(&recall(kernel, other, "deploy").await),
        ["deploy secrets of another agent"]
    );

    // The limit caps the answer; no words lists the newest first.
    let one = kernel
        .memory()
        .recall(Caller::Process(me), "deploy", Some(1))
        .await
        .unwrap();
    assert_eq!(one.len(), 1);
    let newest = recall(kernel, me, "").await;
    assert_eq!(newest[0].entry.text, "Ask the operator first.");
    assert_eq!(newest.len(), 4);
    assert!(newest.iter().all(|h| h.score == 0.0));
    let err = kernel
        .memory()
        .recall(Caller::Process(me), "x", Some(0))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_queries_are_words_never_fts_syntax() {
    let dir = tempfile::tempdir().unwrap();
    let hive = Durable::start(dir.path(), test_settings()).await;
    let kernel = &hive.kernel;
    let me = spawn_probe(kernel, Pid::KERNEL, "me", Role::Agent).await;
    remember(
        kernel,
        me,
        note("near the river, a quoted \"word\" and stars * here"),
    )
    .await;
    remember(kernel, me, note("unrelated entry")).await;

    let hostile = [
        "\"",
        "\"unterminated",
        "*",
        "river*",
        "NEAR(river word)",
        "NEAR",
        "-river",
        "river -word",
        "(river",
        "river)",
        "river OR",
        "AND",
        "NOT river",
        "text:river",
        "{text tags}: river",
        "^river",
        "\0",
        "river\0word",
        "",
        "   ",
        "'; DROP TABLE memory; --",
        "🦀 river",
    ];
    for query in hostile {
        let hits = kernel
            .memory()
            .recall(Caller::Process(me), query, None)
            .await
            .unwrap_or_else(|err| panic!("{query:?}: {err}"));
        let has_words = query.chars().any(char::is_alphanumeric);
        if query.to_lowercase().contains("river") {
            assert_eq!(
                hits[0].entry.text, "near the river, a quoted \"word\" and stars * here",
                "{query:?}"
            );
        } else if !has_words {
            assert_eq!(hits.len(), 2, "no words lists the newest: {query:?}");
        }
    }
    // The table is still there.
    assert_eq!(recall(kernel, me, "unrelated").await.len(), 1);

    let big = "word ".repeat(10_000);
    let hits = kernel
        .memory()
        .recall(Caller::Process(me), &big, None)
        .await
        .unwrap();
    assert_eq!(hits.len(), 1);
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_agent_limit_refuses_and_keys_replace_entries() {
    let dir = tempfile::tempdir().unwrap();
    let settings = KernelSettings {
        memory: MemorySettings {
            max_entry_bytes: 64,
            max_bytes_per_agent: 100,
            max_results: 3,
        },
        ..test_settings()
    };
    let hive = Durable::start(dir.path(), settings).await;
    let kernel = &hive.kernel;
    let me = spawn_probe(kernel, Pid::KERNEL, "me", Role::Agent).await;
    let other = spawn_probe(kernel, Pid::KERNEL, "other", Role::Agent).await;

    let err = kernel
        .memory()
        .store(Caller::Process(me), note(&"x".repeat(65)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted);
    assert!(
        err.to_string()
            .contains("kernel.memory.max_entry_bytes (64 bytes)"),
        "{err}"
    );
    let keyed = |text: &str| NewMemory {
        text: text.into(),
        key: Some("plan".into()),
        tags: Vec::new(),
    };
    let first = remember(kernel, me, keyed(&format!("alpha {}", "a".repeat(50)))).await;
    remember(kernel, me, note(&format!("beta {}", "b".repeat(35)))).await;
    let err = kernel
        .memory()
        .store(Caller::Process(me), note("gamma is one too many"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted);
    assert!(
        err.to_string()
            .contains("kernel.memory.max_bytes_per_agent (100 bytes)"),
        "{err}"
    );
    assert!(
        recall(kernel, me, "gamma").await.is_empty(),
        "nothing stored"
    );
    // The limit is per agent.
    remember(kernel, other, note("gamma is fine here")).await;

    // Storing the key again replaces the entry and counts only the new text.
    let again = remember(kernel, me, keyed("delta, shorter")).await;
    assert_eq!(again, first, "same key, same entry");
    assert!(recall(kernel, me, "alpha").await.is_empty());
    let hits = recall(kernel, me, "delta").await;
    assert_eq!(hits[0].entry.key.as_deref(), Some("plan"));
    remember(kernel, me, note("gamma fits now")).await;

    // Recall never answers more than max_results.
    for i in 0..3 {
        remember(kernel, other, note(&format!("gamma {i}"))).await;
    }
    let hits = kernel
        .memory()
        .recall(Caller::Process(other), "gamma", Some(50))
        .await
        .unwrap();
    assert_eq!(hits.len(), 3);

    for (entry, needle) in [
        (note(" "), "must not be empty"),
        (note("a\0b"), "NUL"),
        (
            NewMemory {
                tags: vec!["two words".into()],
                ..note("x")
            },
            "memory tag",
        ),
    ] {
        let err = kernel
            .memory()
            .store(Caller::Process(me), entry)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(err.to_string().contains(needle), "{err}");
    }
    kernel.shutdown().await;
}

#[tokio::test]
async fn a_kernel_without_a_store_refuses_memory_clearly() {
    let (kernel, _) = hivekernel_tests::kernel().await;
    let err = kernel
        .memory()
        .store(Caller::Admin, note("x"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::FailedPrecondition);
    assert!(err.to_string().contains("no store"), "{err}");
    let err = kernel
        .memory()
        .recall(Caller::Admin, "x", None)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::FailedPrecondition);
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tools_store_and_recall_as_the_calling_process() {
    let dir = tempfile::tempdir().unwrap();
    let hive = Durable::start(dir.path(), test_settings()).await;
    let me = hive.captured(Pid::KERNEL, "me", Role::Agent).await;
    let other = hive.captured(Pid::KERNEL, "other", Role::Agent).await;

    let out = call_tool(
        &me,
        "memory_store",
        json!({"text": "The staging database lives on db-2.", "key": "staging", "tags": ["infra"]}),
    )
    .await
    .unwrap();
    assert!(out.starts_with("remembered as entry "), "{out}");
    let hits: Value = serde_json::from_str(
        &call_tool(&me, "memory_recall", json!({"query": "where is staging?"}))
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(hits[0]["text"], "The staging database lives on db-2.");
    assert_eq!(hits[0]["key"], "staging");
    assert_eq!(hits[0]["tags"], json!(["infra"]));
    assert!(hits[0]["score"].as_f64().unwrap() > 0.0);
    let theirs = call_tool(&other, "memory_recall", json!({"query": "staging"}))
        .await
        .unwrap();
    assert_eq!(theirs, "[]");
    let hostile = call_tool(&me, "memory_recall", json!({"query": "NEAR(\"staging\" *"}))
        .await
        .unwrap();
    assert!(hostile.contains("db-2"), "{hostile}");

    for (tool, args, needle) in [
        ("memory_store", json!({}), "missing field `text`"),
        (
            "memory_store",
            json!({"text": "x", "tags": "infra"}),
            "`tags`",
        ),
        ("memory_recall", json!({"limit": 0}), "field `limit`"),
        ("memory_recall", json!({"query": 5}), "`query`"),
    ] {
        let err = call_tool(&me, tool, args.clone()).await.unwrap_err();
        assert!(
            err.0.starts_with(&format!("invalid arguments for {tool}")) && err.0.contains(needle),
            "{tool} {args}: {err}"
        );
    }
    hive.kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_is_forgotten_by_key_in_the_callers_namespace_only() {
    let dir = tempfile::tempdir().unwrap();
    let hive = Durable::start(dir.path(), test_settings()).await;
    let me = hive.captured(Pid::KERNEL, "me", Role::Agent).await;
    let other = hive.captured(Pid::KERNEL, "other", Role::Agent).await;
    let keyed = |text: &str| json!({"text": text, "key": "staging"});
    call_tool(&me, "memory_store", keyed("Staging is db-2."))
        .await
        .unwrap();
    call_tool(&me, "memory_store", json!({"text": "Lunch is at noon."}))
        .await
        .unwrap();
    call_tool(&other, "memory_store", keyed("Their staging is db-9."))
        .await
        .unwrap();

    let out = call_tool(&me, "memory_forget", json!({"key": "staging"}))
        .await
        .unwrap();
    assert_eq!(out, r#"forgot the entry with key "staging""#);
    assert_eq!(
        texts(&recall(&hive.kernel, me.pid, "").await),
        ["Lunch is at noon."]
    );
    assert_eq!(
        texts(&recall(&hive.kernel, other.pid, "staging").await),
        ["Their staging is db-9."],
        "another process's entry under the same key is untouched"
    );

    let again = call_tool(&me, "memory_forget", json!({"key": "staging"}))
        .await
        .unwrap_err();
    assert!(
        again.0.contains(r#"no memory entry with key "staging""#),
        "{again}"
    );
    let err = hive
        .kernel
        .memory()
        .forget(Caller::Process(me.pid), "staging")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    for bad_key in ["".to_owned(), "k".repeat(129), "a\u{7}b".to_owned()] {
        let err = hive
            .kernel
            .memory()
            .forget(Caller::Process(me.pid), &bad_key)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{bad_key:?}: {err}");
    }
    let bad = call_tool(&me, "memory_forget", json!({}))
        .await
        .unwrap_err();
    assert!(bad.0.contains("missing field `key`"), "{bad}");
    hive.kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_of_a_reaped_process_is_deleted_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let hive = Durable::start(dir.path(), test_settings()).await;
    let lead = hive.captured(Pid::KERNEL, "lead", Role::Lead).await;
    let worker = hive.captured(lead.pid, "worker", Role::Worker).await;
    remember(&hive.kernel, worker.pid, note("Scratch notes of a worker.")).await;
    hive.kernel
        .memory()
        .store(Caller::Admin, note("The admin's own note."))
        .await
        .unwrap();
    // The lead stays a zombie for PID 1 to collect; the worker is reaped at once.
    hive.kernel
        .kill(Caller::Admin, lead.pid, "done")
        .await
        .unwrap();
    hive.kernel.shutdown().await;

    let db = rusqlite::Connection::open(dir.path().join("hivekernel.db")).unwrap();
    let rows = |pid: Pid| -> i64 {
        db.query_row(
            "SELECT count(*) FROM memory WHERE pid = ?1",
            [pid.0 as i64],
            |r| r.get(0),
        )
        .unwrap()
    };
    assert_eq!(rows(worker.pid), 0, "nobody could recall it any more");
    assert_eq!(rows(Pid::KERNEL), 1);
    let indexed: i64 = db
        .query_row(
            "SELECT count(*) FROM memory_fts WHERE memory_fts MATCH 'scratch'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(indexed, 0, "the full-text index follows");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_agent_remembers_and_stores_an_artifact_through_the_model_loop() {
    let dir = tempfile::tempdir().unwrap();
    let server = LlmServer::start(vec![
        Scripted::tool_calls(&[
            (
                "c1",
                "memory_store",
                r#"{"text": "The user prefers short answers.", "tags": ["preference"]}"#,
            ),
            (
                "c2",
                "store_artifact",
                r#"{"name": "summary.md", "content": "short answers", "visibility": "global"}"#,
            ),
        ]),
        Scripted::tool_calls(&[("c3", "memory_recall", r#"{"query": "answers"}"#)]),
        Scripted::content("noted"),
    ])
    .await;
    let provider = server.provider();
    let (registry, _) = agent_registry(AgentSettings::default(), &ToolSettings::default());
    let (store, recovered) = open_store(dir.path()).await;
    let kernel = hivekernel_tests::start(
        Kernel::builder(test_settings())
            .runtimes(registry)
            .llm(Arc::new(provider))
            .store(store, recovered.clone()),
    )
    .await;
    let mut request = SpawnRequest::new(Pid::KERNEL, "scribe");
    request.runtime = Some("tool_agent".into());
    request.model = "test-model".into();
    request.tools = ["memory_store", "memory_recall", "store_artifact"]
        .map(str::to_owned)
        .to_vec();
    let scribe = kernel.spawn(Caller::Admin, request).await.unwrap();
    let (_, reply) = kernel
        .execute_task(
            Caller::Admin,
            TaskSpec::new(scribe, "remember my preference"),
        )
        .await
        .unwrap();
    assert_eq!(reply.unwrap(), "noted");

    let hits = recall(&kernel, scribe, "prefers").await;
    assert_eq!(texts(&hits), ["The user prefers short answers."]);
    let listed = kernel
        .artifacts()
        .list(Caller::Admin, Some(scribe), None)
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "summary.md");
    // The recall's answer went back to the model as the tool result.
    let requests = server.requests();
    let last = requests.last().unwrap().to_string();
    assert!(last.contains("The user prefers short answers."), "{last}");
    kernel.shutdown().await;
}
