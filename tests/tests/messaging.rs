//! Routing rules, mailboxes, execute_task and delegate_async, on an in-process kernel.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use hivekernel_agents::message::kinds;
use hivekernel_agents::{Outgoing, Pid, Priority, Role, TaskSpec};
use hivekernel_kernel::events::EventKind;
use hivekernel_kernel::{Caller, KernelError};
use hivekernel_tests::{kernel, kernel_with, spawn_probe, test_settings, wait_until};

const ROOT: Pid = Pid::KERNEL;

/// root -> a -> (a1, a2 -> a2x), root -> b -> b1
struct Tree {
    a: Pid,
    a1: Pid,
    a2: Pid,
    a2x: Pid,
    b: Pid,
    b1: Pid,
}

async fn tree(kernel: &hivekernel_kernel::Kernel) -> Tree {
    let a = spawn_probe(kernel, ROOT, "a", Role::Lead).await;
    let a1 = spawn_probe(kernel, a, "a1", Role::Worker).await;
    let a2 = spawn_probe(kernel, a, "a2", Role::Lead).await;
    let a2x = spawn_probe(kernel, a2, "a2x", Role::Task).await;
    let b = spawn_probe(kernel, ROOT, "b", Role::Lead).await;
    let b1 = spawn_probe(kernel, b, "b1", Role::Worker).await;
    Tree {
        a,
        a1,
        a2,
        a2x,
        b,
        b1,
    }
}

async fn send(
    kernel: &hivekernel_kernel::Kernel,
    from: Pid,
    to: Pid,
    text: &str,
) -> Result<(), KernelError> {
    kernel
        .send_message(Caller::Process(from), Outgoing::new(to, text))
        .await
        .map(|_| ())
}

#[tokio::test]
async fn parent_and_child_talk_both_ways() {
    let (kernel, journal) = kernel().await;
    let t = tree(&kernel).await;
    send(&kernel, t.a, t.a1, "down").await.unwrap();
    send(&kernel, t.a1, t.a, "up").await.unwrap();
    wait_until("both messages", Duration::from_secs(5), || async {
        journal
            .of(t.a1)
            .iter()
            .any(|m| m.payload == "down" && m.from == t.a)
            && journal
                .of(t.a)
                .iter()
                .any(|m| m.payload == "up" && m.from == t.a1)
    })
    .await;
}

#[tokio::test]
async fn siblings_talk_with_a_low_priority_copy_to_the_parent() {
    let (kernel, journal) = kernel().await;
    let t = tree(&kernel).await;
    send(&kernel, t.a1, t.a2, "hello sibling").await.unwrap();
    wait_until("delivery and copy", Duration::from_secs(5), || async {
        let delivered = journal
            .of(t.a2)
            .iter()
            .any(|m| m.payload == "hello sibling" && m.kind == kinds::MESSAGE);
        let copied = journal.of(t.a).iter().any(|m| {
            m.payload == "hello sibling"
                && m.kind == kinds::SIBLING_COPY
                && m.priority == Priority::Low
                && m.from == t.a1
        });
        delivered && copied
    })
    .await;
}

#[tokio::test]
async fn cross_branch_messages_go_through_the_nearest_common_ancestor() {
    let (kernel, journal) = kernel().await;
    let t = tree(&kernel).await;
    send(&kernel, t.a1, t.b1, "across").await.unwrap();
    wait_until("cross-branch delivery", Duration::from_secs(5), || async {
        journal
            .of(t.b1)
            .iter()
            .any(|m| m.payload == "across" && m.via == Some(ROOT))
    })
    .await;
    // The nearest common ancestor of a1 and its nephew a2x is a.
    send(&kernel, t.a1, t.a2x, "nephew").await.unwrap();
    wait_until("delivery to the nephew", Duration::from_secs(5), || async {
        journal
            .of(t.a2x)
            .iter()
            .any(|m| m.payload == "nephew" && m.via == Some(t.a))
    })
    .await;
}

#[tokio::test]
async fn a_task_may_only_address_its_parent() {
    let (kernel, journal) = kernel().await;
    let t = tree(&kernel).await;
    let mut events = kernel.subscribe(None).live;
    send(&kernel, t.a2x, t.a2, "to parent").await.unwrap();
    for target in [t.a, t.a1, t.b, ROOT] {
        let err = send(&kernel, t.a2x, target, "out of bounds")
            .await
            .unwrap_err();
        assert!(
            matches!(&err, KernelError::PermissionDenied(m) if m.contains("task")),
            "{target}: {err}"
        );
    }
    let denied = events.recv().await.unwrap();
    assert!(
        matches!(denied.kind, EventKind::RouteDenied { to, .. } if to == t.a),
        "{denied:?}"
    );
    wait_until("the allowed message", Duration::from_secs(5), || async {
        journal.of(t.a2).iter().any(|m| m.payload == "to parent")
    })
    .await;
}

#[tokio::test]
async fn messages_to_unknown_or_exited_processes_are_refused() {
    let (kernel, _) = kernel().await;
    let t = tree(&kernel).await;
    assert_eq!(
        send(&kernel, t.a, Pid(777), "x").await.unwrap_err(),
        KernelError::NotFound(Pid(777))
    );
    kernel.kill(Caller::Admin, t.b1, "").await.unwrap();
    assert!(matches!(
        send(&kernel, t.b, t.b1, "x").await,
        Err(KernelError::FailedPrecondition(_))
    ));
    let big = "x".repeat(hivekernel_kernel::InputLimits::default().payload_bytes + 1);
    assert!(matches!(
        send(&kernel, t.a, t.a1, &big).await,
        Err(KernelError::InvalidArgument(_))
    ));
}

#[tokio::test]
async fn execute_task_replies_and_times_out() {
    let (kernel, _) = kernel().await;
    let t = tree(&kernel).await;
    let (_, reply) = kernel
        .execute_task(Caller::Admin, TaskSpec::new(t.a1, "ping"))
        .await
        .unwrap();
    assert_eq!(reply.unwrap(), "ping");
    // A process asks its child through its own syscalls.
    let (_, reply) = kernel
        .execute_task(
            Caller::Admin,
            TaskSpec::new(t.a, format!("exec {} nested", t.a1)),
        )
        .await
        .unwrap();
    assert_eq!(reply.unwrap(), "nested");

    let mut slow = TaskSpec::new(t.a1, "sleep 5000");
    slow.timeout = Some(Duration::from_millis(100));
    let err = kernel.execute_task(Caller::Admin, slow).await.unwrap_err();
    assert!(matches!(err, KernelError::DeadlineExceeded(_)), "{err}");
    // The abandoned task is cancelled at the target: it becomes idle again.
    wait_until(
        "the target to drop abandoned work",
        Duration::from_secs(5),
        || async {
            kernel.get_process(Caller::Admin, t.a1).await.unwrap().state
                == hivekernel_agents::ProcessState::Idle
        },
    )
    .await;
}

#[tokio::test]
async fn delegate_async_reply_lands_in_the_senders_mailbox() {
    let (kernel, journal) = kernel().await;
    let t = tree(&kernel).await;
    let (_, reply) = kernel
        .execute_task(
            Caller::Admin,
            TaskSpec::new(t.a, format!("delegate {} sleep 20", t.a1)),
        )
        .await
        .unwrap();
    let request_id: u64 = reply.unwrap().parse().unwrap();
    wait_until("the task_response", Duration::from_secs(5), || async {
        journal.of(t.a).iter().any(|m| {
            m.kind == kinds::TASK_RESPONSE
                && m.request_id.map(|r| r.0) == Some(request_id)
                && m.from == t.a1
                && m.payload.contains("slept 20")
        })
    })
    .await;
}

/// A probe that works on one task at a time, busy with `sleep ms` so its mailbox fills up.
async fn busy_serial(
    kernel: &hivekernel_kernel::Kernel,
    ms: u64,
) -> (
    Pid,
    tokio::task::JoinHandle<
        Result<(hivekernel_agents::RequestId, hivekernel_agents::TaskReply), KernelError>,
    >,
) {
    let mut request = hivekernel_tests::probe_request(ROOT, "serial", Role::Agent);
    request.limits.max_concurrent_tasks = Some(1);
    let serial = kernel.spawn(Caller::Admin, request).await.unwrap();
    let blocker = {
        let kernel = kernel.clone();
        tokio::spawn(async move {
            kernel
                .execute_task(Caller::Admin, TaskSpec::new(serial, format!("sleep {ms}")))
                .await
        })
    };
    wait_until("serial to be running", Duration::from_secs(5), || async {
        kernel
            .get_process(Caller::Admin, serial)
            .await
            .unwrap()
            .state
            == hivekernel_agents::ProcessState::Running
    })
    .await;
    (serial, blocker)
}

#[tokio::test]
async fn a_full_mailbox_answers_resource_exhausted() {
    let mut settings = test_settings();
    settings.mailbox_capacity = 3;
    let (kernel, _) = kernel_with(settings).await;
    // Keep the process busy so nothing is popped while we fill the mailbox.
    let (serial, blocker) = busy_serial(&kernel, 2000).await;
    for i in 0..3 {
        kernel
            .send_message(Caller::Admin, Outgoing::new(serial, format!("m{i}")))
            .await
            .unwrap();
    }
    let err = kernel
        .send_message(Caller::Admin, Outgoing::new(serial, "overflow"))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        KernelError::MailboxFull {
            pid: serial,
            limit: "3 messages".into()
        }
    );
    assert_eq!(err.kind(), hivekernel_agents::ErrorKind::ResourceExhausted);
    assert_eq!(
        kernel
            .get_process(Caller::Admin, serial)
            .await
            .unwrap()
            .mailbox_len,
        3
    );
    blocker.abort();
}

#[tokio::test]
async fn expired_messages_are_dropped_with_an_event() {
    let (kernel, journal) = kernel().await;
    let mut events = kernel.subscribe(None).live;
    let (serial, blocker) = busy_serial(&kernel, 300).await;
    let mut short = Outgoing::new(serial, "short-lived");
    short.ttl = Some(Duration::from_millis(50));
    let id = kernel.send_message(Caller::Admin, short).await.unwrap();
    kernel
        .send_message(Caller::Admin, Outgoing::new(serial, "durable"))
        .await
        .unwrap();
    blocker.await.unwrap().unwrap().1.unwrap();
    wait_until("the durable message", Duration::from_secs(5), || async {
        journal.of(serial).iter().any(|m| m.payload == "durable")
    })
    .await;
    assert!(
        !journal
            .of(serial)
            .iter()
            .any(|m| m.payload == "short-lived")
    );
    loop {
        let event = events.recv().await.unwrap();
        if let EventKind::MessageExpired { message_id, .. } = event.kind {
            assert_eq!((message_id, event.pid), (id, serial));
            break;
        }
    }
}

#[tokio::test]
async fn messages_to_pid_1_become_events() {
    let (kernel, _) = kernel().await;
    let a = spawn_probe(&kernel, ROOT, "a", Role::Lead).await;
    let mut events = kernel.subscribe(None).live;
    send(&kernel, a, ROOT, "hello kernel").await.unwrap();
    let event = events.recv().await.unwrap();
    assert!(
        matches!(&event.kind, EventKind::KernelMessage { from, payload, .. } if *from == a && payload == "hello kernel")
    );
    let err = kernel
        .execute_task(Caller::Process(a), TaskSpec::new(ROOT, "x"))
        .await
        .unwrap_err();
    assert!(matches!(err, KernelError::InvalidArgument(_)));
}

#[tokio::test]
async fn events_replay_from_a_sequence_number_without_gaps() {
    let (kernel, _) = kernel().await;
    let first = kernel.last_event_seq();
    for i in 0..5 {
        spawn_probe(&kernel, ROOT, &format!("p{i}"), Role::Agent).await;
    }
    let sub = kernel.subscribe(Some(first + 2));
    let seqs: Vec<u64> = sub.replay.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, vec![first + 3, first + 4, first + 5]);
    let mut live = sub.live;
    spawn_probe(&kernel, ROOT, "later", Role::Agent).await;
    assert_eq!(live.recv().await.unwrap().seq, first + 6);
}

#[tokio::test]
async fn a_process_cannot_wait_on_a_task_it_gave_itself() {
    let (kernel, _) = kernel().await;
    let a = spawn_probe(&kernel, ROOT, "a", Role::Lead).await;
    let err = kernel
        .execute_task(Caller::Process(a), TaskSpec::new(a, "hello me"))
        .await
        .unwrap_err();
    assert!(matches!(err, KernelError::InvalidArgument(_)), "{err}");
}

#[tokio::test]
async fn kernel_message_events_keep_only_a_preview_of_the_payload() {
    let (kernel, _) = kernel().await;
    let a = spawn_probe(&kernel, ROOT, "a", Role::Lead).await;
    let mut events = kernel.subscribe(None).live;
    let big = "é".repeat(hivekernel_kernel::KERNEL_MESSAGE_PREVIEW);
    send(&kernel, a, ROOT, &big).await.unwrap();
    let event = events.recv().await.unwrap();
    let EventKind::KernelMessage { payload, .. } = &event.kind else {
        panic!("{event:?}")
    };
    assert!(payload.len() <= hivekernel_kernel::KERNEL_MESSAGE_PREVIEW);
    assert!(payload.ends_with("… [cut: 8192 bytes in all]"), "{payload}");
}

#[tokio::test]
async fn top_level_siblings_send_no_copies_to_the_kernel() {
    let (kernel, journal) = kernel().await;
    let a = spawn_probe(&kernel, ROOT, "a", Role::Lead).await;
    let b = spawn_probe(&kernel, ROOT, "b", Role::Lead).await;
    let mut events = kernel.subscribe(None).live;
    send(&kernel, a, b, "peer").await.unwrap();
    wait_until("delivery", Duration::from_secs(5), || async {
        journal.of(b).iter().any(|m| m.payload == "peer")
    })
    .await;
    assert!(
        matches!(events.try_recv(), Ok(None)),
        "a copy reached the kernel as an event"
    );
}

#[tokio::test]
async fn a_delegated_task_whose_worker_is_killed_mid_task_is_answered_as_failed() {
    let (kernel, journal) = kernel().await;
    let lead = spawn_probe(&kernel, Pid::KERNEL, "lead", Role::Lead).await;
    let (_, worker) = kernel
        .execute_task(Caller::Admin, TaskSpec::new(lead, "spawn slow worker"))
        .await
        .unwrap();
    let worker = Pid(worker.unwrap().parse().unwrap());
    kernel
        .execute_task(
            Caller::Admin,
            TaskSpec::new(lead, format!("delegate {} sleep 60000", worker.0)),
        )
        .await
        .unwrap()
        .1
        .unwrap();
    wait_until(
        "the worker is on the task",
        Duration::from_secs(10),
        || async {
            kernel
                .get_process(Caller::Admin, worker)
                .await
                .is_ok_and(|p| p.state == hivekernel_agents::ProcessState::Running)
        },
    )
    .await;
    kernel.kill(Caller::Admin, worker, "stop").await.unwrap();
    wait_until(
        "the lead hears of its request",
        Duration::from_secs(10),
        || async {
            journal
                .of(lead)
                .iter()
                .any(|m| m.kind == hivekernel_agents::message::kinds::TASK_RESPONSE)
        },
    )
    .await;
    let response = journal
        .of(lead)
        .into_iter()
        .find(|m| m.kind == hivekernel_agents::message::kinds::TASK_RESPONSE)
        .unwrap();
    let body: serde_json::Value = serde_json::from_str(&response.payload).unwrap();
    assert_eq!(body["success"], false);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("exited before answering"),
        "{body}"
    );
    kernel.shutdown().await;
}
