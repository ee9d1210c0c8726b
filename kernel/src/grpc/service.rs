//! The `hivekernel.v1.Kernel` service: each handler converts the request,
//! calls the kernel as the authenticated caller, and converts the answer.

use std::sync::Arc;

use hivekernel_agents::{ArtifactId, Pid, TraceContext, TraceId};
use hivekernel_proto::v1 as pb;
use hivekernel_proto::v1::kernel_server::Kernel as KernelRpc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::streams::{self, Stop};
use super::{attach, convert, cron, inbox, mcp, reload, skills, tokens, transcript};
use crate::events::EventView;
use crate::kernel::{Caller, Kernel};
use crate::otel::Span;
use crate::reload::ConfigReload;
use crate::trace::scope_in;

/// Processes per `ListProcesses` batch when the request leaves it at 0.
const DEFAULT_BATCH: usize = 1000;
/// Largest `ListProcesses` batch, keeping each message well under 4 MiB.
const MAX_BATCH: usize = 10_000;

/// Serves the kernel API over gRPC.
#[derive(Debug, Clone)]
pub(crate) struct KernelService {
    kernel: Kernel,
    stop: Stop,
    /// How `ReloadConfig` reads the config again; `None` without a config file.
    reload: Option<Arc<dyn ConfigReload>>,
}

impl KernelService {
    /// The service; its streams also end when `drain` is cancelled.
    pub(crate) fn new(
        kernel: Kernel,
        drain: CancellationToken,
        reload: Option<Arc<dyn ConfigReload>>,
    ) -> Self {
        let stop = Stop {
            kernel: kernel.shutdown_token(),
            server: drain,
        };
        KernelService {
            kernel,
            stop,
            reload,
        }
    }
}

/// The caller the authentication layer attached to the request.
pub(super) fn caller<T>(request: &Request<T>) -> Result<Caller, Status> {
    request
        .extensions()
        .get::<Caller>()
        .copied()
        .ok_or_else(|| {
            Status::internal("request reached the service without an authenticated caller")
        })
}

type Rpc<T> = Result<Response<T>, Status>;

/// The caller's `traceparent`, if it sent one. A malformed one is ignored
/// (logged at debug level), never an error to the caller.
fn traceparent<T>(request: &Request<T>) -> Option<TraceContext> {
    let given = request.metadata().get("traceparent");
    let parsed = given
        .and_then(|value| value.to_str().ok())
        .and_then(TraceContext::from_traceparent);
    if given.is_some() && parsed.is_none() {
        tracing::debug!(traceparent = ?given, "malformed traceparent ignored");
    }
    parsed
}

impl KernelService {
    /// The span a call that starts work runs in, and its trace: under the
    /// caller's `traceparent`, else a new trace.
    fn call_span<T>(&self, method: &'static str, request: &Request<T>) -> (Span, TraceContext) {
        let parent = traceparent(request);
        match self.kernel.traces() {
            Some(traces) => traces.server(method, parent),
            None => (
                Span::default(),
                parent.map_or_else(TraceContext::new_root, TraceContext::child),
            ),
        }
    }
}

/// Runs `work` as one call, in its span and trace; a refusal marks the
/// span failed with the gRPC code it becomes.
async fn in_call<R, E: Into<Status>>(
    (span, trace): (Span, TraceContext),
    work: impl Future<Output = Result<R, E>>,
) -> Result<R, Status> {
    scope_in((span, Some(trace)), async move {
        work.await.map_err(|err| {
            let status: Status = err.into();
            crate::trace::fail(format!("{:?}", status.code()), status.message());
            status
        })
    })
    .await
}

#[tonic::async_trait]
impl KernelRpc for KernelService {
    async fn spawn(&self, request: Request<pb::SpawnRequest>) -> Rpc<pb::SpawnResponse> {
        let caller = caller(&request)?;
        let opened = self.call_span("Spawn", &request);
        let request = request.into_inner();
        let placement = convert::placement(&request)?;
        let spawn = convert::spawn_request(request)?;
        let pid = in_call(opened, self.kernel.spawn_placed(caller, spawn, &placement)).await?;
        Ok(Response::new(pb::SpawnResponse { pid: pid.0 }))
    }

    async fn kill(&self, request: Request<pb::KillRequest>) -> Rpc<pb::KillResponse> {
        let caller = caller(&request)?;
        let req = request.into_inner();
        let pid = convert::required_pid("pid", req.pid)?;
        let killed = self.kernel.kill(caller, pid, &req.reason).await?;
        Ok(Response::new(pb::KillResponse {
            killed: killed.exited.into_iter().map(|pid| pid.0).collect(),
            unreached: killed
                .unreached
                .into_iter()
                .map(|gone| pb::UnreachedProcess {
                    pid: gone.pid.0,
                    node: gone.node,
                    error: gone.error,
                })
                .collect(),
        }))
    }

    async fn restart_process(
        &self,
        request: Request<pb::RestartProcessRequest>,
    ) -> Rpc<pb::RestartProcessResponse> {
        let caller = caller(&request)?;
        let req = request.into_inner();
        let pid = convert::required_pid("pid", req.pid)?;
        let attempt = self.kernel.restart(caller, pid, &req.reason).await?;
        Ok(Response::new(pb::RestartProcessResponse {
            pid: pid.0,
            attempt,
        }))
    }

    async fn reload_config(
        &self,
        request: Request<pb::ReloadConfigRequest>,
    ) -> Rpc<pb::ReloadConfigResponse> {
        let caller = caller(&request)?;
        let Some(reloader) = &self.reload else {
            return Err(Status::failed_precondition(
                "this kernel was not started from a config file (hivekernel start): there is \
                 nothing to reload",
            ));
        };
        let report = reloader.clone().reload(caller).await?;
        Ok(Response::new(reload::response(report)))
    }

    async fn get_process(&self, request: Request<pb::GetProcessRequest>) -> Rpc<pb::ProcessInfo> {
        let caller = caller(&request)?;
        let pid = convert::required_pid("pid", request.get_ref().pid)?;
        let info = self.kernel.get_process(caller, pid).await?;
        Ok(Response::new(convert::process_info(info)))
    }

    type ListProcessesStream = ReceiverStream<Result<pb::ProcessBatch, Status>>;

    async fn list_processes(
        &self,
        request: Request<pb::ListProcessesRequest>,
    ) -> Rpc<Self::ListProcessesStream> {
        let caller = caller(&request)?;
        let req = request.into_inner();
        // No root: the whole table, or a process's own subtree.
        let root = match (req.root, caller) {
            (0, Caller::Process(own)) => own,
            (0, _) => Pid::KERNEL,
            (root, _) => Pid(root),
        };
        let max_depth = (req.max_depth != 0).then_some(req.max_depth);
        let batch = match req.batch_size as usize {
            0 => DEFAULT_BATCH,
            n => n.min(MAX_BATCH),
        };
        let pids = self.kernel.list_pids(caller, root, max_depth).await?;
        Ok(Response::new(streams::process_batches(
            self.kernel.clone(),
            self.stop.clone(),
            pids,
            batch,
        )))
    }

    async fn send_message(
        &self,
        request: Request<pb::SendMessageRequest>,
    ) -> Rpc<pb::SendMessageResponse> {
        let caller = caller(&request)?;
        let opened = self.call_span("SendMessage", &request);
        let trace = opened.1;
        let message = convert::outgoing(caller, request.into_inner())?;
        let id = in_call(opened, self.kernel.send_message(caller, message)).await?;
        Ok(Response::new(pb::SendMessageResponse {
            message_id: id.0,
            trace_id: trace.trace_id.to_string(),
        }))
    }

    async fn execute_task(
        &self,
        request: Request<pb::ExecuteTaskRequest>,
    ) -> Rpc<pb::ExecuteTaskResponse> {
        let caller = caller(&request)?;
        let opened = self.call_span("ExecuteTask", &request);
        let trace = opened.1;
        let task = convert::task_spec(request.into_inner())?;
        let (request_id, reply) = in_call(opened, self.kernel.execute_task(caller, task)).await?;
        let (success, output, error) = match reply {
            Ok(output) => (true, output, String::new()),
            Err(error) => (false, String::new(), error),
        };
        Ok(Response::new(pb::ExecuteTaskResponse {
            request_id: request_id.0,
            success,
            output,
            error,
            trace_id: trace.trace_id.to_string(),
        }))
    }

    async fn wait_child(&self, request: Request<pb::WaitChildRequest>) -> Rpc<pb::ExitRecord> {
        let caller = caller(&request)?;
        let req = request.into_inner();
        let pid = convert::required_pid("pid", req.pid)?;
        let timeout = convert::optional_millis(req.timeout_ms);
        let record = self.kernel.wait_child(caller, pid, timeout).await?;
        Ok(Response::new(convert::exit_record(record)))
    }

    type SubscribeEventsStream = ReceiverStream<Result<pb::Event, Status>>;

    async fn get_usage_report(
        &self,
        request: Request<pb::UsageReportRequest>,
    ) -> Rpc<pb::UsageReport> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let by = request
            .by
            .parse()
            .map_err(|why: String| Status::invalid_argument(format!("by: {why}")))?;
        let since = Some(request.since_day).filter(|day| !day.is_empty());
        let rows = self.kernel.llm().usage_report(caller, by, since).await?;
        Ok(Response::new(convert::usage_report(rows)))
    }

    async fn subscribe_events(
        &self,
        request: Request<pb::SubscribeEventsRequest>,
    ) -> Rpc<Self::SubscribeEventsStream> {
        let caller = caller(&request)?;
        let req = request.get_ref();
        let trace = match req.trace_id.as_str() {
            "" => None,
            text => Some(TraceId::parse(text).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "trace_id: {} is not a trace id (32 hex digits)",
                    crate::error::shown(text)
                ))
            })?),
        };
        let pid = (req.pid != 0).then_some(Pid(req.pid));
        let filter = self
            .kernel
            .event_filter(caller, pid, req.subtree, &req.types, trace)?;
        let tail = match usize::try_from(req.tail) {
            Ok(0) => None,
            Ok(tail) if tail <= streams::MAX_TAIL => Some(tail),
            _ => {
                return Err(Status::invalid_argument(format!(
                    "tail: at most {} events, got {}",
                    streams::MAX_TAIL,
                    req.tail
                )));
            }
        };
        let view = self.kernel.event_view(caller);
        // A non-zero since_seq or a tail asks for a replay even without the flag.
        let mut since =
            (req.replay || req.since_seq != 0 || tail.is_some()).then_some(req.since_seq);
        // In a cluster, the sequence is the cluster's stream's.
        let bounds = match self.kernel.cluster() {
            Some(cluster) => Some(cluster.event_bounds().await.map_err(|err| {
                Status::unavailable(format!("reading the cluster's events: {err}"))
            })?),
            None => None,
        };
        // When every event matches, the newest N start at a known place.
        if let (Some(tail), Some(from), EventView::All, true) =
            (tail, since, &view, filter.is_any())
        {
            let last = bounds.map_or_else(|| self.kernel.last_event_seq(), |b| b.last);
            since = Some(from.max(last.saturating_sub(tail as u64)));
        }
        let wanted = streams::Wanted {
            since,
            tail,
            view,
            filter,
        };
        if let (Some(cluster), Some(bounds)) = (self.kernel.cluster(), bounds) {
            return Ok(Response::new(streams::cluster_events(
                &self.kernel,
                cluster.clone(),
                self.stop.clone(),
                bounds,
                wanted,
            )));
        }
        let subscription = self.kernel.subscribe(since);
        Ok(Response::new(streams::events(
            &self.kernel,
            self.stop.clone(),
            subscription,
            wanted,
        )))
    }

    async fn add_cron(&self, request: Request<pb::CronSpec>) -> Rpc<pb::CronEntry> {
        let caller = caller(&request)?;
        let spec = cron::spec(caller, request.into_inner())?;
        let info = self.kernel.cron().add(caller, spec).await?;
        Ok(Response::new(cron::entry(info)))
    }

    async fn remove_cron(
        &self,
        request: Request<pb::RemoveCronRequest>,
    ) -> Rpc<pb::RemoveCronResponse> {
        let caller = caller(&request)?;
        self.kernel
            .cron()
            .remove(caller, &request.get_ref().name)
            .await?;
        Ok(Response::new(pb::RemoveCronResponse {}))
    }

    async fn set_cron_enabled(
        &self,
        request: Request<pb::SetCronEnabledRequest>,
    ) -> Rpc<pb::CronEntry> {
        let caller = caller(&request)?;
        let request = request.get_ref();
        let info = self
            .kernel
            .cron()
            .set_enabled(caller, &request.name, request.enabled)
            .await?;
        Ok(Response::new(cron::entry(info)))
    }

    async fn run_cron(&self, request: Request<pb::RunCronRequest>) -> Rpc<pb::CronEntry> {
        let caller = caller(&request)?;
        let info = self
            .kernel
            .cron()
            .run_now(caller, &request.get_ref().name)
            .await?;
        Ok(Response::new(cron::entry(info)))
    }

    async fn list_cron(&self, request: Request<pb::ListCronRequest>) -> Rpc<pb::ListCronResponse> {
        let caller = caller(&request)?;
        let (entries, unanswered) = self.kernel.cron().entries(caller).await;
        Ok(Response::new(pb::ListCronResponse {
            entries: entries.into_iter().map(cron::entry).collect(),
            unanswered: unanswered
                .into_iter()
                .map(|gap| pb::UnansweredNode {
                    node: gap.node,
                    error: gap.error,
                    processes: 0,
                })
                .collect(),
        }))
    }

    type AttachStream = attach::AttachStream;

    async fn attach(&self, request: Request<pb::AttachRequest>) -> Rpc<Self::AttachStream> {
        attach::attach(&self.kernel, &self.stop, request)
    }

    async fn complete_task(
        &self,
        request: Request<pb::CompleteTaskRequest>,
    ) -> Rpc<pb::CompleteTaskResponse> {
        attach::complete_task(&self.kernel, request)
    }

    async fn ack_messages(
        &self,
        request: Request<pb::AckMessagesRequest>,
    ) -> Rpc<pb::AckMessagesResponse> {
        attach::ack_messages(&self.kernel, request)
    }

    async fn store_artifact(
        &self,
        request: Request<pb::StoreArtifactRequest>,
    ) -> Rpc<pb::ArtifactInfo> {
        let caller = caller(&request)?;
        let (owner, artifact) = convert::new_artifact(request.into_inner())?;
        let info = self
            .kernel
            .artifacts()
            .store(caller, owner, artifact)
            .await?;
        Ok(Response::new(convert::artifact_info(info)))
    }

    async fn get_artifact(&self, request: Request<pb::GetArtifactRequest>) -> Rpc<pb::Artifact> {
        let caller = caller(&request)?;
        let id = ArtifactId(convert::required_id("id", request.get_ref().id)?);
        let artifact = self.kernel.artifacts().get(caller, id).await?;
        Ok(Response::new(convert::artifact(artifact)))
    }

    async fn list_artifacts(
        &self,
        request: Request<pb::ListArtifactsRequest>,
    ) -> Rpc<pb::ListArtifactsResponse> {
        let caller = caller(&request)?;
        let req = request.into_inner();
        let owner = (req.owner != 0).then_some(Pid(req.owner));
        let limit = (req.limit != 0).then_some(req.limit as usize);
        let listed = self.kernel.artifacts().list(caller, owner, limit).await?;
        Ok(Response::new(pb::ListArtifactsResponse {
            artifacts: listed.into_iter().map(convert::artifact_info).collect(),
        }))
    }

    async fn delete_artifact(
        &self,
        request: Request<pb::DeleteArtifactRequest>,
    ) -> Rpc<pb::DeleteArtifactResponse> {
        let caller = caller(&request)?;
        let id = ArtifactId(convert::required_id("id", request.get_ref().id)?);
        self.kernel.artifacts().delete(caller, id).await?;
        Ok(Response::new(pb::DeleteArtifactResponse {}))
    }

    async fn find_process(&self, request: Request<pb::FindProcessRequest>) -> Rpc<pb::ProcessInfo> {
        let caller = caller(&request)?;
        let pid = self.kernel.find_process(&request.get_ref().target).await?;
        let info = self.kernel.get_process(caller, pid).await?;
        Ok(Response::new(convert::process_info(info)))
    }

    async fn get_transcript(
        &self,
        request: Request<pb::GetTranscriptRequest>,
    ) -> Rpc<pb::GetTranscriptResponse> {
        let caller = caller(&request)?;
        let req = request.get_ref();
        let pid = convert::required_pid("pid", req.pid)?;
        let query = transcript::query(req)?;
        let page = self.kernel.transcripts().read(caller, pid, query).await?;
        Ok(Response::new(transcript::page(page)))
    }

    async fn list_mcp_servers(
        &self,
        request: Request<pb::ListMcpServersRequest>,
    ) -> Rpc<pb::ListMcpServersResponse> {
        caller(&request)?;
        Ok(Response::new(mcp::servers(&self.kernel)))
    }

    async fn list_nodes(
        &self,
        request: Request<pb::ListNodesRequest>,
    ) -> Rpc<pb::ListNodesResponse> {
        caller(&request)?;
        let nodes = self.kernel.nodes()?;
        Ok(Response::new(pb::ListNodesResponse {
            nodes: nodes.into_iter().map(convert::node).collect(),
        }))
    }

    async fn list_skills(
        &self,
        request: Request<pb::ListSkillsRequest>,
    ) -> Rpc<pb::ListSkillsResponse> {
        let caller = caller(&request)?;
        Ok(Response::new(skills::list(&self.kernel, caller)?))
    }

    async fn get_skill(&self, request: Request<pb::GetSkillRequest>) -> Rpc<pb::Skill> {
        let caller = caller(&request)?;
        Ok(Response::new(skills::get(
            &self.kernel,
            caller,
            request.get_ref(),
        )?))
    }

    async fn manage_skill(
        &self,
        request: Request<pb::ManageSkillRequest>,
    ) -> Rpc<pb::SkillVersion> {
        let caller = caller(&request)?;
        let version = skills::manage(&self.kernel, caller, request.into_inner()).await?;
        Ok(Response::new(version))
    }

    async fn skill_history(
        &self,
        request: Request<pb::SkillHistoryRequest>,
    ) -> Rpc<pb::SkillHistoryResponse> {
        let caller = caller(&request)?;
        let history = skills::history(&self.kernel, caller, request.get_ref()).await?;
        Ok(Response::new(history))
    }

    async fn list_mcp_tools(
        &self,
        request: Request<pb::ListMcpToolsRequest>,
    ) -> Rpc<pb::ListMcpToolsResponse> {
        caller(&request)?;
        Ok(Response::new(mcp::tools(
            &self.kernel,
            &request.get_ref().server,
        )?))
    }

    async fn call_mcp_tool(
        &self,
        request: Request<pb::CallMcpToolRequest>,
    ) -> Rpc<pb::CallMcpToolResponse> {
        let caller = caller(&request)?;
        let opened = self.call_span("CallMcpTool", &request);
        let answer = in_call(opened, mcp::call(&self.kernel, caller, request.get_ref())).await?;
        Ok(Response::new(answer))
    }

    async fn restart_mcp_server(
        &self,
        request: Request<pb::RestartMcpServerRequest>,
    ) -> Rpc<pb::McpServer> {
        let caller = caller(&request)?;
        let answer = mcp::restart(&self.kernel, caller, &request.get_ref().server).await?;
        Ok(Response::new(answer))
    }

    async fn list_requests(
        &self,
        request: Request<pb::ListRequestsRequest>,
    ) -> Rpc<pb::ListRequestsResponse> {
        let caller = caller(&request)?;
        Ok(Response::new(inbox::list(&self.kernel, caller)))
    }

    type WatchRequestsStream = ReceiverStream<Result<pb::InboxChange, Status>>;

    async fn watch_requests(
        &self,
        request: Request<pb::WatchRequestsRequest>,
    ) -> Rpc<Self::WatchRequestsStream> {
        let caller = caller(&request)?;
        Ok(Response::new(inbox::watch(
            &self.kernel,
            caller,
            self.stop.clone(),
        )))
    }

    async fn resolve(&self, request: Request<pb::ResolveRequest>) -> Rpc<pb::InboxRequest> {
        let caller = caller(&request)?;
        let answer = inbox::resolve(&self.kernel, caller, request.into_inner()).await?;
        Ok(Response::new(answer))
    }

    async fn create_token(
        &self,
        request: Request<pb::CreateTokenRequest>,
    ) -> Rpc<pb::CreateTokenResponse> {
        let caller = caller(&request)?;
        let answer = tokens::create(&self.kernel, caller, request.into_inner()).await?;
        Ok(Response::new(answer))
    }

    async fn list_tokens(
        &self,
        request: Request<pb::ListTokensRequest>,
    ) -> Rpc<pb::ListTokensResponse> {
        let caller = caller(&request)?;
        let answer = tokens::list(&self.kernel, caller, request.get_ref())?;
        Ok(Response::new(answer))
    }

    async fn revoke_token(
        &self,
        request: Request<pb::RevokeTokenRequest>,
    ) -> Rpc<pb::OperatorToken> {
        let caller = caller(&request)?;
        let answer = tokens::revoke(&self.kernel, caller, &request.get_ref().token).await?;
        Ok(Response::new(answer))
    }

    async fn read_log(&self, request: Request<pb::ReadLogRequest>) -> Rpc<pb::LogChunk> {
        let caller = caller(&request)?;
        let req = request.into_inner();
        let pid = convert::required_pid("pid", req.pid)?;
        let from = (!req.tail).then_some(req.offset);
        let chunk = self
            .kernel
            .exec()
            .log(caller, pid, from, req.max_bytes)
            .await?;
        Ok(Response::new(pb::LogChunk {
            text: chunk.text,
            offset: chunk.offset,
            size: chunk.size,
        }))
    }

    type WatchTranscriptStream = ReceiverStream<Result<pb::TranscriptEntry, Status>>;

    async fn watch_transcript(
        &self,
        request: Request<pb::WatchTranscriptRequest>,
    ) -> Rpc<Self::WatchTranscriptStream> {
        let caller = caller(&request)?;
        let req = request.get_ref();
        let pid = convert::required_pid("pid", req.pid)?;
        let live = self.kernel.transcripts().watch(caller, pid).await?;
        let query = transcript::watch_query(req);
        Ok(Response::new(transcript::watch(
            &self.kernel,
            self.stop.clone(),
            caller,
            pid,
            query,
            live,
        )))
    }
}
