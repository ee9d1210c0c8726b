//! `mcp serve`: the control plane as MCP tools, for Claude Code, Codex,
//! Cursor and any other MCP client.
//!
//! A bridge, not a second kernel: every tool is one or a few gRPC calls to
//! the running kernel with the caller's token, so a tool may do exactly
//! what the same gRPC call may, and is refused with the kernel's own
//! message. Over stdio the token comes from where every client command
//! reads it (`--token`, `HIVEKERNEL_TOKEN`, `<DATA_DIR>/admin.token`); over
//! HTTP each request carries its own in `Authorization: Bearer`, and one
//! without a token the kernel takes is answered 401 before MCP sees it
//! (serve/streamable.rs).
//!
//! The kernel is reached on the first call, not at start, so a client that
//! starts this server before the kernel still gets it, and every tool says
//! "cannot connect" until the kernel is up.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hivekernel_agents::{Priority, ProcessState, RestartPolicy, Role, Strategy, Tier};
use hivekernel_proto::v1::{CronSpec, Event, RemoveCronRequest, SubscribeEventsRequest};
use parking_lot::Mutex;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, InitializeResult, ServerCapabilities,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::super::client::Session;
use super::super::describe;
use super::super::events::{MISSED, REPLAY_DONE};
use super::super::process::{NewProcess, kill_subtree, list};
use super::super::{CliError, ClientArgs, PsFilter, Target, cron, human, output, ps, task};

/// Events one `events` call returns unless asked for fewer.
const EVENTS_DEFAULT: usize = 100;
/// The most events one `events` call returns.
const EVENTS_MAX: usize = 1000;
/// Distinct tokens whose connections are kept (HTTP); past it they are all dropped.
const KEPT_TOKENS: usize = 64;
/// The longest `exec` timeout taken (a year); longer is refused, not clamped.
const MAX_EXEC_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

const INSTRUCTIONS: &str = "Tools for a running HiveKernel: a process kernel for LLM agents. \
Agents are processes with a PID in a tree under PID 1. A PROCESS argument is a PID, a process \
name (unique among live processes) or a path of names from PID 1 such as queen/worker. \
`ps` and `describe` show the tree; `spawn` starts an agent, `exec` runs a task on one and returns \
its output, `send` leaves a message in its mailbox, `kill` ends it and its subtree; `events` reads \
what happened since a sequence number; `cron_*` manage schedules. The kernel checks every call \
against the caller's token, as it checks any client.";

mod streamable;

/// Serves the tools on stdin/stdout, or on `http` (loopback only) until Ctrl-C.
pub(in crate::cli) async fn run(
    http: Option<SocketAddr>,
    allow_origin: Vec<String>,
    client: ClientArgs,
) -> Result<(), CliError> {
    let bridge = Bridge::new(client, http.is_some());
    match http {
        None => serve_stdio(bridge).await,
        Some(addr) => streamable::serve(bridge, addr, allow_origin).await,
    }
}

async fn serve_stdio(bridge: Bridge) -> Result<(), CliError> {
    let running = bridge
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|err| CliError::Usage(format!("MCP handshake on stdio failed: {err}")))?;
    // Ends when the client closes stdin.
    running
        .waiting()
        .await
        .map_err(|err| CliError::Refused(format!("the MCP session ended with an error: {err}")))?;
    Ok(())
}

/// The token of an `Authorization: Bearer` header.
fn bearer(headers: &http::HeaderMap) -> Option<&str> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The MCP server: the kernel's connection settings, and its tools.
#[derive(Debug, Clone)]
pub(in crate::cli) struct Bridge {
    kernel: Arc<Kernel>,
    tool_router: ToolRouter<Self>,
}

/// Connections to the kernel, made on first use, one per token.
#[derive(Debug)]
struct Kernel {
    args: ClientArgs,
    /// Over HTTP every call must bring its own token: none is read from
    /// the usual places.
    http: bool,
    /// By token; "" is the token from the usual places (stdio).
    sessions: Mutex<HashMap<String, Session>>,
}

impl Kernel {
    /// A connected session for `token` (`None`: the usual places).
    async fn session(&self, token: Option<&str>) -> Result<Session, CliError> {
        let key = token.unwrap_or_default();
        if let Some(session) = self.sessions.lock().get(key) {
            return Ok(session.clone());
        }
        let mut args = self.args.clone();
        if let Some(token) = token {
            args.token = Some(token.to_owned());
        }
        let session = Session::connect(&args).await?;
        let mut sessions = self.sessions.lock();
        if sessions.len() >= KEPT_TOKENS {
            sessions.clear();
        }
        sessions.insert(key.to_owned(), session.clone());
        Ok(session)
    }

    /// Forgets `token`'s connection, so the next call connects again (and
    /// reads `kernel.addr` and the token file again: the kernel may have
    /// restarted elsewhere).
    fn forget(&self, token: Option<&str>) {
        self.sessions.lock().remove(token.unwrap_or_default());
    }
}

/// A PID, or a process's name or path of names.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
enum ProcessRef {
    /// A PID.
    Pid(u64),
    /// A name, or a path of names from PID 1 such as queen/worker.
    Name(String),
}

impl ProcessRef {
    async fn pid(&self, session: &mut Session) -> Result<u64, CliError> {
        match self {
            ProcessRef::Pid(pid) => Ok(*pid),
            ProcessRef::Name(text) => {
                let target: Target = text.parse().map_err(CliError::Usage)?;
                session.pid(&target).await
            }
        }
    }
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "lowercase")]
enum PsFormat {
    /// NAME PID STATE ... columns.
    #[default]
    Table,
    /// An indented tree.
    Tree,
    /// One object per process, with exact numbers.
    Json,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = plain_optionals)]
struct PsParams {
    /// Only the subtree under this process [default: 1, the whole tree].
    root: Option<ProcessRef>,
    /// table (default), tree or json.
    #[serde(default)]
    format: PsFormat,
    /// Only processes in these states: idle, running, blocked, waiting, restarting, zombie.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    state: Vec<ProcessState>,
    /// Only processes of these roles: kernel, daemon, agent, architect, lead, worker, task.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    role: Vec<Role>,
    /// Only processes whose name matches this glob (`*` any text, `?` one character).
    name: Option<String>,
    /// Only processes whose metadata has all of these key/value pairs.
    #[serde(default)]
    labels: HashMap<String, String>,
    /// Include zombies (exited, not yet collected).
    #[serde(default)]
    all: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = plain_optionals)]
struct DescribeParams {
    /// The process.
    process: ProcessRef,
    /// Answer with JSON (exact numbers) instead of text sections.
    #[serde(default)]
    json: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = plain_optionals)]
struct SpawnParams {
    /// The new process's parent [default: 1].
    parent: Option<ProcessRef>,
    /// Its name.
    name: String,
    /// kernel, daemon, agent, architect, lead, worker or task [default: agent].
    #[schemars(with = "Option<String>")]
    role: Option<Role>,
    /// strategic, tactical or operational [default: operational].
    #[schemars(with = "Option<String>")]
    tier: Option<Tier>,
    /// The runtime, such as tool_agent or exec [default: the kernel's].
    runtime: Option<String>,
    /// The model name (a `models` entry of the kernel's config).
    model: Option<String>,
    /// The system prompt.
    prompt: Option<String>,
    /// Tool names, such as spawn_child, read_file, mcp:github.
    #[serde(default)]
    tools: Vec<String>,
    /// never, transient or permanent.
    #[schemars(with = "Option<String>")]
    restart: Option<RestartPolicy>,
    /// How a supervisor restarts its children: one_for_one, one_for_all, rest_for_one.
    #[schemars(with = "Option<String>")]
    strategy: Option<Strategy>,
    /// An exec agent's command line (program first).
    #[serde(default)]
    command: Vec<String>,
    /// The exec command's working directory [default: this server's].
    cwd: Option<String>,
    /// Environment for the exec command.
    #[serde(default)]
    env: HashMap<String, String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = plain_optionals)]
struct ExecParams {
    /// The process that runs the task.
    process: ProcessRef,
    /// The task, in words.
    task: String,
    /// Fail the task after this many seconds [default: the process's own limit].
    timeout_seconds: Option<f64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = plain_optionals)]
struct SendParams {
    /// The receiver.
    process: ProcessRef,
    /// The message text.
    message: String,
    /// The message type [default: message].
    #[serde(rename = "type")]
    kind: Option<String>,
    /// low, normal, high or critical [default: normal].
    #[schemars(with = "Option<String>")]
    priority: Option<Priority>,
    /// Drop the message if it is still unread after this many milliseconds.
    ttl_ms: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = plain_optionals)]
struct KillParams {
    /// The process; its whole subtree exits with it.
    process: ProcessRef,
    /// Why, for the exit record and the events.
    reason: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = plain_optionals)]
struct EventsParams {
    /// Only events after this sequence number: the `next_since_seq` of an
    /// earlier call. Without it, the most recent events.
    since_seq: Option<u64>,
    /// Only this process's events.
    process: Option<ProcessRef>,
    /// Only events of these types, such as spawned, exited, task_finished,
    /// tool_call, llm_call, denied, mcp_server.
    #[serde(default)]
    types: Vec<String>,
    /// At most this many events [default: 100, at most 1000].
    limit: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = plain_optionals)]
struct CronAddParams {
    /// Unique name.
    name: String,
    /// A 5-field crontab line, 6/7 fields with seconds (and a year), or @hourly, @daily, ...
    expression: String,
    /// The task or message text.
    description: String,
    /// The process it acts on: the task's or message's receiver, or the spawned agent's parent.
    target: ProcessRef,
    /// execute, spawn or message [default: execute].
    action: Option<String>,
    /// For spawn: a `templates` entry of the kernel's config.
    template: Option<String>,
    /// When a run is still going at the next time: skip or allow [default: skip].
    overlap: Option<String>,
    /// Runs missed while the kernel was down: skip or run_once [default: skip].
    missed: Option<String>,
    /// Add it disabled.
    #[serde(default)]
    disabled: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = plain_optionals)]
struct CronRmParams {
    /// The entry's name.
    name: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = plain_optionals)]
struct NoParams {}

/// A tool's answer, or the error the kernel (or the connection) gave.
type Answer = Result<CallToolResult, CliError>;

#[tool_router]
impl Bridge {
    fn new(args: ClientArgs, http: bool) -> Bridge {
        Bridge {
            kernel: Arc::new(Kernel {
                args,
                http,
                sessions: Mutex::new(HashMap::new()),
            }),
            tool_router: Self::tool_router(),
        }
    }

    #[tool(
        description = "List the processes as a table, a tree or JSON, filtered by state, role, name or labels.",
        annotations(read_only_hint = true)
    )]
    async fn ps(
        &self,
        Parameters(params): Parameters<PsParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        self.answer(&context, async |session| {
            let root = match &params.root {
                Some(root) => root.pid(session).await?,
                None => 0,
            };
            let filter = PsFilter {
                all: params.all,
                state: params.state,
                role: params.role,
                name: params.name,
                labels: params.labels.into_iter().collect(),
            };
            let procs = list(session, root).await?;
            let kept: Vec<_> = procs
                .into_iter()
                .filter(|p| ps::keeps(&filter, p))
                .collect();
            let text = match params.format {
                PsFormat::Table => output::table(&kept, human::now_ms()),
                PsFormat::Tree => output::tree(&kept),
                PsFormat::Json => {
                    Value::Array(kept.iter().map(output::process_json).collect()).to_string()
                }
            };
            Ok(text_result(text))
        })
        .await
    }

    #[tool(
        description = "Everything the kernel knows of one process: identity, supervision, tools, \
                       limits, usage and budget, children, cron entries, exit.",
        annotations(read_only_hint = true)
    )]
    async fn describe(
        &self,
        Parameters(params): Parameters<DescribeParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        self.answer(&context, async |session| {
            let pid = params.process.pid(session).await?;
            let found = describe::gather(session, pid).await?;
            Ok(text_result(if params.json {
                found.json().to_string()
            } else {
                found.text(human::now_ms())
            }))
        })
        .await
    }

    #[tool(
        description = "Spawn a process under a parent; answers its PID. An agent runs a runtime \
                       (tool_agent with a model, prompt and tools) or an exec command."
    )]
    async fn spawn(
        &self,
        Parameters(params): Parameters<SpawnParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        self.answer(&context, async |session| {
            let parent = match &params.parent {
                Some(parent) => parent.pid(session).await?,
                None => 1,
            };
            let new = NewProcess {
                parent,
                name: params.name,
                role: params.role,
                tier: params.tier,
                model: params.model,
                runtime: params.runtime,
                system_prompt: params.prompt.unwrap_or_default(),
                tools: params.tools,
                restart: params.restart,
                strategy: params.strategy,
                command: params.command,
                cwd: params.cwd.map(Into::into),
                env: params.env.into_iter().collect(),
                node: None,
                node_labels: Vec::new(),
            };
            let pid = session
                .client
                .spawn(new.request()?)
                .await
                .map_err(|status| session.error(status))?
                .into_inner()
                .pid;
            Ok(json_result(&json!({ "pid": pid })))
        })
        .await
    }

    #[tool(
        description = "Run a task on a process and answer its output when it is done (a failed \
                       task is an error result with the task's error)."
    )]
    async fn exec(
        &self,
        Parameters(params): Parameters<ExecParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let timeout = match params.timeout_seconds {
            None => None,
            Some(secs) => match Duration::try_from_secs_f64(secs) {
                Ok(timeout) if !timeout.is_zero() && timeout <= MAX_EXEC_TIMEOUT => Some(timeout),
                _ => {
                    return Ok(error_result(format!(
                        "timeout_seconds: expected a positive number of seconds up to {} \
                         (a year), got {secs}",
                        MAX_EXEC_TIMEOUT.as_secs()
                    )));
                }
            },
        };
        self.answer(&context, async |session| {
            let pid = params.process.pid(session).await?;
            let reply = task::execute(session, pid, params.task, timeout).await?;
            let detail = json!({
                "request_id": reply.request_id,
                "success": reply.success,
                "output": reply.output,
                "error": reply.error,
                "trace_id": reply.trace_id,
            });
            let mut result = if reply.success {
                text_result(reply.output)
            } else {
                error_result(format!("the task failed: {}", reply.error))
            };
            result.structured_content = Some(detail);
            Ok(result)
        })
        .await
    }

    #[tool(description = "Put a message into a process's mailbox; answers the message id.")]
    async fn send(
        &self,
        Parameters(params): Parameters<SendParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        self.answer(&context, async |session| {
            let to = params.process.pid(session).await?;
            let id = task::send_message(
                session,
                to,
                params.message,
                params.kind.unwrap_or_default(),
                params.priority,
                params.ttl_ms.unwrap_or(0),
            )
            .await?;
            Ok(json_result(&json!({ "message_id": id })))
        })
        .await
    }

    #[tool(
        description = "Kill a process and its whole subtree; answers the PIDs that exited.",
        annotations(destructive_hint = true)
    )]
    async fn kill(
        &self,
        Parameters(params): Parameters<KillParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        self.answer(&context, async |session| {
            let pid = params.process.pid(session).await?;
            let killed = kill_subtree(session, pid, params.reason.unwrap_or_default()).await?;
            let mut answer = json!({ "killed": killed.killed });
            if !killed.unreached.is_empty() {
                let unreached: Vec<_> = killed
                    .unreached
                    .iter()
                    .map(|gone| json!({ "pid": gone.pid, "node": gone.node, "error": gone.error }))
                    .collect();
                answer["unreached"] = json!(unreached);
            }
            Ok(json_result(&answer))
        })
        .await
    }

    #[tool(
        description = "Kernel events (spawns, exits, tasks, model and tool calls, denials, ...) \
                       after a sequence number, oldest first; or the most recent ones. Pass the \
                       answer's next_since_seq as since_seq to read on.",
        annotations(read_only_hint = true)
    )]
    async fn events(
        &self,
        Parameters(params): Parameters<EventsParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let limit = params.limit.unwrap_or(EVENTS_DEFAULT);
        if !(1..=EVENTS_MAX).contains(&limit) {
            return Ok(error_result(format!(
                "limit: expected 1 to {EVENTS_MAX}, got {limit}"
            )));
        }
        self.answer(&context, async |session| {
            let pid = match &params.process {
                Some(process) => Some(process.pid(session).await?),
                None => None,
            };
            let since = params.since_seq.unwrap_or(0);
            // The kernel filters; without since_seq it keeps the newest `limit`.
            let mut stream = session
                .client
                .subscribe_events(SubscribeEventsRequest {
                    since_seq: since,
                    replay: true,
                    pid: pid.unwrap_or(0),
                    types: params.types.clone(),
                    tail: if params.since_seq.is_none() {
                        limit as u64
                    } else {
                        0
                    },
                    ..Default::default()
                })
                .await
                .map_err(|status| session.error(status))?
                .into_inner();
            // Markers that events were missed: kept when reading on from a
            // sequence number (the reader must know), not counted against
            // the limit, and left out of "the most recent" (nothing was
            // asked for that could have been missed).
            let mut markers: Vec<Event> = Vec::new();
            let mut kept: Vec<Event> = Vec::new();
            let mut next_since = since;
            let mut more = false;
            while let Some(event) = stream
                .message()
                .await
                .map_err(|status| session.error(status))?
            {
                if event.r#type == REPLAY_DONE {
                    // Every event up to the end of the replay has been read.
                    let last = serde_json::from_str::<Value>(&event.detail)
                        .ok()
                        .and_then(|detail| detail["last_seq"].as_u64());
                    next_since = next_since.max(last.unwrap_or(0));
                    break;
                }
                if MISSED.contains(&event.r#type.as_str()) {
                    if params.since_seq.is_some() {
                        markers.push(event);
                    }
                    continue;
                }
                if kept.len() == limit {
                    // Oldest first from since_seq: the rest is the next call's.
                    more = true;
                    break;
                }
                next_since = next_since.max(event.seq);
                kept.push(event);
            }
            let events: Vec<Value> = markers
                .iter()
                .chain(kept.iter())
                .map(output::event_json)
                .collect();
            Ok(json_result(&json!({
                "events": events,
                "next_since_seq": next_since,
                "more": more,
            })))
        })
        .await
    }

    #[tool(
        description = "List the cron entries with their next and last runs and run history.",
        annotations(read_only_hint = true)
    )]
    async fn cron_ls(
        &self,
        Parameters(_): Parameters<NoParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        self.answer(&context, async |session| {
            let entries = cron::entries(session).await?;
            let all: Vec<Value> = entries.iter().map(cron::entry_json).collect();
            Ok(json_result(&Value::Array(all)))
        })
        .await
    }

    #[tool(
        description = "Add a cron entry: run a task, send a message or spawn an agent on a schedule."
    )]
    async fn cron_add(
        &self,
        Parameters(params): Parameters<CronAddParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        self.answer(&context, async |session| {
            let spec = CronSpec {
                target: params.target.pid(session).await?,
                name: params.name,
                expression: params.expression,
                action: params.action.unwrap_or_else(|| "execute".to_owned()),
                template: params.template.unwrap_or_default(),
                description: params.description,
                disabled: params.disabled,
                overlap: params.overlap.unwrap_or_else(|| "skip".to_owned()),
                missed: params.missed.unwrap_or_else(|| "skip".to_owned()),
            };
            let entry = cron::add_entry(session, spec).await?;
            Ok(json_result(&cron::entry_json(&entry)))
        })
        .await
    }

    #[tool(
        description = "Remove a cron entry added through the API (entries from the config stay).",
        annotations(destructive_hint = true)
    )]
    async fn cron_rm(
        &self,
        Parameters(params): Parameters<CronRmParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        self.answer(&context, async |session| {
            session
                .client
                .remove_cron(RemoveCronRequest {
                    name: params.name.clone(),
                })
                .await
                .map_err(|status| session.error(status))?;
            Ok(json_result(&json!({ "removed": params.name })))
        })
        .await
    }
}

impl Bridge {
    /// Runs `work` with a session for the caller's token; a failure is a
    /// tool error naming what went wrong (the kernel's refusal, or why it
    /// cannot be reached), never a protocol error the model cannot read.
    async fn answer(
        &self,
        context: &RequestContext<RoleServer>,
        work: impl AsyncFnOnce(&mut Session) -> Answer,
    ) -> Result<CallToolResult, ErrorData> {
        let token = context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| bearer(&parts.headers))
            .map(str::to_owned);
        if self.kernel.http && token.is_none() {
            return Ok(error_result(
                "unauthenticated: send the kernel's admin token or a process token as \
                 `Authorization: Bearer <token>`"
                    .to_owned(),
            ));
        }
        let result = match self.kernel.session(token.as_deref()).await {
            Ok(mut session) => work(&mut session).await,
            Err(err) => Err(err),
        };
        Ok(match result {
            Ok(result) => result,
            Err(err) => {
                // Reconnect next time (the kernel may have moved, the token
                // file changed), and keep no session for a refused token.
                if matches!(
                    err,
                    CliError::Connect { .. }
                        | CliError::Usage(_)
                        | CliError::Unauthenticated { .. }
                ) {
                    self.kernel.forget(token.as_deref());
                }
                error_result(err.to_string())
            }
        })
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Bridge {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("hivekernel", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}

/// Optional arguments are optional by being left out of `required`; a
/// `null` in their `type` (schemars' way with `Option`) only trips clients
/// that read `type` as one word and convert arguments by it.
fn plain_optionals(schema: &mut schemars::Schema) {
    let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) else {
        return;
    };
    let null = json!("null");
    for property in properties.values_mut() {
        for key in ["type", "anyOf"] {
            if let Some(Value::Array(alternatives)) = property.get_mut(key) {
                alternatives.retain(|t| *t != null && t.get("type") != Some(&null));
                if key == "type" && alternatives.len() == 1 {
                    let only = alternatives.remove(0);
                    property[key] = only;
                }
            }
        }
    }
}

fn text_result(text: String) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(text)])
}

fn json_result(value: &Value) -> CallToolResult {
    let mut result = text_result(value.to_string());
    if value.is_object() {
        result.structured_content = Some(value.clone());
    }
    result
}

fn error_result(text: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_reads_the_token_of_a_bearer_header() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(bearer(&headers), None);
        headers.insert(
            http::header::AUTHORIZATION,
            http::HeaderValue::from_static("Bearer abc"),
        );
        assert_eq!(bearer(&headers), Some("abc"));
        headers.insert(
            http::header::AUTHORIZATION,
            http::HeaderValue::from_static("bearer  xyz "),
        );
        assert_eq!(bearer(&headers), Some("xyz"));
        for refused in ["Basic abc", "Bearer", "Bearer   ", "abc"] {
            headers.insert(
                http::header::AUTHORIZATION,
                http::HeaderValue::from_static(refused),
            );
            assert_eq!(bearer(&headers), None, "{refused}");
        }
    }

    #[test]
    fn every_tool_has_an_object_schema_and_a_description() {
        let bridge = Bridge::new(
            ClientArgs {
                addr: None,
                token: None,
                token_file: None,
                data_dir: ".".into(),
                tls_ca: None,
                tls_cert: None,
                tls_key: None,
            },
            false,
        );
        let tools = bridge.tool_router.list_all();
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        for expected in [
            "ps", "describe", "spawn", "exec", "send", "kill", "events", "cron_ls", "cron_add",
            "cron_rm",
        ] {
            assert!(names.contains(&expected), "{expected} in {names:?}");
        }
        for tool in &tools {
            assert_eq!(
                tool.input_schema.get("type"),
                Some(&json!("object")),
                "{}",
                tool.name
            );
            assert!(tool.description.as_deref().is_some_and(|d| !d.is_empty()));
            let text = Value::Object((*tool.input_schema).clone()).to_string();
            assert!(!text.contains("\"null\""), "{}: {text}", tool.name);
        }
    }
}
