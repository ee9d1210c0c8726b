//! `orchestrate`: split a task into subtasks, run one short-lived worker per
//! subtask in parallel, and combine their results.
//!
//! 1. **Plan.** The model is asked (through the kernel, so the tokens count
//!    against the caller) for a JSON array of subtasks. The answer is read
//!    leniently (code fences and text around the array are ignored; items may
//!    be strings or objects with a `task`/`description` field), but anything
//!    that is not such an array, an empty one, or one with more subtasks than
//!    `max_workers`, is a tool error naming the problem.
//! 2. **Run.** Each subtask gets its own `task` worker, a child of the
//!    caller, configured from the worker prompt (`prompts/worker.md` by
//!    default), with no tools and a timeout no longer than the caller's. At
//!    most `max_workers` run at once, and no more than the caller has free
//!    child slots, so the caller's own limits hold. Each worker gets its
//!    subtask with `execute_task` and a per-subtask deadline.
//! 3. **Combine.** The model is asked to combine the results (failures
//!    included, marked as such) into one answer.
//!
//! Every worker is killed and collected on every path: after its answer, on
//! its failure or timeout, and, when the caller's task is abandoned
//! mid-flight, by a guard that dismisses whatever is still running.

use crate::capability::Capability;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::{StreamExt, stream};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Tool, ToolContext, ToolError, decode};
use crate::llm::{
    ChatMessage, ChatRequest, ChatResponse, Finish, SUBTASKS_MARKER, SYNTHESIZE_MARKER,
};
use crate::process::{LimitOverrides, MAX_NAME_BYTES, Pid, Role, SpawnRequest};
use crate::runtime::ProcessContext;
use crate::syscalls::{Syscalls, TaskSpec};

/// Longest task text `orchestrate` accepts, in bytes.
pub const MAX_TASK_BYTES: usize = 64 * 1024;
/// Characters of one worker's output passed on to the combining step.
const RESULT_CHARS: usize = 8 * 1024;

/// How `orchestrate` runs its workers (`tool_agent.orchestrate`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, validator::Validate)]
#[serde(default, deny_unknown_fields)]
pub struct OrchestrateSettings {
    /// The file the workers' system prompt is read from, as the config
    /// names it (relative to the config file); `None`: the built-in prompt.
    pub worker_prompt_file: Option<String>,
    /// The workers' system prompt (read from `worker_prompt_file`).
    #[serde(skip)]
    pub worker_prompt: Arc<str>,
    /// Most subtasks (and workers) one call may have.
    #[validate(range(min = 1, max = 100_000))]
    pub max_workers: u32,
    /// Deadline for one subtask, unless the call asks for less.
    #[validate(range(min = 1, max = 2_592_000))]
    pub subtask_timeout_seconds: u64,
    /// Runtime of the workers; `None` takes the kernel's default.
    pub worker_runtime: Option<String>,
    /// Logical model of the workers; `None` takes the caller's.
    pub worker_model: Option<String>,
}

impl OrchestrateSettings {
    /// `subtask_timeout_seconds`.
    pub fn subtask_timeout(&self) -> Duration {
        Duration::from_secs(self.subtask_timeout_seconds)
    }
}

impl Default for OrchestrateSettings {
    fn default() -> Self {
        OrchestrateSettings {
            worker_prompt_file: None,
            worker_prompt: Arc::from(
                "You are a worker. Do exactly the subtask you are given and answer with its result only.",
            ),
            max_workers: 8,
            subtask_timeout_seconds: 120,
            worker_runtime: None,
            worker_model: None,
        }
    }
}

/// The `orchestrate` tool.
#[derive(Debug, Clone, Default)]
pub struct Orchestrate {
    settings: Arc<OrchestrateSettings>,
}

impl Orchestrate {
    /// The tool with `settings`.
    pub fn new(settings: OrchestrateSettings) -> Self {
        Orchestrate {
            settings: Arc::new(settings),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    task: String,
    max_workers: Option<u32>,
    timeout_seconds: Option<u64>,
}

#[async_trait]
impl Tool for Orchestrate {
    fn name(&self) -> &'static str {
        "orchestrate"
    }

    fn capability(&self) -> Option<Capability> {
        Some(Capability::SpawnChildren)
    }

    fn description(&self) -> &'static str {
        "Split a task into independent subtasks, run one worker per subtask in parallel, and return the combined result."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "task": { "type": "string", "description": "The whole task to split and run." },
                "max_workers": { "type": "integer", "minimum": 1, "maximum": self.settings.max_workers, "description": "Most subtasks to split it into." },
                "timeout_seconds": { "type": "integer", "minimum": 1, "maximum": self.settings.subtask_timeout_seconds.max(1), "description": "Deadline for each subtask." }
            },
            "required": ["task"],
            "additionalProperties": false
        })
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<String, ToolError> {
        let args: Args = decode(self, args)?;
        let task = args.task.trim();
        if task.is_empty() {
            return Err(ToolError::new("orchestrate needs a non-empty task"));
        }
        if task.len() > MAX_TASK_BYTES {
            return Err(ToolError::new(format!(
                "the task is {} bytes; orchestrate takes at most {MAX_TASK_BYTES}",
                task.len()
            )));
        }
        let max_workers = self.limit(args.max_workers, self.settings.max_workers, "max_workers")?;
        let timeout = match args.timeout_seconds {
            None => self.settings.subtask_timeout(),
            Some(seconds) => {
                let cap = self.settings.subtask_timeout_seconds.max(1);
                Duration::from_secs(self.limit(Some(seconds), cap, "timeout_seconds")?)
            }
        };
        let process = ctx.process;
        let subtasks = plan(process, task, max_workers).await?;
        let results = self.run(process, &subtasks, timeout).await?;
        let succeeded = results.iter().filter(|r| r.is_ok()).count();
        let combined = combine(process, task, &subtasks, &results).await?;
        Ok(format!(
            "{combined}\n\n({} subtasks: {succeeded} succeeded, {} failed)",
            subtasks.len(),
            subtasks.len() - succeeded
        ))
    }
}

impl Orchestrate {
    /// `requested`, which must lie in `1..=cap`; `cap` when not given.
    fn limit<T>(&self, requested: Option<T>, cap: T, field: &str) -> Result<T, ToolError>
    where
        T: Copy + PartialOrd + From<u8> + std::fmt::Display,
    {
        match requested {
            None => Ok(cap),
            Some(value) if value >= T::from(1) && value <= cap => Ok(value),
            Some(value) => Err(super::args::invalid(
                self,
                format!("field `{field}` must be between 1 and {cap}, got {value}"),
            )),
        }
    }

    /// Runs every subtask on its own worker; the result of each, in order.
    async fn run(
        &self,
        process: &ProcessContext,
        subtasks: &[String],
        timeout: Duration,
    ) -> Result<Vec<Result<String, String>>, ToolError> {
        let me = process
            .syscalls
            .get_process(process.pid)
            .await
            .map_err(|err| ToolError::new(err.message))?;
        let free = me.limits.max_children.saturating_sub(me.children) as usize;
        if free == 0 {
            return Err(ToolError::new(format!(
                "no free child slot: this process already has {} of at most {} children",
                me.children, me.limits.max_children
            )));
        }
        // A worker's deadline never exceeds its parent's own task timeout.
        let timeout = timeout.min(Duration::from_secs(me.limits.timeout_seconds.max(1)));
        let workers = Workers::new(process.syscalls.clone());
        let concurrency = free.min(subtasks.len()).max(1);
        let workers = &workers;
        let results = stream::iter(subtasks.iter().cloned().enumerate())
            .map(|(index, subtask)| self.run_one(process, workers, index, subtask, timeout))
            .buffered(concurrency)
            .collect::<Vec<_>>()
            .await;
        Ok(results)
    }

    /// Spawns the worker for subtask `index`, runs the subtask, dismisses the worker.
    async fn run_one(
        &self,
        process: &ProcessContext,
        workers: &Workers,
        index: usize,
        subtask: String,
        timeout: Duration,
    ) -> Result<String, String> {
        let syscalls = &process.syscalls;
        let mut request = SpawnRequest::new(process.pid, worker_name(&process.name, index));
        request.role = Role::Task;
        request.model = self
            .settings
            .worker_model
            .clone()
            .unwrap_or_else(|| process.model.to_string());
        request.runtime = self.settings.worker_runtime.clone();
        request.system_prompt = self.settings.worker_prompt.to_string();
        request.limits = LimitOverrides {
            max_children: Some(0),
            max_depth: Some(0),
            timeout_seconds: Some(timeout.as_secs().max(1)),
            max_concurrent_tasks: Some(1),
            ..LimitOverrides::default()
        };
        request
            .metadata
            .insert("orchestrated_by".into(), process.pid.to_string());
        let pid = syscalls
            .spawn_child(request)
            .await
            .map_err(|err| format!("could not start a worker: {err}"))?;
        workers.started(pid);
        let mut spec = TaskSpec::new(pid, subtask);
        spec.timeout = Some(timeout);
        let outcome = match syscalls.execute_task(spec).await {
            Ok(reply) => reply,
            Err(err) => Err(err.message),
        };
        workers.finished(pid);
        if syscalls
            .kill(pid, "orchestrate: subtask done")
            .await
            .is_ok()
        {
            let _ = syscalls.wait_child(pid, Some(Duration::from_secs(5))).await;
        }
        outcome
    }
}

/// `<caller>-w<n>`, the caller's part shortened so the whole stays within
/// the kernel's name limit.
fn worker_name(caller: &str, index: usize) -> String {
    let suffix = format!("-w{}", index + 1);
    format!(
        "{}{suffix}",
        crate::text::prefix(caller, MAX_NAME_BYTES - suffix.len())
    )
}

/// The workers still running; dismissed if the call is abandoned before they finish.
#[derive(Debug)]
struct Workers {
    syscalls: Arc<dyn Syscalls>,
    live: Mutex<Vec<Pid>>,
}

impl Workers {
    fn new(syscalls: Arc<dyn Syscalls>) -> Self {
        Workers {
            syscalls,
            live: Mutex::new(Vec::new()),
        }
    }

    fn started(&self, pid: Pid) {
        self.live.lock().push(pid);
    }

    fn finished(&self, pid: Pid) {
        self.live.lock().retain(|p| *p != pid);
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for pid in self.live.get_mut().drain(..) {
            self.syscalls.dismiss(pid, "orchestrate: cancelled");
        }
    }
}

/// Refuses an answer the model did not finish: cut off at the length
/// limit, or withheld by the provider's filter.
fn finished(answer: &ChatResponse, what: &str) -> Result<(), ToolError> {
    match answer.finish() {
        Finish::Done => Ok(()),
        Finish::Truncated => Err(ToolError::new(format!(
            "{what} failed: truncated: the model's answer stopped at the length limit \
             (llm.max_completion_tokens)"
        ))),
        Finish::Filtered => Err(ToolError::new(format!(
            "{what} failed: content_filter: the provider withheld the answer"
        ))),
    }
}

/// Asks the model for the subtasks of `task`.
async fn plan(
    process: &ProcessContext,
    task: &str,
    max_workers: u32,
) -> Result<Vec<String>, ToolError> {
    let system = format!(
        "You plan work for parallel workers. Split the task into independent subtasks that \
         can run at the same time; each must make sense on its own. {SUBTASKS_MARKER}: \
         strings only, at most {max_workers}, and no other text."
    );
    let request = ChatRequest::new(
        process.model.to_string(),
        vec![
            ChatMessage::system(system),
            ChatMessage::user(format!("Task: {task}")),
        ],
    );
    let answer = process
        .syscalls
        .chat(&request)
        .await
        .map_err(|err| ToolError::new(format!("planning the subtasks failed: {err}")))?;
    finished(&answer, "planning the subtasks")?;
    let subtasks = parse_subtasks(&answer.message.content)?;
    if subtasks.len() > max_workers as usize {
        return Err(ToolError::new(format!(
            "the plan has {} subtasks, more than the {max_workers} workers allowed; \
             ask for fewer, larger subtasks",
            subtasks.len()
        )));
    }
    Ok(subtasks)
}

/// Asks the model to combine the workers' results.
async fn combine(
    process: &ProcessContext,
    task: &str,
    subtasks: &[String],
    results: &[Result<String, String>],
) -> Result<String, ToolError> {
    let mut listed = String::new();
    for (index, (subtask, result)) in subtasks.iter().zip(results).enumerate() {
        let (status, text) = match result {
            Ok(output) => ("ok", output.as_str()),
            Err(error) => ("FAILED", error.as_str()),
        };
        let text: String = text.chars().take(RESULT_CHARS).collect();
        let text = text.replace('\n', "\n  ");
        listed.push_str(&format!(
            "- [{}] {subtask} => {status}: {text}\n",
            index + 1
        ));
    }
    let request = ChatRequest::new(
        process.model.to_string(),
        vec![
            ChatMessage::system(
                "You combine the results of parallel workers into one answer to the task. \
                 Say plainly which subtasks failed; never invent a result.",
            ),
            ChatMessage::user(format!(
                "{SYNTHESIZE_MARKER} the results below into one answer.\n\
                 Task: {task}\n\nResults:\n{listed}"
            )),
        ],
    );
    let answer = process
        .syscalls
        .chat(&request)
        .await
        .map_err(|err| ToolError::new(format!("combining the results failed: {err}")))?;
    finished(&answer, "combining the results")?;
    let text = answer.message.content.trim();
    if text.is_empty() {
        return Err(ToolError::new(
            "combining the results failed: the model answered with no text",
        ));
    }
    Ok(text.to_owned())
}

/// Reads a subtask list out of a model's answer; see the [module docs](self).
pub fn parse_subtasks(answer: &str) -> Result<Vec<String>, ToolError> {
    let preview: String = answer.chars().take(200).collect();
    let refuse = |why: &str| {
        ToolError::new(format!(
            "the model's plan is not usable ({why}); it answered: {preview:?}"
        ))
    };
    let (Some(start), Some(end)) = (answer.find('['), answer.rfind(']')) else {
        return Err(refuse("no JSON array in the answer"));
    };
    if end < start {
        return Err(refuse("no JSON array in the answer"));
    }
    let items: Vec<Value> = serde_json::from_str(&answer[start..=end])
        .map_err(|err| refuse(&format!("not a JSON array: {err}")))?;
    let mut subtasks = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let text = match item {
            Value::String(text) => Some(text.as_str()),
            Value::Object(fields) => ["task", "description", "subtask"]
                .iter()
                .find_map(|key| fields.get(*key).and_then(Value::as_str)),
            _ => None,
        };
        let Some(text) = text.map(str::trim).filter(|t| !t.is_empty()) else {
            return Err(refuse(&format!(
                "item {} is not a non-empty string or an object with a `task` string",
                index + 1
            )));
        };
        subtasks.push(text.to_owned());
    }
    if subtasks.is_empty() {
        return Err(refuse("the array is empty"));
    }
    Ok(subtasks)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::{parse_subtasks, worker_name};

    #[test]
    fn worker_names_stay_within_the_name_limit() {
        assert_eq!(worker_name("lead", 0), "lead-w1");
        let long = "é".repeat(100);
        let name = worker_name(&long, 999);
        assert!(name.len() <= 128 && name.ends_with("-w1000"), "{name}");
    }

    #[test]
    fn plans_are_read_leniently() {
        let plain = parse_subtasks(r#"["a", "b"]"#).unwrap();
        assert_eq!(plain, ["a", "b"]);
        let fenced =
            parse_subtasks("Here you go:\n```json\n[\"a\", {\"task\": \"b\"}]\n```").unwrap();
        assert_eq!(fenced, ["a", "b"]);
        let described = parse_subtasks(r#"[{"description": " c "}]"#).unwrap();
        assert_eq!(described, ["c"]);
    }

    #[test]
    fn unusable_plans_are_refused_with_the_reason() {
        for (answer, why) in [
            ("I cannot split this.", "no JSON array"),
            ("] before [", "no JSON array"),
            ("[1, 2]", "item 1"),
            ("[\"a\", \"\"]", "item 2"),
            ("[]", "the array is empty"),
            ("[\"a\",", "no JSON array"),
            ("[\"a\" \"b\"]", "not a JSON array"),
        ] {
            let err = parse_subtasks(answer).unwrap_err();
            assert!(err.0.contains(why), "{answer:?}: {err}");
        }
    }
}
