//! The universal `tool_agent` runtime: every role is a prompt, a tool list and limits.
//!
//! # The loop
//! A task or message becomes a user input. The agent asks the model (through
//! the kernel's [`Syscalls::chat`](crate::Syscalls::chat), which records the
//! tokens against the process), runs every tool call of the answer in order,
//! feeds the results back, and repeats until the model answers without tool
//! calls or `max_tool_iterations` rounds have run. A task's final answer is
//! its reply; a round limit or a failed model call fails the task.
//!
//! Whatever the model writes, a bad tool call never crashes the agent: an
//! unknown tool, a tool not on this agent's list, arguments that are not a
//! JSON object, and a tool that fails all come back to the model as an
//! `error: ...` tool result naming the problem.
//!
//! # Inputs
//! - a task: its description (and its parameters, one `key: value` per line);
//! - a `message`: `Message from process N:` and the payload;
//! - a `task_response` (the answer to a `delegate_async`): `Result of delegated
//!   request R (succeeded|failed):` and the output or error. The final answer
//!   of a message turn has nobody to go to: it is logged and recorded in the
//!   transcript, and a daemon keeps it in its conversation.
//!
//! # Transcript
//! Each turn records its input and its end (answer or failure) through
//! [`Syscalls::record`](crate::Syscalls::record), and each tool call's result
//! through its [`ToolCallReport`]; the kernel records the model requests and
//! answers in between.
//! - `child_exited` and `sibling_copy` notices are logged, not sent to the
//!   model (an orchestrator would otherwise pay a model call per worker).
//!
//! # Waiting for a person
//! A tool call an approval rule covers, and `ask_human`, wait for a person.
//! While one waits, the kernel keeps the turn's checkpoint (its input,
//! the model's answers and the tool results so far, the calls still to
//! run, the parked one first, and the rounds taken) with the request, so
//! after a kernel restart [`Runtime::resume`] carries on from there: the
//! parked call runs again and takes up the same request.
//!
//! # Conversation
//! Daemons keep their conversation between inputs (trimmed to the context
//! budget); every other role starts each input fresh. Before each call the
//! request is fitted to the model's context budget (see `context`); when the
//! provider still says the context is too long, the budget shrinks and the
//! call is retried, at most [`CONTEXT_RETRIES`] times.
//!
//! # Layout
//! - `context`: fitting a conversation into the budget.
//! - `prompt`: the system prompt (prompt, identity, tools) and input texts.
//! - `mcp`: the MCP servers a tool list selects, and what they offer at each call.
//! - `skills`: the skills a tool list selects: catalogue, activation, files.
//! - this file: settings, the factory, the loop.

mod context;
mod mcp;
mod prompt;
mod skills;
mod untrusted;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;

use crate::llm::{
    ChatMessage, ChatRequest, ChatResponse, Finish, LlmError, ToolCall, ToolSchema,
    estimate_request_tokens, estimate_tokens,
};
use crate::mcp::McpSelector;
use crate::message::{Message, Task, TaskReply, kinds};
use crate::process::Role;
use crate::runtime::{ProcessContext, Runtime, RuntimeError, RuntimeFactory};
use crate::skill::SkillSelector;
use crate::syscalls::{Checkpoint, ErrorKind, SyscallError, ToolCallReport};
use crate::tools::{Tool, ToolContext, ToolRegistry};
use crate::transcript::{InputSource, TurnRecord};
use mcp::{McpSelection, Offered};
use skills::Shelf;

/// The tools a tool list's skill entries give (`skill_view`, `skill_read`).
pub const SKILL_TOOLS: [&str; 2] = [skills::VIEW, skills::READ];

/// What the model is told when its answer was cut off and it may go on.
const CONTINUE: &str = "Your answer was cut off at the length limit. Continue exactly where it \
                        stopped, without repeating anything.";

/// The failure of an input whose answer was cut off at `max_tokens`.
fn truncated(message: &ChatMessage, max_tokens: u32) -> String {
    let what = if message.tool_calls.is_empty() {
        "its answer"
    } else {
        "its tool calls"
    };
    format!(
        "truncated: the model's output stopped at the length limit (finish_reason length; \
         max_completion_tokens {max_tokens}, or the end of the context window), so {what} is \
         incomplete; raise llm.max_completion_tokens, or let the agent go on with \
         tool_agent.continue_on_length"
    )
}

/// Retries of one model call after the provider says the context is too long.
pub const CONTEXT_RETRIES: u32 = 3;

/// How every `tool_agent` behaves (the `tool_agent` config section).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSettings {
    /// Model rounds with tool calls before a task is given up.
    pub max_tool_iterations: u32,
    /// Context window in tokens, by logical model name.
    pub context_tokens: BTreeMap<String, u64>,
    /// Context window of models not in `context_tokens`.
    pub default_context_tokens: u64,
    /// Cap on one completion's tokens, also held back from the context budget.
    pub max_completion_tokens: u32,
    /// Longest tool result handed to the model, in bytes; longer ones are cut.
    pub max_tool_result_bytes: usize,
    /// Bytes of tool definitions one request may offer
    /// (`llm.max_tool_definition_bytes`): the built-in and skill tools go
    /// whole, MCP tools fill what is left in tool-list order, and the
    /// system prompt names those left out.
    pub max_tool_definition_bytes: usize,
    /// Name of the provider the kernel uses, for the identity section and logs.
    pub provider: String,
    /// Whether the system prompt carries the process's budget state (tokens
    /// used and left, cost, rate limits) when it has a budget or a rate
    /// limit; read at the start of each input.
    pub budget_in_prompt: bool,
    /// What skills may take of the system prompt (`tool_agent.skills`).
    pub skills: SkillPromptSettings,
    /// Times an answer cut off at `max_completion_tokens` (`finish_reason:
    /// length`) is asked to go on; 0: such an answer fails the input as
    /// `truncated`.
    pub continue_on_length: u32,
}

/// What skills may take of the system prompt (`tool_agent.skills`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    serde::Deserialize,
    serde::Serialize,
    schemars::JsonSchema,
    validator::Validate,
)]
#[serde(default, deny_unknown_fields)]
pub struct SkillPromptSettings {
    /// Estimated tokens the catalogue of skills (`- name: description`
    /// lines) may take; the rest is counted in a note.
    #[validate(range(min = 100, max = 1_000_000))]
    pub catalogue_tokens: u64,
    /// Estimated tokens the instructions of activated skills may take
    /// (never more than a quarter of the model's context budget); the
    /// newest activations are kept.
    #[validate(range(min = 500, max = 1_000_000))]
    pub active_tokens: u64,
}

impl Default for SkillPromptSettings {
    fn default() -> Self {
        SkillPromptSettings {
            catalogue_tokens: 4_000,
            active_tokens: 16_000,
        }
    }
}

impl Default for AgentSettings {
    fn default() -> Self {
        AgentSettings {
            max_tool_iterations: 10,
            context_tokens: BTreeMap::new(),
            default_context_tokens: 128_000,
            max_completion_tokens: 4096,
            max_tool_result_bytes: 64 * 1024,
            max_tool_definition_bytes: crate::llm::Limits::default().tool_definition_bytes,
            provider: "scripted".into(),
            budget_in_prompt: true,
            skills: SkillPromptSettings::default(),
            continue_on_length: 0,
        }
    }
}

impl AgentSettings {
    /// Tokens a request for `model` may use: its window minus room for the
    /// answer, as the server counts them (see [`ToolAgent::budget`]).
    pub fn budget(&self, model: &str) -> u64 {
        let window = self
            .context_tokens
            .get(model)
            .copied()
            .unwrap_or(self.default_context_tokens);
        window
            .saturating_sub(u64::from(self.max_completion_tokens))
            .max(context::MIN_BUDGET_TOKENS)
    }
}

/// Creates the [`ToolAgent`] of each process, with the tools its config names.
///
/// Processes with the same tool list share one [`Toolset`] (the tools and
/// their schemas), and all but daemons (which keep a conversation) share one
/// stateless [`ToolAgent`] per tool list, so an idle agent costs next to
/// nothing here; the system prompt is assembled per input, not kept.
#[derive(Debug)]
pub struct ToolAgentFactory {
    tools: Arc<ToolRegistry>,
    settings: Arc<AgentSettings>,
    toolsets: Mutex<HashMap<Arc<[String]>, Cached>>,
    /// The toolset of an empty tool list, the commonest, kept out of the
    /// cache so spawning a worker takes neither its lock nor a hash.
    no_tools: Cached,
}

/// A resolved tool list, and the stateless agent that uses it.
#[derive(Debug, Clone)]
struct Cached {
    toolset: Arc<Toolset>,
    stateless: Arc<ToolAgent>,
}

impl Cached {
    fn new(
        tools: BTreeMap<String, Arc<dyn Tool>>,
        mcp: McpSelection,
        skills: bool,
        settings: &Arc<AgentSettings>,
    ) -> Self {
        let schemas: Vec<ToolSchema> = tools.values().map(|tool| tool.schema()).collect();
        let tokens = estimate_request_tokens(&ChatRequest {
            tools: schemas.clone(),
            ..ChatRequest::new("", Vec::new())
        });
        let bytes = schemas.iter().map(ToolSchema::definition_bytes).sum();
        let toolset = Arc::new(Toolset {
            tools,
            mcp,
            skills,
            schemas,
            tokens,
            bytes,
        });
        Cached {
            stateless: Arc::new(ToolAgent {
                toolset: toolset.clone(),
                history: None,
                settings: settings.clone(),
            }),
            toolset,
        }
    }
}

/// Distinct tool lists whose toolsets are kept for reuse.
const TOOLSET_CACHE: usize = 1024;

/// A resolved tool list: the built-in tools by name and the schemas offered
/// to the model, and the MCP servers whose tools are asked for at each call.
#[derive(Debug)]
pub struct Toolset {
    tools: BTreeMap<String, Arc<dyn Tool>>,
    mcp: McpSelection,
    /// Whether the list selects skills (`skills` or `skill:<name>`); the
    /// kernel answers which.
    skills: bool,
    schemas: Vec<ToolSchema>,
    /// Estimated tokens the built-in schemas take in every request.
    tokens: u64,
    /// Bytes of the built-in schemas ([`ToolSchema::definition_bytes`]).
    bytes: usize,
}

impl ToolAgentFactory {
    /// A factory drawing tools from `tools`.
    pub fn new(tools: ToolRegistry, settings: AgentSettings) -> Self {
        let settings = Arc::new(settings);
        ToolAgentFactory {
            tools: Arc::new(tools),
            no_tools: Cached::new(BTreeMap::new(), McpSelection::default(), false, &settings),
            settings,
            toolsets: Mutex::new(HashMap::new()),
        }
    }

    /// The registry tools are drawn from.
    pub fn tools(&self) -> &ToolRegistry {
        &self.tools
    }

    /// The toolset for `names` and its stateless agent, shared with every
    /// process that has the same list.
    fn cached(&self, names: &Arc<[String]>) -> Result<Cached, RuntimeError> {
        if names.is_empty() {
            return Ok(self.no_tools.clone());
        }
        if let Some(found) = self.toolsets.lock().get(names) {
            return Ok(found.clone());
        }
        let mut tools = BTreeMap::new();
        let mut mcp = McpSelection::default();
        let mut skills = false;
        for name in names.iter() {
            if let Some(selector) = McpSelector::parse(name) {
                mcp.add(selector.map_err(RuntimeError)?);
                continue;
            }
            if let Some(selector) = SkillSelector::parse(name) {
                selector.map_err(RuntimeError)?;
                skills = true;
                continue;
            }
            let Some(tool) = self.tools.get(name) else {
                return Err(RuntimeError(format!(
                    "unknown tool {name:?} (known tools: {})",
                    self.tools.names().join(", ")
                )));
            };
            tools.insert(name.clone(), tool.clone());
        }
        let cached = Cached::new(tools, mcp, skills, &self.settings);
        let mut cache = self.toolsets.lock();
        if cache.len() < TOOLSET_CACHE {
            cache.insert(names.clone(), cached.clone());
        }
        Ok(cached)
    }
}

impl RuntimeFactory for ToolAgentFactory {
    fn create(&self, ctx: &ProcessContext) -> Result<Arc<dyn Runtime>, RuntimeError> {
        let cached = self.cached(&ctx.tools)?;
        if ctx.role != Role::Daemon {
            return Ok(cached.stateless);
        }
        Ok(Arc::new(ToolAgent {
            toolset: cached.toolset,
            history: Some(Conversation::default()),
            settings: self.settings.clone(),
        }))
    }
}

/// One process's agent: its tools and (daemons) its conversation.
#[derive(Debug)]
pub struct ToolAgent {
    toolset: Arc<Toolset>,
    history: Option<Conversation>,
    settings: Arc<AgentSettings>,
}

/// Key of a daemon's conversation in its durable state.
pub const HISTORY_KEY: &str = "conversation";
/// Key of the skills a daemon's conversation activated, in its durable state.
pub const SKILLS_KEY: &str = "active_skills";

/// A daemon's conversation: read back from the kernel's store on first use,
/// written back after every turn, so it survives a kernel restart.
#[derive(Debug, Default)]
struct Conversation {
    messages: Mutex<Vec<ChatMessage>>,
    /// The skills its turns activated, oldest first; they stay active when
    /// the turns that activated them are trimmed away.
    skills: Mutex<Vec<String>>,
    loaded: tokio::sync::OnceCell<()>,
}

impl Conversation {
    /// The conversation so far and the skills it activated, loading both
    /// from the store the first time.
    async fn snapshot(&self, ctx: &ProcessContext) -> (Vec<ChatMessage>, Vec<String>) {
        self.loaded
            .get_or_init(|| async {
                if let Ok(Some(json)) = ctx.syscalls.load_state(SKILLS_KEY).await {
                    match serde_json::from_str::<Vec<String>>(&json) {
                        Ok(stored) => *self.skills.lock() = stored,
                        Err(err) => {
                            tracing::warn!(pid = %ctx.pid, error = %err, "stored active skills unreadable; none kept")
                        }
                    }
                }
                match ctx.syscalls.load_state(HISTORY_KEY).await {
                    Ok(Some(json)) => match serde_json::from_str::<Vec<ChatMessage>>(&json) {
                        Ok(stored) => {
                            let mut messages = self.messages.lock();
                            let newer = std::mem::replace(&mut *messages, stored);
                            messages.extend(newer);
                        }
                        Err(err) => {
                            tracing::warn!(pid = %ctx.pid, error = %err, "stored conversation unreadable; starting fresh")
                        }
                    },
                    Ok(None) => {}
                    Err(err) => {
                        tracing::warn!(pid = %ctx.pid, error = %err, "cannot load the stored conversation")
                    }
                }
            })
            .await;
        (self.messages.lock().clone(), self.skills.lock().clone())
    }
}

#[async_trait]
impl Runtime for ToolAgent {
    async fn execute(&self, ctx: &ProcessContext, task: Task) -> TaskReply {
        let input = prompt::task_input(&task);
        self.turn(ctx, InputSource::task(&task), input).await
    }

    /// A turn's tools run only after the model asked for them.
    fn hands_over_at_first_call(&self) -> bool {
        true
    }

    async fn on_message(&self, ctx: &ProcessContext, message: Message) -> Result<(), RuntimeError> {
        if message.kind == kinds::CHILD_EXITED || message.kind == kinds::SIBLING_COPY {
            tracing::debug!(pid = %ctx.pid, kind = %message.kind, from = %message.from, "notice noted");
            return Ok(());
        }
        let input = prompt::message_input(&message);
        match self.turn(ctx, InputSource::message(&message), input).await {
            Ok(answer) => {
                tracing::info!(pid = %ctx.pid, kind = %message.kind, from = %message.from, answer = %preview(&answer), "message handled")
            }
            Err(error) => {
                tracing::warn!(pid = %ctx.pid, kind = %message.kind, from = %message.from, %error, "message not handled")
            }
        }
        Ok(())
    }

    async fn resume(&self, ctx: &ProcessContext, checkpoint: &str) -> TaskReply {
        let parked: Parked = serde_json::from_str(checkpoint)
            .map_err(|err| format!("the turn's checkpoint is unreadable: {err}"))?;
        let input = match parked.turn.first() {
            Some(first) if !parked.calls.is_empty() => first.content.clone(),
            _ => return Err("the turn's checkpoint holds no call to resume".into()),
        };
        tracing::info!(pid = %ctx.pid, calls = parked.calls.len(), "resuming a turn that waited for a person");
        let source = parked.source.clone();
        self.recorded(ctx, source, input, self.answer(ctx, parked))
            .await
    }
}

/// A turn as it waits for a person: what [`Checkpoint`] answers, and
/// [`Runtime::resume`] carries on from.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Parked {
    /// Where the turn's input came from.
    source: InputSource,
    /// The input, the model's answers and the tool results so far.
    turn: Vec<ChatMessage>,
    /// The calls of the model's last answer not run yet; the first waits.
    calls: Vec<ToolCall>,
    /// Rounds of tool calls taken.
    rounds: u32,
}

/// [`Parked`] from borrowed parts, as JSON.
fn checkpoint_json(
    source: &InputSource,
    turn: &[ChatMessage],
    calls: &[ToolCall],
    rounds: u32,
) -> String {
    serde_json::json!({ "source": source, "turn": turn, "calls": calls, "rounds": rounds })
        .to_string()
}

impl ToolAgent {
    /// The process's context budget in estimated tokens: the window's
    /// budget divided by how many tokens the server counts per estimated
    /// one (learned by the kernel from reported usage), so a conversation
    /// fitted to it fits the server's count.
    fn budget(&self, ctx: &ProcessContext) -> u64 {
        let ratio = ctx.syscalls.token_ratio();
        let budget = self.settings.budget(&ctx.model);
        if !(ratio.is_finite() && ratio > 0.0) {
            return budget;
        }
        ((budget as f64 / ratio) as u64).max(context::MIN_BUDGET_TOKENS)
    }

    /// Runs one input to a final answer, recording both in the transcript.
    async fn turn(
        &self,
        ctx: &ProcessContext,
        source: InputSource,
        input: String,
    ) -> Result<String, String> {
        let parked = Parked {
            source: source.clone(),
            turn: vec![ChatMessage::user(input.clone())],
            calls: Vec::new(),
            rounds: 0,
        };
        self.recorded(ctx, source, input, self.answer(ctx, parked))
            .await
    }

    /// Runs `work`, a turn, recording its input and its end in the transcript.
    async fn recorded(
        &self,
        ctx: &ProcessContext,
        source: InputSource,
        input: String,
        work: impl Future<Output = Result<String, String>>,
    ) -> Result<String, String> {
        ctx.syscalls.record(TurnRecord::Input {
            source,
            text: input,
        });
        let outcome = work.await;
        ctx.syscalls.record(match &outcome {
            Ok(answer) => TurnRecord::Answer(answer.clone()),
            Err(error) => TurnRecord::Failed(error.clone()),
        });
        outcome
    }

    /// Runs a turn to its final answer: the calls it still has to run (a
    /// resumed turn's), then rounds of model calls and tool calls.
    async fn answer(&self, ctx: &ProcessContext, parked: Parked) -> Result<String, String> {
        let Parked {
            source,
            mut turn,
            mut calls,
            mut rounds,
        } = parked;
        let (history, remembered) = match &self.history {
            Some(conversation) => conversation.snapshot(ctx).await,
            None => Default::default(),
        };
        let max = self.settings.max_tool_iterations;
        // An answer cut at `length` and asked to go on: its parts so far.
        let (mut partial, mut continued) = (String::new(), 0u32);
        // Once per input, so the system prompt stays the same within a turn.
        let budget = if self.settings.budget_in_prompt {
            match ctx.syscalls.get_process(ctx.pid).await {
                Ok(info) => crate::tools::budget::describe(&info),
                Err(err) => {
                    tracing::debug!(pid = %ctx.pid, error = %err, "budget state unknown");
                    None
                }
            }
        } else {
            None
        };
        loop {
            let mut offered = if self.toolset.mcp.is_empty() {
                Offered::default()
            } else {
                self.toolset.mcp.offered(ctx).await
            };
            let shelf = if self.toolset.skills {
                let room = self.settings.skills.active_tokens.min(self.budget(ctx) / 4);
                Shelf::now(ctx, &remembered, &[&history, &turn], room).await
            } else {
                Shelf::default()
            };
            if !offered.tools.is_empty() {
                let skills: usize = shelf
                    .schemas()
                    .iter()
                    .map(ToolSchema::definition_bytes)
                    .sum();
                let room = self
                    .settings
                    .max_tool_definition_bytes
                    .saturating_sub(self.toolset.bytes + skills);
                offered.fit(room, self.settings.max_tool_definition_bytes);
            }
            if calls.is_empty() {
                let sections = prompt::Sections {
                    mcp: &offered,
                    skills: self.toolset.skills.then_some(&shelf),
                    budget: budget.as_deref(),
                };
                let response = self.call_model(ctx, &history, &turn, &sections).await?;
                let finish = response.finish();
                let mut message = response.message;
                if finish == Finish::Filtered {
                    return Err("content_filter: the provider withheld the model's answer \
                                (finish_reason content_filter)"
                        .into());
                }
                if finish == Finish::Truncated {
                    // Tool calls cut off have broken arguments: never run them.
                    if !message.tool_calls.is_empty()
                        || continued >= self.settings.continue_on_length
                    {
                        return Err(truncated(&message, self.settings.max_completion_tokens));
                    }
                    continued += 1;
                    partial.push_str(&message.content);
                    message.reasoning = None;
                    turn.push(message);
                    turn.push(ChatMessage::user(CONTINUE));
                    continue;
                }
                if message.tool_calls.is_empty() {
                    let said = message.content.as_str();
                    // A reasoning model whose answer stayed in its reasoning
                    // (its server's template did not split it out): that
                    // reasoning is the answer.
                    let said = match &message.reasoning {
                        Some(reasoning) if said.trim().is_empty() => reasoning.as_str(),
                        _ => said,
                    };
                    let answer = format!("{partial}{said}").trim().to_owned();
                    if answer.is_empty() {
                        return Err("the model answered with neither text nor a tool call".into());
                    }
                    turn.push(message);
                    self.remember(ctx, turn, &shelf).await;
                    return Ok(answer);
                }
                // A continued answer that ends in tool calls: what came
                // before stays in the conversation, not in the answer.
                partial.clear();
                if rounds >= max {
                    return Err(format!(
                        "no final answer after {max} rounds of tool calls (max_tool_iterations)"
                    ));
                }
                rounds += 1;
                calls = message.tool_calls.clone();
                turn.push(message);
            }
            for (i, call) in calls.iter().enumerate() {
                let result = {
                    // Made only when the call waits for a person.
                    let checkpoint = || checkpoint_json(&source, &turn, &calls[i..], rounds);
                    self.run_tool(ctx, call, &offered, &shelf, Some(&checkpoint))
                        .await
                };
                turn.push(ChatMessage::tool_result(call.id.clone(), result));
            }
            calls.clear();
        }
    }

    /// One model call, fitted to the budget; shrinks and retries on a context-length error.
    async fn call_model(
        &self,
        ctx: &ProcessContext,
        history: &[ChatMessage],
        turn: &[ChatMessage],
        sections: &prompt::Sections<'_>,
    ) -> Result<ChatResponse, String> {
        let toolset = &self.toolset;
        let system = ChatMessage::system(prompt::system_prompt(
            ctx,
            &toolset.tools,
            sections,
            &self.settings,
        ));
        let (offered, shelf) = (sections.mcp, sections.skills);
        let skill_schemas = shelf.map(Shelf::schemas).unwrap_or_default();
        let skill_tokens = shelf.map_or(0, Shelf::tokens);
        let mut budget = self
            .budget(ctx)
            .saturating_sub(toolset.tokens + offered.tokens() + skill_tokens);
        let mut attempt = 0;
        loop {
            let request = ChatRequest {
                tools: toolset
                    .schemas
                    .iter()
                    .cloned()
                    .chain(offered.schemas())
                    .chain(skill_schemas.iter().cloned())
                    .collect(),
                max_tokens: Some(self.settings.max_completion_tokens),
                ..ChatRequest::new(
                    ctx.model.to_string(),
                    context::fit(&system, history, turn, budget),
                )
            };
            match ctx.syscalls.chat(&request).await {
                Ok(response) => return Ok(response),
                Err(LlmError::ContextLength(why)) if attempt < CONTEXT_RETRIES => {
                    attempt += 1;
                    let sent = estimate_tokens(&request.messages);
                    budget = (sent.min(budget) * 3 / 4).max(context::MIN_BUDGET_TOKENS);
                    tracing::info!(pid = %ctx.pid, attempt, budget, %why, "context too long; shortening and retrying");
                }
                // Said as is: the task's reason starts with `budget_exceeded`.
                Err(err @ LlmError::BudgetExceeded(_)) => return Err(err.to_string()),
                Err(err) => return Err(format!("model call failed: {err}")),
            }
        }
    }

    /// Runs one tool call, reported to the kernel; every failure becomes an
    /// `error: ...` result for the model.
    async fn run_tool(
        &self,
        ctx: &ProcessContext,
        call: &ToolCall,
        offered: &Offered,
        shelf: &Shelf,
        checkpoint: Checkpoint<'_>,
    ) -> String {
        let started = std::time::Instant::now();
        let result = self.call_tool(ctx, call, offered, shelf, checkpoint).await;
        let duration = started.elapsed();
        let error = result.as_ref().err().cloned();
        let text = result.unwrap_or_else(|err| format!("error: {err}"));
        let output = crate::text::cut(text, self.settings.max_tool_result_bytes);
        ctx.syscalls.tool_called(ToolCallReport {
            tool: call.name.clone(),
            call_id: call.id.clone(),
            output: output.clone(),
            duration,
            error,
        });
        output
    }

    async fn call_tool(
        &self,
        ctx: &ProcessContext,
        call: &ToolCall,
        offered: &Offered,
        shelf: &Shelf,
        checkpoint: Checkpoint<'_>,
    ) -> Result<String, String> {
        let tools = &self.toolset.tools;
        let tool = tools.get(&call.name);
        let mcp_tool = if tool.is_none() {
            offered.get(&call.name)
        } else {
            None
        };
        let skill_tool = tool.is_none() && mcp_tool.is_none() && shelf.offers(&call.name);
        if tool.is_none() && mcp_tool.is_none() && !skill_tool {
            let skill_tools = if shelf.offers(skills::VIEW) {
                [skills::VIEW, skills::READ].as_slice()
            } else {
                &[]
            };
            let available: Vec<&str> = tools
                .keys()
                .map(String::as_str)
                .chain(offered.tools.iter().map(|tool| tool.schema.name.as_str()))
                .chain(skill_tools.iter().copied())
                .collect();
            return Err(format!(
                "tool {:?} is not available to this agent (available: {})",
                call.name,
                if available.is_empty() {
                    "none".to_owned()
                } else {
                    available.join(", ")
                }
            ));
        }
        let raw = call.arguments.trim();
        let args = if raw.is_empty() {
            serde_json::Value::Object(Default::default())
        } else {
            match crate::json::parse(raw) {
                Ok(args) if args.is_object() => args,
                Ok(_) => return Err(format!("arguments for {} must be a JSON object", call.name)),
                Err(err) => {
                    return Err(format!(
                        "arguments for {} are not valid JSON: {err}",
                        call.name
                    ));
                }
            }
        };
        // A person may have to approve the call first: the kernel says so,
        // and parks this process until they do.
        let canonical = match mcp_tool {
            Some(mcp_tool) => format!("mcp:{}/{}", mcp_tool.server, mcp_tool.name),
            None => call.name.clone(),
        };
        ctx.syscalls
            .approve_tool(&canonical, &args, checkpoint)
            .await
            .map_err(|err| err.message)?;
        if skill_tool {
            return shelf.call(&call.name, args).await;
        }
        if let Some(mcp_tool) = mcp_tool {
            let serde_json::Value::Object(arguments) = args else {
                return Err(format!("arguments for {} must be a JSON object", call.name));
            };
            let output = ctx
                .syscalls
                .mcp_call(&mcp_tool.server, &mcp_tool.name, arguments)
                .await
                .map_err(|err| err.message)?;
            return if output.is_error {
                Err(output.text)
            } else {
                Ok(output.text)
            };
        }
        let Some(tool) = tool else {
            return Err(format!(
                "tool {:?} is not available to this agent",
                call.name
            ));
        };
        let workspace = ctx.workspace_dir();
        let tool_ctx = ToolContext {
            process: ctx,
            workspace: workspace.as_deref(),
            checkpoint,
        };
        tool.call(&tool_ctx, args)
            .await
            .map_err(|err| err.to_string())
    }

    /// Keeps a finished turn in a daemon's conversation, trimmed to the
    /// budget, and writes the conversation back to the kernel's store, with
    /// the skills it has active when they changed.
    async fn remember(&self, ctx: &ProcessContext, turn: Vec<ChatMessage>, shelf: &Shelf) {
        let Some(conversation) = &self.history else {
            return;
        };
        if self.toolset.skills {
            // The last call's shelf already holds this turn's activations.
            let changed = {
                let mut kept = conversation.skills.lock();
                match shelf.kept(&kept) {
                    Some(active) if *kept != active => {
                        *kept = active.clone();
                        Some(active)
                    }
                    _ => None,
                }
            };
            if let Some(active) = changed {
                let json = serde_json::Value::from(active).to_string();
                if let Err(err) = ctx.syscalls.save_state(SKILLS_KEY, Some(json)).await {
                    tracing::warn!(pid = %ctx.pid, error = %err, "active skills not saved");
                }
            }
        }
        let budget = self.budget(ctx);
        let json = {
            let mut history = conversation.messages.lock();
            history.extend(turn);
            while history.len() > 1 && estimate_tokens(&history) > budget {
                let next = context::next_exchange(&history, 0);
                history.drain(..next);
            }
            serde_json::to_string(&*history)
        };
        let saved = match json {
            Ok(json) => ctx.syscalls.save_state(HISTORY_KEY, Some(json)).await,
            Err(err) => Err(SyscallError::new(ErrorKind::Internal, err.to_string())),
        };
        if let Err(err) = saved {
            tracing::warn!(pid = %ctx.pid, error = %err, "conversation not saved");
        }
    }
}

/// The start of `text`, for logs.
fn preview(text: &str) -> &str {
    crate::text::prefix(text, 200)
}
