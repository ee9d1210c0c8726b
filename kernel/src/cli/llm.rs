//! `hivekernel llm check`: what the config's model server can do for the
//! models the config sends, asked the way the kernel asks: its model list
//! and context windows, a one-line answer and one required tool call per
//! model.

use std::path::Path;
use std::time::Instant;

use crate::runtime::RuntimeRegistry;
use hivekernel_agents::llm::{
    ChatMessage, ChatRequest, Finish, LlmError, OpenAiProvider, Provider, ToolSchema,
};
use hivekernel_agents::text::cut;
use serde_json::{Value, json};

use super::{CliError, output};
use crate::config::Config;
use crate::llm::{TEMPLATE_WITH_TOOLS, choose_provider, models_sent};

/// Longest answer asked for.
const ANSWER_TOKENS: u32 = 32;
/// Room for one small tool call.
const TOOL_TOKENS: u32 = 128;

/// What one check found.
struct Found {
    ok: bool,
    detail: String,
}

impl Found {
    fn json(&self) -> Value {
        json!({ "ok": self.ok, "detail": self.detail })
    }
}

/// Runs the checks for the config at `path` (with `--model`), prints what
/// works and what does not; exit 1 when a model the config sends cannot
/// answer or call a tool.
pub(super) async fn check(path: &Path, model: Option<&str>, json: bool) -> Result<(), CliError> {
    let mut config =
        Config::load(path, &RuntimeRegistry::builtin().known()).map_err(CliError::Config)?;
    config.serve_all(model);
    let chosen = choose_provider(&config.llm, &config.kernel.models, |name| {
        std::env::var(name).ok()
    })
    .map_err(CliError::Usage)?;
    let Some(openai) = &chosen.openai else {
        let text = format!(
            "provider: {}: no model server to check\n",
            chosen.description
        );
        return match json {
            true => output::print(&format!(
                "{:#}\n",
                json!({ "provider": chosen.description, "ok": true, "models": [] })
            )),
            false => output::print(&text),
        };
    };
    let mut listed = openai.catalogue().await;
    if let Ok(list) = &mut listed {
        crate::llm::ask_ollama(openai, &config, list).await;
    }
    let mut text = format!("provider: {}\n", chosen.description);
    match &listed {
        Ok(list) => text.push_str(&format!(
            "models the server lists: {}\n",
            if list.models.is_empty() {
                "none".to_owned()
            } else {
                list.ids(20)
            }
        )),
        Err(why) => text.push_str(&format!("models the server lists: unknown ({why})\n")),
    }
    // Each served model once, with the logical names sent as it.
    let mut served: Vec<(&str, Vec<&str>)> = Vec::new();
    for (logical, id) in models_sent(&config) {
        match served.iter_mut().find(|(known, _)| *known == id) {
            Some((_, names)) => names.push(logical),
            None => served.push((id, vec![logical])),
        }
    }
    let mut reports = Vec::new();
    let mut failing = 0;
    for (id, names) in &served {
        let window = listed.as_ref().ok().map(|list| list.get(id));
        let listing = match window {
            None => Found {
                ok: true,
                detail: "not known (the server lists no models)".into(),
            },
            Some(None) => Found {
                ok: false,
                detail: "no: the server does not list it".into(),
            },
            Some(Some(model)) => Found {
                ok: true,
                detail: match model.context_tokens {
                    Some(tokens) => format!("yes, context window {tokens} tokens"),
                    None => "yes (the server does not say its context window)".into(),
                },
            },
        };
        let answer = ask(openai, names[0]).await;
        let template_tools = window.flatten().and_then(|model| model.template_tools);
        let tools = match answer.ok {
            true => call_tool(openai, names[0], template_tools).await,
            false => Found {
                ok: false,
                detail: "not tried (no answer)".into(),
            },
        };
        if !(listing.ok && answer.ok && tools.ok) {
            failing += 1;
        }
        text.push_str(&format!("{id} (for {}):\n", names.join(", ")));
        for (what, found) in [("listed", &listing), ("answer", &answer), ("tools", &tools)] {
            text.push_str(&format!("  {what:<7} {}\n", found.detail));
        }
        reports.push(json!({
            "served": id, "for": names, "listed": listing.json(),
            "answer": answer.json(), "tools": tools.json(),
        }));
    }
    if json {
        let value = json!({
            "provider": chosen.description,
            "listed": listed.as_ref().ok().map(|list| list.models.iter().map(|m| json!({"id": m.id, "context_tokens": m.context_tokens})).collect::<Vec<_>>()),
            "models": reports,
            "ok": failing == 0,
        });
        output::print(&format!("{value:#}\n"))?;
    } else {
        output::print(&text)?;
    }
    match failing {
        0 => Ok(()),
        n => Err(CliError::Refused(format!(
            "{n} of {} models the config sends cannot work as agents need",
            served.len()
        ))),
    }
}

/// Why a model asked to call a tool answered in text instead, as far as
/// the server's word on its chat template tells.
fn answered_in_text(template_tools: Option<bool>) -> String {
    match template_tools {
        Some(true) => "not called: asked to call a tool, the model answered in text, although the \
             server's chat template renders tools (llama.cpp's /props): this model does not \
             call tools reliably; use a larger or tool-trained one"
            .into(),
        Some(false) => format!(
            "dropped: the server's chat template does not render tools (llama.cpp's /props), \
             so the model never saw them: {TEMPLATE_WITH_TOOLS}"
        ),
        None => "dropped or ignored: asked to call a tool, the model answered in text: either \
             the server's chat template does not pass tools on (llama.cpp: start it with \
             --jinja and a template that has tools) or the model does not call them"
            .into(),
    }
}

/// A one-line answer from `model`.
async fn ask(openai: &OpenAiProvider, model: &str) -> Found {
    let mut request = ChatRequest::new(
        model,
        vec![ChatMessage::user(
            "Reply with one short sentence: are you ready?",
        )],
    );
    request.max_tokens = Some(ANSWER_TOKENS);
    let started = Instant::now();
    match openai.chat(&request).await {
        Ok(response) => {
            let said = match response.message.content.trim() {
                "" => response.message.reasoning.clone().unwrap_or_default(),
                text => text.to_owned(),
            };
            let cut_off = match response.finish() {
                Finish::Truncated => format!(" (cut at {ANSWER_TOKENS} tokens)"),
                _ => String::new(),
            };
            Found {
                ok: true,
                detail: format!(
                    "ok in {:.1} s{cut_off}: {:?}",
                    started.elapsed().as_secs_f64(),
                    cut(said.replace('\n', " "), 80)
                ),
            }
        }
        Err(err) => Found {
            ok: false,
            detail: format!("failed: {err}"),
        },
    }
}

/// One call of a tool `model` is required to make; `template_tools` is
/// what the server said of its chat template, if anything.
async fn call_tool(openai: &OpenAiProvider, model: &str, template_tools: Option<bool>) -> Found {
    let mut request = ChatRequest::new(
        model,
        vec![ChatMessage::user(
            "Call the echo tool with the text \"ping\".",
        )],
    );
    request.tools = vec![ToolSchema {
        name: "echo".into(),
        description: "Says the text back.".into(),
        parameters: json!({
            "type": "object",
            "properties": { "text": { "type": "string" } },
            "required": ["text"]
        }),
    }];
    request.require_tool = true;
    request.max_tokens = Some(TOOL_TOKENS);
    match openai.chat(&request).await {
        Ok(response) => match response.message.tool_calls.first() {
            Some(call) => Found {
                ok: true,
                detail: format!(
                    "ok: called {}({})",
                    call.name,
                    cut(call.arguments.clone(), 80)
                ),
            },
            None => Found {
                ok: false,
                detail: answered_in_text(template_tools),
            },
        },
        Err(LlmError::Http { status, body }) => Found {
            ok: false,
            detail: format!(
                "refused: the server answered {status} to a request with tools: {body}"
            ),
        },
        Err(err) => Found {
            ok: false,
            detail: format!("failed: {err}"),
        },
    }
}
