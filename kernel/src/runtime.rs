//! The runtime registry: runtimes by name, the kernel's only link to what
//! runs inside processes. The runner that drives one process is the
//! kernel's (kernel/runner.rs).

use std::collections::BTreeMap;
use std::sync::Arc;

use hivekernel_agents::echo::EchoFactory;
use hivekernel_agents::tool_agent::{AgentSettings, ToolAgentFactory};
use hivekernel_agents::tools::ToolRegistry;
use hivekernel_agents::{Capability, ExecCommand, RuntimeFactory};

use crate::error::KernelError;
use crate::exec::{self, EXEC_RUNTIME, ExecRuntime};

/// Runtimes by name; the kernel's only link to what runs inside processes.
#[derive(Debug, Clone, Default)]
pub struct RuntimeRegistry {
    /// Keyed by name, shared with every process of that runtime.
    factories: BTreeMap<Arc<str>, Arc<dyn RuntimeFactory>>,
    /// Tools the `tool_agent` runtime offers and the capability each needs,
    /// sorted by name (for config and spawn checks).
    tools: Vec<(&'static str, Option<Capability>)>,
    /// The `exec` runtime, once the kernel's gRPC server is known, and its name.
    exec: Option<(Arc<str>, Arc<ExecRuntime>)>,
}

/// How a spawn's runtime is made.
#[derive(Debug)]
pub(crate) enum Maker<'a> {
    /// An in-process runtime.
    Factory(&'a Arc<dyn RuntimeFactory>),
    /// An OS process (the `exec` runtime).
    Exec(&'a Arc<ExecRuntime>, exec::Checked),
}

impl RuntimeRegistry {
    /// The runtimes built into this kernel: `echo`, and `tool_agent` with
    /// every built-in tool and default settings.
    pub fn builtin() -> Self {
        Self::with_tool_agent(ToolAgentFactory::new(
            ToolRegistry::builtin(),
            AgentSettings::default(),
        ))
    }

    /// `echo`, and `tool_agent` made by `factory`.
    pub fn with_tool_agent(factory: ToolAgentFactory) -> Self {
        let mut registry = RuntimeRegistry {
            tools: factory.tools().capabilities(),
            ..RuntimeRegistry::default()
        };
        registry.register("echo", Arc::new(EchoFactory::default()));
        registry.register("tool_agent", Arc::new(factory));
        registry
    }

    /// Enables the `exec` runtime: external agents started as OS processes
    /// that reach the kernel over gRPC. Without it, spawns naming `exec` are refused.
    pub fn enable_exec(&mut self, exec: ExecRuntime) {
        self.exec = Some((Arc::from(EXEC_RUNTIME), Arc::new(exec)));
    }

    /// The `exec` runtime, when enabled.
    pub(crate) fn exec(&self) -> Option<&Arc<ExecRuntime>> {
        self.exec.as_ref().map(|(_, exec)| exec)
    }

    /// How to make runtime `name`, and the name as the registry shares it;
    /// `command` is the OS command, for `exec` only.
    pub(crate) fn maker(
        &self,
        name: &str,
        command: Option<ExecCommand>,
    ) -> Result<(Arc<str>, Maker<'_>), KernelError> {
        if name == EXEC_RUNTIME {
            let Some((name, runtime)) = &self.exec else {
                return Err(KernelError::InvalidArgument(
                    "the exec runtime is not enabled in this kernel (it needs the gRPC server; \
                     `hivekernel start` enables it)"
                        .into(),
                ));
            };
            return Ok((name.clone(), Maker::Exec(runtime, exec::check(command)?)));
        }
        if command.is_some() {
            return Err(KernelError::InvalidArgument(format!(
                "a command is only for runtime exec, not {name}"
            )));
        }
        match self.factories.get_key_value(name) {
            Some((name, factory)) => Ok((name.clone(), Maker::Factory(factory))),
            None => Err(KernelError::InvalidArgument(format!(
                "unknown runtime {name:?} (known: {})",
                self.names().join(", ")
            ))),
        }
    }

    /// Adds (or replaces) a runtime.
    pub fn register(&mut self, name: impl Into<String>, factory: Arc<dyn RuntimeFactory>) {
        self.factories.insert(Arc::from(name.into()), factory);
    }

    /// The factory registered under `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn RuntimeFactory>> {
        self.factories.get(name)
    }

    /// The capability a process needs to be given tool `name`; `None` for a
    /// tool any process may have, or one this kernel does not know.
    pub(crate) fn tool_capability(&self, name: &str) -> Option<Capability> {
        if name.starts_with(hivekernel_agents::mcp::PREFIX) {
            return Some(Capability::McpTools);
        }
        let at = self.tools.binary_search_by(|(tool, _)| (*tool).cmp(name));
        at.ok().and_then(|i| self.tools[i].1)
    }

    /// Registered names, sorted; `exec` when enabled.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.factories.keys().map(|name| &**name).collect();
        if self.exec.is_some() {
            names.push(EXEC_RUNTIME);
            names.sort_unstable();
        }
        names
    }

    /// What a config may name: these runtimes, `exec` (which `hivekernel
    /// start` always enables), and the `tool_agent`'s tools.
    pub fn known(&self) -> crate::config::Known {
        let mut runtimes: Vec<String> =
            self.factories.keys().map(|name| name.to_string()).collect();
        runtimes.push(EXEC_RUNTIME.to_owned());
        runtimes.sort_unstable();
        runtimes.dedup();
        crate::config::Known {
            runtimes,
            tools: self
                .tools
                .iter()
                .map(|(tool, _)| (*tool).to_owned())
                .collect(),
            tool_capabilities: self
                .tools
                .iter()
                .filter_map(|(tool, cap)| Some(((*tool).to_owned(), (*cap)?)))
                .collect(),
        }
    }
}
