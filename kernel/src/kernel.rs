//! The `Kernel` handle: the one API that gRPC and in-process runtimes share.
//!
//! Operations live in their own files under kernel/ by concern: `builder`
//! puts a kernel together and starts it, `spawn` creates processes,
//! `supervisor` ends, collects and restarts them, `router` moves messages
//! and tasks, `runner` drives each process's runtime, `cron` runs schedules.
//! This file holds the shared state, the read-side queries and shutdown.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use hivekernel_agents::{Pid, ProcessInfo, TraceId};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use crate::caller::Caller;
use crate::config::KernelSettings;
use crate::error::{KernelError, Result};
use crate::events::Subscription;
use crate::store::{self, Store, Write};

mod acl;
mod across;
pub(crate) mod artifacts;
pub use artifacts::ArtifactsHandle;
mod asked;
mod builder;
mod census;
mod cluster;
pub(crate) mod cron;
mod declared;
mod exec;
pub use exec::ExecHandle;
mod inbox;
mod inner;
mod lanes;
mod llm;
pub use llm::LlmHandle;
mod mail;
mod mcp;
pub(crate) mod memory;
pub use memory::MemoryHandle;
mod moved;
mod placement;
mod reload;
mod resolve;
mod restore;
mod router;
mod runner;
mod skills;
pub use skills::SkillsHandle;
mod spawn;
pub(crate) mod state;
mod storage;
pub(crate) mod supervisor;
pub(crate) mod syscalls;
mod tree;
pub use inbox::{InboxHandle, MAX_INBOX_TEXT, MAX_SHOWN_ARGUMENTS};
mod tokens;
pub use tokens::{MAX_TOKEN_LIFETIME, NewToken, TokensHandle};
mod transcript;
pub use transcript::{Recording, TranscriptsHandle};

pub use builder::{AgentRefused, Declared, KernelBuilder, Started};
pub(crate) use cluster::moved_away;
pub use cluster::{NodeHandle, Snapshots, Unanswered};
pub use declared::Placed;
use inner::{Inner, Parts};
pub use mcp::{McpHandle, McpToolInfo};
pub use placement::Placement;
pub use restore::{KERNEL_RESTART, Restored};

/// Cheap, cloneable handle to a running kernel.
#[derive(Debug, Clone)]
pub struct Kernel {
    inner: Arc<Inner>,
}

impl Kernel {
    /// PID 1 in its table, the reaper and the cron timer running; the
    /// rest of starting is [`KernelBuilder::start`]'s.
    fn assemble(parts: Parts<'_>) -> Kernel {
        let inner = Arc::new_cyclic(|weak: &Weak<Inner>| Inner::new(weak, parts));
        let kernel = Kernel { inner };
        kernel.start_reaper();
        kernel.cron().start_timer();
        kernel
    }

    /// Name of the model provider, if one is configured.
    pub fn provider_name(&self) -> Option<&str> {
        self.inner.llm().map(|llm| llm.name())
    }

    /// The settings this kernel runs with.
    pub fn settings(&self) -> &KernelSettings {
        self.inner.settings()
    }

    /// The metrics it keeps (`kernel.metrics`), for the doors that count
    /// their calls; `None`: it keeps none.
    pub(crate) fn metrics(&self) -> Option<Arc<crate::metrics::Metrics>> {
        self.inner.metrics().cloned()
    }

    /// Where spans go (`kernel.otel`), for the doors that open them;
    /// `None`: traces are not exported.
    pub(crate) fn traces(&self) -> Option<&Arc<crate::otel::Traces>> {
        self.inner.traces()
    }

    /// The event bus (subscribe, last sequence number).
    pub fn subscribe(&self, since: Option<u64>) -> Subscription {
        self.inner.events().subscribe(since)
    }

    /// What of the event log `caller` may see: all of it (the admin and
    /// operator tokens), or a process's own subtree.
    pub fn event_view(&self, caller: Caller) -> crate::events::EventView {
        use crate::events::EventView;
        match caller {
            Caller::Process(me) => {
                let table = self.inner.table().read();
                EventView::Subtree(table.subtree_preorder(me, None).into_iter().collect())
            }
            _ => EventView::All,
        }
    }

    /// The filter of a subscriber that asked for the events of `pid` (its
    /// subtree's with `subtree`), of `types` and of `trace`. A process may
    /// name only itself or a live descendant; for the operator a PID no
    /// longer in the table is taken as it is, for the events it left.
    pub fn event_filter(
        &self,
        caller: Caller,
        pid: Option<Pid>,
        subtree: bool,
        types: &[String],
        trace: Option<TraceId>,
    ) -> Result<crate::events::EventFilter> {
        let mut filter = crate::events::EventFilter::any()
            .types(types)
            .map_err(KernelError::InvalidArgument)?;
        if let Some(trace) = trace {
            filter = filter.trace(trace);
        }
        match pid {
            Some(pid) => {
                let table = self.inner.table().read();
                if let Caller::Process(me) = caller
                    && me != pid
                    && !table.is_ancestor(me, pid)
                {
                    return Err(KernelError::PermissionDenied(format!(
                        "process {me} may only watch the events of itself and its \
                         descendants, not of {pid}"
                    )));
                }
                let mut members: std::collections::HashSet<Pid> = if subtree {
                    table.subtree_preorder(pid, None).into_iter().collect()
                } else {
                    std::collections::HashSet::new()
                };
                members.insert(pid);
                Ok(filter.processes(members, subtree))
            }
            None if subtree => Err(KernelError::InvalidArgument(
                "subtree needs the pid whose subtree to watch".into(),
            )),
            None => Ok(filter),
        }
    }

    /// Sequence number of the newest event.
    pub fn last_event_seq(&self) -> u64 {
        self.inner.events().last_seq()
    }

    /// A snapshot of one live or zombie process, wherever in the cluster
    /// it lives.
    pub async fn get_process(&self, _caller: Caller, pid: Pid) -> Result<ProcessInfo> {
        if self.inner.cluster().is_none() {
            let info = self.inner.table().read().get(pid).map(|e| e.info(pid));
            return match info {
                Some(info) => Ok(self.exec().with_log_path(info)),
                None => Err(KernelError::NotFound(pid)),
            };
        }
        match self.node().local_infos(&[pid]).pop().flatten() {
            Some(info) => Ok(info),
            None => self.node().remote_info(pid).await,
        }
    }

    /// PIDs of `root`'s subtree in depth-first pre-order, at most
    /// `max_depth` levels below it; on a node of a cluster, the subtree
    /// across every live node.
    pub async fn list_pids(
        &self,
        _caller: Caller,
        root: Pid,
        max_depth: Option<u32>,
    ) -> Result<Vec<Pid>> {
        {
            let table = self.inner.table().read();
            let tree = tree::Tree::new(&table, self.inner.cluster().map(|c| c.listings()));
            if tree.contains(root) {
                return Ok(tree.subtree_preorder(root, max_depth));
            }
        }
        if self.inner.cluster().is_none() {
            return Err(KernelError::NotFound(root));
        }
        match self.node().holder(root).await? {
            // Listed a moment ago, not mirrored yet: nothing below it yet.
            Some(_) => Ok(vec![root]),
            None => Err(KernelError::NotFound(root)),
        }
    }

    /// Snapshots of the given processes in their order, skipping any that
    /// are gone; on a node of a cluster, those other nodes hold are asked
    /// of them.
    pub async fn infos(&self, pids: &[Pid]) -> Vec<ProcessInfo> {
        self.snapshots(pids).await.infos
    }

    /// [`Kernel::infos`], naming the nodes that held some of `pids` and
    /// did not answer for them.
    pub async fn snapshots(&self, pids: &[Pid]) -> Snapshots {
        if let Some(cluster) = self.inner.cluster() {
            return self.node().cluster_infos(cluster, pids).await;
        }
        // Alone: one vector, reused in place (100k snapshots are tens of MB).
        let infos: Vec<ProcessInfo> = {
            let table = self.inner.table().read();
            pids.iter()
                .filter_map(|pid| table.get(*pid).map(|e| e.info(*pid)))
                .collect()
        };
        Snapshots {
            infos: infos
                .into_iter()
                .map(|info| self.exec().with_log_path(info))
                .collect(),
            unanswered: Vec::new(),
        }
    }

    /// Snapshots of `root`'s whole subtree, parents before children.
    pub async fn list_processes(
        &self,
        caller: Caller,
        root: Pid,
        max_depth: Option<u32>,
    ) -> Result<Vec<ProcessInfo>> {
        let pids = self.list_pids(caller, root, max_depth).await?;
        Ok(self.infos(&pids).await)
    }

    /// Live processes (not counting zombies), PID 1 included.
    pub fn live_count(&self) -> usize {
        let table = self.inner.table().read();
        table.iter().filter(|(_, e)| e.is_alive()).count()
    }

    /// Stops everything: refuses new work, ends every process leaves first,
    /// waits up to the grace period for in-flight tasks, then forces the rest.
    pub async fn shutdown(&self) {
        if self.inner.stopping().swap(true, Ordering::SeqCst) {
            self.inner.tracker().wait().await;
            return;
        }
        self.inner.stop_begun().cancel();
        let grace = Duration::from_millis(self.inner.settings().shutdown_grace_ms);
        self.stop_all(grace).await;
        self.inner.shutdown().cancel();
        self.inner.tracker().close();
        self.inner.tracker().wait().await;
        // A clean stop leaves no gap: the next start continues exactly here.
        let settle = [
            (store::Counter::Pid, self.inner.pids().peek()),
            (store::Counter::Id, self.inner.ids().peek()),
            (store::Counter::EventSeq, self.inner.events().next_seq()),
            (
                store::Counter::Transcript,
                self.inner.transcripts().peek_id(),
            ),
        ];
        let store = &self.inner.store();
        store.submit_all(
            settle
                .into_iter()
                .map(|(counter, next)| Write::Settle { counter, next }),
        );
        store.close().await;
        // Spans still queued go out before the process ends (blocking, at
        // most a few seconds: off the async threads).
        if let Some(traces) = self.inner.traces().cloned() {
            let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
        }
    }

    /// Whether [`Kernel::shutdown`] has begun.
    pub fn is_stopping(&self) -> bool {
        self.inner.stopping().load(Ordering::SeqCst)
    }

    /// A token cancelled as soon as [`Kernel::shutdown`] begins, before
    /// any process is stopped.
    pub fn stopping_token(&self) -> CancellationToken {
        self.inner.stop_begun().clone()
    }

    /// A token cancelled when the kernel has stopped its processes.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.inner.shutdown().clone()
    }

    /// The tracker that owns every task the kernel spawns.
    pub fn tracker(&self) -> &TaskTracker {
        self.inner.tracker()
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.inner
            .ids()
            .take(self.inner.store(), self.inner.tracker())
    }

    /// The store, when the kernel keeps one on disk.
    pub fn store(&self) -> Option<&Store> {
        Some(self.inner.store()).filter(|store| store.is_durable())
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

    fn downgrade(&self) -> Weak<Inner> {
        Arc::downgrade(&self.inner)
    }
}
