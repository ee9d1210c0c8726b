//! Config agents as cluster-wide singletons. Every node reads the same
//! config; `hk_declared/<agent>` says which node runs each agent, under
//! which epoch, and the PID it runs as. The first node to create the key
//! runs the agent; a key whose node is no longer live under that epoch (it
//! was lost, stopped or started again) is taken over by compare-and-set
//! at its revision, and the winner starts the agent as the same PID.

use async_nats::jetstream::kv::{CreateErrorKind, Operation, UpdateErrorKind};
use bytes::Bytes;
use hivekernel_agents::Pid;
use serde::{Deserialize, Serialize};

use super::{Cluster, ClusterError, NodeRecord};

/// The bucket of config agents' holders, by agent name.
pub(super) const DECLARED: &str = "hk_declared";

/// Who runs a config agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holding {
    /// The node running it.
    pub node: String,
    /// That node's epoch when it claimed the agent.
    pub epoch: u64,
    /// The PID the agent runs as (0 until the node has spawned it).
    #[serde(default)]
    pub pid: u64,
}

impl Holding {
    /// The PID it ran as, if it was ever spawned.
    pub fn pid(&self) -> Option<Pid> {
        (self.pid > Pid::KERNEL.0).then_some(Pid(self.pid))
    }
}

/// A config agent's key as it stands in the bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// No node runs it: none has claimed it yet, or its node released it
    /// as it stopped (then with the PID it ran as).
    Unclaimed(Option<Pid>),
    /// `holding` names a node live under that epoch (this node included).
    Live(Holding),
    /// `holding` names a node that is not live under that epoch any more.
    Orphaned(Holding),
}

/// What a claim won: the key's revision, for recording the PID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claimed {
    revision: u64,
}

/// A config agent's key: its name where that is a valid key of its own
/// (letters, digits, `-` and `_`), else `x.` and the name's bytes in hex.
pub(super) fn key(name: &str) -> String {
    let plain = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if plain {
        return name.to_owned();
    }
    let mut key = String::with_capacity(2 + name.len() * 2);
    key.push_str("x.");
    for byte in name.bytes() {
        key.push_str(&format!("{byte:02x}"));
    }
    key
}

fn encode(holding: &Holding) -> Bytes {
    Bytes::from(serde_json::to_vec(holding).unwrap_or_default())
}

impl Cluster {
    /// How config agent `name`'s key stands, with its revision.
    pub async fn declared(&self, name: &str) -> Result<(Standing, u64), ClusterError> {
        let key = key(name);
        let entry =
            self.declared.entry(&key).await.map_err(|err| {
                ClusterError::jetstream(&format!("reading {DECLARED}/{key}"), err)
            })?;
        let Some(entry) = entry.filter(|entry| entry.operation == Operation::Put) else {
            return Ok((Standing::Unclaimed(None), 0));
        };
        // A key nobody can read is nobody's: whoever takes it writes it anew.
        let holding: Holding = match serde_json::from_slice(&entry.value) {
            Ok(holding) => holding,
            Err(err) => {
                tracing::warn!(key = %key, error = %err, "cluster: unreadable config agent holder; taking it over");
                return Ok((Standing::Unclaimed(None), entry.revision));
            }
        };
        if holding.node.is_empty() {
            return Ok((Standing::Unclaimed(holding.pid()), entry.revision));
        }
        let live = self.node_live(&holding.node, holding.epoch).await?;
        let standing = if live {
            Standing::Live(holding)
        } else {
            Standing::Orphaned(holding)
        };
        Ok((standing, entry.revision))
    }

    /// Claims config agent `name` for this node: creates its key when
    /// `revision` is 0, else replaces the key at `revision`. `None` when
    /// another node won the race.
    pub async fn claim_declared(
        &self,
        name: &str,
        revision: u64,
        pid: Option<Pid>,
    ) -> Result<Option<Claimed>, ClusterError> {
        let key = key(name);
        let holding = Holding {
            node: self.settings.node.clone(),
            epoch: self.epoch,
            pid: pid.map_or(0, |pid| pid.0),
        };
        let what = || format!("claiming {DECLARED}/{key}");
        let won = if revision == 0 {
            match self.declared.create(&key, encode(&holding)).await {
                Ok(revision) => Some(revision),
                Err(err) if err.kind() == CreateErrorKind::AlreadyExists => None,
                Err(err) => return Err(ClusterError::jetstream(&what(), err)),
            }
        } else {
            match self.declared.update(&key, encode(&holding), revision).await {
                Ok(revision) => Some(revision),
                Err(err) if err.kind() == UpdateErrorKind::WrongLastRevision => None,
                Err(err) => return Err(ClusterError::jetstream(&what(), err)),
            }
        };
        // Two nodes may both have won the write (see `settled`): the one
        // whose write stayed runs the agent.
        let won = match won {
            Some(revision) if super::settled(self.declared.raw(), &key, revision).await? => {
                Some(revision)
            }
            _ => None,
        };
        Ok(won.map(|revision| {
            self.claimed.lock().insert(key, (holding, revision));
            Claimed { revision }
        }))
    }

    /// Records the PID config agent `name`, claimed as `claimed`, runs as.
    /// False when another node wrote the key since the claim: it runs the
    /// agent, and this node's copy must stop.
    pub async fn declared_as(
        &self,
        name: &str,
        claimed: Claimed,
        pid: Pid,
    ) -> Result<bool, ClusterError> {
        let key = key(name);
        let holding = Holding {
            node: self.settings.node.clone(),
            epoch: self.epoch,
            pid: pid.0,
        };
        let revision = match self
            .declared
            .update(&key, encode(&holding), claimed.revision)
            .await
        {
            Ok(revision) => revision,
            Err(err) if err.kind() == UpdateErrorKind::WrongLastRevision => {
                self.claimed.lock().remove(&key);
                return Ok(false);
            }
            Err(err) => {
                return Err(ClusterError::jetstream(
                    &format!("recording {DECLARED}/{key}"),
                    err,
                ));
            }
        };
        self.claimed.lock().insert(key, (holding, revision));
        Ok(true)
    }

    /// Gives up every config agent this node claimed (at leave): each key
    /// still at the revision this node wrote then names no node, only the
    /// PID, so the other nodes start the agents as the same PIDs without
    /// waiting for a loss.
    pub(super) async fn release_declared(&self) {
        let claimed: Vec<(String, (Holding, u64))> = self.claimed.lock().drain().collect();
        for (key, (holding, revision)) in claimed {
            let released = Holding {
                node: String::new(),
                epoch: 0,
                pid: holding.pid,
            };
            if let Err(err) = self
                .declared
                .update(&key, encode(&released), revision)
                .await
            {
                tracing::debug!(key = %key, error = %err, "cluster: config agent not released (taken over already?)");
            }
        }
    }

    /// Whether `node` is live under `epoch`, read from its record (not the
    /// watch's view, which a node that just joined has not filled yet). A
    /// node that stopped answering but is not declared lost yet counts as
    /// live: its agents move once its record is removed.
    async fn node_live(&self, node: &str, epoch: u64) -> Result<bool, ClusterError> {
        if node == self.settings.node {
            return Ok(epoch == self.epoch);
        }
        if node.is_empty() {
            return Ok(false);
        }
        let entry = self
            .nodes
            .entry(node)
            .await
            .map_err(|err| ClusterError::jetstream("reading the node records", err))?;
        Ok(entry
            .filter(|entry| entry.operation == Operation::Put)
            .and_then(|entry| serde_json::from_slice::<NodeRecord>(&entry.value).ok())
            .is_some_and(|record| record.epoch == epoch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_are_their_own_keys_and_others_are_hex() {
        assert_eq!(key("greeter"), "greeter");
        assert_eq!(key("web-fetch_2"), "web-fetch_2");
        // A dot, a space, a star or a non-ASCII letter is no key's; the
        // hex form cannot collide with a plain name (it has a dot).
        assert_eq!(key("a.b"), "x.612e62");
        assert_eq!(key("é"), "x.c3a9");
    }

    #[test]
    fn a_holding_without_a_pid_reads_as_never_spawned() {
        let holding: Holding =
            serde_json::from_str(r#"{"node":"a","epoch":3}"#).expect("a holding");
        assert_eq!(holding.pid(), None);
        let holding = Holding { pid: 12, ..holding };
        assert_eq!(holding.pid(), Some(Pid(12)));
    }
}
