//! One supervised MCP server: its state, and the task that keeps it running.
//!
//! The supervisor task owns the connection. It starts the server (the
//! handshake and the first `tools/list` within `startup_timeout`), then
//! waits for one of: the connection ending on its own (a crash, an exit,
//! a lost HTTP session), a call that went past its deadline (it then sends
//! a `ping`, and a server that does not answer it within the startup
//! timeout is taken as hung), the server saying its tool list changed (it
//! lists them again), the admin asking for a restart (`mcp restart`), or
//! the kernel stopping. After a failure the restart policy decides, with
//! the same intensity rule and backoff as a process's; past the intensity
//! the server stays `failed`, and an event says so, until the admin asks
//! for a restart. State changes take a short lock, never held across an
//! `.await`.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hivekernel_agents::{McpTools, Pid};
use parking_lot::Mutex;
use rmcp::RoleClient;
use rmcp::service::{Peer, ServiceError};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::catalog::Catalog;
use super::connect::{Connection, Listener};
use crate::config::{McpServerSpec, McpTransport};
use crate::event::EventKind;
use crate::events::unix_ms;

/// Where a server is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// `enabled: false` in the config: never started.
    Disabled,
    /// Being started: the handshake and the first tool list.
    Starting,
    /// Answering calls.
    Ready,
    /// Failed; waiting out its backoff before the next start.
    Restarting,
    /// Failed for good: past its restart intensity, or its policy restarts
    /// nothing. It stays so until the admin restarts it, or the kernel restarts.
    Failed,
    /// The kernel is stopping, or has stopped it.
    Stopped,
}

impl Phase {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Phase::Disabled => "disabled",
            Phase::Starting => "starting",
            Phase::Ready => "ready",
            Phase::Restarting => "restarting",
            Phase::Failed => "failed",
            Phase::Stopped => "stopped",
        }
    }
}

/// What the supervisor reports: an `mcp_server` event, on PID 1.
pub(crate) type Report = Arc<dyn Fn(Pid, EventKind) + Send + Sync>;

/// A server as `mcp ls` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// Its name in `mcp_servers`.
    pub name: String,
    /// `stdio` or `http`.
    pub transport: &'static str,
    /// The program it runs, or the URL it is reached at.
    pub target: String,
    /// `disabled`, `starting`, `ready`, `restarting`, `failed` or `stopped`.
    pub state: &'static str,
    /// Restarts since the kernel started.
    pub restarts: u32,
    /// Tools it offers to agents.
    pub tools: usize,
    /// Tools it lists that agents are not offered.
    pub left_out: usize,
    /// Why it last failed.
    pub last_error: Option<String>,
    /// The OS process of a stdio server, while it runs.
    pub os_pid: Option<u32>,
    /// When it entered its state, in ms since the Unix epoch.
    pub since_unix_ms: u64,
    /// The name and version the server gave in the handshake.
    pub server: Option<String>,
}

/// One server and its state.
pub(crate) struct Server {
    pub(crate) name: Arc<str>,
    pub(crate) spec: McpServerSpec,
    state: Mutex<State>,
    /// Bumped at each change of phase, for callers waiting for `ready`.
    changed: watch::Sender<u64>,
    /// A call went past its deadline: the supervisor checks the server.
    suspect: Notify,
    /// The server said its tool list changed.
    tools_changed: Arc<Notify>,
    /// How many restarts the admin has asked for (`mcp restart`); the
    /// supervisor acts on each value it has not handled yet.
    asks: watch::Sender<u64>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("name", &self.name)
            .field("phase", &self.state.lock().phase)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct State {
    phase: Phase,
    peer: Option<Peer<RoleClient>>,
    catalog: Catalog,
    restarts: u32,
    /// When the restarts in the intensity window were decided.
    recent: VecDeque<Instant>,
    last_error: Option<String>,
    os_pid: Option<u32>,
    since_unix_ms: u64,
    server: Option<String>,
    /// The last of `asks` the supervisor has acted on: set together with
    /// the phase the restart starts in, so any later state is the new start's.
    handled: u64,
}

/// Why a call could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unready {
    /// Not started, failed for good, or stopped: no point waiting.
    Down(String),
    /// Still starting, or restarting, after waiting as long as allowed.
    NotYet(String),
}

impl Server {
    pub(crate) fn new(spec: McpServerSpec) -> Server {
        let phase = if spec.enabled {
            Phase::Starting
        } else {
            Phase::Disabled
        };
        Server {
            name: Arc::from(spec.name.as_str()),
            spec,
            state: Mutex::new(State {
                phase,
                peer: None,
                catalog: Catalog::default(),
                restarts: 0,
                recent: VecDeque::new(),
                last_error: None,
                os_pid: None,
                since_unix_ms: unix_ms(SystemTime::now()),
                server: None,
                handled: 0,
            }),
            changed: watch::Sender::new(0),
            suspect: Notify::new(),
            tools_changed: Arc::new(Notify::new()),
            asks: watch::Sender::new(0),
        }
    }

    /// Restarts the server now, as the admin asks: a ready one is closed
    /// and started again, a restarting one skips its backoff, a failed one
    /// is started again with its intensity window cleared. Not counted
    /// against the intensity. Waits up to its startup timeout for the new
    /// start to be ready, and says how it ended.
    pub(crate) async fn restart(&self) -> Result<(), Unready> {
        let mut changes = self.changed.subscribe();
        if let Some(refused) = self.out_of_service(self.state.lock().phase) {
            return Err(refused);
        }
        let mut mine = 0;
        self.asks.send_modify(|asks| {
            *asks += 1;
            mine = *asks;
        });
        // A start takes at most the startup timeout, after the old
        // connection's close (at most a few seconds).
        let deadline = Instant::now() + self.spec.startup_timeout + CLOSE_GRACE;
        loop {
            {
                let state = self.state.lock();
                match state.phase {
                    Phase::Ready if state.handled >= mine => return Ok(()),
                    Phase::Failed if state.handled >= mine => {
                        return Err(Unready::Down(format!(
                            "MCP server {} failed again{}",
                            self.name,
                            because(state.last_error.as_deref())
                        )));
                    }
                    phase => {
                        if let Some(refused) = self.out_of_service(phase) {
                            return Err(refused);
                        }
                    }
                }
            }
            let waited = tokio::time::timeout_at(deadline, changes.changed()).await;
            if !matches!(waited, Ok(Ok(()))) {
                let state = self.state.lock();
                return Err(Unready::NotYet(format!(
                    "MCP server {} is {} and not ready yet{}",
                    self.name,
                    self.state_name(state.phase),
                    because(state.last_error.as_deref())
                )));
            }
        }
    }

    pub(crate) fn info(&self) -> ServerInfo {
        let state = self.state.lock();
        let (transport, target) = match &self.spec.transport {
            McpTransport::Stdio { command, .. } => {
                ("stdio", command.first().cloned().unwrap_or_default())
            }
            McpTransport::Http { url, .. } => ("http", shown_url(url)),
        };
        ServerInfo {
            name: self.spec.name.clone(),
            transport,
            target,
            state: self.state_name(state.phase),
            restarts: state.restarts,
            tools: state.catalog.tools.len(),
            left_out: state.catalog.left_out.len(),
            last_error: state.last_error.clone(),
            os_pid: state.os_pid,
            since_unix_ms: state.since_unix_ms,
            server: state.server.clone(),
        }
    }

    /// `text` (a reason from a failure, which may quote a request or
    /// a URL) without the server's secrets: its header and env values
    /// become `***`, its URL the form `mcp ls` shows; cut to [`MAX_REASON`].
    pub(crate) fn redact(&self, mut text: String) -> String {
        let secrets: Vec<&String> = match &self.spec.transport {
            McpTransport::Http { url, headers } => {
                let shown = shown_url(url);
                if *url != shown {
                    text = text.replace(url.as_str(), &shown);
                }
                headers.values().collect()
            }
            McpTransport::Stdio { env, .. } => env.values().collect(),
        };
        for secret in secrets {
            // Short values are too likely to be ordinary words.
            if secret.len() >= 4 {
                text = text.replace(secret.as_str(), "***");
            }
        }
        hivekernel_agents::text::cut(text, MAX_REASON)
    }

    /// What `phase` is called for this server: an HTTP server waiting to
    /// be reached again is `unavailable` (nothing of it is restarted).
    fn state_name(&self, phase: Phase) -> &'static str {
        match (&self.spec.transport, phase) {
            (McpTransport::Http { .. }, Phase::Restarting) => "unavailable",
            _ => phase.as_str(),
        }
    }

    /// The tools it offers and those it leaves out, as they stand.
    pub(crate) fn catalog(&self) -> Catalog {
        self.state.lock().catalog.clone()
    }

    /// Why a server in `phase` takes neither calls nor restarts: it is
    /// disabled, or stopped with the kernel.
    fn out_of_service(&self, phase: Phase) -> Option<Unready> {
        match phase {
            Phase::Disabled => Some(Unready::Down(format!(
                "MCP server {} is disabled (mcp_servers.{}.enabled)",
                self.name, self.name
            ))),
            Phase::Stopped => Some(Unready::Down(format!(
                "MCP server {} is stopped",
                self.name
            ))),
            Phase::Starting | Phase::Ready | Phase::Restarting | Phase::Failed => None,
        }
    }

    /// Its peer and tools once it is ready: at once if it is, else after
    /// waiting up to `wait` while it starts for the first time, or, with
    /// `through_restart`, while a stdio server restarts.
    pub(crate) async fn ready(
        &self,
        wait: Duration,
        through_restart: bool,
    ) -> Result<(Peer<RoleClient>, McpTools), Unready> {
        let stdio = matches!(self.spec.transport, McpTransport::Stdio { .. });
        let mut changes = self.changed.subscribe();
        let deadline = Instant::now() + wait;
        loop {
            {
                let state = self.state.lock();
                match state.phase {
                    Phase::Ready => {
                        if let Some(peer) = &state.peer {
                            return Ok((peer.clone(), state.catalog.tools.clone()));
                        }
                    }
                    // Worth waiting for: a first start. A server that has
                    // failed is not kept waiting on, or every model call of
                    // every agent selecting it would stall.
                    Phase::Starting if state.restarts == 0 => {}
                    // A call the model has made waits out a crash of a
                    // local server (its restart is ours, and quick) within
                    // its own deadline; an unreachable remote one is not
                    // waited on.
                    Phase::Starting | Phase::Restarting if through_restart && stdio => {}
                    Phase::Starting | Phase::Restarting => {
                        return Err(Unready::NotYet(format!(
                            "MCP server {} is {}{}",
                            self.name,
                            self.state_name(state.phase),
                            because(state.last_error.as_deref())
                        )));
                    }
                    Phase::Disabled | Phase::Stopped => {
                        if let Some(refused) = self.out_of_service(state.phase) {
                            return Err(refused);
                        }
                    }
                    Phase::Failed => {
                        return Err(Unready::Down(format!(
                            "MCP server {} has failed for good{}",
                            self.name,
                            because(state.last_error.as_deref())
                        )));
                    }
                }
            }
            let waited = tokio::time::timeout_at(deadline, changes.changed()).await;
            if !matches!(waited, Ok(Ok(()))) {
                let state = self.state.lock();
                return Err(Unready::NotYet(format!(
                    "MCP server {} is {} (not ready after waiting {} ms){}",
                    self.name,
                    self.state_name(state.phase),
                    wait.as_millis(),
                    because(state.last_error.as_deref())
                )));
            }
        }
    }

    /// A call went past its deadline or could not be sent; the supervisor
    /// checks the server with a `ping`.
    pub(crate) fn suspect(&self) {
        self.suspect.notify_one();
    }

    fn set(&self, update: impl FnOnce(&mut State)) {
        {
            let mut state = self.state.lock();
            let before = state.phase;
            update(&mut state);
            if state.phase != before {
                state.since_unix_ms = unix_ms(SystemTime::now());
            }
        }
        self.changed.send_modify(|n| *n += 1);
    }

    /// Keeps the server running until `stop`; the supervisor task.
    pub(crate) async fn supervise(
        self: Arc<Self>,
        stop: CancellationToken,
        logs: Option<PathBuf>,
        report: Report,
    ) {
        let emit =
            |state: &'static str, reason: Option<String>, attempt: u32, delay: Option<Duration>| {
                report(
                    Pid::KERNEL,
                    EventKind::McpServer {
                        server: self.name.to_string(),
                        state: state.to_owned(),
                        reason,
                        attempt,
                        delay_ms: delay.map(|d| d.as_millis() as u64),
                    },
                );
            };
        let mut asks = self.asks.subscribe();
        if *asks.borrow() > 0 {
            // Asked before this task ran.
            asks.mark_changed();
        }
        loop {
            let attempt = self.state.lock().restarts;
            self.set(|s| s.phase = Phase::Starting);
            let (reason, clean) = self.run_once(&stop, &logs, &emit, attempt, &mut asks).await;
            let reason = self.redact(reason);
            if stop.is_cancelled() {
                break;
            }
            if self.act_on_ask(&mut asks, false, &emit) {
                continue;
            }
            tracing::warn!(server = %self.name, %reason, "MCP server failed");
            let restart = self.spec.restart;
            if !restart.policy.restarts_after(!clean) {
                self.set(|s| {
                    s.phase = Phase::Failed;
                    s.last_error = Some(reason.clone());
                });
                emit(
                    "failed",
                    Some(format!(
                        "{reason}; restart policy {} restarts no more",
                        restart.policy
                    )),
                    attempt,
                    None,
                );
                if self.until_asked(&stop, &emit, &mut asks).await {
                    continue;
                }
                break;
            }
            let admitted = {
                let mut state = self.state.lock();
                restart.admit(&mut state.recent, Instant::now())
            };
            let delay = match admitted {
                Ok(delay) => delay,
                // A remote server is not ours to give up on: it is retried
                // at the longest backoff until it answers again.
                Err(_) if matches!(self.spec.transport, McpTransport::Http { .. }) => {
                    Duration::from_millis(restart.backoff_ms[1])
                }
                Err(recent) => {
                    let why = format!(
                        "{reason}; restart intensity exceeded: {recent} restarts in {}s",
                        restart.within_seconds
                    );
                    tracing::error!(server = %self.name, %why, "MCP server failed for good");
                    self.set(|s| {
                        s.phase = Phase::Failed;
                        s.last_error = Some(reason.clone());
                    });
                    emit("failed", Some(why), attempt, None);
                    if self.until_asked(&stop, &emit, &mut asks).await {
                        continue;
                    }
                    break;
                }
            };
            self.set(|s| {
                s.phase = Phase::Restarting;
                s.last_error = Some(reason.clone());
                s.restarts = s.restarts.saturating_add(1);
            });
            emit(
                self.state_name(Phase::Restarting),
                Some(reason),
                attempt + 1,
                Some(delay),
            );
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(delay) => {}
                Ok(()) = asks.changed() => {
                    self.act_on_ask(&mut asks, false, &emit);
                }
            }
        }
        self.set(|s| {
            s.phase = Phase::Stopped;
            s.peer = None;
            s.os_pid = None;
        });
    }

    /// Acts on a restart the admin asked for and nothing has handled yet:
    /// marks it handled and the server starting, in one step, so whoever
    /// waits on the ask sees only the new start's states after it. After a
    /// failure for good (`failed`), the intensity window starts afresh.
    fn act_on_ask(
        &self,
        asks: &mut watch::Receiver<u64>,
        failed: bool,
        emit: &(impl Fn(&'static str, Option<String>, u32, Option<Duration>) + Sync),
    ) -> bool {
        let asked = *asks.borrow_and_update();
        let attempt = {
            let mut state = self.state.lock();
            if asked <= state.handled {
                return false;
            }
            state.handled = asked;
            state.phase = Phase::Starting;
            state.since_unix_ms = unix_ms(SystemTime::now());
            state.restarts = state.restarts.saturating_add(1);
            if failed {
                state.recent.clear();
            }
            state.restarts
        };
        self.changed.send_modify(|n| *n += 1);
        tracing::info!(server = %self.name, "MCP server restarted by the admin");
        emit(
            self.state_name(Phase::Restarting),
            Some(ASKED.to_owned()),
            attempt,
            Some(Duration::ZERO),
        );
        true
    }

    /// A failed server waits for the admin's restart (true) or the
    /// kernel's stop (false).
    async fn until_asked(
        &self,
        stop: &CancellationToken,
        emit: &(impl Fn(&'static str, Option<String>, u32, Option<Duration>) + Sync),
        asks: &mut watch::Receiver<u64>,
    ) -> bool {
        loop {
            if self.act_on_ask(asks, true, emit) {
                return true;
            }
            tokio::select! {
                () = stop.cancelled() => return false,
                changed = asks.changed() => {
                    if changed.is_err() {
                        return false;
                    }
                }
            }
        }
    }

    /// One life of the server, from its start to its end; says why it
    /// ended and whether that was clean. The connection is closed on every
    /// path out, the stop included (dropping it kills its group).
    async fn run_once(
        &self,
        stop: &CancellationToken,
        logs: &Option<PathBuf>,
        emit: &(impl Fn(&'static str, Option<String>, u32, Option<Duration>) + Sync),
        attempt: u32,
        asks: &mut watch::Receiver<u64>,
    ) -> (String, bool) {
        let listener = Listener {
            tools_changed: self.tools_changed.clone(),
        };
        let startup = self.spec.startup_timeout;
        let opening = tokio::time::timeout(startup, async {
            let connection = Connection::open(&self.spec, logs.as_deref(), listener).await?;
            let tools = list_tools(connection.peer()).await;
            match tools {
                Ok(tools) => Ok((connection, tools)),
                Err(err) => {
                    connection.close().await;
                    Err(err)
                }
            }
        });
        // Dropping a half-open connection kills its group: nothing to wait for.
        let opened = tokio::select! {
            () = stop.cancelled() => return ("the kernel is stopping".into(), true),
            Ok(()) = asks.changed() => return (ASKED.into(), true),
            opened = opening => opened,
        };
        let (mut connection, tools) = match opened {
            Ok(Ok(opened)) => opened,
            Ok(Err(why)) => return (why, false),
            Err(_) => {
                return (
                    format!(
                        "no answer to the handshake within {} s (startup_timeout_seconds)",
                        startup.as_secs()
                    ),
                    false,
                );
            }
        };
        let catalog = Catalog::new(&self.name, tools, &self.spec.tools);
        let server = connection
            .peer()
            .peer_info()
            .and_then(|info| info.server_info.clone())
            .map(|info| format!("{} {}", info.name, info.version));
        let count = catalog.tools.len();
        self.set(|s| {
            s.phase = Phase::Ready;
            s.peer = Some(connection.peer().clone());
            s.catalog = catalog;
            s.os_pid = connection.os_pid();
            s.server = server;
        });
        tracing::info!(server = %self.name, tools = count, "MCP server ready");
        emit("ready", None, attempt, None);
        let outcome = loop {
            tokio::select! {
                () = stop.cancelled() => break ("the kernel is stopping".into(), true),
                Ok(()) = asks.changed() => break (ASKED.into(), true),
                ended = connection.ended() => break ended,
                () = self.suspect.notified() => {
                    let peer = connection.peer().clone();
                    let ping = tokio::time::timeout(
                        startup,
                        peer.send_request(rmcp::model::ClientRequest::PingRequest(Default::default())),
                    );
                    // A stop or an end is not kept waiting behind a hung server.
                    let answer = tokio::select! {
                        () = stop.cancelled() => break ("the kernel is stopping".into(), true),
                        Ok(()) = asks.changed() => break (ASKED.into(), true),
                        ended = connection.ended() => break ended,
                        answer = ping => answer,
                    };
                    match answer {
                        // Any answer, an error too, says it is alive.
                        Ok(Ok(_) | Err(ServiceError::McpError(_))) => {}
                        Ok(Err(err)) => break (format!("unreachable: {err}"), false),
                        Err(_) => break (format!(
                            "hung: a call failed and a ping got no answer within {} s",
                            startup.as_secs()
                        ), false),
                    }
                }
                () = self.tools_changed.notified() => {
                    let peer = connection.peer().clone();
                    let listing = tokio::time::timeout(startup, list_tools(&peer));
                    let listed = tokio::select! {
                        () = stop.cancelled() => break ("the kernel is stopping".into(), true),
                        Ok(()) = asks.changed() => break (ASKED.into(), true),
                        ended = connection.ended() => break ended,
                        listed = listing => listed,
                    };
                    match listed {
                        Ok(Ok(tools)) => {
                            let catalog = Catalog::new(&self.name, tools, &self.spec.tools);
                            let count = catalog.tools.len();
                            let changed = self.state.lock().catalog.differs(&catalog);
                            self.set(|s| s.catalog = catalog);
                            // A server may announce changes that change nothing.
                            if changed {
                                tracing::info!(server = %self.name, tools = count, "MCP server's tool list changed");
                                emit("tools_changed", None, attempt, None);
                            }
                        }
                        Ok(Err(err)) => tracing::warn!(server = %self.name, error = %self.redact(err), "cannot list the changed tools; keeping the old list"),
                        Err(_) => break (format!(
                            "hung: tools/list got no answer within {} s after the list changed",
                            startup.as_secs()
                        ), false),
                    }
                }
            }
        };
        self.set(|s| {
            s.phase = if stop.is_cancelled() {
                Phase::Stopped
            } else {
                Phase::Restarting
            };
            s.peer = None;
            s.os_pid = None;
        });
        connection.close().await;
        outcome
    }
}

/// Pages of `tools/list` read before a server counts as broken.
const MAX_TOOL_PAGES: usize = 64;
/// Tools listed before a server counts as broken.
const MAX_TOOLS: usize = 4096;

/// Every page of the server's `tools/list`, within [`MAX_TOOL_PAGES`] and
/// [`MAX_TOOLS`]: a server that pages on without end is a failure, not a
/// way to fill the kernel's memory within the startup timeout.
async fn list_tools(peer: &Peer<RoleClient>) -> Result<Vec<rmcp::model::Tool>, String> {
    let mut tools = Vec::new();
    let mut cursor = None;
    for _ in 0..MAX_TOOL_PAGES {
        let params = rmcp::model::PaginatedRequestParams::default().with_cursor(cursor);
        let page = peer
            .list_tools(Some(params))
            .await
            .map_err(|err| format!("tools/list failed: {err}"))?;
        tools.extend(page.tools);
        if tools.len() > MAX_TOOLS {
            return Err(format!(
                "tools/list gave more than {MAX_TOOLS} tools; the kernel takes at most that many"
            ));
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(tools),
        }
    }
    Err(format!(
        "tools/list went on for more than {MAX_TOOL_PAGES} pages; the kernel reads at most that many"
    ))
}

/// The reason of a restart the admin asked for.
const ASKED: &str = "restart asked by the admin (mcp restart)";

/// How long closing a connection may take: stdin closed, SIGTERM after
/// 0.5 s, SIGKILL 2 s later.
const CLOSE_GRACE: Duration = Duration::from_secs(3);

/// Longest failure reason kept, shown and reported.
pub(crate) const MAX_REASON: usize = 1024;

/// A URL as it may be shown: without its query and fragment (which may
/// hold a token) and without user information (`user:password@`).
fn shown_url(url: &str) -> String {
    let url = url.split(['?', '#']).next().unwrap_or_default();
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    format!("{scheme}://{host}{path}")
}

fn because(error: Option<&str>) -> String {
    error.map_or_else(String::new, |error| format!(": {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_shown_without_what_may_hold_a_secret() {
        assert_eq!(
            shown_url("https://user:s3cret@mcp.example.com:8443/mcp?key=abc#x"),
            "https://mcp.example.com:8443/mcp"
        );
        assert_eq!(
            shown_url("http://127.0.0.1:3001/mcp"),
            "http://127.0.0.1:3001/mcp"
        );
        assert_eq!(shown_url("https://host"), "https://host");
    }

    #[test]
    fn reasons_lose_header_values_and_are_cut() {
        let mut spec = crate::config::McpServerSpec {
            name: "docs".into(),
            transport: McpTransport::Http {
                url: "https://u:pw@h/mcp?token=T0KEN".into(),
                headers: [("Authorization".to_owned(), "Bearer s3cret-value".to_owned())].into(),
            },
            call_timeout: Duration::from_secs(1),
            startup_timeout: Duration::from_secs(1),
            restart: hivekernel_agents::RestartSpec::default(),
            tools: Default::default(),
            enabled: true,
            max_output_bytes: 4096,
        };
        let server = Server::new(spec.clone());
        let reason = server
            .redact("POST https://u:pw@h/mcp?token=T0KEN failed; sent Bearer s3cret-value".into());
        assert_eq!(reason, "POST https://h/mcp failed; sent ***");
        spec.name = "long".into();
        let long = Server::new(spec).redact("x".repeat(5000));
        assert!(long.len() <= MAX_REASON, "{}", long.len());
    }
}
