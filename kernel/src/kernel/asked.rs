//! Approval rules carried along requests: work runs, in whoever does it,
//! under the approval rules of whoever asked for it, so no process causes
//! through another a tool call it could not make itself without the same
//! approval.
//!
//! A task (`execute_task`, `delegate_async`, an `orchestrate` worker's)
//! and a message (`send_message`, and the copy a parent gets of its
//! children's traffic) carry the rules of their sender: its own (role,
//! config, parent's) and those the sender's current work was asked under.
//! The receiver's turn runs under them ([`crate::trace::approvals`]): a
//! tool call needs the approval of its own rules and of these. A child
//! spawned by such a turn gets them as its own. An `exec` process's
//! requests cannot be matched to the work that caused them, so once it
//! is handed work under rules, everything it asks for carries them for
//! the rest of its run.

use hivekernel_agents::Pid;
use hivekernel_agents::approval::{Carried, MAX_CARRIED_RULES, join};

use crate::error::{KernelError, Result};
use crate::kernel::Kernel;

impl Kernel {
    /// The approval rules work that `from` asks for now is asked under
    /// (see the module docs); refused when they would be more than
    /// [`MAX_CARRIED_RULES`].
    pub(crate) fn asked_under(&self, from: Pid) -> Result<Carried> {
        let carried = crate::trace::approvals();
        if from == Pid::KERNEL {
            return Ok(carried);
        }
        let mut rules = carried.to_vec();
        // One read of the table; the exec runtime only for its own.
        let (own, exec) = match self.inner.table().read().get(from) {
            Some(entry) => (
                entry.proc.approvals.clone(),
                &*entry.proc.runtime_name == crate::exec::EXEC_RUNTIME,
            ),
            None => (None, false),
        };
        if let Some(own) = own {
            join(&mut rules, &own);
        }
        if exec && let Some(exec) = self.inner.runtimes().exec().and_then(|rt| rt.get(from)) {
            join(&mut rules, &exec.asked_under());
        }
        if rules.len() > MAX_CARRIED_RULES {
            return Err(KernelError::LimitExceeded(format!(
                "the work process {from} asks for would carry {} approval rules (its own and \
                 its requesters'), more than the {MAX_CARRIED_RULES} one request may carry",
                rules.len()
            )));
        }
        Ok(rules.into())
    }
}
