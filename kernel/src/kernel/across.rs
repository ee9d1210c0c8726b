//! Children on another node than their parent's (docs/CLUSTER.md,
//! "Subtrees across nodes").
//!
//! The parent's node keeps the parent's side: a child slot (counted in
//! its live children, listed in its children) held for the child from its
//! spawn until the node hears that it ended. The child's node keeps the
//! child: it asks the parent's node to *lend* what a child takes from its
//! parent (capabilities, tools, tier, limits, depth, model and prompt,
//! approval rules, skill directories) and runs every spawn rule against
//! that, as it would against a parent in its own table. The child's exit
//! reaches the parent as its `child_exited` notice, through the parent's
//! lane, and the parent's node frees the slot as it takes the notice. An
//! exit of the parent reaches the child's node as a kill of its subtree
//! there.

use std::path::PathBuf;
use std::sync::Arc;

use hivekernel_agents::message::kinds;
use hivekernel_agents::{
    ApprovalRule, Capabilities, ExitRecord, Killed, Limits, Message, Pid, Role, Tier, Unreached,
};
use serde::{Deserialize, Serialize};

use crate::budget::Pool;
use crate::cluster::rpc::Op;
use crate::cluster::{Cluster, KeptLoan};
use crate::error::{KernelError, Result};
use crate::kernel::Caller;
use crate::kernel::cluster::NodeHandle;
use crate::kernel::cluster::{FORWARDED_KILL, FORWARDED_SEND, FORWARDED_SPAWN, Holder};
use crate::kernel::spawn::{Birth, alive_parent};
use crate::process::{Children, ProcessTable};

/// When a repay is told to the lending node: at once, then again while it
/// does not answer.
const REPAY_AGAIN: [std::time::Duration; 3] = [
    std::time::Duration::ZERO,
    std::time::Duration::from_secs(1),
    std::time::Duration::from_secs(3),
];

/// What a child on another node takes from its parent, as the parent's
/// node lends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ParentGrant {
    pub(crate) pid: Pid,
    pub(crate) role: Role,
    pub(crate) tier: Tier,
    pub(crate) caps: Capabilities,
    pub(crate) tools: Arc<[String]>,
    pub(crate) model: Arc<str>,
    pub(crate) system_prompt: Arc<str>,
    pub(crate) limits: Limits,
    pub(crate) depth: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) approvals: Option<Vec<ApprovalRule>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) skill_dirs: Option<Arc<[PathBuf]>>,
    /// The parent moves with its tree after a loss, so the child may too.
    pub(crate) spec_in_cluster: bool,
    /// The child's own budget was lent from the budget the parent draws
    /// on; its node keeps the loan.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) loaned: bool,
    /// The node that lent it (set by the borrower, never sent).
    #[serde(skip)]
    pub(crate) node: Arc<str>,
}

impl<'k> NodeHandle<'k> {
    /// On the node holding `parent`: holds a child slot of `parent` for
    /// `child`, which another node spawns (once: a child coming back
    /// after its node's loss holds it already), and lends what the child
    /// takes from it. Refused as a spawn under `parent` here would be, and
    /// for a parent that draws on a token budget, which does not reach
    /// another node, unless the child has a budget of its own (`tokens`),
    /// which is lent from it here; `held`: unless the slot is held already
    /// (a child coming back, or confirming once spawned). Answers too the
    /// loan it opened, if it opened one: the owner of the budget lent
    /// from, and the amount.
    fn lend(
        self,
        parent: Pid,
        child: Pid,
        held: bool,
        tokens: Option<u64>,
    ) -> Result<(ParentGrant, Option<(Pid, u64)>)> {
        let mut table = self.kernel.inner.table().write();
        self.kernel.check_running()?;
        alive_parent(parent, table.get(parent))?;
        if table.get(child).is_some() {
            return Err(KernelError::FailedPrecondition(format!(
                "process {child} runs on this node, as a child of process {parent}"
            )));
        }
        let Some(entry) = table.get_mut(parent) else {
            return Err(KernelError::NotFound(parent));
        };
        if held && !entry.children.contains(child) {
            return Err(KernelError::FailedPrecondition(format!(
                "process {parent} holds no slot for process {child}: it ended or restarted \
                 since"
            )));
        }
        let lender = entry.proc.budget.clone();
        let has_loan = self.kernel.inner.loans().lock().contains_key(&child);
        if let Some(pool) = &lender
            && tokens.is_none()
            && !has_loan
            && !held
        {
            return Err(KernelError::FailedPrecondition(format!(
                "process {parent} draws on the token budget of process {}: a child on another \
                 node needs a budget of its own (limits.max_tokens_total), lent from it",
                pool.owner()
            )));
        }
        if !entry.children.contains(child) {
            let max = entry.proc.limits.max_children;
            if entry.live_children >= max {
                return Err(KernelError::TooManyChildren {
                    parent,
                    count: entry.live_children,
                    max,
                });
            }
        }
        // Lent once: a child coming back, or confirming, keeps its loan.
        let (loaned, opened) = match (&lender, tokens) {
            (Some(lender), Some(amount)) if !has_loan => {
                let loan = Pool::allocate(child, amount, Some(lender))?;
                self.kernel.inner.loans().lock().insert(child, loan);
                (true, Some((lender.owner(), amount)))
            }
            (Some(_), _) => (has_loan, None),
            (None, _) => (false, None),
        };
        if !entry.children.contains(child) {
            entry.children.insert(child);
            entry.live_children += 1;
        }
        let proc = &entry.proc;
        let grant = ParentGrant {
            pid: parent,
            role: proc.ctx.role,
            tier: proc.ctx.tier,
            caps: proc.caps,
            tools: proc.ctx.tools.clone(),
            model: proc.ctx.model.clone(),
            system_prompt: proc.ctx.system_prompt.clone(),
            limits: proc.limits,
            depth: entry.depth,
            approvals: proc.approvals.as_deref().cloned(),
            skill_dirs: proc.skill_dirs.clone(),
            spec_in_cluster: proc.spec_in_cluster,
            loaned,
            node: Arc::from(""),
        };
        Ok((grant, opened))
    }

    /// [`NodeHandle::lend`], with a loan it opens kept in the cluster
    /// (`hk_loans`) before the child's node hears of it. A loan that
    /// cannot be kept is refused, and nothing is held for the child. A
    /// child coming back whose loan this node does not hold (it started
    /// again, and has not read its records yet) gets it from its record.
    pub(super) async fn lend_kept(
        self,
        parent: Pid,
        child: Pid,
        held: bool,
        tokens: Option<u64>,
    ) -> Result<ParentGrant> {
        let Some(cluster) = self.kernel.inner.cluster() else {
            return self
                .lend(parent, child, held, tokens)
                .map(|(grant, _)| grant);
        };
        if held && tokens.is_some() && !self.kernel.inner.loans().lock().contains_key(&child) {
            let _records = self.kernel.inner.loan_records().lock().await;
            match cluster.loan(child).await {
                Ok(Some(kept)) => self.match_record(cluster, child, kept, true).await,
                Ok(None) => {}
                Err(err) => {
                    return Err(KernelError::ClusterUnavailable(format!(
                        "the loan to process {child} could not be read: {err}"
                    )));
                }
            }
        }
        let (grant, opened) = self.lend(parent, child, held, tokens)?;
        let Some((lender, amount)) = opened else {
            return Ok(grant);
        };
        let loan = KeptLoan {
            node: cluster.node().to_owned(),
            parent,
            lender,
            amount,
            spent: 0,
            repaid: false,
        };
        if let Err(err) = cluster.open_loan(child, &loan).await {
            self.forget_loan(child);
            if !held {
                self.release_child(parent, child);
            }
            return Err(KernelError::ClusterUnavailable(format!(
                "the loan of {amount} tokens to process {child} could not be kept: {err}"
            )));
        }
        Ok(grant)
    }

    /// On the parent's node: the budget lent to `child`, which used
    /// `used` tokens (charged, or lent on and not back) and exited, is
    /// charged that (once: a repeat finds no loan; at most the loan) and
    /// what it did not use goes back. Kept in the store as a model call's
    /// charge is, then removed from the cluster. A loan this node does
    /// not hold (it started again, and has not read its records yet) is
    /// charged from its record.
    pub(super) async fn repaid(self, child: Pid, used: u64) {
        let loan = self.kernel.inner.loans().lock().remove(&child);
        if let Some(loan) = loan {
            self.charge_loan(child, &loan, used).await;
            return;
        }
        let Some(cluster) = self.kernel.inner.cluster() else {
            return;
        };
        let _records = self.kernel.inner.loan_records().lock().await;
        match cluster.loan(child).await {
            Ok(Some(kept)) if kept.repaid => self.match_record(cluster, child, kept, false).await,
            Ok(_) => {}
            Err(err) => {
                tracing::warn!(%child, error = %err, "cluster: a repaid loan not read; it is charged at this node's next start");
            }
        }
    }

    /// Charges `loan` to `child` what it `used` (at most the loan), gives
    /// the rest back, keeps what the budgets above it spent, and only
    /// then removes its record: a crash in between charges it again at
    /// the next start, never not at all.
    async fn charge_loan(self, child: Pid, loan: &Pool, used: u64) {
        loan.charge(used.min(loan.allocated()));
        loan.close();
        if let Err(err) = self.keep_budgets(loan.lender_owner()).await {
            tracing::warn!(%child, error = %err, "what a loan used was charged but not kept; its record stays, to be charged at the next start");
            return;
        }
        if let Some(cluster) = self.kernel.inner.cluster() {
            cluster.close_loan(child).await;
        }
    }

    /// On the parent's node: a loan whose child is gone without a word
    /// (its node lost: it does not move, or it had exited) is charged what
    /// its node last reported it spent, or whole when nothing can be
    /// read: a budget is not overdrawn.
    pub(super) async fn settle_loan(self, child: Pid) {
        let loan = self.kernel.inner.loans().lock().remove(&child);
        let Some(loan) = loan else {
            return;
        };
        let reported = match self.kernel.inner.cluster() {
            Some(cluster) => cluster.loan(child).await,
            None => Ok(None),
        };
        let used = match reported {
            Ok(Some(kept)) => kept.spent,
            Ok(None) => loan.allocated(),
            Err(err) => {
                tracing::warn!(%child, error = %err, "cluster: what a lost child spent of its loan is unknown; charged whole");
                loan.allocated()
            }
        };
        self.charge_loan(child, &loan, used).await;
    }

    /// After this node's restart: the loans it made to children on
    /// other nodes (by its name: those of its former epochs), from their
    /// records ([`NodeHandle::match_record`]).
    pub(super) async fn reopen_loans(self) {
        let Some(cluster) = self.kernel.inner.cluster() else {
            return;
        };
        let children = match cluster.children_on_loan().await {
            Ok(children) => children,
            Err(err) => {
                tracing::warn!(error = %err, "cluster: loans to children on other nodes not read back; what they spend is not charged here");
                return;
            }
        };
        for child in children {
            // Read under the lock: a repay may come meanwhile.
            let _records = self.kernel.inner.loan_records().lock().await;
            match cluster.loan(child).await {
                Ok(Some(kept)) => self.match_record(cluster, child, kept, false).await,
                Ok(None) => {}
                Err(err) => {
                    tracing::warn!(%child, error = %err, "cluster: a loan not read back; what its child spends is not charged here");
                }
            }
        }
    }

    /// Matches the loan this node made to `child`, as its record `kept`
    /// says, with the budgets here, under `loan_records`, when this node
    /// does not hold it: one repaid is charged; an open one whose child
    /// lives (`asked`: it is asking for it; or listed alive, or its spec
    /// kept to move) is lent again from its lender's budget, whatever that
    /// has left (it had it then); one whose child is gone is charged what
    /// it last reported; one whose lender did not come back is removed.
    async fn match_record(self, cluster: &Cluster, child: Pid, kept: KeptLoan, asked: bool) {
        if kept.node != cluster.node() || self.kernel.inner.loans().lock().contains_key(&child) {
            return;
        }
        let lender = self.own_budget(kept.lender);
        let Some(lender) = lender else {
            tracing::info!(%child, lender = %kept.lender, "cluster: a loan whose lender did not come back is removed");
            cluster.close_loan(child).await;
            return;
        };
        let loan = Pool::reopen(child, kept.amount, &lender);
        let lives = asked
            || !kept.repaid && {
                let listed = cluster.listings().get(child).map(|listing| !listing.exited);
                match listed {
                    Some(alive) => alive,
                    None => matches!(cluster.kept_spec(child).await, Ok(Some(_))),
                }
            };
        if kept.repaid || !lives {
            self.charge_loan(child, &loan, kept.spent).await;
        } else {
            self.kernel.inner.loans().lock().insert(child, loan);
        }
    }

    /// The budget `pid` owns, if it runs here and owns one.
    fn own_budget(self, pid: Pid) -> Option<Arc<Pool>> {
        let table = self.kernel.inner.table().read();
        let proc = &table.get(pid)?.proc;
        proc.budget
            .clone()
            .filter(|pool| pool.owner() == proc.ctx.pid)
    }

    /// A child back as `pid` on the node of its parent, which lent it a
    /// budget of `amount` while it ran on another node (lost since): the
    /// loan, from the same `lender`, is its budget here.
    pub(super) fn loan_back(
        self,
        pid: Pid,
        birth: Birth,
        amount: u64,
        lender: Option<&Arc<Pool>>,
    ) -> Option<Arc<Pool>> {
        let lender = lender?;
        if !matches!(birth, Birth::Restored(_)) {
            return None;
        }
        let mut loans = self.kernel.inner.loans().lock();
        let loan = loans.get(&pid)?;
        if loan.allocated() != amount || loan.lender_owner() != Some(lender.owner()) {
            return None;
        }
        loans.remove(&pid)
    }

    /// On the node a child on loan moved to, before it takes a message:
    /// its budget carries on from what its former node last reported it
    /// spent, kept in this node's store. Moved to its parent's node, the
    /// loan is its budget here ([`NodeHandle::loan_back`]), charged that, and
    /// the cluster no longer keeps it.
    pub(super) async fn carry_loan(self, child: Pid) {
        let Some(cluster) = self.kernel.inner.cluster() else {
            return;
        };
        let Some(pool) = self.own_budget(child) else {
            return;
        };
        match cluster.loan(child).await {
            Ok(Some(kept)) if pool.loaned_by().is_some() => {
                pool.carry(kept.spent, 0);
                if let Err(err) = self.keep_budgets(Some(child)).await {
                    tracing::warn!(%child, error = %err, "what a moved child spent of its loan not kept");
                }
                cluster.report_loan(child, pool.spent());
            }
            Ok(Some(kept)) if kept.node == cluster.node() && !kept.repaid => {
                pool.charge(kept.spent.min(pool.allocated()));
                if let Err(err) = self.keep_budgets(Some(child)).await {
                    tracing::warn!(%child, error = %err, "what a loan used was charged but not kept");
                    return;
                }
                cluster.close_loan(child).await;
            }
            Ok(_) => {}
            Err(err) => {
                tracing::warn!(%child, error = %err, "cluster: what a moved child spent of its loan is unknown; it starts it afresh");
            }
        }
    }

    /// Keeps what the budget `owner` owns spent, and what each budget it
    /// was lent from spent, as a model call's charge does, so a restart of
    /// this node does not give it back.
    async fn keep_budgets(
        self,
        owner: Option<Pid>,
    ) -> std::result::Result<(), crate::store::StoreError> {
        if !self.kernel.inner.store().is_durable() {
            return Ok(());
        }
        let writes: Vec<crate::store::Write> = {
            let table = self.kernel.inner.table().read();
            let mut owner = owner;
            let mut writes = Vec::new();
            while let Some(pid) = owner {
                let Some(entry) = table.get(pid) else {
                    break;
                };
                let Some(pool) = entry.proc.own_budget() else {
                    break;
                };
                writes.push(super::llm::kept(pid, &entry.proc));
                owner = pool.lender_owner();
            }
            writes
        };
        self.kernel.inner.store().commit_all(writes).await
    }

    /// On the parent's node: the spawn of `child` failed, so nothing of
    /// its loan was spent, and the cluster no longer keeps it.
    pub(super) async fn cancel_loan(self, child: Pid) {
        if self.forget_loan(child)
            && let Some(cluster) = self.kernel.inner.cluster()
        {
            cluster.close_loan(child).await;
        }
    }

    /// Gives the loan to `child` back whole, here only; whether there was one.
    fn forget_loan(self, child: Pid) -> bool {
        let loan = self.kernel.inner.loans().lock().remove(&child);
        loan.inspect(|loan| loan.close()).is_some()
    }

    /// Tells the nodes that lent the budgets of children here what each
    /// used (`child`, its pool), once each child exited: first in its
    /// record (so a lending node down now charges it at its next start),
    /// then to that node, asked again 1 s and 4 s later while it does not
    /// answer. In the background, so a slow node holds up no exit.
    pub(super) fn repay_loans(self, repays: Vec<(Pid, Arc<Pool>)>) {
        let kernel = self.kernel.clone();
        let shutdown = self.kernel.inner.shutdown().clone();
        self.kernel.inner.tracker().spawn(async move {
            let asks = repays.iter().map(|(child, pool)| {
                let kernel = &kernel;
                let shutdown = &shutdown;
                async move {
                    let Some((parent, node)) = pool.loaned_by() else {
                        return;
                    };
                    let used = pool.consumed();
                    if let Some(cluster) = kernel.inner.cluster()
                        && let Err(err) = cluster.repay_loan(*child, used).await
                    {
                        tracing::warn!(%child, %parent, %node, error = %err, "cluster: what a loan used not kept in its record");
                    }
                    let op = Op::Repay {
                        parent: *parent,
                        child: *child,
                        spent: used,
                    };
                    let mut error = None;
                    for wait in REPAY_AGAIN {
                        // The first is sent even when stopping.
                        tokio::select! {
                            biased;
                            () = tokio::time::sleep(wait) => {}
                            () = shutdown.cancelled() => break,
                        }
                        match kernel.node().forward::<()>(node, op.clone(), FORWARDED_SEND).await {
                            Ok(()) => return,
                            Err(err) => error = Some(err),
                        }
                    }
                    if let Some(err) = error {
                        tracing::warn!(%child, %parent, %node, error = %err, "cluster: what a loan used not reported; its node charges it from its record at its next start");
                    }
                }
            });
            futures::future::join_all(asks).await;
        });
    }

    /// The children that process `pid`, coming back as the PID it had
    /// (after a restart of its node, or a move), had on other nodes: those
    /// the directory lists alive under it, and those here. Another node
    /// kept their slots; this one does now.
    pub(super) fn children_listed(
        self,
        table: &ProcessTable,
        pid: Pid,
        birth: Birth,
    ) -> (Children, u32) {
        let mut children = Children::default();
        let mut live = 0;
        // A new process has none; a config agent replaced after a reload
        // had its children ended.
        if matches!(birth, Birth::New { .. } | Birth::Replaced(_)) {
            return (children, live);
        }
        let Some(cluster) = self.kernel.inner.cluster() else {
            return (children, live);
        };
        // Here, under it while it was elsewhere, and on other nodes; taken
        // in PID order (the order they came in is not known any more).
        let listings = cluster.listings();
        let mut found: std::collections::BTreeSet<Pid> = table
            .foreign_children(pid)
            .filter(|&child| table.get(child).is_some_and(|entry| entry.is_alive()))
            .collect();
        found.extend(listings.children(pid).filter(|&child| {
            let alive = listings.get(child).is_some_and(|listing| !listing.exited);
            alive && table.get(child).is_none()
        }));
        for child in found {
            if children.insert(child) {
                live += 1;
            }
        }
        (children, live)
    }

    /// What `parent` lends its child `child` when another node holds it;
    /// `None` when it lives here, or nowhere (the spawn then says which).
    pub(super) async fn borrow_parent(
        self,
        parent: Pid,
        child: Pid,
        held: bool,
        tokens: Option<u64>,
    ) -> Result<Option<ParentGrant>> {
        if parent == Pid::KERNEL
            || self.kernel.inner.cluster().is_none()
            || self.kernel.inner.table().read().get(parent).is_some()
        {
            return Ok(None);
        }
        let Some(Holder::There(listing)) = self.holder(parent).await? else {
            return Ok(None);
        };
        let op = Op::Lend {
            parent,
            child,
            held,
            tokens,
        };
        let mut lent: ParentGrant = self.forward(&listing.node, op, FORWARDED_SPAWN).await?;
        lent.node = Arc::from(listing.node.as_str());
        if lent.pid != parent {
            return Err(KernelError::FailedPrecondition(format!(
                "node {} lent process {} for parent {parent}",
                listing.node, lent.pid
            )));
        }
        Ok(Some(lent))
    }

    /// Once `child` runs here: confirms that its parent on another node
    /// still holds its slot. A parent that ended or restarted meanwhile
    /// (its subtree ended without this child, not listed yet) did not:
    /// the child ends, as an orphan.
    pub(super) async fn confirm_child(self, parent: Pid, child: Pid) {
        match self.borrow_parent(parent, child, true, None).await {
            Ok(_) => {}
            Err(KernelError::Remote(refusal)) if refused_as_gone(&refusal) => {
                let reason = format!(
                    "its parent {parent} ended or restarted before it started: {}",
                    refusal.message
                );
                let _ = self
                    .kernel
                    .kill_here(Caller::Admin, child, &reason, true)
                    .await;
            }
            Err(err) => {
                tracing::warn!(%parent, %child, error = %err, "cluster: a child's parent on another node could not be asked whether it still waits for it");
            }
        }
    }

    /// Frees the slot `parent`'s node held for `child`, which was not
    /// spawned after all.
    pub(super) async fn give_back(self, parent: Pid, child: Pid) {
        let Some(node) = self.held_elsewhere(parent) else {
            return;
        };
        let op = Op::Release { parent, child };
        if let Err(err) = self.forward::<()>(&node, op, FORWARDED_SPAWN).await {
            tracing::warn!(%parent, %child, %node, error = %err, "cluster: a child slot held for a spawn that failed was not freed");
        }
    }

    /// On the parent's node: `child`, on another node, ended (or was
    /// never spawned), so `parent` no longer holds a slot for it.
    pub(super) fn release_child(self, parent: Pid, child: Pid) {
        let mut table = self.kernel.inner.table().write();
        // A child of this node is counted by its own exit and reap.
        if table.get(child).is_some() {
            return;
        }
        if let Some(entry) = table.get_mut(parent)
            && entry.children.contains(child)
        {
            entry.children.remove(child);
            entry.live_children = entry.live_children.saturating_sub(1);
        }
    }

    /// A message from another node, before its receiver takes it: a
    /// `child_exited` notice frees the slot its receiver held for a child
    /// there.
    pub(super) fn took_from_elsewhere(self, message: &Message) {
        if message.from != Pid::KERNEL || message.kind != kinds::CHILD_EXITED {
            return;
        }
        if let Ok(record) = serde_json::from_str::<ExitRecord>(&message.payload)
            && record.ppid == message.to
        {
            self.release_child(record.ppid, record.pid);
        }
    }

    /// Kills, on the nodes holding them, the children of this node's
    /// processes that an exit here took with it, and their subtrees
    /// there; each with the reason its ancestor's exit gave.
    /// Answers the PIDs that exited there, leaves first, and what could
    /// not be reached: a child whose node does not answer (dead, paused,
    /// cut off) is named, with the part of its subtree on that node, and
    /// the parts below it on other nodes, which the mirror shows, are
    /// killed directly.
    pub(super) fn kill_elsewhere(
        self,
        orphans: Vec<(Pid, Arc<str>)>,
    ) -> futures::future::BoxFuture<'k, Killed> {
        Box::pin(async move {
            let kills = orphans
                .into_iter()
                .map(|(pid, reason)| self.kill_orphan(pid, reason));
            let mut killed = Killed::default();
            for part in futures::future::join_all(kills).await {
                killed.extend(part);
            }
            killed
        })
    }

    /// [`NodeHandle::kill_elsewhere`] of one child, `pid`.
    async fn kill_orphan(self, pid: Pid, reason: Arc<str>) -> Killed {
        // The directory itself when the mirror has not listed it yet.
        let node = match self.holder(pid).await {
            Ok(Some(Holder::There(listing))) => listing.node,
            // Below a process on a node that did not answer, one of this
            // node's own.
            Ok(Some(Holder::Here)) => {
                return self
                    .kernel
                    .kill_here(Caller::Admin, pid, &reason, true)
                    .await
                    .unwrap_or_default();
            }
            Ok(None) => return Killed::default(),
            Err(err) => {
                tracing::warn!(%pid, error = %err, "cluster: a child on another node outlived its parent's exit");
                return Killed::default();
            }
        };
        let op = Op::Kill {
            pid,
            reason: reason.to_string(),
            orphaned: true,
        };
        let error = match self.forward::<Killed>(&node, op, FORWARDED_KILL).await {
            Ok(killed) => return killed,
            // Ended meanwhile.
            Err(KernelError::Remote(refusal)) if refused_as_gone(&refusal) => {
                return Killed::default();
            }
            Err(err) => err.to_string(),
        };
        tracing::warn!(%pid, %node, %error, "cluster: a child on a node that does not answer outlives its parent's exit");
        // What of its subtree lives on that node is out of reach too; what
        // lives below that, elsewhere, is ended from here.
        let (unreached, beyond) = self.beyond(pid, &node);
        let mut killed = Killed {
            exited: Vec::new(),
            unreached: unreached
                .into_iter()
                .map(|pid| Unreached {
                    pid,
                    node: node.clone(),
                    error: error.clone(),
                })
                .collect(),
        };
        if !beyond.is_empty() {
            let inherited: Arc<str> = Arc::from(format!(
                "{reason} (its ancestor {pid} on node {node} could not be reached)"
            ));
            let orphans = beyond
                .into_iter()
                .map(|pid| (pid, inherited.clone()))
                .collect();
            // Leaves first: the parts out of reach are named after those
            // below them ended.
            let mut below = self.kill_elsewhere(orphans).await;
            below.unreached.append(&mut killed.unreached);
            killed = below;
        }
        killed
    }

    /// `pid`'s subtree as the mirror shows it, split at node `node`: the
    /// processes of it that node holds (`pid` first), and the topmost of
    /// those below them that another node holds (this one included).
    fn beyond(self, pid: Pid, node: &str) -> (Vec<Pid>, Vec<Pid>) {
        let Some(cluster) = self.kernel.inner.cluster() else {
            return (vec![pid], Vec::new());
        };
        let listings = cluster.listings();
        let mut on_node = vec![pid];
        let mut elsewhere = Vec::new();
        let mut next = 0;
        while let Some(&parent) = on_node.get(next) {
            next += 1;
            for child in listings.children(parent) {
                match listings.get(child) {
                    Some(listing) if listing.node == node => on_node.push(child),
                    Some(_) => elsewhere.push(child),
                    None => {}
                }
            }
        }
        // Children the mirror lists of this node's own processes are not
        // in it: this node's table has them.
        drop(listings);
        {
            let table = self.kernel.inner.table().read();
            for (child, entry) in table.iter() {
                if entry.is_alive() && on_node.contains(&entry.ppid) && !elsewhere.contains(&child)
                {
                    elsewhere.push(child);
                }
            }
        }
        (on_node, elsewhere)
    }
}

/// Whether another node refused because the process it was asked about
/// is gone, or no longer what was asked of it (it exited, or restarted).
fn refused_as_gone(refusal: &hivekernel_agents::SyscallError) -> bool {
    matches!(
        refusal.kind,
        hivekernel_agents::ErrorKind::NotFound | hivekernel_agents::ErrorKind::FailedPrecondition
    )
}
