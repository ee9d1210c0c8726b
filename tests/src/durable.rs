//! Durable in-process kernels: a real SQLite file in a test's directory, the
//! built-in runtimes plus `probe` and `capture`, as `hivekernel start` would
//! open them; and a way to call tools as one of their processes.

use std::path::Path;
use std::sync::Arc;

use hivekernel_agents::tools::{ToolContext, ToolError, ToolRegistry};
use hivekernel_agents::{Pid, ProcessContext, Role, SpawnRequest};
use hivekernel_kernel::config::KernelSettings;
use hivekernel_kernel::store::Recovered;
use hivekernel_kernel::{Caller, Kernel};
use serde_json::Value;

use crate::capture::Capture;
use crate::probe::ProbeFactory;
use crate::{Journal, open_store, registry};

/// A kernel on `<dir>/hivekernel.db`, and the `capture` factory its
/// `capture` processes (run as `probe`s) are created by.
#[derive(Debug)]
pub struct Durable {
    /// The kernel.
    pub kernel: Kernel,
    /// Hands out the contexts of `capture` processes.
    pub capture: Arc<Capture>,
    /// What the probes received.
    pub journal: Journal,
    /// What the store read back when it was opened.
    pub recovered: Recovered,
}

impl Durable {
    /// Opens (or reopens) the store in `dir` and starts a kernel on it.
    pub async fn start(dir: &Path, settings: KernelSettings) -> Durable {
        let (mut runtimes, journal) = registry();
        let probe = ProbeFactory {
            journal: journal.clone(),
        };
        let capture = Arc::new(Capture::wrapping(Arc::new(probe)));
        runtimes.register("capture", capture.clone());
        let (store, recovered) = open_store(dir).await;
        let kernel = crate::start(
            Kernel::builder(settings)
                .runtimes(runtimes)
                .store(store, recovered.clone()),
        )
        .await;
        Durable {
            kernel,
            capture,
            journal,
            recovered,
        }
    }

    /// Spawns a `capture` process as the admin and returns its context.
    pub async fn captured(&self, parent: Pid, name: &str, role: Role) -> ProcessContext {
        let mut request = SpawnRequest::new(parent, name);
        request.role = role;
        request.runtime = Some("capture".into());
        self.kernel
            .spawn(Caller::Admin, request)
            .await
            .unwrap_or_else(|err| panic!("spawn {name} under {parent}: {err}"));
        self.capture
            .take()
            .unwrap_or_else(|| panic!("no context captured for {name}"))
    }
}

/// Calls the built-in tool `tool` as `process` (no workspace).
pub async fn call_tool(
    process: &ProcessContext,
    tool: &str,
    args: Value,
) -> Result<String, ToolError> {
    let registry = ToolRegistry::builtin();
    let tool = registry
        .get(tool)
        .unwrap_or_else(|| panic!("no built-in tool {tool}"));
    let ctx = ToolContext {
        process,
        workspace: None,
        checkpoint: None,
    };
    tool.call(&ctx, args).await
}
