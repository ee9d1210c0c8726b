//! OpenTelemetry traces (`kernel.otel`, or the standard `OTEL_EXPORTER_OTLP_*`
//! variables): spans exported over OTLP to a collector, named and
//! attributed after the GenAI semantic conventions.
//!
//! The kernel already carries a W3C trace context on every task and
//! message (trace.rs), across processes, delegation and restarts; spans
//! take their ids from it rather than from where tokio happens to poll.
//! An item carries the span of the work that made it (its parent, as a
//! `traceparent` does); the work that handles it opens its own span under
//! that one and runs in it. So one gRPC call, one cron firing, is one
//! trace, however many processes it reaches:
//!
//! ```text
//! hivekernel.v1.Kernel/ExecuteTask          (SERVER; the caller's traceparent is its parent)
//! └─ invoke_agent lead                      (the task the lead handles)
//!    ├─ chat gpt-4o                         (each model call)
//!    ├─ create_agent worker-1               (each spawn)
//!    ├─ invoke_agent worker-1               (each task or message a worker handles)
//!    │  └─ chat gpt-4o-mini
//!    └─ execute_tool orchestrate            (each tool call, once it ended)
//! ```
//!
//! Off (the default) it costs one branch per item: [`Traces`] is an
//! `Option` the kernel owns. On, spans go to a batch processor (its own
//! thread, a bounded queue that drops and counts rather than blocks) and
//! the rest is flushed when the kernel stops.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use hivekernel_agents::llm::{ChatMessage, ChatRequest, ChatResponse, ChatRole, LlmError};
use hivekernel_agents::{
    Pid, ProcessContext, SpanId, SpawnRequest, ToolCallReport, TraceContext, TraceId,
};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanKind, Status, TraceContextExt as _, TraceFlags, TraceState,
    Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue, StringValue};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use serde_json::json;

use crate::config::{OtelProtocol, OtelSettings};

/// Whether any kernel in this OS process exports traces: the one branch
/// the runner takes per item before it looks for its kernel's tracer.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether a kernel in this OS process may export traces (a hint; the
/// kernel's own [`Traces`] decides).
pub(crate) fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// The kernel's tracer: where spans are made and sent.
#[derive(Debug)]
pub struct Traces {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    /// Message contents go into spans (`gen_ai.input.messages` and the like).
    pub(crate) capture_content: bool,
}

/// One span being recorded; it ends when dropped. A no-op when the kernel
/// exports no traces: one word then (the SDK's span is a few hundred bytes,
/// and every handler's task-local holds one).
#[derive(Debug, Default)]
pub(crate) struct Span(Option<Box<opentelemetry_sdk::trace::Span>>);

impl Traces {
    /// Builds the exporter and the batch processor. Must run inside the
    /// tokio runtime (the gRPC exporter's client lives on it).
    pub fn start(settings: &OtelSettings) -> Result<Traces, String> {
        crate::tls::install_provider();
        let exporter = match settings.protocol {
            OtelProtocol::HttpProtobuf => {
                let mut builder = opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
                if let Some(endpoint) = &settings.endpoint {
                    builder = builder.with_endpoint(http_traces_url(endpoint));
                }
                builder.build()
            }
            OtelProtocol::Grpc => {
                let mut builder = opentelemetry_otlp::SpanExporter::builder().with_tonic();
                if let Some(endpoint) = &settings.endpoint {
                    builder = builder.with_endpoint(endpoint.clone());
                }
                builder.build()
            }
        }
        .map_err(|err| format!("the OTLP exporter cannot start: {err}"))?;
        let mut resource = Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("hivekernel");
        }
        let resource = resource
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("hivekernel");
        EXPORTING.store(true, Ordering::Relaxed);
        Ok(Traces {
            provider,
            tracer,
            capture_content: settings.capture_content,
        })
    }

    /// Opens a span named `name` under `parent` (none: a new trace) and
    /// answers it with the context work running in it carries.
    pub(crate) fn open(
        &self,
        name: impl Into<Cow<'static, str>>,
        kind: SpanKind,
        parent: Option<Parent>,
        attributes: Vec<KeyValue>,
    ) -> (Span, TraceContext) {
        let builder = self
            .tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attributes);
        let span = self
            .tracer
            .build_with_context(builder, &parent_context(parent));
        let context = own_context(span.span_context());
        (Span(Some(Box::new(span))), context)
    }

    /// The span a process handles one task, message or resumed turn in.
    pub(crate) fn invoke_agent(
        &self,
        ctx: &ProcessContext,
        parent: Option<TraceContext>,
        item: &'static str,
    ) -> (Span, TraceContext) {
        // Shared, not copied: one span per item handled.
        let id = StringValue::from(std::sync::Arc::<str>::from(ctx.pid.to_string()));
        self.open(
            format!("invoke_agent {}", ctx.name),
            SpanKind::Internal,
            parent.map(Parent::Local),
            vec![
                KeyValue::new("gen_ai.operation.name", "invoke_agent"),
                KeyValue::new("gen_ai.agent.name", StringValue::from(ctx.name.clone())),
                KeyValue::new("gen_ai.agent.id", id.clone()),
                KeyValue::new("gen_ai.conversation.id", id),
                KeyValue::new("hivekernel.role", ctx.role.as_str()),
                KeyValue::new("hivekernel.item", item),
            ],
        )
    }

    /// The span of one model call process `pid` makes, in the work
    /// running now.
    pub(crate) fn chat(
        &self,
        parent: Option<TraceContext>,
        provider: &str,
        request: &ChatRequest,
        pid: Pid,
    ) -> Span {
        let mut attributes = vec![
            KeyValue::new("gen_ai.operation.name", "chat"),
            KeyValue::new("gen_ai.provider.name", provider.to_owned()),
            KeyValue::new("gen_ai.request.model", request.model.clone()),
            KeyValue::new("gen_ai.conversation.id", pid.to_string()),
        ];
        if let Some(max) = request.max_tokens {
            attributes.push(KeyValue::new("gen_ai.request.max_tokens", i64::from(max)));
        }
        if self.capture_content {
            let (input, system) = messages_json(&request.messages);
            attributes.push(KeyValue::new("gen_ai.input.messages", input));
            if let Some(system) = system {
                attributes.push(KeyValue::new("gen_ai.system_instructions", system));
            }
        }
        let name = format!("chat {}", request.model);
        let parent = parent.map(Parent::Local);
        self.open(name, SpanKind::Client, parent, attributes).0
    }

    /// Completes a model call's span with its answer.
    pub(crate) fn answered(&self, span: &mut Span, answer: &Result<ChatResponse, LlmError>) {
        match answer {
            Ok(response) => {
                let mut attributes = vec![
                    KeyValue::new(
                        "gen_ai.usage.input_tokens",
                        i64::try_from(response.usage.prompt_tokens).unwrap_or(i64::MAX),
                    ),
                    KeyValue::new(
                        "gen_ai.usage.output_tokens",
                        i64::try_from(response.usage.completion_tokens).unwrap_or(i64::MAX),
                    ),
                ];
                if let Some(reason) = &response.finish_reason {
                    attributes.push(KeyValue::new(
                        "gen_ai.response.finish_reasons",
                        opentelemetry::Value::Array(
                            vec![opentelemetry::StringValue::from(reason.clone())].into(),
                        ),
                    ));
                }
                if self.capture_content {
                    let output = serde_json::Value::from(vec![message_json(&response.message)]);
                    attributes.push(KeyValue::new("gen_ai.output.messages", output.to_string()));
                }
                span.set(attributes);
            }
            Err(err) => span.fail(llm_error_type(err), err.to_string()),
        }
    }

    /// The span of one spawn (`create_agent`), in the work running now;
    /// completed with [`Traces::created`].
    pub(crate) fn create_agent(
        &self,
        parent: Option<TraceContext>,
        request: &SpawnRequest,
    ) -> Span {
        let parent = parent.map(Parent::Local);
        let attributes = vec![
            KeyValue::new("gen_ai.operation.name", "create_agent"),
            KeyValue::new("gen_ai.agent.name", request.name.clone()),
            KeyValue::new("gen_ai.request.model", request.model.clone()),
            KeyValue::new("hivekernel.role", request.role.as_str()),
            KeyValue::new("hivekernel.parent.pid", request.parent.to_string()),
        ];
        let name = format!("create_agent {}", request.name);
        self.open(name, SpanKind::Internal, parent, attributes).0
    }

    /// Completes a spawn's span: the PID it got, or why it was refused.
    pub(crate) fn created<E: std::fmt::Display>(span: &mut Span, spawned: &Result<Pid, E>) {
        match spawned {
            Ok(pid) => span.set([KeyValue::new("gen_ai.agent.id", pid.to_string())]),
            Err(err) => span.fail("refused", err.to_string()),
        }
    }

    /// Records one tool call `pid` made, now that it ended (`execute_tool`).
    pub(crate) fn tool_called(
        &self,
        parent: Option<TraceContext>,
        pid: Pid,
        report: &ToolCallReport,
    ) {
        let mut attributes = vec![
            KeyValue::new("gen_ai.operation.name", "execute_tool"),
            KeyValue::new("gen_ai.tool.name", report.tool.clone()),
            KeyValue::new("gen_ai.tool.call.id", report.call_id.clone()),
            KeyValue::new("gen_ai.tool.type", "function"),
            KeyValue::new("gen_ai.conversation.id", pid.to_string()),
        ];
        if self.capture_content {
            attributes.push(KeyValue::new(
                "gen_ai.tool.call.result",
                report.output.clone(),
            ));
        }
        self.ended(
            format!("execute_tool {}", report.tool),
            parent,
            report.duration,
            attributes,
            report.error.as_deref(),
        );
    }

    /// The span of one cron firing, the root of its own trace.
    pub(crate) fn cron(&self, name: &str, slot_unix_ms: u64) -> (Span, TraceContext) {
        let attributes = vec![
            KeyValue::new("hivekernel.cron.name", name.to_owned()),
            KeyValue::new(
                "hivekernel.cron.slot_unix_ms",
                i64::try_from(slot_unix_ms).unwrap_or(i64::MAX),
            ),
        ];
        self.open(format!("cron {name}"), SpanKind::Internal, None, attributes)
    }

    /// The span of one gRPC call that starts work (`Spawn`, `SendMessage`,
    /// `ExecuteTask`, `CallMcpTool`), under the caller's `traceparent`.
    pub(crate) fn server(
        &self,
        method: &'static str,
        parent: Option<TraceContext>,
    ) -> (Span, TraceContext) {
        let attributes = vec![
            KeyValue::new("rpc.system", "grpc"),
            KeyValue::new("rpc.service", "hivekernel.v1.Kernel"),
            KeyValue::new("rpc.method", method),
        ];
        let name = format!("hivekernel.v1.Kernel/{method}");
        self.open(
            name,
            SpanKind::Server,
            parent.map(Parent::Remote),
            attributes,
        )
    }

    /// Records a span that already ended: it began `took` ago.
    pub(crate) fn ended(
        &self,
        name: impl Into<Cow<'static, str>>,
        parent: Option<TraceContext>,
        took: Duration,
        attributes: Vec<KeyValue>,
        error: Option<&str>,
    ) {
        let now = SystemTime::now();
        let builder = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Internal)
            .with_start_time(now.checked_sub(took).unwrap_or(now))
            .with_attributes(attributes);
        let mut span = self
            .tracer
            .build_with_context(builder, &parent_context(parent.map(Parent::Local)));
        if let Some(error) = error {
            span.set_attribute(KeyValue::new("error.type", "tool_error"));
            span.set_status(Status::error(error.to_owned()));
        }
        span.end_with_timestamp(now);
    }

    /// Sends what is still queued and stops the exporter; blocking (at
    /// most a few seconds), so the caller runs it off the async threads.
    pub(crate) fn shutdown(&self) {
        if let Err(err) = self.provider.shutdown_with_timeout(Duration::from_secs(5)) {
            tracing::warn!(error = %err, "traces not all exported at stop");
        }
    }
}

/// Where a span hangs: a span of this kernel, or one a caller named in
/// its `traceparent`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Parent {
    Local(TraceContext),
    Remote(TraceContext),
}

impl Span {
    /// Adds attributes known only once the work is done.
    pub(crate) fn set(&mut self, attributes: impl IntoIterator<Item = KeyValue>) {
        if let Some(span) = &mut self.0 {
            span.set_attributes(attributes);
        }
    }

    /// Marks the span failed, with `error.type` and a description.
    pub(crate) fn fail(
        &mut self,
        error_type: impl Into<opentelemetry::Value>,
        description: impl Into<String>,
    ) {
        if let Some(span) = &mut self.0 {
            span.set_attribute(KeyValue::new("error.type", error_type));
            span.set_status(Status::error(description.into()));
        }
    }
}

/// `error.type` of a failed model call: the kind of failure, low-cardinality.
fn llm_error_type(err: &LlmError) -> &'static str {
    match err {
        LlmError::ContextLength(_) => "context_length_exceeded",
        LlmError::RateLimited { .. } => "rate_limited",
        LlmError::Http { .. } => "http_error",
        LlmError::Transport(_) => "transport_error",
        LlmError::Timeout(_) => "timeout",
        LlmError::InvalidResponse(_) => "invalid_response",
        LlmError::OverLimit(_) => "over_limit",
        LlmError::UnknownModel(_) => "unknown_model",
        LlmError::Config(_) => "config",
        LlmError::Refused(_) => "refused",
        LlmError::BudgetExceeded(_) => "budget_exceeded",
    }
}

fn parent_context(parent: Option<Parent>) -> Context {
    let Some(parent) = parent else {
        return Context::new();
    };
    let (trace, remote) = match parent {
        Parent::Local(trace) => (trace, false),
        Parent::Remote(trace) => (trace, true),
    };
    Context::new().with_remote_span_context(SpanContext::new(
        opentelemetry::trace::TraceId::from_bytes(trace.trace_id.0),
        opentelemetry::trace::SpanId::from_bytes(trace.span_id.0),
        TraceFlags::SAMPLED,
        remote,
        TraceState::default(),
    ))
}

fn own_context(context: &SpanContext) -> TraceContext {
    TraceContext {
        trace_id: TraceId(context.trace_id().to_bytes()),
        span_id: SpanId(context.span_id().to_bytes()),
    }
}

/// The traces URL under an OTLP/HTTP base endpoint (as
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is read): `<base>/v1/traces`.
fn http_traces_url(base: &str) -> String {
    format!("{}/v1/traces", base.trim_end_matches('/'))
}

/// `messages` in the GenAI conventions' shape (`gen_ai.input.messages`):
/// a JSON array of `{role, parts}`, each part text, a tool call or a tool
/// call's response. System messages go to `gen_ai.system_instructions`
/// instead (the second value).
pub(crate) fn messages_json(messages: &[ChatMessage]) -> (String, Option<String>) {
    let mut system = Vec::new();
    let mut shown = Vec::with_capacity(messages.len());
    for message in messages {
        if message.role == ChatRole::System {
            system.push(json!({"type": "text", "content": message.content}));
            continue;
        }
        shown.push(message_json(message));
    }
    let system = (!system.is_empty()).then(|| serde_json::Value::from(system).to_string());
    (serde_json::Value::from(shown).to_string(), system)
}

/// One message as `gen_ai.output.messages` holds it.
pub(crate) fn message_json(message: &ChatMessage) -> serde_json::Value {
    let mut parts = Vec::new();
    if message.role == ChatRole::Tool {
        parts.push(json!({
            "type": "tool_call_response",
            "id": message.tool_call_id,
            "response": message.content,
        }));
    } else if !message.content.is_empty() {
        parts.push(json!({"type": "text", "content": message.content}));
    }
    for call in &message.tool_calls {
        parts.push(json!({
            "type": "tool_call",
            "id": call.id,
            "name": call.name,
            "arguments": call.arguments,
        }));
    }
    json!({"role": message.role.as_str(), "parts": parts})
}
