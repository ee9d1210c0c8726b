//! Acknowledged messages that waited while their process was not running
//! here, put back into its mailbox once: those the store kept across a
//! kernel restart (restore.rs), and those the cluster's mail stream kept
//! for a config agent this node starts, first or taking it over from
//! another node (declared.rs; docs/CLUSTER.md, "Exactly once across
//! nodes").

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hivekernel_agents::{Message, MessageId, Pid};

use crate::cluster::{Letter, Queued};
use crate::events::{EventKind, unix_ms};
use crate::kernel::cluster::NodeHandle;
use crate::mailbox::{Envelope, Item};
use crate::process::ProcShared;

/// An acknowledged message, as it was kept.
pub(super) struct Kept {
    /// Its envelope's id on this node.
    pub(super) id: MessageId,
    pub(super) to: Pid,
    /// The message, or why it could not be read back.
    pub(super) message: Result<Message, String>,
    pub(super) expires_ms: Option<u64>,
}

/// The messages the cluster's mail stream keeps for a config agent about
/// to start here, each with its sequence in the stream.
pub(super) struct Letters {
    pid: Pid,
    queued: Vec<Queued>,
}

impl NodeHandle<'_> {
    /// Puts `kept` back into `receiver`'s mailbox (at `now`, Unix ms).
    /// False when it cannot be (no receiver: `absent` says why; its TTL
    /// passed; it cannot be read): it is then removed from where it was
    /// kept and reported as a `message_dropped` event.
    pub(super) fn requeue(
        self,
        kept: Kept,
        receiver: Option<Arc<ProcShared>>,
        now: u64,
        absent: impl FnOnce() -> String,
    ) -> bool {
        let ttl = match kept.expires_ms {
            Some(at) if at <= now => Err("its TTL passed while it waited".to_owned()),
            Some(at) => Ok(Some(Duration::from_millis(at - now))),
            None => Ok(None),
        };
        let (from, kind) = match &kept.message {
            Ok(message) => (message.from, message.kind.clone()),
            Err(_) => (Pid::KERNEL, "unknown".to_owned()),
        };
        let outcome = match (receiver, kept.message, ttl) {
            (Some(proc), Ok(message), Ok(ttl)) => {
                let env = Envelope::new(kept.id, Item::Message(message), ttl).durable(true);
                proc.mailbox
                    .push_restored(env, || self.kernel.start_runner(&proc))
                    .map_err(|_| format!("process {} has exited", kept.to))
            }
            (None, _, _) => Err(absent()),
            (_, Err(why), _) => Err(format!("cannot read the stored message: {why}")),
            (_, _, Err(why)) => Err(why),
        };
        let Err(reason) = outcome else {
            return true;
        };
        self.kernel.message_done(kept.id, true);
        self.kernel.inner.events().emit(
            kept.to,
            EventKind::MessageDropped {
                message_id: kept.id,
                from,
                kind,
                reason,
            },
        );
        false
    }

    /// The messages waiting in the cluster's mail stream for config agent
    /// `pid`, read before this node starts it. Nothing for a kernel alone
    /// or a new PID; an unreachable stream is logged, and what waits there
    /// stays for the agent's next start.
    pub(super) async fn letters_for(self, pid: Option<Pid>) -> Option<Letters> {
        let (cluster, pid) = (self.kernel.inner.cluster()?, pid?);
        cluster.back_mail_of(pid);
        match cluster.queued_mail(pid).await {
            Ok(queued) => Some(Letters { pid, queued }),
            Err(err) => {
                tracing::error!(%pid, error = %err, "cluster: messages waiting for the agent not read; they wait for its next start");
                None
            }
        }
    }

    /// Puts `letters` into the mailbox of the config agent just started
    /// here as their PID, oldest first.
    pub(super) fn deliver_letters(self, letters: Option<Letters>) {
        let (Some(cluster), Some(Letters { pid, queued })) = (self.kernel.inner.cluster(), letters)
        else {
            return;
        };
        let receiver = self
            .kernel
            .inner
            .table()
            .read()
            .get(pid)
            .filter(|entry| entry.is_alive())
            .map(|entry| entry.proc.clone());
        let Some(receiver) = receiver else {
            // Exited as it started: what waits stays for its next start.
            tracing::warn!(%pid, waiting = queued.len(), "cluster: the agent exited as it started; its messages wait for its next start");
            return;
        };
        let now = unix_ms(SystemTime::now());
        let (mut requeued, mut dropped) = (0, 0);
        for (seq, letter) in queued {
            let id = MessageId(self.kernel.next_id());
            cluster.hold_mail(id, pid, seq);
            let (message, expires_ms) = match letter {
                Ok(Letter {
                    message,
                    expires_ms,
                    ..
                }) => (Ok(message), expires_ms),
                Err(why) => (Err(why), None),
            };
            let kept = Kept {
                id,
                to: pid,
                message,
                expires_ms,
            };
            let absent = || format!("process {pid} exited as it started");
            match self.requeue(kept, Some(receiver.clone()), now, absent) {
                true => requeued += 1,
                false => dropped += 1,
            }
        }
        if requeued + dropped > 0 {
            tracing::info!(%pid, requeued, dropped, "cluster: messages that waited for the agent delivered");
        }
    }
}
