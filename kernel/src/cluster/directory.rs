//! The directory: which node holds each process and where it sits in the
//! tree (`hk_directory`, key = PID). Each node writes the listings of its
//! own processes, from its table, as they are born, exit and leave it;
//! every node keeps a mirror of the others' listings from a watch.
//!
//! A listing holds what does not change while a process lives (its node,
//! parent, name, role, tier, depth) and whether it has exited. Its state
//! (idle, running) is read off counters on the hot path, so it is never
//! written here: whoever wants it asks the holding node (`get`).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_nats::jetstream::kv::{self, Operation};
use bytes::Bytes;
use futures::StreamExt;
use hivekernel_agents::{Pid, Role, Tier};
use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::signed::Signed;

/// Writes to the bucket in flight at once.
const IN_FLIGHT: usize = 256;
/// How long a failed write waits before it is tried again.
const RETRY: Duration = Duration::from_millis(500);

/// One process as the directory lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Listing {
    /// The node holding it.
    pub node: String,
    /// That node's epoch when it wrote this.
    pub epoch: u64,
    /// Its parent.
    pub ppid: Pid,
    pub name: String,
    pub role: Role,
    pub tier: Tier,
    /// Distance from PID 1.
    pub depth: u32,
    /// It has exited and waits to be collected (a zombie).
    #[serde(default)]
    pub exited: bool,
    /// When it started (Unix ms).
    #[serde(default)]
    pub started_unix_ms: u64,
    /// The SHA-256 (hex) of the token its node issued it (an `exec`
    /// process), so every node honours the token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Its mail is the cluster's (`HK_MAIL`): it starts again elsewhere
    /// when its node is lost, so a message for it waits in the stream
    /// while no node can take it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub moves: bool,
}

/// Reads the listings of this node's processes from its table: `None`
/// where a PID is no longer there.
pub type ReadFn = Arc<dyn Fn(&[Pid]) -> Vec<Option<Listing>> + Send + Sync>;

/// A listing as the mirror keeps it, with the revision it was written at.
#[derive(Debug)]
struct Mirrored {
    listing: Listing,
    revision: u64,
}

/// The other nodes' listings, as the watch last delivered them.
#[derive(Debug, Default)]
pub(crate) struct Mirror {
    by_pid: HashMap<Pid, Mirrored>,
    /// Parent to children, for the listings above.
    children: HashMap<Pid, BTreeSet<Pid>>,
    /// The last listings of processes that move, removed since and not
    /// listed again (their node lost, and nobody started them yet), up
    /// to [`MAX_DEPARTED`].
    departed: HashMap<Pid, Listing>,
}

/// At most this many removed listings are remembered; past that the
/// oldest half is forgotten.
const MAX_DEPARTED: usize = 10_000;

impl Mirror {
    fn insert(&mut self, pid: Pid, listing: Listing, revision: u64) {
        let ppid = listing.ppid;
        self.departed.remove(&pid);
        if let Some(earlier) = self
            .by_pid
            .insert(pid, Mirrored { listing, revision })
            .filter(|earlier| earlier.listing.ppid != ppid)
        {
            self.unlink(earlier.listing.ppid, pid);
        }
        self.children.entry(ppid).or_default().insert(pid);
    }

    fn remove(&mut self, pid: Pid) {
        if let Some(gone) = self.by_pid.remove(&pid) {
            self.unlink(gone.listing.ppid, pid);
            if gone.listing.moves && !gone.listing.exited {
                if self.departed.len() >= MAX_DEPARTED {
                    let mut pids: Vec<Pid> = self.departed.keys().copied().collect();
                    pids.sort_unstable();
                    for old in &pids[..pids.len() / 2] {
                        self.departed.remove(old);
                    }
                }
                self.departed.insert(pid, gone.listing);
            }
        }
    }

    /// `pid`'s last listing, whatever its node's state: listed still, or
    /// removed (see [`Mirror::departed`]).
    pub(crate) fn last(&self, pid: Pid) -> Option<&Listing> {
        self.by_pid
            .get(&pid)
            .map(|m| &m.listing)
            .or_else(|| self.departed.get(&pid))
    }

    fn unlink(&mut self, ppid: Pid, pid: Pid) {
        if let Some(set) = self.children.get_mut(&ppid) {
            set.remove(&pid);
            if set.is_empty() {
                self.children.remove(&ppid);
            }
        }
    }
}

/// The mirror as one read sees it: only listings of the live nodes, each
/// as that node's current epoch wrote it (a lost or restarted node's old
/// listings are not shown).
pub struct Listings<'a> {
    mirror: RwLockReadGuard<'a, Mirror>,
    live: HashMap<String, u64>,
}

impl std::fmt::Debug for Listings<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listings")
            .field("listed", &self.mirror.by_pid.len())
            .field("live", &self.live)
            .finish()
    }
}

impl<'a> Listings<'a> {
    pub(super) fn new(mirror: RwLockReadGuard<'a, Mirror>, live: HashMap<String, u64>) -> Self {
        Listings { mirror, live }
    }

    fn shown(&self, listing: &Listing) -> bool {
        self.live.get(&listing.node) == Some(&listing.epoch)
    }

    /// `pid`'s listing, if a live node holds it.
    pub fn get(&self, pid: Pid) -> Option<&Listing> {
        self.mirror
            .by_pid
            .get(&pid)
            .map(|m| &m.listing)
            .filter(|listing| self.shown(listing))
    }

    /// `pid`'s children on the other live nodes, in PID order.
    pub fn children(&self, pid: Pid) -> impl Iterator<Item = Pid> + '_ {
        self.mirror
            .children
            .get(&pid)
            .into_iter()
            .flatten()
            .copied()
            .filter(|child| self.get(*child).is_some())
    }

    /// Every listing of the other live nodes.
    pub fn iter(&self) -> impl Iterator<Item = (Pid, &Listing)> + '_ {
        self.mirror
            .by_pid
            .iter()
            .map(|(pid, m)| (*pid, &m.listing))
            .filter(|(_, listing)| self.shown(listing))
    }
}

/// What waits to be written: PIDs whose listing changed, with the spawns
/// waiting for theirs.
type Pending = HashMap<Pid, Vec<oneshot::Sender<()>>>;

/// This node's part of the directory: its writer and its mirror.
pub(crate) struct Directory {
    store: Signed,
    node: String,
    epoch: u64,
    mirror: RwLock<Mirror>,
    pending: Mutex<Pending>,
    wake: Notify,
    read: OnceLock<ReadFn>,
    /// PIDs this node has listed and not removed since: what it removes
    /// when it leaves.
    /// (with the revision of its last write, once that is known).
    listed: Mutex<HashMap<Pid, Option<u64>>>,
    /// The mirror has replayed the bucket once.
    caught_up: tokio::sync::watch::Sender<bool>,
}

impl std::fmt::Debug for Directory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Directory")
            .field("node", &self.node)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

impl Directory {
    pub(super) fn new(store: Signed, node: String, epoch: u64) -> Self {
        Directory {
            store,
            node,
            epoch,
            mirror: RwLock::new(Mirror::default()),
            pending: Mutex::new(HashMap::new()),
            wake: Notify::new(),
            read: OnceLock::new(),
            listed: Mutex::new(HashMap::new()),
            caught_up: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Waits until the mirror has replayed the bucket once.
    pub(super) async fn caught_up(&self) {
        let _ = self.caught_up.subscribe().wait_for(|done| *done).await;
    }

    /// Notes that `pid`'s listing changed (born, exited, gone); it is
    /// written soon. PID 1 is every node's kernel and is never listed.
    pub(crate) fn touch(&self, pid: Pid) {
        if pid == Pid::KERNEL {
            return;
        }
        self.pending.lock().entry(pid).or_default();
        self.wake.notify_one();
    }

    /// Notes that `pid`'s listing changed; the receiver hears once a
    /// write of it at least this new is stored.
    pub(crate) fn publish(&self, pid: Pid) -> oneshot::Receiver<()> {
        let (done, heard) = oneshot::channel();
        self.pending.lock().entry(pid).or_default().push(done);
        self.wake.notify_one();
        heard
    }

    /// The mirror for one read, with the live nodes' epochs.
    pub(super) fn mirror(&self) -> RwLockReadGuard<'_, Mirror> {
        self.mirror.read()
    }

    /// The listing of `pid` straight from the bucket (one a watch has not
    /// delivered yet), with its revision.
    pub(super) async fn fetch(&self, pid: Pid) -> Result<Option<Listing>, super::ClusterError> {
        let entry = self
            .store
            .entry(pid.0.to_string())
            .await
            .map_err(|err| super::ClusterError::jetstream("reading the directory", err))?;
        Ok(entry
            .filter(|entry| entry.operation == Operation::Put)
            .and_then(|entry| serde_json::from_slice(&entry.value).ok()))
    }

    /// Starts the writer and the mirror, reading listings with `read`.
    /// Every PID `read` knows now is written first.
    pub(super) fn start(
        self: &Arc<Self>,
        read: ReadFn,
        now: impl IntoIterator<Item = Pid>,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) {
        if self.read.set(read).is_err() {
            return;
        }
        for pid in now {
            self.touch(pid);
        }
        let writer = self.clone();
        let stop = cancel.clone();
        tracker.spawn(async move { writer.write(stop).await });
        let mirror = self.clone();
        tracker.spawn(async move { mirror.watch(cancel).await });
    }

    /// Writes what changed, in rounds: each round takes everything
    /// pending, reads it from the table and writes it (so the latest of
    /// each PID is what is stored), then answers the waiting spawns.
    async fn write(&self, cancel: CancellationToken) {
        let Some(read) = self.read.get().cloned() else {
            return;
        };
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = self.wake.notified() => {}
            }
            loop {
                let round = std::mem::take(&mut *self.pending.lock());
                if round.is_empty() {
                    break;
                }
                let pids: Vec<Pid> = round.keys().copied().collect();
                let listings = read(&pids);
                // Noted before the write, so a leave that stops it midway
                // still removes what it may have stored.
                {
                    let mut listed = self.listed.lock();
                    for (pid, _) in pids.iter().zip(&listings).filter(|(_, l)| l.is_some()) {
                        listed.entry(*pid).or_insert(None);
                    }
                }
                let writes = futures::stream::iter(pids.into_iter().zip(listings))
                    .map(|(pid, listing)| self.write_one(pid, listing))
                    .buffer_unordered(IN_FLIGHT)
                    .collect::<Vec<(Pid, bool, bool)>>();
                // Stopped midway at leave, which removes what was listed.
                let written = tokio::select! {
                    () = cancel.cancelled() => return,
                    written = writes => written,
                };
                let mut failed = false;
                {
                    let mut listed = self.listed.lock();
                    for &(pid, ok, present) in &written {
                        if !ok {
                            failed = true;
                        } else if !present {
                            listed.remove(&pid);
                        }
                    }
                }
                let mut round = round;
                let mut again = Vec::new();
                for (pid, ok, _) in written {
                    let waiters = round.remove(&pid).unwrap_or_default();
                    if ok {
                        for waiter in waiters {
                            let _ = waiter.send(());
                        }
                    } else {
                        again.push((pid, waiters));
                    }
                }
                if failed {
                    // Tried again after a pause; newer changes meanwhile
                    // join the same retry.
                    {
                        let mut pending = self.pending.lock();
                        for (pid, waiters) in again {
                            pending.entry(pid).or_default().extend(waiters);
                        }
                    }
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        () = tokio::time::sleep(RETRY) => {}
                    }
                }
            }
        }
    }

    /// Writes one listing, or removes it when the process left the table;
    /// answers the PID, whether the write went through and whether it is listed.
    async fn write_one(&self, pid: Pid, listing: Option<Listing>) -> (Pid, bool, bool) {
        let key = pid.0.to_string();
        let present = listing.is_some();
        // Only this node's own listings are its to remove: a PID it does
        // not hold and never listed may be listed by another node (a
        // config agent that moved there, touched here as this node's
        // restart records it ended).
        // And of those, only while its last write is what the key holds:
        // a config agent that moved on is listed by its new node under
        // the same PID.
        let last = match self.listed.lock().get(&pid) {
            Some(last) => *last,
            None if !present => return (pid, true, false),
            None => None,
        };
        let result = match listing {
            Some(listing) => match self.store.put(&key, encode(&listing)).await {
                Ok(revision) => {
                    if let Some(last) = self.listed.lock().get_mut(&pid) {
                        *last = Some(revision);
                    }
                    Ok(())
                }
                Err(err) => Err(err.to_string()),
            },
            None => self.unlist(pid, last).await,
        };
        if let Err(err) = &result {
            tracing::debug!(%pid, error = %err, "cluster: directory write failed; retrying");
        }
        (pid, result.is_ok(), present)
    }

    /// Keeps the mirror from the bucket's changes, watching again when the
    /// watch breaks (its replay brings what changed meanwhile, removals
    /// included).
    async fn watch(&self, cancel: CancellationToken) {
        'watching: while !cancel.is_cancelled() {
            let mut changes = match self.store.watch_with_history(">").await {
                Ok(changes) => changes,
                Err(err) => {
                    tracing::debug!(error = %err, "cluster: watch of the directory failed; again");
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        () = tokio::time::sleep(RETRY) => continue 'watching,
                    }
                }
            };
            // An empty bucket replays nothing.
            if self
                .store
                .raw()
                .status()
                .await
                .is_ok_and(|status| status.values() == 0)
            {
                self.caught_up.send_replace(true);
            }
            let mut stale = Vec::new();
            loop {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    change = changes.next() => match change {
                        Some(Ok(entry)) => {
                            // Swept in batches: a crash may have left many.
                            let caught_up = entry.delta == 0;
                            if caught_up {
                                self.caught_up.send_replace(true);
                            }
                            if let Some(left) = self.seen(entry) {
                                stale.push(left);
                            }
                            if !stale.is_empty() && (caught_up || stale.len() >= IN_FLIGHT) {
                                self.sweep(std::mem::take(&mut stale)).await;
                            }
                        }
                        Some(Err(err)) => {
                            tracing::debug!(error = %err, "cluster: watch of the directory broke; again");
                            continue 'watching;
                        }
                        None => continue 'watching,
                    },
                }
            }
        }
    }

    /// Takes one change into the mirror; answers a listing an earlier
    /// start of this node left, with its revision, for [`Directory::sweep`].
    fn seen(&self, entry: kv::Entry) -> Option<(Pid, u64)> {
        let Some(pid) = entry
            .key
            .parse::<u64>()
            .ok()
            .map(Pid)
            .filter(|pid| *pid != Pid::KERNEL)
        else {
            tracing::warn!(key = %entry.key, "cluster: directory key that is not a process's PID; ignored");
            return None;
        };
        let listing = match entry.operation {
            Operation::Put => match serde_json::from_slice::<Listing>(&entry.value) {
                Ok(listing) => Some(listing),
                Err(err) => {
                    tracing::warn!(%pid, error = %err, "cluster: unreadable directory listing; ignored");
                    return None;
                }
            },
            Operation::Delete | Operation::Purge => None,
        };
        match listing {
            // This node's own processes are in its table.
            Some(listing) if listing.node == self.node => {
                return (listing.epoch < self.epoch).then_some((pid, entry.revision));
            }
            Some(listing) => self.mirror.write().insert(pid, listing, entry.revision),
            None => self.mirror.write().remove(pid),
        }
        None
    }

    /// Removes listings an earlier start of this node left (it crashed)
    /// for processes it does not hold now, each unless it changed meanwhile.
    async fn sweep(&self, stale: Vec<(Pid, u64)>) {
        let Some(read) = self.read.get() else {
            return;
        };
        let pids: Vec<Pid> = stale.iter().map(|(pid, _)| *pid).collect();
        let held = read(&pids);
        let gone = stale
            .into_iter()
            .zip(held)
            .filter(|(_, held)| held.is_none())
            .map(|(left, _)| left);
        futures::stream::iter(gone)
            .for_each_concurrent(IN_FLIGHT, |(pid, revision)| async move {
                if let Err(err) = self
                    .store
                    .delete_expect_revision(pid.0.to_string(), Some(revision))
                    .await
                {
                    tracing::debug!(%pid, error = %err, "cluster: stale listing not removed");
                }
            })
            .await;
    }

    /// The listings of `node`'s epoch `epoch`, as the mirror holds them.
    pub(super) fn listings_of(&self, node: &str, epoch: u64) -> Vec<(Pid, Listing)> {
        self.mirror
            .read()
            .by_pid
            .iter()
            .filter(|(_, m)| m.listing.node == node && m.listing.epoch == epoch)
            .map(|(pid, m)| (*pid, m.listing.clone()))
            .collect()
    }

    /// Removes the listings of `node`'s epoch `epoch` (a node declared
    /// lost), each unless it changed meanwhile.
    pub(super) async fn purge(&self, node: &str, epoch: u64) {
        let gone: Vec<(Pid, u64)> = self
            .mirror
            .read()
            .by_pid
            .iter()
            .filter(|(_, m)| m.listing.node == node && m.listing.epoch == epoch)
            .map(|(pid, m)| (*pid, m.revision))
            .collect();
        let count = gone.len();
        futures::stream::iter(gone)
            .for_each_concurrent(IN_FLIGHT, |(pid, revision)| {
                self.remove_if_of(pid, revision, node, epoch)
            })
            .await;
        if count > 0 {
            tracing::info!(
                lost = node,
                epoch,
                listings = count,
                "cluster: lost node's listings removed"
            );
        }
    }

    /// Removes `pid`'s listing while it is still `node`'s of `epoch`: at
    /// `revision`, or, when it changed since the mirror saw it (the mirror
    /// lags), at the revision the bucket has now, a few times.
    async fn remove_if_of(&self, pid: Pid, mut revision: u64, node: &str, epoch: u64) {
        let key = pid.0.to_string();
        for _ in 0..3 {
            match self
                .store
                .delete_expect_revision(&key, Some(revision))
                .await
            {
                Ok(()) => return,
                Err(err) => {
                    tracing::debug!(%pid, error = %err, "cluster: lost node's listing not removed yet");
                }
            }
            let Ok(Some(entry)) = self.store.entry(&key).await else {
                return;
            };
            let still = entry.operation == Operation::Put
                && serde_json::from_slice::<Listing>(&entry.value)
                    .is_ok_and(|l| l.node == node && l.epoch == epoch);
            if !still {
                return;
            }
            revision = entry.revision;
        }
    }

    /// Removes `pid`'s listing this node wrote: at the revision of its last
    /// write when known (a listing another node wrote since is left), else
    /// whatever the key holds.
    async fn unlist(&self, pid: Pid, last: Option<u64>) -> Result<(), String> {
        let key = pid.0.to_string();
        let removed = match last {
            Some(revision) => {
                self.store
                    .delete_expect_revision(&key, Some(revision))
                    .await
            }
            None => self.store.delete(&key).await,
        };
        match removed {
            Ok(()) => Ok(()),
            // Written by another node since: not this node's to remove.
            Err(err) if last.is_some() && err.kind() == kv::DeleteErrorKind::WrongLastRevision => {
                Ok(())
            }
            Err(err) => Err(err.to_string()),
        }
    }

    /// Removes every listing this node wrote (it is leaving).
    pub(super) async fn unlist_all(&self) {
        let listed: Vec<(Pid, Option<u64>)> = self.listed.lock().drain().collect();
        futures::stream::iter(listed)
            .for_each_concurrent(IN_FLIGHT, |(pid, last)| async move {
                if let Err(err) = self.unlist(pid, last).await {
                    tracing::debug!(%pid, error = %err, "cluster: listing not removed at leave");
                }
            })
            .await;
    }
}

fn encode(listing: &Listing) -> Bytes {
    // A listing is plain data: serializing it cannot fail.
    Bytes::from(serde_json::to_vec(listing).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(node: &str, epoch: u64, ppid: u64) -> Listing {
        Listing {
            node: node.into(),
            epoch,
            ppid: Pid(ppid),
            name: "w".into(),
            role: Role::Worker,
            tier: Tier::Operational,
            depth: 1,
            exited: false,
            started_unix_ms: 0,
            token: None,
            moves: false,
        }
    }

    #[test]
    fn a_moved_listing_leaves_its_old_parent() {
        let mut mirror = Mirror::default();
        mirror.insert(Pid(10), listing("b", 1, 1), 1);
        mirror.insert(Pid(11), listing("b", 1, 10), 2);
        mirror.insert(Pid(11), listing("b", 1, 1), 3);
        assert_eq!(mirror.children[&Pid(1)], BTreeSet::from([Pid(10), Pid(11)]));
        assert!(!mirror.children.contains_key(&Pid(10)));
        mirror.remove(Pid(10));
        mirror.remove(Pid(11));
        assert!(mirror.children.is_empty() && mirror.by_pid.is_empty());
    }

    /// A listing on b under PID 1 of a process that moves.
    fn moving() -> Listing {
        Listing {
            moves: true,
            ..listing("b", 1, 1)
        }
    }

    #[test]
    fn a_removed_listing_of_a_process_that_moves_is_remembered_until_listed_again() {
        let mut mirror = Mirror::default();
        let moving = moving();
        mirror.insert(Pid(10), moving.clone(), 1);
        mirror.insert(Pid(11), listing("b", 1, 1), 2);
        mirror.insert(
            Pid(12),
            Listing {
                exited: true,
                ..moving.clone()
            },
            3,
        );
        for pid in [10, 11, 12] {
            mirror.remove(Pid(pid));
        }
        // Only the live one that moves: the others end where they were.
        assert_eq!(mirror.last(Pid(10)), Some(&moving));
        assert_eq!(mirror.last(Pid(11)), None);
        assert_eq!(mirror.last(Pid(12)), None);
        let elsewhere = Listing {
            node: "c".into(),
            ..moving
        };
        mirror.insert(Pid(10), elsewhere.clone(), 4);
        assert!(mirror.departed.is_empty());
        assert_eq!(mirror.last(Pid(10)), Some(&elsewhere));
    }

    #[test]
    fn departed_listings_are_bounded() {
        let mut mirror = Mirror::default();
        let moving = moving();
        for pid in 2..(MAX_DEPARTED as u64 + 12) {
            mirror.insert(Pid(pid), moving.clone(), pid);
            mirror.remove(Pid(pid));
        }
        assert!(mirror.departed.len() <= MAX_DEPARTED);
        // The newest are kept.
        assert!(mirror.last(Pid(MAX_DEPARTED as u64 + 11)).is_some());
        assert!(mirror.last(Pid(2)).is_none());
    }

    #[test]
    fn only_the_live_epoch_of_a_live_node_is_shown() {
        let lock = RwLock::new(Mirror::default());
        {
            let mut mirror = lock.write();
            mirror.insert(Pid(10), listing("b", 4, 1), 1);
            mirror.insert(Pid(11), listing("b", 5, 1), 2);
            mirror.insert(Pid(12), listing("c", 1, 1), 3);
        }
        let live = HashMap::from([("b".to_owned(), 5)]);
        let listings = Listings::new(lock.read(), live);
        assert!(listings.get(Pid(10)).is_none(), "an earlier epoch's");
        assert!(listings.get(Pid(11)).is_some());
        assert!(listings.get(Pid(12)).is_none(), "a node that is not live");
        assert_eq!(listings.children(Pid(1)).collect::<Vec<_>>(), [Pid(11)]);
        assert_eq!(listings.iter().count(), 1);
    }
}
