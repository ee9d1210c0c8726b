//! A model endpoint that answers without end or beyond reason, against a
//! real kernel whose `tool_agent` talks to a real chat-completions server
//! on loopback: an endless stream of tool-call arguments, an endless body
//! read whole, 5,000 tool calls in one answer, and an MCP server listing
//! megabytes of tools. Each call fails with an error naming the setting,
//! is not tried again, and the kernel answers the next call; the endless
//! answers are cut once past the limit, so the server gets only so many
//! bytes out before the client hangs up.

use std::sync::Arc;
use std::time::Duration;

use hivekernel_agents::llm::{Limits, OpenAiProvider, OpenAiSettings};
use hivekernel_agents::tool_agent::AgentSettings;
use hivekernel_agents::tools::ToolSettings;
use hivekernel_agents::{Pid, Role, SpawnRequest};
use hivekernel_kernel::events::EventKind;
use hivekernel_kernel::{Caller, Kernel};
use hivekernel_tests::llm_server::{LlmServer, Scripted, system_message};
use hivekernel_tests::mcp::{stdio, wait_for_state};
use hivekernel_tests::{agent_registry, granting_all, run_task, start, test_settings, wait_until};

/// What an endless answer may send before the safety cap stops it: far
/// above what the client reads under the limit plus what the sockets
/// between can hold, far below the cap.
const FLOOD_CAP: usize = 64 << 20;
const FLOODED_AT_MOST: usize = 16 << 20;

/// A provider talking to `server` with `limits`, streaming or not, that
/// would retry a transient failure three times.
fn provider(server: &LlmServer, stream: bool, limits: Limits) -> OpenAiProvider {
    OpenAiProvider::new(OpenAiSettings {
        base_url: server.base_url(),
        stream,
        request_timeout: Duration::from_secs(60),
        max_retries: 3,
        limits,
        ..OpenAiSettings::default()
    })
    .unwrap()
}

/// A kernel whose agents call `provider`, and one agent with `tools`.
async fn agent_for(provider: OpenAiProvider, tools: &[&str]) -> (Kernel, Pid) {
    let settings = hivekernel_kernel::config::KernelSettings {
        task_timeout_seconds: 120,
        ..test_settings()
    };
    let (registry, _) = agent_registry(AgentSettings::default(), &ToolSettings::default());
    let kernel = start(
        Kernel::builder(settings)
            .runtimes(registry)
            .llm(Arc::new(provider)),
    )
    .await;
    let agent = spawn_agent(&kernel, tools).await;
    (kernel, agent)
}

async fn spawn_agent(kernel: &Kernel, tools: &[&str]) -> Pid {
    let mut request = SpawnRequest::new(Pid::KERNEL, "agent");
    request.role = Role::Agent;
    request.model = "test-model".into();
    request.runtime = Some("tool_agent".into());
    request.tools = tools.iter().map(|t| (*t).to_owned()).collect();
    kernel.spawn(Caller::Admin, request).await.unwrap()
}

/// The `tool_call` events of `pid` so far.
fn tool_calls(kernel: &Kernel, pid: Pid) -> usize {
    kernel
        .subscribe(Some(0))
        .replay
        .iter()
        .filter(|e| e.pid == pid && matches!(e.kind, EventKind::ToolCall { .. }))
        .count()
}

/// Runs a task the flood answers: it fails naming `setting`, once, the
/// server is hung up on within [`FLOODED_AT_MOST`] bytes, and the next
/// task is answered.
async fn flood_is_cut(server: &LlmServer, kernel: &Kernel, agent: Pid, says: &str) {
    let error = run_task(kernel, agent, "read the file").await.unwrap_err();
    assert!(error.contains(says), "{error}");
    assert_eq!(server.request_count(), 1, "not tried again");
    wait_until("the client to hang up", Duration::from_secs(30), || async {
        server.hung_up() == 1
    })
    .await;
    let flooded = server.flooded();
    assert!(
        flooded < FLOODED_AT_MOST,
        "the server got {flooded} bytes out"
    );
    assert_eq!(tool_calls(kernel, agent), 0);
    let answer = run_task(kernel, agent, "are you there?").await.unwrap();
    assert_eq!(answer, "still here");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_stream_of_tool_call_arguments_is_cut_at_the_answer_limit() {
    let server = LlmServer::start(vec![
        Scripted::endless_arguments(FLOOD_CAP),
        Scripted::content("still here"),
    ])
    .await;
    let limits = Limits {
        answer_bytes: 64 << 10,
        ..Limits::default()
    };
    let (kernel, agent) = agent_for(provider(&server, true, limits), &["read_file"]).await;
    let says = "model call failed: the model's answer is over 65536 bytes (llm.max_answer_bytes)";
    flood_is_cut(&server, &kernel, agent, says).await;
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_body_read_whole_is_cut_at_the_answer_limit() {
    let server = LlmServer::start(vec![
        Scripted::endless_body(FLOOD_CAP),
        Scripted::content("still here"),
    ])
    .await;
    let limits = Limits {
        answer_bytes: 64 << 10,
        ..Limits::default()
    };
    let (kernel, agent) = agent_for(provider(&server, false, limits), &["read_file"]).await;
    let says = "model call failed: the model's answer is over 65536 bytes (llm.max_answer_bytes)";
    flood_is_cut(&server, &kernel, agent, says).await;
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_thousand_tool_calls_in_one_answer_run_none() {
    let arguments = r#"{"path":"notes.txt"}"#;
    let ids: Vec<String> = (0..5000).map(|i| format!("call_{i}")).collect();
    let calls: Vec<(&str, &str, &str)> = ids
        .iter()
        .map(|id| (id.as_str(), "read_file", arguments))
        .collect();
    for stream in [true, false] {
        let server = LlmServer::start(vec![
            Scripted::tool_calls(&calls),
            Scripted::content("still here"),
        ])
        .await;
        let provider = provider(&server, stream, Limits::default());
        let (kernel, agent) = agent_for(provider, &["read_file"]).await;
        let error = run_task(&kernel, agent, "read the file").await.unwrap_err();
        assert_eq!(
            error,
            "model call failed: the model's answer has more than 64 tool calls \
             (llm.max_tool_calls)",
            "stream {stream}"
        );
        assert_eq!(
            server.request_count(),
            1,
            "not tried again (stream {stream})"
        );
        assert_eq!(tool_calls(&kernel, agent), 0, "stream {stream}");
        let answer = run_task(&kernel, agent, "are you there?").await.unwrap();
        assert_eq!(answer, "still here");
        kernel.shutdown().await;
    }
}

/// An MCP server over stdio listing 2,000 tools of 1,750-byte
/// descriptions (3.5 MB), and answering `ping`.
const HUGE_MCP_SERVER: &str = r#"
import json, sys
tools = [{"name": "tool_%04d" % i, "description": "x" * 1750,
          "inputSchema": {"type": "object"}} for i in range(2000)]
while True:
    line = sys.stdin.readline()
    if not line:
        break
    try:
        message = json.loads(line)
    except ValueError:
        continue
    if "id" not in message:
        continue
    method = message.get("method")
    answer = {"jsonrpc": "2.0", "id": message["id"]}
    if method == "initialize":
        answer["result"] = {"protocolVersion": message["params"]["protocolVersion"],
                            "capabilities": {"tools": {}},
                            "serverInfo": {"name": "huge", "version": "1"}}
    elif method == "tools/list":
        answer["result"] = {"tools": tools}
    elif method == "ping":
        answer["result"] = {}
    else:
        answer["error"] = {"code": -32601, "message": "no such method"}
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn megabytes_of_mcp_tools_are_cut_to_the_definition_limit_with_a_note() {
    let server = LlmServer::start(vec![Scripted::content("ok")]).await;
    let mut huge = stdio(
        "huge",
        vec!["python3".into(), "-c".into(), HUGE_MCP_SERVER.into()],
    );
    huge.max_output_bytes = 16 << 20;
    let (registry, _) = agent_registry(AgentSettings::default(), &ToolSettings::default());
    let kernel = start(
        Kernel::builder(granting_all(test_settings(), &[Role::Agent]))
            .runtimes(registry)
            .mcp_servers(vec![huge])
            .llm(Arc::new(server.provider())),
    )
    .await;
    wait_for_state(&kernel, "huge", "ready", Duration::from_secs(60)).await;
    let agent = spawn_agent(&kernel, &["read_file", "mcp:huge"]).await;
    assert_eq!(run_task(&kernel, agent, "hello").await.unwrap(), "ok");

    let request = &server.requests()[0];
    let tools = request["tools"].as_array().unwrap();
    let bytes: usize = tools
        .iter()
        .map(|tool| {
            let function = &tool["function"];
            let text = |field: &str| function[field].as_str().unwrap_or_default().len();
            text("name") + text("description") + function["parameters"].to_string().len()
        })
        .sum();
    let limit = Limits::default().tool_definition_bytes;
    assert!(bytes <= limit, "{bytes} bytes of tools sent");
    let offered = tools
        .iter()
        .filter(|tool| {
            tool["function"]["name"]
                .as_str()
                .unwrap()
                .starts_with("mcp__huge__")
        })
        .count();
    assert!(
        offered > 100 && offered < 2000,
        "{offered} MCP tools offered"
    );
    assert!(
        tools
            .iter()
            .any(|tool| tool["function"]["name"] == "read_file"),
        "the built-in tool goes whole"
    );
    let system = system_message(request);
    let note = format!(
        "- ({} MCP tools are left out and cannot be called, as the tool definitions of a \
         request may take at most {limit} bytes (llm.max_tool_definition_bytes): \
         mcp:huge/tool_{offered:04}, ",
        2000 - offered
    );
    assert!(system.contains(&note), "{}", tail(&system));
    assert!(
        system.len() < 2 * limit,
        "{} bytes of system prompt",
        system.len()
    );
    kernel.shutdown().await;
}

/// The end of `text`, for a failure message.
fn tail(text: &str) -> &str {
    let mut at = text.len().saturating_sub(3000);
    while !text.is_char_boundary(at) {
        at += 1;
    }
    &text[at..]
}
