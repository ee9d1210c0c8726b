//! The kernel as a node of a cluster: what it tells the cluster about
//! itself (its load, its processes' listings in the directory), what it
//! answers other nodes, and the reads that reach the processes other nodes
//! hold (docs/CLUSTER.md).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use hivekernel_agents::{
    ErrorKind, Message, MessageId, Outgoing, Pid, ProcessInfo, ProcessState, RequestId, TaskSpec,
};
use tokio::sync::Semaphore;

use super::cron::CronInfo;
use super::lanes::Posting;
use super::tree::Tree;
use crate::cluster::rpc::{self, Answer, Op, Refusal, refused};
use crate::cluster::{Cluster, Listing, Load, NodeInfo};
use crate::error::{KernelError, Result};
use crate::events::unix_ms;
use crate::kernel::{Caller, Kernel};
use crate::mailbox::{ReplyTo, Requester};
use crate::process::{ProcShared, ProcessTable};
use crate::router::{Route, check_duration, descends, route};
use crate::store::Write;

/// Requests from other nodes answered at once; more wait their turn.
const SERVED_AT_ONCE: usize = 256;
/// `get` requests in flight at once, for one read.
const GETS_AT_ONCE: usize = 8;
/// How long a forwarded kill may take (a large subtree ends leaves first).
pub(super) const FORWARDED_KILL: std::time::Duration = std::time::Duration::from_secs(30);
/// How long a forwarded cron change may take (it commits to the store).
pub(super) const FORWARDED_CRON: std::time::Duration = std::time::Duration::from_secs(10);
/// How long a forwarded spawn may take (it waits for its listing).
pub(super) const FORWARDED_SPAWN: std::time::Duration = std::time::Duration::from_secs(30);
/// How long a forwarded message may take to be taken in.
pub(super) const FORWARDED_SEND: std::time::Duration = std::time::Duration::from_secs(10);
/// How long a node takes at most to take in a message another node posted
/// (less than that node waits for the answer).
const POST_WAIT: std::time::Duration = std::time::Duration::from_secs(8);
/// How much longer than a forwarded task's timeout its requester waits.
const FORWARD_MARGIN: std::time::Duration = std::time::Duration::from_secs(10);

/// A receiver on another node, and the route to it as judged on the tree
/// across the nodes.
#[derive(Debug)]
pub(super) struct Remote {
    node: String,
    route: Route,
}

/// Where a process lives, as this node finds it.
#[derive(Debug)]
pub(crate) enum Holder {
    /// In this kernel's table.
    Here,
    /// On another live node, as the directory lists it.
    There(Listing),
}

/// This kernel as a node of its cluster ([`Kernel::node`]): where a
/// process lives and reading it there, forwarding what another node must
/// do, answering other nodes, the lanes of the messages it makes, budgets
/// lent to children on other nodes, and what it takes over from a lost
/// node. On a kernel that runs alone, each finds everything here.
#[derive(Debug, Clone, Copy)]
pub struct NodeHandle<'k> {
    pub(super) kernel: &'k Kernel,
}

impl super::Kernel {
    /// This kernel as a node of its cluster.
    pub fn node(&self) -> NodeHandle<'_> {
        NodeHandle { kernel: self }
    }

    /// The cluster this kernel is a node of, if any.
    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.inner.cluster()
    }

    /// The live nodes as this node sees them, this node first; refused
    /// for a kernel that runs alone.
    pub fn nodes(&self) -> Result<Vec<NodeInfo>> {
        match self.inner.cluster() {
            Some(cluster) => Ok(cluster.nodes()),
            None => Err(KernelError::FailedPrecondition(
                "this kernel is not a node of a cluster (start it with --cluster nats://HOST:PORT \
                 or kernel.cluster)"
                    .into(),
            )),
        }
    }

    /// Processes alive and of those running, now: one pass over the table
    /// under its read lock (each heartbeat, not on any hot path).
    pub fn load(&self) -> Load {
        let table = self.inner.table().read();
        let mut load = Load::default();
        for (pid, entry) in table.iter() {
            // PID 1 is the kernel, on every node.
            if pid.0 > 1 && entry.is_alive() {
                load.processes += 1;
                if entry.state() == ProcessState::Running {
                    load.running += 1;
                }
            }
        }
        load
    }
}

impl NodeHandle<'_> {
    /// Where `pid` lives: here, on another live node, or nowhere.
    pub(crate) async fn holder(self, pid: Pid) -> Result<Option<Holder>> {
        if self.kernel.inner.table().read().get(pid).is_some() {
            return Ok(Some(Holder::Here));
        }
        let Some(cluster) = self.kernel.inner.cluster() else {
            return Ok(None);
        };
        let listing = cluster
            .locate(pid)
            .await
            .map_err(|err| KernelError::ClusterUnavailable(err.to_string()))?;
        Ok(listing.map(Holder::There))
    }

    /// A snapshot of `pid`, which another node holds.
    pub(super) async fn remote_info(self, pid: Pid) -> Result<ProcessInfo> {
        let (Some(cluster), Some(Holder::There(listing))) =
            (self.kernel.inner.cluster(), self.holder(pid).await?)
        else {
            return Err(KernelError::NotFound(pid));
        };
        let got = read_from(cluster, &listing.node, vec![pid]).await?;
        got.into_iter()
            .find(|info| info.pid == pid)
            .ok_or(KernelError::NotFound(pid))
    }

    /// Snapshots of `pids` in their order, skipping those gone: this
    /// node's from its table, the others' from the nodes holding them
    /// (each asked once per [`rpc::MAX_GET`] PIDs, the nodes at once).
    pub(super) async fn cluster_infos(self, cluster: &Cluster, pids: &[Pid]) -> Snapshots {
        let mut infos: Vec<Option<ProcessInfo>> = self.local_infos(pids);
        let mut wanted: HashMap<String, Vec<Pid>> = HashMap::new();
        {
            let listings = cluster.listings();
            for (pid, info) in pids.iter().zip(&infos) {
                if info.is_none()
                    && let Some(listing) = listings.get(*pid)
                {
                    wanted.entry(listing.node.clone()).or_default().push(*pid);
                }
            }
        }
        if wanted.is_empty() {
            return Snapshots {
                infos: infos.into_iter().flatten().collect(),
                unanswered: Vec::new(),
            };
        }
        let asks: Vec<(String, Vec<Pid>)> = wanted
            .into_iter()
            .flat_map(|(node, pids)| {
                pids.chunks(rpc::MAX_GET)
                    .map(|chunk| (node.clone(), chunk.to_vec()))
                    .collect::<Vec<_>>()
            })
            .collect();
        let answers: Vec<std::result::Result<Vec<ProcessInfo>, Unanswered>> =
            futures::stream::iter(asks)
                .map(|(node, pids)| async move {
                    let held = pids.len();
                    read_from(cluster, &node, pids).await.map_err(|err| {
                        tracing::warn!(%node, error = %err, "cluster: processes of a node not read");
                        Unanswered {
                            node,
                            error: err.to_string(),
                            processes: held,
                        }
                    })
                })
                .buffer_unordered(GETS_AT_ONCE)
                .collect()
                .await;
        let mut got: HashMap<Pid, ProcessInfo> = HashMap::new();
        let mut unanswered: Vec<Unanswered> = Vec::new();
        for answer in answers {
            match answer {
                Ok(read) => got.extend(read.into_iter().map(|info| (info.pid, info))),
                // A node asked in several chunks is named once.
                Err(gap) => match unanswered.iter_mut().find(|seen| seen.node == gap.node) {
                    Some(seen) => seen.processes += gap.processes,
                    None => unanswered.push(gap),
                },
            }
        }
        unanswered.sort_by(|a, b| a.node.cmp(&b.node));
        for (pid, info) in pids.iter().zip(infos.iter_mut()) {
            if info.is_none() {
                *info = got.remove(pid);
            }
        }
        Snapshots {
            infos: infos.into_iter().flatten().collect(),
            unanswered,
        }
    }

    /// Snapshots of those of `pids` this node holds, `None` for the
    /// others, as callers get them: with their log paths and, on a node
    /// of a cluster, their node; PID 1's live children on the other nodes
    /// are counted too (every node's config agents).
    pub(super) fn local_infos(self, pids: &[Pid]) -> Vec<Option<ProcessInfo>> {
        let mut infos: Vec<Option<ProcessInfo>> = {
            let table = self.kernel.inner.table().read();
            pids.iter()
                .map(|pid| table.get(*pid).map(|e| e.info(*pid)))
                .collect()
        };
        // One read of the mirror for the whole batch.
        let others = self
            .kernel
            .inner
            .cluster()
            .map(|cluster| (cluster.node(), cluster.listings()));
        for info in infos.iter_mut().flatten() {
            if let Some((node, listings)) = &others {
                info.node = Some((*node).to_owned());
                // Another process counts its children elsewhere in its
                // own slots already.
                if info.pid != Pid::KERNEL {
                    continue;
                }
                let elsewhere = listings
                    .children(info.pid)
                    .filter(|child| listings.get(*child).is_some_and(|l| !l.exited))
                    .count();
                info.children = info
                    .children
                    .saturating_add(u32::try_from(elsewhere).unwrap_or(u32::MAX));
            }
        }
        drop(others);
        infos
            .into_iter()
            .map(|info| info.map(|info| self.kernel.exec().with_log_path(info)))
            .collect()
    }
}

impl NodeHandle<'_> {
    /// Joins the kernel to its cluster, if any: hands it the kernel's load
    /// for its heartbeats and its processes' listings for the directory
    /// (through weak handles: the cluster does not keep the kernel alive),
    /// and answers the other nodes' requests until shutdown.
    pub(super) fn serve_cluster(self) {
        let Some(cluster) = self.kernel.inner.cluster().cloned() else {
            return;
        };
        let weak = self.kernel.downgrade();
        cluster.set_load(Arc::new(move || {
            weak.upgrade()
                .map(|inner| Kernel { inner }.load())
                .unwrap_or_default()
        }));
        let weak = self.kernel.downgrade();
        let (node, epoch) = (cluster.node().to_owned(), cluster.epoch());
        let read: crate::cluster::ReadFn = Arc::new(move |pids: &[Pid]| {
            let Some(inner) = weak.upgrade() else {
                return vec![None; pids.len()];
            };
            let exec = inner.runtimes().exec();
            let table = inner.table().read();
            pids.iter()
                .map(|pid| {
                    let mut listed = listing(&table, *pid, &node, epoch)?;
                    listed.token = exec.and_then(|exec| exec.token_digest(*pid));
                    Some(listed)
                })
                .collect()
        });
        let now: Vec<Pid> = self
            .kernel
            .inner
            .table()
            .read()
            .iter()
            .map(|(pid, _)| pid)
            .collect();
        cluster.start_directory(read, now);
        // Every event of this run goes to the cluster's stream, those
        // emitted before this point included.
        let weak = self.kernel.downgrade();
        cluster.publish_events(
            self.kernel.inner.events().first_seq() - 1,
            Arc::new(move |after| {
                weak.upgrade()
                    .map(|inner| inner.events().subscribe(Some(after)))
            }),
        );
        self.fail_unanswered(&cluster);
        self.halt_when_fenced(&cluster);
        let Some(requests) = cluster.requests() else {
            return;
        };
        let weak = self.kernel.downgrade();
        let shutdown = self.kernel.inner.shutdown().clone();
        let tracker = self.kernel.inner.tracker().clone();
        self.kernel.inner.tracker().spawn(async move {
            // Tasks run as long as their timeout, waits up to 30 s: each
            // have slots of their own, so they never hold up reads, kills
            // or each other.
            let quick = Arc::new(Semaphore::new(SERVED_AT_ONCE));
            let tasks = Arc::new(Semaphore::new(SERVED_AT_ONCE));
            let waits = Arc::new(Semaphore::new(SERVED_AT_ONCE));
            let mut requests = requests;
            loop {
                let message = tokio::select! {
                    () = shutdown.cancelled() => return,
                    message = requests.next() => match message {
                        Some(message) => message,
                        None => return,
                    },
                };
                // A message without a reply subject asks nothing.
                let Some(reply) = message.reply else { continue };
                // One no node signed is dropped unanswered (and logged).
                let Some((asked, request)) = cluster.open_request(&message.payload) else {
                    continue;
                };
                let request = match request {
                    Ok(request) => request,
                    Err(refusal) => {
                        cluster.answer(reply, &asked, refused(refusal)).await;
                        continue;
                    }
                };
                let slots = match request.op {
                    Op::Task { .. } => &tasks,
                    Op::Wait { .. } => &waits,
                    _ => &quick,
                };
                // Never waited for: a full node says so at once.
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    let busy = Refusal::new(
                        ErrorKind::ResourceExhausted,
                        format!(
                            "cluster: node {} is answering {SERVED_AT_ONCE} requests of this \
                             kind from other nodes; try again",
                            cluster.node()
                        ),
                    );
                    cluster.answer(reply, &asked, refused(busy)).await;
                    continue;
                };
                let Some(inner) = weak.upgrade() else { return };
                let kernel = Kernel { inner };
                let cluster = cluster.clone();
                tracker.spawn(async move {
                    let answer = kernel.node().answer(&cluster, request).await;
                    cluster.answer(reply, &asked, answer).await;
                    drop(permit);
                });
            }
        });
    }

    /// Kills the `exec` processes' OS processes the moment this node is
    /// fenced, before the stop that follows (which gives them a grace
    /// period): another node runs their processes now.
    fn halt_when_fenced(self, cluster: &Cluster) {
        let Some(exec) = self.kernel.inner.runtimes().exec().cloned() else {
            return;
        };
        let mut fenced = cluster.fenced();
        let shutdown = self.kernel.inner.shutdown().clone();
        self.kernel.inner.tracker().spawn(async move {
            tokio::select! {
                () = shutdown.cancelled() => {}
                seen = fenced.wait_for(Option::is_some) => if seen.is_ok() {
                    let killed = exec.halt();
                    tracing::warn!(killed, "fenced: exec processes killed");
                }
            }
        });
    }

    /// Reports failed, once, every `delegate_async` request sent to a
    /// node that leaves the view before answering, until shutdown.
    fn fail_unanswered(self, cluster: &Arc<Cluster>) {
        let mut departures = cluster.departures();
        let (weak, cluster) = (self.kernel.downgrade(), cluster.clone());
        let shutdown = self.kernel.inner.shutdown().clone();
        self.kernel.inner.tracker().spawn(async move {
            loop {
                let gone = tokio::select! {
                    () = shutdown.cancelled() => return,
                    gone = departures.recv() => gone,
                };
                let left = match &gone {
                    Ok((node, epoch)) => cluster.unanswered_of(Some((node, *epoch))),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        cluster.unanswered_of(None)
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                };
                let Some(inner) = weak.upgrade() else { return };
                let kernel = Kernel { inner };
                for (request_id, node, away) in left {
                    let error = format!(
                        "node_lost: node {node} left the cluster (lost, or stopped) before \
                         process {} answered",
                        away.to
                    );
                    kernel.inner.events().emit(
                        away.to,
                        crate::events::EventKind::TaskFinished {
                            request_id,
                            from: away.requester,
                            success: false,
                            duration_ms: 0,
                            error: Some(Arc::from(error.as_str())),
                        },
                    );
                    kernel.deliver_reply(
                        away.to,
                        request_id,
                        ReplyTo::Mailbox(away.requester),
                        Err(error),
                    );
                }
            }
        });
    }

    /// What this node answers another's request. An operation a node
    /// forwards was asked of it by an operator whose rights it checked;
    /// whoever can publish on the nodes' subjects is trusted as a node,
    /// but one this node does not see live (declared lost, fenced) may
    /// only read.
    async fn answer(self, cluster: &Cluster, request: rpc::Request) -> Bytes {
        let acts = !matches!(
            request.op,
            Op::Get { .. } | Op::Transcript { .. } | Op::ExecLog { .. } | Op::CronList
        );
        // Nor does this node while it cannot tell whether it is one.
        if let Err(why) = cluster.standing().await {
            return refused(Refusal::new(ErrorKind::Unavailable, why));
        }
        if acts && !cluster.is_live(&request.from_node, request.epoch) {
            return refused(Refusal::new(
                ErrorKind::FailedPrecondition,
                format!(
                    "cluster: node {} (epoch {}) is not a live node as node {} sees it; \
                     a node declared lost acts on nothing",
                    request.from_node,
                    request.epoch,
                    cluster.node()
                ),
            ));
        }
        match request.op {
            Op::Get { pids } if pids.len() > rpc::MAX_GET => refused(Refusal::new(
                ErrorKind::InvalidArgument,
                format!("a get names {} PIDs, at most {}", pids.len(), rpc::MAX_GET),
            )),
            Op::Get { pids } => {
                let got = rpc::Got::cut(&pids, self.local_infos(&pids));
                rpc::encode(&Answer::Ok(got))
            }
            // Done here or not at all: a forwarded operation is never
            // forwarded again (a parent on another node only lends).
            Op::Spawn {
                request,
                command,
                node,
                labels,
            } => {
                let request = rpc::spawned(request, command);
                let placement = super::Placement { node, labels };
                let placed = placement.is_any().then_some(&placement);
                held(self.kernel.spawn_at(Caller::Admin, request, placed).await)
            }
            Op::SpawnOwn {
                request,
                command,
                from,
            } => {
                let request = rpc::spawned(request, command);
                held(
                    self.kernel
                        .spawn_at(Caller::Process(from), request, None)
                        .await,
                )
            }
            // An answer whose requester is not here: not waited for here
            // any more.
            Op::Post {
                message: Message { to, .. },
                done: Some(request_id),
                ..
            } if self.kernel.inner.table().read().get(to).is_none() => {
                cluster.answered(request_id);
                held::<()>(Err(KernelError::NotFound(to)))
            }
            Op::Kill { pid, .. }
            | Op::Restart { pid, .. }
            | Op::Wait { pid, .. }
            | Op::Deliver {
                message: Outgoing { to: pid, .. },
                ..
            }
            | Op::Task {
                task: TaskSpec { to: pid, .. },
                ..
            }
            | Op::Delegate {
                task: TaskSpec { to: pid, .. },
                ..
            }
            | Op::Post {
                message: Message { to: pid, .. },
                ..
            } if self.kernel.inner.table().read().get(pid).is_none() => {
                held::<()>(Err(KernelError::NotFound(pid)))
            }
            Op::Kill {
                pid,
                reason,
                orphaned,
            } => held(
                self.kernel
                    .kill_here(Caller::Admin, pid, &reason, orphaned)
                    .await,
            ),
            // An operator's, checked by the asking node.
            Op::CronAdd { spec } => {
                let added = self.kernel.cron().add_checked(Caller::Admin, *spec).await;
                held(added.map(|info| self.kernel.cron().on_this_node(info)))
            }
            Op::CronList => held::<Vec<CronInfo>>(Ok(self.kernel.cron().here(Caller::Admin))),
            Op::Cron { name, change } => held(
                self.kernel
                    .cron()
                    .change_here(Caller::Admin, &name, change)
                    .await,
            ),
            Op::Lend {
                parent,
                child,
                held: slot,
                tokens,
            } => held(self.lend_kept(parent, child, slot, tokens).await),
            Op::Release { parent, child } => {
                self.release_child(parent, child);
                self.cancel_loan(child).await;
                held(Ok(()))
            }
            Op::Repay { child, spent, .. } => {
                self.repaid(child, spent).await;
                held(Ok(()))
            }
            Op::Restart {
                pid,
                reason,
                sibling: true,
                delay_ms,
            } => {
                let delay = std::time::Duration::from_millis(delay_ms);
                held(self.restart_sibling(pid, &reason, delay).await)
            }
            Op::Restart { pid, reason, .. } => held(
                self.kernel
                    .restart_checked(Caller::Admin, pid, &reason)
                    .await,
            ),
            Op::Siblings {
                parent,
                failed,
                delay_ms,
            } => {
                let delay = std::time::Duration::from_millis(delay_ms);
                held(self.siblings_failed(parent, failed, delay).await)
            }
            Op::Fail {
                pid,
                reason,
                started_ms,
            } => held(self.fail_here(pid, started_ms, reason).await),
            Op::Wait { timeout_ms, .. } if timeout_ms > rpc::MAX_WAIT_MS => refused(Refusal::new(
                ErrorKind::InvalidArgument,
                format!("a wait of {timeout_ms} ms, at most {} ms", rpc::MAX_WAIT_MS),
            )),
            Op::Wait { pid, timeout_ms } => {
                let timeout = Some(std::time::Duration::from_millis(timeout_ms));
                held(self.kernel.wait_child(Caller::Admin, pid, timeout).await)
            }
            // The asking node judged the route; copies to a parent are its
            // to send.
            Op::Deliver { message, from, via } => {
                let judged = Route { copy_to: None, via };
                let from = from.unwrap_or(Pid::KERNEL);
                held(self.kernel.send_here(from, message, Some(judged)).await)
            }
            Op::Task { task, from } => {
                let from = from.unwrap_or(Pid::KERNEL);
                held(
                    self.kernel
                        .execute_here(from, task, Some(Route::DIRECT))
                        .await,
                )
            }
            Op::Delegate {
                task,
                from,
                request_id,
            } => {
                let reply = ReplyTo::Node(Box::new(Requester {
                    node: request.from_node,
                    pid: from,
                    request_id,
                }));
                let queued = self.kernel.submit(from, task, reply, Some(Route::DIRECT));
                held(queued.map(|_| ()))
            }
            Op::Adopt {
                lost,
                epoch,
                members,
            } => held(self.adopt(lost, epoch, members).await),
            Op::Post { message, done, key } => held(self.take_post(message, done, key).await),
            // Read here only: a forwarded read is never forwarded again.
            Op::Transcript { pid, query } => held(
                self.kernel
                    .transcripts()
                    .read_here(Caller::Admin, pid, query)
                    .await,
            ),
            Op::ExecLog {
                pid,
                from,
                max_bytes,
            } => held(
                self.kernel
                    .exec()
                    .log_here(Caller::Admin, pid, from, max_bytes)
                    .await,
            ),
        }
    }

    /// The node holding `to` and the route to it, when another node holds
    /// it; `None` when this node holds it, or nobody does (the local
    /// operation then says NOT_FOUND). The route is judged on the tree
    /// across the nodes, as a local one is on the table.
    pub(super) async fn elsewhere(self, caller: Caller, to: Pid) -> Result<Option<Remote>> {
        let Some(cluster) = self.kernel.inner.cluster() else {
            return Ok(None);
        };
        let Some(Holder::There(listing)) = self.holder(to).await? else {
            return Ok(None);
        };
        let from = caller.pid();
        let node = listing.node.clone();
        let judged = {
            let table = self.kernel.inner.table().read();
            let tree = Tree::new(&table, Some(cluster.listings())).with_fresh(to, listing);
            route(&tree, from, to)
        };
        match judged {
            Ok(route) => Ok(Some(Remote { node, route })),
            Err(err) => Err(self.kernel.deny(from, to, err)),
        }
    }

    /// The node holding `pid`, when another one does and `caller` may act
    /// on it there: an operator, or one of its ancestors (judged on the
    /// tree across the nodes); `None` when this node holds it, or nobody
    /// does.
    pub(super) async fn holding(
        self,
        caller: Caller,
        pid: Pid,
        what: &str,
    ) -> Result<Option<String>> {
        let Some(cluster) = self.kernel.inner.cluster() else {
            return Ok(None);
        };
        let Some(Holder::There(listing)) = self.holder(pid).await? else {
            return Ok(None);
        };
        if let Caller::Process(me) = caller {
            let node = listing.node.clone();
            let table = self.kernel.inner.table().read();
            let tree = Tree::new(&table, Some(cluster.listings())).with_fresh(pid, listing);
            if !descends(&tree, me, pid) {
                return Err(KernelError::PermissionDenied(format!(
                    "process {me} may only {what} its descendants, and {pid} (on node {node}) \
                     is not one"
                )));
            }
            return Ok(Some(node));
        }
        Ok(Some(listing.node))
    }

    /// The node holding `pid`, when another one does and `caller` may
    /// wait for it there: an operator, or its parent; `None` when this
    /// node holds it, or nobody does.
    pub(super) async fn parent_elsewhere(self, caller: Caller, pid: Pid) -> Result<Option<String>> {
        if self.kernel.inner.cluster().is_none() {
            return Ok(None);
        }
        let Some(Holder::There(listing)) = self.holder(pid).await? else {
            return Ok(None);
        };
        if let Caller::Process(me) = caller
            && me != listing.ppid
        {
            return Err(KernelError::PermissionDenied(format!(
                "process {me} is not the parent of {pid}"
            )));
        }
        Ok(Some(listing.node))
    }

    /// Waits up to `timeout` (none: without limit) for `pid`, which `node`
    /// holds, to exit, and collects it there; asked in rounds of at most
    /// [`rpc::MAX_WAIT_MS`].
    pub(super) async fn wait_elsewhere(
        self,
        node: &str,
        pid: Pid,
        timeout: Option<std::time::Duration>,
    ) -> Result<hivekernel_agents::ExitRecord> {
        let round_max = std::time::Duration::from_millis(rpc::MAX_WAIT_MS);
        let deadline = timeout.map(|limit| tokio::time::Instant::now() + limit);
        loop {
            let left = deadline.map(|at| at.saturating_duration_since(tokio::time::Instant::now()));
            let round = left.map_or(round_max, |left| left.min(round_max));
            let timed_out = || {
                KernelError::DeadlineExceeded(format!(
                    "process {pid} still running after {} ms",
                    timeout.unwrap_or_default().as_millis()
                ))
            };
            if round.is_zero() {
                return Err(timed_out());
            }
            let op = Op::Wait {
                pid,
                timeout_ms: round.as_millis().max(1) as u64,
            };
            match self
                .forward(node, op, round.saturating_add(FORWARD_MARGIN))
                .await
            {
                Err(KernelError::Remote(refusal))
                    if refusal.kind == ErrorKind::DeadlineExceeded =>
                {
                    if left.is_some_and(|left| left <= round) {
                        return Err(timed_out());
                    }
                }
                done => return done,
            }
        }
    }

    /// Whether this node runs `pid` and it may move to another node (its
    /// mail is the cluster's).
    pub(crate) fn moves_from_here(self, pid: Pid) -> bool {
        self.kernel
            .inner
            .table()
            .read()
            .get(pid)
            .is_some_and(|entry| entry.proc.mail_in_cluster)
    }

    /// Waits, for process `proc` when it may move to another node, until
    /// this node knows it is still a member of its cluster (docs/CLUSTER.md,
    /// "Losing a node"): a node cut off from NATS past half its TTL may
    /// have been declared lost, and the process started elsewhere, so its
    /// copy here makes no model or MCP call until a heartbeat says whether
    /// it still runs here. Refused once the node is fenced or leaves.
    pub(super) async fn still_acting(self, proc: &ProcShared) -> Result<()> {
        let Some(cluster) = self.kernel.inner.cluster().filter(|_| proc.mail_in_cluster) else {
            return Ok(());
        };
        if cluster.still_member().await {
            return Ok(());
        }
        Err(KernelError::FailedPrecondition(moved_away(
            proc.ctx.pid,
            cluster.node(),
        )))
    }

    /// The node holding `pid` when another node does, as the mirror shows
    /// it (for messages the kernel makes, which never wait on NATS).
    pub(super) fn held_elsewhere(self, pid: Pid) -> Option<String> {
        let cluster = self.kernel.inner.cluster()?;
        if pid == Pid::KERNEL || self.kernel.inner.table().read().get(pid).is_some() {
            return None;
        }
        cluster
            .listings()
            .get(pid)
            .map(|listing| listing.node.clone())
    }

    /// A message from `from` to a process on another node: the node
    /// holding it takes it in as a local send (committed to its store)
    /// and answers its id; a copy for siblings' parent goes from here.
    pub(super) async fn send_elsewhere(
        self,
        from: Pid,
        remote: Remote,
        message: Outgoing,
    ) -> Result<MessageId> {
        self.kernel.check_running()?;
        let copy = remote
            .route
            .copy_to
            .map(|parent| (parent, message.payload.clone(), message.approvals.clone()));
        let op = Op::Deliver {
            message,
            from: Some(from),
            via: remote.route.via,
        };
        let id = self.forward(&remote.node, op, FORWARDED_SEND).await?;
        if let Some((parent, payload, approvals)) = copy {
            let carried = (crate::trace::current(), approvals);
            self.kernel
                .copy_to_parent(parent, from, payload, None, carried);
        }
        Ok(id)
    }

    /// A `delegate_async` from `requester` to a process on another node.
    /// The request is recorded here before it is sent (a restart tells the
    /// requester it failed); the answer comes back as a `post` naming it.
    pub(super) async fn delegate_elsewhere(
        self,
        requester: Pid,
        remote: Remote,
        task: TaskSpec,
    ) -> Result<RequestId> {
        self.kernel.check_running()?;
        self.kernel.inner.settings().limits.check_task(&task)?;
        if let Some(timeout) = task.timeout {
            check_duration("timeout", timeout)?;
        }
        let request_id = RequestId(self.kernel.next_id());
        let store = self.kernel.inner.store();
        let durable = store.is_durable();
        if durable {
            store
                .commit(Write::Request {
                    id: request_id,
                    from: requester,
                    to: task.to,
                    created_ms: unix_ms(std::time::SystemTime::now()),
                })
                .await?;
        }
        let copy = remote
            .route
            .copy_to
            .map(|parent| (parent, task.description.clone(), task.approvals.clone()));
        // Waited for before it goes: the answer may come before the
        // forward's own.
        if let Some(cluster) = self.kernel.inner.cluster() {
            cluster.expect_answer(request_id, &remote.node, requester, task.to);
        }
        let op = Op::Delegate {
            task,
            from: requester,
            request_id,
        };
        if let Err(err) = self.forward::<()>(&remote.node, op, FORWARDED_SEND).await {
            if let Some(cluster) = self.kernel.inner.cluster() {
                cluster.answered(request_id);
            }
            if durable {
                store.submit(Write::RequestDone(request_id));
            }
            return Err(err);
        }
        if let Some((parent, description, approvals)) = copy {
            let carried = (crate::trace::current(), approvals);
            self.kernel
                .copy_to_parent(parent, requester, description, Some(request_id), carried);
        }
        Ok(request_id)
    }

    /// A message another node made for a process of this one (`done`:
    /// the request it answers): given an id of this node's and put in its
    /// receiver's lane, without routing checks. Answered once it is where
    /// the receiver reads it (kept in `HK_MAIL` first when its mail is the
    /// cluster's).
    async fn take_post(
        self,
        mut message: Message,
        done: Option<RequestId>,
        key: Option<String>,
    ) -> Result<()> {
        // A message id for the stream: a header, so checked first.
        if let Some(key) = &key
            && !post_key_ok(key)
        {
            return Err(KernelError::InvalidArgument(format!(
                "a post's key must be 1 to {MAX_POST_KEY} ASCII letters, digits, '.', '-' or \
                 '_'; got {} bytes",
                key.len()
            )));
        }
        // An answer gets its id with the request's removal.
        if done.is_none() {
            message.id = MessageId(self.kernel.next_id());
        }
        self.took_from_elsewhere(&message);
        let (kept, taken) = tokio::sync::oneshot::channel();
        self.hand_on(Posting {
            kept: Some(kept),
            key,
            ..Posting::new(message, done)
        });
        // Answered before the sender stops waiting; a message still in the
        // lane then is not handed on (the sender reports it dropped).
        match tokio::time::timeout(POST_WAIT, taken).await {
            Ok(taken) => taken.unwrap_or(Err(KernelError::ShuttingDown)),
            Err(_) => Err(KernelError::DeadlineExceeded(format!(
                "the message was not kept within {} s (NATS slow or unreachable)",
                POST_WAIT.as_secs()
            ))),
        }
    }

    /// Asks `node` to do `op` for a caller of this node, waiting up to
    /// `wait` for its answer.
    pub(super) async fn forward<T: serde::de::DeserializeOwned>(
        self,
        node: &str,
        op: Op,
        wait: std::time::Duration,
    ) -> Result<T> {
        let Some(cluster) = self.kernel.inner.cluster() else {
            return Err(KernelError::FailedPrecondition(
                "this kernel is not a node of a cluster".into(),
            ));
        };
        cluster
            .call_within(node, op, wait)
            .await
            .map_err(KernelError::Remote)
    }

    /// A task from `from` forwarded to the node holding its target: its
    /// timeout set from the target's own when the task names none (the
    /// requesting node waits that long, and a little more for the answer
    /// to travel).
    pub(super) async fn forward_task(
        self,
        from: Pid,
        remote: Remote,
        mut task: TaskSpec,
    ) -> Result<rpc::Executed> {
        let timeout = match task.timeout {
            Some(timeout) => timeout,
            None => {
                let info = self.remote_info(task.to).await?;
                // As the holding node reads it (router.rs).
                std::time::Duration::from_secs(info.limits.timeout_seconds.max(1))
            }
        };
        task.timeout = Some(timeout);
        let wait = timeout.saturating_add(FORWARD_MARGIN);
        let copy = remote
            .route
            .copy_to
            .map(|parent| (parent, task.description.clone(), task.approvals.clone()));
        let op = Op::Task {
            task,
            from: Some(from),
        };
        let executed: rpc::Executed = self.forward(&remote.node, op, wait).await?;
        if let Some((parent, description, approvals)) = copy {
            let carried = (crate::trace::current(), approvals);
            self.kernel
                .copy_to_parent(parent, from, description, Some(executed.0), carried);
        }
        Ok(executed)
    }
}

/// The longest key a post may carry: a node name (64), an epoch and an id.
const MAX_POST_KEY: usize = 128;

/// Whether `key` may be a post's message id in `HK_MAIL`.
fn post_key_ok(key: &str) -> bool {
    (1..=MAX_POST_KEY).contains(&key.len())
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
}

/// An answer of what a local operation returned.
fn held<T: serde::Serialize>(result: Result<T>) -> Bytes {
    match result {
        Ok(value) => rpc::encode(&Answer::Ok(value)),
        Err(err) => refused(err.into()),
    }
}

/// Snapshots of those of `pids` that `node` holds, asked again for the
/// rest while its answers are cut short by their size; only the PIDs
/// asked are taken from its answers.
/// Snapshots of processes, and the nodes that held some of those asked
/// for and did not answer.
#[derive(Debug, Default)]
pub struct Snapshots {
    /// In the order asked, those gone (or unread) left out.
    pub infos: Vec<ProcessInfo>,
    /// By node name.
    pub unanswered: Vec<Unanswered>,
}

/// A node that did not answer for its processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unanswered {
    pub node: String,
    /// Why, as this node saw it.
    pub error: String,
    /// How many of the processes asked for it held.
    pub processes: usize,
}

/// How long a read of another node's processes waits for its answer: a
/// node that answers at all does within milliseconds, and a listing
/// should not wait a paused node's TTL out.
pub(super) const READ_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

async fn read_from(cluster: &Cluster, node: &str, pids: Vec<Pid>) -> Result<Vec<ProcessInfo>> {
    let asked: HashSet<Pid> = pids.iter().copied().collect();
    let mut infos = Vec::new();
    let mut pids = pids;
    while !pids.is_empty() {
        let before = pids.len();
        let got: rpc::Got = cluster
            .call_within(node, Op::Get { pids }, READ_WAIT)
            .await
            .map_err(KernelError::Remote)?;
        let answered = got.processes.len();
        infos.extend(
            got.processes
                .into_iter()
                .filter(|info| asked.contains(&info.pid)),
        );
        // An answer cut short holds at least one snapshot and leaves fewer
        // to ask; one that does not ends the reading (a peer must not
        // keep this node asking).
        pids = got.rest;
        pids.retain(|pid| asked.contains(pid));
        if answered == 0 || pids.len() >= before {
            break;
        }
    }
    Ok(infos)
}

/// `pid`'s listing for the directory, from this node's table.
fn listing(table: &ProcessTable, pid: Pid, node: &str, epoch: u64) -> Option<Listing> {
    if pid == Pid::KERNEL {
        return None;
    }
    let entry = table.get(pid)?;
    let ctx = &entry.proc.ctx;
    Some(Listing {
        node: node.to_owned(),
        epoch,
        ppid: entry.ppid,
        name: ctx.name.to_string(),
        role: ctx.role,
        tier: ctx.tier,
        depth: entry.depth,
        exited: !entry.is_alive(),
        started_unix_ms: entry.proc.started_at_unix_ms,
        token: None,
        moves: entry.proc.mail_in_cluster,
    })
}

/// Why process `pid` on `node` may not act: it runs on another node now.
pub(crate) fn moved_away(pid: Pid, node: &str) -> String {
    format!(
        "process {pid} runs on another node now: node {node} left the cluster, or was declared lost"
    )
}

#[cfg(test)]
mod tests {
    use super::{MAX_POST_KEY, post_key_ok};

    #[test]
    fn a_posts_key_is_a_plain_token() {
        assert!(post_key_ok("node-a_1.42.p1024"));
        let long = "x".repeat(MAX_POST_KEY + 1);
        for bad in ["", "a\r\nNats-Msg-Id: b", "a b", "ä", "a*", long.as_str()] {
            assert!(!post_key_ok(bad), "{bad:?}");
        }
    }
}
