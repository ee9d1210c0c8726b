//! What an OpenAI-compatible server says it serves: its model list
//! (`GET {base_url}/models`) and, where the server tells, each model's
//! context window: vLLM puts `max_model_len` in the list; llama.cpp's
//! `GET /props` (at the server's root) gives the context of one slot,
//! `default_generation_settings.n_ctx`, which is what a request may fill,
//! and whether its chat template renders tools (`chat_template_caps`);
//! Ollama (which answers `GET /api/version`) says in `POST /api/show` the
//! `num_ctx` a model's Modelfile sets, which is what it runs the model with.

use std::time::Duration;

use serde::Deserialize;

/// Longest the kernel waits for a server to say what it serves.
pub const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// Most bytes of such an answer read (a model list with descriptions of
/// every model is a few MB at most).
pub const ASK_MAX_BYTES: usize = 32 << 20;

/// The models a server lists.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Catalogue {
    /// In the order the server listed them.
    pub models: Vec<ServedModel>,
}

/// One model a server lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedModel {
    /// The id requests name it by.
    pub id: String,
    /// Its context window in tokens, when the server says.
    pub context_tokens: Option<u64>,
    /// Whether the chat template the server applies renders the tools a
    /// request offers, when the server says (llama.cpp's
    /// `chat_template_caps.supports_tools`): a template without them drops
    /// the tools, and the model never hears of them.
    pub template_tools: Option<bool>,
}

impl Catalogue {
    /// The listed model with `id`.
    pub fn get(&self, id: &str) -> Option<&ServedModel> {
        self.models.iter().find(|model| model.id == id)
    }

    /// The ids, comma-separated, at most `max` of them.
    pub fn ids(&self, max: usize) -> String {
        let mut ids: Vec<&str> = self
            .models
            .iter()
            .take(max)
            .map(|m| m.id.as_str())
            .collect();
        if self.models.len() > max {
            ids.push("...");
        }
        ids.join(", ")
    }
}

#[derive(Deserialize)]
struct List {
    data: Vec<Listed>,
}

#[derive(Deserialize)]
struct Listed {
    id: String,
    /// vLLM.
    #[serde(default)]
    max_model_len: Option<u64>,
}

#[derive(Deserialize)]
struct Props {
    default_generation_settings: Option<Generation>,
    chat_template_caps: Option<TemplateCaps>,
}

#[derive(Deserialize)]
struct TemplateCaps {
    supports_tools: Option<bool>,
}

/// What llama.cpp's `/props` says of the one model it serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct SlotProps {
    /// The context of one slot.
    pub n_ctx: Option<u64>,
    /// Whether its chat template renders tools.
    pub template_tools: Option<bool>,
}

#[derive(Deserialize)]
struct Generation {
    n_ctx: Option<u64>,
}

/// Parses a `/models` answer; `None` when it is not a model list.
pub(super) fn parse_list(body: &[u8]) -> Option<Catalogue> {
    let list: List = serde_json::from_slice(body).ok()?;
    let models = list
        .data
        .into_iter()
        .filter(|model| !model.id.is_empty())
        .map(|model| ServedModel {
            id: model.id,
            context_tokens: model.max_model_len.filter(|n| *n > 0),
            template_tools: None,
        })
        .collect();
    Some(Catalogue { models })
}

#[derive(Deserialize)]
struct Show {
    #[serde(default)]
    parameters: Option<String>,
    #[serde(default)]
    model_info: Option<serde_json::Map<String, serde_json::Value>>,
}

/// What Ollama's `/api/show` says of a model's context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OllamaContext {
    /// `num_ctx` from its Modelfile's parameters: the window it runs with.
    pub num_ctx: Option<u64>,
    /// `<architecture>.context_length`: what the model was trained for
    /// (Ollama runs it with less unless `num_ctx` says otherwise).
    pub trained: Option<u64>,
}

/// Parses an Ollama `/api/show` answer; `None` when it is not one.
pub(super) fn parse_show(body: &[u8]) -> Option<OllamaContext> {
    let show: Show = serde_json::from_slice(body).ok()?;
    let num_ctx = show.parameters.as_deref().and_then(|parameters| {
        parameters.lines().find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("num_ctx"))
                .then(|| words.next()?.parse::<u64>().ok())
                .flatten()
        })
    });
    let trained = show.model_info.as_ref().and_then(|info| {
        info.iter()
            .find(|(key, _)| key.ends_with(".context_length"))
            .and_then(|(_, value)| value.as_u64())
    });
    if show.parameters.is_none() && show.model_info.is_none() {
        return None;
    }
    Some(OllamaContext {
        num_ctx: num_ctx.filter(|n| *n > 0),
        trained: trained.filter(|n| *n > 0),
    })
}

/// A llama.cpp `/props` answer; `None` when it is not one.
pub(super) fn parse_props(body: &[u8]) -> Option<SlotProps> {
    let props: Props = serde_json::from_slice(body).ok()?;
    Some(SlotProps {
        n_ctx: props
            .default_generation_settings
            .and_then(|settings| settings.n_ctx)
            .filter(|n| *n > 0),
        template_tools: props
            .chat_template_caps
            .and_then(|caps| caps.supports_tools),
    })
}

/// The server's root for `base_url`: without a trailing `/v1`.
pub(super) fn root(base_url: &str) -> &str {
    base_url.strip_suffix("/v1").unwrap_or(base_url)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn reads_openai_vllm_and_llama_cpp_lists() {
        let openai = br#"{"object":"list","data":[{"id":"gpt-4o","object":"model"},{"id":""}]}"#;
        let list = parse_list(openai).unwrap();
        assert_eq!(list.models.len(), 1);
        assert_eq!(list.get("gpt-4o").unwrap().context_tokens, None);
        let vllm = br#"{"data":[{"id":"Qwen/Qwen2.5-7B","max_model_len":32768}]}"#;
        assert_eq!(
            parse_list(vllm)
                .unwrap()
                .get("Qwen/Qwen2.5-7B")
                .unwrap()
                .context_tokens,
            Some(32768)
        );
        assert!(parse_list(b"<html>not found</html>").is_none());
        assert!(parse_list(br#"{"data":"nope"}"#).is_none());
        let props = br#"{"default_generation_settings":{"n_ctx":4096},"total_slots":2,
            "chat_template_caps":{"supports_system_role":true,"supports_tools":true}}"#;
        assert_eq!(
            parse_props(props),
            Some(SlotProps {
                n_ctx: Some(4096),
                template_tools: Some(true)
            })
        );
        let older = br#"{"default_generation_settings":{"n_ctx":0}}"#;
        assert_eq!(parse_props(older), Some(SlotProps::default()));
        assert_eq!(parse_props(b"[]"), None);
        assert_eq!(root("http://127.0.0.1:8080/v1"), "http://127.0.0.1:8080");
        assert_eq!(root("http://h/api"), "http://h/api");
    }

    #[test]
    fn reads_what_ollama_shows() {
        let show = br#"{"parameters":"stop \"<|im_end|>\"\nnum_ctx                        16384",
            "model_info":{"general.architecture":"qwen2","qwen2.context_length":32768}}"#;
        assert_eq!(
            parse_show(show),
            Some(OllamaContext {
                num_ctx: Some(16384),
                trained: Some(32768)
            })
        );
        let unset = br#"{"model_info":{"llama.context_length":131072}}"#;
        assert_eq!(parse_show(unset).unwrap().num_ctx, None);
        assert_eq!(parse_show(br#"{"error":"model not found"}"#), None);
        assert_eq!(parse_show(b"404 page not found"), None);
    }

    #[test]
    fn lists_at_most_max_ids() {
        let catalogue = Catalogue {
            models: ["a", "b", "c"]
                .map(|id| ServedModel {
                    id: id.into(),
                    context_tokens: None,
                    template_tools: None,
                })
                .to_vec(),
        };
        assert_eq!(catalogue.ids(2), "a, b, ...");
        assert_eq!(catalogue.ids(5), "a, b, c");
    }
}
