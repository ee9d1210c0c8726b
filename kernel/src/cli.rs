//! The `hivekernel` command line: `start`, `config check` and the client
//! commands that drive a running kernel over gRPC.
//!
//! Exit codes: 0 ok; 1 the kernel refused or the target was not found;
//! 2 usage or config error; 3 cannot connect to the kernel.
//!
//! # Layout
//! - this file: the clap types and the dispatcher.
//! - `error`: [`CliError`] and its exit codes.
//! - `client`: connecting, the bearer-token interceptor, token loading.
//! - `names`: proto enums to and from the lowercase names agents use.
//! - `output`: table, tree, JSON and timestamp rendering (pure functions).
//! - `process`: `spawn`, `kill`, `restart`, `wait`, listing a subtree.
//! - `ps`: `ps`: filters, and `--watch`.
//! - `reload`: `config reload`.
//! - `task`: `exec`, `send`.
//! - `events`: `events`.
//! - `logs`: `logs` (transcripts, and an `exec` agent's log file).
//! - `describe`: `describe`.
//! - `human`: ages, sizes, counts and dollars as text shows them.
//! - `artifacts`: `artifacts ls | put | get | rm`.
//! - `token`: `token create | ls | revoke`, operator tokens with scopes.
//! - `inbox`: `inbox`, `approve`, `deny`, `answer`.

mod artifacts;
mod backup;
mod client;
mod cron;
mod describe;
mod error;
mod events;
mod human;
mod inbox;
mod llm;
mod logs;
mod mcp;
mod names;
mod nodes;
mod output;
mod process;
mod ps;
mod reload;
mod skills;
mod task;
mod token;
mod usage;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use hivekernel_agents::{Priority, ProcessState, RestartPolicy, Role, Strategy, Tier, Visibility};

pub use error::CliError;

use crate::config::Config;
use crate::daemon::{self, StartOptions};
use crate::runtime::RuntimeRegistry;

/// HiveKernel: an actor-based process kernel for LLM agents.
#[derive(Debug, Parser)]
#[command(
    name = "hivekernel",
    version,
    propagate_version = true,
    after_help = "PROCESS: a PID, a process name (unique among the live processes) or a path of \
                  names from PID 1, such as queen/queen-w1.\n\n\
                  Docs: README.md (quick start), docs/CONFIG.md (every config field), \
                  docs/ARCHITECTURE.md (how the kernel works, and the file behind each behaviour)."
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
    /// What is logged to stderr: a level (error, warn, info, debug, trace) or
    /// directives such as info,hivekernel_kernel=debug. RUST_LOG, when set, wins.
    /// [default: the config's kernel.log.level for start, else info]
    #[arg(long, global = true, value_name = "FILTER", value_parser = log_filter)]
    pub log_level: Option<String>,
    /// How log records are written to stderr: text (coloured on a terminal,
    /// unless NO_COLOR is set) or json, one object per line.
    /// [default: the config's kernel.log.format for start, else text]
    #[arg(long, global = true, value_name = "FORMAT", value_parser = ["text", "json"])]
    pub log_format: Option<String>,
}

fn log_filter(value: &str) -> Result<String, String> {
    crate::config::check_log_level(value).map(|()| value.to_owned())
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start the kernel and the config's agents; serve gRPC until SIGINT or SIGTERM;
    /// SIGHUP reloads the config (as `config reload`).
    Start(StartArgs),
    /// Work with startup configs.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// List processes as a table, a tree or JSON.
    Ps(PsArgs),
    /// Spawn a process under a parent; prints its PID.
    Spawn(SpawnArgs),
    /// Everything the kernel knows of one process, in sections: identity,
    /// supervision, tools, limits, usage and budget, children, cron entries, exit.
    Describe(DescribeArgs),
    /// Kill a process and its whole subtree; prints the PIDs that exited.
    Kill(KillArgs),
    /// Restart a process now, as its supervisor would: its subtree is killed
    /// and it starts again with the same PID and spec. Any restart policy;
    /// not counted against its restart intensity, no backoff.
    Restart(RestartArgs),
    /// Run a task on a process and print its output.
    Exec(ExecArgs),
    /// Put a message into a process's mailbox; prints the message id.
    Send(SendArgs),
    /// Wait for a child of PID 1 to exit and collect its exit record.
    Wait(WaitArgs),
    /// Print kernel events: the retained ones, or a live stream with --follow.
    Events(EventsArgs),
    /// Show what a process's agent did: each turn's input, model requests and
    /// answers, tool calls and results, tokens, durations, the final answer.
    Logs(LogsArgs),
    /// List, add and remove cron entries.
    #[command(subcommand)]
    Cron(CronCommand),
    /// Skills in the Agent Skills format (a directory with a SKILL.md).
    #[command(subcommand)]
    Skills(SkillsCommand),
    /// Store, list, read and delete artifacts.
    #[command(subcommand)]
    Artifacts(ArtifactsCommand),
    /// MCP: the servers the kernel supervises (state, tools, restart), and
    /// `mcp serve`, the kernel's control plane as an MCP server.
    #[command(subcommand)]
    Mcp(McpCommand),
    /// The model server a config points at: what it can do for its models.
    #[command(subcommand)]
    Llm(LlmCommand),
    /// Model calls, tokens, cost and token budgets per process and per subtree.
    Usage(UsageArgs),
    /// Make things a cluster needs (docs/CLUSTER.md).
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// The nodes of the cluster this kernel is a node of: name, epoch,
    /// address, load, labels (docs/CLUSTER.md); `nodes forget NAME` frees
    /// the name of a node that is gone.
    #[command(args_conflicts_with_subcommands = true)]
    Nodes {
        #[command(subcommand)]
        command: Option<NodesCommand>,
        /// One JSON array, exact numbers.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// What agents ask people: tool calls waiting for approval, questions
    /// waiting for an answer (-f: follow as they come and go).
    Inbox(InboxArgs),
    /// Approve a tool call waiting in the inbox: it runs.
    Approve {
        /// The request's id (hivekernel inbox).
        id: u64,
        /// A note for the agent's record.
        #[arg(long, default_value = "")]
        note: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Deny a tool call waiting in the inbox (the agent sees the refusal),
    /// or decline a question.
    Deny {
        /// The request's id (hivekernel inbox).
        id: u64,
        /// Why; the agent sees it.
        #[arg(long, default_value = "")]
        reason: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Answer a question waiting in the inbox.
    Answer {
        /// The request's id (hivekernel inbox).
        id: u64,
        /// The answer (one of its choices, when it offers some).
        text: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Operator tokens with a scope (read, operate, admin), for people and
    /// tools that should not hold the admin token: create, list, revoke.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Copy the store to a new file, consistent as of one moment, while the
    /// kernel runs or not (SQLite's VACUUM INTO; the copy is checked before
    /// it takes the name DEST). Needs no token: it reads the data directory.
    Backup {
        /// The new file (never overwritten).
        dest: PathBuf,
        #[command(flatten)]
        local: DataDirArgs,
    },
    /// Put a backup in place as the store of a data directory no kernel is
    /// running on (refused while one is); the store it replaces is kept
    /// beside it as hivekernel.db.before-restore-<unix seconds>.
    Restore {
        /// The backup to restore.
        src: PathBuf,
        #[command(flatten)]
        local: DataDirArgs,
    },
    /// Print a shell completion script: `source <(hivekernel completion bash)`,
    /// `hivekernel completion zsh > ~/.zfunc/_hivekernel`,
    /// `hivekernel completion fish > ~/.config/fish/completions/hivekernel.fish`.
    Completion {
        /// bash, zsh, fish, elvish or powershell
        shell: clap_complete::Shell,
    },
}

/// Arguments of `hivekernel usage`.
#[derive(Debug, Args)]
pub struct UsageArgs {
    /// Only the subtree under this process [default: 1]
    #[arg(value_name = "PROCESS")]
    pub pid: Option<Target>,
    /// Sum the whole kernel's model usage over time (kept per UTC day) by
    /// model, day or role, instead of listing processes.
    #[arg(long, value_parser = ["model", "day", "role"], conflicts_with = "pid")]
    pub by: Option<String>,
    /// With --by: from this long ago (7d, 24h) or from this UTC day
    /// (2026-11-01) on [default: everything kept]
    #[arg(long, value_name = "WHEN", value_parser = parse_since, requires = "by")]
    pub since: Option<Since>,
    /// Print one JSON array, one object per process.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Where `backup` and `restore` find the store: they read the data
/// directory's files, not the control plane.
#[derive(Debug, Args)]
pub struct DataDirArgs {
    /// The kernel's data directory (`restore` creates it if missing).
    #[arg(
        long,
        value_name = "DIR",
        env = "HIVEKERNEL_DATA_DIR",
        default_value = ".hivekernel"
    )]
    pub data_dir: PathBuf,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// `hivekernel cron ...`.
#[derive(Debug, Subcommand)]
pub enum CronCommand {
    /// List cron entries with their next and last runs.
    Ls {
        /// One JSON array, with each entry's run history.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Add a cron entry; prints it.
    Add(CronAddArgs),
    /// Remove a cron entry added through the API.
    Rm {
        /// The entry's name.
        name: String,
        /// Print `{"removed": NAME}`.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Let an entry fire on its schedule again; prints it. A config entry
    /// keeps the switch until the config changes it.
    Enable(CronNameArgs),
    /// Stop an entry firing on its schedule (it keeps its history); prints it.
    Disable(CronNameArgs),
    /// Fire an entry now, enabled or not; prints it. The run's outcome
    /// shows in `cron ls` and as a `cron_run` event.
    Run(CronNameArgs),
}

/// Arguments of `cron enable`, `cron disable` and `cron run`.
#[derive(Debug, Args)]
pub struct CronNameArgs {
    /// The entry's name.
    pub name: String,
    /// Print the entry as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Arguments of `hivekernel inbox`.
#[derive(Debug, Args)]
pub struct InboxArgs {
    /// One JSON array of the pending requests (with -f: one JSON object per change).
    #[arg(long)]
    pub json: bool,
    /// Keep watching: print each request as it is asked and resolved, until Ctrl-C.
    #[arg(short, long)]
    pub follow: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `hivekernel token ...`.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token; prints it (shown once: the kernel keeps only a hash).
    /// read: ps, describe, events, logs, usage, cron ls, artifacts ls/get,
    /// mcp ls/tools. operate: also spawn, exec, send, kill, restart, cron and
    /// artifact changes, mcp call. admin: everything, tokens and reload included.
    Create {
        /// What it may do: read, operate or admin.
        #[arg(long, value_parser = parse_scope)]
        scope: crate::caller::Scope,
        /// Its name (unique among tokens not revoked) [default: token-<id>]
        #[arg(long)]
        name: Option<String>,
        /// Stop working after this long (30d, 12h, 90m) [default: never]
        #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
        expires: Option<Duration>,
        /// Print the token and its record as one JSON object.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List tokens: id, name, scope, created, expires, status.
    Ls {
        /// Also expired and revoked tokens.
        #[arg(short, long)]
        all: bool,
        /// One JSON array.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Revoke a token by name or id: refused from its next call on.
    Revoke {
        /// Its name, or its id (7 or #7).
        #[arg(id = "revoked", value_name = "TOKEN")]
        token: String,
        /// Print the revoked token's record as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// `hivekernel mcp ...`.
#[derive(Debug, Subcommand)]
pub enum McpCommand {
    /// List the MCP servers: state, restarts, tool count, last error.
    Ls {
        /// One JSON array, one object per server.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List one server's tools: the names models see, and those left out and why.
    Tools {
        /// The server's name in `mcp_servers`.
        server: String,
        /// One JSON array, with each tool's input schema.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Call one tool of a server, as the admin, and print its result
    /// (exit code 1 when the tool reports a failure).
    Call {
        /// The server's name in `mcp_servers`.
        server: String,
        /// The tool's name on the server.
        tool: String,
        /// Its arguments, a JSON object.
        #[arg(long, value_name = "JSON", default_value = "{}")]
        args: String,
        /// Print `{"text": ..., "is_error": ...}`.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Restart one server now (admin only), also one that failed for good;
    /// not counted against its restart intensity. Waits until it is ready.
    Restart {
        /// The server's name in `mcp_servers`.
        server: String,
        /// Print the server as `mcp ls --json` does.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Serve the control plane as MCP tools (ps, describe, spawn, exec, send,
    /// kill, events, cron_ls, cron_add, cron_rm) on stdin/stdout, for Claude
    /// Code, Codex, Cursor and other MCP clients. Each call is a gRPC call to
    /// the running kernel with this command's token (--token,
    /// HIVEKERNEL_TOKEN or <DATA_DIR>/admin.token), checked as any other.
    Serve {
        /// Serve streamable HTTP at http://ADDR/mcp instead (loopback only,
        /// such as 127.0.0.1:8765). Each request must carry its own token as
        /// `Authorization: Bearer`; this command's token is not used.
        #[arg(long, value_name = "ADDR")]
        http: Option<SocketAddr>,
        /// With --http: a browser origin allowed to call it besides the
        /// server's own (such as http://localhost:6274); a request from any
        /// other origin is answered 403. Repeatable.
        #[arg(long = "allow-origin", value_name = "ORIGIN", requires = "http")]
        allow_origin: Vec<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// Arguments of `hivekernel cron add`.
#[derive(Debug, Args)]
pub struct CronAddArgs {
    /// Unique name.
    pub name: String,
    /// 5-field crontab line, 6/7 fields with seconds (and a year), or @hourly, @daily, ...
    pub expression: String,
    /// The task or message text.
    pub description: String,
    /// The process it acts on: the task's or message's receiver, or the spawned agent's parent.
    #[arg(long, value_name = "PROCESS")]
    pub target: Target,
    /// execute, spawn or message
    #[arg(long, default_value = "execute")]
    pub action: String,
    /// For spawn: a `templates` entry of the config.
    #[arg(long)]
    pub template: Option<String>,
    /// skip or allow
    #[arg(long, default_value = "skip")]
    pub overlap: String,
    /// skip or run_once
    #[arg(long, default_value = "skip")]
    pub missed: String,
    /// Add it disabled.
    #[arg(long)]
    pub disabled: bool,
    /// Print the entry as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Arguments of `hivekernel start`.
#[derive(Debug, Args)]
pub struct StartArgs {
    /// The startup config (JSON).
    pub config: PathBuf,
    /// Address to listen on, instead of the config's `kernel.listen`.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Data directory, instead of the config's `kernel.data_dir`.
    #[arg(long, value_name = "DIR", env = "HIVEKERNEL_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Allow listening on an address that is not loopback without TLS.
    #[arg(long)]
    pub insecure_remote: bool,
    /// Serve TLS with this certificate chain (PEM), instead of the config's `kernel.tls.cert`.
    #[arg(long, value_name = "PEM")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "PEM")]
    pub tls_key: Option<PathBuf>,
    /// Mutual TLS: accept only clients with a certificate signed by this CA (PEM).
    #[arg(long, value_name = "PEM")]
    pub tls_client_ca: Option<PathBuf>,
    /// What local clients and exec agents trust for this kernel (PEM), copied to
    /// <DATA_DIR>/tls-ca.pem [default: the --tls-cert file]
    #[arg(long, value_name = "PEM")]
    pub tls_ca: Option<PathBuf>,
    /// Serve /metrics (Prometheus), /healthz and /readyz over plain HTTP on this
    /// address, instead of the config's `kernel.metrics.listen`.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// Send every model as this one served model (e.g. `qwen2.5:7b` on a
    /// local server), whatever `llm.models` says; prices then apply only if
    /// `llm.prices` names it.
    #[arg(long, value_name = "MODEL", env = "HIVEKERNEL_LLM_MODEL")]
    pub model: Option<String>,
    /// Serve the web dashboard, on ADDR if given, instead of the config's
    /// `kernel.dashboard` [default: on when the control plane listens on
    /// loopback, at its address with the next port]
    #[arg(long, value_name = "ADDR", num_args = 0..=1, require_equals = true)]
    pub dashboard: Option<Option<SocketAddr>>,
    /// Do not serve the web dashboard.
    #[arg(long, conflicts_with = "dashboard")]
    pub no_dashboard: bool,
    /// This node's name in the cluster, instead of `kernel.cluster.node`
    /// [default: the host name]
    #[arg(long, value_name = "NAME", env = "HIVEKERNEL_NODE")]
    pub node: Option<String>,
    /// Run as a node of a cluster (docs/CLUSTER.md).
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// `hivekernel skills ...`.
#[derive(Debug, Subcommand)]
pub enum SkillsCommand {
    /// List the skills the kernel loaded: name, where from, who sees it,
    /// description; shadowed ones marked; then what was skipped and why.
    Ls {
        /// One JSON object: skills and problems.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show one skill: its frontmatter fields and its instructions.
    Show {
        /// The skill's name.
        name: String,
        /// This process's saved skill of that name (when several saved one).
        #[arg(long, value_name = "PID")]
        owner: Option<u64>,
        /// One JSON object, the body included.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Every kept version of a skill processes saved: who changed what, when, why.
    History {
        /// The skill's name.
        name: String,
        /// Only this process's skill of that name.
        #[arg(long, value_name = "PID")]
        owner: Option<u64>,
        /// One JSON array, each version's SKILL.md included.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Delete a skill a process saved (its history stays); config skills
    /// are files to edit instead.
    Rm {
        /// The skill's name.
        name: String,
        /// The process whose skill it is, when several saved one of that name.
        #[arg(long, value_name = "PID")]
        owner: Option<u64>,
        /// Why, kept in its history.
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Check a skill directory, or every skill directory in DIR, against the
    /// Agent Skills format: every issue with its file and field; exit 2 when
    /// any skill has an error (warnings alone pass).
    Check {
        /// A skill directory (holding SKILL.md) or a directory of them.
        dir: PathBuf,
        /// One JSON array: dir, name, ok and findings per skill.
        #[arg(long)]
        json: bool,
    },
}

/// `hivekernel llm ...`.
#[derive(Debug, Subcommand)]
pub enum LlmCommand {
    /// Ask the config's model server (read from this environment, as `start`
    /// would) which models it lists and their context windows, then, per model
    /// the config sends, for a one-line answer and one required tool call; print
    /// what works and what does not. Exit 1 when a model cannot work as agents
    /// need (not listed, no answer, or tools dropped or refused).
    Check {
        /// The startup config (JSON).
        #[arg(default_value = "configs/startup.json")]
        config: PathBuf,
        /// As `start --model`: every model sent as this one.
        #[arg(long, value_name = "MODEL", env = "HIVEKERNEL_LLM_MODEL")]
        model: Option<String>,
        /// One JSON object: the server's list and each model's findings.
        #[arg(long)]
        json: bool,
    },
}

/// `hivekernel nodes ...`.
#[derive(Debug, Subcommand)]
pub enum NodesCommand {
    /// Free the name of a node that is gone, so that its next start need
    /// not wait (or, when NATS's replicas disagree, cannot be refused):
    /// reached through NATS, with no node running. Refused while the node
    /// still beats or beat within its TTL; else that start of it is
    /// claimed lost, as a node that judged it would, and its record removed.
    Forget {
        /// The node's name.
        name: String,
        /// A startup config whose `kernel.cluster` reaches the NATS
        /// servers (credentials, TLS, the cluster secret).
        #[arg(long, short, value_name = "FILE")]
        config: Option<PathBuf>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

/// How a node (`start`), or a command that is none (`nodes forget`),
/// reaches the cluster's NATS servers, over (or instead of) the config's
/// `kernel.cluster`.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Cluster")]
pub struct ClusterArgs {
    /// The cluster's NATS servers (comma-separated nats://HOST:PORT),
    /// instead of the config's `kernel.cluster.servers` (docs/CLUSTER.md);
    /// for `start`, it makes the kernel a node. Credentials go in the
    /// URLs (nats://USER:PASSWORD@HOST:PORT), never shown.
    #[arg(
        long,
        value_name = "URLS",
        env = "HIVEKERNEL_CLUSTER",
        hide_env_values = true
    )]
    pub cluster: Option<String>,
    /// Reach NATS servers that let anyone in without credentials (as
    /// `kernel.cluster.insecure`): only where no untrusted host can reach them.
    #[arg(long)]
    pub insecure_cluster: bool,
    /// The cluster secret every node signs what it publishes with, instead
    /// of `kernel.cluster.secret_file` (`hivekernel cluster secret FILE`
    /// makes one; the same file on every node, mode 600).
    #[arg(long, value_name = "FILE")]
    pub cluster_secret: Option<PathBuf>,
}

/// `hivekernel cluster ...`.
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Write a new cluster secret (32 random bytes, hex) to FILE, mode 600,
    /// for `kernel.cluster.secret_file`; copy it to every node. An existing
    /// file is not overwritten.
    Secret {
        /// Where to write it.
        file: PathBuf,
    },
}

/// `hivekernel config ...`.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate a startup config without starting anything; lists every issue,
    /// and what `start` would refuse here: the model provider's key (read from
    /// this environment), the TLS files, the exec sandbox (probed on this host),
    /// the NATS servers of `kernel.cluster` (reached from this machine).
    Check {
        /// The startup config (JSON).
        config: PathBuf,
        /// As `start --model`: every model sent as this one.
        #[arg(long, value_name = "MODEL", env = "HIVEKERNEL_LLM_MODEL")]
        model: Option<String>,
    },
    /// Make the running kernel read its config file again (admin only). It is
    /// checked first, as start checks it: an invalid one changes nothing (exit
    /// 2, every issue listed). Then agents added are spawned, removed ones
    /// stopped, changed ones restarted with their new spec (same PID), and
    /// their cron entries follow; settings only a kernel restart applies are
    /// listed. `kill -HUP` on the kernel does the same.
    Reload {
        /// One JSON object: config, applied, agents, cron, needs_restart.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// A process as the command line names it: its PID, its name (unique among
/// the live processes), or a path of names from PID 1 (`queen/queen-w1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target(String);

impl Target {
    /// The text as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for Target {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err(
                "expected a PID, a process name or a path of names such as queen/worker".into(),
            );
        }
        Ok(Target(text.to_owned()))
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where the kernel is and how to authenticate; shared by every client command.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Connection")]
pub struct ClientArgs {
    /// Kernel address (host:port or URL) [default: the address in <DATA_DIR>/kernel.addr,
    /// else http://127.0.0.1:50051]
    #[arg(long, value_name = "ADDR", env = "HIVEKERNEL_ADDR")]
    pub addr: Option<String>,
    /// Bearer token. Every user of this machine can read a command line
    /// (ps, /proc/PID/cmdline): prefer --token-file or HIVEKERNEL_TOKEN
    /// [default: the contents of <DATA_DIR>/admin.token]
    #[arg(
        long,
        value_name = "TOKEN",
        env = "HIVEKERNEL_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// A file holding the bearer token (surrounding whitespace ignored)
    /// [default: <DATA_DIR>/admin.token]
    #[arg(long, value_name = "PATH", env = "HIVEKERNEL_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// The kernel's data directory, where it writes admin.token and kernel.addr.
    #[arg(
        long,
        value_name = "DIR",
        env = "HIVEKERNEL_DATA_DIR",
        default_value = ".hivekernel"
    )]
    pub data_dir: PathBuf,
    /// CA certificate (PEM) to trust for a kernel that serves TLS; makes a bare
    /// ADDR https [default for https: <DATA_DIR>/tls-ca.pem, written by the kernel]
    #[arg(long, value_name = "PEM", env = "HIVEKERNEL_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM), for a kernel that requires one (mutual TLS).
    #[arg(long, value_name = "PEM", env = "HIVEKERNEL_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "PEM", env = "HIVEKERNEL_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
}

/// Arguments of `hivekernel ps`.
#[derive(Debug, Args)]
pub struct PsArgs {
    /// Show an indented tree instead of a table.
    #[arg(long)]
    pub tree: bool,
    /// Print one JSON array of process objects (exact numbers: times in Unix
    /// milliseconds, tokens, costs in dollars).
    #[arg(long, conflicts_with = "tree")]
    pub json: bool,
    #[command(flatten)]
    pub filter: PsFilter,
    /// Redraw whenever something happens (a spawn, an exit, a task, a model
    /// call), until Ctrl-C.
    #[arg(long, short, conflicts_with = "json")]
    pub watch: bool,
    /// Only the subtree under this process [default: 1]
    #[arg(long, value_name = "PROCESS")]
    pub root: Option<Target>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Which processes `ps` (and `mcp serve`'s `ps` tool) lists.
#[derive(Debug, Clone, Default, Args)]
pub struct PsFilter {
    /// Include zombies (exited, not yet collected).
    #[arg(long, short)]
    pub all: bool,
    /// Only processes in these states: idle, running, blocked, restarting, zombie, ...
    #[arg(long, value_name = "STATE[,STATE]", value_delimiter = ',')]
    pub state: Vec<ProcessState>,
    /// Only processes of these roles.
    #[arg(long, value_name = "ROLE[,ROLE]", value_delimiter = ',')]
    pub role: Vec<Role>,
    /// Only processes whose name matches this glob (`*` any text, `?` one character).
    #[arg(long, value_name = "GLOB")]
    pub name: Option<String>,
    /// Only processes whose metadata has KEY=VALUE (repeatable: all must match).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_env)]
    pub labels: Vec<(String, String)>,
}

/// Arguments of `hivekernel spawn`.
#[derive(Debug, Args)]
pub struct SpawnArgs {
    /// The parent.
    #[arg(long, value_name = "PROCESS")]
    pub parent: Target,
    /// Name of the new process.
    #[arg(long)]
    pub name: String,
    /// Role: kernel, daemon, agent, architect, lead, worker or task [default: agent]
    #[arg(long)]
    pub role: Option<Role>,
    /// Cognitive tier: strategic, tactical or operational (at most the parent's) [default: operational]
    #[arg(long)]
    pub tier: Option<Tier>,
    /// Runtime name [default: the kernel's default runtime]
    #[arg(long)]
    pub runtime: Option<String>,
    /// Logical model name.
    #[arg(long)]
    pub model: Option<String>,
    /// System prompt text.
    #[arg(long, value_name = "TEXT")]
    pub prompt: Option<String>,
    /// Read the system prompt from this file.
    #[arg(long, value_name = "FILE", conflicts_with = "prompt")]
    pub prompt_file: Option<PathBuf>,
    /// Tools the process may use, comma-separated.
    #[arg(long, value_name = "a,b", value_delimiter = ',')]
    pub tools: Vec<String>,
    /// Restart policy: permanent, transient or temporary, with the default
    /// intensity (3 restarts in 5 s, backoff 100 ms to 30 s) [default: the role's]
    #[arg(long, value_name = "POLICY")]
    pub restart: Option<RestartPolicy>,
    /// How its children are restarted: one_for_one, one_for_all or rest_for_one [default: the role's]
    #[arg(long)]
    pub strategy: Option<Strategy>,
    /// Variable for an exec process's environment, KEY=VALUE (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Working directory of an exec process's command [default: the current directory].
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// On a node of a cluster: the node to run on, whichever node its
    /// parent is on [default: the parent's node].
    #[arg(long, value_name = "NODE")]
    pub node: Option<String>,
    /// On a node of a cluster: a label its node must have, LABEL=VALUE
    /// (repeatable; of the live nodes with them all, the one with the
    /// fewest processes).
    #[arg(long = "where", value_name = "LABEL=VALUE", value_parser = parse_label)]
    pub node_labels: Vec<(String, String)>,
    /// Print `{"pid": N}` instead of the bare PID.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub client: ClientArgs,
    /// The OS command of an exec process, after `--` (runtime exec is then the default):
    /// a program name looked up in PATH or an absolute path, and its arguments.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// Arguments of `hivekernel kill`.
#[derive(Debug, Args)]
pub struct KillArgs {
    /// The process to kill, with its subtree.
    #[arg(value_name = "PROCESS")]
    pub pid: Target,
    /// Why, recorded in the exit records.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
    /// Accepted and ignored: kill always takes the whole subtree, leaves first.
    #[arg(long, short)]
    pub recursive: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Arguments of `hivekernel restart`.
#[derive(Debug, Args)]
pub struct RestartArgs {
    /// The process to restart (its subtree is killed).
    #[arg(value_name = "PROCESS")]
    pub pid: Target,
    /// Why, recorded in the `exited` events.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
    /// Print `{"pid": N, "attempt": N}`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Arguments of `hivekernel exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// The process to run the task on.
    #[arg(value_name = "PROCESS")]
    pub pid: Target,
    /// The task description.
    pub text: String,
    /// Give up after this many seconds [default: the target's task timeout]
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    pub timeout: Option<Duration>,
    /// Print {"request_id","success","output","error","trace_id"} as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Arguments of `hivekernel send`.
#[derive(Debug, Args)]
pub struct SendArgs {
    /// The recipient.
    #[arg(value_name = "PROCESS")]
    pub pid: Target,
    /// The message body.
    pub text: String,
    /// Message type [default: message]
    #[arg(long = "type", value_name = "TYPE")]
    pub kind: Option<String>,
    /// Priority: critical, high, normal or low [default: normal]
    #[arg(long)]
    pub priority: Option<Priority>,
    /// Drop the message if it is not delivered within this many milliseconds.
    #[arg(long, value_name = "N")]
    pub ttl_ms: Option<u64>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Arguments of `hivekernel wait`.
#[derive(Debug, Args)]
pub struct WaitArgs {
    /// The child to wait for.
    #[arg(value_name = "PROCESS")]
    pub pid: Target,
    /// Give up after this many seconds [default: wait without limit]
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    pub timeout: Option<Duration>,
    /// Print the exit record as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Arguments of `hivekernel events`.
#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Keep printing live events until Ctrl-C. Replays first only when --since is given.
    #[arg(long, short)]
    pub follow: bool,
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
    /// Replay retained events with a sequence number above N [default: 0, everything retained]
    #[arg(long, value_name = "N")]
    pub since: Option<u64>,
    /// Only the events of this process.
    #[arg(long, value_name = "PROCESS")]
    pub pid: Option<Target>,
    /// With --pid: the events of its whole subtree (descendants spawned later too).
    #[arg(long, requires = "pid")]
    pub subtree: bool,
    /// Only events of these types (spawned, exited, llm_call, tool_call, denied, ...).
    #[arg(long = "type", value_name = "TYPE[,TYPE]", value_delimiter = ',')]
    pub types: Vec<String>,
    /// Only the newest N of the retained events that match, at most 100000
    /// (then live ones with --follow).
    #[arg(long, value_name = "N")]
    pub tail: Option<usize>,
    /// Only the events of one trace: all the work one request caused (the
    /// trace id `exec --json` prints, or the one a client sent as `traceparent`).
    #[arg(long, value_name = "TRACE_ID")]
    pub trace: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Arguments of `hivekernel describe`.
#[derive(Debug, Args)]
pub struct DescribeArgs {
    /// The process.
    #[arg(value_name = "PROCESS")]
    pub pid: Target,
    /// One JSON object: the process as `ps --json` shows it, plus `children` and `cron`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Arguments of `hivekernel logs`.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The process.
    #[arg(value_name = "PROCESS")]
    pub pid: Target,
    /// Keep printing entries as they are recorded, until the process exits or Ctrl-C.
    #[arg(long, short)]
    pub follow: bool,
    /// Only the newest N turns (a turn is one task or message the process handled).
    #[arg(long, value_name = "N")]
    pub tail: Option<u32>,
    /// Only entries recorded within this long before now: 90s, 10m, 2h, 1d, 1h30m.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub since: Option<Duration>,
    /// One JSON object per entry, per line (the detail's fields, plus id, pid, turn, at_unix_ms, type).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `hivekernel artifacts ...`.
#[derive(Debug, Subcommand)]
pub enum ArtifactsCommand {
    /// List artifacts, newest first (the admin sees every one): a table, or JSON.
    Ls(ArtifactsLsArgs),
    /// Store FILE (or stdin, with -) as artifact NAME; prints its id. Storing
    /// a name the owner already has replaces that artifact.
    Put(ArtifactsPutArgs),
    /// Write an artifact's content, byte for byte, to stdout or to a file.
    Get(ArtifactsGetArgs),
    /// Delete an artifact.
    Rm(ArtifactsRmArgs),
}

/// Arguments of `hivekernel artifacts ls`.
#[derive(Debug, Args)]
pub struct ArtifactsLsArgs {
    /// Only this process's artifacts.
    #[arg(long, value_name = "PROCESS")]
    pub owner: Option<Target>,
    /// Print one JSON array of artifact objects.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Arguments of `hivekernel artifacts put`.
#[derive(Debug, Args)]
pub struct ArtifactsPutArgs {
    /// The artifact's name (unique per owner).
    pub name: String,
    /// The file to store, or - for stdin.
    #[arg(value_name = "FILE|-")]
    pub file: PathBuf,
    /// Store it as this process's [default: PID 1, the kernel]
    #[arg(long, value_name = "PROCESS")]
    pub owner: Option<Target>,
    /// MIME type [default: text/plain]
    #[arg(long = "type", value_name = "TYPE")]
    pub content_type: Option<String>,
    /// Who may read it: private, user, subtree or global [default: user]
    #[arg(long)]
    pub visibility: Option<Visibility>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Arguments of `hivekernel artifacts get`.
#[derive(Debug, Args)]
pub struct ArtifactsGetArgs {
    /// The artifact's id.
    pub id: u64,
    /// Write the content to this file instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Arguments of `hivekernel artifacts rm`.
#[derive(Debug, Args)]
pub struct ArtifactsRmArgs {
    /// The artifact's id.
    pub id: u64,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// The `hivekernel` binary's whole run: the async runtime, the command
/// line, logging, the command, and the exit code it ends with.
///
/// It lives here rather than in `main.rs` so that the runtime polls the
/// command's future in this crate: a future first polled in the binary is
/// compiled there, with every async call under it, a second time.
pub fn main() -> i32 {
    // Started as the sandbox helper: that, before any thread exists.
    if let Some(code) = hivekernel_agents::sandbox::helper::dispatch() {
        return code;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build();
    match runtime {
        Ok(runtime) => runtime.block_on(async {
            let mut matches = Cli::command().get_matches();
            let token_in_argv = client::token_in_argv(&matches);
            let args = Cli::from_arg_matches_mut(&mut matches)
                .unwrap_or_else(|err| err.format(&mut Cli::command()).exit());
            let config = match &args.command {
                Command::Start(start) => Some(start.config.as_path()),
                _ => None,
            };
            crate::logging::init(
                args.log_level.as_deref(),
                args.log_format.as_deref(),
                config,
            );
            if token_in_argv {
                eprintln!("{}", client::TOKEN_IN_ARGV);
            }
            match run(args).await {
                Ok(()) => 0,
                Err(err) => {
                    err.report();
                    err.exit_code()
                }
            }
        }),
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            1
        }
    }
}

/// Runs one command; the caller turns an error into its exit code.
pub async fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Start(args) => start(args).await,
        Command::Llm(LlmCommand::Check {
            config,
            model,
            json,
        }) => llm::check(&config, model.as_deref(), json).await,
        Command::Config(ConfigCommand::Check { config, model }) => {
            config_check(&config, model.as_deref()).await
        }
        Command::Skills(SkillsCommand::Check { dir, json }) => skills::check(&dir, json),
        Command::Skills(SkillsCommand::Ls { json, client }) => skills::ls(json, &client).await,
        Command::Skills(SkillsCommand::Show {
            name,
            owner,
            json,
            client,
        }) => skills::show(&name, owner, json, &client).await,
        Command::Skills(SkillsCommand::History {
            name,
            owner,
            json,
            client,
        }) => skills::history(&name, owner, json, &client).await,
        Command::Skills(SkillsCommand::Rm {
            name,
            owner,
            reason,
            client,
        }) => skills::rm(&name, owner, reason, &client).await,
        Command::Config(ConfigCommand::Reload { json, client }) => {
            reload::reload(json, &client).await
        }
        Command::Ps(args) => ps::ps(args).await,
        Command::Spawn(args) => process::spawn(args).await,
        Command::Describe(args) => describe::describe(args).await,
        Command::Kill(args) => process::kill(args).await,
        Command::Restart(args) => process::restart(args).await,
        Command::Wait(args) => process::wait(args).await,
        Command::Exec(args) => task::exec(args).await,
        Command::Send(args) => task::send(args).await,
        Command::Events(args) => events::events(args).await,
        Command::Logs(args) => logs::logs(args).await,
        Command::Cron(command) => cron::run(command).await,
        Command::Mcp(command) => mcp::run(command).await,
        Command::Token(command) => token::run(command).await,
        Command::Inbox(args) => inbox::inbox(args).await,
        Command::Approve { id, note, client } => {
            inbox::resolve(&client, id, inbox::Verdict::Approve, note).await
        }
        Command::Deny { id, reason, client } => {
            inbox::resolve(&client, id, inbox::Verdict::Deny, reason).await
        }
        Command::Answer { id, text, client } => {
            inbox::resolve(&client, id, inbox::Verdict::Answer, text).await
        }
        Command::Artifacts(ArtifactsCommand::Ls(args)) => artifacts::ls(args).await,
        Command::Artifacts(ArtifactsCommand::Put(args)) => artifacts::put(args).await,
        Command::Artifacts(ArtifactsCommand::Get(args)) => artifacts::get(args).await,
        Command::Artifacts(ArtifactsCommand::Rm(args)) => artifacts::rm(args).await,
        Command::Usage(args) => usage::usage(args).await,
        Command::Cluster(ClusterCommand::Secret { file }) => nodes::new_secret(&file),
        Command::Nodes {
            command:
                Some(NodesCommand::Forget {
                    name,
                    config,
                    cluster,
                }),
            ..
        } => nodes::forget(&name, config, cluster).await,
        Command::Nodes { json, client, .. } => nodes::run(json, &client).await,
        Command::Backup { dest, local } => backup::backup(dest, local).await,
        Command::Restore { src, local } => backup::restore(src, local).await,
        Command::Completion { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "hivekernel", &mut script);
            output::print(&String::from_utf8_lossy(&script))
        }
    }
}

async fn start(args: StartArgs) -> Result<(), CliError> {
    let options = StartOptions {
        config: args.config,
        listen: args.listen,
        data_dir: args.data_dir,
        insecure_remote: args.insecure_remote,
        tls: crate::tls::TlsFlags {
            cert: args.tls_cert,
            key: args.tls_key,
            client_ca: args.tls_client_ca,
            ca: args.tls_ca,
        },
        metrics_listen: args.metrics_listen,
        model: args.model,
        dashboard: match (args.dashboard, args.no_dashboard) {
            (_, true) => Some(crate::config::DashboardSettings {
                enabled: Some(false),
                listen: None,
                hosts: Vec::new(),
            }),
            (Some(listen), false) => Some(crate::config::DashboardSettings {
                enabled: Some(true),
                listen,
                hosts: Vec::new(),
            }),
            (None, false) => None,
        },
        cluster: args.cluster.cluster,
        node: args.node,
        insecure_cluster: args.cluster.insecure_cluster,
        cluster_secret: args.cluster.cluster_secret,
    };
    daemon::run(options).await.map_err(CliError::Start)
}

async fn config_check(path: &std::path::Path, model: Option<&str>) -> Result<(), CliError> {
    let registry = RuntimeRegistry::builtin();
    let mut config = Config::load(path, &registry.known()).map_err(CliError::Config)?;
    config.serve_all(model);
    let issues = daemon::environment_issues(&config).await;
    if !issues.is_empty() {
        return Err(CliError::Config(crate::config::ConfigError {
            file: path.to_owned(),
            issues,
        }));
    }
    let count = config.agents.len();
    let noun = if count == 1 { "agent" } else { "agents" };
    let mut text = format!("ok: {}: {count} {noun}\n", path.display());
    let grants = crate::config::Grants::of(&config);
    text.push_str(&grants.agent_lines());
    let (models, unset) = config.model_lines();
    text.push_str(&models);
    let unsigned = config
        .kernel
        .cluster
        .as_ref()
        .filter(|cluster| cluster.secret_file.is_none())
        .map(|_| crate::cluster::UNSIGNED_WARNING.to_owned());
    for warning in grants.warnings().into_iter().chain(unset).chain(unsigned) {
        eprintln!("warning: {warning}");
    }
    output::print(&text)
}

fn parse_scope(text: &str) -> Result<crate::caller::Scope, String> {
    text.parse()
}

/// Parses `KEY=VALUE`.
fn parse_label(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((label, value)) if !label.is_empty() => Ok((label.to_owned(), value.to_owned())),
        _ => Err(format!("expected LABEL=VALUE, got {text:?}")),
    }
}

fn parse_env(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {text:?}"))
}

/// Parses a duration written as numbers with units, largest first:
/// `500ms`, `90s`, `10m`, `2h`, `1d`, `1h30m`.
/// Where `usage --since` starts: a while ago, or a UTC day.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Since {
    /// This long before now.
    Ago(Duration),
    /// This day, `YYYY-MM-DD`.
    Day(String),
}

fn parse_since(text: &str) -> Result<Since, String> {
    if crate::store::usage::is_day(text.trim()) {
        return Ok(Since::Day(text.trim().to_owned()));
    }
    parse_duration(text).map(Since::Ago).map_err(|_| {
        format!("expected a duration such as 7d or 24h, or a day such as 2026-11-01, got {text:?}")
    })
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("expected a duration such as 90s, 10m, 2h or 1d, got {text:?}");
    let mut total = Duration::ZERO;
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let number: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let millis = match &rest[..unit] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(bad()),
        };
        rest = &rest[unit..];
        let part = number.checked_mul(millis).ok_or_else(bad)?;
        total = total
            .checked_add(Duration::from_millis(part))
            .ok_or_else(bad)?;
    }
    Ok(total)
}

/// Parses a positive number of seconds, fractions allowed.
fn parse_seconds(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .parse()
        .map_err(|_| format!("expected a number of seconds, got {text:?}"))?;
    if seconds.is_nan() || seconds <= 0.0 {
        return Err(format!("must be more than 0 seconds, got {text}"));
    }
    Duration::try_from_secs_f64(seconds).map_err(|err| format!("{text} seconds: {err}"))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn help_ends_with_where_the_docs_are() {
        let help = Cli::command().render_help().to_string();
        assert!(
            help.trim_end().ends_with(
                "docs/ARCHITECTURE.md (how the kernel works, and the file behind each behaviour)."
            ),
            "{help}"
        );
        for doc in ["README.md", "docs/CONFIG.md", "docs/ARCHITECTURE.md"] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(doc);
            assert!(path.is_file(), "{} is named in --help", path.display());
        }
    }

    #[test]
    fn a_token_is_warned_of_only_when_on_the_command_line() -> Result<(), clap::Error> {
        let parse = |args: &[&str]| {
            Cli::command().try_get_matches_from(std::iter::once("hivekernel").chain(args.to_vec()))
        };
        let warned = |args: &[&str]| parse(args).map(|m| client::token_in_argv(&m));
        assert!(warned(&["ps", "--token", "x"])?);
        assert!(warned(&["cron", "ls", "--token=x"])?);
        assert!(!warned(&["ps"])?);
        assert!(!warned(&["ps", "--token-file", "t"])?);
        assert!(!warned(&["config", "check", "c.json"])?);
        // `token revoke TOKEN` names a token to revoke, not one to use.
        assert!(!warned(&["token", "revoke", "ci"])?);
        // Both parse: which one is used is settled once it is known
        // which came from the environment (`client::load_token`).
        assert!(warned(&["ps", "--token", "x", "--token-file", "t"])?);
        assert!(!client::TOKEN_IN_ARGV.contains('\n'));
        Ok(())
    }

    #[test]
    fn seconds_parse_and_reject_nonsense() {
        assert_eq!(parse_seconds("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_seconds("0").is_err());
        assert!(parse_seconds("-1").is_err());
        assert!(parse_seconds("NaN").is_err());
        assert!(parse_seconds("soon").is_err());
    }

    #[test]
    fn durations_parse_with_units_and_reject_nonsense() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        for bad in ["", "10", "m", "5x", "1.5h", "-1m", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn bad_role_is_a_usage_error_listing_the_values() {
        let err = Cli::try_parse_from([
            "hivekernel",
            "spawn",
            "--parent",
            "1",
            "--name",
            "w",
            "--role",
            "boss",
        ])
        .err()
        .map(|err| (err.exit_code(), err.to_string()));
        let (code, text) = err.unwrap_or_default();
        assert_eq!(code, 2);
        assert!(text.contains("worker"), "{text}");
    }

    #[test]
    fn spawn_takes_a_restart_policy_and_a_strategy() {
        let spawn = |extra: &[&str]| {
            let args = ["hivekernel", "spawn", "--parent", "1", "--name", "w"];
            Cli::try_parse_from(args.iter().chain(extra))
        };
        let parsed = spawn(&["--restart", "permanent", "--strategy", "rest_for_one"]);
        let Ok(Cli {
            command: Command::Spawn(args),
            ..
        }) = parsed
        else {
            panic!("not a spawn: {parsed:?}");
        };
        assert_eq!(args.restart, Some(RestartPolicy::Permanent));
        assert_eq!(args.strategy, Some(Strategy::RestForOne));
        let text = spawn(&["--restart", "forever"])
            .err()
            .map(|e| e.to_string());
        assert!(
            text.unwrap_or_default()
                .contains("permanent, transient, temporary")
        );
    }

    #[test]
    fn prompt_and_prompt_file_conflict() {
        let parsed = Cli::try_parse_from([
            "hivekernel",
            "spawn",
            "--parent",
            "1",
            "--name",
            "w",
            "--prompt",
            "x",
            "--prompt-file",
            "f",
        ]);
        assert!(parsed.is_err());
    }

    #[test]
    fn clap_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
