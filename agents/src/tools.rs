//! Tools an agent may call, selected by name in config.
//!
//! A [`Tool`] gets its arguments as the JSON object the model produced and
//! answers with text for the model. A tool that fails returns a
//! [`ToolError`]; the agent hands its message back to the model and carries
//! on. Whatever the model asks, a tool checks its own arguments.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;

use crate::capability::Capability;
use crate::llm::ToolSchema;
use crate::runtime::ProcessContext;
use crate::syscalls::SyscallError;

mod args;
pub mod artifacts;
pub mod budget;
pub mod cron;
pub mod human;
pub mod memory;
pub mod orchestrate;
pub mod process;
pub mod skill_manage;
pub mod web;
pub mod workspace;

pub use args::decode;

/// What a tool call may use: the calling process and its workspace.
#[derive(Clone, Copy)]
pub struct ToolContext<'a> {
    /// The calling process (identity and syscalls).
    pub process: &'a ProcessContext,
    /// The process's own workspace directory, when it has one.
    pub workspace: Option<&'a Path>,
    /// The turn this call belongs to, for a tool that may wait for a person.
    pub checkpoint: crate::syscalls::Checkpoint<'a>,
}

impl std::fmt::Debug for ToolContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolContext")
            .field("process", &self.process)
            .field("workspace", &self.workspace)
            .field("checkpoint", &self.checkpoint.is_some())
            .finish()
    }
}

impl ToolContext<'_> {
    /// The workspace, or an error saying the agent has none.
    pub fn workspace(&self) -> Result<&Path, ToolError> {
        self.workspace
            .ok_or_else(|| ToolError::new("this agent has no workspace configured"))
    }
}

/// A failed tool call; the message goes back to the model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ToolError(pub String);

impl ToolError {
    /// An error with `message`.
    pub fn new(message: impl Into<String>) -> Self {
        ToolError(message.into())
    }
}

/// One tool.
#[async_trait]
pub trait Tool: Send + Sync + fmt::Debug {
    /// The name the model calls it by and config selects it by.
    fn name(&self) -> &'static str;

    /// One line saying what it does.
    fn description(&self) -> &'static str;

    /// The capability a process must hold to be given this tool; `None`:
    /// any process may have it.
    fn capability(&self) -> Option<Capability>;

    /// JSON schema of its arguments object.
    fn parameters(&self) -> serde_json::Value;

    /// Runs the tool.
    async fn call(
        &self,
        ctx: &ToolContext<'_>,
        args: serde_json::Value,
    ) -> Result<String, ToolError>;

    /// The schema offered to the model.
    fn schema(&self) -> ToolSchema {
        ToolSchema {
            name: self.name().to_owned(),
            description: self.description().to_owned(),
            parameters: self.parameters(),
        }
    }
}

/// The kernel's refusal, as the model sees it.
pub(crate) fn refused(err: SyscallError) -> ToolError {
    ToolError::new(err.message)
}

/// `value` as compact JSON.
pub(crate) fn to_json(value: &impl serde::Serialize) -> Result<String, ToolError> {
    serde_json::to_string(value)
        .map_err(|err| ToolError::new(format!("cannot encode answer: {err}")))
}

/// What the configurable built-in tools need from config.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolSettings {
    /// How `orchestrate` runs its workers.
    pub orchestrate: orchestrate::OrchestrateSettings,
    /// What `web_fetch` may reach, and its limits.
    pub web: web::WebSettings,
    /// How `shell_exec` confines its commands.
    pub shell: workspace::ShellSettings,
}

/// Tools by name.
#[derive(Debug, Clone, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<&'static str, Arc<dyn Tool>>,
}

impl ToolRegistry {
    /// Every built-in tool, with default settings.
    pub fn builtin() -> Self {
        Self::configured(&ToolSettings::default())
    }

    /// Every built-in tool, configured by `settings`.
    pub fn configured(settings: &ToolSettings) -> Self {
        let mut registry = ToolRegistry::default();
        process::register(&mut registry);
        cron::register(&mut registry);
        registry.register(Arc::new(orchestrate::Orchestrate::new(
            settings.orchestrate.clone(),
        )));
        workspace::register(&mut registry, settings.shell.clone());
        web::register(&mut registry, settings.web.clone());
        artifacts::register(&mut registry);
        memory::register(&mut registry);
        human::register(&mut registry);
        registry.register(Arc::new(budget::Budget));
        registry.register(Arc::new(skill_manage::SkillManage));
        registry
    }

    /// Adds (or replaces) a tool.
    pub fn register(&mut self, tool: Arc<dyn Tool>) {
        self.tools.insert(tool.name(), tool);
    }

    /// The tool called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    /// Registered names, sorted.
    pub fn names(&self) -> Vec<&'static str> {
        self.tools.keys().copied().collect()
    }

    /// Each registered tool's name and the capability it needs, sorted by name.
    pub fn capabilities(&self) -> Vec<(&'static str, Option<Capability>)> {
        self.tools
            .iter()
            .map(|(name, tool)| (*name, tool.capability()))
            .collect()
    }
}
