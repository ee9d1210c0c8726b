//! The inbox through the kernel: a process asks a person (a tool call's
//! approval, `ask_human`) and waits in state `waiting`; the admin, an
//! operator token with the operate scope, or an ancestor holding
//! `approve_requests` resolves the request; its timeout resolves it
//! otherwise. A process that goes away (killed, exited, the kernel
//! stopping) withdraws what it asked. Each request and each resolution is
//! an event of the asking process.
//!
//! Pending requests are kept in the store with the checkpoint of the turn
//! that waits (and the `delegate_async` request it answers): a kernel that
//! stops, cleanly or not, files them again when it starts, and resumes
//! each turn (kernel/restore.rs), whose first wait for a person takes its
//! request up again ([`crate::trace::take_resume`]).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hivekernel_agents::text::cut_str;
use hivekernel_agents::{Capability, OnTimeout, Pid};
use tokio::sync::{broadcast, oneshot};

use super::{Caller, Kernel, Result};
use crate::caller::Scope;
use crate::error::KernelError;
use crate::events::{EventKind, unix_ms};
use crate::inbox::{Ask, Change, Decision, InboxRequest, NotPending, Resolution};
use crate::process::CountGuard;
use crate::store::{StoredInbox, Write};

/// Most bytes of a tool call's arguments a request shows.
pub const MAX_SHOWN_ARGUMENTS: usize = 2048;
/// Most bytes of a question, a note, a reason or an answer.
pub const MAX_INBOX_TEXT: usize = 8192;

/// The inbox through the kernel ([`Kernel::inbox`]): asking a person and
/// waiting, resolving, listing and watching requests, and what a restart
/// files again or withdraws.
#[derive(Debug, Clone, Copy)]
pub struct InboxHandle<'k> {
    kernel: &'k Kernel,
}

impl Kernel {
    /// The kernel's inbox.
    pub fn inbox(&self) -> InboxHandle<'_> {
        InboxHandle { kernel: self }
    }
}

/// Withdraws a request when the wait for it ends early (the asking task
/// dropped: its process killed). A kernel that is stopping keeps it, for
/// the next start to resume.
struct Withdraw<'a> {
    kernel: &'a Kernel,
    id: u64,
    armed: bool,
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        if self.armed && !self.kernel.is_stopping() {
            let _ = self
                .kernel
                .inbox()
                .settle(self.id, Decision::Withdrawn, "kernel".into());
        }
    }
}

/// Removes a kept request's row when its filing is given up midway.
struct Unfiled<'a> {
    kernel: &'a Kernel,
    id: u64,
    armed: bool,
}

impl Drop for Unfiled<'_> {
    fn drop(&mut self) {
        if self.armed && !self.kernel.is_stopping() {
            self.kernel.inner.store().submit(Write::InboxDone(self.id));
        }
    }
}

/// A resumed turn's request, taken up again.
enum TakenUp {
    /// Still pending: wait for it.
    Waiting(Arc<InboxRequest>, oneshot::Receiver<Resolution>),
    /// Resolved while the turn was not back yet.
    Resolved(Resolution),
    /// Gone, or asking something else now: file anew.
    Gone,
}

impl InboxHandle<'_> {
    /// Files `ask` for `pid` and waits for its resolution: a person's, or
    /// the timeout's after `timeout`. `checkpoint` is the waiting turn's,
    /// kept with the request so a restart can resume the turn; a resumed
    /// turn's first call takes up the request it waited for instead.
    pub(crate) async fn ask(
        self,
        pid: Pid,
        ask: Ask,
        timeout: Duration,
        on_timeout: OnTimeout,
        checkpoint: Option<String>,
    ) -> Result<Resolution> {
        self.kernel.check_running()?;
        if let Ask::Question { question, choices } = &ask {
            let longest = choices.iter().map(String::len).max().unwrap_or(0);
            if question.len().max(longest) > MAX_INBOX_TEXT {
                return Err(KernelError::InvalidArgument(format!(
                    "a question and each of its choices may be at most {MAX_INBOX_TEXT} bytes"
                )));
            }
        }
        let (proc, name) = {
            let table = self.kernel.inner.table().read();
            let entry = table.get(pid).ok_or(KernelError::NotFound(pid))?;
            (entry.proc.clone(), entry.proc.ctx.name.to_string())
        };
        let taken = match crate::trace::take_resume() {
            Some(id) => self.take_up(id, &ask),
            None => TakenUp::Gone,
        };
        let (request, answer) = match taken {
            TakenUp::Waiting(request, answer) => (request, answer),
            TakenUp::Resolved(resolution) => return Ok(resolution),
            TakenUp::Gone => {
                let now = unix_ms(SystemTime::now());
                let request = InboxRequest {
                    id: self.kernel.next_id(),
                    pid,
                    name,
                    ask,
                    created_ms: now,
                    deadline_ms: now
                        .saturating_add(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
                    on_timeout,
                    trace: crate::trace::current_id(),
                    asked_under: crate::trace::approvals().to_vec(),
                };
                self.file(request, checkpoint).await
            }
        };
        let left = request
            .deadline_ms
            .saturating_sub(unix_ms(SystemTime::now()));
        let _waiting = CountGuard::enter(&proc.waiting);
        let mut withdraw = Withdraw {
            kernel: self.kernel,
            id: request.id,
            armed: true,
        };
        let resolution = tokio::select! {
            resolved = answer => resolved.ok(),
            () = tokio::time::sleep(Duration::from_millis(left)) => None,
        };
        withdraw.armed = false;
        match resolution {
            Some(resolution) => Ok(resolution),
            // The timeout, unless a person got there first.
            None => match self.settle(request.id, Decision::TimedOut, "timeout".into()) {
                Ok(resolution) => Ok(resolution),
                Err(NotPending::Resolved(resolution)) => Ok((*resolution).clone()),
                Err(NotPending::Unknown) => Err(KernelError::FailedPrecondition(format!(
                    "inbox request {} vanished",
                    request.id
                ))),
            },
        }
    }

    /// Keeps `request` in the store with the waiting turn's `checkpoint`,
    /// then files it, with its event.
    async fn file(
        self,
        request: InboxRequest,
        checkpoint: Option<String>,
    ) -> (Arc<InboxRequest>, oneshot::Receiver<Resolution>) {
        let (id, pid) = (request.id, request.pid);
        // Given up during the commit (its task's limit, a requester gone):
        // the row must not outlive the wait, or a restart would resume a
        // turn that already ended.
        let mut unfiled = Unfiled {
            kernel: self.kernel,
            id,
            armed: true,
        };
        match serde_json::to_string(&request) {
            Ok(json) => {
                let row = StoredInbox {
                    id,
                    pid,
                    request: json,
                    checkpoint,
                    origin: crate::trace::origin().map(|o| (o.request_id, o.from)),
                };
                // Kept before anyone can see it, so a resolution never
                // reaches the store ahead of the request.
                if let Err(err) = self
                    .kernel
                    .inner
                    .store()
                    .commit(Write::InboxPut(Box::new(row)))
                    .await
                {
                    tracing::error!(%pid, request = id, error = %err, "store: inbox request not kept");
                }
            }
            Err(err) => {
                tracing::error!(%pid, request = id, error = %err, "inbox request not kept")
            }
        }
        unfiled.armed = false;
        let (tool, text) = match &request.ask {
            Ask::Approval { tool, arguments } => (Some(tool.clone()), arguments.clone()),
            Ask::Question { question, .. } => (None, question.clone()),
        };
        let (kind, deadline_ms) = (request.ask.kind().to_owned(), request.deadline_ms);
        let filed = self.kernel.inner.inbox().ask(request);
        self.kernel.inner.events().emit(
            pid,
            EventKind::ApprovalRequested {
                id,
                kind,
                tool,
                text: cut_str(&text, MAX_SHOWN_ARGUMENTS),
                deadline_ms,
            },
        );
        if let Some(notifier) = self.kernel.inner.notifier() {
            let body = serde_json::json!({ "type": "inbox_request", "request": &*filed.0 });
            if let Err(failed) = notifier.notify(id, pid, body) {
                let kind = EventKind::NotifyFailed {
                    id,
                    error: failed.error,
                    attempts: failed.attempts,
                };
                self.kernel.inner.events().emit(pid, kind);
            }
        }
        filed
    }

    /// A resumed turn takes up request `id`, pending since before a
    /// restart, when it asks exactly the same again (a decision is never
    /// applied to a call nobody saw); withdrawn otherwise.
    fn take_up(self, id: u64, ask: &Ask) -> TakenUp {
        match self.kernel.inner.inbox().take_up(id) {
            Some((request, Ok(answer))) if request.ask == *ask => TakenUp::Waiting(request, answer),
            Some((request, Err(resolution))) if request.ask == *ask => {
                TakenUp::Resolved((*resolution).clone())
            }
            Some((_, Ok(_))) => {
                self.withdraw(id, "kernel");
                TakenUp::Gone
            }
            Some((_, Err(_))) | None => TakenUp::Gone,
        }
    }

    /// Files again a request kept from before a restart, for its resumed
    /// turn to take up.
    pub(crate) fn refile(self, request: InboxRequest) {
        self.kernel.inner.inbox().refile(request);
    }

    /// Withdraws request `id` when nobody waits for it any more (a resumed
    /// turn that ended without taking it up, a process that did not come
    /// back), as `by` says.
    pub(crate) fn withdraw(self, id: u64, by: &str) {
        let _ = self.settle(id, Decision::Withdrawn, by.to_owned());
    }

    /// Resolves `id` as `decision` by `by`, with its event.
    fn settle(
        self,
        id: u64,
        decision: Decision,
        by: String,
    ) -> std::result::Result<Resolution, NotPending> {
        let text = cut_str(decision.text(), MAX_SHOWN_ARGUMENTS);
        let resolution = Resolution {
            decision,
            by,
            at_ms: unix_ms(SystemTime::now()),
        };
        let request = self.kernel.inner.inbox().resolve(id, resolution.clone())?;
        self.kernel.inner.store().submit(Write::InboxDone(id));
        self.kernel.inner.events().emit(
            request.pid,
            EventKind::ApprovalResolved {
                id,
                decision: resolution.decision.as_str().to_owned(),
                by: resolution.by.clone(),
                text,
            },
        );
        Ok(resolution)
    }

    /// Resolves inbox request `id` as `caller` decides: approve or deny an
    /// approval, answer or deny a question. The admin and operate-scope
    /// tokens may resolve any; a process only its descendants', holding
    /// `approve_requests`.
    pub async fn resolve(
        self,
        caller: Caller,
        id: u64,
        decision: Decision,
    ) -> Result<Arc<InboxRequest>> {
        let request = self
            .kernel
            .inner
            .inbox()
            .get(id)
            .map_err(|why| not_pending(id, why))?;
        self.may_resolve(caller, &request)?;
        if matches!(decision, Decision::TimedOut | Decision::Withdrawn) {
            return Err(KernelError::InvalidArgument(
                "a person approves, denies or answers; timeouts and withdrawals are the kernel's"
                    .into(),
            ));
        }
        let text = decision.text();
        if text.len() > MAX_INBOX_TEXT {
            return Err(KernelError::InvalidArgument(format!(
                "the text is {} bytes; at most {MAX_INBOX_TEXT}",
                text.len()
            )));
        }
        match (&request.ask, &decision) {
            (Ask::Approval { .. }, Decision::Approved { .. } | Decision::Denied { .. })
            | (Ask::Question { .. }, Decision::Denied { .. }) => {}
            (Ask::Question { choices, .. }, Decision::Answered { answer }) => {
                if answer.trim().is_empty() {
                    return Err(KernelError::InvalidArgument("the answer is empty".into()));
                }
                if !choices.is_empty() && !choices.contains(answer) {
                    return Err(KernelError::InvalidArgument(format!(
                        "request {id} offers the answers {}; {} is not one of them",
                        choices.join(", "),
                        hivekernel_agents::text::shown(answer)
                    )));
                }
            }
            (Ask::Approval { .. }, _) => {
                return Err(KernelError::FailedPrecondition(format!(
                    "request {id} asks to approve a tool call: approve or deny it"
                )));
            }
            (Ask::Question { .. }, _) => {
                return Err(KernelError::FailedPrecondition(format!(
                    "request {id} is a question: answer it (or deny it)"
                )));
            }
        }
        self.settle(id, decision, caller.who())
            .map_err(|why| not_pending(id, why))?;
        Ok(request)
    }

    /// Refuses `caller` a resolution of `request` it may not make.
    fn may_resolve(self, caller: Caller, request: &InboxRequest) -> Result<()> {
        let checked = match caller {
            Caller::Process(me) => {
                self.kernel.require(
                    caller,
                    Capability::ApproveRequests,
                    "resolve inbox requests",
                )?;
                let below = self
                    .kernel
                    .inner
                    .table()
                    .read()
                    .is_ancestor(me, request.pid);
                if below {
                    Ok(())
                } else {
                    Err(KernelError::PermissionDenied(format!(
                        "process {me} may resolve only its descendants' requests; request {} is \
                         process {}'s",
                        request.id, request.pid
                    )))
                }
            }
            _ if caller.scope() < Scope::Operate => Err(KernelError::PermissionDenied(
                "resolving inbox requests needs the operate scope".into(),
            )),
            _ => Ok(()),
        };
        self.kernel
            .report_denial(caller, "resolve_request", checked)
    }

    /// The pending requests `caller` may see, oldest first: every one for
    /// the admin and operator tokens; a process's own and its descendants'.
    pub fn pending(self, caller: Caller) -> Vec<Arc<InboxRequest>> {
        let pending = self.kernel.inner.inbox().pending();
        self.visible(caller, pending)
    }

    /// The requests `caller` may see now, and every change after them.
    pub fn watch(self, caller: Caller) -> (Vec<Arc<InboxRequest>>, broadcast::Receiver<Change>) {
        let (pending, changes) = self.kernel.inner.inbox().watch();
        (self.visible(caller, pending), changes)
    }

    /// Whether `caller` may see `request`.
    pub fn sees(self, caller: Caller, request: &InboxRequest) -> bool {
        match caller {
            Caller::Process(me) => {
                me == request.pid
                    || self
                        .kernel
                        .inner
                        .table()
                        .read()
                        .is_ancestor(me, request.pid)
            }
            _ => true,
        }
    }

    fn visible(
        self,
        caller: Caller,
        mut requests: Vec<Arc<InboxRequest>>,
    ) -> Vec<Arc<InboxRequest>> {
        requests.retain(|request| self.sees(caller, request));
        requests
    }
}

/// NOT_FOUND for an unknown request, FAILED_PRECONDITION naming how a
/// resolved one was resolved.
fn not_pending(id: u64, why: NotPending) -> KernelError {
    match why {
        NotPending::Unknown => KernelError::NoSuchRequest(id),
        NotPending::Resolved(how) => KernelError::FailedPrecondition(format!(
            "request {id} was already resolved: {} by {}",
            how.decision.as_str(),
            how.by
        )),
    }
}
