//! The gRPC control plane end to end: a real kernel, the real server on
//! 127.0.0.1:0, and real tonic clients.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use hivekernel_agents::{Outgoing, Pid, SpawnRequest};
use hivekernel_kernel::auth::Authenticator;
use hivekernel_kernel::config::KernelSettings;
use hivekernel_kernel::{Caller, Kernel, grpc};
use hivekernel_proto::v1 as pb;
use hivekernel_proto::v1::kernel_client::KernelClient;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const TOKEN: &str = "0123456789abcdef0123456789abcdef";
const STEP: Duration = Duration::from_secs(10);

/// Adds fixed metadata to every call.
#[derive(Clone)]
struct Headers(Vec<(&'static str, MetadataValue<Ascii>)>);

impl Headers {
    fn bearer(token: &str) -> Self {
        Headers(vec![(
            "authorization",
            format!("Bearer {token}").parse().unwrap(),
        )])
    }
}

impl Interceptor for Headers {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        for (key, value) in &self.0 {
            request.metadata_mut().insert(*key, value.clone());
        }
        Ok(request)
    }
}

type Client = KernelClient<InterceptedService<Channel, Headers>>;

/// A kernel served over gRPC on loopback.
struct Served {
    kernel: Kernel,
    addr: SocketAddr,
    channel: Channel,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Served {
    async fn start() -> Served {
        Served::start_with(hivekernel_tests::test_settings()).await
    }

    async fn start_with(settings: KernelSettings) -> Served {
        let (kernel, _journal) = hivekernel_tests::kernel_with(settings).await;
        let stop = kernel.shutdown_token();
        Served::start_until(kernel, async move { stop.cancelled().await }).await
    }

    /// Serves `kernel` until `shutdown` resolves.
    async fn start_until(
        kernel: Kernel,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Served {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(grpc::serve(
            kernel.clone(),
            listener,
            Authenticator::new(TOKEN.to_owned()),
            shutdown,
        ));
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        Served {
            kernel,
            addr,
            channel,
            server,
        }
    }

    fn client(&self) -> Client {
        self.client_with(Headers::bearer(TOKEN))
    }

    fn client_with(&self, headers: Headers) -> Client {
        KernelClient::with_interceptor(self.channel.clone(), headers)
    }

    async fn stop(self) {
        self.kernel.shutdown().await;
        tokio::time::timeout(STEP, self.server)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
}

fn spawn_req(parent: u64, name: &str) -> pb::SpawnRequest {
    pb::SpawnRequest {
        parent,
        name: name.into(),
        ..Default::default()
    }
}

async fn spawn(client: &mut Client, req: pb::SpawnRequest) -> u64 {
    client.spawn(req).await.unwrap().into_inner().pid
}

fn assert_status<T: std::fmt::Debug>(result: Result<T, Status>, code: Code, needle: &str) {
    let status = result.unwrap_err();
    assert_eq!(status.code(), code, "{status:?}");
    assert!(
        status.message().contains(needle),
        "{needle:?} not in {:?}",
        status.message()
    );
}

#[tokio::test]
async fn calls_without_a_valid_token_are_unauthenticated() {
    let served = Served::start().await;
    let get = || pb::GetProcessRequest { pid: 1 };

    let mut anonymous = KernelClient::new(served.channel.clone());
    assert_status(
        anonymous.get_process(get()).await,
        Code::Unauthenticated,
        "authorization: Bearer",
    );

    let mut wrong = served.client_with(Headers::bearer("not-the-token"));
    assert_status(
        wrong.get_process(get()).await,
        Code::Unauthenticated,
        "invalid token",
    );

    // A header naming a PID is no credential, and does not make a bad token good.
    let Headers(mut headers) = Headers::bearer("not-the-token");
    headers.push(("x-hivekernel-pid", "1".parse().unwrap()));
    let mut claiming = served.client_with(Headers(headers));
    assert_status(
        claiming.get_process(get()).await,
        Code::Unauthenticated,
        "invalid token",
    );
    let mut claiming_only =
        served.client_with(Headers(vec![("x-hivekernel-pid", "1".parse().unwrap())]));
    assert_status(
        claiming_only.get_process(get()).await,
        Code::Unauthenticated,
        "missing",
    );

    let mut basic = served.client_with(Headers(vec![("authorization", TOKEN.parse().unwrap())]));
    assert_status(
        basic.get_process(get()).await,
        Code::Unauthenticated,
        "invalid token",
    );

    let info = served
        .client()
        .get_process(get())
        .await
        .unwrap()
        .into_inner();
    assert_eq!((info.pid, info.ppid, info.name.as_str()), (1, 0, "kernel"));
    served.stop().await;
}

#[tokio::test]
async fn health_answers_without_a_token_and_says_not_serving_once_a_stop_begins() {
    let (kernel, _journal) = hivekernel_tests::kernel_with(hivekernel_tests::test_settings()).await;
    // The server outlives the kernel's stop until released, as while
    // `hivekernel start` stops its processes.
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let served = Served::start_until(kernel, async move {
        let _ = released.await;
    })
    .await;
    let check = |service: &str| HealthCheckRequest {
        service: service.into(),
    };
    let mut anonymous = HealthClient::new(served.channel.clone());
    let mut wrong_token =
        HealthClient::with_interceptor(served.channel.clone(), Headers::bearer("nope"));
    for service in ["", "hivekernel.v1.Kernel"] {
        let reply = anonymous.check(check(service)).await.unwrap().into_inner();
        assert_eq!(reply.status, ServingStatus::Serving as i32, "{service:?}");
        let reply = wrong_token
            .check(check(service))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.status, ServingStatus::Serving as i32, "{service:?}");
    }
    assert_status(
        anonymous.check(check("no.such.Service")).await,
        Code::NotFound,
        "",
    );
    // Health is the only thing answered without a token.
    let result = served
        .client_with(Headers(Vec::new()))
        .get_process(pb::GetProcessRequest { pid: 1 })
        .await;
    assert_status(result, Code::Unauthenticated, "authorization");

    let mut watch = anonymous.watch(check("")).await.unwrap().into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.status, ServingStatus::Serving as i32);
    served.kernel.shutdown().await;
    let next = tokio::time::timeout(STEP, watch.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(next.status, ServingStatus::NotServing as i32);
    for service in ["", "hivekernel.v1.Kernel"] {
        let reply = anonymous.check(check(service)).await.unwrap().into_inner();
        assert_eq!(
            reply.status,
            ServingStatus::NotServing as i32,
            "{service:?}"
        );
    }
    release.send(()).unwrap();
    tokio::time::timeout(STEP, served.server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn reflection_lists_and_describes_every_service_on_v1_and_v1alpha() {
    use tonic_reflection::pb::{v1, v1alpha};

    let served = Served::start().await;
    let expected = [
        "hivekernel.v1.Kernel",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    ];

    let mut client = v1::server_reflection_client::ServerReflectionClient::with_interceptor(
        served.channel.clone(),
        Headers::bearer(TOKEN),
    );
    let ask = |request| v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    };
    let requests = vec![
        ask(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
        ask(
            v1::server_reflection_request::MessageRequest::FileContainingSymbol(
                "hivekernel.v1.Kernel".into(),
            ),
        ),
    ];
    let mut replies = client
        .server_reflection_info(tokio_stream::iter(requests))
        .await
        .unwrap()
        .into_inner();
    let listed = replies.message().await.unwrap().unwrap();
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        listed.message_response
    else {
        panic!("expected a service list, got {listed:?}");
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    for name in expected {
        assert!(names.contains(&name), "{name} not in {names:?}");
    }
    let described = replies.message().await.unwrap().unwrap();
    assert!(
        matches!(
            described.message_response,
            Some(v1::server_reflection_response::MessageResponse::FileDescriptorResponse(ref f))
                if !f.file_descriptor_proto.is_empty()
        ),
        "{described:?}"
    );

    let mut alpha = v1alpha::server_reflection_client::ServerReflectionClient::with_interceptor(
        served.channel.clone(),
        Headers::bearer(TOKEN),
    );
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut replies = alpha
        .server_reflection_info(tokio_stream::iter([request.clone()]))
        .await
        .unwrap()
        .into_inner();
    let listed = replies.message().await.unwrap().unwrap();
    let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        listed.message_response
    else {
        panic!("expected a service list, got {listed:?}");
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    for name in expected {
        assert!(names.contains(&name), "{name} not in {names:?}");
    }

    let mut anonymous =
        v1alpha::server_reflection_client::ServerReflectionClient::new(served.channel.clone());
    let result = anonymous
        .server_reflection_info(tokio_stream::iter([request]))
        .await;
    assert_status(result, Code::Unauthenticated, "authorization");
    served.stop().await;
}

#[tokio::test]
async fn spawn_get_execute_kill_and_wait_round_trip() {
    let served = Served::start().await;
    let mut client = served.client();
    let mut req = spawn_req(1, "worker");
    req.role = pb::Role::Worker as i32;
    req.tools = vec!["read_file".into()];
    req.metadata = HashMap::from([("team".to_owned(), "a".to_owned())]);
    req.limits = Some(pb::Limits {
        max_children: 3,
        ..Default::default()
    });
    let pid = spawn(&mut client, req).await;

    let info = client
        .get_process(pb::GetProcessRequest { pid })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (info.pid, info.ppid, info.name.as_str()),
        (pid, 1, "worker")
    );
    assert_eq!(info.role, pb::Role::Worker as i32);
    assert_eq!(info.tier, pb::CognitiveTier::Strategic as i32);
    assert_eq!(info.runtime, "echo");
    assert_eq!(info.tools, ["read_file"]);
    assert_eq!(info.metadata["team"], "a");
    assert_eq!(info.limits.unwrap().max_children, 3);
    assert_eq!(info.depth, 1);
    assert!(info.exit.is_none());

    let reply = client
        .execute_task(pb::ExecuteTaskRequest {
            pid,
            description: "summarise the README".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(reply.success, "{reply:?}");
    assert_eq!(reply.output, "summarise the README");
    assert!(reply.request_id > 0);

    let sent = client
        .send_message(pb::SendMessageRequest {
            to: pid,
            payload: "hi".into(),
            from: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(sent.message_id > 0);

    let killed = client
        .kill(pb::KillRequest {
            pid,
            reason: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(killed.killed, [pid]);
    let zombie = client
        .get_process(pb::GetProcessRequest { pid })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(zombie.state, pb::ProcessState::Zombie as i32);
    assert_eq!(zombie.exit.unwrap().exit_code, 137);

    let record = client
        .wait_child(pb::WaitChildRequest { pid, timeout_ms: 0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((record.pid, record.ppid, record.exit_code), (pid, 1, 137));
    assert_eq!(record.reason, "killed by 1");
    assert_status(
        client.get_process(pb::GetProcessRequest { pid }).await,
        Code::NotFound,
        "not found",
    );
    served.stop().await;
}

#[tokio::test]
async fn a_failed_task_is_a_reply_and_a_late_one_is_deadline_exceeded() {
    let served = Served::start().await;
    let mut client = served.client();
    let mut req = spawn_req(1, "probe");
    req.runtime = "probe".into();
    let pid = spawn(&mut client, req).await;

    let exec = |description: &str, timeout_ms| pb::ExecuteTaskRequest {
        pid,
        description: description.into(),
        timeout_ms,
        ..Default::default()
    };
    let reply = client
        .execute_task(exec("fail no luck", 0))
        .await
        .unwrap()
        .into_inner();
    assert!(!reply.success);
    assert_eq!(reply.error, "no luck");
    assert!(reply.request_id > 0);

    assert_status(
        client.execute_task(exec("sleep 2000", 50)).await,
        Code::DeadlineExceeded,
        "within 50 ms",
    );
    served.stop().await;
}

#[tokio::test]
async fn each_error_class_maps_to_its_grpc_code() {
    let served = Served::start().await;
    let mut client = served.client();

    // Unknown processes.
    assert_status(
        client.get_process(pb::GetProcessRequest { pid: 999 }).await,
        Code::NotFound,
        "999",
    );
    assert_status(
        client
            .kill(pb::KillRequest {
                pid: 999,
                reason: String::new(),
            })
            .await,
        Code::NotFound,
        "999",
    );

    // Malformed arguments, named by field.
    assert_status(
        client.get_process(pb::GetProcessRequest { pid: 0 }).await,
        Code::InvalidArgument,
        "pid must be set",
    );
    assert_status(
        client.spawn(spawn_req(1, "")).await,
        Code::InvalidArgument,
        "name must not be empty",
    );
    assert_status(
        client.spawn(spawn_req(0, "x")).await,
        Code::InvalidArgument,
        "parent must be set",
    );
    let mut bad_role = spawn_req(1, "x");
    bad_role.role = 99;
    assert_status(
        client.spawn(bad_role).await,
        Code::InvalidArgument,
        "role: unknown enum value 99",
    );
    let mut bad_runtime = spawn_req(1, "x");
    bad_runtime.runtime = "nope".into();
    assert_status(
        client.spawn(bad_runtime).await,
        Code::InvalidArgument,
        "unknown runtime",
    );
    assert_status(
        client
            .wait_child(pb::WaitChildRequest {
                pid: 2,
                timeout_ms: u64::MAX,
            })
            .await,
        Code::InvalidArgument,
        "timeout must be between 1 ms and 30 days",
    );
    let mut bad_priority = pb::SendMessageRequest {
        to: 1,
        priority: 17,
        ..Default::default()
    };
    assert_status(
        client.send_message(bad_priority.clone()).await,
        Code::InvalidArgument,
        "priority",
    );

    // Identity: `from` may only repeat the caller.
    bad_priority.priority = 0;
    bad_priority.from = 5;
    assert_status(
        client.send_message(bad_priority).await,
        Code::PermissionDenied,
        "from must be the caller's own pid",
    );

    // A task may not spawn.
    let mut task = spawn_req(1, "task");
    task.role = pb::Role::Task as i32;
    let task = spawn(&mut client, task).await;
    assert_status(
        client.spawn(spawn_req(task, "child")).await,
        Code::PermissionDenied,
        "lacks capability spawn_children",
    );

    // A full parent.
    let mut small = spawn_req(1, "small");
    small.limits = Some(pb::Limits {
        max_children: 1,
        ..Default::default()
    });
    let small = spawn(&mut client, small).await;
    spawn(&mut client, spawn_req(small, "first")).await;
    assert_status(
        client.spawn(spawn_req(small, "second")).await,
        Code::ResourceExhausted,
        "max children",
    );

    // PID 1 is not killable; an exited process is a failed precondition.
    assert_status(
        client
            .kill(pb::KillRequest {
                pid: 1,
                reason: String::new(),
            })
            .await,
        Code::PermissionDenied,
        "kernel",
    );
    client
        .kill(pb::KillRequest {
            pid: task,
            reason: "done".into(),
        })
        .await
        .unwrap();
    assert_status(
        client
            .kill(pb::KillRequest {
                pid: task,
                reason: String::new(),
            })
            .await,
        Code::FailedPrecondition,
        "already exited",
    );
    served.stop().await;
}

#[tokio::test]
async fn list_processes_streams_the_tree_in_preorder_batches() {
    let served = Served::start_with(KernelSettings {
        max_children: 64,
        ..hivekernel_tests::test_settings()
    })
    .await;
    // PID 1, 49 children, 50 grandchildren each: 2,500 processes.
    let mut expected = vec![1];
    for i in 0..49 {
        let child = served
            .kernel
            .spawn(
                Caller::Admin,
                SpawnRequest::new(Pid::KERNEL, format!("c{i}")),
            )
            .await
            .unwrap();
        expected.push(child.0);
        for j in 0..50 {
            let grandchild = served
                .kernel
                .spawn(Caller::Admin, SpawnRequest::new(child, format!("c{i}.{j}")))
                .await
                .unwrap();
            expected.push(grandchild.0);
        }
    }
    assert_eq!(expected.len(), 2_500);

    let mut client = served.client();
    let mut stream = client
        .list_processes(pb::ListProcessesRequest {
            root: 0,
            max_depth: 0,
            batch_size: 1000,
        })
        .await
        .unwrap()
        .into_inner();
    let mut sizes = Vec::new();
    let mut pids = Vec::new();
    while let Some(batch) = stream.message().await.unwrap() {
        sizes.push(batch.processes.len());
        pids.extend(batch.processes.iter().map(|p| p.pid));
    }
    assert_eq!(sizes, [1000, 1000, 500]);
    assert_eq!(pids, expected);

    // A subtree, one level deep, in one default-sized batch.
    let root = expected[1];
    let mut stream = client
        .list_processes(pb::ListProcessesRequest {
            root,
            max_depth: 1,
            batch_size: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let batch = stream.message().await.unwrap().unwrap();
    assert_eq!(batch.processes.len(), 51);
    assert_eq!(batch.processes[0].pid, root);
    assert!(
        batch.processes[1..]
            .iter()
            .all(|p| p.ppid == root && p.depth == 2)
    );
    assert!(stream.message().await.unwrap().is_none());

    let result = client
        .list_processes(pb::ListProcessesRequest {
            root: 99_999,
            ..Default::default()
        })
        .await;
    assert_status(result, Code::NotFound, "99999");
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_processes_handles_100_000_processes_within_message_limits() {
    let served = Served::start_with(KernelSettings {
        max_children: 100_000,
        ..hivekernel_tests::test_settings()
    })
    .await;
    // 100 leads with 999 workers each, plus the leads and PID 1: 100,001.
    for i in 0..100 {
        let mut lead = SpawnRequest::new(Pid::KERNEL, format!("lead{i}"));
        lead.limits.max_children = Some(1_000);
        let lead = served.kernel.spawn(Caller::Admin, lead).await.unwrap();
        for j in 0..999 {
            served
                .kernel
                .spawn(Caller::Admin, SpawnRequest::new(lead, format!("w{i}.{j}")))
                .await
                .unwrap();
        }
    }
    let mut client = served.client();
    // A large batch size is capped so no message nears the 4 MiB limit.
    let mut stream = client
        .list_processes(pb::ListProcessesRequest {
            root: 0,
            max_depth: 0,
            batch_size: u32::MAX,
        })
        .await
        .unwrap()
        .into_inner();
    let mut total = 0;
    let mut batches = 0;
    let mut last_pid = 0;
    while let Some(batch) = stream.message().await.unwrap() {
        assert!(
            batch.processes.len() <= 10_000,
            "batch of {}",
            batch.processes.len()
        );
        batches += 1;
        total += batch.processes.len();
        last_pid = batch.processes.last().map_or(last_pid, |p| p.pid);
    }
    assert_eq!(total, 100_001);
    assert!(batches >= 11, "{batches} batches");
    assert_eq!(last_pid, 100_001);
    served.stop().await;
}

async fn next_event(events: &mut tonic::Streaming<pb::Event>) -> pb::Event {
    tokio::time::timeout(STEP, events.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn subscribe_events_replays_then_goes_live() {
    let served = Served::start().await;
    let mut client = served.client();
    let before = served.kernel.last_event_seq();
    let first = spawn(&mut client, spawn_req(1, "first")).await;
    let second = spawn(&mut client, spawn_req(1, "second")).await;

    let mut events = client
        .subscribe_events(pb::SubscribeEventsRequest {
            since_seq: before,
            replay: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let replayed = [next_event(&mut events).await, next_event(&mut events).await];
    assert_eq!(
        replayed.iter().map(|e| e.pid).collect::<Vec<_>>(),
        [first, second]
    );
    assert!(replayed.iter().all(|e| e.r#type == "spawned"));
    assert!(replayed[0].seq > before && replayed[1].seq > replayed[0].seq);
    let detail: serde_json::Value = serde_json::from_str(&replayed[0].detail).unwrap();
    assert_eq!(detail["type"], "spawned");
    assert_eq!(detail["name"], "first");
    assert_eq!(detail["ppid"], 1);

    // A seq-0 marker ends the replay and names its last event.
    let done = next_event(&mut events).await;
    assert_eq!((done.seq, done.r#type.as_str()), (0, "replay_done"));
    let detail: serde_json::Value = serde_json::from_str(&done.detail).unwrap();
    assert_eq!(detail["last_seq"], replayed[1].seq);

    let third = spawn(&mut served.client(), spawn_req(1, "third")).await;
    let live = next_event(&mut events).await;
    assert_eq!((live.pid, live.r#type.as_str()), (third, "spawned"));
    assert!(live.seq > replayed[1].seq);
    served.stop().await;
}

#[tokio::test]
async fn a_subscriber_that_falls_behind_gets_one_lagged_event_then_the_rest() {
    let served = Served::start().await;
    let mut events = served
        .client()
        .subscribe_events(pb::SubscribeEventsRequest::default())
        .await
        .unwrap()
        .into_inner();
    // Messages to PID 1 become events. On this single-threaded runtime the
    // stream's producer cannot run until the test yields, so it falls behind
    // the 65,536 events the bus keeps in memory.
    const SENT: u64 = 70_000;
    for i in 0..SENT {
        let message = Outgoing::new(Pid::KERNEL, format!("note {i}"));
        served
            .kernel
            .send_message(Caller::Admin, message)
            .await
            .unwrap();
    }
    let last = served.kernel.last_event_seq();

    let lagged = next_event(&mut events).await;
    assert_eq!(
        (lagged.r#type.as_str(), lagged.seq, lagged.pid),
        ("lagged", 0, 0)
    );
    let detail: serde_json::Value = serde_json::from_str(&lagged.detail).unwrap();
    let missed = detail["missed"].as_u64().unwrap();
    assert!(missed > 0);
    let mut received = 0;
    let mut seq = 0;
    while seq < last {
        let event = next_event(&mut events).await;
        assert_eq!(event.r#type, "kernel_message");
        assert!(event.seq > seq, "{} after {seq}", event.seq);
        seq = event.seq;
        received += 1;
    }
    assert_eq!(missed + received, SENT);
    served.stop().await;
}

#[tokio::test]
async fn an_event_stream_producer_ends_when_its_client_goes_away() {
    let served = Served::start().await;
    let tracker = served.kernel.tracker().clone();
    let idle = tracker.len();
    let events = served
        .client()
        .subscribe_events(pb::SubscribeEventsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(tracker.len(), idle + 1);
    drop(events);
    hivekernel_tests::wait_until("the producer to end", STEP, || {
        let tracker = tracker.clone();
        async move { tracker.len() == idle }
    })
    .await;
    served.stop().await;
}

#[tokio::test]
async fn shutdown_ends_open_event_streams_and_the_server() {
    let served = Served::start().await;
    let mut client = served.client();
    let mut events = client
        .subscribe_events(pb::SubscribeEventsRequest {
            since_seq: 0,
            replay: false,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let addr = served.addr;
    served.stop().await;
    // The stream ends cleanly instead of hanging; the port is closed.
    let end = tokio::time::timeout(STEP, async {
        loop {
            match events.message().await {
                Ok(Some(_)) => continue,
                other => break other,
            }
        }
    })
    .await
    .unwrap();
    assert!(!matches!(end, Ok(Some(_))));
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn server_shutdown_ends_watches_and_streams_while_the_kernel_runs() {
    let (kernel, _journal) = hivekernel_tests::kernel().await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = Served::start_until(kernel.clone(), async move {
        let _ = stopped.await;
    })
    .await;
    let mut health = HealthClient::with_interceptor(served.channel.clone(), Headers::bearer(TOKEN));
    let mut watch = health
        .watch(HealthCheckRequest {
            service: "hivekernel.v1.Kernel".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.status, ServingStatus::Serving as i32);
    let mut events = served
        .client()
        .subscribe_events(pb::SubscribeEventsRequest::default())
        .await
        .unwrap()
        .into_inner();

    stop.send(()).unwrap();
    let last = tokio::time::timeout(STEP, watch.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(last.status, ServingStatus::NotServing as i32);
    assert!(
        tokio::time::timeout(STEP, watch.message())
            .await
            .unwrap()
            .unwrap()
            .is_none()
    );
    assert!(
        tokio::time::timeout(STEP, events.message())
            .await
            .unwrap()
            .unwrap()
            .is_none()
    );
    // Well inside the server's drain grace period: nothing held it open.
    tokio::time::timeout(Duration::from_secs(3), served.server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!kernel.is_stopping());
    kernel.shutdown().await;
}

#[tokio::test]
async fn spawn_takes_a_restart_spec_and_get_process_counts_restarts() {
    let served = Served::start().await;
    let mut client = served.client();
    let mut req = spawn_req(1, "svc");
    req.runtime = "probe".into();
    req.restart = Some(pb::RestartSpec {
        policy: pb::RestartPolicy::Permanent as i32,
        max_restarts: Some(2),
        within_seconds: Some(60),
        backoff_ms: vec![0, 0],
    });
    req.strategy = pb::Strategy::OneForAll as i32;
    let pid = spawn(&mut client, req).await;
    let mut events = served.kernel.subscribe(None).live;
    client
        .send_message(pb::SendMessageRequest {
            to: pid,
            payload: "crash".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    tokio::time::timeout(STEP, async {
        while events.recv().await.unwrap().kind.name() != "restarted" {}
    })
    .await
    .unwrap();
    let info = client
        .get_process(pb::GetProcessRequest { pid })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.restarts, 1);
    assert_eq!(info.state, pb::ProcessState::Idle as i32);

    // A bad spec is refused naming the field, and nothing is spawned.
    let mut bad = spawn_req(1, "bad");
    bad.restart = Some(pb::RestartSpec {
        policy: pb::RestartPolicy::Transient as i32,
        backoff_ms: vec![2000, 1000],
        ..Default::default()
    });
    assert_status(
        client.spawn(bad).await,
        Code::InvalidArgument,
        "restart.backoff_ms",
    );
    let mut unset = spawn_req(1, "unset");
    unset.restart = Some(pb::RestartSpec::default());
    assert_status(
        client.spawn(unset).await,
        Code::InvalidArgument,
        "restart.policy must be set",
    );
    served.stop().await;
}
