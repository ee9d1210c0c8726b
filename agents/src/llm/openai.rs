//! A client for any OpenAI-compatible chat-completions endpoint (OpenAI,
//! OpenRouter, Ollama, vLLM, llama.cpp server).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::StatusCode;
use reqwest::header::CONTENT_TYPE;

use super::catalogue::{self, Catalogue};
use super::{Admission, ChatRequest, ChatResponse, LlmError, Provider, retry, wire};

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
    /// Limit on one HTTP attempt, from connecting to the end of the body
    /// (time spent queued for admission does not count).
    pub request_timeout: Duration,
    /// Retries after the first attempt, on 429, 5xx, transport errors and timeouts.
    pub max_retries: u32,
    /// Cap on requests in flight across every clone of the provider.
    pub max_in_flight: usize,
    /// Send roles strictly alternating from the start (Mistral-family chat
    /// templates). Without it, a 400 naming that rule switches this
    /// provider to it, and the request is sent again once.
    pub strict_roles: bool,
    /// `max_tokens` of a request that names none.
    pub max_completion_tokens: u32,
}

impl Default for OpenAiSettings {
    fn default() -> Self {
        OpenAiSettings {
            base_url: "https://api.openai.com/v1".into(),
            api_key: None,
            models: BTreeMap::new(),
            serve_all: None,
            request_timeout: Duration::from_secs(120),
            max_retries: 3,
            max_in_flight: 16,
            strict_roles: false,
            max_completion_tokens: 4096,
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
            .field("request_timeout", &self.request_timeout)
            .field("max_retries", &self.max_retries)
            .field("max_in_flight", &self.max_in_flight)
            .field("strict_roles", &self.strict_roles)
            .field("max_completion_tokens", &self.max_completion_tokens)
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
    request_timeout: Duration,
    max_retries: u32,
    /// Whether the server wants strictly alternating roles (set, never
    /// cleared, when it refuses anything else).
    strict: std::sync::atomic::AtomicBool,
    max_completion_tokens: u32,
    client: reqwest::Client,
    admission: Admission,
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiProvider")
            .field("endpoint", &self.endpoint)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("models", &self.models)
            .field("request_timeout", &self.request_timeout)
            .field("max_retries", &self.max_retries)
            .field("admission", &self.admission)
            .finish()
    }
}

/// How one HTTP attempt failed.
struct Failure {
    error: LlmError,
    /// Worth another attempt (429, 5xx, transport, timeout).
    retryable: bool,
    /// The wait the provider asked for.
    retry_after: Option<Duration>,
}

impl Failure {
    fn fatal(error: LlmError) -> Self {
        Failure {
            error,
            retryable: false,
            retry_after: None,
        }
    }

    fn transient(error: LlmError, retry_after: Option<Duration>) -> Self {
        Failure {
            error,
            retryable: true,
            retry_after,
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
        if settings.request_timeout.is_zero() {
            return Err(LlmError::Config("request_timeout must be positive".into()));
        }
        if let Some(key) = &settings.api_key
            && (key.is_empty() || key.chars().any(|c| c.is_control()))
        {
            return Err(LlmError::Config(
                "api_key must be non-empty and contain no control characters".into(),
            ));
        }
        let client = reqwest::Client::builder()
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
                request_timeout: settings.request_timeout,
                max_retries: settings.max_retries,
                strict: std::sync::atomic::AtomicBool::new(settings.strict_roles),
                max_completion_tokens: settings.max_completion_tokens.max(1),
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
        let get = |url: String| {
            let mut request = inner.client.get(url).timeout(catalogue::ASK_TIMEOUT);
            if let Some(key) = &inner.api_key {
                request = request.bearer_auth(key);
            }
            async move {
                let response = request.send().await?.error_for_status()?;
                response.bytes().await
            }
        };
        let url = format!("{}/models", inner.base_url);
        let body = get(url.clone())
            .await
            .map_err(|e| LlmError::Transport(describe_transport(&url, &e)))?;
        let mut listed = catalogue::parse_list(&body).ok_or_else(|| {
            LlmError::Transport(format!("{url} did not answer with a model list"))
        })?;
        // llama.cpp serves one model; its slot's context is the window.
        if listed.models.len() == 1 && listed.models[0].context_tokens.is_none() {
            let props = format!("{}/props", catalogue::root(&inner.base_url));
            if let Ok(body) = get(props).await {
                listed.models[0].context_tokens = catalogue::parse_props(&body);
            }
        }
        Ok(listed)
    }

    /// The admission cap this provider's requests queue on.
    pub fn admission(&self) -> &Admission {
        &self.inner.admission
    }

    /// One HTTP attempt, holding an admission slot from before sending until the body is read.
    async fn attempt(&self, body: &[u8], model_id: &str) -> Result<ChatResponse, Failure> {
        let inner = &*self.inner;
        let _slot = inner.admission.admit().await.map_err(Failure::fatal)?;
        let mut request = inner
            .client
            .post(&inner.endpoint)
            .header(CONTENT_TYPE, "application/json")
            .body(body.to_vec());
        if let Some(key) = &inner.api_key {
            request = request.bearer_auth(key);
        }
        let exchange = async {
            let response = request.send().await?;
            let status = response.status();
            let retry_after = retry::retry_after(response.headers());
            let bytes = response.bytes().await?;
            Ok::<_, reqwest::Error>((status, retry_after, bytes))
        };
        let (status, retry_after, bytes) =
            match tokio::time::timeout(inner.request_timeout, exchange).await {
                Err(_elapsed) => return Err(Failure::transient(LlmError::Timeout, None)),
                Ok(Err(e)) if e.is_timeout() => {
                    return Err(Failure::transient(LlmError::Timeout, None));
                }
                Ok(Err(e)) => {
                    // Name the endpoint and the root cause ("connection
                    // refused"), not just reqwest's outermost message.
                    let error = LlmError::Transport(describe_transport(&inner.endpoint, &e));
                    return Err(Failure::transient(error, None));
                }
                Ok(Ok(exchange)) => exchange,
            };
        if status.is_success() {
            return wire::decode(&bytes).map_err(Failure::fatal);
        }
        Err(classify(status, retry_after, &bytes, model_id))
    }
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

    async fn chat(&self, request: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let model_id = self.model_id(&request.model);
        if model_id.is_empty() {
            return Err(LlmError::UnknownModel(request.model.clone()));
        }
        let inner = &*self.inner;
        let shape = |strict| wire::Shape {
            strict,
            max_tokens: inner.max_completion_tokens,
        };
        let mut strict = inner.strict.load(std::sync::atomic::Ordering::Relaxed);
        let mut body = wire::encode(request, model_id, shape(strict))?;
        let mut retry = 0;
        loop {
            let failure = match self.attempt(&body, model_id).await {
                Ok(response) => return Ok(response),
                Err(failure) => failure,
            };
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
                inner
                    .strict
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                strict = true;
                body = wire::encode(request, model_id, shape(true))?;
                continue;
            }
            if !failure.retryable || retry >= self.inner.max_retries {
                return Err(failure.error);
            }
            let wait = retry::delay(retry, failure.retry_after);
            tracing::warn!(
                provider = "openai",
                endpoint = %self.inner.endpoint,
                model = model_id,
                retry = retry + 1,
                max_retries = self.inner.max_retries,
                wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                error = %failure.error,
                "LLM request failed; retrying"
            );
            tokio::time::sleep(wait).await;
            retry += 1;
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
