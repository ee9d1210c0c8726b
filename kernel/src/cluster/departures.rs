//! Nodes leaving the view, for whoever waits on them: a call to a node
//! that is lost before it answers fails at once (`node_lost`), and a
//! `delegate_async` request a lost node was to answer is reported failed
//! to its requester, once.

use std::collections::HashMap;

use hivekernel_agents::{Pid, RequestId};
use tokio::sync::broadcast;

use super::Cluster;

/// Departures queued for a slow listener before it lags (it then checks
/// the view instead).
pub(super) const DEPARTURES_QUEUED: usize = 256;

/// A `delegate_async` request sent to a process on another node, not
/// answered yet.
#[derive(Debug, Clone, Copy)]
pub struct Away {
    /// The requester, on this node.
    pub requester: Pid,
    /// The process asked.
    pub to: Pid,
    /// The asked node's epoch when the request went, if this node saw it.
    epoch: Option<u64>,
}

/// The unanswered requests, by id, with the node asked.
#[derive(Debug, Default)]
pub(super) struct Unanswered(parking_lot::Mutex<HashMap<RequestId, (String, Away)>>);

impl Cluster {
    /// `node` left the view under `epoch` (its record removed, or
    /// replaced by a new epoch's).
    pub(super) fn departed_node(&self, node: &str, epoch: u64) {
        let _ = self.departures.send((node.to_owned(), epoch));
        self.departed.notify_one();
    }

    /// Every node that leaves the view from now on, with its epoch.
    pub fn departures(&self) -> broadcast::Receiver<(String, u64)> {
        self.departures.subscribe()
    }

    /// `node`'s epoch as this node sees it, if it sees the node.
    pub(crate) fn epoch_of(&self, node: &str) -> Option<u64> {
        self.view
            .lock()
            .others
            .get(node)
            .map(|seen| seen.record.epoch)
    }

    /// Returns once `node` under `epoch` leaves the view and is not back
    /// under a new epoch (which answers to the same name, and may answer
    /// what was asked of it); never, while it stays.
    pub(super) async fn departure_of(
        &self,
        departures: &mut broadcast::Receiver<(String, u64)>,
        node: &str,
        epoch: u64,
    ) {
        loop {
            match departures.recv().await {
                Ok((gone, was)) if gone == node && was == epoch => {
                    if self.epoch_of(node).is_none() {
                        return;
                    }
                }
                Ok(_) => {}
                // Missed some: the view says whether it is still there.
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    if self.epoch_of(node) != Some(epoch) {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
            }
        }
    }

    /// Notes request `id` from `requester` to `to` on `node`, about to be
    /// sent.
    pub fn expect_answer(&self, id: RequestId, node: &str, requester: Pid, to: Pid) {
        let away = Away {
            requester,
            to,
            epoch: self.epoch_of(node),
        };
        self.unanswered.0.lock().insert(id, (node.to_owned(), away));
    }

    /// Request `id` is answered (or was never sent): true the first time,
    /// when it was still waited for.
    pub fn answered(&self, id: RequestId) -> bool {
        self.unanswered.0.lock().remove(&id).is_some()
    }

    /// Waits `wait` while `node` stays in the view under `epoch`: true if
    /// it still is then; false as soon as it leaves (one that came back
    /// under another epoch meanwhile, when the wait ends).
    pub async fn stays(&self, node: &str, epoch: u64, wait: std::time::Duration) -> bool {
        let mut departures = self.departures.subscribe();
        if self.epoch_of(node) != Some(epoch) {
            return false;
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => self.epoch_of(node) == Some(epoch),
            () = self.departure_of(&mut departures, node, epoch) => false,
        }
    }

    /// The requests `node` under `epoch` was to answer (`None`: those of
    /// every node no longer in the view), no longer waited for: each is
    /// the caller's to report failed.
    pub fn unanswered_of(&self, gone: Option<(&str, u64)>) -> Vec<(RequestId, String, Away)> {
        let view: HashMap<String, u64> = match gone {
            Some(_) => HashMap::new(),
            None => self
                .view
                .lock()
                .others
                .iter()
                .map(|(name, seen)| (name.clone(), seen.record.epoch))
                .collect(),
        };
        let mut unanswered = self.unanswered.0.lock();
        let left: Vec<RequestId> = unanswered
            .iter()
            .filter(|(_, (asked, away))| match gone {
                Some((node, epoch)) => asked == node && away.epoch.is_none_or(|seen| seen == epoch),
                None => away
                    .epoch
                    .is_some_and(|epoch| view.get(asked) != Some(&epoch)),
            })
            .map(|(id, _)| *id)
            .collect();
        left.into_iter()
            .filter_map(|id| unanswered.remove(&id).map(|(node, away)| (id, node, away)))
            .collect()
    }
}
