//! A lost node's spawned processes, started again here (docs/CLUSTER.md,
//! "Losing a node"). A lost node's processes form trees, each under PID 1
//! or under a process of another node; each tree whose root may move (its
//! spec is in `hk_specs`) is taken over whole by the node that wins its
//! root's key, after the root's restart delay: every process of it comes
//! back as the PID it had, parents first, with the messages kept for it
//! in `HK_MAIL`. One that cannot come back is reported exited
//! (`node_lost`), to its parent too when that came back.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use hivekernel_agents::Pid;

use crate::cluster::rpc::Op;
use crate::cluster::{Cluster, KeptSpec, Listing, Loss, Standing};
use crate::error::KernelError;
use crate::events::unix_ms;
use crate::kernel::cluster::NodeHandle;
use crate::kernel::restore::read_spec;
use crate::kernel::spawn::Birth;
use crate::kernel::{Caller, Placement};
use crate::store::Write;

/// Why a lost node's processes exited.
const NODE_LOST: &str = "node_lost";

/// One tree of a lost node: its root (a child of PID 1, or of a process on
/// another node) and every process
/// under it the directory listed, the root first, parents before children.
#[derive(Debug)]
struct Tree {
    root: Pid,
    members: Vec<(Pid, Listing)>,
    /// This node made the loss's claim: it reports what of the tree ends
    /// with the node, when the tree does not move.
    reports: bool,
}

impl NodeHandle<'_> {
    /// On a node of a cluster: takes over the trees of every node this
    /// node judges lost, until the kernel begins to stop.
    pub(super) fn keep_moving(self) {
        let Some(cluster) = self.kernel.inner.cluster() else {
            return;
        };
        let Some(mut losses) = cluster.losses() else {
            return;
        };
        let kernel = self.kernel.clone();
        let stopping = self.kernel.inner.stop_begun().clone();
        let tracker = self.kernel.inner.tracker().clone();
        self.kernel.inner.tracker().spawn(async move {
            loop {
                let loss = tokio::select! {
                    () = stopping.cancelled() => return,
                    loss = losses.recv() => match loss {
                        Some(loss) => loss,
                        None => return,
                    },
                };
                kernel.node().lost_children(&loss).await;
                kernel.node().lost_parents(&loss).await;
                for tree in trees(&loss) {
                    let kernel = kernel.clone();
                    let (node, epoch) = (loss.node.clone(), loss.epoch);
                    tracker.spawn(async move {
                        kernel.node().take_tree(&node, epoch, tree, true).await
                    });
                }
            }
        });
    }

    /// The children of this node's processes that lived on lost node
    /// `loss.node` and do not move (no spec kept for them under its epoch)
    /// ended with it: their slots are freed and their parents told
    /// (`node_lost`). One that moves keeps its slot; if it does not come
    /// back, the node that took its tree tells its parent.
    async fn lost_children(self, loss: &Loss) {
        let Some(cluster) = self.kernel.inner.cluster() else {
            return;
        };
        let listed: HashMap<Pid, &Listing> = loss.listings.iter().map(|(p, l)| (*p, l)).collect();
        let ended: Vec<(Pid, Pid, String, bool)> = {
            let table = self.kernel.inner.table().read();
            table
                .iter()
                .flat_map(|(parent, entry)| entry.children.iter().map(move |child| (parent, child)))
                .filter(|(_, child)| table.get(*child).is_none())
                .filter_map(|(parent, child)| {
                    let listing = listed.get(&child)?;
                    Some((parent, child, listing.name.clone(), listing.exited))
                })
                .collect()
        };
        for (parent, child, name, exited) in ended {
            // Exited, its notice lost with its node: its parent was told
            // nothing, and its slot is freed now.
            if exited {
                self.release_child(parent, child);
                self.settle_loan(child).await;
                continue;
            }
            match cluster.kept_spec(child).await {
                Ok(None) => {}
                // It moves, or moved already.
                Ok(Some(_)) => continue,
                Err(err) => {
                    tracing::warn!(%child, lost = %loss.node, error = %err, "cluster: whether a child on a lost node moves is unknown; its slot stays held");
                    continue;
                }
            }
            self.release_child(parent, child);
            self.settle_loan(child).await;
            let reason = does_not_move(&loss.node, child);
            self.kernel
                .report_ended(child, parent, &name, &reason, unix_ms(SystemTime::now()));
        }
    }

    /// The processes here whose parent lived on lost node `loss.node` end
    /// with it, as the subtree of an exited process does, unless their
    /// parent comes back elsewhere: a config agent (its key in
    /// `hk_declared` names it), or a spawned process whose spec is kept.
    async fn lost_parents(self, loss: &Loss) {
        let Some(cluster) = self.kernel.inner.cluster() else {
            return;
        };
        let listed: HashMap<Pid, &Listing> = loss.listings.iter().map(|(p, l)| (*p, l)).collect();
        let orphaned: Vec<(Pid, String, Vec<Pid>)> = {
            let table = self.kernel.inner.table().read();
            table
                .foreign()
                .filter_map(|(parent, children)| {
                    let listing = listed.get(&parent)?;
                    Some((
                        parent,
                        listing.name.clone(),
                        children.iter().copied().collect(),
                    ))
                })
                .collect()
        };
        for (parent, name, children) in orphaned {
            let declared = match cluster.declared(&name).await {
                Ok((Standing::Live(held) | Standing::Orphaned(held), _)) => held.pid(),
                Ok((Standing::Unclaimed(pid), _)) => pid,
                Err(_) => None,
            };
            let back = declared == Some(parent)
                || match cluster.kept_spec(parent).await {
                    Ok(kept) => kept.is_some(),
                    Err(err) => {
                        tracing::warn!(%parent, lost = %loss.node, error = %err, "cluster: whether a lost parent comes back is unknown; its children here live on");
                        true
                    }
                };
            if back {
                continue;
            }
            let reason = format!(
                "{NODE_LOST}: parent {parent} ended with node {}, and does not come back",
                loss.node
            );
            for child in children {
                if let Err(err) = self
                    .kernel
                    .kill_here(Caller::Admin, child, &reason, true)
                    .await
                {
                    tracing::debug!(%child, error = %err, "cluster: an orphan of a lost node not ended");
                }
            }
        }
    }

    /// A tree of lost node `node` that does not move: under a `temporary`
    /// root, or under a config agent, which comes back by its key in
    /// `hk_declared` without it. Each of its processes that had not exited
    /// is reported exited (`node_lost`) but the config agent, and a root
    /// whose parent here was told already ([`NodeHandle::lost_children`]).
    fn ended_with_node(self, node: &str, tree: &Tree) {
        let told = tree.members.first().is_some_and(|(_, root)| {
            root.ppid != Pid::KERNEL && self.kernel.inner.table().read().get(root.ppid).is_some()
        });
        let now = unix_ms(SystemTime::now());
        for (at, (pid, listing)) in tree.members.iter().enumerate() {
            let root = at == 0;
            if listing.exited || (root && (listing.moves || told)) {
                continue;
            }
            let reason = does_not_move(node, *pid);
            self.kernel
                .report_ended(*pid, listing.ppid, &listing.name, &reason, now);
        }
    }

    /// Takes over a tree of lost node `lost` that another node offers
    /// this one (`Op::Adopt`), in the background: refused unless it is one
    /// whole tree of that node's, under a root whose key still names it
    /// and whose placement admits this node, with no PID running here.
    pub(super) async fn adopt(
        self,
        lost: String,
        epoch: u64,
        members: Vec<(Pid, Listing)>,
    ) -> crate::error::Result<()> {
        let refused = |why: String| Err(KernelError::InvalidArgument(why));
        let Some(cluster) = self.kernel.inner.cluster() else {
            return Err(KernelError::FailedPrecondition(
                "this kernel is not a node of a cluster".into(),
            ));
        };
        if self.kernel.is_stopping() {
            return Err(KernelError::ShuttingDown);
        }
        let count = members.len();
        if let Some((pid, _)) = members
            .iter()
            .find(|(_, listing)| listing.node != lost || listing.epoch != epoch)
        {
            return refused(format!(
                "an adopted tree's process {pid} is not listed as node {lost}'s (epoch {epoch})"
            ));
        }
        if let Some(pid) = {
            let table = self.kernel.inner.table().read();
            members
                .iter()
                .map(|(pid, _)| *pid)
                .find(|pid| table.get(*pid).is_some())
        } {
            return refused(format!(
                "process {pid} of an adopted tree runs here already"
            ));
        }
        let loss = Loss {
            node: lost.clone(),
            epoch,
            listings: members,
            claimed: false,
        };
        let mut found = trees(&loss);
        let tree = match (found.pop(), found.is_empty()) {
            (Some(tree), true) if tree.members.len() == count => tree,
            _ => {
                return refused(format!(
                    "an adopted tree must be one tree, under PID 1 or a process of another node, \
                     with each PID once ({count} listings given)"
                ));
            }
        };
        let root = tree.root;
        let kept = match cluster.kept_spec(root).await {
            Ok(Some((kept, _))) if kept.node == lost && kept.epoch == epoch => kept,
            Ok(_) => {
                return Err(KernelError::FailedPrecondition(format!(
                    "process {root} is not node {lost}'s to move any more"
                )));
            }
            Err(err) => return Err(KernelError::ClusterUnavailable(err.to_string())),
        };
        let placement = Placement {
            node: kept.placed_on,
            labels: kept.labels,
        };
        if !placement.admits_node(cluster.node(), cluster.labels()) {
            return Err(KernelError::FailedPrecondition(format!(
                "process {root} is placed ({}), which node {} is not",
                placement.shown(),
                cluster.node()
            )));
        }
        let kernel = self.kernel.clone();
        self.kernel
            .inner
            .tracker()
            .spawn(async move { kernel.node().take_tree(&lost, epoch, tree, false).await });
        Ok(())
    }

    /// Starts `tree` of lost node `node` (epoch `epoch`) here if its root
    /// may move here and this node wins its key; one whose placement rules
    /// this node out is offered to a live node it admits, when `may_offer`
    /// (a judge of the loss, not a node it was offered to).
    async fn take_tree(self, node: &str, epoch: u64, tree: Tree, may_offer: bool) {
        let Some(cluster) = self.kernel.inner.cluster() else {
            return;
        };
        let root = tree.root;
        let kept = match cluster.kept_spec(root).await {
            Ok(Some((kept, _))) => kept,
            // A config agent (the config keeps its spec), or one that
            // does not move (temporary).
            Ok(None) => {
                if tree.reports {
                    self.ended_with_node(node, &tree);
                }
                return;
            }
            Err(err) => {
                tracing::warn!(%root, lost = node, error = %err, "cluster: a lost node's process not taken over");
                return;
            }
        };
        // Taken over already, or its node started again and took it back.
        if kept.node != node || kept.epoch != epoch {
            return;
        }
        let placement = Placement {
            node: kept.placed_on.clone(),
            labels: kept.labels.clone(),
        };
        if !placement.admits_node(cluster.node(), cluster.labels()) {
            if may_offer {
                self.offer(cluster, node, epoch, tree, &placement).await;
            } else {
                tracing::warn!(%root, lost = node, wants = %placement.shown(), "cluster: an offered process is placed where this node is not; left");
            }
            return;
        }
        let delay = read_spec(&kept.spec, kept.ppid)
            .ok()
            .and_then(|request| self.kernel.supervision_for(&request).ok())
            .map_or(Duration::ZERO, |(restart, _)| {
                Duration::from_millis(restart.backoff_ms.first().copied().unwrap_or(0))
            });
        // Its restart delay first, unclaimed: a node that stops meanwhile
        // leaves the tree to the others.
        tokio::select! {
            biased;
            () = self.kernel.inner.stop_begun().cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
        let (kept, revision) = match cluster.kept_spec(root).await {
            Ok(Some((kept, revision))) if kept.node == node && kept.epoch == epoch => {
                (kept, revision)
            }
            Ok(_) => return,
            Err(err) => {
                tracing::warn!(%root, lost = node, error = %err, "cluster: a lost node's process not taken over");
                return;
            }
        };
        if self.kernel.is_stopping() {
            return;
        }
        match cluster.claim_spec(root, &kept, revision).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(err) => {
                tracing::debug!(%root, error = %err, "cluster: a lost node's process not claimed");
                return;
            }
        }
        let mut specs = HashMap::from([(root, (kept, None))]);
        let (mut back, mut gone) = (0usize, Vec::new());
        let mut started = Vec::new();
        for (pid, listing) in tree.members {
            if listing.exited {
                // A zombie nobody collected: gone with its node.
                if let Ok(Some((_, revision))) = cluster.kept_spec(pid).await {
                    cluster.remove_spec(pid, revision).await;
                }
                continue;
            }
            // Never two copies here (a peer's offer names what it names).
            if self.kernel.inner.table().read().get(pid).is_some() {
                tracing::warn!(%pid, lost = node, "cluster: a lost node's process runs here already; left as it is");
                continue;
            }
            let kept = match specs.remove(&pid) {
                Some(found) => Ok(found),
                None => match cluster.kept_spec(pid).await {
                    // Only what is still the lost node's: another node's is left alone.
                    Ok(Some((kept, _))) if kept.node != node || kept.epoch != epoch => {
                        tracing::warn!(%pid, lost = node, holder = %kept.node, "cluster: a lost node's process is another node's now; left");
                        continue;
                    }
                    Ok(Some((kept, revision))) => Ok((kept, Some(revision))),
                    Ok(None) => Err("temporary: it does not move".to_owned()),
                    Err(err) => Err(err.to_string()),
                },
            };
            let came = match kept {
                Ok((kept, revision)) => self.bring_back(cluster, pid, kept, revision).await,
                Err(why) => Err(Some(why)),
            };
            match came {
                Ok(()) => {
                    back += 1;
                    started.push(pid);
                }
                // Stopping: what is left keeps its key, this node's
                // (the root) or the lost node's.
                Err(None) => break,
                Err(Some(why)) => gone.push((pid, listing, why)),
            }
        }
        let now = unix_ms(SystemTime::now());
        for (pid, listing, why) in &gone {
            let reason = format!("{NODE_LOST}: node {node} was lost; did not come back: {why}");
            self.kernel
                .report_ended(*pid, listing.ppid, &listing.name, &reason, now);
            // A root's parent on another node is told there.
            if *pid == root && self.held_elsewhere(listing.ppid).is_some() {
                self.kernel
                    .tell_parent(*pid, listing.ppid, &listing.name, &reason, now);
            }
        }
        tracing::warn!(%root, from = node, back, gone = gone.len(), "cluster: processes taken over from a node that is gone");
        // Their API cron entries run here from now on.
        self.kernel.cron().take(&started).await;
    }

    /// Offers `tree` of lost node `node` to the live node with the fewest
    /// processes of those `placement` admits; it waits for its own node
    /// when there is none, or the offer fails.
    async fn offer(
        self,
        cluster: &Cluster,
        node: &str,
        epoch: u64,
        tree: Tree,
        placement: &Placement,
    ) {
        let root = tree.root;
        let mut chosen: Vec<_> = cluster
            .nodes()
            .into_iter()
            .filter(|info| !info.this && info.record.node != node && placement.admits(info))
            .collect();
        chosen.sort_by_key(|info| (info.record.load.processes, info.record.node.clone()));
        if chosen.is_empty() {
            tracing::warn!(%root, lost = node, wants = %placement.shown(), "cluster: no live node may run a lost node's process; it waits for its node");
            return;
        }
        // The least busy first; the next after a refusal.
        for info in chosen {
            let to = info.record.node;
            let op = Op::Adopt {
                lost: node.to_owned(),
                epoch,
                members: tree.members.clone(),
            };
            match cluster.call::<()>(&to, op).await {
                Ok(()) => {
                    tracing::info!(%root, lost = node, to = %to, "cluster: a lost node's process offered to a node its placement admits");
                    return;
                }
                Err(refusal) => {
                    tracing::warn!(%root, lost = node, to = %to, error = %refusal.message, "cluster: a node refused a lost node's process");
                }
            }
        }
        tracing::warn!(%root, lost = node, "cluster: no node took a lost node's process; it waits for its node");
    }

    /// Starts `pid` here as its `kept` spec says, with its waiting
    /// messages, and keeps its spec as this node's. The root's key is this
    /// node's already (`revision` is `None`); another's is rewritten. Why
    /// it did not come back, or `None` when the kernel is stopping.
    async fn bring_back(
        self,
        cluster: &Cluster,
        pid: Pid,
        kept: KeptSpec,
        revision: Option<u64>,
    ) -> Result<(), Option<String>> {
        let request = read_spec(&kept.spec, kept.ppid)
            .map_err(|why| Some(format!("its kept spawn request is unreadable: {why}")))?;
        let letters = self.letters_for(Some(pid)).await;
        match self
            .kernel
            .spawn_as(Caller::Admin, request, Birth::Restored(pid))
            .await
        {
            Ok(_) => {
                self.carry_loan(pid).await;
                self.deliver_letters(letters);
                // Kept here too, so a restart of this node brings it back.
                if self.kernel.inner.store().is_durable() {
                    self.kernel.inner.store().submit(Write::Spec {
                        pid,
                        spec: kept.spec.clone(),
                    });
                }
                if revision.is_some() {
                    let mine = KeptSpec {
                        node: cluster.node().to_owned(),
                        epoch: cluster.epoch(),
                        ..kept
                    };
                    if let Err(err) = cluster.keep_spec(pid, &mine).await {
                        tracing::warn!(%pid, error = %err, "cluster: a moved process's spec not rewritten");
                    }
                }
                Ok(())
            }
            Err(KernelError::ShuttingDown) => Err(None),
            Err(err) => {
                match revision {
                    Some(revision) => cluster.remove_spec(pid, revision).await,
                    // The root's key is this node's now.
                    None => {
                        if let Ok(Some((_, revision))) = cluster.kept_spec(pid).await {
                            cluster.remove_spec(pid, revision).await;
                        }
                    }
                }
                Err(Some(err.to_string()))
            }
        }
    }
}

/// Why process `pid` of lost node `node` ended with it.
fn does_not_move(node: &str, pid: Pid) -> String {
    format!(
        "{NODE_LOST}: node {node} was lost, and process {pid} does not move (temporary, or under \
         a parent that does not move)"
    )
}

/// The trees of `loss`: each listed process under the root it descends
/// from (a child of PID 1, or of a process on another node), parents
/// before children.
fn trees(loss: &Loss) -> Vec<Tree> {
    let by_pid: HashMap<Pid, &Listing> = loss.listings.iter().map(|(p, l)| (*p, l)).collect();
    let mut trees: HashMap<Pid, Vec<(Pid, Listing)>> = HashMap::new();
    for (pid, listing) in &loss.listings {
        let (mut at, mut hops) = (*pid, 0);
        let root = loop {
            let Some(up) = by_pid.get(&at) else {
                break None;
            };
            if up.ppid == Pid::KERNEL || !by_pid.contains_key(&up.ppid) {
                break Some(at);
            }
            at = up.ppid;
            hops += 1;
            if hops > by_pid.len() {
                break None;
            }
        };
        if let Some(root) = root {
            trees.entry(root).or_default().push((*pid, listing.clone()));
        }
    }
    let mut trees: Vec<Tree> = trees
        .into_iter()
        .map(|(root, mut members)| {
            members.sort_by_key(|(pid, listing)| (listing.depth, *pid));
            Tree {
                root,
                members,
                reports: loss.claimed,
            }
        })
        .collect();
    trees.sort_by_key(|tree| tree.root);
    trees
}

#[cfg(test)]
mod tests {
    use hivekernel_agents::{Role, Tier};

    use super::*;

    fn listed(ppid: u64, depth: u32) -> Listing {
        Listing {
            node: "a".into(),
            epoch: 1,
            ppid: Pid(ppid),
            name: "w".into(),
            role: Role::Worker,
            tier: Tier::Operational,
            depth,
            exited: false,
            started_unix_ms: 0,
            token: None,
            moves: false,
        }
    }

    #[test]
    fn a_lost_node_s_processes_form_trees_under_their_roots_parents_first() {
        // 3000 moved here before it spawned 1100: PIDs do not give the order.
        let loss = Loss {
            node: "a".into(),
            epoch: 1,
            listings: vec![
                (Pid(1101), listed(1100, 3)),
                (Pid(1100), listed(3000, 2)),
                (Pid(3000), listed(1, 1)),
                (Pid(5), listed(1, 1)),
                // Its parent is another node's: the root of a tree.
                (Pid(7), listed(99, 2)),
                (Pid(8), listed(7, 3)),
            ],
            claimed: true,
        };
        let trees = trees(&loss);
        let shown: Vec<(Pid, Vec<Pid>)> = trees
            .iter()
            .map(|t| (t.root, t.members.iter().map(|(p, _)| *p).collect()))
            .collect();
        assert_eq!(
            shown,
            vec![
                (Pid(5), vec![Pid(5)]),
                (Pid(7), vec![Pid(7), Pid(8)]),
                (Pid(3000), vec![Pid(3000), Pid(1100), Pid(1101)]),
            ]
        );
    }
}
