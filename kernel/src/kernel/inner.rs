//! The kernel's parts, owned here: the settings, the process table, the
//! counters, the event bus, the transcripts, the store, the runtimes, the model provider, the
//! task tracker and shutdown signals, the reaper and cron. Their fields are
//! private to this file; the facade's files reach each part through its
//! accessor and use it through the part's own API.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use hivekernel_agents::llm::Provider;
use hivekernel_agents::{Capabilities, Limits, Pid, ProcessContext, Role, SpawnRequest, Tier};
use parking_lot::RwLock;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::cron::Cron;
use super::supervisor::Reaper;
use super::syscalls::KernelSyscalls;
use crate::config::{KernelSettings, RoleSettings};
use crate::counter::Counter;
use crate::events::{EventBus, unix_ms};
use crate::mailbox::Mailbox;
use crate::mcp::McpServers;
use crate::process::{Entry, NewProc, ProcShared, ProcessTable};
use crate::runtime::RuntimeRegistry;
use crate::store::{self, Recovered, Store};
use crate::tokens::OperatorTokens;
use crate::transcripts::Transcripts;
use crate::usage::Meter;

/// Events retained in memory for replay.
const EVENT_RETENTION: usize = 65_536;

/// What a kernel is assembled from (the builder's fields).
#[derive(Debug)]
pub(super) struct Parts<'a> {
    pub(super) settings: KernelSettings,
    pub(super) runtimes: RuntimeRegistry,
    pub(super) llm: Option<Arc<dyn Provider>>,
    pub(super) store: Store,
    /// What the store read back, when it is durable: where counters continue.
    pub(super) recovered: Option<&'a Recovered>,
    pub(super) templates: HashMap<String, SpawnRequest>,
    pub(super) cron_anchor: Option<(u64, tokio::time::Instant)>,
    pub(super) mcp: McpServers,
    pub(super) traces: Option<Arc<crate::otel::Traces>>,
    pub(super) cluster: Option<Arc<crate::cluster::Cluster>>,
    pub(super) skills: crate::skills::Library,
}

/// The kernel's parts. Each group below is a part with one purpose; the
/// facade's files reach every field through an accessor of [`Inner`].
#[derive(Debug)]
pub(super) struct Inner {
    settings: Settings,
    table: RwLock<ProcessTable>,
    counters: Counters,
    events: EventBus,
    /// The SQLite store, or its in-memory form.
    store: Store,
    runtimes: RuntimeRegistry,
    model: Model,
    life: Lifecycle,
    telemetry: Telemetry,
    node: Node,
    services: Services,
}

/// The settings as they stand.
#[derive(Debug)]
struct Settings {
    /// As the kernel started with them.
    start: KernelSettings,
    /// The `roles` section as it stands: the settings' at start, replaced
    /// by a config reload. Read at each spawn.
    roles: RwLock<Arc<HashMap<Role, RoleSettings>>>,
    /// Root of the workspaces of processes that have no directory of their own.
    workspace_root: Arc<std::path::Path>,
}

/// Where new PIDs and ids come from.
#[derive(Debug)]
struct Counters {
    /// PIDs; never reused, across restarts too.
    pids: Counter,
    /// Message and request ids.
    ids: Counter,
}

/// Access to the model.
#[derive(Debug)]
struct Model {
    /// The model provider behind [`Syscalls::chat`](hivekernel_agents::Syscalls::chat).
    provider: Option<Arc<dyn Provider>>,
    /// Server tokens per estimated token, per served model, learned from
    /// the usage answers report; kept in the store.
    calibration: hivekernel_agents::llm::calibration::Calibration,
}

/// What runs, and how it stops.
#[derive(Debug)]
struct Lifecycle {
    /// Every task the kernel starts.
    tracker: TaskTracker,
    /// Cancelled to stop those tasks.
    shutdown: CancellationToken,
    stopping: AtomicBool,
    /// Cancelled as a stop begins (`stopping` turns true): what outside
    /// watchers (health) wait on.
    stop_begun: CancellationToken,
    /// Collects the exited processes nobody waits for.
    reaper: Reaper,
}

/// What the kernel is watched by.
#[derive(Debug)]
struct Telemetry {
    /// What `/metrics` serves, when `kernel.metrics` is set; the bus and
    /// the store feed it too.
    metrics: Option<Arc<crate::metrics::Metrics>>,
    /// Where spans go, when traces are exported (`kernel.otel`).
    traces: Option<Arc<crate::otel::Traces>>,
}

/// This kernel as a node of a cluster.
#[derive(Debug)]
struct Node {
    /// The cluster it is a node of, if any (`kernel.cluster`).
    cluster: Option<Arc<crate::cluster::Cluster>>,
    /// The receivers' lanes of the messages the kernel makes (lanes.rs).
    lanes: super::lanes::Lanes,
    /// Token budgets lent to children on other nodes, by child: what
    /// each loan spent comes back when its child exits (across.rs).
    loans: parking_lot::Mutex<HashMap<Pid, Arc<crate::budget::Pool>>>,
    /// Taken while a loan is matched with its record in the cluster
    /// (reopened, or charged from it), so two of those never interleave.
    loan_records: tokio::sync::Mutex<()>,
}

/// The subsystems each feature owns.
#[derive(Debug)]
struct Services {
    transcripts: Transcripts,
    cron: Cron,
    /// The MCP servers the config names; fixed at start.
    mcp: McpServers,
    /// The skills the config's directories hold; reloaded with the config.
    skills: crate::skills::Library,
    /// Operator tokens; the authentication layer reads the same registry.
    tokens: OperatorTokens,
    /// Held while a token change is written, so two never interleave.
    token_changes: tokio::sync::Mutex<()>,
    /// What processes ask people, waiting.
    inbox: crate::inbox::Inbox,
    /// The inbox's webhook, when the config names one.
    notifier: Option<crate::notify::Notifier>,
}

impl Inner {
    /// The parts, with PID 1 in the table; `weak` is the kernel it will be.
    pub(super) fn new(weak: &Weak<Inner>, parts: Parts<'_>) -> Inner {
        let Parts {
            settings,
            runtimes,
            llm,
            store,
            recovered,
            templates,
            cron_anchor,
            mcp,
            traces,
            cluster,
            skills,
        } = parts;
        let start = |counter: store::Counter, fresh: u64| {
            recovered.map_or(fresh, |r| r.next(counter).max(fresh))
        };
        // A crash skips at most a block: PIDs are seen by people, keep their jump small.
        let pids = Counter::new(store::Counter::Pid, start(store::Counter::Pid, 2), 1 << 10);
        // On a node of a cluster, ids start in this start's own range
        // (its epoch, which no other start of any node shares), so they
        // are unique cluster-wide and a message keeps its id wherever it
        // moves; ids this node kept from earlier starts lie below it.
        let first_id = cluster
            .as_ref()
            .map_or(1, |cluster| crate::cluster::first_id(cluster.epoch()));
        let ids = Counter::new(
            store::Counter::Id,
            start(store::Counter::Id, first_id),
            1 << 16,
        );
        let first_seq = start(store::Counter::EventSeq, 1);
        // PID 1's subtree is the whole kernel: its usage carries on.
        let kernel_usage = Meter::default();
        if let Some(kept) = recovered.and_then(|r| r.usage.get(&Pid::KERNEL)) {
            kernel_usage.add_kept(kept.own, kept.subtree);
        }
        let limits = Limits {
            max_children: settings.max_children,
            max_depth: settings.max_depth,
            timeout_seconds: settings.task_timeout_seconds,
            max_concurrent_tasks: settings.max_concurrent_tasks,
            max_tokens_total: None,
            spawns_per_minute: None,
            llm_calls_per_minute: None,
            max_storage_bytes: None,
        };
        let ctx = ProcessContext {
            pid: Pid::KERNEL,
            name: Arc::from("kernel"),
            role: Role::Kernel,
            tier: Tier::Strategic,
            model: Arc::from(""),
            system_prompt: Arc::from(""),
            tools: Arc::from(Vec::new()),
            workspace: None,
            syscalls: Arc::new(KernelSyscalls::new(weak.clone(), Pid::KERNEL)),
        };
        let kernel_proc = ProcShared::new(NewProc {
            ctx,
            runtime_name: Arc::from("kernel"),
            runtime: None,
            limits,
            metadata: Default::default(),
            started_at_unix_ms: unix_ms(SystemTime::now()),
            mailbox: Mailbox::new(0, 0, Duration::from_secs(1)),
            usage: kernel_usage,
            budget: None,
            caps: Capabilities::ALL,
            restored: false,
            mail_in_cluster: false,
            spec_in_cluster: false,
            approvals: None,
            skill_dirs: None,
        });
        let table = ProcessTable::with_kernel(Entry {
            ppid: Pid(0),
            depth: 0,
            children: Default::default(),
            live_children: 0,
            proc: Arc::new(kernel_proc),
            exit: None,
            exit_waiters: None,
            sup: None,
        });
        let tracker = TaskTracker::new();
        let transcripts = Transcripts::new(
            settings.transcripts,
            store.clone(),
            start(store::Counter::Transcript, 1),
            tracker.clone(),
        );
        let calibration = hivekernel_agents::llm::calibration::Calibration::default();
        for (model, ratio) in recovered
            .map(|r| r.token_ratios.clone())
            .unwrap_or_default()
        {
            calibration.restore(model, ratio);
        }
        let metrics = settings.metrics.as_ref().map(|_| {
            let metrics = Arc::new(crate::metrics::Metrics::new(SystemTime::now()));
            store.observe_commits(metrics.store_commits());
            metrics
        });
        let tokens = OperatorTokens::new(recovered.map(|r| r.tokens.clone()).unwrap_or_default());
        let shutdown = CancellationToken::new();
        let notifier = settings.notify.clone().and_then(|notify| {
            let kernel = weak.clone();
            let failed = move |failed: crate::notify::Failed| {
                if let Some(inner) = kernel.upgrade() {
                    inner.events.emit(
                        failed.pid,
                        crate::events::EventKind::NotifyFailed {
                            id: failed.request,
                            error: failed.error,
                            attempts: failed.attempts,
                        },
                    );
                }
            };
            crate::notify::Notifier::start(notify, &tracker, shutdown.clone(), failed)
                .inspect_err(|err| tracing::error!(error = %err, "the inbox webhook cannot start"))
                .ok()
        });
        Inner {
            settings: Settings {
                workspace_root: Arc::from(settings.workspace_root()),
                roles: RwLock::new(Arc::new(settings.roles.clone())),
                start: settings,
            },
            table: RwLock::new(table),
            counters: Counters { pids, ids },
            events: EventBus::with_store(EVENT_RETENTION, store.clone(), first_seq)
                .with_metrics(metrics.clone())
                .with_tap(
                    cluster
                        .clone()
                        .map(|cluster| cluster as Arc<dyn crate::events::ProcessTap>),
                ),
            store,
            runtimes,
            model: Model {
                provider: llm,
                calibration,
            },
            life: Lifecycle {
                tracker,
                shutdown,
                stopping: AtomicBool::new(false),
                stop_begun: CancellationToken::new(),
                reaper: Reaper::default(),
            },
            telemetry: Telemetry { metrics, traces },
            node: Node {
                cluster,
                lanes: Default::default(),
                loans: Default::default(),
                loan_records: tokio::sync::Mutex::new(()),
            },
            services: Services {
                transcripts,
                cron: Cron::new(templates, cron_anchor),
                mcp,
                skills,
                tokens,
                token_changes: tokio::sync::Mutex::new(()),
                inbox: Default::default(),
                notifier,
            },
        }
    }

    /// The inbox.
    pub(super) fn inbox(&self) -> &crate::inbox::Inbox {
        &self.services.inbox
    }

    /// The inbox's webhook, if any.
    pub(super) fn notifier(&self) -> Option<&crate::notify::Notifier> {
        self.services.notifier.as_ref()
    }

    /// The operator tokens, and the lock token changes hold.
    pub(super) fn tokens(&self) -> (&OperatorTokens, &tokio::sync::Mutex<()>) {
        (&self.services.tokens, &self.services.token_changes)
    }

    pub(super) fn settings(&self) -> &KernelSettings {
        &self.settings.start
    }

    /// What processes of `role` get unless they ask otherwise, as the
    /// `roles` section stands now.
    pub(super) fn role(&self, role: Role) -> Option<RoleSettings> {
        self.settings.roles.read().get(&role).cloned()
    }

    /// What processes of `role` may do: its `roles` entry's list, else the
    /// role's default (PID 1 always has every capability).
    pub(super) fn role_capabilities(&self, role: Role) -> Capabilities {
        crate::config::role_capabilities(&self.settings.roles.read(), role)
    }

    /// The `roles` section as it stands now.
    pub(super) fn roles(&self) -> Arc<HashMap<Role, RoleSettings>> {
        self.settings.roles.read().clone()
    }

    /// Replaces the `roles` section (a config reload).
    pub(super) fn set_roles(&self, roles: HashMap<Role, RoleSettings>) {
        *self.settings.roles.write() = Arc::new(roles);
    }

    pub(super) fn table(&self) -> &RwLock<ProcessTable> {
        &self.table
    }

    pub(super) fn pids(&self) -> &Counter {
        &self.counters.pids
    }

    pub(super) fn ids(&self) -> &Counter {
        &self.counters.ids
    }

    pub(super) fn events(&self) -> &EventBus {
        &self.events
    }

    pub(super) fn metrics(&self) -> Option<&Arc<crate::metrics::Metrics>> {
        self.telemetry.metrics.as_ref()
    }

    pub(super) fn traces(&self) -> Option<&Arc<crate::otel::Traces>> {
        self.telemetry.traces.as_ref()
    }

    pub(super) fn cluster(&self) -> Option<&Arc<crate::cluster::Cluster>> {
        self.node.cluster.as_ref()
    }

    pub(super) fn loans(&self) -> &parking_lot::Mutex<HashMap<Pid, Arc<crate::budget::Pool>>> {
        &self.node.loans
    }

    pub(super) fn loan_records(&self) -> &tokio::sync::Mutex<()> {
        &self.node.loan_records
    }

    pub(super) fn lanes(&self) -> &super::lanes::Lanes {
        &self.node.lanes
    }

    pub(super) fn transcripts(&self) -> &Transcripts {
        &self.services.transcripts
    }

    pub(super) fn calibration(&self) -> &hivekernel_agents::llm::calibration::Calibration {
        &self.model.calibration
    }

    pub(super) fn store(&self) -> &Store {
        &self.store
    }

    pub(super) fn runtimes(&self) -> &RuntimeRegistry {
        &self.runtimes
    }

    pub(super) fn workspace_root(&self) -> &Arc<std::path::Path> {
        &self.settings.workspace_root
    }

    pub(super) fn llm(&self) -> Option<&Arc<dyn Provider>> {
        self.model.provider.as_ref()
    }

    pub(super) fn tracker(&self) -> &TaskTracker {
        &self.life.tracker
    }

    pub(super) fn shutdown(&self) -> &CancellationToken {
        &self.life.shutdown
    }

    pub(super) fn stopping(&self) -> &AtomicBool {
        &self.life.stopping
    }

    pub(super) fn stop_begun(&self) -> &CancellationToken {
        &self.life.stop_begun
    }

    pub(super) fn reaper(&self) -> &Reaper {
        &self.life.reaper
    }

    pub(super) fn cron(&self) -> &Cron {
        &self.services.cron
    }

    pub(super) fn mcp(&self) -> &McpServers {
        &self.services.mcp
    }

    pub(super) fn skills(&self) -> &crate::skills::Library {
        &self.services.skills
    }
}
