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
use hivekernel_agents::{ApprovalRule, Capabilities, ExitRecord, Limits, Message, Pid, Role, Tier};
use serde::{Deserialize, Serialize};

use crate::budget::Pool;
use crate::cluster::rpc::Op;
use crate::error::{KernelError, Result};
use crate::kernel::cluster::{FORWARDED_KILL, FORWARDED_SEND, FORWARDED_SPAWN, Holder};
use crate::kernel::spawn::{Birth, alive_parent};
use crate::kernel::{Caller, Kernel};
use crate::process::{Children, ProcessTable};

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

impl Kernel {
    /// On the node holding `parent`: holds a child slot of `parent` for
    /// `child`, which another node spawns (once: a child coming back
    /// after its node's loss holds it already), and lends what the child
    /// takes from it. Refused as a spawn under `parent` here would be, and
    /// for a parent that draws on a token budget, which does not reach
    /// another node, unless the child has a budget of its own (`tokens`),
    /// which is lent from it here; `held`: unless the slot is held already
    /// (a child coming back, or confirming once spawned).
    pub(super) fn lend(
        &self,
        parent: Pid,
        child: Pid,
        held: bool,
        tokens: Option<u64>,
    ) -> Result<ParentGrant> {
        let mut table = self.inner.table().write();
        self.check_running()?;
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
        let has_loan = self.inner.loans().lock().contains_key(&child);
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
        let loaned = match (&lender, tokens) {
            (Some(lender), Some(amount)) if !has_loan => {
                let loan = Pool::allocate(child, amount, Some(lender))?;
                self.inner.loans().lock().insert(child, loan);
                true
            }
            (Some(_), _) => has_loan,
            (None, _) => false,
        };
        if !entry.children.contains(child) {
            entry.children.insert(child);
            entry.live_children += 1;
        }
        let proc = &entry.proc;
        Ok(ParentGrant {
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
        })
    }

    /// On the parent's node: the budget lent to `child`, which used
    /// `used` tokens (charged, or lent on and not back) and exited, is
    /// charged that (once: a repeat finds no loan; at most the loan) and
    /// what it did not use goes back. Kept in the store as a model call's
    /// charge is.
    pub(super) fn repaid(&self, child: Pid, used: u64) {
        let loan = self.inner.loans().lock().remove(&child);
        let Some(loan) = loan else {
            return;
        };
        loan.charge(used.min(loan.allocated()));
        loan.close();
        self.keep_budgets_above(&loan);
    }

    /// On the parent's node: a loan whose child is gone without a word
    /// (its node lost, and it does not move) counts as used whole: a
    /// budget is never overdrawn.
    pub(super) fn settle_loan(&self, child: Pid) {
        let loan = self.inner.loans().lock().remove(&child);
        if let Some(loan) = loan {
            loan.charge(loan.remaining());
            loan.close();
            self.keep_budgets_above(&loan);
        }
    }

    /// Keeps what the budgets above `loan` spent, as a model call's
    /// charge does, so a restart of this node does not give it back.
    fn keep_budgets_above(&self, loan: &Pool) {
        if !self.inner.store().is_durable() {
            return;
        }
        let writes: Vec<crate::store::Write> = {
            let table = self.inner.table().read();
            let mut owner = loan.lender_owner();
            let mut writes = Vec::new();
            while let Some(pid) = owner {
                let Some(entry) = table.get(pid) else {
                    break;
                };
                let proc = &entry.proc;
                let Some(pool) = proc.own_budget() else {
                    break;
                };
                writes.push(crate::store::Write::Usage {
                    pid,
                    own: proc.usage.snapshot(),
                    subtree: proc.usage.subtree(),
                    budget_spent: Some(pool.spent()),
                });
                owner = pool.lender_owner();
            }
            writes
        };
        self.inner.store().submit_all(writes);
    }

    /// On the parent's node: the spawn of `child` failed, so nothing of
    /// its loan was spent.
    pub(super) fn cancel_loan(&self, child: Pid) {
        let loan = self.inner.loans().lock().remove(&child);
        if let Some(loan) = loan {
            loan.close();
        }
    }

    /// Tells the nodes that lent the budgets of children here what each
    /// used (`child`, its pool), once each child exited: in the
    /// background, so a slow node holds up no exit.
    pub(super) fn repay_loans(&self, repays: Vec<(Pid, Arc<Pool>)>) {
        let kernel = self.clone();
        self.inner.tracker().spawn(async move {
            let asks = repays.iter().map(|(child, pool)| {
                let kernel = &kernel;
                async move {
                    let Some((parent, node)) = pool.loaned_by() else {
                        return;
                    };
                    let op = Op::Repay {
                        parent: *parent,
                        child: *child,
                        spent: pool.consumed(),
                    };
                    if let Err(err) = kernel.forward::<()>(node, op, FORWARDED_SEND).await {
                        tracing::warn!(%child, %parent, %node, error = %err, "cluster: what a loan used not reported; it stays lent, as used");
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
        &self,
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
        let Some(cluster) = self.inner.cluster() else {
            return (children, live);
        };
        // Here, under it while it was elsewhere.
        for child in table.foreign_children(pid) {
            if table.get(child).is_some_and(|entry| entry.is_alive()) && children.insert(child) {
                live += 1;
            }
        }
        let listings = cluster.listings();
        for child in listings.children(pid) {
            let alive = listings.get(child).is_some_and(|listing| !listing.exited);
            if alive && table.get(child).is_none() && children.insert(child) {
                live += 1;
            }
        }
        (children, live)
    }

    /// What `parent` lends its child `child` when another node holds it;
    /// `None` when it lives here, or nowhere (the spawn then says which).
    pub(super) async fn borrow_parent(
        &self,
        parent: Pid,
        child: Pid,
        held: bool,
        tokens: Option<u64>,
    ) -> Result<Option<ParentGrant>> {
        if parent == Pid::KERNEL
            || self.inner.cluster().is_none()
            || self.inner.table().read().get(parent).is_some()
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
    pub(super) async fn confirm_child(&self, parent: Pid, child: Pid) {
        match self.borrow_parent(parent, child, true, None).await {
            Ok(_) => {}
            Err(KernelError::Remote(refusal)) if refused_as_gone(&refusal) => {
                let reason = format!(
                    "its parent {parent} ended or restarted before it started: {}",
                    refusal.message
                );
                let _ = self.kill_here(Caller::Admin, child, &reason, true).await;
            }
            Err(err) => {
                tracing::warn!(%parent, %child, error = %err, "cluster: a child's parent on another node could not be asked whether it still waits for it");
            }
        }
    }

    /// Frees the slot `parent`'s node held for `child`, which was not
    /// spawned after all.
    pub(super) async fn give_back(&self, parent: Pid, child: Pid) {
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
    pub(super) fn release_child(&self, parent: Pid, child: Pid) {
        let mut table = self.inner.table().write();
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
    pub(super) fn took_from_elsewhere(&self, message: &Message) {
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
    /// Answers the PIDs that exited there, leaves first.
    pub(super) async fn kill_elsewhere(&self, orphans: Vec<(Pid, Arc<str>)>) -> Vec<Pid> {
        let kills = orphans.into_iter().map(|(pid, reason)| async move {
            // The directory itself when the mirror has not listed it yet.
            let node = match self.holder(pid).await {
                Ok(Some(Holder::There(listing))) => listing.node,
                Ok(_) => return Vec::new(),
                Err(err) => {
                    tracing::warn!(%pid, error = %err, "cluster: a child on another node outlived its parent's exit");
                    return Vec::new();
                }
            };
            let op = Op::Kill {
                pid,
                reason: reason.to_string(),
                orphaned: true,
            };
            match self.forward::<Vec<Pid>>(&node, op, FORWARDED_KILL).await {
                Ok(killed) => killed,
                // Ended meanwhile.
                Err(KernelError::Remote(refusal)) if refused_as_gone(&refusal) => Vec::new(),
                Err(err) => {
                    tracing::warn!(%pid, %node, error = %err, "cluster: a child on another node outlived its parent's exit");
                    Vec::new()
                }
            }
        });
        futures::future::join_all(kills).await.concat()
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
