//! Counters whose values are never handed out twice, across restarts too.
//!
//! With a store, a counter reserves values ahead in blocks: the store records
//! "everything below N may have been used", and a restart starts at N. A new
//! block is reserved when half of the current one is used, so the write is
//! committed long before its values are needed; [`Counter::committed`] lets
//! a caller that must not hand out an unreserved value wait for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio_util::task::TaskTracker;

use crate::store::{self, Store, StoreError, Write};

/// A monotonically increasing counter, optionally backed by the store.
#[derive(Debug)]
pub(crate) struct Counter {
    kind: store::Counter,
    /// Values reserved per store write: what a crash may skip.
    block: u64,
    next: AtomicU64,
    /// Values below this are reserved (the write may still be queued).
    reserved: AtomicU64,
    /// Values below this are reserved and committed.
    committed: Arc<AtomicU64>,
}

impl Counter {
    /// A counter starting at `start`; `start` itself counts as reserved
    /// (it came from the store, or there is no store).
    pub(crate) fn new(kind: store::Counter, start: u64, block: u64) -> Self {
        Counter {
            kind,
            block: block.max(2),
            next: AtomicU64::new(start),
            reserved: AtomicU64::new(start),
            committed: Arc::new(AtomicU64::new(start)),
        }
    }

    /// Hands out the next value, reserving the next block in `store` when
    /// half of the current one is used.
    pub(crate) fn take(&self, store: &Store, tracker: &TaskTracker) -> u64 {
        let value = self.next.fetch_add(1, Ordering::Relaxed);
        if store.is_durable() && value + self.block / 2 >= self.reserved.load(Ordering::Acquire) {
            let until = value + self.block;
            if self.reserved.fetch_max(until, Ordering::AcqRel) < until {
                let store = store.clone();
                let committed = self.committed.clone();
                let counter = self.kind;
                tracker.spawn(async move {
                    if store
                        .commit(Write::Reserve { counter, until })
                        .await
                        .is_ok()
                    {
                        committed.fetch_max(until, Ordering::AcqRel);
                    }
                });
            }
        }
        value
    }

    /// Waits until `value` is covered by a committed reservation.
    pub(crate) async fn committed(&self, store: &Store, value: u64) -> Result<(), StoreError> {
        while value >= self.committed.load(Ordering::Acquire) {
            let until = self.reserved.load(Ordering::Acquire).max(value + 1);
            store
                .commit(Write::Reserve {
                    counter: self.kind,
                    until,
                })
                .await?;
            self.committed.fetch_max(until, Ordering::AcqRel);
        }
        Ok(())
    }

    /// The next value exactly: what a clean stop writes back.
    pub(crate) fn peek(&self) -> u64 {
        self.next.load(Ordering::Acquire)
    }
}
