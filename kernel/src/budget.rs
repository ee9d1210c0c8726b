//! Token budgets that flow down the tree, and what model calls cost.
//!
//! A process given `max_tokens_total` at spawn gets its own [`Pool`], lent
//! from the pool its parent draws on; a process without one draws on its
//! nearest ancestor's. Calls are charged from the usage the provider reports,
//! in the kernel's model path, so an agent cannot under-report. When a pool's
//! owner exits, what it did not use goes back to the lender.

use std::collections::BTreeMap;
use std::sync::Arc;

use hivekernel_agents::llm::Usage;
use hivekernel_agents::{BudgetInfo, Pid};
use parking_lot::Mutex;

use crate::error::{KernelError, Result};

/// One allocated budget.
#[derive(Debug)]
pub(crate) struct Pool {
    owner: Pid,
    allocated: u64,
    /// The pool it was lent from, which gets the remainder back.
    lender: Option<Arc<Pool>>,
    /// Lent by the budget its parent on another node draws on: the parent,
    /// and the node that keeps the loan and hears what it used when the
    /// owner exits.
    loaned_by: Option<(Pid, Arc<str>)>,
    state: Mutex<PoolState>,
}

#[derive(Debug, Default)]
struct PoolState {
    /// Charged calls, plus what exited borrowers did not return.
    used: u64,
    /// Lent to live borrowers.
    lent: u64,
    /// The owner exited; nothing more is charged or lent.
    closed: bool,
    /// Tokens charged to this pool and to every pool lent from it, ever:
    /// what the store keeps, so a restart cannot hand them out again.
    spent: u64,
}

impl PoolState {
    fn remaining(&self, allocated: u64) -> u64 {
        allocated.saturating_sub(self.used.saturating_add(self.lent))
    }
}

impl Pool {
    /// A pool of `amount` (at least 1, as spawn checks) tokens for `owner`,
    /// taken from `lender` when given. Refused when the lender has less than
    /// `amount` left.
    pub(crate) fn allocate(
        owner: Pid,
        amount: u64,
        lender: Option<&Arc<Pool>>,
    ) -> Result<Arc<Pool>> {
        if let Some(lender) = lender {
            let mut state = lender.state.lock();
            lender.check_lend(&state, amount)?;
            state.lent += amount;
        }
        Ok(Pool::lent_from(owner, amount, lender))
    }

    /// A loan to `owner` made before a restart, lent from `lender` again
    /// whatever it has left now (it had it then).
    pub(crate) fn reopen(owner: Pid, amount: u64, lender: &Arc<Pool>) -> Arc<Pool> {
        {
            let mut state = lender.state.lock();
            state.lent = state.lent.saturating_add(amount);
        }
        Pool::lent_from(owner, amount, Some(lender))
    }

    /// A fresh pool of `amount` for `owner`, whose lender (if any) has
    /// counted it lent.
    fn lent_from(owner: Pid, amount: u64, lender: Option<&Arc<Pool>>) -> Arc<Pool> {
        Arc::new(Pool {
            owner,
            allocated: amount,
            lender: lender.cloned(),
            loaned_by: None,
            state: Mutex::default(),
        })
    }

    /// A pool of `amount` tokens for `owner`, lent through its parent
    /// `parent` on another node, `node`, which keeps the loan.
    pub(crate) fn on_loan(owner: Pid, amount: u64, parent: Pid, node: Arc<str>) -> Arc<Pool> {
        Arc::new(Pool {
            owner,
            allocated: amount,
            lender: None,
            loaned_by: Some((parent, node)),
            state: Mutex::default(),
        })
    }

    /// The parent on another node, and its node, that keeps this pool's loan.
    pub(crate) fn loaned_by(&self) -> Option<&(Pid, Arc<str>)> {
        self.loaned_by.as_ref()
    }

    /// The budget at the top of this one's lenders, when it is on loan
    /// from another node: the one whose spending that node hears of.
    pub(crate) fn on_loan_root(self: &Arc<Self>) -> Option<Arc<Pool>> {
        let mut at = self;
        while let Some(lender) = &at.lender {
            at = lender;
        }
        at.loaned_by.is_some().then(|| at.clone())
    }

    /// What is no longer there to spend: charged, or still lent to
    /// borrowers (once closed, what the lender keeps).
    pub(crate) fn consumed(&self) -> u64 {
        self.allocated.saturating_sub(self.remaining())
    }

    /// Tokens allocated to it.
    pub(crate) fn allocated(&self) -> u64 {
        self.allocated
    }

    /// Refuses lending `amount` when less than that is left.
    pub(crate) fn can_lend(&self, amount: u64) -> Result<()> {
        self.check_lend(&self.state.lock(), amount)
    }

    fn check_lend(&self, state: &PoolState, amount: u64) -> Result<()> {
        let left = state.remaining(self.allocated);
        if state.closed || amount > left {
            return Err(KernelError::PermissionDenied(format!(
                "max_tokens_total {amount} exceeds the {left} tokens left in the budget of \
                 process {}",
                self.owner
            )));
        }
        Ok(())
    }

    /// The process the pool was allocated to.
    pub(crate) fn owner(&self) -> Pid {
        self.owner
    }

    /// Tokens left.
    pub(crate) fn remaining(&self) -> u64 {
        self.state.lock().remaining(self.allocated)
    }

    /// Refuses a call when nothing is left, naming the budget.
    pub(crate) fn check(&self, pid: Pid) -> Result<u64> {
        let left = self.remaining();
        if left == 0 {
            return Err(KernelError::BudgetExceeded(format!(
                "process {pid} has used up its token budget (max_tokens_total {} of process {})",
                self.allocated, self.owner
            )));
        }
        Ok(left)
    }

    /// Charges the tokens of one call; they count as spent by every lender above too.
    pub(crate) fn charge(&self, tokens: u64) {
        {
            let mut state = self.state.lock();
            state.used = state.used.saturating_add(tokens);
            state.spent = state.spent.saturating_add(tokens);
        }
        let mut lender = self.lender.as_deref();
        while let Some(pool) = lender {
            let mut state = pool.state.lock();
            state.spent = state.spent.saturating_add(tokens);
            drop(state);
            lender = pool.lender.as_deref();
        }
    }

    /// Tokens spent from this pool and the pools lent from it, ever.
    /// The owner of the budget this one was lent from.
    pub(crate) fn lender_owner(&self) -> Option<Pid> {
        self.lender.as_ref().map(|lender| lender.owner)
    }

    /// Carries on after a restart with what it had `spent`, of which
    /// `borrowed` was spent by borrowers that came back (their loans hold
    /// it). Only this pool: its lenders carry their own spending.
    pub(crate) fn carry(&self, spent: u64, borrowed: u64) {
        let mut state = self.state.lock();
        state.spent = state.spent.saturating_add(spent);
        state.used = state.used.saturating_add(spent.saturating_sub(borrowed));
    }

    pub(crate) fn spent(&self) -> u64 {
        self.state.lock().spent
    }

    /// The owner exited: gives what it did not use back to the lender.
    pub(crate) fn close(&self) {
        let unused = {
            let mut state = self.state.lock();
            if state.closed {
                return;
            }
            state.closed = true;
            state.remaining(self.allocated)
        };
        if let Some(lender) = &self.lender {
            let mut state = lender.state.lock();
            state.lent = state.lent.saturating_sub(self.allocated);
            state.used = state
                .used
                .saturating_add(self.allocated.saturating_sub(unused));
        }
    }

    /// The budget as reported in GetProcess.
    pub(crate) fn info(&self) -> BudgetInfo {
        let state = self.state.lock();
        BudgetInfo {
            owner: self.owner,
            max_tokens_total: self.allocated,
            used: state.used,
            remaining: state.remaining(self.allocated),
        }
    }
}

/// Price of one model, in US dollars per million tokens (a missing one is 0).
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Price {
    /// Per million prompt tokens.
    pub input_per_million: f64,
    /// Per million completion tokens.
    pub output_per_million: f64,
}

impl Eq for Price {}

impl Price {
    /// What `usage` costs, in billionths of a dollar.
    pub(crate) fn cost_nano_usd(&self, usage: Usage) -> u64 {
        // Dollars per million tokens = thousandths of a nano-dollar per token.
        let nanos = usage.prompt_tokens as f64 * self.input_per_million * 1e3
            + usage.completion_tokens as f64 * self.output_per_million * 1e3;
        nanos.round() as u64
    }
}

/// Prices by model name (the logical name a process names, or the provider's id).
pub type Prices = BTreeMap<String, Price>;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_child_budget_comes_from_the_parent_and_its_remainder_goes_back() {
        let parent = Pool::allocate(Pid(2), 1000, None).unwrap();
        let child = Pool::allocate(Pid(3), 600, Some(&parent)).unwrap();
        assert_eq!(parent.remaining(), 400);
        let err = Pool::allocate(Pid(4), 401, Some(&parent)).unwrap_err();
        assert!(
            err.to_string().contains("401 exceeds the 400 tokens left"),
            "{err}"
        );
        child.charge(250);
        assert_eq!(child.remaining(), 350);
        child.close();
        assert_eq!(parent.remaining(), 750, "350 unused tokens came back");
        child.close();
        assert_eq!(
            parent.remaining(),
            750,
            "closing twice returns nothing more"
        );
    }

    #[test]
    fn what_borrowers_spend_counts_as_spent_by_every_lender() {
        let top = Pool::allocate(Pid(2), 1000, None).unwrap();
        let mid = Pool::allocate(Pid(3), 500, Some(&top)).unwrap();
        let leaf = Pool::allocate(Pid(4), 100, Some(&mid)).unwrap();
        leaf.charge(30);
        mid.charge(20);
        assert_eq!((top.spent(), mid.spent(), leaf.spent()), (50, 50, 30));
        leaf.close();
        mid.close();
        assert_eq!(
            top.spent(),
            50,
            "closing returns the rest, not the spending"
        );
        assert_eq!(top.remaining(), 950);
    }

    #[test]
    fn an_exhausted_budget_refuses_calls() {
        let pool = Pool::allocate(Pid(2), 10, None).unwrap();
        pool.charge(12);
        assert_eq!(pool.remaining(), 0);
        let err = pool.check(Pid(5)).unwrap_err();
        assert!(matches!(err, KernelError::BudgetExceeded(_)), "{err}");
        assert!(err.to_string().contains("process 5"), "{err}");
    }

    #[test]
    fn cost_follows_the_price_per_million() {
        let price = Price {
            input_per_million: 2.5,
            output_per_million: 10.0,
        };
        let usage = Usage {
            prompt_tokens: 1000,
            completion_tokens: 100,
        };
        // 1000 * 2.5e-6 + 100 * 10e-6 = 0.0035 dollars.
        assert_eq!(price.cost_nano_usd(usage), 3_500_000);
    }
}
