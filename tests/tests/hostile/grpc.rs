//! Malformed gRPC arguments against the real server: each is refused with
//! the status its class maps to and a message naming the field, and the
//! process tree, the cron table and the target's mailbox are unchanged.
//! Then a mailbox flood: RESOURCE_EXHAUSTED at capacity, never beyond, and
//! the flooded process carries on.

use std::time::Duration;

use hivekernel_agents::{Pid, ProcessState, Role, TaskSpec};
use hivekernel_kernel::{Caller, InputLimits};
use hivekernel_proto::v1 as pb;
use hivekernel_tests::served::{Client, Served};
use hivekernel_tests::{kernel_with, probe_request, spawn_probe, test_settings, wait_until};
use tokio_stream::StreamExt;
use tonic::{Code, Status};

/// Every process as (pid, ppid, name, state, children, mailbox length).
async fn tree(client: &mut Client) -> Vec<(u64, u64, String, i32, u32, u32)> {
    let mut stream = client
        .list_processes(pb::ListProcessesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut all = Vec::new();
    while let Some(batch) = stream.next().await {
        for p in batch.unwrap().processes {
            all.push((p.pid, p.ppid, p.name, p.state, p.children, p.mailbox_len));
        }
    }
    all
}

/// The documented default of `kernel.limits.payload_bytes`.
const MAX_PAYLOAD_BYTES: usize = 1 << 20;

#[track_caller]
fn refused<T: std::fmt::Debug>(what: &str, result: Result<T, Status>, code: Code, says: &str) {
    let status = match result {
        Ok(answer) => panic!("{what} was accepted: {answer:?}"),
        Err(status) => status,
    };
    assert_eq!(status.code(), code, "{what}: {status:?}");
    assert!(
        status.message().contains(says),
        "{what}: {says:?} not in {:?}",
        status.message()
    );
    assert!(status.message().len() < 4096, "{what}: a long message");
}

fn spawn(parent: u64, name: &str) -> pb::SpawnRequest {
    pb::SpawnRequest {
        parent,
        name: name.into(),
        runtime: "probe".into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn malformed_requests_are_refused_and_change_nothing() {
    assert_eq!(InputLimits::default().payload_bytes, MAX_PAYLOAD_BYTES);
    let (kernel, journal) = kernel_with(test_settings()).await;
    let target = spawn_probe(&kernel, Pid::KERNEL, "target", Role::Lead).await;
    let served = Served::start(&kernel).await;
    let mut client = served.admin();
    let before = tree(&mut client).await;
    let t = target.0;

    let max = u64::MAX.to_string();
    let with = |f: fn(&mut pb::SpawnRequest)| {
        let mut req = spawn(t, "child");
        f(&mut req);
        req
    };
    let spawns: Vec<(&str, pb::SpawnRequest, Code, &str)> = vec![
        (
            "empty name",
            spawn(t, ""),
            Code::InvalidArgument,
            "name must not be empty",
        ),
        ("blank name", spawn(t, "   "), Code::InvalidArgument, "name"),
        (
            "control character",
            spawn(t, "a\u{7}b"),
            Code::InvalidArgument,
            "control",
        ),
        (
            "long name",
            spawn(t, &"n".repeat(129)),
            Code::InvalidArgument,
            "at most 128",
        ),
        (
            "3 MiB name",
            spawn(t, &"n".repeat(3 << 20)),
            Code::InvalidArgument,
            "at most 128",
        ),
        (
            "parent 0",
            spawn(0, "child"),
            Code::InvalidArgument,
            "parent must be set",
        ),
        (
            "unknown parent",
            spawn(u64::MAX, "child"),
            Code::NotFound,
            &max,
        ),
        (
            "unknown role",
            with(|r| r.role = 99),
            Code::InvalidArgument,
            "role: unknown enum value 99",
        ),
        (
            "negative tier",
            with(|r| r.tier = -1),
            Code::InvalidArgument,
            "tier: unknown enum value -1",
        ),
        (
            "unknown strategy",
            with(|r| r.strategy = 77),
            Code::InvalidArgument,
            "strategy: unknown enum value 77",
        ),
        (
            "kernel role",
            with(|r| r.role = pb::Role::Kernel as i32),
            Code::InvalidArgument,
            "kernel",
        ),
        (
            "unknown runtime",
            with(|r| r.runtime = "docker".into()),
            Code::InvalidArgument,
            "unknown runtime",
        ),
        (
            "placement on a kernel alone",
            with(|r| r.node = "b".into()),
            Code::FailedPrecondition,
            "this kernel runs alone",
        ),
        (
            "33 node labels",
            with(|r| r.node_labels = (0..33).map(|i| (format!("l{i}"), "x".into())).collect()),
            Code::InvalidArgument,
            "node_labels: at most 32 labels, got 33",
        ),
        (
            "a node name of 3 MiB",
            with(|r| r.node = "n".repeat(3 << 20)),
            Code::InvalidArgument,
            "at most 128 bytes each",
        ),
        (
            "a label without a name",
            with(|r| r.node_labels = [(String::new(), "x".into())].into()),
            Code::InvalidArgument,
            "a label has an empty name",
        ),
        (
            "restart without a policy",
            with(|r| r.restart = Some(pb::RestartSpec::default())),
            Code::InvalidArgument,
            "restart.policy must be set",
        ),
        (
            "a prompt over the limit",
            with(|r| r.system_prompt = "p".repeat(256 * 1024 + 1)),
            Code::InvalidArgument,
            "system_prompt is 262145 bytes, at most 262144 (kernel.limits.prompt_bytes)",
        ),
        (
            "a 3.9 MB model",
            with(|r| r.model = "m".repeat(3_900_000)),
            Code::InvalidArgument,
            "model is 3900000 bytes, at most 256 (kernel.limits.model_bytes)",
        ),
        (
            "a long runtime name",
            with(|r| r.runtime = "r".repeat(257)),
            Code::InvalidArgument,
            "runtime is 257 bytes, at most 256",
        ),
        (
            "200,000 metadata entries",
            with(|r| {
                r.metadata = (0..200_000)
                    .map(|i| (format!("k{i}"), "v".into()))
                    .collect()
            }),
            Code::InvalidArgument,
            "metadata has 200000 entries, at most 64 (kernel.limits.metadata_entries)",
        ),
        (
            "a long metadata value",
            with(|r| r.metadata = [("purpose".into(), "v".repeat(1025))].into()),
            Code::InvalidArgument,
            "metadata value of \"purpose\" is 1025 bytes, at most 1024",
        ),
        (
            "a long metadata key",
            with(|r| r.metadata = [("k".repeat(1025), "v".into())].into()),
            Code::InvalidArgument,
            "metadata key of",
        ),
        (
            "100,000 duplicate tools",
            with(|r| r.tools = vec!["read_file".into(); 100_000]),
            Code::InvalidArgument,
            "tools has 100000 entries, at most 128 (kernel.limits.tools)",
        ),
        (
            "a tool twice",
            with(|r| r.tools = vec!["read_file".into(), "read_file".into()]),
            Code::InvalidArgument,
            "tools lists \"read_file\" twice",
        ),
        (
            "a huge command",
            with(|r| {
                r.runtime = String::new();
                r.command = vec!["sh".into(), "a".repeat(70_000)];
            }),
            Code::InvalidArgument,
            "command with its env is 70004 bytes, at most 65536",
        ),
        (
            "a huge environment",
            with(|r| {
                r.runtime = String::new();
                r.command = vec!["sh".into()];
                r.env = (0..10_000)
                    .map(|i| (format!("V{i}"), "x".repeat(8)))
                    .collect();
            }),
            Code::InvalidArgument,
            "(kernel.limits.command_bytes)",
        ),
        (
            "limits above the parent's",
            with(|r| {
                r.limits = Some(pb::Limits {
                    max_children: u32::MAX,
                    ..Default::default()
                })
            }),
            Code::PermissionDenied,
            "max_children",
        ),
    ];
    for (what, req, code, says) in spawns {
        refused(what, client.spawn(req).await, code, says);
    }

    let pid0 = "pid must be set";
    refused(
        "get pid 0",
        client.get_process(pb::GetProcessRequest { pid: 0 }).await,
        Code::InvalidArgument,
        pid0,
    );
    refused(
        "kill pid 0",
        client
            .kill(pb::KillRequest {
                pid: 0,
                reason: "x".into(),
            })
            .await,
        Code::InvalidArgument,
        pid0,
    );
    refused(
        "wait pid 0",
        client
            .wait_child(pb::WaitChildRequest {
                pid: 0,
                timeout_ms: 10,
            })
            .await,
        Code::InvalidArgument,
        pid0,
    );
    refused(
        "execute on pid 0",
        client
            .execute_task(pb::ExecuteTaskRequest {
                pid: 0,
                description: "x".into(),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        pid0,
    );
    refused(
        "a 4 MB kill reason",
        client
            .kill(pb::KillRequest {
                pid: t,
                reason: "r".repeat(4_000_000),
            })
            .await,
        Code::InvalidArgument,
        "reason is 4000000 bytes, at most 1024 (kernel.limits.reason_bytes)",
    );
    refused(
        "kill an unknown pid",
        client
            .kill(pb::KillRequest {
                pid: u64::MAX,
                reason: String::new(),
            })
            .await,
        Code::NotFound,
        &max,
    );

    let message = |f: fn(&mut pb::SendMessageRequest)| {
        let mut req = pb::SendMessageRequest {
            to: t,
            payload: "hello".into(),
            ..Default::default()
        };
        f(&mut req);
        req
    };
    let sends: Vec<(&str, pb::SendMessageRequest, Code, &str)> = vec![
        (
            "to 0",
            message(|m| m.to = 0),
            Code::InvalidArgument,
            "to must be set",
        ),
        (
            "payload over the limit",
            message(|m| m.payload = "p".repeat(MAX_PAYLOAD_BYTES + 1)),
            Code::InvalidArgument,
            "at most 1048576",
        ),
        (
            "a 4 MB type",
            message(|m| m.r#type = "t".repeat(4_000_000)),
            Code::InvalidArgument,
            "type is 4000000 bytes, at most 128 (kernel.limits.type_bytes)",
        ),
        (
            "a 4 MB type to PID 1",
            message(|m| {
                m.to = 1;
                m.r#type = "t".repeat(4_000_000);
            }),
            Code::InvalidArgument,
            "type is 4000000 bytes",
        ),
        (
            "unknown priority",
            message(|m| m.priority = 17),
            Code::InvalidArgument,
            "priority",
        ),
        (
            "negative priority",
            message(|m| m.priority = -3),
            Code::InvalidArgument,
            "priority",
        ),
        (
            "endless ttl",
            message(|m| m.ttl_ms = u64::MAX),
            Code::InvalidArgument,
            "ttl",
        ),
        (
            "someone else's from",
            message(|m| m.from = 7),
            Code::PermissionDenied,
            "from",
        ),
    ];
    for (what, req, code, says) in sends {
        refused(what, client.send_message(req).await, code, says);
    }
    refused(
        "a task description over the limit",
        client
            .execute_task(pb::ExecuteTaskRequest {
                pid: t,
                description: "d".repeat(MAX_PAYLOAD_BYTES + 1),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "at most 1048576",
    );
    refused(
        "65 task parameters",
        client
            .execute_task(pb::ExecuteTaskRequest {
                pid: t,
                description: "x".into(),
                params: (0..65).map(|i| (format!("p{i}"), "v".into())).collect(),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "params has 65 entries, at most 64 (kernel.limits.metadata_entries)",
    );
    refused(
        "task parameters over the payload limit",
        client
            .execute_task(pb::ExecuteTaskRequest {
                pid: t,
                description: "x".into(),
                params: [("doc".into(), "d".repeat(MAX_PAYLOAD_BYTES))].into(),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "description with params is 1048577 bytes, at most 1048576",
    );
    refused(
        "an endless task timeout",
        client
            .execute_task(pb::ExecuteTaskRequest {
                pid: t,
                description: "x".into(),
                timeout_ms: u64::MAX,
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "timeout",
    );

    let cron = |f: fn(&mut pb::CronSpec)| {
        let mut spec = pb::CronSpec {
            name: "nightly".into(),
            expression: "@daily".into(),
            target: t,
            description: "x".into(),
            ..Default::default()
        };
        f(&mut spec);
        spec
    };
    let crons: Vec<(&str, pb::CronSpec, &str)> = vec![
        ("empty name", cron(|c| c.name = String::new()), "name"),
        (
            "bad minute",
            cron(|c| c.expression = "61 * * * *".into()),
            "cannot parse",
        ),
        (
            "three fields",
            cron(|c| c.expression = "* * *".into()),
            "got 3",
        ),
        (
            "empty expression",
            cron(|c| c.expression = " ".into()),
            "empty",
        ),
        (
            "huge expression",
            cron(|c| c.expression = "* ".repeat(10_000)),
            "bytes",
        ),
        (
            "bad weekday",
            cron(|c| c.expression = "0 0 * * 9".into()),
            "day-of-week 9",
        ),
        (
            "unknown action",
            cron(|c| c.action = "explode".into()),
            "explode",
        ),
        (
            "huge name",
            cron(|c| c.name = "n".repeat(2 << 20)),
            "[cut: 2097152 bytes in all]",
        ),
        (
            "huge action",
            cron(|c| c.action = "a".repeat(2 << 20)),
            "[cut: 2097152 bytes in all]",
        ),
        (
            "unknown overlap",
            cron(|c| c.overlap = "maybe".into()),
            "maybe",
        ),
        (
            "unknown missed",
            cron(|c| c.missed = "later".into()),
            "later",
        ),
        ("unknown target", cron(|c| c.target = u64::MAX), &max),
        (
            "description over the limit",
            cron(|c| c.description = "d".repeat(MAX_PAYLOAD_BYTES + 1)),
            "1048576",
        ),
    ];
    for (what, spec, says) in crons {
        let status = client.add_cron(spec).await.unwrap_err();
        assert!(
            matches!(status.code(), Code::InvalidArgument | Code::NotFound),
            "{what}: {status:?}"
        );
        assert!(
            status.message().contains(says),
            "{what}: {says:?} not in {status:?}"
        );
        assert!(status.message().len() < 4096, "{what}: a long message");
    }

    // Reading transcripts and finding processes: bad arguments are named.
    refused(
        "a transcript of PID 0",
        client
            .get_transcript(pb::GetTranscriptRequest::default())
            .await,
        Code::InvalidArgument,
        "pid must be set",
    );
    refused(
        "a transcript of a PID that never was",
        client
            .get_transcript(pb::GetTranscriptRequest {
                pid: 987_654,
                ..Default::default()
            })
            .await,
        Code::NotFound,
        "987654",
    );
    refused(
        "a page token this kernel never gave",
        client
            .get_transcript(pb::GetTranscriptRequest {
                pid: t,
                page_token: "\u{0}\u{1}junk".repeat(1000),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "page_token",
    );
    let huge_page = client
        .get_transcript(pb::GetTranscriptRequest {
            pid: t,
            page_size: u32::MAX,
            ..Default::default()
        })
        .await;
    assert!(
        huge_page.is_ok(),
        "a huge page size is capped, not refused: {huge_page:?}"
    );
    refused(
        "a watch of a PID that never was",
        client
            .watch_transcript(pb::WatchTranscriptRequest {
                pid: 987_654,
                ..Default::default()
            })
            .await,
        Code::NotFound,
        "987654",
    );
    refused(
        "an empty process name",
        client.find_process(pb::FindProcessRequest::default()).await,
        Code::InvalidArgument,
        "got nothing",
    );
    refused(
        "a process name of a megabyte",
        client
            .find_process(pb::FindProcessRequest {
                target: "n".repeat(1 << 20),
            })
            .await,
        Code::InvalidArgument,
        "at most 4096",
    );
    refused(
        "a path through nobody",
        client
            .find_process(pb::FindProcessRequest {
                target: "nobody/else".into(),
            })
            .await,
        Code::NotFound,
        "no child named \"nobody\" under PID 1",
    );

    // Skills: every malformed change is refused before anything is looked up.
    let manage = |action: &str, name: &str| pb::ManageSkillRequest {
        action: action.into(),
        name: name.into(),
        ..pb::ManageSkillRequest::default()
    };
    let changes: Vec<(&str, pb::ManageSkillRequest, Code, &str)> = vec![
        (
            "unknown skill action",
            manage("rename", "x"),
            Code::InvalidArgument,
            "unknown skill action \"rename\"",
        ),
        (
            "unknown visibility",
            pb::ManageSkillRequest {
                content: "c".into(),
                visibility: "user".into(),
                ..manage("create", "x")
            },
            Code::InvalidArgument,
            "unknown skill visibility",
        ),
        (
            "create without content",
            manage("create", "x"),
            Code::InvalidArgument,
            "needs `content`",
        ),
        (
            "a name with a slash",
            manage("delete", "a/b"),
            Code::InvalidArgument,
            "no spaces, control characters or `/`",
        ),
        (
            "a megabyte name",
            manage("delete", &"n".repeat(1 << 20)),
            Code::InvalidArgument,
            "at most 64",
        ),
        (
            "an operator creating a skill",
            pb::ManageSkillRequest {
                content: "c".into(),
                ..manage("create", "x")
            },
            Code::FailedPrecondition,
            "no store",
        ),
    ];
    for (what, request, code, says) in changes {
        refused(what, client.manage_skill(request).await, code, says);
    }
    refused(
        "the history of an empty name",
        client
            .skill_history(pb::SkillHistoryRequest::default())
            .await,
        Code::InvalidArgument,
        "the skill name is empty",
    );

    // A request over the server's size limit is refused by the transport; the server carries on.
    let too_big = pb::SpawnRequest {
        system_prompt: "p".repeat(5 << 20),
        ..spawn(t, "big")
    };
    let status = client.spawn(too_big).await.unwrap_err();
    assert!(
        matches!(status.code(), Code::OutOfRange | Code::ResourceExhausted),
        "{status:?}"
    );

    assert_eq!(tree(&mut client).await, before);
    let crons = client.list_cron(pb::ListCronRequest {}).await.unwrap();
    assert!(crons.into_inner().entries.is_empty());
    assert!(journal.of(target).is_empty(), "{:?}", journal.of(target));
    // And the kernel still works.
    let child = client
        .spawn(spawn(t, "fine"))
        .await
        .unwrap()
        .into_inner()
        .pid;
    assert!(child > t);
    kernel.shutdown().await;
    served.stopped().await;
}

/// A kernel served on loopback with one process, `slow`, that works on one
/// task at a time and is busy with one for 1.5 s, so nothing is taken from
/// its mailbox meanwhile.
struct Busy {
    kernel: hivekernel_kernel::Kernel,
    journal: hivekernel_tests::Journal,
    slow: Pid,
    busy: tokio::task::JoinHandle<
        hivekernel_kernel::error::Result<(
            hivekernel_agents::RequestId,
            hivekernel_agents::TaskReply,
        )>,
    >,
    served: Served,
}

async fn busy_process(settings: hivekernel_kernel::config::KernelSettings) -> Busy {
    let (kernel, journal) = kernel_with(settings).await;
    let mut request = probe_request(Pid::KERNEL, "slow", Role::Agent);
    request.limits.max_concurrent_tasks = Some(1);
    let slow = kernel.spawn(Caller::Admin, request).await.unwrap();
    let served = Served::start(&kernel).await;
    let busy = {
        let kernel = kernel.clone();
        tokio::spawn(async move {
            kernel
                .execute_task(Caller::Admin, TaskSpec::new(slow, "sleep 1500"))
                .await
        })
    };
    wait_until(
        "the process to be busy",
        Duration::from_secs(10),
        || async {
            kernel.get_process(Caller::Admin, slow).await.unwrap().state == ProcessState::Running
        },
    )
    .await;
    Busy {
        kernel,
        journal,
        slow,
        busy,
        served,
    }
}

#[tokio::test]
async fn a_mailbox_flood_is_refused_at_capacity_and_the_process_carries_on() {
    const CAPACITY: usize = 16;
    let mut settings = test_settings();
    settings.mailbox_capacity = CAPACITY;
    let Busy {
        kernel,
        journal,
        slow,
        busy,
        served,
    } = busy_process(settings).await;
    let mut client = served.admin();

    let mut accepted = 0;
    let refusal = loop {
        let sent = client
            .send_message(pb::SendMessageRequest {
                to: slow.0,
                payload: format!("flood {accepted}"),
                ..Default::default()
            })
            .await;
        let info = client
            .get_process(pb::GetProcessRequest { pid: slow.0 })
            .await
            .unwrap()
            .into_inner();
        assert!(
            info.mailbox_len as usize <= CAPACITY,
            "{} queued",
            info.mailbox_len
        );
        match sent {
            Ok(_) => accepted += 1,
            Err(status) => break status,
        }
        assert!(accepted <= CAPACITY, "more than the capacity accepted");
    };
    assert_eq!(accepted, CAPACITY);
    assert_eq!(refusal.code(), Code::ResourceExhausted, "{refusal:?}");
    assert!(
        refusal.message().contains(&slow.to_string())
            && refusal.message().contains(&format!("{CAPACITY}")),
        "{refusal:?}"
    );
    // Refused again, still at capacity.
    for _ in 0..50 {
        let status = client
            .send_message(pb::SendMessageRequest {
                to: slow.0,
                payload: "more".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::ResourceExhausted);
    }

    // It finishes its task, works through exactly what was accepted, and answers again.
    assert_eq!(busy.await.unwrap().unwrap().1, Ok("slept 1500".to_owned()));
    wait_until("the accepted messages", Duration::from_secs(10), || async {
        journal.of(slow).len() == CAPACITY
    })
    .await;
    let payloads: Vec<String> = journal.of(slow).into_iter().map(|m| m.payload).collect();
    let expected: Vec<String> = (0..CAPACITY).map(|i| format!("flood {i}")).collect();
    assert_eq!(payloads, expected);
    let answer = client
        .execute_task(pb::ExecuteTaskRequest {
            pid: slow.0,
            description: "still here".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        answer.success && answer.output == "still here",
        "{answer:?}"
    );
    let info = client
        .get_process(pb::GetProcessRequest { pid: slow.0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.mailbox_len, 0);
    assert_eq!(info.exit, None);
    client
        .send_message(pb::SendMessageRequest {
            to: slow.0,
            payload: "after".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    kernel.shutdown().await;
    served.stopped().await;
}

/// 1,024 messages of 1 MiB once added 1.1 GB to one mailbox: bytes bound it too.
#[tokio::test]
async fn a_mailbox_is_bounded_by_bytes_as_well_as_by_count() {
    const MAX_BYTES: u64 = 4 << 20;
    let mut settings = test_settings();
    settings.mailbox_max_bytes = MAX_BYTES;
    let Busy {
        kernel,
        journal,
        slow,
        busy,
        served,
    } = busy_process(settings).await;
    let mut client = served.admin();

    // Each weighs its type ("message", 7 bytes) and its 1 MiB payload.
    let mib = |i: usize| pb::SendMessageRequest {
        to: slow.0,
        payload: format!("{i} {}", "m".repeat((1 << 20) - 2)),
        ..Default::default()
    };
    let mut accepted = 0;
    let refusal = loop {
        match client.send_message(mib(accepted)).await {
            Ok(_) => accepted += 1,
            Err(status) => break status,
        }
        assert!(accepted <= 4, "more than 4 MiB accepted");
    };
    assert_eq!(
        accepted, 3,
        "three fit in 4 MiB with their types, a fourth does not"
    );
    assert_eq!(refusal.code(), Code::ResourceExhausted, "{refusal:?}");
    assert!(
        refusal.message().contains(&format!(
            "mailbox of process {slow} is full ({MAX_BYTES} bytes, kernel.mailbox_max_bytes)"
        )),
        "{refusal:?}"
    );
    // A small message still fits beside them.
    client
        .send_message(pb::SendMessageRequest {
            to: slow.0,
            payload: "small".into(),
            ..Default::default()
        })
        .await
        .unwrap();

    // Once it has worked through them, it takes megabytes again.
    assert!(busy.await.unwrap().is_ok());
    wait_until("the accepted messages", Duration::from_secs(10), || async {
        journal.of(slow).len() == 4
    })
    .await;
    for i in 0..3 {
        client.send_message(mib(i)).await.unwrap();
    }
    kernel.shutdown().await;
    served.stopped().await;
}

#[tokio::test]
async fn credentials_are_accepted_only_in_their_one_spelling() {
    let (kernel, _) = kernel_with(test_settings()).await;
    let served = Served::start(&kernel).await;
    let token = hivekernel_tests::served::TOKEN;
    let ask = |mut client: Client| async move {
        client
            .get_process(pb::GetProcessRequest { pid: 1 })
            .await
            .map(|answer| answer.into_inner().pid)
    };
    assert_eq!(ask(served.with_token(token)).await.unwrap(), 1);
    // The admin token with a space before or after it is another string.
    for spelled in [
        format!(" {token}"),
        format!("{token} "),
        format!("{token}\t"),
    ] {
        refused(
            &format!("{spelled:?}"),
            ask(served.with_token(&spelled)).await,
            Code::Unauthenticated,
            "invalid token",
        );
    }
    // A process token names its PID one way: p8, never p08 or p+8.
    let issued = served.auth.issue(Pid(8)).unwrap();
    let secret = issued.strip_prefix("p8.").unwrap();
    let whose = |mut client: Client| async move {
        client
            .get_process(pb::GetProcessRequest { pid: 8 })
            .await
            .map(|_| ())
    };
    refused(
        "the issued token, for a process that is not there",
        whose(served.with_token(&issued)).await,
        Code::NotFound,
        "process 8",
    );
    for forged in [
        format!("p08.{secret}"),
        format!("p+8.{secret}"),
        format!("p008.{secret}"),
    ] {
        refused(
            &forged[..5],
            whose(served.with_token(&forged)).await,
            Code::Unauthenticated,
            "invalid token",
        );
    }
    kernel.shutdown().await;
    served.stopped().await;
}

#[tokio::test]
async fn forged_expired_and_too_small_operator_tokens_are_refused_and_change_nothing() {
    let (kernel, _) = kernel_with(test_settings()).await;
    let served = Served::start(&kernel).await;
    let mut admin = served.admin();
    let victim = spawn_probe(&kernel, Pid::KERNEL, "victim", Role::Agent).await;
    let create = |name: &'static str, scope: pb::TokenScope, expires_in_seconds| {
        let mut admin = admin.clone();
        async move {
            admin
                .create_token(pb::CreateTokenRequest {
                    name: name.into(),
                    scope: scope.into(),
                    expires_in_seconds,
                })
                .await
                .unwrap()
                .into_inner()
                .secret
        }
    };
    let read = create("reader", pb::TokenScope::Read, 0).await;
    let brief = create("brief", pb::TokenScope::Admin, 1).await;
    let before = tree(&mut admin).await;
    let kill = |mut client: Client| async move {
        client
            .kill(pb::KillRequest {
                pid: victim.0,
                reason: "hostile".into(),
            })
            .await
            .map(|_| ())
    };
    let secret = read.strip_prefix("o1.").unwrap();
    // Forged: another id, a non-canonical id, a changed or cut secret, the
    // hash the store keeps, an operator prefix on the admin token.
    let mut flipped = secret.to_owned();
    flipped.replace_range(..1, if secret.starts_with('0') { "1" } else { "0" });
    for forged in [
        format!("o2.{secret}"),
        format!("o01.{secret}"),
        format!("o+1.{secret}"),
        format!("o0.{secret}"),
        format!("o1.{flipped}"),
        format!("o1.{}", &secret[..secret.len() - 1]),
        "o1.".to_owned(),
        format!("o1.{secret}.{secret}"),
        format!("o{}.{secret}", u64::MAX),
        format!("o99999999999999999999999.{secret}"),
        format!("o1.{}", hivekernel_tests::served::TOKEN),
    ] {
        refused(
            &forged,
            kill(served.with_token(&forged)).await,
            Code::Unauthenticated,
            "invalid token",
        );
    }
    // Too small a scope: refused before anything runs.
    refused(
        "a read token's kill",
        kill(served.with_token(&read)).await,
        Code::PermissionDenied,
        "Kill needs the operate scope",
    );
    refused(
        "a read token's token",
        served
            .with_token(&read)
            .create_token(pb::CreateTokenRequest {
                name: "escalate".into(),
                scope: pb::TokenScope::Admin.into(),
                expires_in_seconds: 0,
            })
            .await,
        Code::PermissionDenied,
        "CreateToken needs the admin scope",
    );
    // Expired: an admin token no longer.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    refused(
        "an expired admin-scope token",
        kill(served.with_token(&brief)).await,
        Code::Unauthenticated,
        "has expired",
    );
    assert_eq!(tree(&mut admin).await, before, "nothing changed");
    let tokens = admin
        .list_tokens(pb::ListTokensRequest { all: true })
        .await
        .unwrap()
        .into_inner()
        .tokens;
    assert_eq!(tokens.len(), 2, "no token was made: {tokens:?}");
    kernel.shutdown().await;
    served.stopped().await;
}

/// A `SpawnRequest` as a careless or hostile client may encode it: `name`
/// (field 2) as raw bytes, which need not be UTF-8.
#[derive(Clone, PartialEq, prost::Message)]
struct RawSpawn {
    #[prost(uint64, tag = "1")]
    parent: u64,
    #[prost(bytes = "vec", tag = "2")]
    name: Vec<u8>,
}

#[tokio::test]
async fn a_request_that_does_not_decode_is_invalid_argument_and_changes_nothing() {
    let (kernel, _) = kernel_with(test_settings()).await;
    let served = Served::start(&kernel).await;
    let mut admin = served.admin();
    let before = tree(&mut admin).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", served.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let bearer = hivekernel_tests::served::Bearer::new(hivekernel_tests::served::TOKEN);
    let mut grpc = tonic::client::Grpc::new(tonic::service::interceptor::InterceptedService::new(
        channel, bearer,
    ));
    grpc.ready().await.unwrap();
    let spawn = RawSpawn {
        parent: 1,
        name: vec![b'w', 0xff, 0xfe],
    };
    let answer: Result<tonic::Response<pb::SpawnResponse>, Status> = grpc
        .unary(
            tonic::Request::new(spawn),
            tonic::codegen::http::uri::PathAndQuery::from_static("/hivekernel.v1.Kernel/Spawn"),
            tonic_prost::ProstCodec::default(),
        )
        .await;
    refused(
        "a name that is not UTF-8",
        answer,
        Code::InvalidArgument,
        "name",
    );
    assert_eq!(tree(&mut admin).await, before, "the tree changed");
    kernel.shutdown().await;
    served.stopped().await;
}
