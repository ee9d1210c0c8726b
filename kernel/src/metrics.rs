//! Prometheus metrics (`kernel.metrics`): what the kernel counts as it
//! works, and what it reads off its parts when scraped.
//!
//! A kernel started with `kernel.metrics` owns one [`Metrics`]; without it
//! there is none, and every place that counts pays one `Option` check.
//! Counters and histograms are fed as things happen: every event passes
//! [`Metrics::event`] on its way into the bus; model calls (which know the
//! caller's role), routing, gRPC calls and store commits are counted where
//! they happen. Gauges (processes by state and role, mailbox depth, pending
//! inbox requests, the store's queue) are read when scraped, from a
//! [`Census`] the kernel takes then.
//!
//! No label names a process: a PID or a name would make a series per
//! process. Labels that come from outside the kernel's own vocabulary
//! (tool and model names, which a model or a caller may make up) keep at
//! most [`MAX_LABEL_VALUES`] values each; later ones are counted as
//! `other`. Every metric is listed in docs/OPERATIONS.md.

use std::collections::HashSet;
use std::time::Duration;

use hivekernel_agents::llm::Usage;
use hivekernel_agents::process::{EXIT_CANNOT_START, EXIT_FAILED, EXIT_KILLED, EXIT_PANICKED};
use hivekernel_agents::{ProcessState, Role};
use parking_lot::Mutex;
use prometheus::core::Collector;
use prometheus::{
    CounterVec, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::event::EventKind;

/// The media type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

/// Distinct values a label that comes from outside keeps before the rest
/// are counted as `other`.
pub const MAX_LABEL_VALUES: usize = 256;

/// Seconds; for calls that take milliseconds to minutes (tasks, tools).
const WORK_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];
/// Seconds; for model calls.
const MODEL_BUCKETS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
];
/// Seconds; for gRPC calls and store commits.
const FAST_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// What the kernel holds right now, taken when scraped.
#[derive(Debug, Default, Clone)]
pub struct Census {
    /// Live processes (zombies included) by state and role.
    pub processes: Vec<(ProcessState, Role, u64)>,
    /// Messages and tasks waiting in all mailboxes.
    pub mailbox_messages: u64,
    /// The most waiting in any one mailbox.
    pub mailbox_messages_max: u64,
    /// Live `SubscribeEvents` streams (and other bus subscribers).
    pub event_subscribers: u64,
    /// Inbox requests waiting for a person, by kind (`approval`, `question`).
    pub inbox_pending: Vec<(&'static str, u64)>,
    /// Writes queued for the store and not yet committed.
    pub store_queue: u64,
    /// Messages and bucket values from the cluster's NATS that no node
    /// signed (or replayed, or stale), refused since start.
    pub cluster_refused: u64,
}

/// [`Metrics::hot`]: `messages_routed_total` by type, and tasks by outcome.
#[derive(Debug)]
struct Hot {
    routed_message: IntCounter,
    routed_task: IntCounter,
    routed_resume: IntCounter,
    /// `[error, ok]`, indexed by success.
    tasks: [IntCounter; 2],
    task_seconds: [Histogram; 2],
}

impl Hot {
    fn new(routed: &IntCounterVec, tasks: &IntCounterVec, task_seconds: &HistogramVec) -> Hot {
        let outcomes = [outcome(false), outcome(true)];
        Hot {
            routed_message: routed.with_label_values(&["message"]),
            routed_task: routed.with_label_values(&["task"]),
            routed_resume: routed.with_label_values(&["resume"]),
            tasks: outcomes.map(|o| tasks.with_label_values(&[o])),
            task_seconds: outcomes.map(|o| task_seconds.with_label_values(&[o])),
        }
    }
}

/// The kernel's metrics: one registry, its families, and the label caps.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    spawns: IntCounterVec,
    exits: IntCounterVec,
    restarts: IntCounterVec,
    escalations: IntCounter,
    refusals: IntCounterVec,
    routed: IntCounterVec,
    mailbox_refusals: IntCounterVec,
    messages_expired: IntCounter,
    messages_dropped: IntCounter,
    llm_calls: IntCounterVec,
    llm_tokens: IntCounterVec,
    llm_cost: CounterVec,
    llm_seconds: HistogramVec,
    tool_calls: IntCounterVec,
    tool_seconds: HistogramVec,
    cron_runs: IntCounterVec,
    inbox_requests: IntCounterVec,
    inbox_resolutions: IntCounterVec,
    notify_failures: IntCounter,
    mcp_servers: IntCounterVec,
    events: IntCounter,
    grpc_requests: IntCounterVec,
    grpc_seconds: HistogramVec,
    store_commit_seconds: Histogram,
    processes: IntGaugeVec,
    mailbox_messages: IntGauge,
    mailbox_messages_max: IntGauge,
    event_subscribers: IntGauge,
    inbox_pending: IntGaugeVec,
    store_queue: IntGauge,
    cluster_refused: IntCounter,
    /// Children of the families counted for every message and task,
    /// resolved once: a family's lookup hashes its label values under a
    /// lock, which the route path should not pay per item.
    hot: Hot,
    tools: Bounded,
    models: Bounded,
    /// One scrape at a time: a render resets and refills the gauges.
    rendering: Mutex<()>,
}

impl Metrics {
    /// Every family, registered, at zero; `started` is when the kernel
    /// started (`hivekernel_start_time_seconds`).
    pub fn new(started: std::time::SystemTime) -> Metrics {
        let registry = Registry::new();
        let reg = Registrar(&registry);
        let routed = reg.counters(
            "messages_routed_total",
            "Items delivered into a mailbox, by type (message, task, resume).",
            &["type"],
        );
        let tasks = reg.counters("tasks_total", "Tasks finished, by outcome.", &["outcome"]);
        let task_seconds = reg.histograms(
            "task_duration_seconds",
            "Time from a task's pop to its reply, by outcome.",
            &["outcome"],
            WORK_BUCKETS,
        );
        let hot = Hot::new(&routed, &tasks, &task_seconds);
        let metrics = Metrics {
            routed,
            spawns: reg.counters(
                "spawns_total",
                "Processes created (not those restored after a kernel restart), by role.",
                &["role"],
            ),
            exits: reg.counters(
                "exits_total",
                "Processes that exited, by how: normal (code 0), failed, killed, panicked, cannot_start or error (another code).",
                &["reason"],
            ),
            restarts: reg.counters(
                "restarts_total",
                "Processes restarted by their supervisor (automatic) or by an operator (manual).",
                &["kind"],
            ),
            escalations: reg.counter(
                "escalations_total",
                "Children that exceeded their restart intensity, failing their parent in turn.",
            ),
            refusals: reg.counters(
                "refusals_total",
                "Requests refused by policy (capabilities, limits, budgets, rate limits, routing rules), by action.",
                &["action"],
            ),
            mailbox_refusals: reg.counters(
                "mailbox_refusals_total",
                "Items a mailbox refused: full (by count or bytes) or closed.",
                &["reason"],
            ),
            messages_expired: reg.counter(
                "messages_expired_total",
                "Messages that passed their TTL before delivery.",
            ),
            messages_dropped: reg.counter(
                "messages_dropped_total",
                "Messages the kernel produced itself that could not be delivered.",
            ),
            llm_calls: reg.counters(
                "llm_calls_total",
                "Model calls made through the kernel, by model, caller role and outcome.",
                &["model", "role", "outcome"],
            ),
            llm_tokens: reg.counters(
                "llm_tokens_total",
                "Tokens the provider reported, by model, caller role and type (prompt, completion).",
                &["model", "role", "type"],
            ),
            llm_cost: reg.float_counters(
                "llm_cost_usd_total",
                "What model calls cost in US dollars, from llm.prices, by model and caller role.",
                &["model", "role"],
            ),
            llm_seconds: reg.histograms(
                "llm_call_duration_seconds",
                "Time from a model request to its answer (retries included), by model.",
                &["model"],
                MODEL_BUCKETS,
            ),
            tool_calls: reg.counters(
                "tool_calls_total",
                "Tool calls agents' runtimes made, by tool and outcome.",
                &["tool", "outcome"],
            ),
            tool_seconds: reg.histograms(
                "tool_call_duration_seconds",
                "How long a tool ran, by tool.",
                &["tool"],
                WORK_BUCKETS,
            ),
            cron_runs: reg.counters(
                "cron_runs_total",
                "Cron slots, by status (ok, failed, skipped, missed).",
                &["status"],
            ),
            inbox_requests: reg.counters(
                "inbox_requests_total",
                "Requests agents put to people, by kind (approval, question).",
                &["kind"],
            ),
            inbox_resolutions: reg.counters(
                "inbox_resolutions_total",
                "Inbox requests resolved, by decision (approved, denied, answered, timed_out, withdrawn).",
                &["decision"],
            ),
            notify_failures: reg.counter(
                "notify_failures_total",
                "Inbox webhook calls that failed for good or were dropped.",
            ),
            mcp_servers: reg.counters(
                "mcp_server_transitions_total",
                "MCP server state changes, by server and new state.",
                &["server", "state"],
            ),
            events: reg.counter("events_total", "Events emitted."),
            grpc_requests: reg.counters(
                "grpc_requests_total",
                "gRPC calls answered, by service, method and status code (a stream's, as it began).",
                &["service", "method", "code"],
            ),
            grpc_seconds: reg.histograms(
                "grpc_request_duration_seconds",
                "Time to a gRPC call's answer (a stream's first), by service and method.",
                &["service", "method"],
                FAST_BUCKETS,
            ),
            store_commit_seconds: reg.histogram(
                "store_commit_duration_seconds",
                "Time the store takes to commit one batch of writes.",
                FAST_BUCKETS,
            ),
            processes: reg.gauges(
                "processes",
                "Processes in the table (the kernel's own included), by state and role.",
                &["state", "role"],
            ),
            mailbox_messages: reg.gauge(
                "mailbox_messages",
                "Messages and tasks waiting in all mailboxes.",
            ),
            mailbox_messages_max: reg.gauge(
                "mailbox_messages_max",
                "The most messages and tasks waiting in any one mailbox.",
            ),
            event_subscribers: reg.gauge(
                "event_subscribers",
                "Live event subscribers (SubscribeEvents streams and the kernel's own).",
            ),
            inbox_pending: reg.gauges(
                "inbox_pending",
                "Inbox requests waiting for a person, by kind.",
                &["kind"],
            ),
            store_queue: reg.gauge(
                "store_queue_writes",
                "Writes queued for the store, not yet committed.",
            ),
            cluster_refused: reg.counter(
                "cluster_refused_total",
                "Messages and bucket values on the cluster's NATS refused: not signed with \
                 the cluster secret, replayed or stale.",
            ),
            hot,
            tools: Bounded::default(),
            models: Bounded::default(),
            rendering: Mutex::new(()),
            registry: registry.clone(),
        };
        let start = reg.float_gauge(
            "start_time_seconds",
            "When the kernel started, in seconds since the Unix epoch.",
        );
        start.set(
            started
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64(),
        );
        reg.gauges(
            "build_info",
            "Always 1; the version of the running kernel.",
            &["version"],
        )
        .with_label_values(&[env!("CARGO_PKG_VERSION")])
        .set(1);
        metrics
    }

    /// Counts what `kind` says happened.
    #[inline]
    pub fn event(&self, kind: &EventKind) {
        self.events.inc();
        match kind {
            EventKind::Spawned {
                role,
                restored: false,
                ..
            } => self.spawns.with_label_values(&[role.as_str()]).inc(),
            EventKind::Exited { exit_code, .. } => {
                self.exits
                    .with_label_values(&[exit_class(*exit_code)])
                    .inc();
            }
            EventKind::Restarted { manual, .. } => {
                let kind = if *manual { "manual" } else { "automatic" };
                self.restarts.with_label_values(&[kind]).inc();
            }
            EventKind::Escalated { .. } => self.escalations.inc(),
            // The action is one of the kernel's own words (`spawn`, `llm_call`).
            EventKind::Denied { action, .. } => {
                self.refusals.with_label_values(&[action.as_str()]).inc();
            }
            EventKind::RouteDenied { .. } => self.refusals.with_label_values(&["route"]).inc(),
            EventKind::MessageExpired { .. } => self.messages_expired.inc(),
            EventKind::MessageDropped { .. } => self.messages_dropped.inc(),
            EventKind::TaskFinished {
                success,
                duration_ms,
                ..
            } => {
                let ok = usize::from(*success);
                self.hot.tasks[ok].inc();
                self.hot.task_seconds[ok].observe(seconds(*duration_ms));
            }
            EventKind::ToolCall {
                tool,
                ok,
                duration_ms,
                ..
            } => {
                let tool = self.tools.label(tool);
                self.tool_calls
                    .with_label_values(&[tool, outcome(*ok)])
                    .inc();
                self.tool_seconds
                    .with_label_values(&[tool])
                    .observe(seconds(*duration_ms));
            }
            EventKind::CronRun { status, .. } => {
                self.cron_runs.with_label_values(&[status.as_str()]).inc();
            }
            EventKind::ApprovalRequested { kind, .. } => {
                self.inbox_requests
                    .with_label_values(&[kind.as_str()])
                    .inc();
            }
            EventKind::ApprovalResolved { decision, .. } => {
                self.inbox_resolutions
                    .with_label_values(&[decision.as_str()])
                    .inc();
            }
            EventKind::NotifyFailed { .. } => self.notify_failures.inc(),
            EventKind::McpServer { server, state, .. } => {
                self.mcp_servers
                    .with_label_values(&[server.as_str(), state.as_str()])
                    .inc();
            }
            // Counted where the caller's role is known: `Metrics::llm_call`.
            EventKind::LlmCall { .. } => {}
            _ => {}
        }
    }

    /// One model call of a process of `role`.
    pub fn llm_call(
        &self,
        model: &str,
        role: Role,
        usage: Usage,
        cost_nano_usd: u64,
        duration: Duration,
        ok: bool,
    ) {
        let model = self.models.label(model);
        let role = role.as_str();
        self.llm_calls
            .with_label_values(&[model, role, outcome(ok)])
            .inc();
        if usage.prompt_tokens > 0 {
            self.llm_tokens
                .with_label_values(&[model, role, "prompt"])
                .inc_by(usage.prompt_tokens);
        }
        if usage.completion_tokens > 0 {
            self.llm_tokens
                .with_label_values(&[model, role, "completion"])
                .inc_by(usage.completion_tokens);
        }
        if cost_nano_usd > 0 {
            self.llm_cost
                .with_label_values(&[model, role])
                .inc_by(cost_nano_usd as f64 / 1e9);
        }
        self.llm_seconds
            .with_label_values(&[model])
            .observe(duration.as_secs_f64());
    }

    /// An item of `kind` (`message`, `task`, `resume`) went into a mailbox.
    #[inline]
    pub fn routed(&self, kind: &'static str) {
        match kind {
            "message" => self.hot.routed_message.inc(),
            "task" => self.hot.routed_task.inc(),
            "resume" => self.hot.routed_resume.inc(),
            other => self.routed.with_label_values(&[other]).inc(),
        }
    }

    /// A mailbox refused an item (`full`, `full_bytes`, `closed`).
    pub fn mailbox_refused(&self, reason: &'static str) {
        self.mailbox_refusals.with_label_values(&[reason]).inc();
    }

    /// A gRPC call to `service`/`method` (names this server has, or
    /// `unknown`) was answered with `code` after `elapsed`.
    pub fn grpc_call(&self, (service, method): (&str, &str), code: &str, elapsed: Duration) {
        self.grpc_requests
            .with_label_values(&[service, method, code])
            .inc();
        self.grpc_seconds
            .with_label_values(&[service, method])
            .observe(elapsed.as_secs_f64());
    }

    /// The histogram the store's writer records its commits in.
    pub fn store_commits(&self) -> Histogram {
        self.store_commit_seconds.clone()
    }

    /// The exposition: every family, with the gauges set from `census`.
    pub fn render(&self, census: &Census) -> String {
        let _one = self.rendering.lock();
        self.processes.reset();
        for &(state, role, count) in &census.processes {
            self.processes
                .with_label_values(&[state.as_str(), role.as_str()])
                .set(gauge(count));
        }
        self.mailbox_messages.set(gauge(census.mailbox_messages));
        self.mailbox_messages_max
            .set(gauge(census.mailbox_messages_max));
        self.event_subscribers.set(gauge(census.event_subscribers));
        self.inbox_pending.reset();
        for kind in ["approval", "question"] {
            let count = census
                .inbox_pending
                .iter()
                .filter(|(k, _)| *k == kind)
                .map(|(_, n)| *n)
                .sum();
            self.inbox_pending
                .with_label_values(&[kind])
                .set(gauge(count));
        }
        self.store_queue.set(gauge(census.store_queue));
        // Counted by the cluster; the family follows it at each scrape.
        let counted = self.cluster_refused.get();
        self.cluster_refused
            .inc_by(census.cluster_refused.saturating_sub(counted));
        let mut text = String::with_capacity(16 << 10);
        if let Err(err) = TextEncoder::new().encode_utf8(&self.registry.gather(), &mut text) {
            // Only a family with mismatched label counts fails, which
            // `Registrar` rules out; say so rather than serve half a page.
            tracing::error!(error = %err, "metrics: cannot encode");
        }
        text
    }
}

/// `exits_total`'s reason for an exit code.
fn exit_class(code: i32) -> &'static str {
    match code {
        0 => "normal",
        EXIT_FAILED => "failed",
        EXIT_KILLED => "killed",
        EXIT_PANICKED => "panicked",
        EXIT_CANNOT_START => "cannot_start",
        _ => "error",
    }
}

fn outcome(ok: bool) -> &'static str {
    if ok { "ok" } else { "error" }
}

fn seconds(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

fn gauge(count: u64) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// A label's values, capped at [`MAX_LABEL_VALUES`].
#[derive(Debug, Default)]
struct Bounded(Mutex<HashSet<Box<str>>>);

impl Bounded {
    /// `value`, or `other` once the cap is reached by other values.
    fn label<'a>(&self, value: &'a str) -> &'a str {
        let mut seen = self.0.lock();
        if seen.contains(value) {
            value
        } else if seen.len() < MAX_LABEL_VALUES {
            seen.insert(value.into());
            value
        } else {
            "other"
        }
    }
}

/// Makes families named `hivekernel_<name>` and registers them. The names
/// and label lists are this file's constants: a failure is a bug here,
/// caught by the first test that makes a `Metrics`.
struct Registrar<'a>(&'a Registry);

impl Registrar<'_> {
    fn add<C: Collector + Clone + 'static>(&self, collector: C) -> C {
        #[expect(clippy::expect_used, reason = "fixed names, checked by every test")]
        self.0
            .register(Box::new(collector.clone()))
            .expect("metric families have distinct, valid names");
        collector
    }

    fn opts(name: &str, help: &str) -> Opts {
        Opts::new(name, help).namespace("hivekernel")
    }

    #[expect(clippy::expect_used, reason = "fixed names, checked by every test")]
    fn counters(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.add(IntCounterVec::new(Self::opts(name, help), labels).expect("valid counter"))
    }

    #[expect(clippy::expect_used, reason = "fixed names, checked by every test")]
    fn float_counters(&self, name: &str, help: &str, labels: &[&str]) -> CounterVec {
        self.add(CounterVec::new(Self::opts(name, help), labels).expect("valid counter"))
    }

    #[expect(clippy::expect_used, reason = "fixed names, checked by every test")]
    fn counter(&self, name: &str, help: &str) -> IntCounter {
        self.add(IntCounter::with_opts(Self::opts(name, help)).expect("valid counter"))
    }

    #[expect(clippy::expect_used, reason = "fixed names, checked by every test")]
    fn gauges(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.add(IntGaugeVec::new(Self::opts(name, help), labels).expect("valid gauge"))
    }

    #[expect(clippy::expect_used, reason = "fixed names, checked by every test")]
    fn gauge(&self, name: &str, help: &str) -> IntGauge {
        self.add(IntGauge::with_opts(Self::opts(name, help)).expect("valid gauge"))
    }

    #[expect(clippy::expect_used, reason = "fixed names, checked by every test")]
    fn float_gauge(&self, name: &str, help: &str) -> Gauge {
        self.add(Gauge::with_opts(Self::opts(name, help)).expect("valid gauge"))
    }

    fn histogram_opts(name: &str, help: &str, buckets: &[f64]) -> HistogramOpts {
        HistogramOpts::from(Self::opts(name, help)).buckets(buckets.to_vec())
    }

    #[expect(clippy::expect_used, reason = "fixed names, checked by every test")]
    fn histograms(&self, name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> HistogramVec {
        self.add(
            HistogramVec::new(Self::histogram_opts(name, help, buckets), labels)
                .expect("valid histogram"),
        )
    }

    #[expect(clippy::expect_used, reason = "fixed names, checked by every test")]
    fn histogram(&self, name: &str, help: &str, buckets: &[f64]) -> Histogram {
        self.add(
            Histogram::with_opts(Self::histogram_opts(name, help, buckets))
                .expect("valid histogram"),
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn labels_from_outside_are_capped_and_the_rest_count_as_other() {
        let bounded = Bounded::default();
        for i in 0..MAX_LABEL_VALUES {
            assert_eq!(bounded.label(&format!("tool{i}")), format!("tool{i}"));
        }
        assert_eq!(bounded.label("one_too_many"), "other");
        assert_eq!(bounded.label("tool7"), "tool7");
    }

    #[test]
    fn events_are_counted_by_their_bounded_labels_and_gauges_come_from_the_census() {
        let metrics = Metrics::new(std::time::SystemTime::now());
        metrics.event(&EventKind::Exited {
            ppid: hivekernel_agents::Pid(1),
            name: "w".into(),
            exit_code: EXIT_KILLED,
            reason: "killed by operator".into(),
        });
        metrics.event(&EventKind::ToolCall {
            tool: "shell_exec".into(),
            ok: false,
            duration_ms: 1500,
            error: Some("exit 1".into()),
        });
        metrics.llm_call(
            "sonnet",
            Role::Worker,
            Usage {
                prompt_tokens: 120,
                completion_tokens: 30,
            },
            2_500_000,
            Duration::from_millis(800),
            true,
        );
        let census = Census {
            processes: vec![(ProcessState::Idle, Role::Worker, 3)],
            mailbox_messages: 7,
            mailbox_messages_max: 5,
            inbox_pending: vec![("approval", 2)],
            ..Census::default()
        };
        let text = metrics.render(&census);
        for line in [
            "hivekernel_exits_total{reason=\"killed\"} 1",
            "hivekernel_tool_calls_total{outcome=\"error\",tool=\"shell_exec\"} 1",
            "hivekernel_tool_call_duration_seconds_bucket{tool=\"shell_exec\",le=\"2.5\"} 1",
            "hivekernel_tool_call_duration_seconds_bucket{tool=\"shell_exec\",le=\"1\"} 0",
            "hivekernel_llm_tokens_total{model=\"sonnet\",role=\"worker\",type=\"prompt\"} 120",
            "hivekernel_llm_tokens_total{model=\"sonnet\",role=\"worker\",type=\"completion\"} 30",
            "hivekernel_llm_cost_usd_total{model=\"sonnet\",role=\"worker\"} 0.0025",
            "hivekernel_processes{role=\"worker\",state=\"idle\"} 3",
            "hivekernel_mailbox_messages 7",
            "hivekernel_inbox_pending{kind=\"approval\"} 2",
            "hivekernel_inbox_pending{kind=\"question\"} 0",
            "hivekernel_events_total 2",
        ] {
            assert!(text.contains(line), "{line:?} not in\n{text}");
        }
        // The next census replaces the last: no stale state or role.
        let text = metrics.render(&Census::default());
        assert!(!text.contains("state=\"idle\""), "{text}");
    }
}
