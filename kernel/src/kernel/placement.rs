//! Where a spawn runs on a node of a cluster (docs/CLUSTER.md,
//! "Placement"): the node it names, a node with the labels it asks for,
//! or its parent's node. The node an operator asked forwards the spawn to
//! that node (`spawn`), which runs every spawn rule there (against what a
//! parent on another node lends it, kernel/across.rs) and answers the
//! PID once every node can find it.

use std::collections::BTreeMap;

use hivekernel_agents::{Pid, SpawnRequest};

use super::cluster::{FORWARDED_SPAWN, Holder};
use crate::cluster::NodeInfo;
use crate::cluster::rpc::Op;
use crate::error::{KernelError, Result};
use crate::kernel::{Caller, Kernel};

/// Where a spawn asks to run: a node by name, labels its node must have,
/// or both. The default places nothing: the parent's node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// The node's name.
    pub node: Option<String>,
    /// Labels the node must have, each with this value.
    pub labels: BTreeMap<String, String>,
}

impl Placement {
    /// Whether it places anything.
    pub fn is_any(&self) -> bool {
        self.node.is_some() || !self.labels.is_empty()
    }

    /// Whether node `info` is one it allows.
    pub(crate) fn admits(&self, info: &NodeInfo) -> bool {
        self.admits_node(&info.record.node, &info.record.labels)
    }

    /// Whether node `node`, with `labels`, is one it allows.
    pub(crate) fn admits_node(&self, node: &str, labels: &BTreeMap<String, String>) -> bool {
        self.node.as_deref().is_none_or(|name| name == node)
            && self
                .labels
                .iter()
                .all(|(key, value)| labels.get(key) == Some(value))
    }

    /// How it reads in an error.
    pub(crate) fn shown(&self) -> String {
        let mut parts: Vec<String> = self.node.iter().map(|n| format!("node {n:?}")).collect();
        if !self.labels.is_empty() {
            parts.push(format!("labels {}", labels(&self.labels)));
        }
        parts.join(" with ")
    }
}

/// Labels as `a=1,b=2`.
fn labels(labels: &BTreeMap<String, String>) -> String {
    let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.join(",")
}

/// The live nodes and their labels, as an error lists them.
fn listed(nodes: &[NodeInfo]) -> String {
    let shown: Vec<String> = nodes
        .iter()
        .map(|info| format!("{} [{}]", info.record.node, labels(&info.record.labels)))
        .collect();
    shown.join(", ")
}

impl Kernel {
    /// [`Kernel::spawn`] on the node `placement` chooses, or on the node
    /// holding the parent: this node forwards it there when that is
    /// another. Only an operator places a spawn; a parent on another node
    /// than the chosen one lends its child what it takes from it.
    pub async fn spawn_placed(
        &self,
        caller: Caller,
        request: SpawnRequest,
        placement: &Placement,
    ) -> Result<Pid> {
        let placed = placement.is_any().then_some(placement);
        match self.placed_on(caller, &request, placement).await? {
            Some(node) => {
                let op = match caller {
                    Caller::Process(me) => Op::spawn_own(request, me),
                    _ => Op::spawn(request, placement.node.clone(), placement.labels.clone()),
                };
                self.node().forward(&node, op, FORWARDED_SPAWN).await
            }
            None => self.spawn_at(caller, request, placed).await,
        }
    }

    /// The node another than this one a spawn runs on; `None`: here.
    async fn placed_on(
        &self,
        caller: Caller,
        request: &SpawnRequest,
        placement: &Placement,
    ) -> Result<Option<String>> {
        let Some(cluster) = self.inner.cluster() else {
            if placement.is_any() {
                return Err(KernelError::FailedPrecondition(
                    "a placement (node, node labels) chooses a node of a cluster, and this \
                     kernel runs alone"
                        .into(),
                ));
            }
            return Ok(None);
        };
        if let Caller::Process(me) = caller
            && placement.is_any()
        {
            return Err(KernelError::PermissionDenied(format!(
                "process {me} spawns its children on its own node; only an operator places \
                 a spawn on a node"
            )));
        }
        let parent = request.parent;
        // Unplaced, a child lives on its parent's node (PID 1 is every
        // node's; a parent here, or nowhere: the local spawn says which).
        if !placement.is_any() {
            if parent == Pid::KERNEL {
                return Ok(None);
            }
            return match self.node().holder(parent).await? {
                Some(Holder::There(listing)) => Ok(Some(listing.node)),
                _ => Ok(None),
            };
        }
        let nodes = cluster.nodes();
        let chosen = nodes
            .iter()
            .filter(|info| placement.admits(info))
            .min_by_key(|info| (info.record.load.processes, info.record.node.clone()))
            .ok_or_else(|| {
                KernelError::FailedPrecondition(format!(
                    "no live node has {} (live: {})",
                    placement.shown(),
                    listed(&nodes)
                ))
            })?;
        // The chosen node spawns it; a parent on another node lends it
        // what a child takes from its parent.
        let node = chosen.record.node.clone();
        Ok((node != cluster.node()).then_some(node))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use super::Placement;
    use crate::cluster::{NodeInfo, NodeRecord};

    fn node(name: &str, labels: &[(&str, &str)]) -> NodeInfo {
        NodeInfo {
            record: NodeRecord {
                node: name.into(),
                labels: labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
                ..NodeRecord::default()
            },
            seen_ago: std::time::Duration::ZERO,
            this: false,
        }
    }

    #[test]
    fn a_placement_admits_the_nodes_with_its_name_and_every_label() {
        let gpu = node("b", &[("gpu", "true"), ("zone", "x")]);
        let plain = node("c", &[]);
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let any = Placement::default();
        assert!(!any.is_any() && any.admits(&gpu) && any.admits(&plain));
        let on_gpu = Placement {
            node: None,
            labels: labels(&[("gpu", "true")]),
        };
        assert!(on_gpu.admits(&gpu) && !on_gpu.admits(&plain));
        let wrong_value = Placement {
            node: None,
            labels: labels(&[("gpu", "false")]),
        };
        assert!(!wrong_value.admits(&gpu));
        let named = Placement {
            node: Some("c".into()),
            labels: labels(&[("gpu", "true")]),
        };
        assert!(!named.admits(&gpu) && !named.admits(&plain));
        assert_eq!(named.shown(), "node \"c\" with labels gpu=true");
    }
}
