//! The kernel as a node of a cluster: what it tells the cluster about
//! itself, and what it answers about the other nodes (docs/CLUSTER.md).

use std::sync::Arc;

use hivekernel_agents::ProcessState;

use crate::cluster::{Cluster, Load, NodeInfo};
use crate::error::{KernelError, Result};
use crate::kernel::Kernel;

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
}

impl Kernel {
    /// Hands the cluster, if any, the kernel's load for its heartbeats,
    /// through a weak handle: the cluster does not keep the kernel alive.
    pub(super) fn report_load(&self) {
        if let Some(cluster) = self.inner.cluster() {
            let weak = self.downgrade();
            cluster.set_load(Arc::new(move || {
                weak.upgrade()
                    .map(|inner| Kernel { inner }.load())
                    .unwrap_or_default()
            }));
        }
    }
}
