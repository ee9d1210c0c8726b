//! Cron entries added through the API that follow their target when it
//! moves (`hk_cron`, key = the target's PID, a dot, and the entry's name
//! as `hk_declared` writes names): an entry aimed at a process that may
//! move (a config agent, or a spawned process whose spec is in
//! `hk_specs`) is kept here too, so that the node that starts the process
//! after its node is lost runs the entry on (docs/CLUSTER.md, "Events and
//! cron"). Written by the node holding the target when an entry is added,
//! switched or removed, and removed when the target is reaped there.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use futures::StreamExt;
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

/// The entries this node wrote, by target: removed with their target.
#[derive(Debug, Default)]
pub(super) struct Kept(parking_lot::Mutex<HashMap<Pid, HashSet<String>>>);

impl Cluster {
    /// Keeps entry `spec` (of `owner`, added at `created_ms`) in the
    /// cluster, over what it held under that name for that target.
    pub(crate) async fn keep_cron(
        &self,
        owner: Pid,
        spec: &CronSpec,
        created_ms: u64,
    ) -> Result<(), ClusterError> {
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
        self.kept_crons
            .0
            .lock()
            .entry(spec.target)
            .or_default()
            .insert(spec.name.clone());
        Ok(())
    }

    /// Removes entry `name` aimed at `target` from the cluster.
    pub(crate) async fn drop_cron(&self, target: Pid, name: &str) -> Result<(), ClusterError> {
        if let Some(names) = self.kept_crons.0.lock().get_mut(&target) {
            names.remove(name);
        }
        self.crons.delete(key(target, name)).await.map_err(|err| {
            ClusterError::jetstream(&format!("removing cron entry {name:?} from {CRONS}"), err)
        })
    }

    /// The entries kept for `targets`: read from every key's latest
    /// value, those of other targets left out. An entry that cannot be
    /// read is said in the log and left out.
    pub(crate) async fn crons_of(
        &self,
        targets: &HashSet<Pid>,
    ) -> Result<Vec<KeptCron>, ClusterError> {
        let what = || format!("reading {CRONS}");
        let mut keys = self
            .crons
            .keys()
            .await
            .map_err(|err| ClusterError::jetstream(&what(), err))?;
        let mut wanted = Vec::new();
        while let Some(key) = keys.next().await {
            let key = key.map_err(|err| ClusterError::jetstream(&what(), err))?;
            let target = key
                .split_once('.')
                .and_then(|(pid, _)| pid.parse::<u64>().ok())
                .map(Pid);
            if target.is_some_and(|target| targets.contains(&target)) {
                wanted.push(key);
            }
        }
        let mut found = Vec::with_capacity(wanted.len());
        for key in wanted {
            let Some(value) = self
                .crons
                .get(&key)
                .await
                .map_err(|err| ClusterError::jetstream(&what(), err))?
            else {
                continue;
            };
            match serde_json::from_slice::<KeptCron>(&value) {
                Ok(kept) => found.push(kept),
                Err(err) => {
                    tracing::warn!(key, error = %err, "cluster: a cron entry in {CRONS} cannot be read; left out");
                }
            }
        }
        Ok(found)
    }

    /// Removes the entries this node wrote for `pid`, reaped here (not
    /// once this node was fenced: they are the cluster's then).
    pub(super) fn drop_crons_of(&self, pid: Pid) {
        let Some(names) = self.kept_crons.0.lock().remove(&pid) else {
            return;
        };
        if self.fenced.borrow().is_some() || names.is_empty() {
            return;
        }
        let crons = self.crons.clone();
        self.tracker.spawn(async move {
            for name in names {
                if let Err(err) = crons.delete(key(pid, &name)).await {
                    tracing::warn!(%pid, cron = name, error = %err, "cluster: cron entry of a reaped process not removed from {CRONS}");
                }
            }
        });
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
