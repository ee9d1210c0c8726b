//! What an entry does when it fires; each action acts as the operator
//! (PID 1), which is an ancestor of every process.

use std::sync::atomic::{AtomicU64, Ordering};

use hivekernel_agents::{Outgoing, TaskSpec};

use super::CronHandle;
use super::{CronAction, CronSpec, OUTPUT_PREVIEW};
use crate::kernel::Caller;

/// Message kind of the `message` action.
pub const CRON_MESSAGE: &str = "cron";

/// Numbers the agents the `spawn` action starts.
static SPAWNED: AtomicU64 = AtomicU64::new(1);

impl CronHandle<'_> {
    /// Runs `spec`'s action once; `Ok` carries the answer, `Err` why it failed.
    pub(super) async fn run(self, spec: &CronSpec) -> Result<String, String> {
        let task = || {
            let mut task = TaskSpec::new(spec.target, spec.description.clone());
            task.params.insert("cron".into(), spec.name.clone());
            task
        };
        match spec.action {
            CronAction::Execute => {
                let (_, reply) = self
                    .kernel
                    .execute_task(Caller::Admin, task())
                    .await
                    .map_err(|e| e.to_string())?;
                reply
            }
            CronAction::Message => {
                let mut message = Outgoing::new(spec.target, spec.description.clone());
                message.kind = CRON_MESSAGE.to_owned();
                self.kernel
                    .send_message(Caller::Admin, message)
                    .await
                    .map(|id| format!("message {} delivered", id.0))
                    .map_err(|e| e.to_string())
            }
            CronAction::Spawn => self.run_from_template(spec, task()).await,
        }
    }

    /// Spawns a fresh agent from the template, runs the task, then kills and collects it.
    async fn run_from_template(
        self,
        spec: &CronSpec,
        mut task: TaskSpec,
    ) -> Result<String, String> {
        let template = spec.template.as_deref().unwrap_or_default();
        let Some(mut request) = self.kernel.inner.cron().template(template) else {
            return Err(format!("template {template:?} is not in the config"));
        };
        request.parent = spec.target;
        request.name = format!(
            "{template}-cron-{}",
            SPAWNED.fetch_add(1, Ordering::Relaxed)
        );
        let pid = self
            .kernel
            .spawn(Caller::Admin, request)
            .await
            .map_err(|e| format!("cannot spawn from template {template:?}: {e}"))?;
        task.to = pid;
        let outcome = self.kernel.execute_task(Caller::Admin, task).await;
        self.kernel
            .dismiss(Caller::Admin, pid, "cron run finished")
            .await;
        let (_, reply) = outcome.map_err(|e| e.to_string())?;
        reply
    }
}

/// `text` cut to at most [`OUTPUT_PREVIEW`] bytes.
pub(super) fn preview(text: &str) -> String {
    hivekernel_agents::text::cut_str(text, OUTPUT_PREVIEW)
}
