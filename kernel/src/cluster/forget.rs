//! `hivekernel nodes forget NAME`: the operator's way out when a node's
//! name stays taken by a start of it that is gone. Run against NATS
//! directly (no node need be running): it refuses while the record still
//! beats, else claims that start lost, as a node that judged it would,
//! and removes its record, so the name's next start registers at once.

use std::time::{Duration, SystemTime};

use async_nats::jetstream::{self, kv};
use kv::Operation;

use super::signed::Signed;
use super::{
    CLAIMS, ClusterError, Judged, NODES, NodeRecord, REQUEST_TIMEOUT, access, seal_of, watch_record,
};
use crate::config::ClusterSettings;
use crate::event::unix_ms;

/// Who a loss claimed by `nodes forget` names as its claimant: no node,
/// so none reported the forgotten start's processes ended.
pub(crate) const FORGOTTEN_BY: &str = "operator";

/// A start of a node that was forgotten.
#[derive(Debug, Clone, PartialEq)]
pub struct Forgotten {
    /// Its epoch.
    pub epoch: u64,
    /// Where it served.
    pub address: String,
    /// How long before now it last beat, by its own clock.
    pub silent: Duration,
}

/// Why a node was not forgotten.
#[derive(Debug, thiserror::Error)]
pub enum ForgetError {
    /// Reaching NATS or reading the records failed.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The cluster holds no record of that name.
    #[error(
        "node {0:?} has no record in the cluster: there is nothing to forget, and it can start"
    )]
    Unknown(String),
    /// The node still writes heartbeats, or wrote one within its TTL.
    #[error(
        "node {node:?} is alive (epoch {epoch}, serving at {address}): {evidence}; stop it \
         first, or wait until it has been silent for its TTL ({ttl_ms} ms)"
    )]
    Alive {
        /// Its name.
        node: String,
        /// Its epoch.
        epoch: u64,
        /// Where it serves.
        address: String,
        /// What showed it alive.
        evidence: String,
        /// Its TTL.
        ttl_ms: u64,
    },
    /// The record changed while it was judged: another start of the name.
    #[error(
        "node {0:?}'s record changed while it was watched (did it start again?); look at `hivekernel nodes` and ask again"
    )]
    Changed(String),
}

/// Forgets node `name` of the cluster `settings` reach: refused while its
/// record beats (watched for two of its heartbeats) or its last heartbeat
/// is within its TTL; else its start is claimed lost and its record
/// removed (compare-and-set on the revision watched).
pub async fn forget(settings: &ClusterSettings, name: &str) -> Result<Forgotten, ForgetError> {
    let seal = seal_of(settings)?;
    let client = access::connect(settings).await?;
    let mut js = jetstream::new(client.clone());
    js.set_timeout(REQUEST_TIMEOUT);
    let nodes = js
        .get_key_value(NODES)
        .await
        .map_err(|err| ClusterError::jetstream(&format!("opening bucket {NODES}"), err))?;
    let nodes = Signed::new(nodes, NODES, seal.clone());
    let read = |err| ClusterError::jetstream("reading the node records", err);
    let entry = nodes.latest(name).await.map_err(read)?;
    let Some(entry) = entry.filter(|entry| entry.operation == Operation::Put) else {
        return Err(ForgetError::Unknown(name.to_owned()));
    };
    let record: NodeRecord = serde_json::from_slice(&entry.value).unwrap_or_else(|_| NodeRecord {
        node: name.to_owned(),
        ..NodeRecord::default()
    });
    let ttl_ms = record.node_ttl_ms.max(settings.node_ttl_ms);
    let alive = |evidence: String| ForgetError::Alive {
        node: name.to_owned(),
        epoch: record.epoch,
        address: record.address.clone(),
        evidence,
        ttl_ms,
    };
    let silent =
        Duration::from_millis(unix_ms(SystemTime::now()).saturating_sub(record.heartbeat_unix_ms));
    if silent < Duration::from_millis(ttl_ms) {
        return Err(alive(format!(
            "its last heartbeat was {:.1} s ago",
            silent.as_secs_f64()
        )));
    }
    // Its clock may be behind this one: whether it still beats decides.
    let watch = (2 * record.heartbeat_ms.max(settings.heartbeat_ms)).clamp(500, ttl_ms.max(500));
    let revision = match watch_record(&nodes, name, Some(&record), &entry, watch).await {
        Judged::Beating => return Err(alive("it wrote a heartbeat just now".to_owned())),
        Judged::Changed => return Err(ForgetError::Changed(name.to_owned())),
        Judged::Silent { revision } => revision,
    };
    if let Ok(claims) = js.get_key_value(CLAIMS).await {
        let claims = Signed::new(claims, CLAIMS, seal);
        let claim = format!("lost.{name}.{}", record.epoch);
        if let Err(err) = claims.create(&claim, FORGOTTEN_BY).await
            && err.kind() != kv::CreateErrorKind::AlreadyExists
        {
            return Err(ClusterError::jetstream("claiming the node lost", err).into());
        }
    }
    match nodes
        .raw()
        .delete_expect_revision(name, Some(revision))
        .await
    {
        Ok(()) => {}
        Err(err) if err.kind() == kv::UpdateErrorKind::WrongLastRevision => {
            return Err(ForgetError::Changed(name.to_owned()));
        }
        Err(err) => return Err(ClusterError::jetstream("removing the node's record", err).into()),
    }
    tracing::warn!(
        node = name,
        epoch = record.epoch,
        "cluster: node forgotten by the operator"
    );
    let _ = client.drain().await;
    Ok(Forgotten {
        epoch: record.epoch,
        address: record.address,
        silent,
    })
}
