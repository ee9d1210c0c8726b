//! Cron entries added through the API that follow their target when it
//! moves (`hk_cron`, key = the target's PID, a dot, and the entry's name
//! as `hk_declared` writes names): an entry aimed at a process that may
//! move (a config agent, or a spawned process whose spec is in
//! `hk_specs`) is kept here too, so that the node that starts the process
//! after its node is lost runs the entry on (docs/CLUSTER.md, "Events and
//! cron"). Written by the node holding the target when an entry is added,
//! switched or removed; a node started again removes the keys it wrote
//! last of entries whose target did not come back to it.

use std::collections::HashSet;

use async_nats::jetstream::kv;
use bytes::Bytes;
use hivekernel_agents::Pid;
use hivekernel_agents::cron::CronSpec;
use serde::{Deserialize, Serialize};

use super::{Cluster, ClusterError, declared};

/// The bucket of cron entries that follow their target.
pub(super) const CRONS: &str = "hk_cron";

/// An entry as the cluster keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptCron {
    /// The node that wrote it.
    pub node: String,
    /// Who added it (PID 1: an operator).
    pub owner: Pid,
    /// When it was added (Unix ms).
    pub created_ms: u64,
    /// The entry, with its switch.
    pub spec: CronSpec,
}

/// The key of entry `name` aimed at `target`.
fn key(target: Pid, name: &str) -> String {
    format!("{}.{}", target.0, declared::key(name))
}

impl Cluster {
    /// Keeps entry `spec` (of `owner`, added at `created_ms`) in the
    /// cluster, over what it held under that name for that target.
    pub(crate) async fn keep_cron(
        &self,
        owner: Pid,
        spec: &CronSpec,
        created_ms: u64,
    ) -> Result<(), ClusterError> {
        // A node that may have been declared lost writes nothing over the
        // node that took the target over.
        if !self.still_member().await {
            return Err(ClusterError::JetStream(format!(
                "process {} runs on another node now",
                spec.target
            )));
        }
        let kept = KeptCron {
            node: self.settings.node.clone(),
            owner,
            created_ms,
            spec: spec.clone(),
        };
        let value = serde_json::to_vec(&kept)
            .map_err(|err| ClusterError::JetStream(format!("encoding a cron entry: {err}")))?;
        self.crons
            .put(key(spec.target, &spec.name), Bytes::from(value))
            .await
            .map_err(|err| {
                ClusterError::jetstream(
                    &format!("keeping cron entry {:?} in {CRONS}", spec.name),
                    err,
                )
            })?;
        Ok(())
    }

    /// Removes entry `name` aimed at `target` from the cluster.
    pub(crate) async fn drop_cron(&self, target: Pid, name: &str) -> Result<(), ClusterError> {
        if !self.still_member().await {
            return Err(ClusterError::JetStream(format!(
                "process {target} runs on another node now"
            )));
        }
        self.crons.delete(key(target, name)).await.map_err(|err| {
            ClusterError::jetstream(&format!("removing cron entry {name:?} from {CRONS}"), err)
        })
    }

    /// Removes entry `name` aimed at `target` if this node wrote it last
    /// (at its restart, for a target that did not come back here: one
    /// another node took over is that node's). Failures are said in the log.
    pub(crate) async fn drop_stale_cron(&self, target: Pid, name: &str) {
        let key = key(target, name);
        let entry = match self.crons.entry(&key).await {
            Ok(Some(entry)) if entry.operation == kv::Operation::Put => entry,
            Ok(_) => return,
            Err(err) => {
                tracing::warn!(key, error = %err, "cluster: a stale cron entry in {CRONS} not read");
                return;
            }
        };
        let ours = serde_json::from_slice::<KeptCron>(&entry.value)
            .is_ok_and(|kept| kept.node == self.settings.node);
        if ours
            && let Err(err) = self
                .crons
                .delete_expect_revision(&key, Some(entry.revision))
                .await
            && err.kind() != kv::DeleteErrorKind::WrongLastRevision
        {
            tracing::warn!(key, error = %err, "cluster: a stale cron entry stays in {CRONS}");
        }
    }

    /// The entries kept for `targets`, each with the target its key names:
    /// read from every key's latest value, those of other targets left
    /// out. An entry that cannot be read is said in the log and left out.
    pub(crate) async fn crons_of(
        &self,
        targets: &HashSet<Pid>,
    ) -> Result<Vec<(Pid, KeptCron)>, ClusterError> {
        let what = || format!("reading {CRONS}");
        let mut wanted = Vec::new();
        for key in super::all_keys(self.crons.raw(), CRONS).await? {
            let target = key
                .split_once('.')
                .and_then(|(pid, _)| pid.parse::<u64>().ok())
                .map(Pid);
            if let Some(target) = target.filter(|target| targets.contains(target)) {
                wanted.push((target, key));
            }
        }
        let mut found = Vec::with_capacity(wanted.len());
        for (target, key) in wanted {
            let Some(value) = self
                .crons
                .get(&key)
                .await
                .map_err(|err| ClusterError::jetstream(&what(), err))?
            else {
                continue;
            };
            match serde_json::from_slice::<KeptCron>(&value) {
                Ok(kept) => found.push((target, kept)),
                Err(err) => {
                    tracing::warn!(key, error = %err, "cluster: a cron entry in {CRONS} cannot be read; left out");
                }
            }
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_the_target_then_the_name_as_a_key() {
        assert_eq!(key(Pid(12), "nightly"), "12.nightly");
        assert_eq!(key(Pid(12), "a.b"), "12.x.612e62");
    }

    #[test]
    fn kv_keys_are_what_the_bucket_accepts() {
        // Keys are NATS subject tokens: no spaces, no wildcards.
        for name in ["every day", "a*b", ">"] {
            let key = key(Pid(7), name);
            assert!(
                key.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_'),
                "{key}"
            );
        }
    }
}
