//! Who is asking: the identity every kernel operation acts for, and the
//! scope of what it may ask.

use std::fmt;
use std::str::FromStr;

use hivekernel_agents::Pid;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Who is asking. The identity comes from the caller's credential, never from the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// The operator holding the admin token; acts as the kernel (PID 1).
    Admin,
    /// An operator token: sees what the admin sees, and may do what its
    /// scope allows.
    Operator {
        /// The token's id (`hivekernel token ls`).
        token: u64,
        /// What it may do.
        scope: Scope,
    },
    /// A process, acting only as itself.
    Process(Pid),
}

impl Caller {
    /// The PID the caller acts as: a process itself, an operator as the kernel.
    pub fn pid(self) -> Pid {
        match self {
            Caller::Admin | Caller::Operator { .. } => Pid::KERNEL,
            Caller::Process(pid) => pid,
        }
    }

    /// What it may ask: the admin everything, an operator token its scope,
    /// a process `operate` (its capabilities then decide).
    pub fn scope(self) -> Scope {
        match self {
            Caller::Admin => Scope::Admin,
            Caller::Operator { scope, .. } => scope,
            Caller::Process(_) => Scope::Operate,
        }
    }

    /// Whether it sees what the kernel sees (the admin and operator
    /// tokens); a process sees what its place in the tree allows.
    pub fn sees_all(self) -> bool {
        !matches!(self, Caller::Process(_))
    }

    /// Who it is, as events and logs name it: `admin`, `token 3`, `process 7`.
    pub fn who(self) -> String {
        match self {
            Caller::Admin => "admin".to_owned(),
            Caller::Operator { token, .. } => format!("token {token}"),
            Caller::Process(pid) => format!("process {pid}"),
        }
    }
}

/// How much a credential may do; each scope includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// Read what the kernel shows: processes, events, transcripts, usage,
    /// cron entries, artifacts, MCP servers.
    Read,
    /// Also act on processes: spawn, exec, send, kill, restart, cron and
    /// artifact changes, MCP tool calls, answering the inbox.
    Operate,
    /// Also change the kernel itself: reload its config, restart MCP
    /// servers, create and revoke tokens.
    Admin,
}

impl Scope {
    /// Every scope, smallest first.
    pub const ALL: [Scope; 3] = [Scope::Read, Scope::Operate, Scope::Admin];

    /// Its name in the CLI, JSON and gRPC.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Operate => "operate",
            Scope::Admin => "admin",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Scope {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Scope::ALL
            .into_iter()
            .find(|scope| scope.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown scope {} (expected one of: read, operate, admin)",
                    hivekernel_agents::text::shown(s)
                )
            })
    }
}

impl Serialize for Scope {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Scope {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}
