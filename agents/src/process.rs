//! Process identity and lifecycle types shared by the kernel and runtimes.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::capability::Capabilities;
use crate::named::named_enum;
use crate::supervision::{RestartSpec, Strategy};

/// Exit code of a killed process.
pub const EXIT_KILLED: i32 = 137;
/// Exit code of a process whose runtime panicked.
pub const EXIT_PANICKED: i32 = 101;
/// Exit code of a process whose runtime failed.
pub const EXIT_FAILED: i32 = 1;
/// Exit code of an `exec` process whose OS process could not be started.
pub const EXIT_CANNOT_START: i32 = 127;

/// Longest process name, in bytes.
pub const MAX_NAME_BYTES: usize = 128;

/// The one rule for a process name (config agents, templates, spawns,
/// orchestrate's workers): not blank, no control characters, at most
/// [`MAX_NAME_BYTES`]; the error quotes the name (cut when long).
#[inline]
pub fn check_name(name: &str) -> Result<(), String> {
    // Quoted only when refused: every spawn passes here.
    let shown = || crate::text::shown(name);
    if name.trim().is_empty() {
        Err(format!(
            "must not be empty or only whitespace, got {}",
            shown()
        ))
    } else if name.chars().any(char::is_control) {
        Err(format!("{} contains control characters", shown()))
    } else if name.len() > MAX_NAME_BYTES {
        Err(format!(
            "{} is {} bytes long, at most {MAX_NAME_BYTES} allowed",
            shown(),
            name.len()
        ))
    } else {
        Ok(())
    }
}

/// A process id. PID 1 is the kernel; PIDs are never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Pid(pub u64);

impl Pid {
    /// The kernel's own PID.
    pub const KERNEL: Pid = Pid(1);
}

impl fmt::Display for Pid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

named_enum!(
    /// What a process is for; the `roles` config section grants each its capabilities.
    Role, "role" {
        Kernel = "kernel",
        Daemon = "daemon",
        Agent = "agent",
        Architect = "architect",
        Lead = "lead",
        Worker = "worker",
        Task = "task",
    }
);

named_enum!(
    /// How much judgement a process is trusted with; a child's tier is never above its parent's.
    Tier, "cognitive tier" {
        Strategic = "strategic",
        Tactical = "tactical",
        Operational = "operational",
    }
);

impl Tier {
    /// Rank where higher is more senior: strategic 2, tactical 1, operational 0.
    pub fn rank(self) -> u8 {
        match self {
            Tier::Strategic => 2,
            Tier::Tactical => 1,
            Tier::Operational => 0,
        }
    }
}

named_enum!(
    /// Lifecycle state of a process.
    ProcessState, "state" {
        Idle = "idle",
        Running = "running",
        Blocked = "blocked",
        Sleeping = "sleeping",
        Waiting = "waiting",
        Zombie = "zombie",
        Dead = "dead",
        Restarting = "restarting",
    }
);

/// Per-process limits, inherited and narrowed down the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Live children this process may have at once.
    pub max_children: u32,
    /// Levels of descendants allowed below this process (0: no children).
    pub max_depth: u32,
    /// Default timeout for a task run on this process.
    pub timeout_seconds: u64,
    /// Tasks this process works on at the same time.
    pub max_concurrent_tasks: u32,
    /// Its own token budget, allocated from its parent's at spawn; `None`:
    /// it draws on its nearest ancestor's budget, or is unlimited without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens_total: Option<u64>,
    /// Children it may spawn per minute; `None`: no limit. (Non-zero,
    /// as the quota below: 8 bytes less in every process, which keeps a
    /// process's shared state in its allocator size class.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spawns_per_minute: Option<std::num::NonZeroU32>,
    /// Model calls it may make per minute; `None`: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm_calls_per_minute: Option<std::num::NonZeroU32>,
    /// Bytes of artifacts, memory and skills its subtree (it and every
    /// descendant, alive or gone) may keep in the store; `None`: it counts
    /// toward its nearest ancestor's quota only. A quota further up still
    /// applies. (Non-zero, so that it costs every process 8 bytes, not 16.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_storage_bytes: Option<std::num::NonZeroU64>,
}

/// Requested limits: `None` inherits from the parent (narrowed where needed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitOverrides {
    /// See [`Limits::max_children`].
    pub max_children: Option<u32>,
    /// See [`Limits::max_depth`].
    pub max_depth: Option<u32>,
    /// See [`Limits::timeout_seconds`].
    pub timeout_seconds: Option<u64>,
    /// See [`Limits::max_concurrent_tasks`].
    pub max_concurrent_tasks: Option<u32>,
    /// See [`Limits::max_tokens_total`]; taken from the parent's budget.
    #[serde(default)]
    pub max_tokens_total: Option<u64>,
    /// See [`Limits::spawns_per_minute`].
    #[serde(default)]
    pub spawns_per_minute: Option<u32>,
    /// See [`Limits::llm_calls_per_minute`].
    #[serde(default)]
    pub llm_calls_per_minute: Option<u32>,
    /// See [`Limits::max_storage_bytes`].
    #[serde(default)]
    pub max_storage_bytes: Option<u64>,
}

/// Everything needed to create a process; the kernel validates it against the parent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpawnRequest {
    /// Parent of the new process.
    pub parent: Pid,
    /// Human name; must not be empty.
    pub name: String,
    /// Role of the new process.
    pub role: Role,
    /// Tier; `None` takes the parent's.
    pub tier: Option<Tier>,
    /// Logical model name (e.g. `sonnet`).
    pub model: String,
    /// Runtime name; `None` takes the kernel's default.
    pub runtime: Option<String>,
    /// System prompt text.
    pub system_prompt: String,
    /// Tool names the process may use.
    pub tools: Vec<String>,
    /// Requested limits.
    pub limits: LimitOverrides,
    /// Free-form labels.
    pub metadata: BTreeMap<String, String>,
    /// When the kernel restarts it; `None` takes its role's default from
    /// config (temporary, never restarted, when the role has none).
    #[serde(default)]
    pub restart: Option<RestartSpec>,
    /// How a failure of one of its children affects the others; `None` takes
    /// its role's default from config (one_for_one when the role has none).
    #[serde(default)]
    pub strategy: Option<Strategy>,
    /// Its working directory; `None` takes `<kernel workspace>/<name>`.
    /// Only the kernel's own config sets this; it is not taken from clients.
    #[serde(skip)]
    pub workspace: Option<PathBuf>,
    /// The OS command of an `exec` process. Set by the kernel's config and
    /// the control plane; never taken from a model's tool arguments.
    #[serde(skip)]
    pub exec: Option<ExecCommand>,
    /// Tool calls that need a person's approval (a config agent's
    /// `approval`), besides its role's and its parent's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approval: Vec<crate::approval::ApprovalRule>,
    /// Directories of skills it and its descendants see (a config agent's
    /// `skills`). Only the kernel's own config sets this; it is not taken
    /// from clients or from a model's tool arguments.
    #[serde(skip)]
    pub skills: Vec<PathBuf>,
}

/// The OS process an `exec` process runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecCommand {
    /// Program and arguments; the program is a name looked up in `PATH` or an absolute path.
    pub argv: Vec<String>,
    /// Variables added to the kernel's environment.
    pub env: BTreeMap<String, String>,
    /// Working directory; `None` takes the process's workspace directory.
    pub cwd: Option<PathBuf>,
}

impl SpawnRequest {
    /// A request with defaults for everything but parent and name.
    pub fn new(parent: Pid, name: impl Into<String>) -> Self {
        SpawnRequest {
            parent,
            name: name.into(),
            role: Role::Agent,
            tier: None,
            model: String::new(),
            runtime: None,
            system_prompt: String::new(),
            tools: Vec::new(),
            limits: LimitOverrides::default(),
            metadata: BTreeMap::new(),
            restart: None,
            strategy: None,
            workspace: None,
            exec: None,
            approval: Vec::new(),
            skills: Vec::new(),
        }
    }
}

/// How a process ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitRecord {
    /// The process that exited.
    pub pid: Pid,
    /// Its parent at exit.
    pub ppid: Pid,
    /// Its name.
    pub name: String,
    /// 0 for a normal exit; 137 when killed; 101 when its runtime panicked.
    pub exit_code: i32,
    /// Final output, if any.
    pub output: String,
    /// Why it ended.
    pub reason: String,
    /// Wall-clock time of the exit.
    pub exited_at_unix_ms: u64,
}

/// A snapshot of one process, as `ps` and GetProcess show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// Its PID.
    pub pid: Pid,
    /// Its parent's PID (0 for the kernel).
    pub ppid: Pid,
    /// Its name.
    pub name: String,
    /// Its role.
    pub role: Role,
    /// Its cognitive tier.
    pub tier: Tier,
    /// Its state now.
    pub state: ProcessState,
    /// Logical model name.
    pub model: String,
    /// Runtime name.
    pub runtime: String,
    /// Tool names.
    pub tools: Vec<String>,
    /// Effective limits.
    pub limits: Limits,
    /// Distance from PID 1.
    pub depth: u32,
    /// Live children.
    pub children: u32,
    /// Messages waiting in its mailbox.
    pub mailbox_len: u32,
    /// Wall-clock start time.
    pub started_at_unix_ms: u64,
    /// Free-form labels.
    pub metadata: BTreeMap<String, String>,
    /// Model calls made through the kernel and the tokens they used.
    pub usage: LlmUsage,
    /// Set once the process has exited.
    pub exit: Option<ExitRecord>,
    /// Times the kernel restarted it.
    #[serde(default)]
    pub restarts: u32,
    /// Where an `exec` process's stdout and stderr go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_path: Option<String>,
    /// What it may do: its role's capabilities, narrowed to its parent's.
    #[serde(default)]
    pub capabilities: Capabilities,
    /// Its usage plus every descendant's, exited ones included.
    #[serde(default)]
    pub subtree_usage: LlmUsage,
    /// The token budget it draws on; `None`: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetInfo>,
    /// Its restart policy and intensity.
    #[serde(default)]
    pub restart: RestartSpec,
    /// How its children are restarted when one fails.
    #[serde(default)]
    pub strategy: Strategy,
    /// The exit its latest restart followed, kept across kernel restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_exit: Option<ExitRecord>,
    /// It came back after a kernel restart as the PID it had.
    #[serde(default)]
    pub restored: bool,
    /// The cluster node holding it; `None` on a kernel that runs alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// A token budget as seen from one process that draws on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetInfo {
    /// The process it was allocated to (the process itself, or an ancestor).
    pub owner: Pid,
    /// Tokens allocated.
    pub max_tokens_total: u64,
    /// Tokens consumed, and not returned by children that exited.
    pub used: u64,
    /// Tokens left for new calls and allocations.
    pub remaining: u64,
}

/// Model calls a process made through its kernel, as the provider counted them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LlmUsage {
    /// Completed model calls.
    pub calls: u64,
    /// Prompt tokens over every call.
    pub prompt_tokens: u64,
    /// Completion tokens over every call.
    pub completion_tokens: u64,
    /// What the calls cost, in billionths of a US dollar, from the price table.
    #[serde(default)]
    pub cost_nano_usd: u64,
}

impl LlmUsage {
    /// Prompt plus completion tokens.
    pub fn total_tokens(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }

    /// What the calls cost, in US dollars.
    pub fn cost_usd(&self) -> f64 {
        self.cost_nano_usd as f64 / 1e9
    }
}
