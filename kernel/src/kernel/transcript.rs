//! Reading transcripts: who may read whose, a page at a time or live.

use std::sync::Arc;

use hivekernel_agents::Pid;
use tokio::sync::broadcast;

use crate::cluster::rpc::Op;
use crate::error::{KernelError, Result};
use crate::kernel::cluster::{FORWARDED_SEND, Holder};
use crate::kernel::{Caller, Kernel};
use crate::transcript::{Entry, Page, Query};

/// A page of another node's transcript ends once it holds about this
/// much: its answer is one NATS message (1 MiB by default).
const REMOTE_PAGE_BYTES: usize = 256 << 10;

/// Transcripts through the kernel ([`Kernel::transcripts`]): reading and
/// watching them as the caller may, here or on the node that keeps them.
#[derive(Debug, Clone, Copy)]
pub struct TranscriptsHandle<'k> {
    kernel: &'k Kernel,
}

impl Kernel {
    /// The kernel's transcripts.
    pub fn transcripts(&self) -> TranscriptsHandle<'_> {
        TranscriptsHandle { kernel: self }
    }
}

impl TranscriptsHandle<'_> {
    /// `pid`'s transcript entries matching `query`, oldest first. A process
    /// may read its own transcript and its descendants'; the admin reads
    /// every one, kept transcripts of reaped processes too. One another
    /// node of a cluster holds is read there (`transcript`), in pages of
    /// at most [`REMOTE_PAGE_BYTES`].
    pub async fn read(self, caller: Caller, pid: Pid, query: Query) -> Result<Page> {
        if self.kernel.inner.table().read().get(pid).is_none()
            && let Some(node) = self
                .kernel
                .node()
                .holding(caller, pid, "read the transcript of")
                .await?
        {
            let query = Query {
                max_bytes: query.max_bytes.min(REMOTE_PAGE_BYTES),
                ..query
            };
            let op = Op::Transcript { pid, query };
            return self.kernel.node().forward(&node, op, FORWARDED_SEND).await;
        }
        self.read_here(caller, pid, query).await
    }

    /// [`TranscriptsHandle::read`] as this node keeps it, never asking another
    /// (what a node answers another's `transcript` with).
    pub(super) async fn read_here(self, caller: Caller, pid: Pid, query: Query) -> Result<Page> {
        let known = self.may_read_own(caller, pid, Record::Transcript)?;
        let page = self.kernel.inner.transcripts().read(pid, query).await?;
        if !known && page.entries.is_empty() && query.after_id == 0 {
            return Err(KernelError::NotFound(pid));
        }
        Ok(page)
    }

    /// Entries recorded from now on (of every process: the reader filters),
    /// after the checks of [`TranscriptsHandle::read`] (a process gone with
    /// nothing kept is NOT_FOUND). Subscribed before what is kept is read,
    /// so nothing falls between the two. A process another node holds
    /// records there: its watcher reads it in pages ([`TranscriptsHandle::recorded_elsewhere`]).
    pub async fn watch(self, caller: Caller, pid: Pid) -> Result<broadcast::Receiver<Arc<Entry>>> {
        let here = self.kernel.inner.table().read().get(pid).is_some();
        if here {
            self.may_read_own(caller, pid, Record::Transcript)?;
        }
        let live = self.kernel.inner.transcripts().subscribe();
        if !here {
            let first = Query {
                limit: 1,
                ..Query::default()
            };
            self.read(caller, pid, first).await?;
        }
        Ok(live)
    }

    /// The node, and its epoch, where `pid` records its transcript when
    /// another node of the cluster holds it (read from the directory
    /// itself when the mirror does not list it yet).
    pub async fn recorded_elsewhere(self, pid: Pid) -> Option<(String, u64)> {
        match self.kernel.node().holder(pid).await {
            Ok(Some(Holder::There(listing))) => Some((listing.node, listing.epoch)),
            _ => None,
        }
    }

    /// Whether `pid`, on the other node `node` under `epoch` when a watch
    /// of it began, still records there; else whether it exited (or is
    /// gone), or moved (its new node numbers its entries afresh).
    /// A directory that cannot be read says it still records there.
    pub async fn recording_there(self, pid: Pid, node: &str, epoch: u64) -> Recording {
        let Some(cluster) = self.kernel.inner.cluster() else {
            return Recording::Ended;
        };
        match cluster.locate(pid).await {
            Ok(Some(listing)) if listing.node != node || listing.epoch != epoch => Recording::Moved,
            Ok(Some(listing)) if listing.exited => Recording::Ended,
            Ok(Some(_)) | Err(_) => Recording::Still,
            Ok(None) => Recording::Ended,
        }
    }

    /// Whether `pid` will record nothing more: it has exited for good (a
    /// zombie, or gone). A process waiting to be restarted has not.
    pub fn has_exited(self, pid: Pid) -> bool {
        let table = self.kernel.inner.table().read();
        table.get(pid).is_none_or(|entry| !entry.is_alive())
    }

    /// Refuses a process caller `pid`'s transcript or log unless it is its
    /// own or a descendant's; answers whether `pid` is in the process table.
    pub(super) fn may_read_own(self, caller: Caller, pid: Pid, what: Record) -> Result<bool> {
        let checked = {
            let table = self.kernel.inner.table().read();
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
        self.kernel.report_denial(caller, what.action(), checked)
    }
}

/// What a watch of a process on another node finds of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recording {
    /// It still records where the watch began.
    Still,
    /// It exited there, or is gone.
    Ended,
    /// It runs on another node, or under another epoch, now.
    Moved,
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
