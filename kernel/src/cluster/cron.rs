//! Cron leases: each slot of a cron entry is fired by one node of the
//! cluster, the one whose marker `cron.<slot ms>.<entry>` in `hk_claims`
//! stayed (docs/CLUSTER.md, "Events and cron").

use bytes::Bytes;

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

/// The marker of slot `slot_ms` of cron entry `name`.
fn marker(name: &str, slot_ms: u64) -> String {
    format!("cron.{slot_ms}.{}", key(name))
}

impl Cluster {
    /// Claims slot `slot_ms` of cron entry `name` for this node: the first
    /// marker created wins, once the stream leader still holds it after
    /// the settling wait (two creates in flight at once may both be
    /// accepted by nats-server before 2.9.21, see `settled`).
    pub async fn lease_slot(&self, name: &str, slot_ms: u64) -> Result<Lease, ClusterError> {
        let key = marker(name, slot_ms);
        let node = Bytes::from(self.settings.node.clone());
        let written = match self.claims.create(&key, node).await {
            Ok(revision) => Some(revision),
            Err(err) if err.kind() == CreateErrorKind::AlreadyExists => None,
            Err(err) => {
                return Err(ClusterError::jetstream(
                    &format!("claiming {CLAIMS}/{key}"),
                    err,
                ));
            }
        };
        Ok(match last_after_settling(&self.claims, &key).await? {
            Some((last, _)) if Some(last) == written => Lease::Won,
            Some((_, holder)) => Lease::Taken(String::from_utf8_lossy(&holder).into_owned()),
            // Aged out between the write and the read: a slot a day old.
            None => Lease::Taken(String::new()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::marker;

    #[test]
    fn a_marker_names_the_slot_then_the_entry_as_a_valid_key() {
        assert_eq!(
            marker("nightly", 1_700_000_000_000),
            "cron.1700000000000.nightly"
        );
        // A name that is no key of its own is spelled in hex, so the slot
        // never runs into it.
        assert_eq!(marker("a.b c", 5), "cron.5.x.612e622063");
    }
}
