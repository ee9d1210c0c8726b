//! Capabilities: what a process may do, granted per role in config.
//!
//! A process holds the capabilities of its role, narrowed to its parent's,
//! so a child never holds more than its parent. Every kernel operation a
//! process asks for, and every tool it is given, names the capability it
//! needs.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::Role;
use crate::named::named_enum;

named_enum!(
    /// One right a role can grant.
    Capability, "capability" {
        /// Create child processes (`spawn_child`, `orchestrate`).
        SpawnChildren = "spawn_children",
        /// End processes in its subtree (`kill_child`).
        KillProcesses = "kill_processes",
        /// Send messages (`send_message`).
        SendMessage = "send_message",
        /// Store and delete artifacts (`store_artifact`).
        WriteArtifact = "write_artifact",
        /// Run shell commands in its workspace (`shell_exec`).
        ShellExec = "shell_exec",
        /// Write files in its workspace (`write_file`, `edit_file`).
        FileWrite = "file_write",
        /// Read files in its workspace (`read_file`, `list_dir`).
        FileRead = "file_read",
        /// Reach the network (`web_fetch`).
        NetworkAccess = "network_access",
        /// Add and remove cron entries (`schedule_cron`, `remove_cron`).
        ManageCron = "manage_cron",
        /// Give a child its own token budget (`max_tokens_total` at spawn).
        BudgetAllocate = "budget_allocate",
        /// Be given tools of the kernel's MCP servers (`mcp:<server>`).
        McpTools = "mcp_tools",
        /// Resolve its descendants' inbox requests: approve or deny their
        /// tool calls, answer their questions.
        ApproveRequests = "approve_requests",
        /// Create, edit and delete skills in the kernel's store (`skill_manage`).
        ManageSkills = "manage_skills",
        /// Save or change a skill every agent sees (`global` visibility)
        /// without a person's approval: without it, such a write waits in
        /// the inbox for a person to approve it.
        PublishSkills = "publish_skills",
        /// Give its children a model the config does not name (in
        /// `llm.models`, `llm.default_model`, orchestrate's `worker_model`,
        /// an agent or a template); without it a child gets one of those,
        /// or a model on its own line.
        AnyModel = "any_model",
    }
);

impl Capability {
    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

/// A set of capabilities.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Capabilities(u32);

impl Capabilities {
    /// No capability.
    pub const NONE: Capabilities = Capabilities(0);
    /// Every capability.
    pub const ALL: Capabilities = Capabilities((1 << Capability::ALL.len()) - 1);

    /// Whether `capability` is in the set.
    pub fn contains(self, capability: Capability) -> bool {
        self.0 & capability.bit() != 0
    }

    /// The set with `capability` added.
    pub fn with(self, capability: Capability) -> Capabilities {
        Capabilities(self.0 | capability.bit())
    }

    /// What both sets hold.
    pub fn intersect(self, other: Capabilities) -> Capabilities {
        Capabilities(self.0 & other.0)
    }

    /// The members, in declaration order.
    pub fn iter(self) -> impl Iterator<Item = Capability> {
        Capability::ALL
            .iter()
            .copied()
            .filter(move |c| self.contains(*c))
    }

    /// The members' names, in declaration order.
    pub fn names(self) -> Vec<&'static str> {
        self.iter().map(Capability::as_str).collect()
    }

    /// What a process of `role` may do when the config grants its role
    /// nothing explicitly: least privilege. No role gets `shell_exec`,
    /// `network_access`, `manage_cron`, `budget_allocate` or `mcp_tools` by
    /// default; only roles that lead others may spawn and kill; `worker` and
    /// `task` do their own work and report it. PID 1 has every capability.
    pub fn role_default(role: Role) -> Capabilities {
        use Capability::*;
        let set: &[Capability] = match role {
            Role::Kernel => return Capabilities::ALL,
            Role::Daemon | Role::Agent => &[
                SpawnChildren,
                KillProcesses,
                SendMessage,
                WriteArtifact,
                FileRead,
                FileWrite,
            ],
            Role::Architect | Role::Lead => &[
                SpawnChildren,
                KillProcesses,
                SendMessage,
                WriteArtifact,
                FileRead,
            ],
            Role::Worker => &[SendMessage, WriteArtifact, FileRead, FileWrite],
            Role::Task => &[SendMessage, WriteArtifact, FileRead],
        };
        set.iter().copied().collect()
    }
}

impl FromIterator<Capability> for Capabilities {
    fn from_iter<I: IntoIterator<Item = Capability>>(iter: I) -> Self {
        iter.into_iter()
            .fold(Capabilities::NONE, Capabilities::with)
    }
}

impl fmt::Debug for Capabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.names()).finish()
    }
}

impl Serialize for Capabilities {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for Capabilities {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let list = Vec::<Capability>::deserialize(deserializer)?;
        Ok(list.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn sets_hold_what_was_put_in() {
        let set: Capabilities = [Capability::ShellExec, Capability::FileRead]
            .into_iter()
            .collect();
        assert!(set.contains(Capability::ShellExec));
        assert!(!set.contains(Capability::FileWrite));
        assert_eq!(set.names(), ["shell_exec", "file_read"]);
        assert_eq!(Capabilities::ALL.iter().count(), Capability::ALL.len());
        assert_eq!(
            Capabilities::ALL.intersect(set),
            set,
            "ALL is the identity of intersect"
        );
        assert_eq!(set.intersect(Capabilities::NONE), Capabilities::NONE);
    }

    #[test]
    fn role_defaults_grant_no_dangerous_capability() {
        for role in Role::ALL.iter().copied().filter(|r| *r != Role::Kernel) {
            let set = Capabilities::role_default(role);
            for risky in [
                Capability::ShellExec,
                Capability::NetworkAccess,
                Capability::ManageCron,
                Capability::BudgetAllocate,
                Capability::McpTools,
                Capability::ApproveRequests,
                Capability::ManageSkills,
                Capability::PublishSkills,
            ] {
                assert!(!set.contains(risky), "{role} gets {risky} by default");
            }
            assert!(set.contains(Capability::SendMessage), "{role}");
        }
        for role in [Role::Task, Role::Worker] {
            let set = Capabilities::role_default(role);
            assert!(!set.contains(Capability::SpawnChildren), "{role}");
            assert!(!set.contains(Capability::KillProcesses), "{role}");
        }
        assert!(Capabilities::role_default(Role::Lead).contains(Capability::SpawnChildren));
        assert_eq!(Capabilities::role_default(Role::Kernel), Capabilities::ALL);
    }

    #[test]
    fn serde_uses_the_names() {
        let set = Capabilities::NONE.with(Capability::ManageCron);
        let json = serde_json::to_string(&set).unwrap();
        assert_eq!(json, r#"["manage_cron"]"#);
        assert_eq!(serde_json::from_str::<Capabilities>(&json).unwrap(), set);
        assert!(serde_json::from_str::<Capabilities>(r#"["root"]"#).is_err());
    }
}
