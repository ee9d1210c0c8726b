//! One connection to an MCP server: a child process over stdio, or a
//! streamable HTTP session; the handshake; and stopping it so nothing is
//! left behind.
//!
//! A stdio server runs in a process group of its own, its stdin and stdout
//! are the kernel's pipes (JSON-RPC, each message at most
//! `max_output_bytes`: a longer line is dropped, never buffered), and its
//! stderr goes to `<data_dir>/logs/mcp-<name>.log`, kept to
//! [`LOG_BYTES`] (then moved to `.log.1`, replacing the one before), so a
//! server that floods its output costs neither memory nor the disk.
//! Stopping it closes its stdin (the protocol's way to ask a stdio server
//! to exit), then sends SIGTERM to the group, then SIGKILL after
//! [`STOP_GRACE`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use rmcp::model::{ClientCapabilities, ClientConfig, Implementation};
use rmcp::service::{NotificationContext, Peer, QuitReason, RunningServiceCancellationToken};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, RoleClient, ServiceExt as _};
use rustix::process::Signal;
use tokio::io::AsyncReadExt as _;
use tokio::process::{Child, Command};
use tokio::sync::Notify;

use crate::config::{McpServerSpec, McpTransport};

/// Bytes of a server's stderr log before it is moved to `.log.1`.
pub(crate) const LOG_BYTES: u64 = 8 << 20;

/// From SIGTERM to SIGKILL when a stdio server is stopped.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(2);

/// What the kernel tells a server about itself, and what it hears from it.
#[derive(Debug, Clone)]
pub(super) struct Listener {
    /// Notified when the server says its tool list changed.
    pub(super) tools_changed: Arc<Notify>,
}

impl ClientHandler for Listener {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("hivekernel", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.tools_changed.notify_one();
    }
}

/// A live connection: the handle requests go through, and what ends it.
pub(super) struct Connection {
    peer: Peer<RoleClient>,
    cancel: Option<RunningServiceCancellationToken>,
    /// Ends when the session ends: the peer closed it, or it was cancelled.
    session: futures::future::Fuse<BoxFuture<'static, String>>,
    child: Option<ServerProcess>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("os_pid", &self.os_pid())
            .finish_non_exhaustive()
    }
}

/// A stdio server's OS process and its log writer.
struct ServerProcess {
    child: Child,
    group: Option<rustix::process::Pid>,
    /// Copies stderr to the log; aborted when the connection is dropped.
    log: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // Whatever path dropped it, nothing of the group outlives it.
        signal(self.group, Signal::KILL);
        if let Some(log) = self.log.take() {
            log.abort();
        }
    }
}

fn signal(group: Option<rustix::process::Pid>, sig: Signal) {
    if let Some(group) = group {
        // ESRCH: the group is already gone, which is the goal.
        let _ = rustix::process::kill_process_group(group, sig);
    }
}

impl Connection {
    /// Starts the server and performs the MCP handshake. The caller bounds
    /// the time; dropping the future leaves no process behind.
    pub(super) async fn open(
        spec: &McpServerSpec,
        logs: Option<&Path>,
        listener: Listener,
    ) -> Result<Connection, String> {
        match &spec.transport {
            McpTransport::Stdio { command, env, cwd } => {
                let mut child = start(spec, command, env, cwd.as_deref(), logs)?;
                let stdout = child.child.stdout.take();
                let stdin = child.child.stdin.take();
                let (Some(stdout), Some(stdin)) = (stdout, stdin) else {
                    return Err("its stdin or stdout could not be opened".into());
                };
                let transport = AsyncRwTransport::new_client(stdout, stdin)
                    .with_max_line_length(spec.max_output_bytes);
                let service = listener
                    .serve(transport)
                    .await
                    .map_err(|err| format!("MCP handshake failed: {err}"))?;
                Ok(Connection::running(service, Some(child)))
            }
            McpTransport::Http { url, headers } => {
                let mut custom = HashMap::new();
                for (name, value) in headers {
                    let name = http::HeaderName::try_from(name.as_str())
                        .map_err(|err| format!("header {name}: {err}"))?;
                    let value = http::HeaderValue::try_from(value.as_str())
                        .map_err(|err| format!("header {name}: {err}"))?;
                    custom.insert(name, value);
                }
                let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                    .custom_headers(custom)
                    .max_sse_event_size(spec.max_output_bytes)
                    .max_json_response_size(spec.max_output_bytes);
                let transport = StreamableHttpClientTransport::from_config(config);
                let service = listener
                    .serve(transport)
                    .await
                    .map_err(|err| format!("MCP handshake failed: {err}"))?;
                Ok(Connection::running(service, None))
            }
        }
    }

    fn running(
        service: rmcp::service::RunningService<RoleClient, Listener>,
        child: Option<ServerProcess>,
    ) -> Connection {
        let peer = service.peer().clone();
        let cancel = Some(service.cancellation_token());
        let session = async move {
            match service.waiting().await {
                Ok(QuitReason::Cancelled) => "the session was closed".to_owned(),
                Ok(QuitReason::Closed) => "the server closed the connection".to_owned(),
                Ok(reason) => format!("the session ended: {reason:?}"),
                Err(err) => format!("the session ended: {err}"),
            }
        }
        .boxed()
        .fuse();
        Connection {
            peer,
            cancel,
            session,
            child,
        }
    }

    /// The handle requests go through.
    pub(super) fn peer(&self) -> &Peer<RoleClient> {
        &self.peer
    }

    /// The OS process of a stdio server.
    pub(super) fn os_pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|child| child.child.id())
    }

    /// Waits until the connection ends without being asked to, and says
    /// why, and whether that was a clean exit (a stdio server that exited
    /// with status 0).
    pub(super) async fn ended(&mut self) -> (String, bool) {
        let Some(process) = self.child.as_mut() else {
            return ((&mut self.session).await, false);
        };
        tokio::select! {
            status = process.child.wait() => match status {
                Ok(status) => {
                    let (code, reason) = crate::exec::describe(status);
                    (reason, code == 0)
                }
                Err(err) => (format!("cannot wait for its OS process: {err}"), false),
            },
            why = &mut self.session => (why, false),
        }
    }

    /// Ends the session and, for a stdio server, its whole process group:
    /// stdin closed, then SIGTERM, then SIGKILL after [`STOP_GRACE`].
    pub(super) async fn close(mut self) {
        if let Some(cancel) = self.cancel.take() {
            cancel.cancel();
        }
        let Some(mut process) = self.child.take() else {
            return;
        };
        let exited = tokio::time::timeout(STOP_GRACE / 4, process.child.wait()).await;
        if exited.is_err() {
            signal(process.group, Signal::TERM);
            if tokio::time::timeout(STOP_GRACE, process.child.wait())
                .await
                .is_err()
            {
                signal(process.group, Signal::KILL);
                // SIGKILL cannot be ignored; bounded all the same.
                let _ = tokio::time::timeout(STOP_GRACE, process.child.wait()).await;
            }
        }
        // Its helpers too, whatever the leader did; then never again: once
        // the group is empty its number may be another group's.
        signal(process.group.take(), Signal::KILL);
        if let Some(mut log) = process.log.take()
            && tokio::time::timeout(Duration::from_millis(200), &mut log)
                .await
                .is_err()
        {
            tracing::debug!("an MCP server's log writer outlived the server's group");
            log.abort();
        }
    }
}

/// Starts a stdio server's OS process.
fn start(
    spec: &McpServerSpec,
    command: &[String],
    env: &std::collections::BTreeMap<String, String>,
    cwd: Option<&Path>,
    logs: Option<&Path>,
) -> Result<ServerProcess, String> {
    let Some((program, args)) = command.split_first() else {
        return Err("its command is empty".into());
    };
    let mut cmd = Command::new(program);
    // What identifies the kernel to its own agents is not a server's business.
    for reserved in crate::command::RESERVED_ENV {
        cmd.env_remove(reserved);
    }
    // systemd's notification socket is the kernel's, not a server's.
    cmd.env_remove(crate::command::NOTIFY_SOCKET_ENV);
    cmd.args(args)
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(if logs.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .process_group(0)
        .kill_on_drop(true);
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    let mut child = cmd
        .spawn()
        .map_err(|err| format!("cannot start {program}: {err}"))?;
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .and_then(rustix::process::Pid::from_raw);
    let log = match (logs, child.stderr.take()) {
        (Some(dir), Some(stderr)) => {
            let path = dir.join(format!("mcp-{}.log", spec.name));
            Some(tokio::spawn(copy_log(stderr, path)))
        }
        _ => None,
    };
    Ok(ServerProcess { child, group, log })
}

/// Copies a server's stderr to `path`, moving a full log to `.1`.
async fn copy_log(mut stderr: tokio::process::ChildStderr, path: PathBuf) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut file = match open_log(&path).await {
        Ok(file) => Some(file),
        Err(err) => {
            tracing::warn!(path = %path.display(), error = %err, "cannot open an MCP server's log; its stderr is dropped");
            None
        }
    };
    loop {
        let read = match stderr.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        let Some(log) = file.as_mut() else { continue };
        if let Err(err) = tokio::io::AsyncWriteExt::write_all(log, &buf[..read]).await {
            tracing::warn!(path = %path.display(), error = %err, "cannot write an MCP server's log; its stderr is dropped");
            file = None;
            continue;
        }
        let full = log
            .metadata()
            .await
            .is_ok_and(|meta| meta.len() >= LOG_BYTES);
        if full {
            let mut old = path.clone().into_os_string();
            old.push(".1");
            let _ = tokio::fs::rename(&path, &old).await;
            file = open_log(&path).await.ok();
        }
    }
}

async fn open_log(path: &Path) -> std::io::Result<tokio::fs::File> {
    if let Some(dir) = path.parent() {
        tokio::fs::create_dir_all(dir).await?;
    }
    tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .await
}
