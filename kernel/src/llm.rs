//! The kernel's model path: which provider serves the processes, and the one
//! door every model call goes through, so usage is counted by the kernel
//! from the provider's own figures.

use std::sync::Arc;
use std::time::Duration;

use hivekernel_agents::llm::catalogue::Catalogue;
use hivekernel_agents::llm::{OpenAiProvider, OpenAiSettings, Provider, ScriptedProvider};
use hivekernel_agents::tool_agent::AgentSettings;

use crate::config::{Config, LlmConfig, ModelNames, ProviderChoice};

/// Overrides `llm.base_url` (and makes `auto` pick `openai`).
pub const BASE_URL_ENV: &str = "HIVEKERNEL_LLM_BASE_URL";
pub use crate::config::MODEL_ENV;
/// Where `openai` goes when neither the config nor the environment names an endpoint.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// The provider chosen for a config, and a one-line description for the log.
#[derive(Debug, Clone)]
pub struct ChosenProvider {
    /// The provider.
    pub provider: Arc<dyn Provider>,
    /// The same provider when it talks to an OpenAI-compatible server,
    /// which can be asked what it serves.
    pub openai: Option<OpenAiProvider>,
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
    names: &ModelNames,
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
            openai: None,
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
        models: names.models.clone(),
        serve_all: names.serve_all.clone(),
        stream: config.stream,
        first_token_timeout: Duration::from_secs(config.first_token_timeout_seconds),
        idle_timeout: Duration::from_secs(config.idle_timeout_seconds),
        request_timeout: Duration::from_secs(config.request_timeout_seconds),
        max_retries: config.max_retries,
        unavailable_wait: Duration::from_secs(config.unavailable_wait_seconds),
        max_in_flight: config.max_in_flight,
        strict_roles: config.strict_roles,
        max_completion_tokens: config.max_completion_tokens,
        parallel_tool_calls: config.parallel_tool_calls,
        limits: config.limits(),
    };
    let provider = OpenAiProvider::new(settings).map_err(|err| err.to_string())?;
    Ok(ChosenProvider {
        provider: Arc::new(provider.clone()),
        openai: Some(provider),
        description: format!("openai at {base_url}"),
    })
}

/// What a llama.cpp server whose chat template renders no tools needs.
pub(crate) const TEMPLATE_WITH_TOOLS: &str =
    "start llama-server with --jinja and a chat template that takes tools";

/// Asks the server what it serves, and holds the config to it: every
/// model the config sends must be listed (a warning each, or with
/// `llm.strict_models` an error naming them all), and a context window the
/// server reports replaces the configured one for the names sent as that
/// model. A server that lists nothing is not checked (a debug log says why).
pub async fn check_served(
    openai: &OpenAiProvider,
    config: &Config,
    agent: &mut AgentSettings,
) -> Result<(), String> {
    let mut catalogue = match openai.catalogue().await {
        Ok(catalogue) => catalogue,
        Err(why) => {
            tracing::info!(error = %why, "the model server lists no models; model names are not checked");
            return Ok(());
        }
    };
    ask_ollama(openai, config, &mut catalogue).await;
    let names = &config.kernel.models;
    let mut unknown = Vec::new();
    let mut missing: Vec<&str> = Vec::new();
    // Served models whose template drops tools, warned of once each.
    let mut toolless: Vec<&str> = Vec::new();
    let agents_have_tools = config.agents.iter().any(|agent| !agent.tools.is_empty());
    for (logical, served) in models_sent(config) {
        match catalogue.get(served) {
            None if missing.contains(&served) => {}
            None => {
                missing.push(served);
                unknown.push(match logical == served {
                    true => format!("{served:?}"),
                    false => format!("{served:?} (for {logical})"),
                });
            }
            Some(model) => {
                if model.template_tools == Some(false)
                    && agents_have_tools
                    && !toolless.contains(&served)
                {
                    toolless.push(served);
                    tracing::warn!(
                        model = %served,
                        "the server's chat template does not render tools (llama.cpp's /props): \
                         agents' tools never reach the model; {TEMPLATE_WITH_TOOLS}"
                    );
                }
                let Some(window) = model.context_tokens else {
                    continue;
                };
                if window <= u64::from(agent.max_completion_tokens) {
                    tracing::warn!(
                        model = %served,
                        context_tokens = window,
                        max_completion_tokens = agent.max_completion_tokens,
                        "the server's context window is no larger than llm.max_completion_tokens: \
                         lower that, or answers crowd out the conversation"
                    );
                }
                agent.context_tokens.insert(logical.to_owned(), window);
                if names.serve_all.is_some() {
                    agent.default_context_tokens = window;
                }
                tracing::info!(model = %logical, %served, context_tokens = window, "context window from the server");
            }
        }
    }
    if unknown.is_empty() {
        return Ok(());
    }
    let mut problem = format!(
        "the model server does not list {} (it lists: {})",
        unknown.join(", "),
        catalogue.ids(20)
    );
    if names.serve_all.is_none() {
        problem.push_str(&format!(
            "; to send one of those for every model, start with --model NAME or set {}",
            crate::config::MODEL_ENV
        ));
    }
    if config.llm.strict_models {
        return Err(format!("llm.strict_models: {problem}"));
    }
    tracing::warn!("{problem}; requests naming them will fail");
    Ok(())
}

/// Fills in the windows an Ollama server runs the sent models with (the
/// `num_ctx` of their Modelfiles). A server that is not Ollama is asked
/// once; a model without `num_ctx` keeps the configured window, with a
/// note of what Ollama does instead.
pub(crate) async fn ask_ollama(
    openai: &OpenAiProvider,
    config: &Config,
    catalogue: &mut Catalogue,
) {
    let mut asked: Vec<&str> = Vec::new();
    for (_, served) in models_sent(config) {
        let Some(model) = catalogue.models.iter_mut().find(|m| m.id == served) else {
            continue;
        };
        if model.context_tokens.is_some() || asked.contains(&served) {
            continue;
        }
        asked.push(served);
        let Some(context) = openai.ollama_context(served).await else {
            // Not Ollama (or it does not know the model): nothing to learn.
            return;
        };
        match context.num_ctx {
            Some(window) => model.context_tokens = Some(window),
            None => tracing::info!(
                model = served,
                trained_context_tokens = context.trained,
                "Ollama runs this model with its default context (OLLAMA_CONTEXT_LENGTH), \
                 as its Modelfile sets no num_ctx; set llm.context_tokens to match"
            ),
        }
    }
}

/// Every (logical, served) model pair the config can send: its agents'
/// (or the default), the default, orchestrate's workers', and the names
/// `llm.models` maps; each logical name once.
pub(crate) fn models_sent(config: &Config) -> Vec<(&str, &str)> {
    let names = &config.kernel.models;
    let agents = config
        .agents
        .iter()
        .filter(|agent| config.runtime_of(agent) == crate::config::TOOL_AGENT)
        .map(|agent| names.model_of(&agent.model));
    let logical = agents
        .chain(names.default_model.as_deref())
        .chain(config.tools.orchestrate.worker_model.as_deref())
        .chain(names.models.keys().map(String::as_str))
        .filter(|model| !model.is_empty());
    let mut sent: Vec<(&str, &str)> = Vec::new();
    for model in logical {
        if !sent.iter().any(|(name, _)| *name == model) {
            sent.push((model, names.served(model)));
        }
    }
    sent
}

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
    fn auto_is_scripted_without_an_endpoint_or_key() {
        let chosen =
            choose_provider(&LlmConfig::default(), &ModelNames::default(), env(&[])).unwrap();
        assert_eq!(chosen.provider.name(), "scripted");
    }

    #[test]
    fn auto_uses_the_endpoint_from_the_environment() {
        let vars = [(BASE_URL_ENV, "http://127.0.0.1:9/v1")];
        let chosen =
            choose_provider(&LlmConfig::default(), &ModelNames::default(), env(&vars)).unwrap();
        assert_eq!(chosen.provider.name(), "openai");
        assert_eq!(chosen.description, "openai at http://127.0.0.1:9/v1");
    }

    #[test]
    fn auto_uses_openai_when_the_key_variable_is_set() {
        let vars = [("OPENAI_API_KEY", "sk-test")];
        let chosen =
            choose_provider(&LlmConfig::default(), &ModelNames::default(), env(&vars)).unwrap();
        assert_eq!(chosen.description, format!("openai at {DEFAULT_BASE_URL}"));
    }

    #[test]
    fn openai_without_a_key_for_the_public_endpoint_names_the_variable() {
        let config = LlmConfig {
            provider: ProviderChoice::OpenAi,
            api_key_env: "MY_KEY".into(),
            ..LlmConfig::default()
        };
        let err = choose_provider(&config, &ModelNames::default(), env(&[])).unwrap_err();
        assert!(err.contains("MY_KEY"), "{err}");
    }

    #[test]
    fn a_bad_base_url_in_the_environment_is_refused() {
        let vars = [(BASE_URL_ENV, "localhost:8080")];
        let err =
            choose_provider(&LlmConfig::default(), &ModelNames::default(), env(&vars)).unwrap_err();
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
        let chosen = choose_provider(&config, &ModelNames::default(), env(&vars)).unwrap();
        assert_eq!(chosen.provider.name(), "scripted");
    }
}
