//! Spawn rules, subtree kill, exit records, wait_child and reaping, on an in-process kernel.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use hivekernel_agents::message::kinds;
use hivekernel_agents::{
    Capability, ErrorKind, LimitOverrides, Pid, ProcessState, Role, SpawnRequest, Tier,
};
use hivekernel_kernel::events::EventKind;
use hivekernel_kernel::{Caller, EXIT_KILLED, EXIT_PANICKED, KernelError};
use hivekernel_tests::{
    kernel, kernel_with, probe_request, spawn_probe, test_settings, wait_until,
};

const ROOT: Pid = Pid::KERNEL;

#[tokio::test]
async fn pid_1_is_the_kernel_and_pids_are_never_reused() {
    let (kernel, _) = kernel().await;
    let info = kernel.get_process(Caller::Admin, ROOT).await.unwrap();
    assert_eq!(
        (info.role, info.tier, info.ppid),
        (Role::Kernel, Tier::Strategic, Pid(0))
    );

    let a = spawn_probe(&kernel, ROOT, "a", Role::Agent).await;
    kernel.kill(Caller::Admin, a, "").await.unwrap();
    kernel.wait_child(Caller::Admin, a, None).await.unwrap();
    let b = spawn_probe(&kernel, ROOT, "b", Role::Agent).await;
    assert!(b.0 > a.0, "pid {a} was reused as {b}");
    assert!(
        kernel.get_process(Caller::Admin, a).await.is_err(),
        "reaped process still listed"
    );
}

#[tokio::test]
async fn spawn_refuses_an_empty_name() {
    let (kernel, _) = kernel().await;
    for name in ["", "   ", "bad\nname"] {
        let err = kernel
            .spawn(Caller::Admin, probe_request(ROOT, name, Role::Agent))
            .await
            .unwrap_err();
        assert!(
            matches!(err, KernelError::InvalidArgument(_)),
            "{name:?}: {err}"
        );
    }
    assert_eq!(kernel.live_count(), 1);
}

#[tokio::test]
async fn spawn_refuses_a_parent_that_is_not_alive() {
    let (kernel, _) = kernel().await;
    let parent = spawn_probe(&kernel, ROOT, "parent", Role::Lead).await;
    kernel.kill(Caller::Admin, parent, "").await.unwrap();
    let err = kernel
        .spawn(Caller::Admin, probe_request(parent, "orphan", Role::Worker))
        .await
        .unwrap_err();
    assert!(
        matches!(err, KernelError::ParentNotAlive { pid, .. } if pid == parent),
        "{err}"
    );
    let err = kernel
        .spawn(
            Caller::Admin,
            probe_request(Pid(999), "orphan", Role::Worker),
        )
        .await
        .unwrap_err();
    assert_eq!(err, KernelError::NotFound(Pid(999)));
}

#[tokio::test]
async fn spawn_refuses_beyond_the_kernel_max_depth() {
    let mut settings = test_settings();
    settings.max_depth = 3;
    let (kernel, _) = kernel_with(settings).await;
    let mut parent = ROOT;
    for level in 1..=3 {
        parent = spawn_probe(&kernel, parent, &format!("level{level}"), Role::Lead).await;
    }
    let err = kernel
        .spawn(Caller::Admin, probe_request(parent, "level4", Role::Worker))
        .await
        .unwrap_err();
    assert!(
        matches!(err, KernelError::DepthExceeded { depth: 4, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("max depth"), "{err}");
}

#[tokio::test]
async fn max_depth_narrows_per_process() {
    let (kernel, _) = kernel().await;
    let mut request = probe_request(ROOT, "shallow", Role::Lead);
    request.limits.max_depth = Some(1);
    let shallow = kernel.spawn(Caller::Admin, request).await.unwrap();
    // A lead may spawn: what stops its child is the depth.
    let child = spawn_probe(&kernel, shallow, "child", Role::Lead).await;
    assert_eq!(
        kernel
            .get_process(Caller::Admin, child)
            .await
            .unwrap()
            .limits
            .max_depth,
        0
    );
    let err = kernel
        .spawn(
            Caller::Admin,
            probe_request(child, "grandchild", Role::Worker),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, KernelError::DepthExceeded { .. }), "{err}");
}

#[tokio::test]
async fn spawn_refuses_past_max_children_and_counts_only_live_ones() {
    let (kernel, _) = kernel().await;
    let mut request = probe_request(ROOT, "lead", Role::Lead);
    request.limits.max_children = Some(2);
    let lead = kernel.spawn(Caller::Admin, request).await.unwrap();
    let first = spawn_probe(&kernel, lead, "w1", Role::Worker).await;
    spawn_probe(&kernel, lead, "w2", Role::Worker).await;
    let err = kernel
        .spawn(Caller::Admin, probe_request(lead, "w3", Role::Worker))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        KernelError::TooManyChildren {
            parent: lead,
            count: 2,
            max: 2
        }
    );
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted);
    // A zombie is not a live child.
    kernel.kill(Caller::Admin, first, "").await.unwrap();
    spawn_probe(&kernel, lead, "w3", Role::Worker).await;
}

#[tokio::test]
async fn spawn_refuses_a_tier_above_the_parent() {
    let (kernel, _) = kernel().await;
    let mut request = probe_request(ROOT, "ops", Role::Lead);
    request.tier = Some(Tier::Operational);
    let ops = kernel.spawn(Caller::Admin, request).await.unwrap();
    let mut request = probe_request(ops, "boss", Role::Worker);
    request.tier = Some(Tier::Tactical);
    let err = kernel.spawn(Caller::Admin, request).await.unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::TierAboveParent {
                child: "tactical",
                parent: "operational"
            }
        ),
        "{err}"
    );
    // Unspecified tier inherits the parent's.
    let child = spawn_probe(&kernel, ops, "peer", Role::Worker).await;
    assert_eq!(
        kernel.get_process(Caller::Admin, child).await.unwrap().tier,
        Tier::Operational
    );
}

#[tokio::test]
async fn a_task_may_not_spawn() {
    let (kernel, _) = kernel().await;
    let task = spawn_probe(&kernel, ROOT, "t", Role::Task).await;
    let err = kernel
        .spawn(Caller::Admin, probe_request(task, "sub", Role::Task))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        KernelError::MissingCapability {
            pid: task,
            role: Role::Task,
            capability: Capability::SpawnChildren,
            action: "spawn children",
        }
    );
    // The same rule through the process's own syscalls.
    let (_, reply) = kernel
        .execute_task(
            Caller::Admin,
            hivekernel_agents::TaskSpec::new(task, "spawn sub"),
        )
        .await
        .unwrap();
    assert!(
        reply
            .unwrap_err()
            .contains("lacks capability spawn_children")
    );
}

#[tokio::test]
async fn spawn_refuses_limits_larger_than_the_parents() {
    let (kernel, _) = kernel().await;
    let mut request = probe_request(ROOT, "lead", Role::Lead);
    request.limits = LimitOverrides {
        max_children: Some(4),
        max_depth: Some(3),
        timeout_seconds: Some(5),
        max_concurrent_tasks: Some(2),
        ..LimitOverrides::default()
    };
    let lead = kernel.spawn(Caller::Admin, request).await.unwrap();
    type Widen = fn(&mut LimitOverrides);
    let cases: [(&str, Widen); 4] = [
        ("max_children", |l| l.max_children = Some(5)),
        ("max_depth", |l| l.max_depth = Some(3)),
        ("timeout_seconds", |l| l.timeout_seconds = Some(6)),
        ("max_concurrent_tasks", |l| l.max_concurrent_tasks = Some(3)),
    ];
    for (field, widen) in cases {
        let mut request = probe_request(lead, "child", Role::Worker);
        widen(&mut request.limits);
        let err = kernel.spawn(Caller::Admin, request).await.unwrap_err();
        assert!(
            matches!(err, KernelError::LimitExceedsParent { field: f, .. } if f == field),
            "{field}: {err}"
        );
    }
    let child = spawn_probe(&kernel, lead, "child", Role::Worker).await;
    let limits = kernel
        .get_process(Caller::Admin, child)
        .await
        .unwrap()
        .limits;
    assert_eq!(
        (
            limits.max_children,
            limits.max_depth,
            limits.timeout_seconds,
            limits.max_concurrent_tasks
        ),
        (4, 2, 5, 2)
    );
}

#[tokio::test]
async fn a_process_may_only_spawn_its_own_children() {
    let (kernel, _) = kernel().await;
    let a = spawn_probe(&kernel, ROOT, "a", Role::Lead).await;
    let b = spawn_probe(&kernel, ROOT, "b", Role::Lead).await;
    let err = kernel
        .spawn(
            Caller::Process(a),
            probe_request(b, "intruder", Role::Worker),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, KernelError::PermissionDenied(_)), "{err}");
    let mut request = SpawnRequest::new(a, "own");
    request.runtime = Some("echo".into());
    kernel.spawn(Caller::Process(a), request).await.unwrap();
}

#[tokio::test]
async fn kill_takes_the_subtree_leaves_first_and_tells_the_parent() {
    let (kernel, journal) = kernel().await;
    let parent = spawn_probe(&kernel, ROOT, "parent", Role::Lead).await;
    let top = spawn_probe(&kernel, parent, "top", Role::Lead).await;
    let mid = spawn_probe(&kernel, top, "mid", Role::Lead).await;
    let leaf1 = spawn_probe(&kernel, mid, "leaf1", Role::Worker).await;
    let leaf2 = spawn_probe(&kernel, mid, "leaf2", Role::Worker).await;
    let side = spawn_probe(&kernel, top, "side", Role::Worker).await;
    let mut events = kernel.subscribe(None).live;

    let killed = kernel.kill(Caller::Admin, top, "test").await.unwrap();
    assert!(killed.unreached.is_empty());
    let killed = killed.exited;
    assert_eq!(killed, vec![leaf1, leaf2, mid, side, top]);
    // Nothing below top is left; top is a zombie for its parent to collect.
    for pid in [leaf1, leaf2, mid, side] {
        assert!(
            kernel.get_process(Caller::Admin, pid).await.is_err(),
            "{pid} still in the table"
        );
    }
    let zombie = kernel.get_process(Caller::Admin, top).await.unwrap();
    assert_eq!(zombie.state, ProcessState::Zombie);
    assert_eq!(zombie.exit.as_ref().unwrap().exit_code, EXIT_KILLED);
    assert_eq!(zombie.children, 0, "its children went with it");
    assert_eq!(kernel.live_count(), 2);

    let mut exited = Vec::new();
    while exited.len() < 5 {
        let event = events.recv().await.unwrap();
        if let EventKind::Exited { .. } = event.kind {
            exited.push(event.pid);
        }
    }
    assert_eq!(exited, killed, "exit events must come leaves first");

    wait_until(
        "child_exited message at the parent",
        Duration::from_secs(5),
        || async {
            journal
                .of(parent)
                .iter()
                .any(|m| m.kind == kinds::CHILD_EXITED && m.payload.contains("\"exit_code\":137"))
        },
    )
    .await;
}

#[tokio::test]
async fn kill_refuses_pid_1_strangers_and_the_dead() {
    let (kernel, _) = kernel().await;
    let a = spawn_probe(&kernel, ROOT, "a", Role::Lead).await;
    let b = spawn_probe(&kernel, ROOT, "b", Role::Lead).await;
    assert!(matches!(
        kernel.kill(Caller::Admin, ROOT, "").await,
        Err(KernelError::PermissionDenied(_))
    ));
    assert!(matches!(
        kernel.kill(Caller::Process(a), b, "").await,
        Err(KernelError::PermissionDenied(_))
    ));
    assert_eq!(
        kernel.kill(Caller::Admin, Pid(4242), "").await,
        Err(KernelError::NotFound(Pid(4242)))
    );
    kernel.kill(Caller::Admin, a, "").await.unwrap();
    assert!(matches!(
        kernel.kill(Caller::Admin, a, "").await,
        Err(KernelError::FailedPrecondition(_))
    ));
}

#[tokio::test]
async fn kill_cancels_work_in_flight_and_fails_queued_tasks() {
    let (kernel, _) = kernel().await;
    let busy = spawn_probe(&kernel, ROOT, "busy", Role::Agent).await;
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let kernel = kernel.clone();
        tasks.push(tokio::spawn(async move {
            kernel
                .execute_task(
                    Caller::Admin,
                    hivekernel_agents::TaskSpec::new(busy, "sleep 60000"),
                )
                .await
        }));
    }
    wait_until("busy to be running", Duration::from_secs(5), || async {
        kernel.get_process(Caller::Admin, busy).await.unwrap().state == ProcessState::Running
    })
    .await;
    kernel.kill(Caller::Admin, busy, "").await.unwrap();
    for task in tasks {
        let err = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap()
            .unwrap_err();
        assert!(matches!(err, KernelError::FailedPrecondition(_)), "{err}");
    }
}

#[tokio::test]
async fn wait_child_returns_the_exit_record_and_reaps() {
    let (kernel, _) = kernel().await;
    let parent = spawn_probe(&kernel, ROOT, "parent", Role::Lead).await;
    let child = spawn_probe(&kernel, parent, "child", Role::Worker).await;

    // The parent blocks in wait_child until the child exits.
    let waiter = {
        let kernel = kernel.clone();
        tokio::spawn(async move {
            kernel
                .wait_child(
                    Caller::Process(parent),
                    child,
                    Some(Duration::from_secs(10)),
                )
                .await
        })
    };
    wait_until("parent to block", Duration::from_secs(5), || async {
        kernel
            .get_process(Caller::Admin, parent)
            .await
            .unwrap()
            .state
            == ProcessState::Blocked
    })
    .await;
    kernel.kill(Caller::Admin, child, "enough").await.unwrap();
    let record = waiter.await.unwrap().unwrap();
    assert_eq!(
        (
            record.pid,
            record.ppid,
            record.exit_code,
            record.reason.as_str()
        ),
        (child, parent, EXIT_KILLED, "enough")
    );
    assert_eq!(
        kernel.get_process(Caller::Admin, child).await.unwrap_err(),
        KernelError::NotFound(child)
    );

    // Only the parent (or the admin) may wait, and a running child times out.
    let other = spawn_probe(&kernel, ROOT, "other", Role::Lead).await;
    let child2 = spawn_probe(&kernel, parent, "child2", Role::Worker).await;
    assert!(matches!(
        kernel
            .wait_child(Caller::Process(other), child2, None)
            .await,
        Err(KernelError::PermissionDenied(_))
    ));
    assert!(matches!(
        kernel
            .wait_child(
                Caller::Process(parent),
                child2,
                Some(Duration::from_millis(50))
            )
            .await,
        Err(KernelError::DeadlineExceeded(_))
    ));
}

// Paused clock: the reaper's deadline passes without a real wait.
#[tokio::test(start_paused = true)]
async fn uncollected_zombies_are_reaped_after_the_timeout() {
    let mut settings = test_settings();
    settings.zombie_timeout_seconds = 1;
    let (kernel, _) = kernel_with(settings).await;
    let child = spawn_probe(&kernel, ROOT, "child", Role::Worker).await;
    kernel.kill(Caller::Admin, child, "").await.unwrap();
    assert_eq!(
        kernel
            .get_process(Caller::Admin, child)
            .await
            .unwrap()
            .state,
        ProcessState::Zombie
    );
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(
        kernel.get_process(Caller::Admin, child).await.is_ok(),
        "reaped too early"
    );
    wait_until(
        "the zombie to be reaped",
        Duration::from_secs(10),
        || async { kernel.get_process(Caller::Admin, child).await.is_err() },
    )
    .await;
}

#[tokio::test]
async fn a_panicking_runtime_exits_its_process_and_the_kernel_keeps_running() {
    let (kernel, _) = kernel().await;
    let parent = spawn_probe(&kernel, ROOT, "parent", Role::Lead).await;
    let child = spawn_probe(&kernel, parent, "fragile", Role::Lead).await;
    let grandchild = spawn_probe(&kernel, child, "below", Role::Worker).await;
    let (_, reply) = kernel
        .execute_task(
            Caller::Admin,
            hivekernel_agents::TaskSpec::new(child, "panic"),
        )
        .await
        .unwrap();
    assert!(reply.unwrap_err().contains("panicked"));
    let record = kernel
        .wait_child(Caller::Process(parent), child, Some(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(record.exit_code, EXIT_PANICKED);
    assert!(kernel.get_process(Caller::Admin, grandchild).await.is_err());
    // The kernel still serves.
    let (_, reply) = kernel
        .execute_task(
            Caller::Admin,
            hivekernel_agents::TaskSpec::new(parent, "still here"),
        )
        .await
        .unwrap();
    assert_eq!(reply.unwrap(), "still here");
}

#[tokio::test]
async fn shutdown_stops_everything_and_refuses_new_work() {
    let (kernel, _) = kernel().await;
    let lead = spawn_probe(&kernel, ROOT, "lead", Role::Lead).await;
    spawn_probe(&kernel, lead, "worker", Role::Worker).await;
    kernel.shutdown().await;
    assert_eq!(kernel.live_count(), 1);
    assert!(
        kernel.tracker().is_closed() && kernel.tracker().is_empty(),
        "tasks outlived shutdown"
    );
    let err = kernel
        .spawn(Caller::Admin, probe_request(ROOT, "late", Role::Agent))
        .await
        .unwrap_err();
    assert_eq!(err, KernelError::ShuttingDown);
}

#[tokio::test]
async fn a_kill_whose_caller_gives_up_still_finishes_its_bookkeeping() {
    let (kernel, journal) = kernel().await;
    let parent = spawn_probe(&kernel, ROOT, "parent", Role::Lead).await;
    let child = spawn_probe(&kernel, parent, "child", Role::Lead).await;
    spawn_probe(&kernel, child, "grandchild", Role::Worker).await;
    let mut events = kernel.subscribe(None).live;
    // Poll the kill once, then drop it, as a cancelled gRPC call would.
    {
        let kill = kernel.kill(Caller::Admin, child, "abandoned");
        tokio::pin!(kill);
        let _ = futures::poll!(kill.as_mut());
    }
    let mut exited = 0;
    while exited < 2 {
        let event = tokio::time::timeout(Duration::from_secs(5), events.recv())
            .await
            .expect("exit events after a cancelled kill")
            .unwrap();
        if matches!(event.kind, EventKind::Exited { .. }) {
            exited += 1;
        }
    }
    wait_until(
        "the parent to hear of it",
        Duration::from_secs(5),
        || async {
            journal
                .of(parent)
                .iter()
                .any(|m| m.kind == kinds::CHILD_EXITED)
        },
    )
    .await;
    let record = kernel
        .wait_child(Caller::Process(parent), child, None)
        .await
        .unwrap();
    assert_eq!(record.reason, "abandoned");
}

#[tokio::test]
async fn pid_1_cannot_be_waited_for() {
    let (kernel, _) = kernel().await;
    let err = kernel
        .wait_child(Caller::Admin, ROOT, None)
        .await
        .unwrap_err();
    assert!(matches!(err, KernelError::InvalidArgument(_)), "{err}");
}
