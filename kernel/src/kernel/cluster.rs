//! The kernel as a node of a cluster: what it tells the cluster about
//! itself (its load, its processes' listings in the directory), what it
//! answers other nodes, and the reads that reach the processes other nodes
//! hold (docs/CLUSTER.md).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use hivekernel_agents::{ErrorKind, Pid, ProcessInfo, ProcessState};
use tokio::sync::Semaphore;

use crate::cluster::rpc::{self, Answer, Op, Refusal};
use crate::cluster::{Cluster, Listing, Load, NodeInfo};
use crate::error::{KernelError, Result};
use crate::kernel::Kernel;
use crate::process::ProcessTable;

/// Requests from other nodes answered at once; more wait their turn.
const SERVED_AT_ONCE: usize = 256;
/// `get` requests to one node in flight at once, for one read.
const GETS_AT_ONCE: usize = 8;

/// Where a process lives, as this node finds it.
#[derive(Debug)]
pub(crate) enum Holder {
    /// In this kernel's table.
    Here,
    /// On another live node, as the directory lists it.
    There(Listing),
}

impl Kernel {
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

    /// Where `pid` lives: here, on another live node, or nowhere.
    pub(crate) async fn holder(&self, pid: Pid) -> Result<Option<Holder>> {
        if self.inner.table().read().get(pid).is_some() {
            return Ok(Some(Holder::Here));
        }
        let Some(cluster) = self.inner.cluster() else {
            return Ok(None);
        };
        let listing = cluster
            .locate(pid)
            .await
            .map_err(|err| KernelError::ClusterUnavailable(err.to_string()))?;
        Ok(listing.map(Holder::There))
    }

    /// A snapshot of `pid`, which another node holds.
    pub(super) async fn remote_info(&self, pid: Pid) -> Result<ProcessInfo> {
        let (Some(cluster), Some(Holder::There(listing))) =
            (self.inner.cluster(), self.holder(pid).await?)
        else {
            return Err(KernelError::NotFound(pid));
        };
        let got: rpc::Got = cluster
            .call(&listing.node, Op::Get { pids: vec![pid] })
            .await
            .map_err(KernelError::Remote)?;
        got.into_iter()
            .find(|info| info.pid == pid)
            .ok_or(KernelError::NotFound(pid))
    }

    /// Snapshots of `pids` in their order, skipping those gone: this
    /// node's from its table, the others' from the nodes holding them
    /// (each asked once per [`rpc::MAX_GET`] PIDs, the nodes at once).
    pub(super) async fn cluster_infos(&self, cluster: &Cluster, pids: &[Pid]) -> Vec<ProcessInfo> {
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
            return infos.into_iter().flatten().collect();
        }
        let nodes = wanted.len();
        let asks: Vec<(String, Vec<Pid>)> = wanted
            .into_iter()
            .flat_map(|(node, pids)| {
                pids.chunks(rpc::MAX_GET)
                    .map(|chunk| (node.clone(), chunk.to_vec()))
                    .collect::<Vec<_>>()
            })
            .collect();
        let answers: Vec<rpc::Got> = futures::stream::iter(asks)
            .map(|(node, pids)| async move {
                match cluster.call::<rpc::Got>(&node, Op::Get { pids }).await {
                    Ok(got) => got,
                    Err(refusal) => {
                        tracing::warn!(%node, error = %refusal, "cluster: processes of a node not read");
                        Vec::new()
                    }
                }
            })
            .buffer_unordered(GETS_AT_ONCE * nodes)
            .collect()
            .await;
        let mut got: HashMap<Pid, ProcessInfo> = answers
            .into_iter()
            .flatten()
            .map(|info| (info.pid, info))
            .collect();
        for (pid, info) in pids.iter().zip(infos.iter_mut()) {
            if info.is_none() {
                *info = got.remove(pid);
            }
        }
        infos.into_iter().flatten().collect()
    }

    /// Snapshots of those of `pids` this node holds, `None` for the others.
    pub(super) fn local_infos(&self, pids: &[Pid]) -> Vec<Option<ProcessInfo>> {
        let infos: Vec<Option<ProcessInfo>> = {
            let table = self.inner.table().read();
            pids.iter()
                .map(|pid| table.get(*pid).map(|e| e.info(*pid)))
                .collect()
        };
        infos
            .into_iter()
            .map(|info| info.map(|info| self.shown(info)))
            .collect()
    }

    /// A snapshot as callers get it: with its log path, and its node when
    /// this kernel is one.
    pub(super) fn shown(&self, info: ProcessInfo) -> ProcessInfo {
        let mut info = self.with_log_path(info);
        if let Some(cluster) = self.inner.cluster() {
            info.node = Some(cluster.node().to_owned());
        }
        info
    }
}

impl Kernel {
    /// Joins the kernel to its cluster, if any: hands it the kernel's load
    /// for its heartbeats and its processes' listings for the directory
    /// (through weak handles: the cluster does not keep the kernel alive),
    /// and answers the other nodes' requests until shutdown.
    pub(super) fn serve_cluster(&self) {
        let Some(cluster) = self.inner.cluster().cloned() else {
            return;
        };
        let weak = self.downgrade();
        cluster.set_load(Arc::new(move || {
            weak.upgrade()
                .map(|inner| Kernel { inner }.load())
                .unwrap_or_default()
        }));
        let weak = self.downgrade();
        let (node, epoch) = (cluster.node().to_owned(), cluster.epoch());
        let read: crate::cluster::ReadFn = Arc::new(move |pids: &[Pid]| {
            let Some(inner) = weak.upgrade() else {
                return vec![None; pids.len()];
            };
            let table = inner.table().read();
            pids.iter()
                .map(|pid| listing(&table, *pid, &node, epoch))
                .collect()
        });
        let now: Vec<Pid> = self
            .inner
            .table()
            .read()
            .iter()
            .map(|(pid, _)| pid)
            .collect();
        cluster.start_directory(read, now);
        let Some(requests) = cluster.requests() else {
            return;
        };
        let weak = self.downgrade();
        let shutdown = self.inner.shutdown().clone();
        let tracker = self.inner.tracker().clone();
        self.inner.tracker().spawn(async move {
            let permits = Arc::new(Semaphore::new(SERVED_AT_ONCE));
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
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    return;
                };
                let Some(inner) = weak.upgrade() else { return };
                let kernel = Kernel { inner };
                let cluster = cluster.clone();
                tracker.spawn(async move {
                    let answer = kernel.answer(&message.payload).await;
                    cluster.answer(reply, answer).await;
                    drop(permit);
                });
            }
        });
    }

    /// What this node answers another's request.
    async fn answer(&self, payload: &[u8]) -> Bytes {
        let request = match rpc::decode_request(payload) {
            Ok(request) => request,
            Err(refusal) => return rpc::encode(&Answer::<()>::Error(refusal)),
        };
        match request.op {
            Op::Get { pids } if pids.len() > rpc::MAX_GET => {
                rpc::encode(&Answer::<()>::Error(Refusal {
                    kind: ErrorKind::InvalidArgument,
                    message: format!("a get names {} PIDs, at most {}", pids.len(), rpc::MAX_GET),
                }))
            }
            Op::Get { pids } => {
                let got: rpc::Got = self.local_infos(&pids).into_iter().flatten().collect();
                rpc::encode(&Answer::Ok(got))
            }
        }
    }
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
    })
}
