//! [`KernelBuilder`]: the one way a kernel is put together and started, by
//! `hivekernel start`, the tests and the benchmark alike.
//!
//! Everything a kernel runs with is given before [`KernelBuilder::start`];
//! nothing is configured after it returns. Starting is, in order: PID 1,
//! the reaper and the cron timer; the config's agents as children of PID 1
//! in the order given, each as the PID it had before a restart; what the
//! store remembers (every other process, from its kept spawn request; what
//! could not come back recorded dead; queued messages; unanswered
//! requests); and the cron entries, stored and declared.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use hivekernel_agents::llm::Provider;
use hivekernel_agents::{CronSpec, Pid, SpawnRequest};

use super::{Kernel, Parts, Placed, Placement, cron};
use crate::config::{KernelSettings, McpServerSpec};
use crate::error::KernelError;
use crate::exec::ExecRuntime;
use crate::kernel::Restored;
use crate::mcp::McpServers;
use crate::runtime::RuntimeRegistry;
use crate::store::{Recovered, Store};

/// How long a node's start waits to have read the cluster's records and
/// directory before it brings its processes back.
const CATCH_UP: std::time::Duration = std::time::Duration::from_secs(5);

/// A config agent: how to spawn it, and the cron entries it owns.
#[derive(Debug, Clone)]
pub struct Declared {
    /// Its spawn request (a child of PID 1).
    pub request: SpawnRequest,
    /// Its cron entries; their target is set to its PID when it starts.
    pub cron: Vec<CronSpec>,
    /// On a node of a cluster: the nodes it may run on (default: any).
    pub placement: Placement,
}

impl Declared {
    /// An agent with no cron entries, on any node.
    pub fn new(request: SpawnRequest) -> Self {
        Declared {
            request,
            cron: Vec::new(),
            placement: Placement::default(),
        }
    }
}

/// What a kernel is made of; [`KernelBuilder::start`] says what starting does.
#[derive(Debug)]
#[must_use = "a builder does nothing until start() is awaited"]
pub struct KernelBuilder {
    settings: KernelSettings,
    runtimes: RuntimeRegistry,
    llm: Option<Arc<dyn Provider>>,
    store: Option<(Store, Recovered)>,
    exec: Option<ExecRuntime>,
    templates: HashMap<String, SpawnRequest>,
    agents: Vec<Declared>,
    cron_anchor: Option<(u64, tokio::time::Instant)>,
    mcp: Vec<McpServerSpec>,
    traces: Option<Arc<crate::otel::Traces>>,
    cluster: Option<Arc<crate::cluster::Cluster>>,
}

/// A started kernel, and what starting it did.
#[derive(Debug)]
pub struct Started {
    /// The kernel.
    pub kernel: Kernel,
    /// The PID of each declared agent this kernel runs, in the order they
    /// were given (on a node of a cluster, those no other node runs).
    pub agents: Vec<Pid>,
    /// On a node of a cluster: the declared agents another node runs, by
    /// name, with that node.
    pub elsewhere: BTreeMap<String, String>,
    /// What the store brought back (all zero without a store).
    pub restored: Restored,
    /// Stored or declared cron entries that could not be loaded.
    pub cron_problems: Vec<String>,
}

/// A declared agent the kernel refused; the kernel was stopped again.
#[derive(Debug, thiserror::Error)]
#[error("agent {name:?} could not be started: {source}")]
pub struct AgentRefused {
    /// The agent.
    pub name: String,
    /// Why.
    pub source: KernelError,
}

impl Kernel {
    /// A kernel with these settings, the built-in runtimes, no model
    /// provider and no store, until the builder says otherwise.
    pub fn builder(settings: KernelSettings) -> KernelBuilder {
        KernelBuilder {
            settings,
            runtimes: RuntimeRegistry::builtin(),
            llm: None,
            store: None,
            exec: None,
            templates: HashMap::new(),
            agents: Vec::new(),
            cron_anchor: None,
            mcp: Vec::new(),
            traces: None,
            cluster: None,
        }
    }
}

impl KernelBuilder {
    /// The runtimes processes may name.
    pub fn runtimes(mut self, runtimes: RuntimeRegistry) -> Self {
        self.runtimes = runtimes;
        self
    }

    /// The model provider behind every process's model calls.
    pub fn llm(mut self, provider: Arc<dyn Provider>) -> Self {
        self.llm = Some(provider);
        self
    }

    /// Exports a span per gRPC call, task and message handled, model call,
    /// tool call, spawn and cron firing to `traces` (see [`crate::otel`]).
    pub fn traces(mut self, traces: Arc<crate::otel::Traces>) -> Self {
        self.traces = Some(traces);
        self
    }

    /// Runs this kernel as a node of `cluster`: new PIDs come from the
    /// cluster-wide PID space (docs/CLUSTER.md).
    pub fn cluster(mut self, cluster: Arc<crate::cluster::Cluster>) -> Self {
        self.cluster = Some(cluster);
        self
    }

    /// Keeps what must survive in `store`, continuing from what it
    /// `recovered` (counters, config agents' PIDs and usage, queued
    /// messages, cron entries).
    pub fn store(mut self, store: Store, recovered: Recovered) -> Self {
        self.store = Some((store, recovered));
        self
    }

    /// Enables the `exec` runtime: external agents started as OS processes
    /// that reach the kernel over gRPC. Without it, `exec` spawns are refused.
    pub fn exec(mut self, exec: ExecRuntime) -> Self {
        self.exec = Some(exec);
        self
    }

    /// The config's `templates`, by name, that cron `spawn` entries start from.
    pub fn cron_templates(mut self, templates: HashMap<String, SpawnRequest>) -> Self {
        self.templates = templates;
        self
    }

    /// The MCP servers the kernel starts and supervises (`mcp_servers`).
    pub fn mcp_servers(mut self, servers: Vec<McpServerSpec>) -> Self {
        self.mcp = servers;
        self
    }

    /// The config's agents, started as children of PID 1 in this order.
    pub fn agents(mut self, agents: Vec<Declared>) -> Self {
        self.agents = agents;
        self
    }

    /// Reads cron's wall time as `earlier` does, for embedders (and tests
    /// under a paused tokio clock) that run one kernel after another in the
    /// same process: the second then sees the slots the first saw pass.
    pub fn cron_clock_of(mut self, earlier: &Kernel) -> Self {
        self.cron_anchor = Some(earlier.cron().clock_anchor());
        self
    }

    /// Starts the kernel: PID 1, the reaper and the cron timer; the declared
    /// agents, each as the PID it had before a restart; what the store
    /// remembers; the cron entries, stored and declared. Must be awaited
    /// inside a tokio runtime. Fails only when a declared agent is refused,
    /// after stopping what had started.
    pub async fn start(self) -> Result<Started, AgentRefused> {
        let KernelBuilder {
            settings,
            mut runtimes,
            llm,
            store,
            exec,
            templates,
            agents,
            cron_anchor,
            mcp,
            traces,
            cluster,
        } = self;
        if let Some(exec) = exec {
            runtimes.enable_exec(exec);
        }
        let (store, mut recovered) = match store {
            Some((store, recovered)) => (store, Some(recovered)),
            None => (Store::in_memory(), None),
        };
        store.set_event_log_limit(settings.event_log_limit);
        let durable = store.is_durable();
        // A server's stderr is kept where exec agents' output is, when
        // the kernel keeps anything on disk.
        let mcp_logs = durable.then(|| settings.data_dir.join("logs"));
        let sources = skill_sources(&settings, &agents, &templates);
        let saved_skills = recovered
            .as_mut()
            .map(|recovered| std::mem::take(&mut recovered.skills))
            .unwrap_or_default();
        // Blocking reads and parsing, off the async threads; a failure loads none.
        let skills = tokio::task::spawn_blocking(move || {
            let library = crate::skills::Library::load(sources);
            library.restore_saved(&saved_skills);
            library
        })
        .await
        .unwrap_or_else(|err| {
            tracing::error!(error = %err, "the skills directories were not read");
            crate::skills::Library::default()
        });
        let kernel = Kernel::assemble(Parts {
            settings,
            runtimes,
            llm,
            store,
            recovered: recovered.as_ref(),
            templates,
            cron_anchor,
            mcp: McpServers::new(mcp, mcp_logs),
            traces,
            cluster,
            skills,
        });
        kernel.mcp().start();
        kernel.node().serve_cluster();
        // What comes back may sit under a parent on another node, or have
        // children there: read the cluster's tree first.
        if let Some(cluster) = kernel.cluster()
            && !cluster.caught_up(CATCH_UP).await
        {
            tracing::warn!(
                wait_ms = CATCH_UP.as_millis() as u64,
                "cluster: the directory was not read in time; processes under parents on other \
                 nodes may not come back"
            );
        }
        if recovered.is_some() {
            kernel.exec().reclaim_orphans();
        }
        let mut pids = Vec::with_capacity(agents.len());
        let mut here = Vec::with_capacity(agents.len());
        let mut elsewhere = BTreeMap::new();
        for agent in &agents {
            match kernel.spawn_declared(agent, recovered.as_ref()).await {
                Ok(Placed::Here(pid)) => {
                    pids.push(pid);
                    here.push(agent);
                }
                Ok(Placed::Held { node, .. }) => {
                    elsewhere.insert(agent.request.name.clone(), node);
                }
                Ok(Placed::Unplaced { wants }) => {
                    let waiting = format!("none yet: it wants {wants}");
                    elsewhere.insert(agent.request.name.clone(), waiting);
                }
                Err(source) => {
                    kernel.shutdown().await;
                    return Err(AgentRefused {
                        name: agent.request.name.clone(),
                        source,
                    });
                }
            }
        }
        let stored_cron = recovered
            .as_mut()
            .map(|recovered| std::mem::take(&mut recovered.cron))
            .unwrap_or_default();
        let restored = match recovered {
            Some(recovered) => kernel.restore(recovered).await,
            None => Restored::default(),
        };
        let declared_cron: Vec<(Pid, CronSpec)> = here
            .iter()
            .zip(&pids)
            .flat_map(|(agent, pid)| cron::declared(*pid, &agent.cron))
            .collect();
        let cron_problems = if durable || !declared_cron.is_empty() {
            kernel.cron().start(stored_cron, declared_cron).await
        } else {
            Vec::new()
        };
        kernel.cron().started();
        // A config agent this node claimed from a node that is gone (or
        // that released it) brings the API entries aimed at it; its own
        // from before are in the store, and stay as they are.
        kernel.cron().take(&pids).await;
        // After the cron's start, which would otherwise replace the entries
        // of an agent taken over meanwhile.
        kernel.keep_declared(agents);
        kernel.node().keep_moving();
        Ok(Started {
            kernel,
            agents: pids,
            elsewhere,
            restored,
            cron_problems,
        })
    }
}

/// The directories skills are loaded from: the kernel's, then each config
/// agent's and template's.
fn skill_sources(
    settings: &KernelSettings,
    agents: &[Declared],
    templates: &HashMap<String, SpawnRequest>,
) -> crate::skills::Sources {
    let mut from_templates: Vec<&SpawnRequest> = templates.values().collect();
    from_templates.sort_by(|a, b| a.name.cmp(&b.name));
    let requests = agents
        .iter()
        .map(|agent| &agent.request)
        .chain(from_templates);
    crate::skills::Sources::new(
        &settings.skills,
        requests.map(|request| (request.name.as_str(), request.skills.as_slice())),
    )
}
