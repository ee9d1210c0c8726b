//! The kernel's error type: one variant per way an operation is refused.

use hivekernel_agents::{Capability, ErrorKind, Pid, Role, SyscallError};

/// Why a kernel operation was refused or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// No live or zombie process has this PID.
    #[error("process {0} not found")]
    NotFound(Pid),
    /// The parent named in a spawn is not alive.
    #[error("parent {pid} is not alive (state {state})")]
    ParentNotAlive {
        /// The parent.
        pid: Pid,
        /// Its state.
        state: &'static str,
    },
    /// The child would sit deeper than its ancestors allow.
    #[error("max depth exceeded: a child of {parent} would be at depth {depth}, {why}")]
    DepthExceeded {
        /// The parent.
        parent: Pid,
        /// The child's depth.
        depth: u32,
        /// Which limit stands in the way.
        why: String,
    },
    /// The parent already has its maximum number of live children.
    #[error(
        "max children reached: process {parent} has {count} live children (max_children {max})"
    )]
    TooManyChildren {
        /// The parent.
        parent: Pid,
        /// Live children now.
        count: u32,
        /// Its limit.
        max: u32,
    },
    /// A child may not have a higher cognitive tier than its parent.
    #[error("cognitive tier {child} is above the parent's tier {parent}")]
    TierAboveParent {
        /// Requested tier.
        child: &'static str,
        /// The parent's tier.
        parent: &'static str,
    },
    /// The process's role does not grant what it asked to do.
    #[error("process {pid} (role {role}) lacks capability {capability}, needed to {action}")]
    MissingCapability {
        /// The process that asked.
        pid: Pid,
        /// Its role.
        role: Role,
        /// The capability it lacks.
        capability: Capability,
        /// What it asked to do.
        action: &'static str,
    },
    /// A requested limit is larger than the parent's.
    #[error("limit {field} = {requested} exceeds the parent's {allowed}")]
    LimitExceedsParent {
        /// Which limit.
        field: &'static str,
        /// Requested value.
        requested: u64,
        /// Largest value allowed.
        allowed: u64,
    },
    /// A malformed argument.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The caller may not do this.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// An answer names a task its process does not have pending.
    #[error(
        "process {pid} has no pending task {request_id} (answered already, timed out, or its requester gave up)"
    )]
    TaskNotPending {
        /// The answering process.
        pid: Pid,
        /// The request it named.
        request_id: hivekernel_agents::RequestId,
    },
    /// The receiver's mailbox is full.
    #[error("mailbox of process {pid} is full ({limit})")]
    MailboxFull {
        /// The receiver.
        pid: Pid,
        /// The limit it is at, e.g. `1024 messages`.
        limit: String,
    },
    /// The target exists but cannot take this (e.g. it is a zombie).
    #[error("{0}")]
    FailedPrecondition(String),
    /// No answer before the deadline.
    #[error("{0}")]
    DeadlineExceeded(String),
    /// No artifact with this id, or none the caller may see.
    #[error("artifact {0} not found")]
    ArtifactNotFound(hivekernel_agents::ArtifactId),
    /// A size limit from config stands in the way; the message names it.
    #[error("{0}")]
    LimitExceeded(String),
    /// The kernel keeps nothing on disk, so it cannot keep this.
    #[error("this kernel has no store, so it keeps no {0}; start it with a data directory")]
    NoStore(&'static str),
    /// The token budget a process draws on is used up.
    #[error("budget_exceeded: {0}")]
    BudgetExceeded(String),
    /// A per-process rate limit (`spawns_per_minute`, `llm_calls_per_minute`) stands in the way.
    #[error("{0}")]
    RateLimited(String),
    /// The kernel is shutting down.
    #[error("kernel is shutting down")]
    ShuttingDown,
    /// No cron entry has this name.
    #[error("no cron entry named {}", shown(.0))]
    NoSuchCron(String),
    /// No process answers to a name or a path (the message says which).
    #[error("{0}")]
    NoSuchName(String),
    /// No MCP server has this name (the message lists those there are).
    #[error("{0}")]
    NoSuchMcpServer(String),
    /// An MCP server cannot take a call now (starting, restarting, failed);
    /// the message says which and why.
    #[error("{0}")]
    McpUnavailable(String),
    /// The cluster cannot answer now (NATS unreachable, no PID block).
    #[error("cluster: {0}")]
    ClusterUnavailable(String),
    /// No skill the caller may see has this name (the message says whose).
    #[error("{0}")]
    NoSuchSkill(String),
    /// The caller's memory has no entry with this key.
    #[error("no memory entry with key {}", shown(.0))]
    NoSuchMemory(String),
    /// The store could not commit what the call needs (nothing was acknowledged).
    #[error("not committed: {0}")]
    Store(#[from] crate::store::StoreError),
    /// No inbox request has this id.
    #[error("no inbox request {0} (hivekernel inbox lists those pending)")]
    NoSuchRequest(u64),
    /// A token change was refused (the message says why).
    #[error("{0}")]
    Token(#[from] crate::tokens::TokenError),
    /// Another node of the cluster refused or failed the operation: its
    /// class and message as that node gave them.
    #[error("{0}")]
    Remote(SyscallError),
}

impl KernelError {
    /// The class of this error, shared with syscalls and gRPC.
    pub fn kind(&self) -> ErrorKind {
        use KernelError::*;
        match self {
            NotFound(_)
            | TaskNotPending { .. }
            | NoSuchCron(_)
            | NoSuchName(_)
            | NoSuchMemory(_)
            | NoSuchMcpServer(_)
            | NoSuchSkill(_)
            | NoSuchRequest(_)
            | ArtifactNotFound(_) => ErrorKind::NotFound,
            InvalidArgument(_) => ErrorKind::InvalidArgument,
            PermissionDenied(_) => ErrorKind::PermissionDenied,
            TooManyChildren { .. }
            | MailboxFull { .. }
            | DepthExceeded { .. }
            | LimitExceeded(_)
            | BudgetExceeded(_)
            | RateLimited(_) => ErrorKind::ResourceExhausted,
            ParentNotAlive { .. } | FailedPrecondition(_) | NoStore(_) => {
                ErrorKind::FailedPrecondition
            }
            TierAboveParent { .. } | MissingCapability { .. } | LimitExceedsParent { .. } => {
                ErrorKind::PermissionDenied
            }
            DeadlineExceeded(_) => ErrorKind::DeadlineExceeded,
            ShuttingDown | McpUnavailable(_) | ClusterUnavailable(_) => ErrorKind::Unavailable,
            Store(crate::store::StoreError::Closed) => ErrorKind::Unavailable,
            Store(crate::store::StoreError::InMemory) => ErrorKind::FailedPrecondition,
            Store(_) => ErrorKind::Internal,
            Remote(refusal) => refusal.kind,
            Token(err) => {
                use crate::tokens::TokenError;
                match err {
                    TokenError::InvalidName(_) => ErrorKind::InvalidArgument,
                    TokenError::NotFound(_) => ErrorKind::NotFound,
                    TokenError::NameTaken(_) | TokenError::AlreadyRevoked(_) => {
                        ErrorKind::FailedPrecondition
                    }
                }
            }
        }
    }
}

impl KernelError {
    /// Whether this is a refusal by policy (a capability, a limit from the
    /// parent, a budget, a rate), which the kernel reports as a `denied` event.
    pub fn is_denial(&self) -> bool {
        matches!(
            self,
            KernelError::BudgetExceeded(_) | KernelError::RateLimited(_)
        ) || self.kind() == ErrorKind::PermissionDenied
    }

    /// The error as a caller gets it: its text, cut to [`MAX_MESSAGE_BYTES`].
    pub fn message(&self) -> String {
        capped(self.to_string())
    }
}

impl From<KernelError> for SyscallError {
    fn from(err: KernelError) -> Self {
        SyscallError::new(err.kind(), err.message())
    }
}

/// Longest error message a caller gets. Over gRPC it travels in an HTTP/2
/// header, and one that quoted a huge argument back would make the client's
/// HTTP/2 layer drop the whole connection instead of showing the error; a
/// process's model would get it whole in its context.
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// `message`, cut to [`MAX_MESSAGE_BYTES`].
pub(crate) fn capped(message: String) -> String {
    hivekernel_agents::text::cut(message, MAX_MESSAGE_BYTES)
}

/// Shorthand for kernel results.
pub type Result<T, E = KernelError> = std::result::Result<T, E>;

/// An error and its causes, `a: b: c`, without repeats.
pub(crate) fn error_chain(err: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = vec![err.to_string()];
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !parts.iter().any(|part| part.contains(&text)) {
            parts.push(text);
        }
        source = cause.source();
    }
    parts.join(": ")
}

pub(crate) use hivekernel_agents::text::shown;
