//! Spawn specs of processes that may move (`hk_specs`, key = PID): what a
//! node needs to start a process again as the same PID when the node that
//! held it is lost. A process's key names the node (and epoch) that holds
//! it; the key of a *root* (a spawned child of PID 1) decides who holds
//! its whole subtree, since a child lives on its parent's node: a node
//! takes a lost root over, or its own back after a restart, by a
//! compare-and-set at the revision it read.

use std::collections::{BTreeMap, HashMap};

use async_nats::jetstream::kv::{self, Operation, UpdateErrorKind};
use bytes::Bytes;
use hivekernel_agents::Pid;
use serde::{Deserialize, Serialize};

use super::{Cluster, ClusterError};

/// The bucket of spawn specs, by PID.
pub(super) const SPECS: &str = "hk_specs";

/// A process's spawn spec as the cluster keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptSpec {
    /// The node holding the process.
    pub node: String,
    /// That node's epoch when it wrote this.
    pub epoch: u64,
    /// Its parent when it was spawned.
    pub ppid: Pid,
    /// The node its spawn named (`--node`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placed_on: Option<String>,
    /// The labels its spawn asked of its node (`--where`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// The spawn request, as the local store keeps it.
    pub spec: String,
}

/// A process's key in `hk_specs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecKey {
    /// Its spec, and the revision it was read at.
    Kept(KeptSpec, u64),
    /// Removed: the process was reaped, or did not come back after a
    /// loss, on the node that held it last.
    Removed,
    /// Never written: spawned before its node joined a cluster, or its
    /// write failed.
    Never,
}

/// The keys this node wrote, with the revision of its last write: only
/// those are its to delete, and only at that revision (a node that took
/// the process over since wrote another).
#[derive(Debug, Default)]
pub(super) struct Written(parking_lot::Mutex<HashMap<Pid, u64>>);

fn encode(kept: &KeptSpec) -> Bytes {
    // Strings and numbers: serializing cannot fail.
    Bytes::from(serde_json::to_vec(kept).unwrap_or_default())
}

impl Cluster {
    /// A spec for `pid` held by this node, as this node writes it.
    pub fn spec_here(
        &self,
        ppid: Pid,
        placed_on: Option<String>,
        labels: BTreeMap<String, String>,
        spec: String,
    ) -> KeptSpec {
        KeptSpec {
            node: self.settings.node.clone(),
            epoch: self.epoch,
            ppid,
            placed_on,
            labels,
            spec,
        }
    }

    /// Keeps `pid`'s spec, naming this node: at its spawn, or once this
    /// node has started it again.
    pub async fn keep_spec(&self, pid: Pid, kept: &KeptSpec) -> Result<(), ClusterError> {
        let revision = self
            .specs
            .put(pid.0.to_string(), encode(kept))
            .await
            .map_err(|err| ClusterError::jetstream(&format!("keeping {SPECS}/{pid}"), err))?;
        self.written.0.lock().insert(pid, revision);
        Ok(())
    }

    /// `pid`'s kept spec and its revision, if there is one.
    pub async fn kept_spec(&self, pid: Pid) -> Result<Option<(KeptSpec, u64)>, ClusterError> {
        Ok(match self.spec_key(pid).await? {
            SpecKey::Kept(kept, revision) => Some((kept, revision)),
            SpecKey::Removed | SpecKey::Never => None,
        })
    }

    /// `pid`'s key as it stands (a removal leaves a marker behind).
    pub async fn spec_key(&self, pid: Pid) -> Result<SpecKey, ClusterError> {
        let key = pid.0.to_string();
        let entry = self
            .specs
            .entry(&key)
            .await
            .map_err(|err| ClusterError::jetstream(&format!("reading {SPECS}/{key}"), err))?;
        let Some(entry) = entry else {
            return Ok(SpecKey::Never);
        };
        if entry.operation != Operation::Put {
            return Ok(SpecKey::Removed);
        }
        let kept = serde_json::from_slice(&entry.value).map_err(|err| ClusterError::Corrupt {
            bucket: SPECS,
            key,
            reason: err.to_string(),
        })?;
        Ok(SpecKey::Kept(kept, entry.revision))
    }

    /// Takes `pid` (a root) for this node: replaces its spec, read at
    /// `revision`, with one naming this node. False when another node
    /// wrote it since (it took the process).
    pub async fn claim_spec(
        &self,
        pid: Pid,
        kept: &KeptSpec,
        revision: u64,
    ) -> Result<bool, ClusterError> {
        let key = pid.0.to_string();
        let mine = KeptSpec {
            node: self.settings.node.clone(),
            epoch: self.epoch,
            ..kept.clone()
        };
        let won = match self.specs.update(&key, encode(&mine), revision).await {
            Ok(revision) => revision,
            Err(err) if err.kind() == UpdateErrorKind::WrongLastRevision => return Ok(false),
            Err(err) => {
                return Err(ClusterError::jetstream(
                    &format!("claiming {SPECS}/{key}"),
                    err,
                ));
            }
        };
        // Two nodes may both have won the write (see `settled`).
        if !super::settled(self.specs.raw(), &key, won).await? {
            return Ok(false);
        }
        self.written.0.lock().insert(pid, won);
        Ok(true)
    }

    /// Removes `pid`'s spec, read at `revision` (a lost process that does
    /// not come back); left when it changed since.
    pub async fn remove_spec(&self, pid: Pid, revision: u64) {
        if let Err(err) = self
            .specs
            .delete_expect_revision(pid.0.to_string(), Some(revision))
            .await
        {
            tracing::debug!(%pid, error = %err, "cluster: spec not removed (changed since?)");
        }
        self.written.0.lock().remove(&pid);
    }

    /// `pid` left this node's table for good: its spec goes, in the
    /// background, if this node wrote it last. Nothing once fenced: the
    /// processes this node ends then live elsewhere.
    pub(super) fn drop_spec(&self, pid: Pid) {
        let Some(revision) = self.written.0.lock().remove(&pid) else {
            return;
        };
        if self.fenced.borrow().is_some() {
            return;
        }
        let specs = self.specs.clone();
        self.tracker.spawn(async move {
            let key = pid.0.to_string();
            if let Err(err) = specs.delete_expect_revision(&key, Some(revision)).await
                && err.kind() != kv::DeleteErrorKind::WrongLastRevision
            {
                tracing::warn!(%pid, error = %err, "cluster: spec of a reaped process not removed");
            }
        });
    }
}
