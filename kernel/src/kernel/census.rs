//! What `/metrics` serves: the metrics the kernel keeps, with the gauges
//! read off its parts at the moment of the scrape.

use hivekernel_agents::{ProcessState, Role};

use crate::kernel::Kernel;
use crate::metrics::Census;

impl Kernel {
    /// The Prometheus exposition, or `None` when the kernel keeps no
    /// metrics (`kernel.metrics` is not set).
    pub fn metrics_text(&self) -> Option<String> {
        let metrics = self.inner.metrics()?;
        Some(metrics.render(&self.census()))
    }

    /// Processes by state and role, mailbox depths, subscribers, pending
    /// inbox requests and the store's queue, now. One pass over the table
    /// under its read lock, counting into a fixed grid (no allocation per
    /// process).
    fn census(&self) -> Census {
        let states = ProcessState::ALL.len();
        let mut grid = vec![0u64; states * Role::ALL.len()];
        let (mut waiting, mut most) = (0u64, 0u64);
        {
            let table = self.inner.table().read();
            for (_, entry) in table.iter() {
                let state = entry.state() as usize;
                let role = entry.proc.ctx.role as usize;
                if let Some(cell) = grid.get_mut(role * states + state) {
                    *cell += 1;
                }
                if entry.is_alive() {
                    let len = entry.proc.mailbox.len() as u64;
                    waiting += len;
                    most = most.max(len);
                }
            }
        }
        let processes = Role::ALL
            .iter()
            .flat_map(|&role| ProcessState::ALL.iter().map(move |&state| (state, role)))
            .zip(grid)
            .filter(|(_, count)| *count > 0)
            .map(|((state, role), count)| (state, role, count))
            .collect();
        let pending = self.inner.inbox().pending();
        let inbox_pending = ["approval", "question"]
            .into_iter()
            .map(|kind| {
                let count = pending.iter().filter(|r| r.ask.kind() == kind).count();
                (kind, count as u64)
            })
            .collect();
        Census {
            processes,
            mailbox_messages: waiting,
            mailbox_messages_max: most,
            event_subscribers: self.inner.events().subscribers() as u64,
            inbox_pending,
            store_queue: self.inner.store().queued() as u64,
            cluster_refused: self.inner.cluster().map_or(0, |cluster| cluster.refused()),
        }
    }
}
