//! A loopback HTTP server speaking the OpenAI chat-completions protocol, scripted per test.
//!
//! `POST /v1/chat/completions` is answered from a script: the n-th request
//! gets the n-th [`Scripted`] answer; once the script runs out, a fallback
//! answers (by default a 500 naming the exhausted script, so a test that
//! makes more calls than it planned fails loudly). Every request body and
//! `authorization` header is recorded, and the server tracks how many
//! requests it was answering at once. The server stops when dropped.
//!
//! A request that asks for `"stream": true` gets a JSON answer as a real
//! server streams it: server-sent events, one chunk per word of the text
//! and per piece of each tool call's arguments, the finish reason, the
//! usage, then `[DONE]`. [`Scripted::Events`] sends events of its own at
//! its own pace, and the server counts streams the client hung up on.
//! [`Scripted::Flood`] is an answer that goes on (a stream of tool-call
//! argument deltas, a JSON body) and counts the bytes it got out.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

/// A dynamic answer: computed from the request body.
pub type Responder = Arc<dyn Fn(&Value) -> Scripted + Send + Sync>;

/// One scripted answer.
#[derive(Clone)]
pub enum Scripted {
    /// `200 OK` with this JSON body.
    Json(Value),
    /// Any status with a raw body (e.g. malformed JSON), and optionally `Retry-After`.
    Status {
        /// The HTTP status.
        status: u16,
        /// The body, sent as is.
        body: String,
        /// The `Retry-After` header value, if any.
        retry_after: Option<String>,
    },
    /// Waits, then answers with the inner answer.
    Delay(Duration, Box<Scripted>),
    /// Computes the answer from the request body.
    Dynamic(Responder),
    /// `200 OK` as server-sent events: each `(wait, data)` sent as
    /// `data: {data}` after its wait; the stream then ends.
    Events(Vec<(Duration, String)>),
    /// `200 OK` that goes on until the client hangs up (counted), or
    /// until a safety cap of bytes is sent; see [`Flood`].
    Flood(Flood),
}

/// An answer without end: `head`, then `piece` again and again, as fast
/// as the client takes them, until it hangs up or `up_to` bytes went out
/// (then the answer just ends, unfinished).
#[derive(Debug, Clone)]
pub struct Flood {
    /// The HTTP status.
    pub status: u16,
    /// Each part as a `data:` event of a `text/event-stream`; else the
    /// parts make up one `application/json` body.
    pub events: bool,
    /// What comes first (the start of the answer).
    pub head: String,
    /// What comes after it, again and again.
    pub piece: String,
    /// Bytes sent before giving up on the client hanging up.
    pub up_to: usize,
}

/// Forever, for a test's purposes: a wait in [`Scripted::Events`] that
/// only the client's timeout ends.
pub const FOREVER: Duration = Duration::from_secs(3600);

impl fmt::Debug for Scripted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scripted::Json(body) => f.debug_tuple("Json").field(body).finish(),
            Scripted::Status {
                status,
                body,
                retry_after,
            } => f
                .debug_struct("Status")
                .field("status", status)
                .field("body", body)
                .field("retry_after", retry_after)
                .finish(),
            Scripted::Delay(wait, inner) => {
                f.debug_tuple("Delay").field(wait).field(inner).finish()
            }
            Scripted::Dynamic(_) => f.write_str("Dynamic(..)"),
            Scripted::Events(events) => f.debug_tuple("Events").field(events).finish(),
            Scripted::Flood(flood) => f
                .debug_struct("Flood")
                .field("status", &flood.status)
                .field("events", &flood.events)
                .field("up_to", &flood.up_to)
                .finish(),
        }
    }
}

impl Scripted {
    /// A final text answer with usage 10 prompt + 5 completion tokens.
    pub fn content(text: &str) -> Self {
        Scripted::Json(content_body(text, 10, 5))
    }

    /// A final text answer with the given usage.
    pub fn content_with_usage(text: &str, prompt_tokens: u64, completion_tokens: u64) -> Self {
        Scripted::Json(content_body(text, prompt_tokens, completion_tokens))
    }

    /// An answer calling tools, each `(id, name, arguments JSON text)`; usage 10 + 5.
    pub fn tool_calls(calls: &[(&str, &str, &str)]) -> Self {
        Scripted::Json(tool_calls_body(calls, 10, 5))
    }

    /// An answer `message` (an assistant message object) that stopped for
    /// `finish_reason`; usage 10 + 5.
    pub fn finished(message: Value, finish_reason: &str) -> Self {
        Scripted::Json(completion(message, finish_reason, 10, 5))
    }

    /// A status with a body and no `Retry-After`.
    pub fn status(status: u16, body: &str) -> Self {
        Scripted::Status {
            status,
            body: body.to_owned(),
            retry_after: None,
        }
    }

    /// An OpenAI-style error `{"error": {"message", "type", "code"}}` with `status`.
    pub fn error(status: u16, code: &str, message: &str) -> Self {
        let body = json!({ "error": { "message": message, "type": code, "code": code } });
        Scripted::status(status, &body.to_string())
    }

    /// A 400 saying the context is too long, as OpenAI words it.
    pub fn context_length_exceeded() -> Self {
        Scripted::error(
            400,
            "context_length_exceeded",
            "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.",
        )
    }

    /// A 429 asking the client to wait `seconds`.
    pub fn rate_limited(seconds: u64) -> Self {
        Scripted::status(
            429,
            r#"{"error":{"message":"Rate limit reached","code":"rate_limit_exceeded"}}"#,
        )
        .with_retry_after(&seconds.to_string())
    }

    /// This answer with a `Retry-After` header (only for [`Scripted::Status`]).
    pub fn with_retry_after(self, value: &str) -> Self {
        match self {
            Scripted::Status { status, body, .. } => Scripted::Status {
                status,
                body,
                retry_after: Some(value.to_owned()),
            },
            other => other,
        }
    }

    /// This answer, sent after `wait`.
    pub fn after(self, wait: Duration) -> Self {
        Scripted::Delay(wait, Box::new(self))
    }

    /// A text answer streamed a word at a time, one word every `every`
    /// (the first after `every` too), then `stop`, usage 10 + 5 and `[DONE]`.
    pub fn streamed(text: &str, every: Duration) -> Self {
        let mut events: Vec<_> = word_deltas(text, "content", every).collect();
        events.extend(closing(
            &json!({ "prompt_tokens": 10, "completion_tokens": 5 }),
            "stop",
        ));
        Scripted::Events(events)
    }

    /// A text answer that streams `text` a word at a time and then says
    /// nothing more for an hour (a server stuck mid-answer).
    pub fn stalled(text: &str) -> Self {
        let mut events: Vec<_> = word_deltas(text, "content", Duration::ZERO).collect();
        events.push((FOREVER, "[DONE]".to_owned()));
        Scripted::Events(events)
    }

    /// A streamed tool call whose arguments never end: after the call's
    /// id and name, deltas of 4 KiB of arguments each, up to `up_to` bytes.
    pub fn endless_arguments(up_to: usize) -> Self {
        let head = json!({ "tool_calls": [{
            "index": 0, "id": "call_flood", "type": "function",
            "function": { "name": "read_file", "arguments": "{\"path\":\"" },
        }]});
        let piece = json!({ "tool_calls": [{
            "index": 0, "function": { "arguments": "x".repeat(4096) },
        }]});
        Scripted::Flood(Flood {
            status: 200,
            events: true,
            head: delta(head, None).to_string(),
            piece: delta(piece, None).to_string(),
            up_to,
        })
    }

    /// A body read whole whose text never ends: the start of a
    /// chat-completions JSON, then 8 KiB of text at a time, up to `up_to` bytes.
    pub fn endless_body(up_to: usize) -> Self {
        Scripted::Flood(Flood {
            status: 200,
            events: false,
            head: r#"{"choices":[{"index":0,"message":{"role":"assistant","content":""#.to_owned(),
            piece: "x".repeat(8192),
            up_to,
        })
    }

    /// `status` with a body that never ends: an error's start, then 8 KiB
    /// of text at a time, up to `up_to` bytes.
    pub fn endless_error(status: u16, up_to: usize) -> Self {
        Scripted::Flood(Flood {
            status,
            events: false,
            head: r#"{"error":{"message":"overloaded "#.to_owned(),
            piece: "x".repeat(8192),
            up_to,
        })
    }

    /// An answer computed from the request body.
    pub fn dynamic(respond: impl Fn(&Value) -> Scripted + Send + Sync + 'static) -> Self {
        Scripted::Dynamic(Arc::new(respond))
    }
}

/// A chat-completions body with a text answer.
pub fn content_body(text: &str, prompt_tokens: u64, completion_tokens: u64) -> Value {
    completion(
        json!({ "role": "assistant", "content": text }),
        "stop",
        prompt_tokens,
        completion_tokens,
    )
}

/// A chat-completions body calling tools, each `(id, name, arguments JSON text)`.
pub fn tool_calls_body(
    calls: &[(&str, &str, &str)],
    prompt_tokens: u64,
    completion_tokens: u64,
) -> Value {
    let calls: Vec<Value> = calls
        .iter()
        .map(|(id, name, arguments)| {
            json!({
                "id": id,
                "type": "function",
                "function": { "name": name, "arguments": arguments },
            })
        })
        .collect();
    completion(
        json!({ "role": "assistant", "content": null, "tool_calls": calls }),
        "tool_calls",
        prompt_tokens,
        completion_tokens,
    )
}

fn completion(message: Value, finish_reason: &str, prompt: u64, completion: u64) -> Value {
    json!({
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": "test-model",
        "choices": [{ "index": 0, "message": message, "finish_reason": finish_reason }],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    })
}

/// `text` a word at a time (each with the spaces after it, so they add up
/// to `text`), each as a chunk whose delta sets `field`, sent after `wait`.
fn word_deltas<'a>(
    text: &'a str,
    field: &'a str,
    wait: Duration,
) -> impl Iterator<Item = (Duration, String)> + 'a {
    text.split_inclusive(' ')
        .map(move |word| (wait, delta(json!({ field: word }), None).to_string()))
}

/// One chunk of a streamed answer: `delta`, and `finish_reason` on the last.
fn delta(delta: Value, finish_reason: Option<&str>) -> Value {
    json!({
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "test-model",
        "choices": [{ "index": 0, "delta": delta, "finish_reason": finish_reason }],
    })
}

/// The end of a streamed answer: its finish reason, its usage, `[DONE]`.
fn closing(usage: &Value, finish_reason: &str) -> [(Duration, String); 3] {
    let usage = json!({
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": usage,
    });
    [
        (
            Duration::ZERO,
            delta(json!({}), Some(finish_reason)).to_string(),
        ),
        (Duration::ZERO, usage.to_string()),
        (Duration::ZERO, "[DONE]".to_owned()),
    ]
}

/// A whole chat-completions body as a server streams it.
fn as_events(body: &Value) -> Vec<(Duration, String)> {
    let choice = &body["choices"][0];
    let message = &choice["message"];
    let mut events = vec![(
        Duration::ZERO,
        delta(json!({ "role": "assistant", "content": "" }), None).to_string(),
    )];
    let now = |chunk: Value| (Duration::ZERO, chunk.to_string());
    for field in ["reasoning_content", "reasoning", "content"] {
        if let Some(text) = message[field].as_str() {
            events.extend(word_deltas(text, field, Duration::ZERO));
        }
    }
    for (index, call) in message["tool_calls"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let head = json!({ "tool_calls": [{
            "index": index, "id": call["id"], "type": "function",
            "function": { "name": call["function"]["name"], "arguments": "" },
        }]});
        events.push(now(delta(head, None)));
        let arguments = match &call["function"]["arguments"] {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        let middle = arguments.len() / 2;
        let middle = (middle..=arguments.len())
            .find(|at| arguments.is_char_boundary(*at))
            .unwrap_or(arguments.len());
        for piece in [&arguments[..middle], &arguments[middle..]] {
            let piece =
                json!({ "tool_calls": [{ "index": index, "function": { "arguments": piece } }] });
            events.push(now(delta(piece, None)));
        }
    }
    let finish = choice["finish_reason"].as_str().unwrap_or("stop");
    let usage = if body["usage"].is_object() {
        body["usage"].clone()
    } else {
        json!({ "prompt_tokens": 0, "completion_tokens": 0 })
    };
    events.extend(closing(&usage, finish));
    events
}

/// What the server saw and what it still has to say.
struct State {
    script: Mutex<VecDeque<Scripted>>,
    fallback: Option<Responder>,
    requests: Mutex<Vec<Value>>,
    authorizations: Mutex<Vec<Option<String>>>,
    /// (answering now, most at once)
    concurrency: Mutex<(usize, usize)>,
    /// `GET` paths answered with a JSON body (`/v1/models`, `/props`).
    pages: Mutex<Vec<(String, Value)>>,
    /// Streamed answers the client hung up on before their end.
    hung_up: Mutex<usize>,
    /// Bytes of [`Scripted::Flood`] answers handed to the connection.
    flooded: Mutex<usize>,
}

/// A running loopback chat-completions server; stops when dropped.
#[derive(Debug)]
pub struct LlmServer {
    addr: SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
}

impl fmt::Debug for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("State")
            .field("scripted_left", &self.script.lock().len())
            .field("requests", &self.requests.lock().len())
            .finish()
    }
}

impl LlmServer {
    /// Answers the n-th request with `responses[n]`; past the end, with a 500.
    pub async fn start(responses: Vec<Scripted>) -> LlmServer {
        Self::start_with(responses, None).await
    }

    /// Answers every request with `respond(request body)`.
    pub async fn answering(
        respond: impl Fn(&Value) -> Scripted + Send + Sync + 'static,
    ) -> LlmServer {
        Self::start_with(Vec::new(), Some(Arc::new(respond))).await
    }

    /// Answers from `responses` first, then every further request with `fallback`.
    pub async fn start_with(responses: Vec<Scripted>, fallback: Option<Responder>) -> LlmServer {
        Self::start_at("127.0.0.1:0".parse().expect("address"), responses, fallback).await
    }

    /// [`LlmServer::start_with`] on `addr` (a server coming back where it was).
    pub async fn start_at(
        addr: SocketAddr,
        responses: Vec<Scripted>,
        fallback: Option<Responder>,
    ) -> LlmServer {
        let listener = TcpListener::bind(addr)
            .await
            .expect("bind the loopback LLM server");
        let addr = listener.local_addr().expect("loopback LLM server address");
        let state = Arc::new(State {
            script: Mutex::new(responses.into()),
            fallback,
            requests: Mutex::default(),
            authorizations: Mutex::default(),
            concurrency: Mutex::default(),
            pages: Mutex::default(),
            hung_up: Mutex::default(),
            flooded: Mutex::default(),
        });
        let task = tokio::spawn(accept(listener, state.clone()));
        LlmServer { addr, state, task }
    }

    /// Answers `path` (any method) with `body` from now on, as a server
    /// describing itself does (`/v1/models`, llama.cpp's `/props`,
    /// Ollama's `/api/show`).
    pub fn serve_page(&self, path: &str, body: Value) {
        let mut pages = self.state.pages.lock();
        pages.retain(|(known, _)| known != path);
        pages.push((path.to_owned(), body));
    }

    /// `http://127.0.0.1:PORT/v1`, the base URL a provider should use.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// An OpenAI-compatible provider talking to this server: a 10 s request
    /// timeout and no retries, so a scripted failure shows at once.
    pub fn provider(&self) -> hivekernel_agents::llm::OpenAiProvider {
        hivekernel_agents::llm::OpenAiProvider::new(hivekernel_agents::llm::OpenAiSettings {
            base_url: self.base_url(),
            request_timeout: Duration::from_secs(10),
            max_retries: 0,
            ..Default::default()
        })
        .unwrap()
    }

    /// Every request body received so far, in arrival order (non-JSON as a string).
    pub fn requests(&self) -> Vec<Value> {
        self.state.requests.lock().clone()
    }

    /// How many requests arrived so far.
    pub fn request_count(&self) -> usize {
        self.state.requests.lock().len()
    }

    /// The `authorization` header of every request, in arrival order.
    pub fn authorizations(&self) -> Vec<Option<String>> {
        self.state.authorizations.lock().clone()
    }

    /// The `authorization` header of the latest request.
    pub fn authorization(&self) -> Option<String> {
        self.state.authorizations.lock().last().cloned().flatten()
    }

    /// The most requests the server was answering at the same time.
    pub fn max_concurrent(&self) -> usize {
        self.state.concurrency.lock().1
    }

    /// Requests being answered right now.
    pub fn answering_now(&self) -> usize {
        self.state.concurrency.lock().0
    }

    /// Streamed answers the client closed the connection of before they ended.
    pub fn hung_up(&self) -> usize {
        *self.state.hung_up.lock()
    }

    /// Bytes of [`Scripted::Flood`] answers the server got out so far:
    /// what the client read, plus what the sockets and channels between
    /// held when it hung up.
    pub fn flooded(&self) -> usize {
        *self.state.flooded.lock()
    }
}

impl Drop for LlmServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accepts connections until aborted; dropping the set aborts every connection with it.
async fn accept(listener: TcpListener, state: Arc<State>) {
    let mut connections = JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of file descriptors or similar: back off instead of spinning.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        // Events go out as they are written, as a streaming server sends
        // them (with Nagle's algorithm, each small write after the first
        // would wait for the client's delayed ACK).
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(handle(state, request).await) }
            });
            // A client that hangs up mid-answer (a timeout test) is not an error here.
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        while connections.try_join_next().is_some() {}
    }
}

type Body = BoxBody<Bytes, Infallible>;

async fn handle(state: Arc<State>, request: Request<Incoming>) -> Response<Body> {
    if request.uri().path() != "/v1/chat/completions" {
        let pages = state.pages.lock();
        if let Some((_, body)) = pages.iter().find(|(path, _)| path == request.uri().path()) {
            return respond(200, body.to_string(), None);
        }
    }
    if request.method() != hyper::Method::POST || request.uri().path() != "/v1/chat/completions" {
        let body = format!("no route for {} {}", request.method(), request.uri().path());
        return respond(404, body, None);
    }
    let authorization = request
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let bytes = match request.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(e) => return respond(400, format!("cannot read the body: {e}"), None),
    };
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    let answer = {
        // Record and pick the answer under one lock so the n-th request gets the n-th answer.
        let mut script = state.script.lock();
        let mut requests = state.requests.lock();
        requests.push(body.clone());
        state.authorizations.lock().push(authorization);
        let number = requests.len();
        script
            .pop_front()
            .or_else(|| state.fallback.as_ref().map(|f| f(&body)))
            .unwrap_or_else(|| {
                Scripted::status(
                    500,
                    &format!("llm_server: script exhausted at request {number}"),
                )
            })
    };
    let answering = Answering::new(state);
    render(answer, &body, answering).await
}

/// Counts a request as being answered while it lives (even if the client
/// hangs up); a streamed answer holds it until its stream ends.
struct Answering(Arc<State>);

impl Answering {
    fn new(state: Arc<State>) -> Self {
        {
            let mut concurrency = state.concurrency.lock();
            concurrency.0 += 1;
            concurrency.1 = concurrency.1.max(concurrency.0);
        }
        Answering(state)
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.concurrency.lock().0 -= 1;
    }
}

async fn render(mut answer: Scripted, request: &Value, answering: Answering) -> Response<Body> {
    let streaming = request["stream"] == true;
    loop {
        answer = match answer {
            Scripted::Json(body) if streaming => Scripted::Events(as_events(&body)),
            Scripted::Json(body) => return respond(200, body.to_string(), None),
            Scripted::Events(events) => return stream(events, answering),
            Scripted::Flood(flood) => return flood_out(flood, answering),
            Scripted::Status {
                status,
                body,
                retry_after,
            } => return respond(status, body, retry_after),
            Scripted::Delay(wait, inner) => {
                tokio::time::sleep(wait).await;
                *inner
            }
            Scripted::Dynamic(respond) => respond(request),
        };
    }
}

/// Sends `events` as server-sent events, each after its wait, holding
/// `answering` until the stream ends or the client hangs up (counted).
fn stream(events: Vec<(Duration, String)>, answering: Answering) -> Response<Body> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
    tokio::spawn(async move {
        for (wait, data) in events {
            // A zero wait is no wait: a timer would round it up to its tick.
            let pause = async {
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
            };
            let sent = tokio::select! {
                () = pause => {
                    tx.send(Ok(Frame::data(Bytes::from(format!("data: {data}\n\n"))))).await.is_ok()
                }
                () = tx.closed() => false,
            };
            if !sent {
                *answering.0.hung_up.lock() += 1;
                return;
            }
        }
        drop(answering);
    });
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    Response::builder()
        .status(StatusCode::OK)
        .header(hyper::header::CONTENT_TYPE, "text/event-stream")
        .body(BodyExt::boxed(body))
        .expect("a valid response")
}

/// Sends `flood` as fast as the client reads it, holding `answering`
/// until the client hangs up (counted) or `up_to` bytes went out.
fn flood_out(flood: Flood, answering: Answering) -> Response<Body> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
    let part = |text: &str| match flood.events {
        true => Bytes::from(format!("data: {text}\n\n")),
        false => Bytes::from(text.to_owned()),
    };
    let (head, piece) = (part(&flood.head), part(&flood.piece));
    let content_type = match flood.events {
        true => "text/event-stream",
        false => "application/json",
    };
    tokio::spawn(async move {
        let mut next = head;
        let mut sent = 0;
        while sent < flood.up_to {
            let bytes = next.len();
            if tx.send(Ok(Frame::data(next))).await.is_err() {
                *answering.0.hung_up.lock() += 1;
                return;
            }
            sent += bytes;
            *answering.0.flooded.lock() += bytes;
            next = piece.clone();
        }
        drop(answering);
    });
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    Response::builder()
        .status(StatusCode::from_u16(flood.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(hyper::header::CONTENT_TYPE, content_type)
        .body(BodyExt::boxed(body))
        .expect("a valid response")
}

fn respond(status: u16, body: String, retry_after: Option<String>) -> Response<Body> {
    let mut builder = Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(hyper::header::CONTENT_TYPE, "application/json");
    if let Some(value) = retry_after {
        builder = builder.header(hyper::header::RETRY_AFTER, value);
    }
    builder
        .body(BodyExt::boxed(Full::new(Bytes::from(body))))
        .expect("a valid response")
}

/// Answers a chat-completions request body as the offline `scripted` provider
/// would (see its rules), so the real HTTP path drives the real agent loop.
pub fn scripted_answer(body: &Value) -> Scripted {
    let request = request_of(body);
    let answer = hivekernel_agents::llm::ScriptedProvider::new().answer(&request);
    let usage = answer.usage;
    let calls: Vec<(&str, &str, &str)> = answer
        .message
        .tool_calls
        .iter()
        .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
        .collect();
    if calls.is_empty() {
        Scripted::Json(content_body(
            &answer.message.content,
            usage.prompt_tokens,
            usage.completion_tokens,
        ))
    } else {
        Scripted::Json(tool_calls_body(
            &calls,
            usage.prompt_tokens,
            usage.completion_tokens,
        ))
    }
}

/// The chat request a request body stands for (model, messages, tools).
pub fn request_of(body: &Value) -> hivekernel_agents::llm::ChatRequest {
    use hivekernel_agents::llm::{ChatMessage, ChatRequest, ChatRole, ToolCall, ToolSchema};
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let messages = body["messages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|m| {
            let role = match m["role"].as_str() {
                Some("system") => ChatRole::System,
                Some("assistant") => ChatRole::Assistant,
                Some("tool") => ChatRole::Tool,
                _ => ChatRole::User,
            };
            let calls = m["tool_calls"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(|c| {
                    ToolCall::new(
                        text(&c["id"]),
                        text(&c["function"]["name"]),
                        text(&c["function"]["arguments"]),
                    )
                })
                .collect();
            ChatMessage {
                role,
                content: text(&m["content"]),
                tool_calls: calls,
                tool_call_id: m["tool_call_id"].as_str().map(str::to_owned),
                reasoning: None,
            }
        })
        .collect();
    let tools = body["tools"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|t| ToolSchema {
            name: text(&t["function"]["name"]),
            description: text(&t["function"]["description"]),
            parameters: t["function"]["parameters"].clone(),
        })
        .collect();
    ChatRequest {
        tools,
        ..ChatRequest::new(text(&body["model"]), messages)
    }
}

/// The text of the last message of a request body.
pub fn last_message(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// The text of the system message of a request body.
pub fn system_message(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|m| m.first())
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// The contents of the `tool` messages in a recorded chat request, in order:
/// the tool results the model was shown.
pub fn tool_results(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect()
}
