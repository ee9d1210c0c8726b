//! Cron leases: each slot of a cron entry is fired by one node of the
//! cluster, the one whose marker `cron.<slot ms>.<owner>.<entry>` in
//! `hk_claims` stayed (docs/CLUSTER.md, "Events and cron"). Entry names
//! are unique on a node, not across nodes: the owner tells apart two
//! nodes' entries of one name. A process's PID is the cluster's (a config
//! agent keeps its PID when it moves); PID 1 is every node's, so the
//! operator's entries are told apart by their node. An entry that
//! follows its target (`hk_cron`: unique by target and name across the
//! cluster) is claimed under its target, `t<pid>`, by whichever node
//! holds it, so the node that takes it over never fires a slot again.

use hivekernel_agents::Pid;

use super::declared::key;
use super::{CLAIMS, Cluster, ClusterError, CreateErrorKind, last_after_settling};

/// Who fires a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lease {
    /// This node: its marker stayed.
    Won,
    /// Another node, named in its marker.
    Taken(String),
}

/// The marker of slot `slot_ms` of cron entry `name` of `owner` on `node`,
/// or of the entry following `target` when it does.
fn marker(node: &str, (owner, target): (Pid, Option<Pid>), name: &str, slot_ms: u64) -> String {
    let owner = match target {
        Some(target) => format!("t{}", target.0),
        None if owner == Pid::KERNEL => format!("n{}", key(node)),
        None => owner.0.to_string(),
    };
    format!("cron.{slot_ms}.{owner}.{}", key(name))
}

impl Cluster {
    /// Claims slot `slot_ms` of cron entry `name` for this node: the first
    /// marker created wins, once the stream leader still holds it after
    /// the settling wait (two creates in flight at once may both be
    /// accepted by nats-server before 2.9.21, see `settled`).
    pub async fn lease_slot(
        &self,
        owner: (Pid, Option<Pid>),
        name: &str,
        slot_ms: u64,
    ) -> Result<Lease, ClusterError> {
        // A node that may have been declared lost fires nothing: the node
        // that took its processes over does.
        self.standing().await.map_err(ClusterError::JetStream)?;
        let key = marker(&self.settings.node, owner, name, slot_ms);
        let written = match self.claims.create(&key, &self.settings.node).await {
            Ok(revision) => Some(revision),
            Err(err) if err.kind() == CreateErrorKind::AlreadyExists => None,
            Err(err) => {
                return Err(ClusterError::jetstream(
                    &format!("claiming {CLAIMS}/{key}"),
                    err,
                ));
            }
        };
        Ok(match last_after_settling(self.claims.raw(), &key).await? {
            Some((last, _)) if Some(last) == written => Lease::Won,
            Some((_, holder)) => Lease::Taken(match self.claims.open_value(&key, &holder) {
                Some(holder) => String::from_utf8_lossy(&holder).into_owned(),
                None => "? (a marker no node signed)".to_owned(),
            }),
            // Aged out between the write and the read: a slot a day old.
            None => Lease::Taken(String::new()),
        })
    }
}

#[cfg(test)]
mod tests {
    use hivekernel_agents::Pid;

    use super::marker;

    #[test]
    fn a_marker_names_the_slot_the_owner_and_the_entry_as_a_valid_key() {
        assert_eq!(
            marker("a", (Pid(12), None), "nightly", 1_700_000_000_000),
            "cron.1700000000000.12.nightly"
        );
        // A name that is no key of its own is spelled in hex, so the slot
        // never runs into it.
        assert_eq!(
            marker("a", (Pid(12), None), "a.b c", 5),
            "cron.5.12.x.612e622063"
        );
        // The operator's entries are each node's own...
        let operator = (Pid(1), None);
        assert_ne!(marker("a", operator, "n", 5), marker("b", operator, "n", 5));
        assert_eq!(marker("a", operator, "n", 5), "cron.5.na.n");
        // ... but one that follows its target is the same on every node.
        let follows = (Pid(1), Some(Pid(40)));
        assert_eq!(marker("a", follows, "n", 5), marker("b", follows, "n", 5));
        assert_eq!(marker("a", follows, "n", 5), "cron.5.t40.n");
    }
}
