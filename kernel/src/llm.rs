//! The kernel's model path: which provider serves the processes, and the one
//! door every model call goes through, so usage is counted by the kernel
//! from the provider's own figures.

use std::sync::Arc;

use hivekernel_agents::llm::{
    ChatRequest, ChatResponse, LlmError, OpenAiProvider, OpenAiSettings, Provider,
    ScriptedProvider, Usage,
};
use hivekernel_agents::{Pid, ToolCallReport};

use crate::config::{LlmConfig, ProviderChoice};
use crate::error::KernelError;
use crate::events::EventKind;
use crate::kernel::{Caller, Kernel};
use crate::process::ProcShared;
use crate::store::Write;

/// Overrides `llm.base_url` (and makes `auto` pick `openai`).
pub const BASE_URL_ENV: &str = "HIVEKERNEL_LLM_BASE_URL";
/// Where `openai` goes when neither the config nor the environment names an endpoint.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// The provider chosen for a config, and a one-line description for the log.
#[derive(Debug, Clone)]
pub struct ChosenProvider {
    /// The provider.
    pub provider: Arc<dyn Provider>,
    /// E.g. `openai at http://127.0.0.1:8080/v1` or `scripted (offline, deterministic)`.
    pub description: String,
}

/// Picks and builds the provider for `config`, reading the environment through `env`.
///
/// `auto` picks `openai` when an endpoint is configured (`llm.base_url`,
/// [`BASE_URL_ENV`]) or the API key variable is set, else `scripted`.
/// Errors name the setting or variable that is wrong.
pub fn choose_provider(
    config: &LlmConfig,
    env: impl Fn(&str) -> Option<String>,
) -> Result<ChosenProvider, String> {
    let from_env = env(BASE_URL_ENV).filter(|url| !url.trim().is_empty());
    if let Some(url) = &from_env
        && let Some(problem) = crate::config::base_url_problem(url)
    {
        return Err(format!("{BASE_URL_ENV}: {problem}"));
    }
    let base_url = from_env.or_else(|| config.base_url.clone());
    let api_key = env(&config.api_key_env).filter(|key| !key.trim().is_empty());
    let openai = match config.provider {
        ProviderChoice::Scripted => false,
        ProviderChoice::OpenAi => true,
        ProviderChoice::Auto => base_url.is_some() || api_key.is_some(),
    };
    if !openai {
        return Ok(ChosenProvider {
            provider: Arc::new(ScriptedProvider::new()),
            description: "scripted (offline, deterministic)".into(),
        });
    }
    let base_url = base_url.unwrap_or_else(|| DEFAULT_BASE_URL.to_owned());
    if base_url.trim_end_matches('/') == DEFAULT_BASE_URL && api_key.is_none() {
        return Err(format!(
            "the openai provider at {DEFAULT_BASE_URL} needs an API key, and the variable {} \
             named by llm.api_key_env is not set",
            config.api_key_env
        ));
    }
    let settings = OpenAiSettings {
        base_url: base_url.clone(),
        api_key,
        models: config.models.clone(),
        request_timeout: config.request_timeout,
        max_retries: config.max_retries,
        max_in_flight: config.max_in_flight,
    };
    let provider = OpenAiProvider::new(settings).map_err(|err| err.to_string())?;
    Ok(ChosenProvider {
        provider: Arc::new(provider),
        description: format!("openai at {base_url}"),
    })
}

impl Kernel {
    /// One model call for process `pid`; its usage is recorded against `pid`.
    pub(crate) async fn chat(
        &self,
        pid: Pid,
        request: &ChatRequest,
    ) -> Result<ChatResponse, LlmError> {
        let Some(llm) = self.inner.llm.clone() else {
            return Err(LlmError::Refused(
                "this kernel has no model provider configured".into(),
            ));
        };
        let proc = {
            let table = self.inner.table.read();
            match table.get(pid) {
                Some(entry) if entry.is_alive() => entry.proc.clone(),
                _ => {
                    return Err(LlmError::Refused(format!("process {pid} is not running")));
                }
            }
        };
        let refused = |err: KernelError| {
            self.report(Caller::Process(pid), "llm_call", &err);
            match err {
                KernelError::BudgetExceeded(why) => LlmError::BudgetExceeded(why),
                other => LlmError::Refused(other.to_string()),
            }
        };
        let what = format!("process {pid} may not call a model now");
        proc.usage
            .take_llm_call(proc.limits.llm_calls_per_minute, &what)
            .map_err(refused)?;
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
        let started = std::time::Instant::now();
        let answer = llm.chat(request).await;
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let (usage, error) = match &answer {
            Ok(response) => (response.usage, None),
            Err(err) => (
                Usage::default(),
                Some(cut(err.to_string(), EVENT_ERROR_BYTES)),
            ),
        };
        let (cost_nano_usd, stored) = if answer.is_ok() {
            self.charge(&proc, usage)
        } else {
            (0, None)
        };
        self.inner.events.emit(
            pid,
            EventKind::LlmCall {
                model: proc.ctx.model.clone(),
                prompt_tokens: usage.prompt_tokens,
                completion_tokens: usage.completion_tokens,
                cost_nano_usd,
                duration_ms,
                error,
            },
        );
        // Tokens a crash would forget could be spent twice: the answer waits
        // for the store. (Queued already: a caller that gives up cannot undo it.)
        if let Some(stored) = stored
            && let Err(err) = stored.await
        {
            tracing::warn!(%pid, error = %err, "model usage not stored");
        }
        answer
    }

    /// Records a tool call `pid`'s runtime made, as a `tool_call` event.
    pub(crate) fn tool_called(&self, pid: Pid, report: ToolCallReport) {
        let kind = EventKind::ToolCall {
            ok: report.error.is_none(),
            tool: cut(report.tool, EVENT_TOOL_BYTES),
            duration_ms: u64::try_from(report.duration.as_millis()).unwrap_or(u64::MAX),
            error: report.error.map(|error| cut(error, EVENT_ERROR_BYTES)),
        };
        self.inner.events.emit(pid, kind);
    }

    /// Counts one call's usage for the process, its budget and its ancestors'
    /// subtrees, and queues it for the store in one transaction; answers the
    /// call's cost and, with a store, the commit to wait for.
    fn charge(
        &self,
        proc: &ProcShared,
        usage: Usage,
    ) -> (
        u64,
        Option<impl Future<Output = Result<(), crate::store::StoreError>> + use<>>,
    ) {
        let cost = self
            .inner
            .settings
            .prices
            .get(proc.ctx.model.as_ref())
            .map_or(0, |price| price.cost_nano_usd(usage));
        proc.usage.record_own(usage, cost);
        if let Some(pool) = &proc.budget {
            pool.charge(usage.total());
        }
        let kept = |pid: Pid, proc: &ProcShared| Write::Usage {
            pid,
            own: proc.usage.snapshot(),
            subtree: proc.usage.subtree(),
            budget_spent: proc
                .budget
                .as_ref()
                .filter(|pool| pool.owner() == pid)
                .map(|pool| pool.spent()),
        };
        // Snapshots only for a kernel that keeps them.
        let store = &self.inner.store;
        let durable = store.is_durable();
        let mut writes: Vec<Write> = match durable {
            true => vec![kept(proc.ctx.pid, proc)],
            false => Vec::new(),
        };
        {
            let table = self.inner.table.read();
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

/// Error texts in events are cut to this many bytes.
const EVENT_ERROR_BYTES: usize = 512;
/// Tool names in events (the model may make one up) are cut to this many bytes.
const EVENT_TOOL_BYTES: usize = 128;

use hivekernel_agents::text::cut;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

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

    #[test]
    fn auto_is_scripted_without_an_endpoint_or_key() {
        let chosen = choose_provider(&LlmConfig::default(), env(&[])).unwrap();
        assert_eq!(chosen.provider.name(), "scripted");
    }

    #[test]
    fn auto_uses_the_endpoint_from_the_environment() {
        let vars = [(BASE_URL_ENV, "http://127.0.0.1:9/v1")];
        let chosen = choose_provider(&LlmConfig::default(), env(&vars)).unwrap();
        assert_eq!(chosen.provider.name(), "openai");
        assert_eq!(chosen.description, "openai at http://127.0.0.1:9/v1");
    }

    #[test]
    fn auto_uses_openai_when_the_key_variable_is_set() {
        let vars = [("OPENAI_API_KEY", "sk-test")];
        let chosen = choose_provider(&LlmConfig::default(), env(&vars)).unwrap();
        assert_eq!(chosen.description, format!("openai at {DEFAULT_BASE_URL}"));
    }

    #[test]
    fn openai_without_a_key_for_the_public_endpoint_names_the_variable() {
        let config = LlmConfig {
            provider: ProviderChoice::OpenAi,
            api_key_env: "MY_KEY".into(),
            ..LlmConfig::default()
        };
        let err = choose_provider(&config, env(&[])).unwrap_err();
        assert!(err.contains("MY_KEY"), "{err}");
    }

    #[test]
    fn a_bad_base_url_in_the_environment_is_refused() {
        let vars = [(BASE_URL_ENV, "localhost:8080")];
        let err = choose_provider(&LlmConfig::default(), env(&vars)).unwrap_err();
        assert!(
            err.contains(BASE_URL_ENV) && err.contains("http://"),
            "{err}"
        );
    }

    #[test]
    fn scripted_ignores_the_environment() {
        let config = LlmConfig {
            provider: ProviderChoice::Scripted,
            ..LlmConfig::default()
        };
        let vars = [(BASE_URL_ENV, "http://127.0.0.1:9/v1")];
        let chosen = choose_provider(&config, env(&vars)).unwrap();
        assert_eq!(chosen.provider.name(), "scripted");
    }
}
