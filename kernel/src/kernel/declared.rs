//! Config agents: spawned at start under PID 1, each as the PID it ran as
//! before. On a node of a cluster each is a cluster-wide singleton: the
//! node that claims it in `hk_declared` runs it, the others leave it; when
//! its node goes (lost, stopped, or started again as a new epoch) another
//! node takes the claim over and starts it again as the same PID, after
//! its restart backoff (an agent whose restart policy is `temporary` is
//! not started again). Its cron entries run where it runs, and move with
//! it (kernel/cron/schedule/lease.rs).

use std::time::Duration;

use hivekernel_agents::{Pid, RestartPolicy};

use crate::cluster::{Claimed, ClusterError, Standing};
use crate::error::{KernelError, Result};
use crate::kernel::spawn::Birth;
use crate::kernel::{Caller, Declared, Kernel};
use crate::store::{Recovered, Write};

/// Where a config agent runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placed {
    /// This node spawned it, as this PID.
    Here(Pid),
    /// A live node of the cluster runs it (this node, when it took the
    /// agent over from another since it started): the node, and the PID
    /// once that node has recorded it.
    Held { node: String, pid: Option<Pid> },
    /// Its placement (`node`, `where`) rules this node out, and no node
    /// runs it: a node it may run on starts it when it starts, or takes
    /// it over. What it wants, as an error says it.
    Unplaced { wants: String },
}

fn unavailable(err: ClusterError) -> KernelError {
    KernelError::ClusterUnavailable(err.to_string())
}

impl Kernel {
    /// Spawns a config-declared agent under PID 1, as the PID it last ran
    /// as when that is known, and records its PID for the next restart.
    /// On a node of a cluster only when no live node runs it already.
    pub(crate) async fn spawn_declared(
        &self,
        agent: &Declared,
        recovered: Option<&Recovered>,
    ) -> Result<Placed> {
        let request = agent.request.clone();
        let name = request.name.clone();
        if agent.placement.is_any() && self.inner.cluster().is_none() {
            return Err(KernelError::FailedPrecondition(format!(
                "config agent {name:?} is placed ({}): that chooses a node of a cluster, and \
                 this kernel runs alone (no kernel.cluster, no --cluster)",
                agent.placement.shown()
            )));
        }
        let mut previous = recovered.and_then(|r| r.declared.get(&name).copied());
        let mut claimed = None;
        if let Some(cluster) = self.inner.cluster() {
            let (standing, revision) = cluster.declared(&name).await.map_err(unavailable)?;
            match standing {
                Standing::Live(holding) => {
                    return Ok(Placed::Held {
                        pid: holding.pid(),
                        node: holding.node,
                    });
                }
                // The PID it ran as wherever it ran: the cluster's word.
                Standing::Unclaimed(pid) => previous = pid.or(previous),
                Standing::Orphaned(holding) => previous = holding.pid(),
            }
            if !self.may_run(agent) {
                return Ok(Placed::Unplaced {
                    wants: agent.placement.shown(),
                });
            }
            match cluster
                .claim_declared(&name, revision, previous)
                .await
                .map_err(unavailable)?
            {
                Some(won) => claimed = Some(won),
                // Another node claimed it first.
                None => return self.held(&name).await,
            }
        }
        let previous = previous
            .filter(|pid| *pid > Pid::KERNEL && self.inner.table().read().get(*pid).is_none());
        let letters = self.node().letters_for(previous).await;
        let pid = self
            .spawn_as(Caller::Admin, request, Birth::Declared(previous))
            .await?;
        if !self.declared_here(&name, pid, claimed).await? {
            return self.held(&name).await;
        }
        self.node().deliver_letters(letters);
        Ok(Placed::Here(pid))
    }

    /// Whether config agent `agent` may run on this node: its placement
    /// admits this node's name and labels.
    fn may_run(&self, agent: &Declared) -> bool {
        self.inner.cluster().is_none_or(|cluster| {
            agent
                .placement
                .admits_node(cluster.node(), cluster.labels())
        })
    }

    /// Where config agent `name` runs, as the cluster says now.
    async fn held(&self, name: &str) -> Result<Placed> {
        let Some(cluster) = self.inner.cluster() else {
            return Err(KernelError::ClusterUnavailable(
                "this kernel is not a node of a cluster".into(),
            ));
        };
        match cluster.declared(name).await.map_err(unavailable)?.0 {
            Standing::Live(holding) | Standing::Orphaned(holding) => Ok(Placed::Held {
                pid: holding.pid(),
                node: holding.node,
            }),
            Standing::Unclaimed(_) => Err(KernelError::ClusterUnavailable(format!(
                "config agent {name:?} was released while being claimed; it starts at the next check"
            ))),
        }
    }

    /// Records that config agent `name` runs here as `pid`: in the store,
    /// for the next start, and in the cluster, for every node. False when
    /// another node took the agent meanwhile: this node's copy stood down.
    async fn declared_here(&self, name: &str, pid: Pid, claimed: Option<Claimed>) -> Result<bool> {
        self.inner
            .store()
            .commit(Write::Declared {
                name: name.to_owned(),
                pid,
            })
            .await?;
        let (Some(cluster), Some(claimed)) = (self.inner.cluster(), claimed) else {
            return Ok(true);
        };
        match cluster.declared_as(name, claimed, pid).await {
            Ok(true) => {}
            // Another node took the key meanwhile: it runs the agent.
            Ok(false) => {
                self.stand_down(name, pid).await;
                return Ok(false);
            }
            // The claim stands; a node taking it over later starts the
            // agent with a PID of its own.
            Err(err) => {
                tracing::warn!(%pid, agent = name, error = %err, "cluster: config agent's PID not recorded");
            }
        }
        Ok(true)
    }

    /// Stops this node's copy `pid` of config agent `name`, which another
    /// node runs.
    async fn stand_down(&self, name: &str, pid: Pid) {
        tracing::warn!(%pid, agent = name, "config agent runs on another node; this node's copy stops");
        self.cron().forget(pid);
        // Its queued messages are the other copy's: left in the stream.
        if let Some(cluster) = self.inner.cluster() {
            cluster.leave_mail_of(pid);
        }
        if let Err(err) = self
            .stop_declared(pid, "cluster: the config agent runs on another node")
            .await
        {
            tracing::error!(%pid, agent = name, error = %err, "config agent's copy not stopped");
        }
    }

    /// The PID this node runs config agent `name` as, if it does.
    fn running_declared(&self, name: &str) -> Option<Pid> {
        let table = self.inner.table().read();
        let kernel = table.get(Pid::KERNEL)?;
        kernel.children.iter().find(|pid| {
            table
                .get(*pid)
                .is_some_and(|entry| entry.is_alive() && &*entry.proc.ctx.name == name)
        })
    }

    /// On a node of a cluster: takes over the config agents `agents` whose
    /// node has gone, with their cron entries, whenever a node leaves the
    /// view and at least once a TTL, until the kernel begins to stop.
    pub(super) fn keep_declared(&self, agents: Vec<Declared>) {
        let Some(cluster) = self.inner.cluster().cloned() else {
            return;
        };
        if agents.is_empty() {
            return;
        }
        let kernel = self.clone();
        let stopping = self.inner.stop_begun().clone();
        let every = cluster.node_ttl();
        self.inner.tracker().spawn(async move {
            loop {
                tokio::select! {
                    () = stopping.cancelled() => return,
                    () = cluster.departure(every) => {}
                }
                for agent in &agents {
                    if stopping.is_cancelled() {
                        return;
                    }
                    kernel.take_over(agent).await;
                }
            }
        });
    }

    /// Starts config agent `agent` here, with its cron entries, if no live
    /// node runs it and this node wins its claim: at once when it was
    /// released (its node stopped cleanly), after its restart backoff when
    /// its node went without a word; never again when its restart policy
    /// is `temporary`.
    async fn take_over(&self, agent: &Declared) {
        let Some(cluster) = self.inner.cluster() else {
            return;
        };
        let request = &agent.request;
        let name = request.name.as_str();
        let (standing, revision) = match cluster.declared(name).await {
            Ok(read) => read,
            Err(err) => {
                tracing::debug!(agent = name, error = %err, "cluster: config agent's holder not read");
                return;
            }
        };
        let (from, pid, delay) = match standing {
            // Two nodes may both have started it (see `cluster::settled`):
            // the one the key does not name stops its copy.
            Standing::Live(holding) => {
                if holding.node != cluster.node()
                    && let Some(mine) = self.running_declared(name)
                {
                    self.stand_down(name, mine).await;
                }
                return;
            }
            _ if !self.may_run(agent) => return,
            Standing::Unclaimed(pid) => (None, pid, Duration::ZERO),
            Standing::Orphaned(holding) => {
                let Ok((restart, _)) = self.supervision_for(request) else {
                    return;
                };
                if restart.policy == RestartPolicy::Temporary {
                    return;
                }
                let delay = Duration::from_millis(restart.backoff_ms[0]);
                (Some(holding.node.clone()), holding.pid(), delay)
            }
        };
        let claimed = match cluster.claim_declared(name, revision, pid).await {
            Ok(Some(claimed)) => claimed,
            Ok(None) => return,
            Err(err) => {
                tracing::debug!(agent = name, error = %err, "cluster: config agent not claimed");
                return;
            }
        };
        // A spawn once the kernel stops is refused: the claim goes at leave.
        tokio::select! {
            () = self.inner.stop_begun().cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
        let pid = pid.filter(|pid| self.inner.table().read().get(*pid).is_none());
        // Read before it runs: a message sent once it runs is its mailbox's.
        let letters = self.node().letters_for(pid).await;
        let spawned = self
            .spawn_as(Caller::Admin, request.clone(), Birth::Declared(pid))
            .await;
        match spawned {
            Ok(pid) => {
                // Said as soon as it runs (its listing may be read before
                // its key is confirmed).
                match from {
                    Some(node) => {
                        tracing::warn!(%pid, agent = name, from = %node, "config agent taken over from a node that is gone")
                    }
                    None => {
                        tracing::info!(%pid, agent = name, "config agent started (released by its node)")
                    }
                }
                match self.declared_here(name, pid, Some(claimed)).await {
                    Ok(true) => {}
                    // Another node took it meanwhile, and this copy stood down.
                    Ok(false) => return,
                    Err(err) => {
                        tracing::error!(%pid, agent = name, error = %err, "store: config agent's PID not recorded");
                    }
                }
                self.node().deliver_letters(letters);
                self.cron().adopt(pid, &agent.cron).await;
                // And the API entries aimed at it, from its last node.
                self.cron().take(&[pid]).await;
            }
            // Claimed but not running: it stays this node's until this node
            // goes, as an agent that exited for good under its supervisor does.
            Err(err) => {
                tracing::error!(agent = name, error = %err, "config agent could not be started here");
            }
        }
    }
}
