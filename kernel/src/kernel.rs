//! The `Kernel` handle: the one API that gRPC and in-process runtimes share.
//!
//! Operations live in their own files under kernel/ by concern: `builder`
//! puts a kernel together and starts it, `spawn` creates processes,
//! `supervisor` ends, collects and restarts them, `router` moves messages
//! and tasks, `runner` drives each process's runtime, `cron` runs schedules.
//! This file holds the shared state, the read-side queries and shutdown.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use hivekernel_agents::llm::Provider;
use hivekernel_agents::{
    Capabilities, Limits, Pid, ProcessContext, ProcessInfo, Role, SpawnRequest, Tier,
};
use parking_lot::RwLock;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use crate::caller::Caller;
use crate::config::KernelSettings;
use crate::counter::Counter;
use crate::error::{KernelError, Result};
use crate::events::{EventBus, Subscription, unix_ms};
use crate::mailbox::Mailbox;
use crate::process::{Entry, NewProc, ProcShared, ProcessTable};
use crate::runtime::RuntimeRegistry;
use crate::store::{self, Recovered, Store, Write};
use crate::usage::Meter;
use cron::Cron;
use supervisor::Reaper;
use syscalls::KernelSyscalls;

mod acl;
mod builder;
pub(crate) mod cron;
mod exec;
mod restore;
mod router;
mod runner;
mod spawn;
pub(crate) mod supervisor;
pub(crate) mod syscalls;

pub use builder::{AgentRefused, Declared, KernelBuilder, Started};
pub use restore::{KERNEL_RESTART, Restored};

/// Cheap, cloneable handle to a running kernel.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) settings: KernelSettings,
    pub(crate) table: RwLock<ProcessTable>,
    /// PIDs; never reused, across restarts too.
    pub(crate) pids: Counter,
    /// Message and request ids.
    pub(crate) ids: Counter,
    pub(crate) events: EventBus,
    /// The SQLite store, or its in-memory form.
    pub(crate) store: Store,
    pub(crate) runtimes: RuntimeRegistry,
    /// Root of the workspaces of processes that have no directory of their own.
    pub(crate) workspace_root: Arc<std::path::Path>,
    /// The model provider behind [`Syscalls::chat`](hivekernel_agents::Syscalls::chat).
    pub(crate) llm: Option<Arc<dyn Provider>>,
    pub(crate) tracker: TaskTracker,
    pub(crate) shutdown: CancellationToken,
    pub(crate) stopping: AtomicBool,
    pub(crate) reaper: Reaper,
    pub(crate) cron: Cron,
}

/// Events retained in memory for replay.
const EVENT_RETENTION: usize = 65_536;

impl Kernel {
    /// PID 1 in its table, the reaper and the cron timer running; its
    /// processes' model calls go to `llm`. Events, messages and usage go to
    /// `store`, and counters continue from what it `recovered`. The rest of
    /// starting is [`KernelBuilder::start`]'s.
    fn assemble(
        settings: KernelSettings,
        runtimes: RuntimeRegistry,
        llm: Option<Arc<dyn Provider>>,
        store: Store,
        recovered: Option<&Recovered>,
        templates: HashMap<String, SpawnRequest>,
        cron_anchor: Option<(u64, tokio::time::Instant)>,
    ) -> Kernel {
        let start = |counter: store::Counter, fresh: u64| {
            recovered.map_or(fresh, |r| r.next(counter).max(fresh))
        };
        // A crash skips at most a block: PIDs are seen by people, keep their jump small.
        let pids = Counter::new(store::Counter::Pid, start(store::Counter::Pid, 2), 1 << 10);
        let ids = Counter::new(store::Counter::Id, start(store::Counter::Id, 1), 1 << 16);
        let first_seq = start(store::Counter::EventSeq, 1);
        // PID 1's subtree is the whole kernel: its usage carries on.
        let kernel_usage = Meter::default();
        if let Some(kept) = recovered.and_then(|r| r.usage.get(&Pid::KERNEL)) {
            kernel_usage.add_kept(kept.own, kept.subtree);
        }
        let inner = Arc::new_cyclic(|weak: &Weak<Inner>| {
            let limits = Limits {
                max_children: settings.max_children,
                max_depth: settings.max_depth,
                timeout_seconds: settings.task_timeout_seconds,
                max_concurrent_tasks: settings.max_concurrent_tasks,
                max_tokens_total: None,
                spawns_per_minute: None,
                llm_calls_per_minute: None,
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
                mailbox: Mailbox::new(0, Duration::from_secs(1)),
                usage: kernel_usage,
                budget: None,
                caps: Capabilities::ALL,
            });
            let mut entries = rustc_hash::FxHashMap::default();
            entries.insert(
                Pid::KERNEL,
                Entry {
                    ppid: Pid(0),
                    depth: 0,
                    children: Default::default(),
                    live_children: 0,
                    proc: Arc::new(kernel_proc),
                    exit: None,
                    exit_waiters: None,
                    sup: None,
                },
            );
            Inner {
                workspace_root: Arc::from(settings.workspace_root()),
                settings,
                table: RwLock::new(ProcessTable { entries }),
                pids,
                ids,
                events: EventBus::with_store(EVENT_RETENTION, store.clone(), first_seq),
                store,
                runtimes,
                llm,
                tracker: TaskTracker::new(),
                shutdown: CancellationToken::new(),
                stopping: AtomicBool::new(false),
                reaper: Reaper::default(),
                cron: Cron::new(templates, cron_anchor),
            }
        });
        let kernel = Kernel { inner };
        kernel.start_reaper();
        kernel.start_cron_timer();
        kernel
    }

    /// Name of the model provider, if one is configured.
    pub fn provider_name(&self) -> Option<&str> {
        self.inner.llm.as_deref().map(|llm| llm.name())
    }

    /// The settings this kernel runs with.
    pub fn settings(&self) -> &KernelSettings {
        &self.inner.settings
    }

    /// The event bus (subscribe, last sequence number).
    pub fn subscribe(&self, since: Option<u64>) -> Subscription {
        self.inner.events.subscribe(since)
    }

    /// Sequence number of the newest event.
    pub fn last_event_seq(&self) -> u64 {
        self.inner.events.last_seq()
    }

    /// A snapshot of one live or zombie process.
    pub async fn get_process(&self, _caller: Caller, pid: Pid) -> Result<ProcessInfo> {
        let table = self.inner.table.read();
        let info = table
            .get(pid)
            .map(|entry| entry.info(pid))
            .ok_or(KernelError::NotFound(pid))?;
        drop(table);
        Ok(self.with_log_path(info))
    }

    /// PIDs of `root`'s subtree in depth-first pre-order, at most `max_depth` levels below it.
    pub async fn list_pids(
        &self,
        _caller: Caller,
        root: Pid,
        max_depth: Option<u32>,
    ) -> Result<Vec<Pid>> {
        let table = self.inner.table.read();
        if table.get(root).is_none() {
            return Err(KernelError::NotFound(root));
        }
        Ok(table.subtree_preorder(root, max_depth))
    }

    /// Snapshots of the given processes, skipping any that are gone.
    pub fn infos(&self, pids: &[Pid]) -> Vec<ProcessInfo> {
        let infos: Vec<ProcessInfo> = {
            let table = self.inner.table.read();
            pids.iter()
                .filter_map(|pid| table.get(*pid).map(|e| e.info(*pid)))
                .collect()
        };
        infos
            .into_iter()
            .map(|info| self.with_log_path(info))
            .collect()
    }

    /// Snapshots of `root`'s whole subtree, parents before children.
    pub async fn list_processes(
        &self,
        caller: Caller,
        root: Pid,
        max_depth: Option<u32>,
    ) -> Result<Vec<ProcessInfo>> {
        let pids = self.list_pids(caller, root, max_depth).await?;
        Ok(self.infos(&pids))
    }

    /// Live processes (not counting zombies), PID 1 included.
    pub fn live_count(&self) -> usize {
        let table = self.inner.table.read();
        table.entries.values().filter(|e| e.is_alive()).count()
    }

    /// Stops everything: refuses new work, ends every process leaves first,
    /// waits up to the grace period for in-flight tasks, then forces the rest.
    pub async fn shutdown(&self) {
        if self.inner.stopping.swap(true, Ordering::SeqCst) {
            self.inner.tracker.wait().await;
            return;
        }
        let grace = Duration::from_millis(self.inner.settings.shutdown_grace_ms);
        self.stop_all(grace).await;
        self.inner.shutdown.cancel();
        self.inner.tracker.close();
        self.inner.tracker.wait().await;
        // A clean stop leaves no gap: the next start continues exactly here.
        let settle = [
            (store::Counter::Pid, self.inner.pids.peek()),
            (store::Counter::Id, self.inner.ids.peek()),
            (store::Counter::EventSeq, self.inner.events.next_seq()),
        ];
        let store = &self.inner.store;
        store.submit_all(
            settle
                .into_iter()
                .map(|(counter, next)| Write::Settle { counter, next }),
        );
        store.close().await;
    }

    /// Whether [`Kernel::shutdown`] has begun.
    pub fn is_stopping(&self) -> bool {
        self.inner.stopping.load(Ordering::SeqCst)
    }

    /// A token cancelled when the kernel has stopped its processes.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.inner.shutdown.clone()
    }

    /// The tracker that owns every task the kernel spawns.
    pub fn tracker(&self) -> &TaskTracker {
        &self.inner.tracker
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.inner.ids.take(&self.inner.store, &self.inner.tracker)
    }

    /// The store, when the kernel keeps one on disk.
    pub fn store(&self) -> Option<&Store> {
        Some(&self.inner.store).filter(|store| store.is_durable())
    }

    /// The store, for what only a kernel with a data directory keeps
    /// (artifacts, memory); refused with FAILED_PRECONDITION otherwise.
    pub(crate) fn durable_store(&self, what: &'static str) -> Result<&Store> {
        self.store().ok_or(KernelError::NoStore(what))
    }

    pub(crate) fn check_running(&self) -> Result<()> {
        if self.is_stopping() {
            Err(KernelError::ShuttingDown)
        } else {
            Ok(())
        }
    }

    pub(crate) fn downgrade(&self) -> Weak<Inner> {
        Arc::downgrade(&self.inner)
    }
}
