//! Who may do what: role capabilities, the tools a child may be given, and
//! the `denied` events that report every refusal by policy.
//!
//! A process holds its role's capabilities (the `roles` section) narrowed to
//! its parent's. The admin token acts as PID 1 and holds every capability.

use hivekernel_agents::{Capabilities, Capability, McpSelector, Pid, Role, SkillSelector};

use crate::error::{KernelError, Result};
use crate::events::EventKind;
use crate::kernel::{Caller, Kernel};
use crate::runtime::RuntimeRegistry;

impl Kernel {
    /// Refuses `caller` unless it holds `capability`, needed to `action`.
    pub(crate) fn require(
        &self,
        caller: Caller,
        capability: Capability,
        action: &'static str,
    ) -> Result<()> {
        let Caller::Process(pid) = caller else {
            return Ok(());
        };
        let (caps, role) = {
            let table = self.inner.table().read();
            let Some(entry) = table.get(pid) else {
                return Err(KernelError::NotFound(pid));
            };
            (entry.proc.caps, entry.proc.ctx.role)
        };
        if caps.contains(capability) {
            return Ok(());
        }
        Err(KernelError::MissingCapability {
            pid,
            role,
            capability,
            action,
        })
    }

    /// Passes `result` through, reporting a refusal by policy as a `denied`
    /// event of the caller's process.
    pub(crate) fn report_denial<T>(
        &self,
        caller: Caller,
        action: &'static str,
        result: Result<T>,
    ) -> Result<T> {
        if let Err(err) = &result {
            self.report(caller, action, err);
        }
        result
    }

    /// Reports `err` as a `denied` event of the caller's process if it is a
    /// refusal by policy.
    pub(crate) fn report(&self, caller: Caller, action: &'static str, err: &KernelError) {
        if err.is_denial() {
            self.inner.events().emit(
                caller.pid(),
                EventKind::Denied {
                    action: action.to_owned(),
                    reason: err.to_string(),
                },
            );
        }
    }
}

/// What a new child may hold and be given, checked against its parent.
pub(crate) struct ChildGrant<'a> {
    pub(crate) parent: Pid,
    pub(crate) parent_role: Role,
    pub(crate) parent_caps: Capabilities,
    pub(crate) parent_tools: &'a [String],
    /// The child's role's capabilities from config.
    pub(crate) role_caps: Capabilities,
}

impl ChildGrant<'_> {
    /// Whether the parent has `tool`: the same entry, or for an MCP or
    /// skill entry one that covers it (`mcp:fs` covers `mcp:fs/read_file`,
    /// `skills` covers `skill:deploy`).
    fn parent_has(&self, tool: &str) -> bool {
        if self.parent_tools.iter().any(|own| own == tool) {
            return true;
        }
        if let Some(Ok(wanted)) = SkillSelector::parse(tool) {
            return self
                .parent_tools
                .iter()
                .filter_map(|own| SkillSelector::parse(own)?.ok())
                .any(|own| own.covers(&wanted));
        }
        let Some(Ok(wanted)) = McpSelector::parse(tool) else {
            return false;
        };
        self.parent_tools
            .iter()
            .filter_map(|own| McpSelector::parse(own)?.ok())
            .any(|own| own.covers(&wanted))
    }

    /// The child's capabilities: its role's, never more than its parent's.
    /// Refused when a tool is not among the parent's (PID 1 may give any)
    /// or needs a capability the child does not get.
    pub(crate) fn check(
        &self,
        role: Role,
        tools: &[String],
        runtimes: &RuntimeRegistry,
    ) -> Result<Capabilities> {
        let caps = self.role_caps.intersect(self.parent_caps);
        if self.parent_role != Role::Kernel {
            let extra: Vec<&str> = tools
                .iter()
                .filter(|tool| !self.parent_has(tool))
                .map(String::as_str)
                .collect();
            if !extra.is_empty() {
                return Err(KernelError::PermissionDenied(format!(
                    "a child may only get tools its parent has: {} not among the tools of \
                     process {} ({})",
                    extra.join(", "),
                    self.parent,
                    if self.parent_tools.is_empty() {
                        "none".to_owned()
                    } else {
                        self.parent_tools.join(", ")
                    }
                )));
            }
        }
        for tool in tools {
            if let Some(needed) = runtimes.tool_capability(tool)
                && !caps.contains(needed)
            {
                return Err(KernelError::PermissionDenied(format!(
                    "tool {tool} needs capability {needed}, which a child of process {} with \
                     role {role} does not get (roles.{role}.capabilities, narrowed to the parent's)",
                    self.parent
                )));
            }
        }
        Ok(caps)
    }
}
