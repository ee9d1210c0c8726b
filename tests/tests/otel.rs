//! OpenTelemetry traces received by an OTLP receiver on loopback (the
//! protocol's own messages over HTTP/protobuf and over gRPC): one
//! orchestrate is one trace of GenAI-named spans under the caller's
//! `traceparent`; contents only when asked for; the real binary turned on
//! by the standard variables flushes what it queued when it stops.

#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use hivekernel_agents::tool_agent::AgentSettings;
use hivekernel_agents::tools::ToolSettings;
use hivekernel_agents::{Pid, Role, SpawnRequest};
use hivekernel_kernel::config::{KernelSettings, OtelProtocol, OtelSettings};
use hivekernel_kernel::otel::Traces;
use hivekernel_kernel::{Caller, Kernel};
use hivekernel_proto::v1 as pb;
use hivekernel_tests::binary::Binary;
use hivekernel_tests::llm_server::{LlmServer, Scripted, scripted_answer};
use hivekernel_tests::otlp::{OtlpReceiver, ReceivedSpan};
use hivekernel_tests::served::Served;
use hivekernel_tests::{agent_registry, open_store, start, test_settings};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
const SERVER: i32 = 2;
const CLIENT: i32 = 3;
const STATUS_ERROR: i32 = 2;

/// A kernel running `tool_agent`s against `server`, exporting to `otel`.
async fn traced_kernel(
    server: &LlmServer,
    otel: OtelSettings,
    dir: &std::path::Path,
) -> (Kernel, Served) {
    let settings = KernelSettings {
        workspace: Some(dir.join("work")),
        default_runtime: "tool_agent".into(),
        otel: Some(otel.clone()),
        ..test_settings()
    };
    let mut tools = ToolSettings::default();
    tools.orchestrate.worker_prompt = Arc::from("WORKER PROMPT: do the one subtask.");
    let (registry, _) = agent_registry(AgentSettings::default(), &tools);
    let (store, recovered) = open_store(dir).await;
    let traces = Arc::new(Traces::start(&otel).unwrap());
    let kernel = start(
        Kernel::builder(settings)
            .runtimes(registry)
            .llm(Arc::new(server.provider()))
            .store(store, recovered)
            .traces(traces),
    )
    .await;
    let served = Served::start(&kernel).await;
    (kernel, served)
}

async fn spawn_agent(kernel: &Kernel, name: &str, tools: &[&str]) -> Pid {
    let mut request = SpawnRequest::new(Pid::KERNEL, name);
    request.role = Role::Daemon;
    request.runtime = Some("tool_agent".into());
    request.model = "test-model".into();
    request.tools = tools.iter().map(|t| (*t).to_owned()).collect();
    kernel.spawn(Caller::Admin, request).await.unwrap()
}

fn children<'a>(spans: &'a [ReceivedSpan], parent: &ReceivedSpan) -> Vec<&'a ReceivedSpan> {
    spans
        .iter()
        .filter(|s| s.parent_span_id == parent.span_id)
        .collect()
}

fn named<'a, S: std::borrow::Borrow<ReceivedSpan>>(
    spans: &'a [S],
    prefix: &str,
) -> Vec<&'a ReceivedSpan> {
    spans
        .iter()
        .map(|s| s.borrow())
        .filter(|s| s.name.starts_with(prefix))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_orchestrate_is_one_trace_of_genai_spans_under_the_callers_traceparent() {
    let receiver = OtlpReceiver::http().await;
    let server = LlmServer::answering(scripted_answer).await;
    let dir = tempfile::tempdir().unwrap();
    let otel = OtelSettings {
        endpoint: Some(receiver.endpoint()),
        protocol: OtelProtocol::HttpProtobuf,
        capture_content: false,
    };
    let (kernel, served) = traced_kernel(&server, otel, dir.path()).await;
    let lead = spawn_agent(&kernel, "lead", &["orchestrate"]).await;

    let mut call = tonic::Request::new(pb::ExecuteTaskRequest {
        pid: lead.0,
        description: "- one\n- two\n- three\n".into(),
        ..Default::default()
    });
    call.metadata_mut().insert(
        "traceparent",
        format!("00-{TRACE}-{CALLER_SPAN}-01").parse().unwrap(),
    );
    let reply = served
        .admin()
        .execute_task(call)
        .await
        .unwrap()
        .into_inner();
    assert!(reply.success, "{reply:?}");
    assert_eq!(reply.trace_id, TRACE);
    let model_calls = server.request_count();
    // A clean stop sends what is still queued.
    kernel.shutdown().await;

    let all = receiver.spans();
    let spans: Vec<ReceivedSpan> = all
        .iter()
        .filter(|s| s.trace_id == TRACE)
        .cloned()
        .collect();
    assert!(
        spans.iter().all(|s| s.service == "hivekernel"),
        "{spans:#?}"
    );
    // The call is the root, hung under the caller's span.
    let roots: Vec<_> = spans
        .iter()
        .filter(|s| s.parent_span_id == CALLER_SPAN)
        .collect();
    assert_eq!(roots.len(), 1, "{spans:#?}");
    let root = roots[0];
    assert_eq!(root.name, "hivekernel.v1.Kernel/ExecuteTask");
    assert_eq!(root.kind, SERVER);
    assert_eq!(root.str("rpc.system"), Some("grpc"));
    assert_eq!(root.str("rpc.method"), Some("ExecuteTask"));
    // Every other span hangs from a span of the same trace: one tree.
    let ids: HashSet<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    assert_eq!(ids.len(), spans.len(), "span ids are unique");
    for span in &spans {
        assert!(
            span.parent_span_id == CALLER_SPAN || ids.contains(span.parent_span_id.as_str()),
            "{} hangs from nothing exported: {span:#?}",
            span.name
        );
    }

    // The lead's turn.
    let invoked = children(&spans, root);
    assert_eq!(invoked.len(), 1, "{invoked:#?}");
    let turn = invoked[0];
    assert_eq!(turn.name, "invoke_agent lead");
    assert_eq!(turn.str("gen_ai.operation.name"), Some("invoke_agent"));
    assert_eq!(turn.str("gen_ai.agent.name"), Some("lead"));
    assert_eq!(
        turn.str("gen_ai.agent.id"),
        Some(lead.0.to_string().as_str())
    );
    assert_ne!(turn.status, STATUS_ERROR);

    // Under it: its model calls, the orchestrate tool call, three spawns
    // and three workers' turns.
    let under = children(&spans, turn);
    let workers: Vec<_> = named(&under, "invoke_agent ")
        .into_iter()
        .filter(|s| s.name != "invoke_agent lead")
        .collect();
    // The notices of its workers' exits the lead then handles, in its trace.
    let notices: Vec<_> = under
        .iter()
        .filter(|s| s.name == "invoke_agent lead")
        .collect();
    assert_eq!(notices.len(), 3, "{under:#?}");
    assert!(
        notices
            .iter()
            .all(|s| s.str("hivekernel.item") == Some("message")),
        "{notices:#?}"
    );
    let spawns = named(&under, "create_agent ");
    assert_eq!(workers.len(), 3, "{under:#?}");
    assert_eq!(spawns.len(), 3, "{under:#?}");
    let spawned: HashSet<&str> = spawns
        .iter()
        .map(|s| s.str("gen_ai.agent.id").unwrap())
        .collect();
    for worker in &workers {
        assert_eq!(worker.str("gen_ai.operation.name"), Some("invoke_agent"));
        assert!(
            spawned.contains(worker.str("gen_ai.agent.id").unwrap()),
            "each worker's turn follows its spawn: {worker:#?}"
        );
        let chats = children(&spans, worker);
        assert_eq!(
            chats.len(),
            1,
            "a worker answers in one model call: {chats:#?}"
        );
        assert_eq!(chats[0].name, "chat test-model");
    }
    let tools = named(&under, "execute_tool ");
    assert_eq!(tools.len(), 1, "{under:#?}");
    assert_eq!(tools[0].name, "execute_tool orchestrate");
    assert_eq!(tools[0].str("gen_ai.tool.name"), Some("orchestrate"));
    assert!(
        tools[0]
            .str("gen_ai.tool.call.id")
            .is_some_and(|id| !id.is_empty())
    );
    assert!(tools[0].start_unix_nano < tools[0].end_unix_nano);

    // Every model call is a `chat` span with its usage, as the server
    // answered it; one span per request the server saw.
    let chats = named(&spans, "chat ");
    assert_eq!(chats.len(), model_calls, "{chats:#?}");
    let requests = server.requests();
    let mut prompt_total = 0;
    for chat in &chats {
        assert_eq!(chat.kind, CLIENT);
        assert_eq!(chat.str("gen_ai.operation.name"), Some("chat"));
        assert_eq!(chat.str("gen_ai.request.model"), Some("test-model"));
        assert_eq!(chat.str("gen_ai.provider.name"), Some("openai"));
        assert!(
            chat.attributes
                .contains_key("gen_ai.response.finish_reasons")
        );
        prompt_total += chat.int("gen_ai.usage.input_tokens").unwrap();
        assert!(chat.int("gen_ai.usage.output_tokens").unwrap() > 0);
        // Off by default: no contents.
        assert!(!chat.attributes.contains_key("gen_ai.input.messages"));
        assert!(!chat.attributes.contains_key("gen_ai.output.messages"));
    }
    let expected: i64 = requests
        .iter()
        .map(|body| match scripted_answer(body) {
            Scripted::Json(answer) => answer["usage"]["prompt_tokens"].as_i64().unwrap(),
            other => panic!("{other:?}"),
        })
        .sum();
    assert_eq!(prompt_total, expected);
    // The lead's own model calls (it asks, plans, combines) hang from its turn.
    assert!(named(&under, "chat ").len() >= 2, "{under:#?}");
    assert!(receiver.requests() >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_grpc_contents_are_sent_only_when_asked_and_a_refused_call_is_an_error_span() {
    let receiver = OtlpReceiver::grpc().await;
    let server =
        LlmServer::answering(|_| Scripted::content_with_usage("the answer is 42", 77, 9)).await;
    let dir = tempfile::tempdir().unwrap();
    let otel = OtelSettings {
        endpoint: Some(receiver.endpoint()),
        protocol: OtelProtocol::Grpc,
        capture_content: true,
    };
    let (kernel, served) = traced_kernel(&server, otel, dir.path()).await;
    let solo = spawn_agent(&kernel, "solo", &[]).await;

    // No traceparent: the call starts a trace of its own, whose id it answers.
    let reply = served
        .admin()
        .execute_task(pb::ExecuteTaskRequest {
            pid: solo.0,
            description: "what is six times seven?".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(reply.success, "{reply:?}");
    // Refused: no such process.
    let refused = served
        .admin()
        .execute_task(pb::ExecuteTaskRequest {
            pid: 999_999,
            description: "anyone there?".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::NotFound);
    kernel.shutdown().await;

    let spans = receiver.spans();
    let by_trace: HashMap<&str, Vec<&ReceivedSpan>> =
        spans.iter().fold(HashMap::new(), |mut map, span| {
            map.entry(span.trace_id.as_str()).or_default().push(span);
            map
        });
    let answered = &by_trace[reply.trace_id.as_str()];
    let root = answered
        .iter()
        .find(|s| s.parent_span_id.is_empty())
        .expect("a root span");
    assert_eq!(root.name, "hivekernel.v1.Kernel/ExecuteTask");
    let chat = answered
        .iter()
        .find(|s| s.name == "chat test-model")
        .expect("a chat span");
    assert_eq!(chat.int("gen_ai.usage.input_tokens"), Some(77));
    assert_eq!(chat.int("gen_ai.usage.output_tokens"), Some(9));
    let input: serde_json::Value =
        serde_json::from_str(chat.str("gen_ai.input.messages").unwrap()).unwrap();
    let user = input
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "user")
        .expect("the task, as the user's message");
    assert!(
        user["parts"][0]["content"]
            .as_str()
            .unwrap()
            .contains("what is six times seven?"),
        "{input}"
    );
    let output: serde_json::Value =
        serde_json::from_str(chat.str("gen_ai.output.messages").unwrap()).unwrap();
    assert_eq!(output[0]["role"], "assistant");
    assert_eq!(output[0]["parts"][0]["content"], "the answer is 42");

    let failed: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "hivekernel.v1.Kernel/ExecuteTask" && s.status == STATUS_ERROR)
        .collect();
    assert_eq!(failed.len(), 1, "{spans:#?}");
    assert_eq!(failed[0].str("error.type"), Some("NotFound"));
    assert_ne!(failed[0].trace_id, reply.trace_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_exports_when_the_standard_variables_say_so_and_flushes_at_stop() {
    let bin = match hivekernel_tests::build_hivekernel() {
        Ok(bin) => bin,
        Err((bin, why)) => panic!("cannot build {}: {why}", bin.display()),
    };
    let receiver = OtlpReceiver::http().await;
    let server = LlmServer::answering(|_| Scripted::content_with_usage("done", 1234, 56)).await;
    let dir = tempfile::tempdir().unwrap();
    let config = serde_json::json!({
        "kernel": { "listen": "127.0.0.1:0" },
        "llm": { "provider": "openai", "base_url": server.base_url(),
                 "api_key_env": "HIVEKERNEL_TEST_NO_KEY", "max_retries": 0 },
        "agents": [{
            "name": "writer", "role": "daemon", "runtime": "tool_agent", "model": "test-model",
            "system_prompt": "You write."
        }]
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();

    // A protocol it does not speak is refused before anything starts.
    let refused = std::process::Command::new(&bin)
        .arg("start")
        .arg(dir.path().join("config.json"))
        .arg("--data-dir")
        .arg(dir.path().join("refused"))
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint())
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("OTEL_EXPORTER_OTLP_PROTOCOL") && stderr.contains("http/json"),
        "{stderr}"
    );

    // The batch would wait five seconds; a stop must not lose it.
    let kernel = Binary::start_with_env(
        &bin,
        dir.path(),
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint().as_str()),
            ("OTEL_SERVICE_NAME", "swarm-a"),
        ],
    );
    assert!(
        kernel.log().contains("exporting traces over OTLP"),
        "{}",
        kernel.log()
    );
    let reply = kernel.json(&["exec", "writer", "write the summary", "--json"]);
    let trace = reply["trace_id"].as_str().unwrap().to_owned();
    let pid = kernel.child.id();
    let stopped = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    let spans = receiver
        .wait_for(Duration::from_secs(20), |spans| {
            spans
                .iter()
                .any(|s| s.trace_id == trace && s.name.starts_with("chat "))
        })
        .await;
    let traced: Vec<_> = spans.iter().filter(|s| s.trace_id == trace).collect();
    let chat = traced
        .iter()
        .find(|s| s.name == "chat test-model")
        .unwrap_or_else(|| panic!("no chat span in {traced:#?}\n{}", kernel.log()));
    assert_eq!(chat.int("gen_ai.usage.input_tokens"), Some(1234));
    assert_eq!(chat.service, "swarm-a");
    assert!(traced.iter().any(|s| s.name == "invoke_agent writer"));
    assert!(
        traced
            .iter()
            .any(|s| s.name == "hivekernel.v1.Kernel/ExecuteTask")
    );
}
