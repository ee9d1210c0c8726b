//! A client for any OpenAI-compatible chat-completions endpoint (OpenAI,
//! OpenRouter, Ollama, vLLM, llama.cpp server).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use tokio::time::Instant;

use super::catalogue::{self, Catalogue};
use super::stream::{Assembly, Events, Said};
use super::{
    Admission, ChatRequest, ChatResponse, Limits, LlmError, OverLimit, Provider, Retry, Watch,
    retry, wire,
};

/// Bytes of an error answer's body read: enough for any error a server
/// words, and its start is all an error keeps.
const MAX_ERROR_BODY_READ: usize = 64 << 10;

/// Where and how to reach an OpenAI-compatible endpoint.
#[derive(Clone, PartialEq, Eq)]
pub struct OpenAiSettings {
    /// API root, e.g. `https://api.openai.com/v1`; requests go to `{base_url}/chat/completions`.
    pub base_url: String,
    /// Sent as `Authorization: Bearer ...` when set (must not be empty); never logged.
    pub api_key: Option<String>,
    /// Logical model name -> provider model id; names not in the map are sent as they are.
    pub models: BTreeMap<String, String>,
    /// One model id every logical name is sent as, whatever `models` says.
    pub serve_all: Option<String>,
    /// Ask for answers as server-sent events (`stream: true`), read as
    /// they arrive; without it, each answer comes whole.
    pub stream: bool,
    /// Longest wait from sending a streamed request to its first event.
    pub first_token_timeout: Duration,
    /// Longest silence between two events of a streamed answer.
    pub idle_timeout: Duration,
    /// Cap on one HTTP attempt, from connecting to the end of the answer,
    /// streamed or not (time spent queued for admission does not count).
    pub request_timeout: Duration,
    /// Retries after the first attempt, on 429, other 5xx, transport
    /// errors and timeouts.
    pub max_retries: u32,
    /// How long a server that refuses connections or answers 502/503
    /// (starting, loading its model) is waited for, retrying with backoff,
    /// besides `max_retries`.
    pub unavailable_wait: Duration,
    /// Cap on requests in flight across every clone of the provider.
    pub max_in_flight: usize,
    /// Send roles strictly alternating from the start (Mistral-family chat
    /// templates). Without it, a 400 naming that rule switches this
    /// provider to it, and the request is sent again once.
    pub strict_roles: bool,
    /// `max_tokens` of a request that names none.
    pub max_completion_tokens: u32,
    /// Sent as `parallel_tool_calls` with every request that offers tools;
    /// `None` sends nothing (the server's default); `false` asks for at
    /// most one call per answer.
    pub parallel_tool_calls: Option<bool>,
    /// Caps on an answer's bytes and tool calls and on a request's tool
    /// definitions; a call past one fails, and is not tried again.
    pub limits: Limits,
}

impl Default for OpenAiSettings {
    fn default() -> Self {
        OpenAiSettings {
            base_url: "https://api.openai.com/v1".into(),
            api_key: None,
            models: BTreeMap::new(),
            serve_all: None,
            stream: true,
            first_token_timeout: Duration::from_secs(120),
            idle_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(600),
            max_retries: 3,
            unavailable_wait: Duration::from_secs(60),
            max_in_flight: 16,
            strict_roles: false,
            max_completion_tokens: 4096,
            parallel_tool_calls: None,
            limits: Limits::default(),
        }
    }
}

impl fmt::Debug for OpenAiSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiSettings")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("models", &self.models)
            .field("serve_all", &self.serve_all)
            .field("stream", &self.stream)
            .field("first_token_timeout", &self.first_token_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("max_retries", &self.max_retries)
            .field("unavailable_wait", &self.unavailable_wait)
            .field("max_in_flight", &self.max_in_flight)
            .field("strict_roles", &self.strict_roles)
            .field("max_completion_tokens", &self.max_completion_tokens)
            .field("parallel_tool_calls", &self.parallel_tool_calls)
            .field("limits", &self.limits)
            .finish()
    }
}

/// An OpenAI-compatible provider; clones share the HTTP client and the admission cap.
#[derive(Clone)]
pub struct OpenAiProvider {
    inner: Arc<Inner>,
}

impl fmt::Debug for OpenAiProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

struct Inner {
    base_url: String,
    endpoint: String,
    api_key: Option<String>,
    models: BTreeMap<String, String>,
    serve_all: Option<String>,
    stream: bool,
    first_token_timeout: Duration,
    idle_timeout: Duration,
    request_timeout: Duration,
    max_retries: u32,
    unavailable_wait: Duration,
    /// Whether the server wants strictly alternating roles (set, never
    /// cleared, when it refuses anything else).
    strict: AtomicBool,
    max_completion_tokens: u32,
    parallel_tool_calls: Option<bool>,
    limits: Limits,
    client: reqwest::Client,
    admission: Admission,
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiProvider")
            .field("endpoint", &self.endpoint)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("models", &self.models)
            .field("stream", &self.stream)
            .field("request_timeout", &self.request_timeout)
            .field("max_retries", &self.max_retries)
            .field("admission", &self.admission)
            .finish()
    }
}

/// How one HTTP attempt failed.
struct Failure {
    error: LlmError,
    /// What another attempt may do.
    cause: Cause,
    /// The wait the provider asked for.
    retry_after: Option<Duration>,
}

/// Why an attempt failed, as far as trying again goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    /// Another attempt would fail the same way (4xx, an unreadable answer).
    Fatal,
    /// Worth a bounded number of retries (429, 5xx, a broken connection,
    /// a timeout).
    Transient,
    /// The server is not there yet (connection refused, 502, 503): worth
    /// waiting for, up to `unavailable_wait`.
    Unavailable,
}

impl Failure {
    fn fatal(error: LlmError) -> Self {
        Failure {
            error,
            cause: Cause::Fatal,
            retry_after: None,
        }
    }

    fn transient(error: LlmError, retry_after: Option<Duration>) -> Self {
        Failure {
            error,
            cause: Cause::Transient,
            retry_after,
        }
    }

    fn unavailable(error: LlmError, retry_after: Option<Duration>) -> Self {
        Failure {
            error,
            cause: Cause::Unavailable,
            retry_after,
        }
    }

    /// A transport error: refused connections are a server not there yet.
    fn transport(url: &str, error: &reqwest::Error) -> Self {
        let described = LlmError::Transport(describe_transport(url, error));
        if error.is_connect() {
            Failure::unavailable(described, None)
        } else {
            Failure::transient(described, None)
        }
    }
}

impl OpenAiProvider {
    /// A provider with its own admission cap of `settings.max_in_flight`.
    pub fn new(settings: OpenAiSettings) -> Result<Self, LlmError> {
        let admission = Admission::new(settings.max_in_flight)?;
        Self::with_admission(settings, admission)
    }

    /// A provider that shares `admission` (e.g. with providers for other
    /// endpoints); `settings.max_in_flight` is not used.
    pub fn with_admission(
        settings: OpenAiSettings,
        admission: Admission,
    ) -> Result<Self, LlmError> {
        let base_url = settings.base_url.trim().trim_end_matches('/').to_owned();
        let url = reqwest::Url::parse(&base_url)
            .map_err(|e| LlmError::Config(format!("base_url {base_url:?} is not a URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(LlmError::Config(format!(
                "base_url {base_url:?} must be an http:// or https:// URL with a host"
            )));
        }
        for (name, limit) in [
            ("first_token_timeout", settings.first_token_timeout),
            ("idle_timeout", settings.idle_timeout),
            ("request_timeout", settings.request_timeout),
        ] {
            if limit.is_zero() {
                return Err(LlmError::Config(format!("{name} must be positive")));
            }
        }
        if let Some(key) = &settings.api_key
            && (key.is_empty() || key.chars().any(|c| c.is_control()))
        {
            return Err(LlmError::Config(
                "api_key must be non-empty and contain no control characters".into(),
            ));
        }
        let client = crate::http::client_builder()
            .user_agent(concat!("hivekernel/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| LlmError::Config(format!("cannot build the HTTP client: {e}")))?;
        Ok(OpenAiProvider {
            inner: Arc::new(Inner {
                endpoint: format!("{base_url}/chat/completions"),
                base_url,
                api_key: settings.api_key,
                models: settings.models,
                serve_all: settings.serve_all,
                stream: settings.stream,
                first_token_timeout: settings.first_token_timeout,
                idle_timeout: settings.idle_timeout,
                request_timeout: settings.request_timeout,
                max_retries: settings.max_retries,
                unavailable_wait: settings.unavailable_wait,
                strict: AtomicBool::new(settings.strict_roles),
                max_completion_tokens: settings.max_completion_tokens.max(1),
                parallel_tool_calls: settings.parallel_tool_calls,
                limits: settings.limits,
                client,
                admission,
            }),
        })
    }

    /// The API root requests go under (no trailing slash).
    pub fn base_url(&self) -> &str {
        &self.inner.base_url
    }

    /// The provider model id that `logical` is sent as.
    pub fn model_id<'a>(&'a self, logical: &'a str) -> &'a str {
        let inner = &*self.inner;
        match &inner.serve_all {
            Some(all) => all,
            None => inner.models.get(logical).map_or(logical, String::as_str),
        }
    }

    /// What the server says it serves: its model list and, where it
    /// tells, context windows (see [`catalogue`](super::catalogue)). An
    /// error when it lists none (the endpoint is missing, refused or not a
    /// list).
    pub async fn catalogue(&self) -> Result<Catalogue, LlmError> {
        let inner = &*self.inner;
        let get = |url: String| self.ask(inner.client.get(url));
        let url = format!("{}/models", inner.base_url);
        let body = get(url.clone()).await.map_err(|e| match e {
            Asked::Failed(e) => LlmError::Transport(describe_transport(&url, &e)),
            Asked::TooLong => LlmError::Transport(format!(
                "{url} answered with more than {} bytes",
                catalogue::ASK_MAX_BYTES
            )),
        })?;
        let mut listed = catalogue::parse_list(&body).ok_or_else(|| {
            LlmError::Transport(format!("{url} did not answer with a model list"))
        })?;
        // llama.cpp serves one model; its slot's context is the window.
        if let [model] = listed.models.as_mut_slice()
            && model.context_tokens.is_none()
        {
            let props = format!("{}/props", catalogue::root(&inner.base_url));
            if let Ok(body) = get(props).await
                && let Some(props) = catalogue::parse_props(&body)
            {
                model.context_tokens = props.n_ctx;
                model.template_tools = props.template_tools;
            }
        }
        Ok(listed)
    }

    /// What Ollama says of `id`'s context, when the server is Ollama
    /// (it answers `GET /api/version`) and knows the model; else `None`.
    pub async fn ollama_context(&self, id: &str) -> Option<catalogue::OllamaContext> {
        let inner = &*self.inner;
        let root = catalogue::root(&inner.base_url);
        let version = self
            .ask(inner.client.get(format!("{root}/api/version")))
            .await
            .ok()?;
        serde_json::from_slice::<serde_json::Value>(&version)
            .ok()?
            .get("version")?;
        let show = inner
            .client
            .post(format!("{root}/api/show"))
            .json(&serde_json::json!({ "model": id }));
        catalogue::parse_show(&self.ask(show).await.ok()?)
    }

    /// The body of a question about what the server serves: within
    /// [`catalogue::ASK_TIMEOUT`] and [`catalogue::ASK_MAX_BYTES`], with
    /// the API key, an error status an error.
    async fn ask(&self, request: reqwest::RequestBuilder) -> Result<Vec<u8>, Asked> {
        let mut request = request.timeout(catalogue::ASK_TIMEOUT);
        if let Some(key) = &self.inner.api_key {
            request = request.bearer_auth(key);
        }
        let mut response = request
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(Asked::Failed)?;
        match read_up_to(&mut response, catalogue::ASK_MAX_BYTES).await {
            Ok((body, true)) => Ok(body),
            Ok((_, false)) => Err(Asked::TooLong),
            Err(e) => Err(Asked::Failed(e)),
        }
    }

    /// The admission cap this provider's requests queue on.
    pub fn admission(&self) -> &Admission {
        &self.inner.admission
    }

    /// One HTTP attempt, holding an admission slot from before sending
    /// until the answer is read, telling `watch` of streamed text.
    async fn attempt(
        &self,
        body: &[u8],
        model_id: &str,
        watch: &dyn Watch,
    ) -> Result<ChatResponse, Failure> {
        let inner = &*self.inner;
        let _slot = inner.admission.admit().await.map_err(Failure::fatal)?;
        let started = Instant::now();
        let cap = started + inner.request_timeout;
        let mut request = inner
            .client
            .post(&inner.endpoint)
            .header(CONTENT_TYPE, "application/json")
            .body(body.to_vec());
        if inner.stream {
            request = request.header(ACCEPT, "text/event-stream");
        }
        if let Some(key) = &inner.api_key {
            request = request.bearer_auth(key);
        }
        let limit = |error: &str| Failure::transient(LlmError::Timeout(error.to_owned()), None);
        let capped = || {
            limit(&format!(
                "the answer took longer than {} s",
                inner.request_timeout.as_secs_f64()
            ))
        };
        // Headers come before the first token: both within its limit.
        let first_by = match inner.stream {
            true => (started + inner.first_token_timeout).min(cap),
            false => cap,
        };
        let no_first_token = || match first_by < cap {
            true => limit(&format!(
                "no first token within {} s",
                inner.first_token_timeout.as_secs_f64()
            )),
            false => capped(),
        };
        let mut response = match tokio::time::timeout_at(first_by, request.send()).await {
            Err(_elapsed) => return Err(no_first_token()),
            Ok(Err(e)) => return Err(Failure::transport(&inner.endpoint, &e)),
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        let retry_after = retry::retry_after(response.headers());
        let streamed = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.starts_with("text/event-stream"));
        let limits = &inner.limits;
        if !status.is_success() || !streamed {
            // An error, or a server that answers whole whatever was asked:
            // read up to a limit, never whatever length it goes on for.
            let over = || Failure::fatal(OverLimit::AnswerBytes(limits.answer_bytes).into());
            let most = match status.is_success() {
                true => limits.answer_bytes,
                false => MAX_ERROR_BODY_READ,
            };
            if status.is_success()
                && response
                    .content_length()
                    .is_some_and(|length| length > most as u64)
            {
                return Err(over());
            }
            let (bytes, whole) =
                match tokio::time::timeout_at(cap, read_up_to(&mut response, most)).await {
                    Err(_elapsed) => return Err(capped()),
                    Ok(Err(e)) => return Err(Failure::transport(&inner.endpoint, &e)),
                    Ok(Ok(read)) => read,
                };
            if !status.is_success() {
                return Err(classify(status, retry_after, &bytes, model_id));
            }
            if !whole {
                return Err(over());
            }
            let answer = wire::decode(&bytes).map_err(Failure::fatal)?;
            limits
                .check_answer(&answer)
                .map_err(|over| Failure::fatal(over.into()))?;
            return Ok(answer);
        }
        let mut events = Events::default();
        let mut answer = Assembly::new(*limits);
        let mut deadline = first_by;
        let mut waiting_first = true;
        loop {
            let chunk = match tokio::time::timeout_at(deadline, response.chunk()).await {
                Err(_elapsed) if waiting_first => return Err(no_first_token()),
                Err(_elapsed) if deadline >= cap => return Err(capped()),
                Err(_elapsed) => {
                    return Err(limit(&format!(
                        "the answer stopped for {} s after {} bytes",
                        inner.idle_timeout.as_secs_f64(),
                        answer.text().len()
                    )));
                }
                Ok(Err(e)) => return Err(Failure::transport(&inner.endpoint, &e)),
                Ok(Ok(chunk)) => chunk,
            };
            let (datas, ended) = match chunk {
                Some(bytes) => (events.push(&bytes).map_err(Failure::fatal)?, false),
                None => (
                    std::mem::take(&mut events).finish().into_iter().collect(),
                    true,
                ),
            };
            for data in datas {
                waiting_first = false;
                let added = answer.apply(&data).map_err(|said| match said {
                    Said::Fatal(error) => Failure::fatal(error),
                    Said::Error(said) => said_in_stream(said),
                })?;
                if !added.reasoning.is_empty() {
                    watch.streamed(&added.reasoning, true);
                }
                if !added.text.is_empty() {
                    watch.streamed(&added.text, false);
                }
                if answer.is_done() {
                    return answer.finish().map_err(Failure::fatal);
                }
            }
            if ended {
                if answer.is_finished() {
                    return answer.finish().map_err(Failure::fatal);
                }
                let error = LlmError::Transport(format!(
                    "the stream from {} ended before the answer did (after {} bytes)",
                    inner.endpoint,
                    answer.text().len()
                ));
                return Err(Failure::transient(error, None));
            }
            if !waiting_first {
                deadline = (Instant::now() + inner.idle_timeout).min(cap);
            }
        }
    }
}

/// Up to `most` bytes of `response`'s body, read as it comes, and whether
/// that is all of it (a body that goes on is left unread).
async fn read_up_to(
    response: &mut reqwest::Response,
    most: usize,
) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = most.saturating_sub(body.len());
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return Ok((body, false));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, true))
}

/// How asking the server what it serves failed.
enum Asked {
    /// The request, or its status.
    Failed(reqwest::Error),
    /// The answer went on past [`catalogue::ASK_MAX_BYTES`].
    TooLong,
}

/// An error a server sent inside a stream (the status was 200 already).
fn said_in_stream(said: wire::ProviderError) -> Failure {
    if wire::is_context_length(said.code.as_deref(), &said.message) {
        return Failure::fatal(LlmError::ContextLength(said.message));
    }
    let error = LlmError::InvalidResponse(format!(
        "the provider reported an error mid-answer: {}",
        said.message
    ));
    Failure::transient(error, None)
}

/// Turns an error status into a failure, deciding whether it is worth retrying.
fn classify(
    status: StatusCode,
    retry_after: Option<Duration>,
    body: &[u8],
    model_id: &str,
) -> Failure {
    let said = wire::ProviderError::parse(body);
    let http = || LlmError::Http {
        status: status.as_u16(),
        body: wire::truncate(&String::from_utf8_lossy(body)),
    };
    if status == StatusCode::TOO_MANY_REQUESTS {
        return Failure::transient(LlmError::RateLimited { retry_after }, retry_after);
    }
    // llama.cpp answers 500 "Context size has been exceeded." when parallel
    // slots share one cache: shortening helps, repeating does not.
    if (matches!(status.as_u16(), 400 | 413 | 422) || status.is_server_error())
        && wire::is_context_length(said.code.as_deref(), &said.message)
    {
        return Failure::fatal(LlmError::ContextLength(said.message));
    }
    // 503 "Loading model" (llama.cpp), or a proxy whose server is restarting.
    if matches!(status.as_u16(), 502 | 503) {
        return Failure::unavailable(http(), retry_after);
    }
    if status.is_server_error() {
        return Failure::transient(http(), retry_after);
    }
    if matches!(status.as_u16(), 400 | 404)
        && wire::is_unknown_model(said.code.as_deref(), &said.message)
    {
        return Failure::fatal(LlmError::UnknownModel(model_id.to_owned()));
    }
    Failure::fatal(http())
}

#[async_trait]
impl Provider for OpenAiProvider {
    fn name(&self) -> &str {
        "openai"
    }

    async fn call(
        &self,
        request: &ChatRequest,
        watch: &dyn Watch,
    ) -> Result<ChatResponse, LlmError> {
        let model_id = self.model_id(&request.model);
        if model_id.is_empty() {
            return Err(LlmError::UnknownModel(request.model.clone()));
        }
        let inner = &*self.inner;
        inner.limits.check_request(request)?;
        let shape = |strict| wire::Shape {
            strict,
            max_tokens: inner.max_completion_tokens,
            stream: inner.stream,
            parallel_tool_calls: inner.parallel_tool_calls,
        };
        let mut strict = inner.strict.load(Ordering::Relaxed);
        let mut body = wire::encode(request, model_id, shape(strict))?;
        let started = Instant::now();
        let mut attempt = 0;
        let mut retries = 0;
        loop {
            attempt += 1;
            let began = Instant::now();
            let failure = match self.attempt(&body, model_id, watch).await {
                Ok(response) => return Ok(response),
                Err(failure) => failure,
            };
            let took = began.elapsed();
            if !strict
                && let LlmError::Http {
                    status: 400,
                    body: said,
                } = &failure.error
                && wire::is_role_rule(said)
            {
                // Once for this provider: every later request is sent so.
                tracing::info!(
                    provider = "openai",
                    endpoint = %inner.endpoint,
                    model = model_id,
                    "the server's chat template wants strictly alternating roles; sending them so"
                );
                inner.strict.store(true, Ordering::Relaxed);
                strict = true;
                body = wire::encode(request, model_id, shape(true))?;
                watch.retrying(&Retry {
                    attempt,
                    error: &failure.error,
                    took,
                    wait: Duration::ZERO,
                });
                continue;
            }
            let wait = retry::delay(attempt - 1, failure.retry_after);
            // Waiting for a server that is not there yet does not use up
            // the retries, until `unavailable_wait` has passed.
            let waits_out = failure.cause == Cause::Unavailable
                && started.elapsed() + wait <= inner.unavailable_wait;
            let retries_left = failure.cause != Cause::Fatal && retries < inner.max_retries;
            if !waits_out && !retries_left {
                return Err(failure.error);
            }
            tracing::warn!(
                provider = "openai",
                endpoint = %inner.endpoint,
                model = model_id,
                attempt,
                max_retries = inner.max_retries,
                waited_s = started.elapsed().as_secs(),
                wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                error = %failure.error,
                "{}",
                match waits_out {
                    true => "LLM server unavailable; waiting for it",
                    false => "LLM request failed; retrying",
                }
            );
            watch.retrying(&Retry {
                attempt,
                error: &failure.error,
                took,
                wait,
            });
            tokio::time::sleep(wait).await;
            retries += u32::from(!waits_out);
        }
    }
}

/// `<message> (<cause>: <cause>...) calling <url>`; the URL holds no secret.
fn describe_transport(url: &str, error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    if let Some(at) = text.find(" for url (") {
        text.truncate(at);
    }
    let mut source = std::error::Error::source(error);
    let mut causes = Vec::new();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) && !causes.contains(&cause_text) {
            causes.push(cause_text);
        }
        source = cause.source();
    }
    if !causes.is_empty() {
        text = format!("{text} ({})", causes.join(": "));
    }
    format!("{text} calling {url}")
}
