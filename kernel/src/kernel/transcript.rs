//! Reading transcripts: who may read whose, a page at a time or live.

use std::sync::Arc;

use hivekernel_agents::Pid;
use tokio::sync::broadcast;

use crate::cluster::rpc::Op;
use crate::error::{KernelError, Result};
use crate::kernel::cluster::FORWARDED_SEND;
use crate::kernel::{Caller, Kernel};
use crate::transcript::{Entry, Page, Query};

/// A page of another node's transcript ends once it holds about this
/// much: its answer is one NATS message (1 MiB by default).
const REMOTE_PAGE_BYTES: usize = 256 << 10;

impl Kernel {
    /// `pid`'s transcript entries matching `query`, oldest first. A process
    /// may read its own transcript and its descendants'; the admin reads
    /// every one, kept transcripts of reaped processes too. One another
    /// node of a cluster holds is read there (`transcript`), in pages of
    /// at most [`REMOTE_PAGE_BYTES`].
    pub async fn transcript(&self, caller: Caller, pid: Pid, query: Query) -> Result<Page> {
        if self.inner.table().read().get(pid).is_none()
            && let Some(node) = self.holding(caller, pid, "read the transcript of").await?
        {
            let query = Query {
                max_bytes: query.max_bytes.min(REMOTE_PAGE_BYTES),
                ..query
            };
            let op = Op::Transcript { pid, query };
            return self.forward(&node, op, FORWARDED_SEND).await;
        }
        let known = self.may_read_own(caller, pid, Record::Transcript)?;
        let page = self.inner.transcripts().read(pid, query).await?;
        if !known && page.entries.is_empty() && query.after_id == 0 {
            return Err(KernelError::NotFound(pid));
        }
        Ok(page)
    }

    /// Entries recorded from now on (of every process: the reader filters),
    /// after the checks of [`Kernel::transcript`] (a process gone with
    /// nothing kept is NOT_FOUND). Subscribed before what is kept is read,
    /// so nothing falls between the two. A process another node holds
    /// records there: its watcher reads it in pages ([`Kernel::recorded_at`]).
    pub async fn watch_transcript(
        &self,
        caller: Caller,
        pid: Pid,
    ) -> Result<broadcast::Receiver<Arc<Entry>>> {
        let here = self.inner.table().read().get(pid).is_some();
        if here {
            self.may_read_own(caller, pid, Record::Transcript)?;
        }
        let live = self.inner.transcripts().subscribe();
        if !here {
            let first = Query {
                limit: 1,
                ..Query::default()
            };
            self.transcript(caller, pid, first).await?;
        }
        Ok(live)
    }

    /// Where `pid` records its transcript: here (or nowhere any more), or
    /// on another node of the cluster, under its epoch there.
    pub fn recorded_at(&self, pid: Pid) -> Recorded {
        if self.inner.table().read().get(pid).is_some() {
            return Recorded::Here;
        }
        let Some(cluster) = self.inner.cluster() else {
            return Recorded::Here;
        };
        match cluster.listings().get(pid) {
            Some(listing) if listing.node != cluster.node() => Recorded::There {
                node: listing.node.clone(),
                epoch: listing.epoch,
            },
            _ => Recorded::Here,
        }
    }

    /// Whether `pid` still records where `at` says: there, listed under
    /// that node's same epoch and not exited. A move after its node's
    /// loss ends a watch (its new node numbers its entries afresh).
    pub fn still_recorded_at(&self, pid: Pid, at: &Recorded) -> bool {
        match at {
            Recorded::Here => !self.has_exited(pid),
            Recorded::There { node, epoch } => self.inner.cluster().is_some_and(|cluster| {
                cluster.listings().get(pid).is_some_and(|listing| {
                    !listing.exited && listing.node == *node && listing.epoch == *epoch
                })
            }),
        }
    }

    /// Whether `pid` will record nothing more: it has exited for good (a
    /// zombie, or gone). A process waiting to be restarted has not.
    pub fn has_exited(&self, pid: Pid) -> bool {
        let table = self.inner.table().read();
        table.get(pid).is_none_or(|entry| !entry.is_alive())
    }

    /// Refuses a process caller `pid`'s transcript or log unless it is its
    /// own or a descendant's; answers whether `pid` is in the process table.
    pub(super) fn may_read_own(&self, caller: Caller, pid: Pid, what: Record) -> Result<bool> {
        let checked = {
            let table = self.inner.table().read();
            let known = table.get(pid).is_some();
            match caller {
                Caller::Admin | Caller::Operator { .. } => Ok(known),
                Caller::Process(_) if !known => Err(KernelError::NotFound(pid)),
                Caller::Process(me) if me == pid || table.is_ancestor(me, pid) => Ok(true),
                Caller::Process(me) => Err(KernelError::PermissionDenied(format!(
                    "process {me} may read only its own {what} and its descendants'; \
                     process {pid} is not one of them",
                    what = what.noun()
                ))),
            }
        };
        self.report_denial(caller, what.action(), checked)
    }
}

/// Where a process records its transcript, as a watch of it began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// On this node.
    Here,
    /// On another node of the cluster.
    There { node: String, epoch: u64 },
}

/// What a process may read of itself and its descendants.
#[derive(Debug, Clone, Copy)]
pub(super) enum Record {
    Transcript,
    /// An `exec` agent's log file.
    Log,
}

impl Record {
    fn noun(self) -> &'static str {
        match self {
            Record::Transcript => "transcript",
            Record::Log => "log",
        }
    }

    fn action(self) -> &'static str {
        match self {
            Record::Transcript => "read_transcript",
            Record::Log => "read_log",
        }
    }
}
