//! Token budgets lent to a child on another node (`hk_loans`, key = the
//! child's PID; docs/CLUSTER.md, "Subtrees across nodes").
//!
//! The lending node writes the record when it lends, before the child's
//! node hears the loan is granted, and removes it once the loan is
//! charged. The child's node writes what the child has spent after each
//! model call (coalesced: the latest figure per child, written in the
//! background) and, as the child exits, what it used, marked repaid. So
//! the loan outlives either node: a lending node started again reopens
//! the loans it made (and charges those repaid while it was down), and a
//! child that moves after its node's loss carries on from what it had
//! reported spent.

use std::collections::HashMap;

use async_nats::jetstream::kv;
use bytes::Bytes;
use hivekernel_agents::Pid;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::{Cluster, ClusterError};

/// The bucket of loans across nodes.
pub(super) const LOANS: &str = "hk_loans";

/// A compare-and-set lost this many times in a row gives up (each loss
/// is another write to the same loan landing first).
const AMEND_TRIES: usize = 5;

/// A loan as the cluster keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptLoan {
    /// The node that lent it and keeps it in its memory.
    pub node: String,
    /// The child's parent.
    pub parent: Pid,
    /// The owner of the budget it was lent from (the parent, or the
    /// ancestor whose budget the parent draws on).
    pub lender: Pid,
    /// Tokens lent.
    pub amount: u64,
    /// Tokens the child (and the budgets it lent on) spent, as its node
    /// last reported; once `repaid`, what it used in all.
    #[serde(default)]
    pub spent: u64,
    /// The child exited; `spent` is final and waits to be charged.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub repaid: bool,
}

/// What children on loan here spent, waiting to be written (the latest
/// figure per child: one entry per process on loan at most).
#[derive(Debug, Default)]
pub(super) struct Reports {
    pending: Mutex<HashMap<Pid, u64>>,
    wake: tokio::sync::Notify,
}

fn key(child: Pid) -> String {
    child.0.to_string()
}

impl Cluster {
    /// Keeps the loan this node made to `child` (over any record a former
    /// incarnation of it left).
    pub(crate) async fn open_loan(&self, child: Pid, loan: &KeptLoan) -> Result<(), ClusterError> {
        let value = serde_json::to_vec(loan)
            .map_err(|err| ClusterError::JetStream(format!("encoding a loan: {err}")))?;
        self.loans
            .put(key(child), Bytes::from(value))
            .await
            .map_err(|err| {
                ClusterError::jetstream(
                    &format!("keeping the loan to process {child} in {LOANS}"),
                    err,
                )
            })?;
        Ok(())
    }

    /// The loan kept for `child`, if any.
    pub(crate) async fn loan(&self, child: Pid) -> Result<Option<KeptLoan>, ClusterError> {
        Ok(self.loan_entry(child).await?.map(|(loan, _)| loan))
    }

    async fn loan_entry(&self, child: Pid) -> Result<Option<(KeptLoan, u64)>, ClusterError> {
        let what = || format!("reading the loan to process {child} in {LOANS}");
        let entry = self
            .loans
            .entry(key(child))
            .await
            .map_err(|err| ClusterError::jetstream(&what(), err))?;
        let Some(entry) = entry.filter(|entry| entry.operation == kv::Operation::Put) else {
            return Ok(None);
        };
        let loan = serde_json::from_slice::<KeptLoan>(&entry.value)
            .map_err(|err| ClusterError::JetStream(format!("{}: {err}", what())))?;
        Ok(Some((loan, entry.revision)))
    }

    /// Removes the loan to `child`: charged, settled or never used.
    /// Tried a few times; a failure is said in the log, and the record
    /// waits for this node's next start, which charges it again: twice
    /// rather than not at all.
    pub(crate) async fn close_loan(&self, child: Pid) {
        let mut failed = None;
        for _ in 0..AMEND_TRIES {
            match self.loans.delete(key(child)).await {
                Ok(()) => return,
                Err(err) => failed = Some(err),
            }
        }
        if let Some(err) = failed {
            tracing::warn!(%child, error = %err, "cluster: a closed loan stays in {LOANS}");
        }
    }

    /// On the child's node: `child`, on loan, has spent `spent` in all;
    /// written in the background, the latest figure only.
    pub(crate) fn report_loan(&self, child: Pid, spent: u64) {
        {
            let mut pending = self.loan_reports.pending.lock();
            let at = pending.entry(child).or_default();
            *at = (*at).max(spent);
        }
        self.loan_reports.wake.notify_one();
    }

    /// On the child's node: `child` exited having used `used` of its
    /// loan. Answers the loan, marked repaid, or `None` when there is no
    /// record (its lender closed it, or it was made before records were).
    pub(crate) async fn repay_loan(
        &self,
        child: Pid,
        used: u64,
    ) -> Result<Option<KeptLoan>, ClusterError> {
        self.loan_reports.pending.lock().remove(&child);
        self.amend_loan(child, |loan| {
            loan.spent = used;
            loan.repaid = true;
        })
        .await
    }

    /// Writes the reports waiting, until the node stops.
    pub(super) async fn report_loans(&self) {
        loop {
            tokio::select! {
                () = self.cancel.cancelled() => return,
                () = self.loan_reports.wake.notified() => {}
            }
            let pending = std::mem::take(&mut *self.loan_reports.pending.lock());
            // A node that may have been declared lost reports nothing:
            // the node that took its processes over carries on from here.
            if pending.is_empty() || !self.still_member().await {
                continue;
            }
            for (child, spent) in pending {
                let reported = self
                    .amend_loan(child, |loan| {
                        if !loan.repaid {
                            loan.spent = loan.spent.max(spent);
                        }
                    })
                    .await;
                if let Err(err) = reported {
                    tracing::warn!(%child, error = %err, "cluster: what a child on loan spent not reported");
                }
            }
        }
    }

    /// Changes the loan to `child` by compare-and-set, read again when
    /// another write lands first.
    async fn amend_loan(
        &self,
        child: Pid,
        change: impl Fn(&mut KeptLoan),
    ) -> Result<Option<KeptLoan>, ClusterError> {
        let what = || format!("writing the loan to process {child} in {LOANS}");
        for _ in 0..AMEND_TRIES {
            let Some((mut loan, revision)) = self.loan_entry(child).await? else {
                return Ok(None);
            };
            change(&mut loan);
            let value = serde_json::to_vec(&loan)
                .map_err(|err| ClusterError::JetStream(format!("encoding a loan: {err}")))?;
            match self
                .loans
                .update(key(child), Bytes::from(value), revision)
                .await
            {
                Ok(_) => return Ok(Some(loan)),
                Err(err) if err.kind() == kv::UpdateErrorKind::WrongLastRevision => continue,
                Err(err) => return Err(ClusterError::jetstream(&what(), err)),
            }
        }
        Err(ClusterError::JetStream(format!(
            "{}: {AMEND_TRIES} writes in a row landed first",
            what()
        )))
    }

    /// The children the cluster keeps a loan to, whichever node made it.
    pub(crate) async fn children_on_loan(&self) -> Result<Vec<Pid>, ClusterError> {
        let mut children = Vec::new();
        for key in super::all_keys(self.loans.raw(), LOANS).await? {
            match key.parse::<u64>() {
                Ok(child) => children.push(Pid(child)),
                Err(_) => tracing::warn!(key, "cluster: a key in {LOANS} names no PID; left out"),
            }
        }
        Ok(children)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_loan_reads_back_as_written_and_older_records_read_as_unspent() {
        let loan = KeptLoan {
            node: "a".into(),
            parent: Pid(4),
            lender: Pid(3),
            amount: 1_000,
            spent: 120,
            repaid: false,
        };
        let text = serde_json::to_string(&loan).unwrap();
        assert!(!text.contains("repaid"), "{text}");
        assert_eq!(serde_json::from_str::<KeptLoan>(&text).unwrap(), loan);
        let bare: KeptLoan =
            serde_json::from_str(r#"{"node":"a","parent":4,"lender":3,"amount":9}"#).unwrap();
        assert_eq!((bare.spent, bare.repaid), (0, false));
    }
}
