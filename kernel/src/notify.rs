//! The inbox's webhook (`kernel.notify`): each new inbox request is POSTed
//! as JSON to a URL, so a person learns of it without watching the inbox.
//!
//! It never holds up the kernel: a request is queued (a bounded queue; a
//! full one drops the call) and one task owned by the kernel sends the
//! queue in order, each call with its own timeout and a bounded number of
//! retries (backoff doubling from half a second; a 4xx other than 408 and
//! 429 is not retried). A call that still fails, or is dropped, is a
//! `notify_failed` event of the asking process. Addresses follow
//! `web_fetch`'s rules ([`Guard`]): loopback and private networks only
//! when the config allows them; redirects are not followed.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use hivekernel_agents::tools::web::Guard;
use reqwest::Url;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Calls waiting to be sent before new ones are dropped.
const QUEUE: usize = 256;
/// The first retry's delay; each further one doubles it.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);

/// Where and how to call (`kernel.notify`, checked).
#[derive(Clone, PartialEq, Eq)]
pub struct NotifySettings {
    /// The URL (`url`, or the variable `url_env` names).
    pub url: Url,
    /// Headers sent with each call, their values read from the environment.
    pub headers: Vec<(String, String)>,
    /// Whether loopback and private addresses may be called.
    pub allow_private_networks: bool,
    /// Internal addresses that may be called even so.
    pub allow_addresses: Vec<IpAddr>,
    /// Each attempt's timeout.
    pub timeout: Duration,
    /// Attempts after the first.
    pub retries: u32,
}

impl fmt::Debug for NotifySettings {
    // The URL's path and query and the header values may be secrets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NotifySettings")
            .field("host", &self.url.host_str())
            .field(
                "headers",
                &self
                    .headers
                    .iter()
                    .map(|(name, _)| name)
                    .collect::<Vec<_>>(),
            )
            .field("allow_private_networks", &self.allow_private_networks)
            .field("allow_addresses", &self.allow_addresses)
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .finish()
    }
}

impl NotifySettings {
    /// The address rules calls follow.
    pub fn guard(&self) -> Guard {
        Guard::new(self.allow_private_networks, &self.allow_addresses)
    }

    /// Where calls go, for logs: scheme, host and port, never the path.
    pub fn shown(&self) -> String {
        format!(
            "{}://{}{}",
            self.url.scheme(),
            self.url.host_str().unwrap_or_default(),
            self.url.port().map(|p| format!(":{p}")).unwrap_or_default()
        )
    }
}

/// A call that failed for good: the request it was about, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failed {
    /// The inbox request.
    pub(crate) request: u64,
    /// Its process.
    pub(crate) pid: hivekernel_agents::Pid,
    /// Why, naming the last attempt's problem.
    pub(crate) error: String,
    /// Attempts made.
    pub(crate) attempts: u32,
}

/// One call to make.
struct Call {
    request: u64,
    pid: hivekernel_agents::Pid,
    body: Value,
}

/// The webhook's sender: a queue and the task that empties it.
#[derive(Debug)]
pub(crate) struct Notifier {
    queue: mpsc::Sender<Call>,
}

impl Notifier {
    /// Starts the sending task on `tracker`, ending with `shutdown`;
    /// `failed` hears of every call that failed for good.
    pub(crate) fn start(
        settings: NotifySettings,
        tracker: &TaskTracker,
        shutdown: CancellationToken,
        failed: impl Fn(Failed) + Send + Sync + 'static,
    ) -> Result<Notifier, String> {
        let client = settings.guard().client(settings.timeout)?;
        let (queue, mut calls) = mpsc::channel::<Call>(QUEUE);
        let settings = Arc::new(settings);
        tracker.spawn(async move {
            loop {
                let call = tokio::select! {
                    () = shutdown.cancelled() => return,
                    call = calls.recv() => match call {
                        Some(call) => call,
                        None => return,
                    },
                };
                let outcome = tokio::select! {
                    () = shutdown.cancelled() => return,
                    outcome = send(&client, &settings, &call.body) => outcome,
                };
                if let Err((error, attempts)) = outcome {
                    tracing::warn!(request = call.request, pid = %call.pid, %error, attempts, "inbox webhook failed");
                    failed(Failed {
                        request: call.request,
                        pid: call.pid,
                        error,
                        attempts,
                    });
                }
            }
        });
        Ok(Notifier { queue })
    }

    /// Queues a call about `request` of `pid` with `body`; when the queue
    /// is full, the call is dropped and the answer says so.
    pub(crate) fn notify(
        &self,
        request: u64,
        pid: hivekernel_agents::Pid,
        body: Value,
    ) -> Result<(), Failed> {
        self.queue
            .try_send(Call { request, pid, body })
            .map_err(|err| Failed {
                request,
                pid,
                error: match err {
                    mpsc::error::TrySendError::Full(_) => {
                        format!("{QUEUE} webhook calls are already waiting; this one was dropped")
                    }
                    mpsc::error::TrySendError::Closed(_) => "the webhook sender has stopped".into(),
                },
                attempts: 0,
            })
    }
}

/// Sends one call, retrying; the last error and the attempts made when
/// every attempt failed.
async fn send(
    client: &reqwest::Client,
    settings: &NotifySettings,
    body: &Value,
) -> Result<(), (String, u32)> {
    let mut attempts = 0;
    let mut delay = FIRST_BACKOFF;
    loop {
        attempts += 1;
        let mut request = client.post(settings.url.clone()).json(body);
        for (name, value) in &settings.headers {
            request = request.header(name, value);
        }
        let (error, retry) = match request.send().await {
            Ok(response) if response.status().is_success() => return Ok(()),
            Ok(response) => {
                let status = response.status();
                let retry = !status.is_client_error()
                    || status == reqwest::StatusCode::REQUEST_TIMEOUT
                    || status == reqwest::StatusCode::TOO_MANY_REQUESTS;
                (
                    format!("{} answered HTTP {status}", settings.shown()),
                    retry,
                )
            }
            Err(err) => (
                format!("cannot call {}: {}", settings.shown(), chain(&err)),
                true,
            ),
        };
        if !retry || attempts > settings.retries {
            return Err((error, attempts));
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(30));
    }
}

/// An error and its causes, without the URL reqwest puts in its message
/// (its path may be a secret).
fn chain(err: &reqwest::Error) -> String {
    let mut text = if err.is_timeout() {
        "timed out".to_owned()
    } else if err.is_connect() {
        "cannot connect".to_owned()
    } else {
        "request failed".to_owned()
    };
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
