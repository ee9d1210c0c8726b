//! The cluster-wide PID space: blocks of PIDs taken from the counter
//! `hk_counters/pid` by compare-and-set, so no two nodes ever hand out the
//! same PID and no PID is handed out twice. The next block is fetched when
//! half of the current one is used, so a spawn waits on NATS only when a
//! burst outruns the fetch.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{ClusterError, increment};

/// PIDs per block.
pub(crate) const BLOCK: u64 = 1 << 10;
/// How long a spawn waits for a block before it is refused.
const WAIT: Duration = Duration::from_secs(10);

/// The blocks this node holds.
pub(crate) struct PidBlocks {
    counters: kv::Store,
    /// No PID below this is handed out (this node's own, from before it
    /// joined a cluster).
    floor: u64,
    state: Mutex<Blocks>,
    /// Wakes the fetcher.
    wanted: Notify,
    /// Wakes spawns waiting for a block.
    filled: Notify,
}

#[derive(Debug, Default)]
struct Blocks {
    next: u64,
    end: u64,
    spare: Option<(u64, u64)>,
}

impl Blocks {
    fn take(&mut self) -> Option<u64> {
        if self.next >= self.end {
            let (start, end) = self.spare.take()?;
            self.next = start;
            self.end = end;
        }
        let pid = self.next;
        self.next += 1;
        Some(pid)
    }

    /// Whether the next block should be fetched now.
    fn low(&self) -> bool {
        self.spare.is_none() && self.end.saturating_sub(self.next) <= BLOCK / 2
    }
}

impl PidBlocks {
    pub(super) fn new(counters: kv::Store, floor: u64) -> Self {
        PidBlocks {
            counters,
            floor: floor.max(2),
            state: Mutex::new(Blocks::default()),
            wanted: Notify::new(),
            filled: Notify::new(),
        }
    }

    /// Fetches one block now, as the spare (at join, before any spawn).
    pub(super) async fn fill(&self) -> Result<(), ClusterError> {
        let block = increment(&self.counters, "pid", BLOCK, self.floor).await?;
        self.state.lock().spare = Some(block);
        Ok(())
    }

    /// Starts the fetcher, ended by `cancel`.
    pub(super) fn start(self: &Arc<Self>, tracker: &TaskTracker, cancel: CancellationToken) {
        let me = self.clone();
        tracker.spawn(async move {
            loop {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = me.wanted.notified() => {}
                }
                if !me.state.lock().low() {
                    continue;
                }
                match increment(&me.counters, "pid", BLOCK, me.floor).await {
                    Ok(block) => {
                        me.state.lock().spare = Some(block);
                        me.filled.notify_waiters();
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "cluster: no PID block; retrying");
                        me.wanted.notify_one();
                        tokio::select! {
                            () = cancel.cancelled() => return,
                            () = tokio::time::sleep(Duration::from_millis(500)) => {}
                        }
                    }
                }
            }
        });
    }

    /// The next PID of this node's blocks, waiting for a block when they
    /// are used up (refused after a while: NATS unreachable).
    pub(crate) async fn next(&self) -> Result<u64, ClusterError> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let filled = self.filled.notified();
            {
                let mut state = self.state.lock();
                let pid = state.take();
                if state.low() {
                    self.wanted.notify_one();
                }
                if let Some(pid) = pid {
                    return Ok(pid);
                }
            }
            if tokio::time::timeout_at(deadline, filled).await.is_err() {
                return Err(ClusterError::JetStream(format!(
                    "no PID block from the cluster within {} s (is NATS reachable?)",
                    WAIT.as_secs()
                )));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_used_up_before_the_spare() {
        let mut blocks = Blocks {
            next: 10,
            end: 12,
            spare: Some((100, 102)),
        };
        let taken: Vec<u64> = std::iter::from_fn(|| blocks.take()).collect();
        assert_eq!(taken, vec![10, 11, 100, 101]);
        assert!(blocks.low());
    }

    #[test]
    fn the_next_block_is_wanted_at_half() {
        let mut blocks = Blocks {
            next: 0,
            end: BLOCK,
            spare: None,
        };
        assert!(!blocks.low());
        for _ in 0..BLOCK / 2 {
            blocks.take();
        }
        assert!(blocks.low());
        blocks.spare = Some((BLOCK, 2 * BLOCK));
        assert!(!blocks.low());
    }
}
