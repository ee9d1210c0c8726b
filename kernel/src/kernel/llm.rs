//! Model calls through the kernel: the provider is called for a process,
//! and the usage it reports is charged to the process, its ancestors and
//! their budgets, committed, and recorded as `llm_call` events; tool calls
//! a runtime reports become `tool_call` events. Requests, answers, tool
//! results and what a runtime records itself go into the process's
//! transcript.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hivekernel_agents::llm::{ChatRequest, ChatResponse, LlmError, Retry, Usage, Watch};
use hivekernel_agents::{Pid, ToolCallReport, TurnRecord};
use parking_lot::Mutex;

use crate::budget::Pool;
use crate::error::KernelError;
use crate::events::EventKind;
use crate::kernel::{Caller, Kernel};
use crate::process::ProcShared;
use crate::store::usage::{UsageBy, UsageRow};
use crate::store::{BucketKind, Write};
use crate::transcript::EntryKind as TranscriptKind;

/// Model calls through the kernel ([`Kernel::llm`]): a process's chat requests,
/// what they cost and are charged, and the usage report.
#[derive(Debug, Clone, Copy)]
pub struct LlmHandle<'k> {
    kernel: &'k Kernel,
}

impl Kernel {
    /// The kernel's model calls.
    pub fn llm(&self) -> LlmHandle<'_> {
        LlmHandle { kernel: self }
    }
}

impl LlmHandle<'_> {
    /// One model call for process `pid`; its usage is recorded against `pid`.
    pub(crate) async fn chat(
        self,
        pid: Pid,
        request: &ChatRequest,
    ) -> Result<ChatResponse, LlmError> {
        let Some(llm) = self.kernel.inner.llm() else {
            return Err(LlmError::Refused(
                "this kernel has no model provider configured".into(),
            ));
        };
        let proc = {
            let table = self.kernel.inner.table().read();
            match table.get(pid) {
                Some(entry) if entry.is_alive() => entry.proc.clone(),
                _ => {
                    return Err(LlmError::Refused(format!("process {pid} is not running")));
                }
            }
        };
        let refused = |err: KernelError| {
            self.kernel.report(Caller::Process(pid), "llm_call", &err);
            match err {
                KernelError::BudgetExceeded(why) => LlmError::BudgetExceeded(why),
                other => LlmError::Refused(other.to_string()),
            }
        };
        self.kernel
            .node()
            .still_acting(&proc)
            .await
            .map_err(|err| LlmError::Refused(err.to_string()))?;
        // The turn acts from here: its message leaves the cluster's stream.
        self.kernel
            .hand_over_turn(pid)
            .await
            .map_err(|err| LlmError::Refused(err.to_string()))?;
        let what = format!("process {pid} may not call a model now");
        let level = proc
            .usage
            .take_llm_call(proc.limits.llm_calls_per_minute, &what)
            .map_err(refused)?;
        self.kernel.keep_bucket(pid, BucketKind::LlmCalls, level);
        let left = proc.budget.as_ref().map(|pool| pool.check(pid));
        // The answer may not take more than is left.
        let capped = left
            .transpose()
            .map_err(refused)?
            .map(|left| u32::try_from(left).unwrap_or(u32::MAX))
            .filter(|left| request.max_tokens.is_none_or(|max| max > *left))
            .map(|left| ChatRequest {
                max_tokens: Some(left),
                ..request.clone()
            });
        let request = capped.as_ref().unwrap_or(request);
        let transcripts = self.kernel.inner.transcripts();
        let estimated = hivekernel_agents::llm::estimate_request_tokens(request);
        let calibrated = estimated as f64 * self.token_ratio_of(&proc.ctx.model);
        transcripts.record_request(
            pid,
            proc.ctx.model.clone(),
            request.max_tokens,
            calibrated.round() as u64,
            &request.messages,
        );
        let traces = self.kernel.inner.traces();
        let mut span = traces
            .map(|traces| traces.chat(crate::trace::current(), llm.name(), request, pid))
            .unwrap_or_default();
        let call = Call::new(self.kernel, pid, proc.ctx.model.clone());
        let answer = llm.call(request, &call).await;
        let (started, attempts) = call.end();
        if let Some(traces) = traces {
            traces.answered(&mut span, &answer);
        }
        drop(span);
        let duration_ms = millis(started.elapsed());
        let (usage, error) = match &answer {
            Ok(response) => (response.usage, None),
            Err(err) => (
                Usage::default(),
                Some(cut(err.to_string(), EVENT_ERROR_BYTES)),
            ),
        };
        if let Ok(response) = &answer {
            self.calibrate(&proc.ctx.model, estimated, response.usage.prompt_tokens);
        }
        let (cost_nano_usd, stored) = if answer.is_ok() {
            self.charge(&proc, usage)
        } else {
            (0, None)
        };
        if let Some(metrics) = self.kernel.inner.metrics() {
            metrics.llm_call(
                &proc.ctx.model,
                proc.ctx.role,
                usage,
                cost_nano_usd,
                started.elapsed(),
                answer.is_ok(),
            );
        }
        self.kernel.inner.events().emit(
            pid,
            EventKind::LlmCall {
                model: proc.ctx.model.clone(),
                prompt_tokens: usage.prompt_tokens,
                completion_tokens: usage.completion_tokens,
                cost_nano_usd,
                duration_ms,
                error,
                attempt: (attempts > 1).then_some(attempts),
            },
        );
        // Tokens a crash would forget could be spent twice: the answer waits
        // for the store. (Queued already: a caller that gives up cannot undo it.)
        if let Some(stored) = stored
            && let Err(err) = stored.await
        {
            tracing::warn!(%pid, error = %err, "model usage not stored");
        }
        // After the commit the answer waits for, so that commit does not
        // wait for this entry too.
        transcripts.record(
            pid,
            match &answer {
                Ok(response) => TranscriptKind::Response {
                    content: response.message.content.clone(),
                    tool_calls: response.message.tool_calls.clone(),
                    finish_reason: response.finish_reason.clone(),
                    reasoning: response.message.reasoning.clone(),
                    prompt_tokens: response.usage.prompt_tokens,
                    completion_tokens: response.usage.completion_tokens,
                    duration_ms,
                },
                Err(err) => TranscriptKind::ModelError {
                    error: err.to_string(),
                    duration_ms,
                    partial: None,
                },
            },
        );
        answer
    }

    /// Learns how the server counts `model`'s tokens from a request it
    /// counted as `counted` prompt tokens, keeping the ratio when it moved.
    fn calibrate(self, model: &str, estimated: u64, counted: u64) {
        let settings = self.kernel.inner.settings();
        let served = settings.models.served(model);
        if let Some(ratio) = self
            .kernel
            .inner
            .calibration()
            .observe(served, estimated, counted)
        {
            tracing::debug!(
                model = served,
                ratio = ratio.ratio,
                samples = ratio.samples,
                "token estimate calibrated"
            );
            self.kernel.inner.store().submit(Write::TokenRatio {
                model: served.to_owned(),
                ratio,
            });
        }
    }

    /// Server tokens per estimated token for `pid`'s model (1 when not
    /// learned yet, or `pid` is gone).
    pub(crate) fn token_ratio(self, pid: Pid) -> f64 {
        let model = {
            let table = self.kernel.inner.table().read();
            match table.get(pid) {
                Some(entry) => entry.proc.ctx.model.clone(),
                None => return 1.0,
            }
        };
        self.token_ratio_of(&model)
    }

    /// Server tokens per estimated token for logical `model`.
    fn token_ratio_of(self, model: &str) -> f64 {
        let settings = self.kernel.inner.settings();
        self.kernel
            .inner
            .calibration()
            .ratio(settings.models.served(model))
    }

    /// Model usage over time, summed `by`, from UTC day `since`
    /// (`YYYY-MM-DD`; none: all kept). The operator's: a process may not
    /// read what the whole kernel spends.
    pub async fn usage_report(
        self,
        caller: Caller,
        by: UsageBy,
        since: Option<String>,
    ) -> crate::error::Result<Vec<UsageRow>> {
        if let Caller::Process(pid) = caller {
            return Err(KernelError::PermissionDenied(format!(
                "process {pid} may not read the kernel's usage report (it is the operator's)"
            )));
        }
        if let Some(day) = &since
            && !crate::store::usage::is_day(day)
        {
            return Err(KernelError::InvalidArgument(format!(
                "since_day {} is not a day (expected YYYY-MM-DD)",
                hivekernel_agents::text::shown(day)
            )));
        }
        let store = self.kernel.durable_store("usage over time")?;
        Ok(store.usage_report(by, since).await?)
    }

    /// Records a tool call `pid`'s runtime made, as a `tool_call` event
    /// and in its transcript.
    pub(crate) fn tool_called(self, pid: Pid, report: ToolCallReport) {
        if let Some(traces) = self.kernel.inner.traces() {
            traces.tool_called(crate::trace::current(), pid, &report);
        }
        let ok = report.error.is_none();
        let duration_ms = u64::try_from(report.duration.as_millis()).unwrap_or(u64::MAX);
        self.kernel.inner.transcripts().record(
            pid,
            TranscriptKind::ToolResult {
                call_id: report.call_id,
                tool: report.tool.clone(),
                ok,
                output: report.output,
                duration_ms,
            },
        );
        let kind = EventKind::ToolCall {
            ok,
            tool: cut(report.tool, EVENT_TOOL_BYTES),
            duration_ms,
            error: report.error.map(|error| cut(error, EVENT_ERROR_BYTES)),
        };
        self.kernel.inner.events().emit(pid, kind);
    }

    /// Adds what `pid`'s runtime records to its transcript.
    pub(crate) fn record(self, pid: Pid, record: TurnRecord) {
        let kind = match record {
            TurnRecord::Input { source, text } => TranscriptKind::Input { source, text },
            TurnRecord::Answer(text) => TranscriptKind::Answer { text },
            TurnRecord::Failed(error) => TranscriptKind::Failed { error },
        };
        self.kernel.inner.transcripts().record(pid, kind);
    }

    /// Counts one call's usage for the process, its budget and its ancestors'
    /// subtrees, and queues it for the store in one transaction; answers the
    /// call's cost and, with a store, the commit to wait for.
    fn charge(
        self,
        proc: &ProcShared,
        usage: Usage,
    ) -> (
        u64,
        Option<impl Future<Output = Result<(), crate::store::StoreError>> + use<>>,
    ) {
        let settings = self.kernel.inner.settings();
        let cost = settings
            .prices
            .get(settings.models.priced_as(&proc.ctx.model))
            .map_or(0, |price| price.cost_nano_usd(usage));
        proc.usage.record_own(usage, cost);
        if let Some(pool) = &proc.budget {
            pool.charge(usage.total());
            // On loan from another node: that node hears of it.
            if let Some(root) = pool.on_loan_root()
                && let Some(cluster) = self.kernel.inner.cluster()
            {
                cluster.report_loan(root.owner(), root.spent());
            }
        }
        // Snapshots only for a kernel that keeps them.
        let store = &self.kernel.inner.store();
        let durable = store.is_durable();
        let mut writes: Vec<Write> = match durable {
            true => vec![
                kept(proc.ctx.pid, proc),
                Write::UsageDay {
                    day: crate::store::usage::utc_day(crate::event::unix_ms(
                        std::time::SystemTime::now(),
                    )),
                    model: proc.ctx.model.clone(),
                    role: proc.ctx.role.as_str(),
                    usage,
                    cost_nano_usd: cost,
                },
            ],
            false => Vec::new(),
        };
        {
            let table = self.kernel.inner.table().read();
            let mut at = table.get(proc.ctx.pid).map(|entry| entry.ppid);
            while let Some(ppid) = at {
                let Some(entry) = table.get(ppid) else {
                    break;
                };
                entry.proc.usage.record_descendant(usage, cost);
                if durable {
                    writes.push(kept(ppid, &entry.proc));
                }
                at = (entry.depth > 0).then_some(entry.ppid);
            }
        }
        (cost, durable.then(|| store.commit_all(writes)))
    }
}

/// A model call in progress, as the kernel follows it: answer text that
/// streams in goes to live transcript watchers (a `partial` entry at most
/// every [`PARTIAL_EVERY`]), each failed attempt that is tried again
/// becomes an `llm_call` event and a `model_error` entry, and a call
/// dropped before it ends (its task cancelled) is recorded as cancelled.
struct Call<'a> {
    kernel: &'a Kernel,
    pid: Pid,
    model: Arc<str>,
    started: Instant,
    state: Mutex<Streamed>,
}

/// What the current attempt has streamed.
#[derive(Debug, Default)]
struct Streamed {
    /// Its answer text.
    text: String,
    /// Bytes of `text` already sent live.
    sent: usize,
    /// Reasoning not yet sent live.
    reasoning: String,
    /// When a partial entry last went out.
    last_sent: Option<Instant>,
    /// Attempts so far, this one included.
    attempts: u32,
    /// The call has answered or failed (not cancelled).
    ended: bool,
}

/// Streamed text goes out live at most this often (and at once when more
/// than [`PARTIAL_BYTES`] wait), so a fast model makes no entry per token.
const PARTIAL_EVERY: Duration = Duration::from_millis(100);
const PARTIAL_BYTES: usize = 4096;

impl<'a> Call<'a> {
    fn new(kernel: &'a Kernel, pid: Pid, model: Arc<str>) -> Self {
        Call {
            kernel,
            pid,
            model,
            started: Instant::now(),
            state: Mutex::new(Streamed {
                attempts: 1,
                ..Streamed::default()
            }),
        }
    }

    /// The call has ended: when it started, and how many attempts it made.
    fn end(&self) -> (Instant, u32) {
        let mut state = self.state.lock();
        state.ended = true;
        (self.started, state.attempts)
    }

    /// The text streamed so far, if any.
    fn partial(state: &Streamed) -> Option<String> {
        (!state.text.is_empty()).then(|| state.text.clone())
    }

    /// An `llm_call` event and a `model_error` entry for a failed attempt.
    fn failed(&self, error: String, took: Duration, attempt: u32, partial: Option<String>) {
        let duration_ms = millis(took);
        self.kernel.inner.events().emit(
            self.pid,
            EventKind::LlmCall {
                model: self.model.clone(),
                prompt_tokens: 0,
                completion_tokens: 0,
                cost_nano_usd: 0,
                duration_ms,
                error: Some(cut(error.clone(), EVENT_ERROR_BYTES)),
                attempt: Some(attempt),
            },
        );
        self.kernel.inner.transcripts().record(
            self.pid,
            TranscriptKind::ModelError {
                error,
                duration_ms,
                partial,
            },
        );
    }
}

impl Watch for Call<'_> {
    fn streamed(&self, text: &str, reasoning: bool) {
        let transcripts = self.kernel.inner.transcripts();
        let due = {
            let mut state = self.state.lock();
            match reasoning {
                true => state.reasoning.push_str(text),
                false => state.text.push_str(text),
            }
            if !transcripts.watched() {
                state.reasoning.clear();
                return;
            }
            let waiting = state.text.len() - state.sent + state.reasoning.len();
            let due = state
                .last_sent
                .is_none_or(|at| at.elapsed() >= PARTIAL_EVERY || waiting >= PARTIAL_BYTES);
            if !due {
                return;
            }
            state.last_sent = Some(Instant::now());
            let thought = std::mem::take(&mut state.reasoning);
            let said = state.text.get(state.sent..).unwrap_or_default().to_owned();
            state.sent = state.text.len();
            [(thought, true), (said, false)]
        };
        for (text, reasoning) in due {
            if !text.is_empty() {
                transcripts.stream(self.pid, TranscriptKind::Partial { text, reasoning });
            }
        }
    }

    fn retrying(&self, retry: &Retry<'_>) {
        let partial = {
            let mut state = self.state.lock();
            let partial = Self::partial(&state);
            *state = Streamed {
                attempts: retry.attempt + 1,
                ..Streamed::default()
            };
            partial
        };
        let error = format!(
            "attempt {}: {}; trying again in {:.1} s",
            retry.attempt,
            retry.error,
            retry.wait.as_secs_f64()
        );
        self.failed(error, retry.took, retry.attempt, partial);
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        let state = self.state.get_mut();
        if state.ended {
            return;
        }
        // The task was cancelled mid-call: the connection is closed with
        // the dropped request, and the call is recorded as what it was.
        let took = self.started.elapsed();
        let error = format!(
            "cancelled after {:.1} s (attempt {}): the task ended before the model answered",
            took.as_secs_f64(),
            state.attempts
        );
        let (attempt, partial) = (state.attempts, Self::partial(state));
        self.failed(error, took, attempt, partial);
    }
}

pub(super) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Process `pid`'s usage and what its own budget spent, as the store keeps
/// them.
pub(super) fn kept(pid: Pid, proc: &ProcShared) -> Write {
    Write::Usage {
        pid,
        own: proc.usage.snapshot(),
        subtree: proc.usage.subtree(),
        budget_spent: proc.own_budget().map(Pool::spent),
    }
}

/// Error texts in events are cut to this many bytes.
const EVENT_ERROR_BYTES: usize = 512;
/// Tool names in events (the model may make one up) are cut to this many bytes.
const EVENT_TOOL_BYTES: usize = 128;

use hivekernel_agents::text::cut;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_texts_are_cut_on_a_character_boundary_within_the_limit() {
        assert_eq!(cut("short".into(), 8), "short");
        let cut_text = cut("é".repeat(100), 64);
        assert!(cut_text.len() <= 64, "{cut_text}");
        assert_eq!(
            cut_text,
            format!("{}… [cut: 200 bytes in all]", "é".repeat(18))
        );
        let long = cut("x".repeat(600), EVENT_ERROR_BYTES);
        assert!(long.len() <= EVENT_ERROR_BYTES && long.len() > EVENT_ERROR_BYTES - 4);
    }
}
