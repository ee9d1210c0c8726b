//! The inbox through the kernel: a process asks a person (a tool call's
//! approval, `ask_human`) and waits in state `waiting`; the admin, an
//! operator token with the operate scope, or an ancestor holding
//! `approve_requests` resolves the request; its timeout resolves it
//! otherwise. A process that goes away (killed, exited, the kernel
//! stopping) withdraws what it asked. Each request and each resolution is
//! an event of the asking process.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hivekernel_agents::text::cut_str;
use hivekernel_agents::{Capability, OnTimeout, Pid};
use tokio::sync::broadcast;

use super::{Caller, Kernel, Result};
use crate::caller::Scope;
use crate::error::KernelError;
use crate::events::{EventKind, unix_ms};
use crate::inbox::{Ask, Change, Decision, InboxRequest, NotPending, Resolution};
use crate::process::CountGuard;

/// Most bytes of a tool call's arguments a request shows.
pub const MAX_SHOWN_ARGUMENTS: usize = 2048;
/// Most bytes of a question, a note, a reason or an answer.
pub const MAX_INBOX_TEXT: usize = 8192;

/// Withdraws a request when the wait for it ends early (the asking task
/// dropped: its process killed, the kernel stopping).
struct Withdraw<'a> {
    kernel: &'a Kernel,
    id: u64,
    armed: bool,
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = self
                .kernel
                .settle(self.id, Decision::Withdrawn, "kernel".into());
        }
    }
}

impl Kernel {
    /// Files `ask` for `pid` and waits for its resolution: a person's, or
    /// the timeout's after `timeout`.
    pub(crate) async fn ask_person(
        &self,
        pid: Pid,
        ask: Ask,
        timeout: Duration,
        on_timeout: OnTimeout,
    ) -> Result<Resolution> {
        self.check_running()?;
        if let Ask::Question { question, choices } = &ask {
            let longest = choices.iter().map(String::len).max().unwrap_or(0);
            if question.len().max(longest) > MAX_INBOX_TEXT {
                return Err(KernelError::InvalidArgument(format!(
                    "a question and each of its choices may be at most {MAX_INBOX_TEXT} bytes"
                )));
            }
        }
        let (proc, name) = {
            let table = self.inner.table().read();
            let entry = table.get(pid).ok_or(KernelError::NotFound(pid))?;
            (entry.proc.clone(), entry.proc.ctx.name.to_string())
        };
        let now = unix_ms(SystemTime::now());
        let deadline_ms =
            now.saturating_add(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
        let (tool, text) = match &ask {
            Ask::Approval { tool, arguments } => (Some(tool.clone()), arguments.clone()),
            Ask::Question { question, .. } => (None, question.clone()),
        };
        let kind = ask.kind().to_owned();
        let (request, answer) = self.inner.inbox().ask(InboxRequest {
            id: 0,
            pid,
            name,
            ask,
            created_ms: now,
            deadline_ms,
            on_timeout,
            trace: crate::trace::current_id(),
        });
        self.inner.events().emit(
            pid,
            EventKind::ApprovalRequested {
                id: request.id,
                kind,
                tool,
                text: cut_str(&text, MAX_SHOWN_ARGUMENTS),
                deadline_ms,
            },
        );
        let _waiting = CountGuard::enter(&proc.waiting);
        let mut withdraw = Withdraw {
            kernel: self,
            id: request.id,
            armed: true,
        };
        let resolution = tokio::select! {
            resolved = answer => resolved.ok(),
            () = tokio::time::sleep(timeout) => None,
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

    /// Resolves `id` as `decision` by `by`, with its event.
    fn settle(
        &self,
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
        let request = self.inner.inbox().resolve(id, resolution.clone())?;
        self.inner.events().emit(
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
    pub async fn resolve_request(
        &self,
        caller: Caller,
        id: u64,
        decision: Decision,
    ) -> Result<Arc<InboxRequest>> {
        let request = self
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
    fn may_resolve(&self, caller: Caller, request: &InboxRequest) -> Result<()> {
        let checked = match caller {
            Caller::Process(me) => {
                self.require(
                    caller,
                    Capability::ApproveRequests,
                    "resolve inbox requests",
                )?;
                let below = self.inner.table().read().is_ancestor(me, request.pid);
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
        self.report_denial(caller, "resolve_request", checked)
    }

    /// The pending requests `caller` may see, oldest first: every one for
    /// the admin and operator tokens; a process's own and its descendants'.
    pub fn inbox(&self, caller: Caller) -> Vec<Arc<InboxRequest>> {
        let pending = self.inner.inbox().pending();
        self.visible_requests(caller, pending)
    }

    /// The requests `caller` may see now, and every change after them.
    pub fn watch_inbox(
        &self,
        caller: Caller,
    ) -> (Vec<Arc<InboxRequest>>, broadcast::Receiver<Change>) {
        let (pending, changes) = self.inner.inbox().watch();
        (self.visible_requests(caller, pending), changes)
    }

    /// Whether `caller` may see `request`.
    pub fn sees_request(&self, caller: Caller, request: &InboxRequest) -> bool {
        match caller {
            Caller::Process(me) => {
                me == request.pid || self.inner.table().read().is_ancestor(me, request.pid)
            }
            _ => true,
        }
    }

    fn visible_requests(
        &self,
        caller: Caller,
        mut requests: Vec<Arc<InboxRequest>>,
    ) -> Vec<Arc<InboxRequest>> {
        requests.retain(|request| self.sees_request(caller, request));
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
