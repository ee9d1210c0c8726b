//! The `llm` and `tool_agent` sections, both phases: the model provider, and
//! how every `tool_agent` process and its configurable tools behave.
//!
//! ```json
//! "llm": {
//!   "provider": "auto",                 // auto | scripted | openai
//!   "base_url": "https://api.openai.com/v1",
//!   "api_key_env": "OPENAI_API_KEY",
//!   "models": { "sonnet": "gpt-4o" },
//!   "default_model": "sonnet",          // for agents and spawns that name none
//!   "context_tokens": { "sonnet": 128000 },
//!   "default_context_tokens": 128000,
//!   "max_completion_tokens": 4096,
//!   "stream": true,                     // answers as server-sent events
//!   "first_token_timeout_seconds": 120, "idle_timeout_seconds": 60,
//!   "request_timeout_seconds": 600,     // cap on one attempt, streamed or not
//!   "max_retries": 3, "unavailable_wait_seconds": 60, "max_in_flight": 16,
//!   "strict_roles": false, "strict_models": false,
//!   "max_answer_bytes": 4194304, "max_tool_calls": 64,
//!   "max_tool_definition_bytes": 262144,
//!   "prices": { "gpt-4o": { "input_per_million": 2.5, "output_per_million": 10 } }
//! },
//! "tool_agent": {
//!   "max_tool_iterations": 10,
//!   "max_tool_result_bytes": 65536,
//!   "orchestrate": { "worker_prompt_file": "../prompts/worker.md", "max_workers": 8,
//!                    "subtask_timeout_seconds": 120, "worker_model": "mini" },
//!   "web": { "allow_private_networks": false, "allow_addresses": ["10.0.0.7"],
//!            "max_bytes": 2097152, "timeout_seconds": 30, "max_redirects": 5 },
//!   "skills": { "catalogue_tokens": 4000, "active_tokens": 16000 },
//!   "budget_in_prompt": true
//! }
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;

use hivekernel_agents::tool_agent::AgentSettings;
use hivekernel_agents::tools::ToolSettings;
use hivekernel_agents::tools::orchestrate::OrchestrateSettings;
use hivekernel_agents::tools::web::WebSettings;
use serde::Deserialize;
use serde_json::Value;

use super::parse::{section, settings};
use super::validate::{Context, in_range, read_prompt};
use super::{ConfigIssue, LlmConfig, ModelNames};
use crate::budget::{Price, Prices};
use validator::ValidationError;

/// The `tool_agent` section as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawToolAgent {
    max_tool_iterations: u32,
    max_tool_result_bytes: usize,
    orchestrate: Option<Value>,
    web: Option<Value>,
    shell: Option<Value>,
    skills: Option<Value>,
    budget_in_prompt: bool,
    continue_on_length: u32,
}

impl Default for RawToolAgent {
    fn default() -> Self {
        let agent = AgentSettings::default();
        RawToolAgent {
            max_tool_iterations: agent.max_tool_iterations,
            max_tool_result_bytes: agent.max_tool_result_bytes,
            orchestrate: None,
            web: None,
            shell: None,
            skills: None,
            budget_in_prompt: agent.budget_in_prompt,
            continue_on_length: agent.continue_on_length,
        }
    }
}

/// What the agents' settings take from `llm`: context sizes, and the room
/// for tool definitions.
#[derive(Debug)]
pub(super) struct ContextSizes {
    context_tokens: BTreeMap<String, u64>,
    default_context_tokens: u64,
    max_completion_tokens: u32,
    max_tool_definition_bytes: usize,
}

/// Smallest `llm.max_answer_bytes`: room for a short answer and its calls.
pub(super) const MIN_ANSWER_BYTES: usize = 4 << 10;

/// Smallest `llm.max_tool_definition_bytes`: room for every built-in tool,
/// which a request always offers whole.
pub(super) const MIN_TOOL_DEFINITION_BYTES: usize = 64 << 10;

/// Largest context window a model may be given, in tokens.
pub(super) const MAX_CONTEXT: u64 = 100_000_000;

/// `llm.base_url`: an http or https API root.
pub(super) fn base_url_check(url: &str) -> Result<(), ValidationError> {
    match base_url_problem(url) {
        None => Ok(()),
        Some(problem) => Err(ValidationError::new("base_url").with_message(problem.into())),
    }
}

/// `llm.api_key_env`: the name of a variable, never the key itself.
pub(super) fn env_name_check(name: &str) -> Result<(), ValidationError> {
    if is_env_name(name) {
        return Ok(());
    }
    Err(ValidationError::new("env_name").with_message(
        format!(
            "{name:?} is not an environment variable name (letters, digits and _, not starting \
             with a digit); name the variable that holds the key, never the key itself"
        )
        .into(),
    ))
}

/// Parses and checks `llm`.
pub(super) fn llm(
    value: Option<&Value>,
    issues: &mut Vec<ConfigIssue>,
) -> (LlmConfig, ModelNames, ContextSizes, Prices) {
    let llm: LlmConfig = settings(value, "llm", issues).value;
    for (name, id) in &llm.models {
        if name.trim().is_empty() || id.trim().is_empty() {
            issues.push(ConfigIssue::new(
                format!("llm.models.{name}"),
                format!("model names and ids must not be empty, got {name:?} -> {id:?}"),
            ));
        }
    }
    if let Some(name) = &llm.default_model
        && name.trim().is_empty()
    {
        issues.push(ConfigIssue::new(
            "llm.default_model",
            "must name a model (or be left out: then agents without a model have none)",
        ));
    }
    for (name, tokens) in &llm.context_tokens {
        in_range(
            *tokens,
            1024..=MAX_CONTEXT,
            &format!("llm.context_tokens.{name}"),
            issues,
        );
    }
    let prices = prices(&llm.prices, &llm.models, issues);
    let names = ModelNames {
        models: llm.models.clone(),
        default_model: llm.default_model.clone(),
        serve_all: None,
        // Filled once the agents are read.
        configured: Default::default(),
    };
    let sizes = ContextSizes {
        context_tokens: llm.context_tokens.clone(),
        default_context_tokens: llm.default_context_tokens,
        max_completion_tokens: llm.max_completion_tokens,
        max_tool_definition_bytes: llm.max_tool_definition_bytes,
    };
    (llm, names, sizes, prices)
}

/// `llm.prices` with their ranges checked: model name -> dollars per
/// million tokens. A price given for a provider's model id also applies to
/// the names mapped to it.
fn prices(
    given: &BTreeMap<String, Price>,
    models: &BTreeMap<String, String>,
    issues: &mut Vec<ConfigIssue>,
) -> Prices {
    let mut prices = Prices::new();
    for (name, price) in given {
        for (field, dollars) in [
            ("input_per_million", price.input_per_million),
            ("output_per_million", price.output_per_million),
        ] {
            if !(dollars.is_finite() && (0.0..=1_000_000.0).contains(&dollars)) {
                issues.push(ConfigIssue::new(
                    format!("llm.prices.{name}.{field}"),
                    format!("must be between 0 and 1000000 dollars, got {dollars}"),
                ));
            }
        }
        prices.insert(name.clone(), *price);
    }
    for (name, id) in models {
        if let Some(price) = prices.get(id).copied() {
            prices.entry(name.clone()).or_insert(price);
        }
    }
    prices
}

/// Parses and checks `tool_agent`.
pub(super) fn tool_agent(
    value: Option<&Value>,
    checks: &Context<'_>,
    sizes: ContextSizes,
    prompt_bytes: usize,
    issues: &mut Vec<ConfigIssue>,
) -> (AgentSettings, ToolSettings) {
    let raw = section::<RawToolAgent>(value, "tool_agent", issues).value;
    in_range(
        raw.max_tool_iterations,
        1..=1000,
        "tool_agent.max_tool_iterations",
        issues,
    );
    in_range(
        raw.max_tool_result_bytes,
        256..=16 * 1024 * 1024,
        "tool_agent.max_tool_result_bytes",
        issues,
    );
    in_range(
        raw.continue_on_length,
        0..=16,
        "tool_agent.continue_on_length",
        issues,
    );
    let mut agent = AgentSettings {
        max_tool_iterations: raw.max_tool_iterations,
        context_tokens: sizes.context_tokens,
        default_context_tokens: sizes.default_context_tokens,
        max_completion_tokens: sizes.max_completion_tokens,
        max_tool_definition_bytes: sizes.max_tool_definition_bytes,
        max_tool_result_bytes: raw.max_tool_result_bytes,
        provider: String::new(),
        budget_in_prompt: raw.budget_in_prompt,
        continue_on_length: raw.continue_on_length,
        ..AgentSettings::default()
    };
    super::skills::prompt(raw.skills.as_ref(), &mut agent, issues);

    let web = web(raw.web.as_ref(), issues);
    let shell = super::sandbox::shell(raw.shell.as_ref(), checks, issues);
    let mut orchestrate: OrchestrateSettings =
        settings(raw.orchestrate.as_ref(), "tool_agent.orchestrate", issues).value;
    if let Some(runtime) = &orchestrate.worker_runtime
        && let Some(problem) = checks.runtime_problem(runtime)
    {
        issues.push(ConfigIssue::new(
            "tool_agent.orchestrate.worker_runtime",
            problem,
        ));
    }
    let prompt_location = "tool_agent.orchestrate.worker_prompt_file";
    if let Some(path) = orchestrate
        .worker_prompt_file
        .as_deref()
        .and_then(|file| checks.path_field(file, prompt_location, issues))
    {
        let text = read_prompt(&path, prompt_location, prompt_bytes, issues);
        if !text.trim().is_empty() {
            orchestrate.worker_prompt = Arc::from(text);
        }
    }
    (
        agent,
        ToolSettings {
            orchestrate,
            web,
            shell,
        },
    )
}

/// Parses and checks `tool_agent.web`.
fn web(value: Option<&Value>, issues: &mut Vec<ConfigIssue>) -> WebSettings {
    settings(value, "tool_agent.web", issues).value
}

/// Why `url` cannot be an API root, if it cannot.
pub(crate) fn base_url_problem(url: &str) -> Option<String> {
    url_problem(url, "https://api.openai.com/v1")
}

/// Why `url` cannot be an HTTP endpoint, if it cannot; `example` shows a good one.
pub(crate) fn url_problem(url: &str, example: &str) -> Option<String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    match rest {
        None => Some(format!(
            "{url:?} must start with http:// or https:// (e.g. {example})"
        )),
        Some(rest) if rest.is_empty() || rest.starts_with('/') => {
            Some(format!("{url:?} has no host"))
        }
        Some(_) if url.chars().any(char::is_whitespace) => {
            Some(format!("{url:?} contains whitespace"))
        }
        Some(_) => None,
    }
}

/// Whether `name` is a portable environment variable name.
pub(super) fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The runtime whose processes call a model through the kernel.
pub(crate) const TOOL_AGENT: &str = "tool_agent";

impl super::Config {
    /// The runtime `agent` runs: its own, `exec` for a command, else the
    /// kernel's default.
    pub fn runtime_of<'a>(&'a self, agent: &'a super::AgentSpec) -> &'a str {
        match (&agent.runtime, &agent.exec) {
            (Some(runtime), _) => runtime,
            (None, Some(_)) => crate::command::EXEC_RUNTIME,
            (None, None) => &self.kernel.default_runtime,
        }
    }

    /// Sends every model as `model` (`start --model`), over `llm.models`
    /// and `HIVEKERNEL_LLM_MODEL`; nothing when `None` or blank.
    pub fn serve_all(&mut self, model: Option<&str>) {
        if let Some(model) = model.map(str::trim).filter(|model| !model.is_empty()) {
            self.kernel.models.serve_all = Some(model.to_owned());
        }
    }

    /// One line per config agent: the model it will use and the name the
    /// server is sent; and a warning per model-calling agent with none.
    pub fn model_lines(&self) -> (String, Vec<String>) {
        let names = &self.kernel.models;
        let width = self.agents.iter().map(|a| a.name.len()).max().unwrap_or(0);
        let mut text = match &names.serve_all {
            Some(all) => format!("models (every one sent as {all}):\n"),
            None => "models:\n".to_owned(),
        };
        let mut warnings = Vec::new();
        for agent in &self.agents {
            let runtime = self.runtime_of(agent);
            let model = names.model_of(&agent.model);
            let what = match (runtime != TOOL_AGENT, model.is_empty()) {
                (true, _) => format!("none (the {runtime} runtime calls no model)"),
                (false, true) => {
                    warnings.push(format!(
                        "agent {} names no model and there is no llm.default_model: \
                         its first model call will fail",
                        agent.name
                    ));
                    "none (set its model or llm.default_model)".to_owned()
                }
                (false, false) => {
                    let default = if agent.model.is_empty() {
                        " (the default)"
                    } else {
                        ""
                    };
                    match names.served(model) {
                        served if served == model => format!("{model}{default}"),
                        served => format!("{model}{default}, sent as {served}"),
                    }
                }
            };
            text.push_str(&format!("  {:<width$}  {what}\n", agent.name));
        }
        (text, warnings)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn every_built_in_tool_fits_the_smallest_room_for_tool_definitions() {
        let tools = hivekernel_agents::tools::ToolRegistry::builtin();
        let bytes: usize = tools
            .names()
            .into_iter()
            .map(|name| tools.get(name).unwrap().schema().definition_bytes())
            .sum();
        // Half at most, leaving room for the skill tools and some MCP ones.
        assert!(bytes <= MIN_TOOL_DEFINITION_BYTES / 2, "{bytes} bytes");
    }
}
