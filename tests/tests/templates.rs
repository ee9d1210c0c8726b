//! What servers other than OpenAI's demand of a conversation and say in
//! an answer, against a loopback server that enforces it as a strict chat
//! template does (Mistral-family: one system message, first; roles that
//! alternate; 9-character tool-call ids), and answers that stopped for a
//! reason other than being done: `length`, `content_filter`, an answer left
//! in `reasoning_content`.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use hivekernel_agents::llm::{ChatMessage, ChatRequest, Provider};
use hivekernel_agents::tool_agent::AgentSettings;
use hivekernel_agents::tools::ToolSettings;
use hivekernel_agents::{Pid, Role, SpawnRequest};
use hivekernel_kernel::{Caller, Kernel};
use hivekernel_tests::llm_server::{LlmServer, Scripted};
use hivekernel_tests::{agent_kernel, run_task, test_settings};
use serde_json::{Value, json};

/// What a Mistral-family chat template refuses in `body`, as its server says it.
fn template_refuses(body: &Value) -> Option<&'static str> {
    let messages = body["messages"].as_array()?;
    let roles: Vec<&str> = messages.iter().filter_map(|m| m["role"].as_str()).collect();
    if roles.iter().skip(1).any(|r| *r == "system") {
        return Some(
            "After the optional system message, conversation roles must alternate \
             user/assistant/user/assistant/...",
        );
    }
    let talk: Vec<&str> = roles
        .iter()
        .copied()
        .filter(|r| *r != "system" && *r != "tool")
        .collect();
    if talk.first() != Some(&"user") || talk.windows(2).any(|w| w[0] == w[1]) {
        return Some("Conversation roles must alternate user/assistant/user/assistant/...");
    }
    for message in messages {
        for call in message["tool_calls"].as_array().into_iter().flatten() {
            let id = call["id"].as_str().unwrap_or_default();
            if id.len() != 9 || !id.chars().all(|c| c.is_ascii_alphanumeric()) {
                return Some("Tool call IDs should be alphanumeric strings with length 9!");
            }
        }
    }
    None
}

/// A server with a strict template: refuses what it would, else answers
/// with `answer(body)`.
async fn strict_server(answer: impl Fn(&Value) -> Scripted + Send + Sync + 'static) -> LlmServer {
    LlmServer::answering(move |body| match template_refuses(body) {
        Some(why) => Scripted::error(400, "invalid_request_error", why),
        None => answer(body),
    })
    .await
}

#[tokio::test]
async fn a_strict_template_is_detected_once_and_then_always_satisfied() {
    let server = strict_server(|_| Scripted::content("fine")).await;
    let provider = server.provider();
    // Two system messages (a context note) and two user messages in a row
    // (a delegated result arriving after a task).
    let request = ChatRequest::new(
        "m",
        vec![
            ChatMessage::system("You are careful."),
            ChatMessage::system("[Context note: 4 earlier messages were left out.]"),
            ChatMessage::user("first"),
            ChatMessage::user("second"),
        ],
    );
    let answer = provider.chat(&request).await.unwrap();
    assert_eq!(answer.message.content, "fine");
    let sent = server.requests();
    assert_eq!(sent.len(), 2, "refused once, then sent in the strict shape");
    let first = &sent[0]["messages"];
    assert_eq!(
        first.as_array().unwrap().len(),
        3,
        "one system message: {first}"
    );
    assert!(
        first[0]["content"]
            .as_str()
            .unwrap()
            .ends_with("[Context note: 4 earlier messages were left out.]"),
        "{first}"
    );
    assert_eq!(sent[1]["messages"][1]["content"], "first\n\nsecond");
    assert!(
        sent.iter()
            .all(|body| body["max_tokens"].as_u64().is_some())
    );

    // From then on the provider sends the strict shape at once.
    provider.chat(&request).await.unwrap();
    assert_eq!(server.requests().len(), 3);
}

async fn kernel(server: &LlmServer, agent: AgentSettings) -> (Kernel, Pid) {
    let settings = hivekernel_kernel::config::KernelSettings {
        default_runtime: "tool_agent".into(),
        ..test_settings()
    };
    let tools = ToolSettings::default();
    let (kernel, _) = agent_kernel(settings, Arc::new(server.provider()), agent, &tools).await;
    let mut request = SpawnRequest::new(Pid::KERNEL, "calc");
    request.role = Role::Agent;
    request.model = "test-model".into();
    request.runtime = Some("tool_agent".into());
    request.tools = vec!["get_process_info".into()];
    let pid = kernel.spawn(Caller::Admin, request).await.unwrap();
    (kernel, pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_without_an_id_gets_one_a_strict_template_accepts() {
    // The model calls a tool without an id, then answers.
    let server = strict_server(|body| {
        let after_tool = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["role"] == "tool");
        if after_tool {
            Scripted::content("done")
        } else {
            Scripted::finished(
                json!({"role": "assistant", "content": null, "tool_calls": [
                    {"type": "function", "function": {"name": "get_process_info", "arguments": "{}"}}
                ]}),
                "tool_calls",
            )
        }
    })
    .await;
    let (kernel, pid) = kernel(&server, AgentSettings::default()).await;
    assert_eq!(run_task(&kernel, pid, "who am I?").await.unwrap(), "done");
    let sent = server.requests();
    assert_eq!(sent.len(), 2, "no request refused: {sent:#?}");
    let call = &sent[1]["messages"][2]["tool_calls"][0];
    let id = call["id"].as_str().unwrap();
    assert_eq!(sent[1]["messages"][3]["tool_call_id"], id);
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_cut_at_the_length_limit_fails_as_truncated_or_goes_on() {
    let cut =
        |text: &str| Scripted::finished(json!({"role": "assistant", "content": text}), "length");
    let server = LlmServer::start(vec![
        cut("The first half"),
        cut("The first half"),
        Scripted::content(" and the rest."),
        Scripted::finished(
            json!({"role": "assistant", "content": "", "reasoning_content": "It is 4."}),
            "stop",
        ),
        Scripted::finished(
            json!({"role": "assistant", "content": ""}),
            "content_filter",
        ),
    ])
    .await;
    let (kernel, pid) = kernel(&server, AgentSettings::default()).await;
    let failed = run_task(&kernel, pid, "write it").await.unwrap_err();
    assert!(failed.starts_with("truncated:"), "{failed}");
    kernel.shutdown().await;

    let settings = AgentSettings {
        continue_on_length: 1,
        ..AgentSettings::default()
    };
    let (kernel, pid) = self::kernel(&server, settings).await;
    let answer = run_task(&kernel, pid, "write it").await.unwrap();
    assert_eq!(answer, "The first half and the rest.");
    let asked = &server.requests()[2]["messages"];
    let asked = asked.as_array().unwrap();
    assert_eq!(asked[asked.len() - 2]["content"], "The first half");
    assert!(
        asked[asked.len() - 1]["content"]
            .as_str()
            .unwrap()
            .contains("Continue exactly where it stopped"),
        "{asked:?}"
    );

    // An answer left in the reasoning is the answer; a filtered one fails.
    assert_eq!(run_task(&kernel, pid, "2+2?").await.unwrap(), "It is 4.");
    let filtered = run_task(&kernel, pid, "say it").await.unwrap_err();
    assert!(filtered.starts_with("content_filter:"), "{filtered}");
    kernel.shutdown().await;
}
