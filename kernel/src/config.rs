//! The JSON startup config: kernel settings and the agents PID 1 starts.
//!
//! Loading runs in two phases, so that one mistake never hides another.
//! `parse` reads each section on its own, key by key, and reports every key
//! that does not deserialize at its path (inside nested values too). Most
//! sections deserialize straight into their settings types, which declare
//! their defaults (`Default`), their ranges (`#[validate]` attributes, run
//! by `parse::settings`) and their meaning (doc comments, from which
//! `reference` generates docs/CONFIG.md's tables). [`KernelSettings`] is
//! the `kernel` section itself; its keys that need the environment or the
//! config's directory (`tls`, `exec`, `notify`, `metrics`, `cluster`,
//! `otel`) are read apart, by their modules. The agent entries and those
//! sections still go through a `Raw*` struct as written. `validate` makes
//! the checks that cross fields and sections: names, runtimes, tools,
//! capabilities, limits, paths and prompt files. Every issue is collected,
//! with its location, before [`Config::load`] returns; a config with any
//! issue starts nothing.
//!
//! Layout: `parse` (phase 1), `validate` (phase 2 and the `kernel`
//! section), `model` (`llm`, `tool_agent`), `supervision` (`roles`, and the
//! restart specs and strategies of roles and agents), `storage`
//! (`kernel.storage`, `artifacts`, `memory`, `transcripts`), `connections`
//! (`kernel.connections`), `tls` (`kernel.tls`), `sandbox`
//! (`tool_agent.shell`, `kernel.exec`), `mcp` (`mcp_servers`), `skills`
//! (`kernel.skills`, an agent's `skills`, `tool_agent.skills`),
//! `observe` (`kernel.metrics`, `log`, `otel`, `dashboard`), `notify`
//! (`kernel.notify`), `cluster` (`kernel.cluster`), `approval` (approval
//! rules), `cron` (agents' `cron` entries and `templates`). The tests of
//! what a config says are kernel/tests/config.rs, through [`Config::load`].

mod approval;
mod cluster;
pub use cluster::{
    ClusterSettings, MIN_SECRET_BYTES, host_name, node_name_problem, parse_servers, read_secret,
};
mod connections;
pub use connections::ConnectionSettings;
mod cron;
mod mcp;
pub use mcp::{McpServerSpec, McpToolFilter, McpTransport};
mod model;
pub(crate) use model::TOOL_AGENT;
mod notify;
mod observe;
pub(crate) use model::{base_url_problem, url_problem};
pub use observe::{
    DEFAULT_LOG_LEVEL, DashboardSettings, LogFormat, LogSettings, MetricsSettings, OtelProtocol,
    OtelSettings, check_log_level,
};
mod parse;
mod sandbox;
mod skills;
pub use sandbox::{ExecSettings, LogRotation};
pub(crate) use sandbox::{check_grants, lexical};
mod storage;
pub use storage::{ArtifactSettings, MemorySettings, StorageSettings, TranscriptSettings};
mod supervision;
pub use supervision::Grants;
mod tls;
mod validate;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use hivekernel_agents::tool_agent::AgentSettings;
use hivekernel_agents::tools::ToolSettings;
use hivekernel_agents::{
    Capabilities, Capability, LimitOverrides, RestartSpec, Role, Strategy, Tier,
};
use serde::Deserialize;
use validator::Validate;

/// A validated startup config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The config file it was read from.
    pub path: PathBuf,
    /// Kernel-wide settings.
    pub kernel: KernelSettings,
    /// The model provider (the `llm` section).
    pub llm: LlmConfig,
    /// How `tool_agent` processes behave (the `tool_agent` section, plus the
    /// context sizes from `llm`).
    pub agent: AgentSettings,
    /// Settings of the configurable built-in tools (`tool_agent.orchestrate`, ...).
    pub tools: ToolSettings,
    /// Agents started as children of PID 1, in file order.
    pub agents: Vec<AgentSpec>,
    /// Agent specs the cron `spawn` action starts from; never started on their own.
    pub templates: Vec<AgentSpec>,
    /// MCP servers the kernel starts and supervises (`mcp_servers`), sorted
    /// by name; disabled ones are listed too.
    pub mcp: Vec<McpServerSpec>,
}

/// What the config may name: registered runtimes and tools.
#[derive(Debug, Clone, Default)]
pub struct Known {
    /// Registered runtime names.
    pub runtimes: Vec<String>,
    /// Registered tool names.
    pub tools: Vec<String>,
    /// The capability each tool that needs one needs.
    pub tool_capabilities: BTreeMap<String, Capability>,
}

/// Which model provider the kernel uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(try_from = "String")]
pub enum ProviderChoice {
    /// `openai` when an endpoint is configured (`base_url`,
    /// `HIVEKERNEL_LLM_BASE_URL`, or the API key variable is set), else `scripted`.
    #[default]
    Auto,
    /// The deterministic offline provider.
    Scripted,
    /// An OpenAI-compatible chat-completions endpoint.
    OpenAi,
}

impl TryFrom<String> for ProviderChoice {
    type Error = String;

    fn try_from(name: String) -> Result<Self, String> {
        match name.as_str() {
            "auto" => Ok(ProviderChoice::Auto),
            "scripted" => Ok(ProviderChoice::Scripted),
            "openai" => Ok(ProviderChoice::OpenAi),
            other => Err(format!(
                "unknown provider {other:?} (expected one of: auto, scripted, openai)"
            )),
        }
    }
}

/// The `llm` section, as written: the provider, what the kernel asks of
/// it, and the model names, context sizes and prices agents use.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, validator::Validate)]
#[serde(default, deny_unknown_fields)]
pub struct LlmConfig {
    /// Which provider.
    pub provider: ProviderChoice,
    /// API root of the OpenAI-compatible endpoint; `None` takes
    /// `HIVEKERNEL_LLM_BASE_URL`, else `https://api.openai.com/v1`.
    #[validate(custom(function = "model::base_url_check"))]
    pub base_url: Option<String>,
    /// Environment variable holding the API key (never the key itself).
    #[validate(custom(function = "model::env_name_check"))]
    pub api_key_env: String,
    /// Logical model name -> the id the server is sent.
    pub models: BTreeMap<String, String>,
    /// The logical model of an agent or spawn that names none.
    pub default_model: Option<String>,
    /// Context window per logical model, in tokens.
    pub context_tokens: BTreeMap<String, u64>,
    /// Context window of a model not in `context_tokens`.
    #[validate(range(min = 1024, max = model::MAX_CONTEXT))]
    pub default_context_tokens: u64,
    /// `max_tokens` of a model call that names none (orchestrate's
    /// planning and combining calls); the `tool_agent` sends its own.
    #[validate(range(min = 1, max = 1_000_000))]
    pub max_completion_tokens: u32,
    /// Ask for answers streamed (server-sent events).
    pub stream: bool,
    /// Longest wait for a streamed answer's first event.
    #[validate(range(min = 1, max = 86_400))]
    pub first_token_timeout_seconds: u64,
    /// Longest silence between two events of a streamed answer.
    #[validate(range(min = 1, max = 86_400))]
    pub idle_timeout_seconds: u64,
    /// Cap on one HTTP attempt, streamed or not.
    #[validate(range(min = 1, max = 86_400))]
    pub request_timeout_seconds: u64,
    /// Retries on 429, other 5xx, transport errors and timeouts.
    #[validate(range(min = 0, max = 10))]
    pub max_retries: u32,
    /// How long a server that refuses connections or answers 502/503 is
    /// waited for (starting, loading its model), besides the retries.
    #[validate(range(min = 0, max = 3600))]
    pub unavailable_wait_seconds: u64,
    /// Kernel-wide cap on model requests in flight; more wait their turn.
    #[validate(range(min = 1, max = 10_000))]
    pub max_in_flight: usize,
    /// Send roles strictly alternating from the first request (else only
    /// once the server refuses anything else).
    pub strict_roles: bool,
    /// Refuse to start when the server's model list lacks a model the
    /// config sends (else a warning).
    pub strict_models: bool,
    /// `parallel_tool_calls` sent with requests that offer tools; `None`
    /// sends nothing.
    pub parallel_tool_calls: Option<bool>,
    /// Most bytes of one answer.
    #[validate(range(min = model::MIN_ANSWER_BYTES, max = 268_435_456))]
    pub max_answer_bytes: usize,
    /// Most tool calls in one answer.
    #[validate(range(min = 1, max = 4096))]
    pub max_tool_calls: usize,
    /// Most bytes of a request's tool definitions.
    #[validate(range(min = model::MIN_TOOL_DEFINITION_BYTES, max = 67_108_864))]
    pub max_tool_definition_bytes: usize,
    /// Model name -> dollars per million tokens.
    #[serde(deserialize_with = "parse::object_values")]
    pub prices: BTreeMap<String, crate::budget::Price>,
}

impl LlmConfig {
    /// The caps on an answer and a request's tool definitions.
    pub fn limits(&self) -> hivekernel_agents::llm::Limits {
        hivekernel_agents::llm::Limits {
            answer_bytes: self.max_answer_bytes,
            tool_calls: self.max_tool_calls,
            tool_definition_bytes: self.max_tool_definition_bytes,
        }
    }
}

impl Default for LlmConfig {
    fn default() -> Self {
        let agent = AgentSettings::default();
        let limits = hivekernel_agents::llm::Limits::default();
        LlmConfig {
            provider: ProviderChoice::Auto,
            base_url: None,
            api_key_env: "OPENAI_API_KEY".into(),
            models: BTreeMap::new(),
            default_model: None,
            context_tokens: BTreeMap::new(),
            default_context_tokens: agent.default_context_tokens,
            max_completion_tokens: agent.max_completion_tokens,
            stream: true,
            first_token_timeout_seconds: 120,
            idle_timeout_seconds: 60,
            request_timeout_seconds: 600,
            max_retries: 3,
            unavailable_wait_seconds: 60,
            max_in_flight: 16,
            strict_roles: false,
            strict_models: false,
            parallel_tool_calls: None,
            max_answer_bytes: limits.answer_bytes,
            max_tool_calls: limits.tool_calls,
            max_tool_definition_bytes: limits.tool_definition_bytes,
            prices: BTreeMap::new(),
        }
    }
}

/// One served model every logical model name is sent as (`start --model`).
pub const MODEL_ENV: &str = "HIVEKERNEL_LLM_MODEL";

/// Which model a process uses and what the server is sent for it
/// (`llm.models`, `llm.default_model`, and `--model` or
/// `HIVEKERNEL_LLM_MODEL`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModelNames {
    /// Logical model name -> the id the server is sent; names not in the
    /// map are sent as they are.
    pub models: BTreeMap<String, String>,
    /// The logical model of an agent or spawn that names none.
    pub default_model: Option<String>,
    /// One served model every logical name is sent as, whatever `models`
    /// says (`--model`, `HIVEKERNEL_LLM_MODEL`).
    pub serve_all: Option<String>,
    /// Every logical model the config names: `models`, the default,
    /// orchestrate's `worker_model`, its agents' and templates'. A process
    /// gives its children one of these (or one on its own line) unless it
    /// holds `any_model`.
    pub configured: BTreeSet<String>,
}

impl ModelNames {
    /// The logical model a process asking for `model` uses: it, or the
    /// default when it names none (empty when there is no default).
    pub fn model_of<'a>(&'a self, model: &'a str) -> &'a str {
        match (model.is_empty(), &self.default_model) {
            (true, Some(default)) => default,
            _ => model,
        }
    }

    /// The model id the server is sent for logical `model`.
    pub fn served<'a>(&'a self, model: &'a str) -> &'a str {
        match &self.serve_all {
            Some(all) => all,
            None => self.models.get(model).map_or(model, String::as_str),
        }
    }

    /// The name a price is kept under for calls to logical `model`: the
    /// one served model when every name is sent as it (a local model has
    /// no price unless one is set for it), else the logical name (whose
    /// price is its own or its served id's).
    pub fn priced_as<'a>(&'a self, model: &'a str) -> &'a str {
        self.serve_all.as_deref().unwrap_or(model)
    }

    /// Whether the config names logical `model` (see [`ModelNames::configured`]).
    pub fn is_configured(&self, model: &str) -> bool {
        self.configured.contains(model)
            || self.models.contains_key(model)
            || self.default_model.as_deref() == Some(model)
    }

    /// Whether both send every logical name to the same served model (the
    /// names the config's agents use come and go with the agents).
    pub fn sends_like(&self, other: &ModelNames) -> bool {
        self.models == other.models
            && self.default_model == other.default_model
            && self.serve_all == other.serve_all
    }
}

/// Longest timeout or interval the kernel takes, in seconds (30 days).
const MAX_SECONDS: u64 = 2_592_000;
/// [`MAX_SECONDS`] in milliseconds.
const MAX_MS: u64 = 2_592_000_000;
/// Largest `kernel.mailbox_max_bytes` (the byte counts are 32-bit).
const MAX_MAILBOX_BYTES: u64 = u32::MAX as u64;

/// Kernel-wide settings: the `kernel` section as written, which
/// deserializes straight into it, then the fields filled from other
/// sections and the sections read with the environment or the config's
/// directory (each marked where it is read).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Validate)]
#[serde(default, deny_unknown_fields)]
pub struct KernelSettings {
    /// Address the gRPC server binds.
    #[serde(deserialize_with = "observe::grpc_address")]
    pub listen: SocketAddr,
    /// Data directory, resolved relative to the config file's directory.
    pub data_dir: PathBuf,
    /// Levels of processes allowed below PID 1.
    #[validate(range(min = 1, max = 64))]
    pub max_depth: u32,
    /// Ceiling on live children of any one process, PID 1 included.
    #[validate(range(min = 1, max = 100_000))]
    pub max_children: u32,
    /// Messages a mailbox holds before senders get backpressure.
    #[validate(range(min = 1, max = 1_000_000))]
    pub mailbox_capacity: usize,
    /// Bytes of messages and tasks a mailbox holds before senders get
    /// backpressure; an empty mailbox takes any one message.
    #[validate(range(min = 1024, max = MAX_MAILBOX_BYTES))]
    pub mailbox_max_bytes: u64,
    /// A waiting message rises one priority level per this many milliseconds.
    #[validate(range(min = 1, max = MAX_MS))]
    pub mailbox_aging_ms: u64,
    /// Zombies their parent does not collect are reaped after this many seconds.
    #[validate(range(max = MAX_SECONDS))]
    pub zombie_timeout_seconds: u64,
    /// Whether processes whose restart policy is `temporary` come back after
    /// a kernel restart too (every other live process does).
    pub restore_temporary: bool,
    /// Default `execute_task` timeout.
    #[validate(range(min = 1, max = MAX_SECONDS))]
    pub task_timeout_seconds: u64,
    /// Tasks one process works on at the same time.
    #[validate(range(min = 1))]
    pub max_concurrent_tasks: u32,
    /// How long shutdown waits for processes before forcing them.
    #[validate(range(max = 3_600_000))]
    pub shutdown_grace_ms: u64,
    /// Runtime for agents that name none; must be registered.
    pub default_runtime: String,
    /// Root of the agents' workspaces (each gets `<workspace>/<name>/`);
    /// `None` means `<data_dir>-workspace`, beside the data directory.
    pub workspace: Option<PathBuf>,
    /// How hard the store pushes each commit to disk.
    pub synchronous: crate::store::Synchronous,
    /// Events the store keeps (the newest ones).
    #[validate(range(min = 1_000, max = 1_000_000_000))]
    pub event_log_limit: u64,
    /// Defaults per role (the `roles` section); a role not listed has none.
    #[serde(skip)]
    pub roles: HashMap<Role, RoleSettings>,
    /// Storage quotas on the store and on subtrees (`kernel.storage`).
    #[validate(nested)]
    #[serde(deserialize_with = "parse::object")]
    pub storage: StorageSettings,
    /// Size limits on artifacts (`kernel.artifacts`).
    #[validate(nested)]
    #[serde(deserialize_with = "parse::object")]
    pub artifacts: ArtifactSettings,
    /// Size limits on agent memory (`kernel.memory`).
    #[validate(nested)]
    #[serde(deserialize_with = "parse::object")]
    pub memory: MemorySettings,
    /// What transcripts keep, and for how long (`kernel.transcripts`).
    #[validate(nested)]
    #[serde(deserialize_with = "parse::object")]
    pub transcripts: TranscriptSettings,
    /// Size limits on what callers send (`kernel.limits`).
    #[validate(nested)]
    #[serde(deserialize_with = "parse::object")]
    pub limits: crate::limits::InputLimits,
    /// How the control plane treats connections (`kernel.connections`).
    #[validate(nested)]
    #[serde(deserialize_with = "parse::object")]
    pub connections: ConnectionSettings,
    /// What model calls cost, by model name (filled from `llm.prices`).
    #[serde(skip)]
    pub prices: crate::Prices,
    /// Model names: the default, and what the server is sent (from `llm`).
    #[serde(skip)]
    pub models: ModelNames,
    /// TLS on the control plane (`kernel.tls`, read by `tls::tls`);
    /// `None`: plain text.
    #[serde(deserialize_with = "parse::read_apart")]
    pub tls: Option<crate::tls::TlsFiles>,
    /// Whether `exec` agents run in the sandbox (`kernel.exec`, read by
    /// `sandbox::exec`).
    #[serde(deserialize_with = "parse::read_apart")]
    pub exec: ExecSettings,
    /// The inbox's webhook (`kernel.notify`, read with the environment by
    /// `notify::notify`); `None`: none.
    #[serde(deserialize_with = "parse::read_apart")]
    pub notify: Option<crate::notify::NotifySettings>,
    /// The metrics listener (`kernel.metrics`, read by `observe::metrics`);
    /// `None`: no metrics are kept.
    #[serde(deserialize_with = "parse::read_apart")]
    pub metrics: Option<MetricsSettings>,
    /// The web dashboard (`kernel.dashboard`).
    #[serde(deserialize_with = "parse::object")]
    pub dashboard: DashboardSettings,
    /// This kernel as a node of a cluster (`kernel.cluster`, read by
    /// `cluster::cluster`, or `--cluster`); `None`: it runs alone.
    #[serde(deserialize_with = "parse::read_apart")]
    pub cluster: Option<ClusterSettings>,
    /// What is logged, and how (`kernel.log`).
    #[validate(nested)]
    #[serde(deserialize_with = "parse::object")]
    pub log: LogSettings,
    /// Where traces are exported (`kernel.otel` with the `OTEL_*`
    /// variables, read by `observe::otel`); `None`: no spans are made.
    #[serde(deserialize_with = "parse::read_apart")]
    pub otel: Option<OtelSettings>,
    /// Directories of skills every process may see (`kernel.skills`), in
    /// order: a later one's skill wins over an earlier one's of the same name.
    pub skills: Vec<PathBuf>,
}

/// What processes of `role` may do under `roles`: its entry's list, else
/// the role's least-privilege default ([`Capabilities::role_default`]; PID 1
/// always has every capability).
pub fn role_capabilities(roles: &HashMap<Role, RoleSettings>, role: Role) -> Capabilities {
    if role == Role::Kernel {
        return Capabilities::ALL;
    }
    roles
        .get(&role)
        .and_then(|settings| settings.capabilities)
        .unwrap_or_else(|| Capabilities::role_default(role))
}

/// What one role gets unless a process asks otherwise (one entry of `roles`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoleSettings {
    /// Restart spec of processes of this role; `None`: temporary.
    pub restart: Option<RestartSpec>,
    /// Strategy of processes of this role for their children; `None`: one_for_one.
    pub strategy: Option<Strategy>,
    /// What processes of this role may do (`"all"` is every one); `None`:
    /// the role's default, [`Capabilities::role_default`].
    pub capabilities: Option<Capabilities>,
    /// Tool calls of processes of this role that need a person's approval.
    pub approval: Vec<hivekernel_agents::ApprovalRule>,
}

impl KernelSettings {
    /// What processes of `role` may do: its `roles` entry's list, else the
    /// role's default (PID 1 always has every capability).
    pub fn capabilities(&self, role: Role) -> Capabilities {
        role_capabilities(&self.roles, role)
    }

    /// The root of the agents' workspaces: `kernel.workspace`, else the data
    /// directory's path with `-workspace` added (`.hivekernel` ->
    /// `.hivekernel-workspace`), beside it and never inside it, so that no
    /// agent works next to the admin token and the store.
    pub fn workspace_root(&self) -> PathBuf {
        match &self.workspace {
            Some(root) => root.clone(),
            None => beside(&self.data_dir),
        }
    }

    /// What commands run for agents must never reach: the data directory,
    /// and the root of the workspaces (each command gets its own workspace).
    pub fn keep_out(&self) -> hivekernel_agents::sandbox::KeepOut {
        hivekernel_agents::sandbox::KeepOut {
            forbidden: vec![lexical(&self.data_dir)],
            hidden: vec![lexical(&self.workspace_root())],
        }
    }
}

impl Default for KernelSettings {
    fn default() -> Self {
        KernelSettings {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 50051)),
            data_dir: PathBuf::from(".hivekernel"),
            max_depth: 8,
            max_children: 32,
            mailbox_capacity: 1024,
            mailbox_max_bytes: 16 << 20,
            mailbox_aging_ms: 5000,
            zombie_timeout_seconds: 60,
            restore_temporary: true,
            task_timeout_seconds: 300,
            max_concurrent_tasks: 4,
            shutdown_grace_ms: 5000,
            default_runtime: "tool_agent".to_owned(),
            synchronous: Default::default(),
            event_log_limit: crate::store::DEFAULT_EVENT_LOG_LIMIT,
            workspace: None,
            roles: HashMap::new(),
            storage: Default::default(),
            artifacts: Default::default(),
            memory: Default::default(),
            transcripts: Default::default(),
            limits: Default::default(),
            connections: Default::default(),
            prices: Default::default(),
            models: ModelNames::default(),
            tls: None,
            exec: Default::default(),
            notify: None,
            metrics: None,
            dashboard: DashboardSettings::default(),
            cluster: None,
            log: LogSettings::default(),
            otel: None,
            skills: Vec::new(),
        }
    }
}

/// The default root of the workspaces for `data_dir`: its path with
/// `-workspace` added.
fn beside(data_dir: &Path) -> PathBuf {
    let data_dir = lexical(data_dir);
    let mut name = data_dir
        .file_name()
        .map(|name| name.to_os_string())
        .unwrap_or_else(|| "hivekernel".into());
    name.push("-workspace");
    data_dir.with_file_name(name)
}

/// One agent from the `agents` list, started as a child of PID 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSpec {
    /// Unique, non-empty name.
    pub name: String,
    /// Its role (never `kernel`).
    pub role: Role,
    /// Its cognitive tier.
    pub tier: Tier,
    /// Logical model name; may be empty.
    pub model: String,
    /// Runtime name; `None` takes `kernel.default_runtime`.
    pub runtime: Option<String>,
    /// The prompt text: the file's contents when a file is given, else the inline text.
    pub system_prompt: String,
    /// Resolved prompt file path, when given.
    pub system_prompt_file: Option<PathBuf>,
    /// Tool names, unique and non-empty.
    pub tools: Vec<String>,
    /// Resolved workspace directory, when given.
    pub workspace: Option<PathBuf>,
    /// Requested limits, already checked against the kernel's ceilings.
    pub limits: LimitOverrides,
    /// Free-form labels.
    pub metadata: BTreeMap<String, String>,
    /// Its restart spec; `None` takes its role's from `roles`.
    pub restart: Option<RestartSpec>,
    /// Its strategy for its children; `None` takes its role's from `roles`.
    pub strategy: Option<Strategy>,
    /// Runtime `exec`: the OS command (relative paths in it resolved against
    /// the config file's directory, which is also its working directory).
    pub exec: Option<hivekernel_agents::ExecCommand>,
    /// Its cron entries (`target` is set to its PID once it runs).
    pub cron: Vec<hivekernel_agents::CronSpec>,
    /// Its tool calls that need a person's approval (besides its role's).
    pub approval: Vec<hivekernel_agents::ApprovalRule>,
    /// Directories of skills it and its descendants see besides the
    /// kernel's, winning over them.
    pub skills: Vec<PathBuf>,
    /// On a node of a cluster: the node it runs on (`node`); `None`: any.
    pub node: Option<String>,
    /// On a node of a cluster: labels its node must have (`where`).
    pub node_labels: BTreeMap<String, String>,
}

/// `kernel.log` of a config file's text, when it parses as JSON and the
/// section is valid; anything else is left to [`Config::load`] to report.
pub fn log_settings(text: &[u8]) -> Option<LogSettings> {
    let document: serde_json::Value = serde_json::from_slice(text).ok()?;
    let mut issues = Vec::new();
    let log = document.get("kernel")?.get("log");
    let settings = parse::settings(log, "kernel.log", &mut issues).value;
    issues.is_empty().then_some(settings)
}

/// Largest config file read, in bytes.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

impl Config {
    /// Read, parse and validate the file at `path`.
    pub fn load(path: &Path, known: &Known) -> Result<Config, ConfigError> {
        let problem = match crate::files::read_capped(path, MAX_CONFIG_BYTES) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(text) => return Config::from_str_at(&text, path, known),
                Err(err) => format!(
                    "cannot read config file {}: it is not UTF-8 text ({err})",
                    path.display()
                ),
            },
            Err(problem) => format!("cannot read config file {}: {problem}", path.display()),
        };
        Err(ConfigError {
            file: path.to_path_buf(),
            issues: vec![ConfigIssue::new("", problem)],
        })
    }

    /// Parse and validate `text` as if read from `path` (used for messages
    /// and relative paths); `${NAME}` references in `mcp_servers` read the
    /// kernel's environment.
    pub fn from_str_at(text: &str, path: &Path, known: &Known) -> Result<Config, ConfigError> {
        let env = |name: &str| std::env::var(name).ok();
        Config::from_str_with_env(text, path, known, &env)
    }

    /// [`Config::from_str_at`] with `env` as the whole environment the
    /// config reads (`${NAME}` in `mcp_servers`, `kernel.notify`'s secrets,
    /// the `OTEL_*` variables and [`MODEL_ENV`]).
    pub fn from_str_with_env(
        text: &str,
        path: &Path,
        known: &Known,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let mut issues = Vec::new();
        let config = load_sections(text, path, known, env, &mut issues);
        match config {
            Some(config) if issues.is_empty() => Ok(config),
            _ => Err(ConfigError {
                file: path.to_path_buf(),
                issues,
            }),
        }
    }
}

/// Runs both phases section by section, so issues come out grouped by
/// section; `env` reads the environment variables `mcp_servers` and
/// `kernel.notify` name.
fn load_sections(
    text: &str,
    path: &Path,
    known: &Known,
    env: &dyn Fn(&str) -> Option<String>,
    issues: &mut Vec<ConfigIssue>,
) -> Option<Config> {
    let base = path.parent().unwrap_or_else(|| Path::new(""));
    let document = parse::document(text, issues)?;
    let checks = validate::Context::new(base, known);
    let (mut kernel, ceilings) = checks.kernel(document.kernel.as_ref(), env, issues);
    let (llm, models, context, prices) = model::llm(document.llm.as_ref(), issues);
    kernel.prices = prices;
    kernel.models = models;
    if let Some(model) = env(MODEL_ENV).filter(|model| !model.trim().is_empty()) {
        kernel.models.serve_all = Some(model.trim().to_owned());
    }
    let (agent, tools) = model::tool_agent(
        document.tool_agent.as_ref(),
        &checks,
        context,
        kernel.limits.prompt_bytes,
        issues,
    );
    kernel.roles = supervision::roles(document.roles.as_ref(), issues);
    let mut tools = tools;
    tools.shell.keep_out = kernel.keep_out();
    sandbox::check_grants(
        &tools.shell.grants,
        "tool_agent.shell",
        &kernel.data_dir,
        issues,
    );
    sandbox::check_grants(&kernel.exec.grants, "kernel.exec", &kernel.data_dir, issues);
    if let Some(root) = &kernel.workspace
        && let Some(problem) = sandbox::overlap(root, &kernel.data_dir)
    {
        let default = beside(&kernel.data_dir);
        let message = format!("{problem} (the default is {})", default.display());
        issues.push(ConfigIssue::new("kernel.workspace", message));
    }
    let mcp = mcp::servers(document.mcp_servers.as_ref(), &checks, env, issues);
    let checks = checks.with_mcp(&mcp);
    for (role, settings) in &kernel.roles {
        checks.check_approval_tools(
            &settings.approval,
            &format!("roles.{role}.approval"),
            issues,
        );
    }
    let mut agents = Vec::new();
    let entries = document.agents.unwrap_or_default();
    for (index, value) in entries.iter().enumerate() {
        if let Some(raw) = parse::agent(index, value, issues) {
            agents.push(checks.agent(raw, &ceilings, &kernel, issues));
        }
    }
    let mut agents = validate::across_agents(agents, entries.len(), &ceilings, issues);
    let mut templates = Vec::new();
    for (index, value) in document.templates.unwrap_or_default().iter().enumerate() {
        if let Some(raw) = parse::entry("templates", index, value, issues) {
            templates.push(checks.agent(raw, &ceilings, &kernel, issues));
        }
    }
    let templates = cron::templates(templates, issues);
    cron::agent_entries(&mut agents, &entries, &templates, issues);
    let named = agents
        .iter()
        .chain(&templates)
        .map(|agent| agent.model.as_str());
    let named = named.chain(tools.orchestrate.worker_model.as_deref());
    kernel.models.configured = named
        .filter(|model| !model.is_empty())
        .map(str::to_owned)
        .collect();
    Some(Config {
        path: path.to_path_buf(),
        kernel,
        llm,
        agent,
        tools,
        agents,
        templates,
        mcp,
    })
}

/// Every problem found in one config file.
#[derive(Debug, Clone, thiserror::Error)]
pub struct ConfigError {
    /// The config file.
    pub file: PathBuf,
    /// The problems, grouped by section: top level, kernel, each agent, then across agents.
    pub issues: Vec<ConfigIssue>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, issue) in self.issues.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{}: {issue}", self.file.display())?;
        }
        Ok(())
    }
}

/// One problem and where it is (`kernel.listen`, `agents[0] (queen).limits.max_depth`, or empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssue {
    /// Path to the offending field; empty when the issue concerns the whole file.
    pub location: String,
    /// What is wrong, naming the bad value.
    pub message: String,
}

impl ConfigIssue {
    fn new(location: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigIssue {
            location: location.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.location.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.location, self.message)
        }
    }
}

/// `base.field`, or just `field` at the top level; an empty key reads `""`,
/// so that even it has a location.
fn at(base: &str, field: &str) -> String {
    let field = if field.is_empty() { "\"\"" } else { field };
    if base.is_empty() {
        field.to_owned()
    } else {
        format!("{base}.{field}")
    }
}

#[cfg(test)]
mod reference;
