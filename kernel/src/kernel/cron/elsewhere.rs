//! Cron across the nodes of a cluster (docs/CLUSTER.md, "Events and
//! cron"): an entry lives on the node that runs its target, and an
//! operator reaches it from any node. `cron add` aimed at a process on
//! another node is added there; `cron ls` lists every node's entries, each
//! with its node, and names the nodes that did not answer; `cron rm`,
//! `enable`, `disable` and `run` of a name this node does not hold act on
//! the node that does.

use futures::StreamExt as _;
use hivekernel_agents::Pid;

use super::CronHandle;
use super::{CronInfo, CronSpec};
use crate::cluster::rpc::{CronChange, Op};
use crate::error::{KernelError, Result};
use crate::kernel::Caller;
use crate::kernel::cluster::{FORWARDED_CRON, Holder, READ_WAIT, Unanswered};

/// Nodes asked at once for their entries.
const LISTS_AT_ONCE: usize = 16;

impl CronHandle<'_> {
    /// The node holding `target` when it is another node's and `caller`
    /// may act there (an operator); a process aiming an entry at a process
    /// on another node is refused, naming where it runs.
    pub(super) async fn target_elsewhere(
        self,
        caller: Caller,
        target: Pid,
    ) -> Result<Option<String>> {
        if self.kernel.inner.cluster().is_none()
            || self.kernel.inner.table().read().get(target).is_some()
        {
            return Ok(None);
        }
        let Some(Holder::There(listing)) = self.kernel.node().holder(target).await? else {
            return Ok(None);
        };
        if !caller.sees_all() {
            return Err(KernelError::FailedPrecondition(format!(
                "process {target} runs on node {}: a process's cron entries aim at \
                 processes on its own node (an operator may add this one)",
                listing.node
            )));
        }
        Ok(Some(listing.node))
    }

    /// Adds `spec` on `node`, which holds its target.
    pub(super) async fn forward_add(self, node: &str, spec: CronSpec) -> Result<CronInfo> {
        let op = Op::CronAdd {
            spec: Box::new(spec),
        };
        self.kernel.node().forward(node, op, FORWARDED_CRON).await
    }

    /// Applies `change` to entry `name` as `caller`: here, or, when this
    /// node holds no entry of that name and the caller is an operator, on
    /// the node that does. The entry after it (none after a removal).
    pub(super) async fn change(
        self,
        caller: Caller,
        name: &str,
        change: CronChange,
    ) -> Result<Option<CronInfo>> {
        match self.change_here(caller, name, change).await {
            Err(KernelError::NoSuchCron(_))
                if let Some(node) = self.elsewhere(caller, name).await? =>
            {
                self.forward_change(&node, name, change).await
            }
            done => done,
        }
    }

    /// Applies `change` to this node's entry `name` as `caller`, who holds
    /// the capability: the entry after it, naming this node.
    pub(in crate::kernel) async fn change_here(
        self,
        caller: Caller,
        name: &str,
        change: CronChange,
    ) -> Result<Option<CronInfo>> {
        let changed = match change {
            CronChange::Remove => self.remove_checked(caller, name).await.map(|()| None),
            CronChange::Enable(enabled) => self
                .set_enabled_checked(caller, name, enabled)
                .await
                .map(Some),
            CronChange::Run => self.run_checked(caller, name).await.map(Some),
        };
        changed.map(|info| info.map(|info| self.on_this_node(info)))
    }

    /// Applies `change` to entry `name` on `node`, which holds it: the
    /// entry after it (none after a removal).
    pub(super) async fn forward_change(
        self,
        node: &str,
        name: &str,
        change: CronChange,
    ) -> Result<Option<CronInfo>> {
        let op = Op::Cron {
            name: name.to_owned(),
            change,
        };
        self.kernel.node().forward(node, op, FORWARDED_CRON).await
    }

    /// The other node holding entry `name`, for an operator, when this one
    /// does not; refused when several do (names are each node's own).
    pub(super) async fn elsewhere(self, caller: Caller, name: &str) -> Result<Option<String>> {
        if !caller.sees_all() || self.kernel.inner.cluster().is_none() {
            return Ok(None);
        }
        let (entries, unanswered) = self.of_others().await;
        let mut holders: Vec<String> = entries
            .into_iter()
            .filter(|info| info.spec.name == name)
            .filter_map(|info| info.node)
            .collect();
        holders.dedup();
        match holders.len() {
            0 if !unanswered.is_empty() => {
                let silent: Vec<&str> = unanswered.iter().map(|gap| gap.node.as_str()).collect();
                Err(KernelError::ClusterUnavailable(format!(
                    "no cron entry named {name:?} here or on the nodes that answered; \
                     node {} did not answer",
                    silent.join(", ")
                )))
            }
            0 => Ok(None),
            1 => Ok(holders.pop()),
            _ => Err(KernelError::FailedPrecondition(format!(
                "cron entry {name:?} is on nodes {}: ask the node whose entry it is \
                 (--addr)",
                holders.join(", ")
            ))),
        }
    }

    /// Every entry `caller` may see: this node's, and for an operator
    /// every other node's too, each with its node, by name; and the nodes
    /// that did not answer.
    pub async fn entries(self, caller: Caller) -> (Vec<CronInfo>, Vec<Unanswered>) {
        let mut entries = self.here(caller);
        if !caller.sees_all() || self.kernel.inner.cluster().is_none() {
            return (entries, Vec::new());
        }
        let (others, unanswered) = self.of_others().await;
        entries.extend(others);
        entries.sort_by(|a, b| (&a.spec.name, &a.node).cmp(&(&b.spec.name, &b.node)));
        (entries, unanswered)
    }

    /// `info` of an entry of this node, naming it.
    pub(crate) fn on_this_node(self, mut info: CronInfo) -> CronInfo {
        info.node = self
            .kernel
            .inner
            .cluster()
            .map(|cluster| cluster.node().to_owned());
        info
    }

    /// This node's entries `caller` may see, each with this node's name
    /// on a node of a cluster.
    pub(crate) fn here(self, caller: Caller) -> Vec<CronInfo> {
        self.list(caller)
            .into_iter()
            .map(|info| self.on_this_node(info))
            .collect()
    }

    /// The entries of every other live node, and those that did not answer.
    async fn of_others(self) -> (Vec<CronInfo>, Vec<Unanswered>) {
        let Some(cluster) = self.kernel.inner.cluster() else {
            return (Vec::new(), Vec::new());
        };
        let others: Vec<String> = cluster
            .nodes()
            .into_iter()
            .filter(|node| !node.this)
            .map(|node| node.record.node)
            .collect();
        let answers: Vec<(String, std::result::Result<Vec<CronInfo>, String>)> =
            futures::stream::iter(others)
                .map(|node| async move {
                    let listed = cluster
                        .call_within::<Vec<CronInfo>>(&node, Op::CronList, READ_WAIT)
                        .await
                        .map_err(|refusal| refusal.message);
                    (node, listed)
                })
                .buffer_unordered(LISTS_AT_ONCE)
                .collect()
                .await;
        let mut entries = Vec::new();
        let mut unanswered = Vec::new();
        for (node, listed) in answers {
            match listed {
                Ok(listed) => entries.extend(listed.into_iter().map(|mut info| {
                    // Named by the node that answered, whatever it wrote.
                    info.node = Some(node.clone());
                    info
                })),
                Err(error) => unanswered.push(Unanswered {
                    node,
                    error,
                    processes: 0,
                }),
            }
        }
        unanswered.sort_by(|a, b| a.node.cmp(&b.node));
        (entries, unanswered)
    }
}
