//! Streamed answers and retries by cause, the OpenAI-compatible provider
//! against a real chat-completions server on loopback: what arrives as it
//! streams, each limit (first token, silence, overall), a dropped call
//! closing its connection, and a server that is not up yet or is loading
//! its model waited for.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use hivekernel_agents::llm::{
    ChatMessage, ChatRequest, LlmError, OpenAiProvider, OpenAiSettings, Provider, Retry, Watch,
};
use hivekernel_tests::llm_server::{FOREVER, LlmServer, Scripted};
use parking_lot::Mutex;
use serde_json::json;

/// What a call told its watch.
#[derive(Debug, Default)]
struct Seen {
    /// Each piece of streamed text, with when it came.
    pieces: Mutex<Vec<(String, bool, Instant)>>,
    /// Each failed attempt: (attempt, error, wait).
    retries: Mutex<Vec<(u32, String, Duration)>>,
}

impl Watch for Seen {
    fn streamed(&self, text: &str, reasoning: bool) {
        self.pieces
            .lock()
            .push((text.to_owned(), reasoning, Instant::now()));
    }

    fn retrying(&self, retry: &Retry<'_>) {
        self.retries
            .lock()
            .push((retry.attempt, retry.error.to_string(), retry.wait));
    }
}

impl Seen {
    fn text(&self) -> String {
        let pieces = self.pieces.lock();
        pieces
            .iter()
            .filter(|p| !p.1)
            .map(|p| p.0.as_str())
            .collect()
    }
}

fn provider(server: &LlmServer, settings: OpenAiSettings) -> OpenAiProvider {
    OpenAiProvider::new(OpenAiSettings {
        base_url: server.base_url(),
        ..settings
    })
    .unwrap()
}

/// No retries unless a test asks for them, so each failure shows at once.
fn quick() -> OpenAiSettings {
    OpenAiSettings {
        max_retries: 0,
        ..OpenAiSettings::default()
    }
}

fn hi() -> ChatRequest {
    ChatRequest::new("m", vec![ChatMessage::user("hi")])
}

#[tokio::test]
async fn a_streamed_answer_arrives_as_it_is_written() {
    let server = LlmServer::start(vec![Scripted::streamed(
        "one two three four",
        Duration::from_millis(100),
    )])
    .await;
    let provider = provider(&server, quick());
    let seen = Seen::default();

    let answer = provider.call(&hi(), &seen).await.unwrap();

    assert_eq!(answer.message.content, "one two three four");
    assert_eq!(answer.finish_reason.as_deref(), Some("stop"));
    assert_eq!(answer.usage.total(), 15, "usage from the last chunk");
    let pieces = seen.pieces.lock();
    assert_eq!(
        pieces.iter().map(|p| p.0.as_str()).collect::<Vec<_>>(),
        ["one ", "two ", "three ", "four"]
    );
    // Each word as it came, not all at the end.
    let spread = pieces[3].2 - pieces[0].2;
    assert!(spread >= Duration::from_millis(250), "{spread:?}");
    let sent = &server.requests()[0];
    assert_eq!(sent["stream"], true);
    assert_eq!(sent["stream_options"], json!({ "include_usage": true }));
}

#[tokio::test]
async fn streamed_tool_calls_and_reasoning_are_put_back_together() {
    let server = LlmServer::start(vec![Scripted::finished(
        json!({
            "role": "assistant",
            "content": "Reading it.",
            "reasoning_content": "the file holds the answer",
            "tool_calls": [
                { "id": "call_a", "type": "function",
                  "function": { "name": "read_file", "arguments": "{\"path\":\"notes/é.md\"}" } },
                { "id": "call_b", "type": "function",
                  "function": { "name": "list_dir", "arguments": "{}" } },
            ],
        }),
        "tool_calls",
    )])
    .await;
    let provider = provider(&server, quick());
    let seen = Seen::default();

    let answer = provider.call(&hi(), &seen).await.unwrap();

    let calls = &answer.message.tool_calls;
    assert_eq!(calls.len(), 2);
    assert_eq!(
        (calls[0].id.as_str(), calls[0].name.as_str()),
        ("call_a", "read_file")
    );
    assert_eq!(calls[0].arguments, r#"{"path":"notes/é.md"}"#);
    assert_eq!(
        (calls[1].name.as_str(), calls[1].arguments.as_str()),
        ("list_dir", "{}")
    );
    assert_eq!(answer.message.content, "Reading it.");
    assert_eq!(
        answer.message.reasoning.as_deref(),
        Some("the file holds the answer")
    );
    assert_eq!(answer.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(seen.text(), "Reading it.");
    assert!(
        seen.pieces.lock().iter().any(|p| p.1),
        "reasoning streamed as such"
    );
}

#[tokio::test]
async fn a_long_answer_that_keeps_coming_is_not_cut_but_silence_is() {
    // 12 words, 100 ms apart: longer than the first-token and idle limits,
    // well within the overall cap.
    let text = "a b c d e f g h i j k l";
    let server = LlmServer::start(vec![
        Scripted::streamed(text, Duration::from_millis(100)),
        Scripted::stalled("stuck after this"),
    ])
    .await;
    let provider = provider(
        &server,
        OpenAiSettings {
            first_token_timeout: Duration::from_millis(500),
            idle_timeout: Duration::from_millis(400),
            request_timeout: Duration::from_secs(20),
            ..quick()
        },
    );

    let answer = provider.chat(&hi()).await.unwrap();
    assert_eq!(answer.message.content, text);

    let seen = Seen::default();
    let began = Instant::now();
    let error = provider.call(&hi(), &seen).await.unwrap_err();
    assert_eq!(
        error,
        LlmError::Timeout("the answer stopped for 0.4 s after 16 bytes".into())
    );
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "{:?}",
        began.elapsed()
    );
    assert_eq!(seen.text(), "stuck after this");
    // The connection was closed, so the server stops generating.
    wait_until(|| server.hung_up() == 1).await;
}

#[tokio::test]
async fn no_first_token_and_the_overall_cap_are_limits_of_their_own() {
    let server = LlmServer::start(vec![
        // Headers at once, then nothing.
        Scripted::Events(vec![(FOREVER, "[DONE]".into())]),
        // Keeps streaming, never ends.
        Scripted::Events(
            (0..100)
                .map(|_| {
                    let chunk = json!({ "choices": [{ "index": 0, "delta": { "content": "x" } }] });
                    (Duration::from_millis(50), chunk.to_string())
                })
                .collect(),
        ),
    ])
    .await;
    let provider = provider(
        &server,
        OpenAiSettings {
            first_token_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_millis(900),
            ..quick()
        },
    );

    let error = provider.chat(&hi()).await.unwrap_err();
    assert_eq!(
        error,
        LlmError::Timeout("no first token within 0.3 s".into())
    );
    let error = provider.chat(&hi()).await.unwrap_err();
    assert_eq!(
        error,
        LlmError::Timeout("the answer took longer than 0.9 s".into())
    );
    wait_until(|| server.hung_up() == 2).await;
}

#[tokio::test]
async fn dropping_a_call_closes_its_connection() {
    let server = LlmServer::start(vec![Scripted::stalled("thinking hard")]).await;
    let provider = provider(&server, quick());
    let seen = Seen::default();

    let request = hi();
    let call = provider.call(&request, &seen);
    let abandoned = tokio::time::timeout(Duration::from_millis(500), call).await;

    assert!(abandoned.is_err(), "still streaming when dropped");
    assert_eq!(seen.text(), "thinking hard");
    wait_until(|| server.hung_up() == 1 && server.answering_now() == 0).await;
}

#[tokio::test]
async fn errors_inside_a_stream_and_streams_cut_short() {
    let chunk = |text: &str| {
        json!({ "choices": [{ "index": 0, "delta": { "content": text } }] }).to_string()
    };
    let now = Duration::ZERO;
    let server = LlmServer::start(vec![
        // llama.cpp's shared-slot overflow, said after the headers.
        Scripted::Events(vec![
            (now, chunk("par")),
            (
                now,
                json!({ "error": { "code": 500, "message": "Context size has been exceeded." } })
                    .to_string(),
            ),
        ]),
        // The connection ends mid-answer: retried, and the retry answers.
        Scripted::Events(vec![(now, chunk("cut sh"))]),
        Scripted::content("whole"),
        Scripted::Events(vec![(now, "{not json".into())]),
    ])
    .await;
    let provider = provider(
        &server,
        OpenAiSettings {
            max_retries: 1,
            ..quick()
        },
    );

    let error = provider.chat(&hi()).await.unwrap_err();
    assert!(
        matches!(&error, LlmError::ContextLength(m) if m.contains("Context size")),
        "{error:?}"
    );
    let seen = Seen::default();
    let answer = provider.call(&hi(), &seen).await.unwrap();
    assert_eq!(answer.message.content, "whole");
    let retries = seen.retries.lock().clone();
    assert_eq!(retries.len(), 1);
    assert!(
        retries[0]
            .1
            .contains("ended before the answer did (after 6 bytes)"),
        "{retries:?}"
    );
    let error = provider.chat(&hi()).await.unwrap_err();
    assert!(
        matches!(&error, LlmError::InvalidResponse(m) if m.contains("not a chat-completion chunk")),
        "{error:?}"
    );
    assert_eq!(server.request_count(), 4, "garbage is not retried");
}

#[tokio::test]
async fn a_server_that_answers_whole_when_asked_to_stream_still_works() {
    let body = json!({
        "choices": [{ "message": { "role": "assistant", "content": "whole" }, "finish_reason": "stop" }],
        "usage": { "prompt_tokens": 3, "completion_tokens": 1 },
    });
    // Status answers are sent as plain JSON whatever the request asked.
    let server = LlmServer::start(vec![Scripted::status(200, &body.to_string())]).await;
    let provider = provider(&server, quick());

    let answer = provider.chat(&hi()).await.unwrap();

    assert_eq!(answer.message.content, "whole");
    assert_eq!(answer.usage.total(), 4);
}

#[tokio::test]
async fn non_streaming_providers_ask_for_whole_answers() {
    let server = LlmServer::start(vec![Scripted::content("whole")]).await;
    let provider = provider(
        &server,
        OpenAiSettings {
            stream: false,
            ..quick()
        },
    );
    let seen = Seen::default();

    let answer = provider.call(&hi(), &seen).await.unwrap();

    assert_eq!(answer.message.content, "whole");
    assert!(seen.pieces.lock().is_empty());
    let sent = &server.requests()[0];
    assert!(sent.get("stream").is_none() && sent.get("stream_options").is_none());
}

#[tokio::test]
async fn a_model_loading_is_waited_out_as_the_server_asks() {
    let loading =
        || Scripted::error(503, "unavailable_error", "Loading model").with_retry_after("1");
    let server = LlmServer::start(vec![loading(), loading(), Scripted::content("loaded")]).await;
    // No retries for other causes: waiting for a server is not one.
    let provider = provider(
        &server,
        OpenAiSettings {
            unavailable_wait: Duration::from_secs(30),
            ..quick()
        },
    );
    let seen = Seen::default();
    let began = Instant::now();

    let answer = provider.call(&hi(), &seen).await.unwrap();

    assert_eq!(answer.message.content, "loaded");
    assert!(
        began.elapsed() >= Duration::from_secs(2),
        "{:?}",
        began.elapsed()
    );
    let retries = seen.retries.lock().clone();
    assert_eq!(
        retries.iter().map(|r| r.0).collect::<Vec<_>>(),
        [1, 2],
        "{retries:?}"
    );
    assert!(
        retries
            .iter()
            .all(|r| r.2 >= Duration::from_secs(1) && r.1.contains("503"))
    );
}

#[tokio::test]
async fn a_server_not_up_yet_is_waited_for_and_one_gone_for_good_is_given_up_on() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let settings = |wait| OpenAiSettings {
        base_url: format!("http://{addr}/v1"),
        max_retries: 0,
        unavailable_wait: wait,
        ..OpenAiSettings::default()
    };
    let waiting = OpenAiProvider::new(settings(Duration::from_secs(30))).unwrap();
    let seen = Seen::default();
    let request = hi();
    let call = waiting.call(&request, &seen);
    let comes_up = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        LlmServer::start_at(addr, vec![Scripted::content("up now")], None).await
    };

    let (answer, server) = tokio::join!(call, comes_up);

    assert_eq!(answer.unwrap().message.content, "up now");
    assert_eq!(server.request_count(), 1);
    let retries = seen.retries.lock().clone();
    assert!(!retries.is_empty());
    assert!(
        retries.iter().all(|r| r.1.contains("refused")),
        "{retries:?}"
    );
    drop(server);

    // Gone and not coming back: given up once the wait is over.
    let began = Instant::now();
    let error = OpenAiProvider::new(settings(Duration::from_secs(1)))
        .unwrap()
        .chat(&hi())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, LlmError::Transport(m) if m.contains("refused")),
        "{error:?}"
    );
    let took = began.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

#[tokio::test]
async fn other_server_errors_use_up_the_retries_and_no_more() {
    let server = LlmServer::answering(|_| Scripted::error(500, "server_error", "boom")).await;
    let provider = provider(
        &server,
        OpenAiSettings {
            max_retries: 2,
            unavailable_wait: Duration::from_secs(30),
            ..quick()
        },
    );
    let seen = Seen::default();

    let error = provider.call(&hi(), &seen).await.unwrap_err();

    assert!(
        matches!(error, LlmError::Http { status: 500, .. }),
        "{error:?}"
    );
    assert_eq!(server.request_count(), 3);
    assert_eq!(seen.retries.lock().len(), 2);
}

async fn wait_until(done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
