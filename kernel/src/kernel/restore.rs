//! Coming back after a restart: config agents keep their PIDs, what did not
//! come back is recorded dead, acknowledged messages are delivered and
//! unanswered requests are failed.
//!
//! The order matters: [`Kernel::spawn_declared`] for every config agent
//! first, then [`Kernel::restore`] once, before the control plane opens.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use hivekernel_agents::message::kinds;
use hivekernel_agents::{ExitRecord, Message, MessageId, Pid, Priority, SpawnRequest};

use crate::error::Result;
use crate::events::{EventKind, ReapCause, unix_ms};
use crate::kernel::supervisor::EXIT_KILLED;
use crate::kernel::{Caller, Kernel};
use crate::mailbox::{Envelope, Item, ReplyTo};
use crate::store::{Recovered, StoredUsage, Write};

/// Why processes that did not come back are dead.
pub const KERNEL_RESTART: &str = "kernel restart";

/// What coming back after a restart did (see [`Started::restored`](super::Started)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restored {
    /// Processes alive before the restart that did not come back.
    pub ended: usize,
    /// Acknowledged messages put back into mailboxes.
    pub requeued: usize,
    /// Messages whose receiver did not come back (or that expired meanwhile).
    pub dropped: usize,
    /// Unanswered requests reported failed to their requesters.
    pub failed_requests: usize,
}

impl Kernel {
    /// Spawns a config-declared agent under PID 1, as the PID it last ran as
    /// when the store knows one, and records its PID for the next restart.
    pub(crate) async fn spawn_declared(
        &self,
        request: SpawnRequest,
        recovered: Option<&Recovered>,
    ) -> Result<Pid> {
        let name = request.name.clone();
        let previous = recovered
            .and_then(|r| r.declared.get(&name).copied())
            .filter(|pid| *pid > Pid::KERNEL && self.inner.table().read().get(*pid).is_none());
        let pid = self.spawn_as(Caller::Admin, request, previous).await?;
        if let Some(kept) = recovered.and_then(|r| r.usage.get(&pid)) {
            self.carry_usage(pid, kept);
        }
        self.inner
            .store()
            .commit(Write::Declared { name, pid })
            .await?;
        Ok(pid)
    }

    /// A config agent back as `pid` carries on with the usage it had, and
    /// its own budget with what that budget had spent. A budget added to the
    /// config since starts whole: usage from before it is not charged to it.
    fn carry_usage(&self, pid: Pid, kept: &StoredUsage) {
        let Some(proc) = self.inner.table().read().get(pid).map(|e| e.proc.clone()) else {
            return;
        };
        proc.usage.add_kept(kept.own, kept.subtree);
        if let Some(pool) = &proc.budget
            && pool.owner() == pid
            && let Some(spent) = kept.budget_spent
        {
            pool.charge(spent);
        }
    }

    /// Settles what the store remembers from before the restart, once the
    /// config agents are back.
    pub(crate) fn restore(&self, recovered: Recovered) -> Restored {
        let mut restored = Restored::default();
        let alive: HashSet<Pid> = {
            let table = self.inner.table().read();
            table
                .iter()
                .filter(|(pid, entry)| *pid != Pid::KERNEL && entry.is_alive())
                .map(|(pid, _)| pid)
                .collect()
        };
        let now = unix_ms(SystemTime::now());

        // Alive before, not back now: dead, and their parents are told.
        let reason: std::sync::Arc<str> = KERNEL_RESTART.into();
        let mut events = Vec::new();
        for process in recovered
            .processes
            .iter()
            .filter(|p| !alive.contains(&p.pid))
        {
            restored.ended += 1;
            events.push((
                process.pid,
                EventKind::Exited {
                    ppid: process.ppid,
                    name: process.name.as_str().into(),
                    exit_code: EXIT_KILLED,
                    reason: reason.clone(),
                },
            ));
            events.push((
                process.pid,
                EventKind::Reaped {
                    by: ReapCause::KernelRestart,
                },
            ));
            if alive.contains(&process.ppid) {
                let record = ExitRecord {
                    pid: process.pid,
                    ppid: process.ppid,
                    name: process.name.clone(),
                    exit_code: EXIT_KILLED,
                    output: String::new(),
                    reason: KERNEL_RESTART.to_owned(),
                    exited_at_unix_ms: now,
                };
                let notice = Message {
                    id: MessageId(self.next_id()),
                    from: Pid::KERNEL,
                    to: process.ppid,
                    kind: kinds::CHILD_EXITED.to_owned(),
                    payload: serde_json::to_string(&record).unwrap_or_default(),
                    priority: Priority::High,
                    request_id: None,
                    via: None,
                    trace: None,
                };
                self.deliver_system(process.ppid, notice);
            }
        }
        // Zombies nobody collected before the restart are gone with it.
        events.extend(
            recovered
                .zombies
                .iter()
                .filter(|pid| !alive.contains(pid))
                .map(|pid| {
                    let kind = EventKind::Reaped {
                        by: ReapCause::KernelRestart,
                    };
                    (*pid, kind)
                }),
        );
        self.inner.events().emit_all(events);

        // Acknowledged, undelivered messages: back into their mailboxes, once.
        for stored in recovered.messages {
            let receiver = self
                .inner
                .table()
                .read()
                .get(stored.to)
                .filter(|entry| alive.contains(&stored.to) && entry.is_alive())
                .map(|entry| entry.proc.clone());
            let ttl = match stored.expires_ms {
                Some(at) if at <= now => Err("its TTL passed while the kernel was down".to_owned()),
                Some(at) => Ok(Some(Duration::from_millis(at - now))),
                None => Ok(None),
            };
            let (from, kind) = match &stored.message {
                Ok(message) => (message.from, message.kind.clone()),
                Err(_) => (Pid::KERNEL, "unknown".to_owned()),
            };
            let outcome = match (receiver, stored.message, ttl) {
                (Some(proc), Ok(message), Ok(ttl)) => {
                    let env = Envelope::new(stored.id, Item::Message(message), ttl).durable(true);
                    proc.mailbox
                        .push_restored(env, || self.start_runner(&proc))
                        .map_err(|_| format!("process {} has exited", stored.to))
                }
                (None, _, _) => Err(format!(
                    "process {} did not come back after the restart",
                    stored.to
                )),
                (_, Err(why), _) => Err(format!("cannot read the stored message: {why}")),
                (_, _, Err(why)) => Err(why),
            };
            match outcome {
                Ok(()) => restored.requeued += 1,
                Err(reason) => {
                    restored.dropped += 1;
                    self.message_done(stored.id, true);
                    self.inner.events().emit(
                        stored.to,
                        EventKind::MessageDropped {
                            message_id: stored.id,
                            from,
                            kind,
                            reason,
                        },
                    );
                }
            }
        }

        // Requests nobody answered before the restart: failed, not lost.
        for request in recovered.requests {
            restored.failed_requests += 1;
            self.deliver_reply(
                request.to,
                request.id,
                ReplyTo::Mailbox(request.from),
                Err(format!(
                    "{KERNEL_RESTART}: process {} did not answer before the kernel stopped",
                    request.to
                )),
            );
        }
        restored
    }
}
