//! The LLM provider layer against a real chat-completions server on loopback.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hivekernel_agents::llm::{
    ChatMessage, ChatRequest, ChatRole, Limits, LlmError, OpenAiProvider, OpenAiSettings,
    OverLimit, Provider, SUBTASKS_MARKER, ScriptedProvider, ToolCall, ToolSchema, Usage,
    estimate_request_tokens, estimate_tokens,
};
use hivekernel_tests::llm_server::{LlmServer, Scripted};
use hivekernel_tests::wait_until;
use serde_json::{Value, json};

fn settings(server: &LlmServer) -> OpenAiSettings {
    OpenAiSettings {
        base_url: server.base_url(),
        api_key: Some("sk-test-secret".into()),
        models: BTreeMap::from([("sonnet".into(), "provider/sonnet-4".into())]),
        request_timeout: Duration::from_secs(5),
        max_retries: 0,
        max_in_flight: 4,
        ..OpenAiSettings::default()
    }
}

fn provider(server: &LlmServer, max_retries: u32) -> OpenAiProvider {
    OpenAiProvider::new(OpenAiSettings {
        max_retries,
        ..settings(server)
    })
    .unwrap()
}

fn read_file_tool() -> ToolSchema {
    ToolSchema {
        name: "read_file".into(),
        description: "Read a file in the workspace".into(),
        parameters: json!({
            "type": "object",
            "properties": { "path": { "type": "string" } },
            "required": ["path"],
        }),
    }
}

fn task(text: &str) -> ChatRequest {
    ChatRequest::new("sonnet", vec![ChatMessage::user(text)])
}

#[tokio::test]
async fn content_reply_parses_and_request_is_in_openai_shape() {
    let server = LlmServer::start(vec![Scripted::content_with_usage("hello there", 12, 3)]).await;
    let mut request = ChatRequest::new(
        "sonnet",
        vec![
            ChatMessage::system("You are terse."),
            ChatMessage::user("hi"),
        ],
    );
    request.tools = vec![read_file_tool()];
    request.max_tokens = Some(64);

    let response = provider(&server, 0).chat(&request).await.unwrap();

    assert_eq!(response.message.role, ChatRole::Assistant);
    assert_eq!(response.message.content, "hello there");
    assert!(response.message.tool_calls.is_empty());
    assert_eq!(response.finish_reason.as_deref(), Some("stop"));
    assert_eq!(
        response.usage,
        Usage {
            prompt_tokens: 12,
            completion_tokens: 3
        }
    );
    assert_eq!(response.usage.total(), 15);

    let sent = &server.requests()[0];
    assert_eq!(sent["model"], "provider/sonnet-4");
    assert_eq!(sent["max_tokens"], 64);
    assert_eq!(
        sent["messages"],
        json!([
            { "role": "system", "content": "You are terse." },
            { "role": "user", "content": "hi" },
        ])
    );
    assert_eq!(
        sent["tools"],
        json!([{
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file in the workspace",
                "parameters": read_file_tool().parameters,
            },
        }])
    );
    assert_eq!(
        server.authorization().as_deref(),
        Some("Bearer sk-test-secret")
    );
}

#[tokio::test]
async fn unmapped_model_goes_as_is_without_key_or_tools_and_with_the_default_max_tokens() {
    let server = LlmServer::start(vec![Scripted::content("ok")]).await;
    let provider = OpenAiProvider::new(OpenAiSettings {
        api_key: None,
        ..settings(&server)
    })
    .unwrap();

    provider
        .chat(&ChatRequest::new(
            "llama3:8b",
            vec![ChatMessage::user("hi")],
        ))
        .await
        .unwrap();

    let sent = &server.requests()[0];
    assert_eq!(sent["model"], "llama3:8b");
    assert!(
        sent.get("tools").is_none(),
        "no tools key when none are offered: {sent}"
    );
    // Every request caps its answer: the provider's default when the
    // caller names none.
    assert_eq!(sent["max_tokens"], 4096);
    assert_eq!(server.authorizations(), vec![None]);
    assert_eq!(provider.model_id("sonnet"), "provider/sonnet-4");
    assert_eq!(provider.name(), "openai");
}

#[tokio::test]
async fn tool_calls_parse_and_results_go_back_in_the_next_request() {
    let server = LlmServer::start(vec![
        Scripted::tool_calls(&[
            ("call_a", "read_file", r#"{"path":"a.txt"}"#),
            ("call_b", "read_file", r#"{"path": "b.txt""#),
        ]),
        Scripted::content("both read"),
    ])
    .await;
    let provider = provider(&server, 0);
    let mut request = task("read a and b");
    request.tools = vec![read_file_tool()];

    let first = provider.chat(&request).await.unwrap();
    assert_eq!(first.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(first.message.content, "");
    assert_eq!(
        first.message.tool_calls,
        vec![
            ToolCall::new("call_a", "read_file", r#"{"path":"a.txt"}"#),
            // Malformed arguments arrive verbatim: refusing them is the agent loop's job.
            ToolCall::new("call_b", "read_file", r#"{"path": "b.txt""#),
        ]
    );

    request.messages.push(first.message);
    request
        .messages
        .push(ChatMessage::tool_result("call_a", "contents of a"));
    request.messages.push(ChatMessage::tool_result(
        "call_b",
        "error: malformed arguments",
    ));
    let second = provider.chat(&request).await.unwrap();
    assert_eq!(second.message.content, "both read");

    let sent = &server.requests()[1]["messages"];
    assert_eq!(
        sent[1],
        json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [
                { "id": "call_a", "type": "function",
                  "function": { "name": "read_file", "arguments": "{\"path\":\"a.txt\"}" } },
                { "id": "call_b", "type": "function",
                  "function": { "name": "read_file", "arguments": "{\"path\": \"b.txt\"" } },
            ],
        })
    );
    assert_eq!(
        sent[2],
        json!({ "role": "tool", "content": "contents of a", "tool_call_id": "call_a" })
    );
    assert_eq!(
        sent[3],
        json!({ "role": "tool", "content": "error: malformed arguments", "tool_call_id": "call_b" })
    );
}

#[tokio::test]
async fn rate_limit_is_retried_after_the_wait_the_provider_asks_for() {
    let server = LlmServer::start(vec![Scripted::rate_limited(1), Scripted::content("ok")]).await;
    let started = Instant::now();

    let response = provider(&server, 3).chat(&task("hi")).await.unwrap();

    assert_eq!(response.message.content, "ok");
    assert_eq!(server.request_count(), 2);
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "retried after {:?}, before Retry-After: 1",
        started.elapsed()
    );
}

#[tokio::test]
async fn rate_limit_past_the_retries_is_rate_limited() {
    let server = LlmServer::start(vec![Scripted::rate_limited(1)]).await;

    let error = provider(&server, 0).chat(&task("hi")).await.unwrap_err();

    assert_eq!(
        error,
        LlmError::RateLimited {
            retry_after: Some(Duration::from_secs(1))
        }
    );
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn server_errors_are_retried_until_success() {
    let server = LlmServer::start(vec![
        Scripted::status(503, "overloaded"),
        Scripted::status(503, "overloaded"),
        Scripted::content("third time lucky"),
    ])
    .await;

    let response = provider(&server, 3).chat(&task("hi")).await.unwrap();

    assert_eq!(response.message.content, "third time lucky");
    assert_eq!(server.request_count(), 3);
}

#[tokio::test]
async fn server_errors_past_the_retries_are_http_errors() {
    let server = LlmServer::answering(|_| Scripted::status(500, "boom")).await;

    let error = provider(&server, 2).chat(&task("hi")).await.unwrap_err();

    assert_eq!(
        error,
        LlmError::Http {
            status: 500,
            body: "boom".into()
        }
    );
    assert_eq!(server.request_count(), 3, "one attempt and two retries");
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    let server =
        LlmServer::answering(|_| Scripted::error(400, "invalid_request_error", "bad temperature"))
            .await;

    let error = provider(&server, 3).chat(&task("hi")).await.unwrap_err();

    match error {
        LlmError::Http { status: 400, body } => assert!(body.contains("bad temperature"), "{body}"),
        other => panic!("expected HTTP 400, got {other:?}"),
    }
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn context_length_errors_are_recognised_at_once() {
    let server = LlmServer::answering(|_| Scripted::context_length_exceeded()).await;
    let error = provider(&server, 3).chat(&task("hi")).await.unwrap_err();
    assert!(
        matches!(&error, LlmError::ContextLength(m) if m.contains("maximum context length")),
        "{error:?}"
    );
    assert_eq!(server.request_count(), 1);

    // llama.cpp words it differently and sends no code.
    let server = LlmServer::start(vec![Scripted::status(
        400,
        r#"{"error":{"message":"the request exceeds the available context size, try increasing it"}}"#,
    )])
    .await;
    let error = provider(&server, 3).chat(&task("hi")).await.unwrap_err();
    assert!(matches!(error, LlmError::ContextLength(_)), "{error:?}");
}

#[tokio::test]
async fn unreadable_answers_are_invalid_responses() {
    let server = LlmServer::start(vec![
        Scripted::status(200, "{not json"),
        Scripted::Json(json!({ "choices": [] })),
        Scripted::Json(json!({ "choices": [{ "finish_reason": "stop" }] })),
    ])
    .await;
    // Answers asked for whole (a streamed request gets these as events).
    let provider = OpenAiProvider::new(OpenAiSettings {
        stream: false,
        max_retries: 3,
        ..settings(&server)
    })
    .unwrap();

    for expected in ["not a chat completion", "no choices", "no message"] {
        let error = provider.chat(&task("hi")).await.unwrap_err();
        assert!(
            matches!(&error, LlmError::InvalidResponse(m) if m.contains(expected)),
            "expected {expected:?}, got {error:?}"
        );
    }
    assert_eq!(server.request_count(), 3, "invalid answers are not retried");
}

#[tokio::test]
async fn an_error_whose_body_never_ends_is_read_only_so_far() {
    let server = LlmServer::start(vec![Scripted::endless_error(500, 64 << 20)]).await;
    let error = provider(&server, 0).chat(&task("hi")).await.unwrap_err();
    let LlmError::Http { status: 500, body } = &error else {
        panic!("{error:?}");
    };
    assert!(
        body.starts_with(r#"{"error":{"message":"overloaded xxx"#) && body.len() < 2200,
        "{body:.100}"
    );
    wait_until("the client to hang up", Duration::from_secs(30), || async {
        server.hung_up() == 1
    })
    .await;
    let flooded = server.flooded();
    assert!(flooded < 16 << 20, "the server got {flooded} bytes out");
}

#[tokio::test]
async fn answers_and_requests_past_the_limits_fail_at_once() {
    let long = "x".repeat(100_000);
    let server = LlmServer::start(vec![Scripted::content(&long)]).await;
    let limits = Limits {
        answer_bytes: 65536,
        tool_definition_bytes: 100,
        ..Limits::default()
    };
    let provider = OpenAiProvider::new(OpenAiSettings {
        stream: false,
        max_retries: 3,
        limits,
        ..settings(&server)
    })
    .unwrap();
    // Its `Content-Length` says it is too long: not read, not tried again.
    let error = provider.chat(&task("hi")).await.unwrap_err();
    assert_eq!(error, LlmError::OverLimit(OverLimit::AnswerBytes(65536)));
    assert_eq!(server.request_count(), 1);
    // Tools past the limit are not sent at all.
    let mut request = task("hi");
    request.tools = vec![read_file_tool()];
    let error = provider.chat(&request).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "the request's tool definitions are over 100 bytes (llm.max_tool_definition_bytes)"
    );
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn unknown_models_are_named() {
    let server = LlmServer::start(vec![Scripted::error(
        404,
        "model_not_found",
        "The model `gpt-9` does not exist",
    )])
    .await;
    let error = provider(&server, 3)
        .chat(&ChatRequest::new("gpt-9", vec![]))
        .await
        .unwrap_err();
    assert_eq!(error, LlmError::UnknownModel("gpt-9".into()));
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn slow_answers_time_out_after_the_retries() {
    let server =
        LlmServer::answering(|_| Scripted::content("late").after(Duration::from_secs(3))).await;
    let provider = OpenAiProvider::new(OpenAiSettings {
        request_timeout: Duration::from_millis(200),
        max_retries: 1,
        ..settings(&server)
    })
    .unwrap();

    let error = provider.chat(&task("hi")).await.unwrap_err();

    assert_eq!(
        error,
        LlmError::Timeout("the answer took longer than 0.2 s".into())
    );
    assert_eq!(server.request_count(), 2);
}

#[tokio::test]
async fn unreachable_endpoints_are_transport_errors_after_the_retries() {
    // A port that was just free: nothing listens there.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let provider = OpenAiProvider::new(OpenAiSettings {
        base_url: format!("http://{addr}/v1"),
        max_retries: 1,
        unavailable_wait: Duration::ZERO,
        ..OpenAiSettings::default()
    })
    .unwrap();

    let error = provider.chat(&task("hi")).await.unwrap_err();

    let LlmError::Transport(message) = &error else {
        panic!("not a transport error: {error:?}");
    };
    // The endpoint and the root cause, not just "error sending request".
    assert!(
        message.contains(&format!("http://{addr}/v1/chat/completions")),
        "{message}"
    );
    assert!(message.to_lowercase().contains("refused"), "{message}");
}

#[tokio::test]
async fn admission_control_queues_requests_over_the_cap() {
    let server =
        LlmServer::answering(|_| Scripted::content("ok").after(Duration::from_millis(300))).await;
    let provider = OpenAiProvider::new(OpenAiSettings {
        max_in_flight: 2,
        ..settings(&server)
    })
    .unwrap();
    let started = Instant::now();

    let calls: Vec<_> = (0..6)
        .map(|i| {
            // Each task gets its own clone: the cap is shared by all of them.
            let provider = provider.clone();
            tokio::spawn(async move { provider.chat(&task(&format!("task {i}"))).await })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap().message.content, "ok");
    }

    assert_eq!(server.request_count(), 6);
    assert_eq!(
        server.max_concurrent(),
        2,
        "never more than max_in_flight at once"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "three waves of two"
    );
    assert_eq!(provider.admission().in_flight(), 0);
}

#[tokio::test]
async fn settings_are_validated_and_the_key_is_never_shown() {
    let base = OpenAiSettings {
        api_key: Some("sk-test-secret".into()),
        ..OpenAiSettings::default()
    };
    for (settings, expected) in [
        (
            OpenAiSettings {
                base_url: "ftp://example.com/v1".into(),
                ..base.clone()
            },
            "http",
        ),
        (
            OpenAiSettings {
                base_url: "not a url".into(),
                ..base.clone()
            },
            "not a URL",
        ),
        (
            OpenAiSettings {
                max_in_flight: 0,
                ..base.clone()
            },
            "max_in_flight",
        ),
        (
            OpenAiSettings {
                request_timeout: Duration::ZERO,
                ..base.clone()
            },
            "request_timeout",
        ),
    ] {
        let error = OpenAiProvider::new(settings).unwrap_err();
        assert!(
            matches!(&error, LlmError::Config(m) if m.contains(expected)),
            "expected {expected:?}: {error:?}"
        );
        assert!(!error.to_string().contains("sk-test-secret"));
    }
    let provider = OpenAiProvider::new(OpenAiSettings {
        base_url: "https://api.example.com/v1/".into(),
        ..base.clone()
    })
    .unwrap();
    assert_eq!(provider.base_url(), "https://api.example.com/v1");
    assert!(!format!("{provider:?}").contains("sk-test-secret"));
    assert!(!format!("{base:?}").contains("sk-test-secret"));
}

// ---- the scripted provider -------------------------------------------------

fn tool(name: &str) -> ToolSchema {
    ToolSchema {
        name: name.into(),
        description: format!("the {name} tool"),
        parameters: json!({ "type": "object" }),
    }
}

fn scripted_request(system: &str, last: ChatMessage, tools: &[&str]) -> ChatRequest {
    let mut request = ChatRequest::new("sonnet", vec![ChatMessage::system(system), last]);
    request.tools = tools.iter().map(|name| tool(name)).collect();
    request
}

fn only_call(request: &ChatRequest) -> (String, Value) {
    let response = ScriptedProvider.answer(request);
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
    let [call] = response.message.tool_calls.as_slice() else {
        panic!("expected one tool call, got {:?}", response.message);
    };
    assert_eq!(call.id, format!("call_{}", request.messages.len()));
    (
        call.name.clone(),
        serde_json::from_str(&call.arguments).unwrap(),
    )
}

fn content(request: &ChatRequest) -> String {
    let response = ScriptedProvider.answer(request);
    assert!(
        response.message.tool_calls.is_empty(),
        "{:?}",
        response.message
    );
    assert_eq!(response.finish_reason.as_deref(), Some("stop"));
    response.message.content
}

#[test]
fn scripted_orchestrates_multi_part_tasks() {
    for text in [
        "research rust actors; compare them with erlang",
        "summarise the README and list open questions",
        "Plan:\n1. read the code\n2. write tests\n3. report",
    ] {
        let request = scripted_request(
            "Name: queen",
            ChatMessage::user(text),
            &["orchestrate", "delegate_async"],
        );
        assert_eq!(
            only_call(&request),
            ("orchestrate".into(), json!({ "task": text }))
        );
    }
}

#[test]
fn scripted_orchestrates_only_with_the_tool_and_several_parts() {
    let two_parts = ChatMessage::user("read a and write b");
    let request = scripted_request("Name: coder", two_parts, &["read_file"]);
    assert_eq!(content(&request), "coder handled: read a and write b");

    let one_part = ChatMessage::user("summarise the README");
    let request = scripted_request("Name: queen", one_part, &["orchestrate"]);
    assert_eq!(content(&request), "queen handled: summarise the README");
}

#[test]
fn scripted_delegates_with_a_pid() {
    let request = scripted_request(
        "- Name: assistant",
        ChatMessage::user("delegate: 5 summarise x and y"),
        &["delegate_async", "orchestrate"],
    );
    assert_eq!(
        only_call(&request),
        (
            "delegate_async".into(),
            json!({ "pid": 5, "task": "summarise x and y" })
        )
    );

    let no_pid = scripted_request(
        "",
        ChatMessage::user("delegate: someone"),
        &["delegate_async"],
    );
    assert_eq!(content(&no_pid), "agent handled: delegate: someone");
    let no_tool = scripted_request("", ChatMessage::user("delegate: 5 x"), &[]);
    assert_eq!(content(&no_tool), "agent handled: delegate: 5 x");
}

#[test]
fn scripted_splits_tasks_into_a_json_array() {
    let system = format!("You plan work. {SUBTASKS_MARKER}, nothing else.");
    let cases = [
        (
            "Task: research actors; compare with erlang; write it up",
            vec!["research actors", "compare with erlang", "write it up"],
        ),
        ("Task: read a and write b", vec!["read a", "write b"]),
        (
            "Task:\n1. read the code\n2) write tests\n\nBe brief.",
            vec!["read the code", "write tests"],
        ),
        ("Task: just one thing", vec!["just one thing"]),
    ];
    for (user, expected) in cases {
        // Orchestrate on offer must not make the planner recurse.
        let request = scripted_request(&system, ChatMessage::user(user), &["orchestrate"]);
        let parts: Vec<String> = serde_json::from_str(&content(&request)).unwrap();
        assert_eq!(parts, expected, "for {user:?}");
    }

    // The marker in the user message works too.
    let user = format!("{SUBTASKS_MARKER}.\nTask: a; b");
    let request = scripted_request("Name: orchestrator", ChatMessage::user(user), &[]);
    assert_eq!(content(&request), r#"["a","b"]"#);
}

#[test]
fn scripted_synthesizes_listed_results() {
    let user = "Synthesize the worker results into one answer.\n\
                Task:\n1. read a\n2. read b\n\n\
                Results:\n1. worker-1 handled: read a\n2. worker-2 handled: read b\n";
    let request = scripted_request("Name: queen", ChatMessage::user(user), &["orchestrate"]);
    assert_eq!(
        content(&request),
        "Summary: worker-1 handled: read a; worker-2 handled: read b"
    );

    let bare = "Synthesize these:\n- alpha\n- beta";
    let request = scripted_request("", ChatMessage::user(bare), &[]);
    assert_eq!(content(&request), "Summary: alpha; beta");
}

#[test]
fn scripted_reports_tool_results() {
    let mut request = scripted_request(
        "Name: queen",
        ChatMessage::user("x and y"),
        &["orchestrate"],
    );
    request.messages.push(
        ChatMessage::assistant("").with_tool_calls(vec![ToolCall::new(
            "call_2",
            "orchestrate",
            "{}",
        )]),
    );
    let long = "r".repeat(500);
    request
        .messages
        .push(ChatMessage::tool_result("call_2", long.clone()));
    assert_eq!(content(&request), format!("Done: {}", &long[..200]));

    request.messages.pop();
    request.messages.push(ChatMessage::tool_result(
        "call_2",
        "Summary: x done; y done",
    ));
    assert_eq!(content(&request), "Done: Summary: x done; y done");
}

#[test]
fn scripted_default_names_the_agent() {
    let system = "You are helpful.\n\n## Identity\nName: coder\nPID: 7\nRole: task";
    let request = scripted_request(system, ChatMessage::user("fix the bug"), &["read_file"]);
    assert_eq!(content(&request), "coder handled: fix the bug");

    let request = ChatRequest::new("mini", vec![ChatMessage::user("hello")]);
    assert_eq!(content(&request), "agent handled: hello");
}

#[tokio::test]
async fn scripted_is_deterministic_and_counts_tokens() {
    let provider: Arc<dyn Provider> = Arc::new(ScriptedProvider::new());
    assert_eq!(provider.name(), "scripted");
    let requests = [
        scripted_request("Name: q", ChatMessage::user("a; b"), &["orchestrate"]),
        scripted_request("Name: q", ChatMessage::user("hello"), &[]),
        scripted_request("Name: q", ChatMessage::tool_result("call_1", "ok"), &[]),
    ];
    for request in &requests {
        let first = provider.chat(request).await.unwrap();
        let second = provider.chat(&request.clone()).await.unwrap();
        assert_eq!(first, second);
        assert_eq!(
            first.usage.prompt_tokens,
            estimate_tokens(&request.messages)
        );
        assert!(first.usage.prompt_tokens > 0 && first.usage.completion_tokens > 0);
    }
}

#[tokio::test]
async fn scripted_drives_a_tool_loop_to_a_final_answer() {
    // The loop the agent runtime will run: call, execute tools, feed back, until no calls.
    let provider = ScriptedProvider::new();
    let mut request = scripted_request(
        "Name: queen",
        ChatMessage::user("review the code and write the changelog"),
        &["orchestrate"],
    );
    let mut turns = 0;
    let answer = loop {
        turns += 1;
        let response = provider.chat(&request).await.unwrap();
        if response.message.tool_calls.is_empty() {
            break response.message.content;
        }
        let calls = response.message.tool_calls.clone();
        request.messages.push(response.message);
        for call in calls {
            let args: Value = serde_json::from_str(&call.arguments).unwrap();
            let result = format!("Summary: ran {}", args["task"].as_str().unwrap());
            request
                .messages
                .push(ChatMessage::tool_result(call.id, result));
        }
    };
    assert_eq!(turns, 2);
    assert_eq!(
        answer,
        "Done: Summary: ran review the code and write the changelog"
    );
}

#[test]
fn token_estimates_grow_with_the_conversation() {
    assert_eq!(estimate_tokens(&[]), 0);
    let short = [ChatMessage::user("hi")];
    let long = [
        ChatMessage::user("hi"),
        ChatMessage::assistant("x".repeat(400)),
    ];
    assert!(estimate_tokens(&short) > 0);
    assert!(estimate_tokens(&long) >= estimate_tokens(&short) + 100);

    let mut request = ChatRequest::new("sonnet", long.to_vec());
    let without_tools = estimate_request_tokens(&request);
    request.tools = vec![read_file_tool()];
    assert!(estimate_request_tokens(&request) > without_tools);
}
