//! Restart policies, restart intensity and backoff, supervision strategies,
//! escalation and shutdown, on an in-process kernel under a paused clock.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use hivekernel_agents::RestartPolicy::{Permanent, Temporary, Transient};
use hivekernel_agents::{
    Outgoing, Pid, ProcessInfo, ProcessState, RestartPolicy, RestartSpec, Role, Strategy, TaskSpec,
};
use hivekernel_kernel::config::RoleSettings;
use hivekernel_kernel::events::{Event, EventKind, Live};
use hivekernel_kernel::{Caller, EXIT_FAILED, EXIT_KILLED, EXIT_PANICKED, Kernel, KernelError};
use hivekernel_tests::{kernel, kernel_with, probe_request, test_settings, wait_until};
use tokio::time::Instant;

const ROOT: Pid = Pid::KERNEL;

/// `policy`, `max_restarts` within 60 s, backoff from 100 ms to 1 s.
fn restart(policy: RestartPolicy, max_restarts: u32) -> RestartSpec {
    RestartSpec {
        policy,
        max_restarts,
        within_seconds: 60,
        backoff_ms: [100, 1000],
    }
}

/// Spawns a `probe` lead as the admin with the given supervision.
async fn spawn(
    kernel: &Kernel,
    parent: Pid,
    name: &str,
    restart: Option<RestartSpec>,
    strategy: Option<Strategy>,
) -> Pid {
    let mut request = probe_request(parent, name, Role::Lead);
    request.restart = restart;
    request.strategy = strategy;
    kernel
        .spawn(Caller::Admin, request)
        .await
        .unwrap_or_else(|e| panic!("spawn {name} under {parent}: {e}"))
}

/// Makes `pid`'s runtime fail (a runtime error: exit code 1).
async fn crash(kernel: &Kernel, pid: Pid) {
    kernel
        .send_message(Caller::Admin, Outgoing::new(pid, "crash"))
        .await
        .unwrap_or_else(|e| panic!("crash {pid}: {e}"));
}

/// Runs `task` on `pid` in the background; its answer does not matter.
fn run(kernel: &Kernel, pid: Pid, task: &str) {
    let (kernel, task) = (kernel.clone(), TaskSpec::new(pid, task));
    tokio::spawn(async move {
        let _ = kernel.execute_task(Caller::Admin, task).await;
    });
}

async fn info(kernel: &Kernel, pid: Pid) -> ProcessInfo {
    kernel
        .get_process(Caller::Admin, pid)
        .await
        .unwrap_or_else(|e| panic!("process {pid}: {e}"))
}

async fn is_gone(kernel: &Kernel, pid: Pid) -> bool {
    kernel.get_process(Caller::Admin, pid).await == Err(KernelError::NotFound(pid))
}

/// The kernel's live events, read with a deadline.
struct Events(Live);

impl Events {
    fn new(kernel: &Kernel) -> Self {
        Events(kernel.subscribe(None).live)
    }

    /// Every event up to and including the next `kind` event about `pid`.
    async fn until(&mut self, pid: Pid, kind: &str) -> Vec<Arc<Event>> {
        let mut seen = Vec::new();
        let found = tokio::time::timeout(Duration::from_secs(3600), async {
            loop {
                let event = self.0.recv().await.unwrap();
                seen.push(event.clone());
                if event.pid == pid && event.kind.name() == kind {
                    return;
                }
            }
        })
        .await;
        assert!(found.is_ok(), "no {kind} event for {pid}; saw {seen:#?}");
        seen
    }

    /// The next `kind` event about `pid`.
    async fn next(&mut self, pid: Pid, kind: &str) -> Arc<Event> {
        self.until(pid, kind).await.pop().unwrap()
    }

    /// The events already emitted and not yet read.
    fn drain(&mut self) -> Vec<Arc<Event>> {
        std::iter::from_fn(|| self.0.try_recv().ok().flatten()).collect()
    }
}

fn restarted(events: &[Arc<Event>]) -> Vec<(Pid, u32)> {
    events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::Restarted { attempt, .. } => Some((e.pid, attempt)),
            _ => None,
        })
        .collect()
}

/// Crashes one child of a parent with `strategy` until the parent gives up,
/// checking each restart on the way: the restart count before escalation is
/// `max_restarts` and failure `max_restarts + 1` escalates.
async fn crash_loop_escalates_at_the_intensity(strategy: Strategy, max_restarts: u32) {
    let (kernel, _) = kernel().await;
    let mut events = Events::new(&kernel);
    let parent = spawn(&kernel, ROOT, "parent", None, Some(strategy)).await;
    let before = spawn(
        &kernel,
        parent,
        "before",
        Some(restart(Permanent, 100)),
        None,
    )
    .await;
    let failing = Some(restart(Permanent, max_restarts));
    let failing = spawn(&kernel, parent, "failing", failing, None).await;
    let after = spawn(
        &kernel,
        parent,
        "after",
        Some(restart(Transient, 100)),
        None,
    )
    .await;
    let temp = spawn(&kernel, parent, "temp", None, None).await;
    let stopped: &[Pid] = match strategy {
        Strategy::OneForOne => &[],
        Strategy::OneForAll => &[before, after, temp],
        Strategy::RestForOne => &[after, temp],
    };
    // Temporary children the strategy stops stay dead.
    let mut expected: Vec<Pid> = stopped.iter().copied().filter(|&p| p != temp).collect();
    expected.push(failing);
    expected.sort();

    for attempt in 1..=max_restarts {
        crash(&kernel, failing).await;
        let mut seen = events.until(failing, "restarted").await;
        while restarted(&seen).len() < expected.len() {
            seen.extend(events.until(*expected.last().unwrap(), "restarted").await);
        }
        let restarts = restarted(&seen);
        let in_order: Vec<(Pid, u32)> = expected.iter().map(|&p| (p, attempt)).collect();
        assert_eq!(restarts, in_order, "{strategy}: restart {attempt}");
        let exited = seen
            .iter()
            .position(|e| e.pid == failing && e.kind.name() == "exited");
        let back = seen
            .iter()
            .position(|e| e.pid == failing && e.kind.name() == "restarted");
        assert!(exited < back && exited.is_some(), "exit before restart");
        for pid in [before, failing, after] {
            let info = info(&kernel, pid).await;
            let count = if expected.contains(&pid) { attempt } else { 0 };
            assert_eq!(info.restarts, count, "{strategy}: restarts of {pid}");
            assert_ne!(info.state, ProcessState::Restarting);
            assert_eq!(info.ppid, parent);
        }
        let temp_info = info(&kernel, temp).await;
        if stopped.contains(&temp) {
            let exit = temp_info.exit.unwrap();
            assert_eq!(exit.exit_code, EXIT_KILLED);
            assert_eq!(exit.reason, format!("restart: sibling {failing} failed"));
        } else {
            assert_eq!(temp_info.state, ProcessState::Idle);
        }
    }

    crash(&kernel, failing).await;
    let seen = events.until(parent, "escalated").await;
    assert!(restarted(&seen).is_empty(), "{strategy}: {seen:#?}");
    let escalated = &seen[seen.len() - 1].kind;
    assert_eq!(
        escalated,
        &EventKind::Escalated {
            child: failing,
            name: Arc::from("failing"),
            restarts: max_restarts,
            within_seconds: 60,
        }
    );
    let exit = info(&kernel, parent).await.exit.expect("the parent failed");
    assert_eq!(exit.exit_code, EXIT_FAILED);
    assert_eq!(
        exit.reason,
        format!(
            "restart intensity exceeded: child {failing} (failing) restarted {max_restarts} times in 60s"
        )
    );
    for pid in [before, failing, after, temp] {
        assert!(is_gone(&kernel, pid).await, "{pid} outlived its parent");
    }
    // The parent was temporary: nothing comes back, and the kernel serves on.
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert!(restarted(&events.drain()).is_empty());
    assert_eq!(kernel.live_count(), 1);
    let fresh = spawn(&kernel, ROOT, "fresh", None, None).await;
    let (_, reply) = kernel
        .execute_task(Caller::Admin, TaskSpec::new(fresh, "hello"))
        .await
        .unwrap();
    assert_eq!(reply.unwrap(), "hello");
}

#[tokio::test(start_paused = true)]
async fn one_for_one_crash_loop_escalates_exactly_at_the_intensity() {
    crash_loop_escalates_at_the_intensity(Strategy::OneForOne, 3).await;
}

#[tokio::test(start_paused = true)]
async fn one_for_all_crash_loop_escalates_exactly_at_the_intensity() {
    crash_loop_escalates_at_the_intensity(Strategy::OneForAll, 2).await;
}

#[tokio::test(start_paused = true)]
async fn rest_for_one_crash_loop_escalates_exactly_at_the_intensity() {
    crash_loop_escalates_at_the_intensity(Strategy::RestForOne, 4).await;
}

#[tokio::test(start_paused = true)]
async fn backoff_delays_double_up_to_the_cap_and_reset_when_the_window_empties() {
    let (kernel, _) = kernel().await;
    let mut events = Events::new(&kernel);
    let spec = RestartSpec {
        policy: Permanent,
        max_restarts: 5,
        within_seconds: 10,
        backoff_ms: [100, 500],
    };
    let pid = spawn(&kernel, ROOT, "flaky", Some(spec), None).await;
    let mut delays = Vec::new();
    for attempt in 1..=5 {
        let start = Instant::now();
        crash(&kernel, pid).await;
        let event = events.next(pid, "restarted").await;
        let waited = start.elapsed();
        let EventKind::Restarted {
            attempt: n,
            delay_ms,
            ..
        } = event.kind
        else {
            unreachable!()
        };
        assert_eq!(n, attempt);
        let delay = Duration::from_millis(delay_ms);
        assert!(
            waited >= delay && waited < delay + Duration::from_millis(2),
            "restart {attempt}: waited {waited:?}, announced {delay:?}"
        );
        delays.push(delay_ms);
    }
    assert_eq!(delays, [100, 200, 400, 500, 500]);

    // Once no restart is left in the window, the backoff starts over.
    tokio::time::sleep(Duration::from_secs(11)).await;
    crash(&kernel, pid).await;
    let event = events.next(pid, "restarted").await;
    assert_eq!(
        event.kind,
        EventKind::Restarted {
            attempt: 6,
            delay_ms: 100,
            manual: false,
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_restarting_process_keeps_its_identity_and_gets_a_fresh_mailbox() {
    let (kernel, journal) = kernel().await;
    let mut events = Events::new(&kernel);
    let mut request = probe_request(ROOT, "phoenix", Role::Lead);
    request.restart = Some(restart(Permanent, 3));
    request.tools = vec!["read_file".into()];
    request.metadata.insert("purpose".into(), "test".into());
    let pid = kernel.spawn(Caller::Admin, request).await.unwrap();
    let child = spawn(&kernel, pid, "child", Some(restart(Permanent, 3)), None).await;
    let before = info(&kernel, pid).await;
    kernel
        .send_message(Caller::Admin, Outgoing::new(pid, "first"))
        .await
        .unwrap();

    crash(&kernel, pid).await;
    let exited = events.next(pid, "exited").await;
    assert!(matches!(
        exited.kind,
        EventKind::Exited {
            exit_code: EXIT_FAILED,
            ..
        }
    ));
    let waiting = info(&kernel, pid).await;
    assert_eq!(waiting.state, ProcessState::Restarting);
    assert_eq!(waiting.exit, None);
    assert!(is_gone(&kernel, child).await, "its subtree died with it");
    let refused = kernel
        .send_message(Caller::Admin, Outgoing::new(pid, "while down"))
        .await
        .unwrap_err();
    assert!(
        matches!(refused, KernelError::FailedPrecondition(_)),
        "{refused}"
    );
    let err = kernel
        .spawn(Caller::Admin, probe_request(pid, "orphan", Role::Worker))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        KernelError::ParentNotAlive {
            pid,
            state: "restarting"
        }
    );

    events.next(pid, "restarted").await;
    let after = info(&kernel, pid).await;
    assert_eq!(after.restarts, 1);
    assert_eq!(after.state, ProcessState::Idle);
    assert_eq!(after.children, 0, "children are not restarted with it");
    let same = |i: &ProcessInfo| {
        (
            i.pid,
            i.ppid,
            i.name.clone(),
            i.role,
            i.tier,
            i.runtime.clone(),
            i.tools.clone(),
            i.limits,
            i.metadata.clone(),
        )
    };
    assert_eq!(same(&after), same(&before));
    kernel
        .send_message(Caller::Admin, Outgoing::new(pid, "second"))
        .await
        .unwrap();
    wait_until(
        "the restarted probe to read",
        Duration::from_secs(5),
        || async { journal.of(pid).iter().any(|m| m.payload == "second") },
    )
    .await;
    let payloads: Vec<String> = journal.of(pid).into_iter().map(|m| m.payload).collect();
    assert_eq!(payloads, ["first", "second"]);
    let (_, reply) = kernel
        .execute_task(Caller::Admin, TaskSpec::new(pid, "still me"))
        .await
        .unwrap();
    assert_eq!(reply.unwrap(), "still me");
}

#[tokio::test(start_paused = true)]
async fn transient_restarts_after_failures_but_not_after_a_normal_exit() {
    let (kernel, _) = kernel().await;
    let mut events = Events::new(&kernel);
    let pid = spawn(
        &kernel,
        ROOT,
        "transient",
        Some(restart(Transient, 10)),
        None,
    )
    .await;

    crash(&kernel, pid).await;
    events.next(pid, "restarted").await;
    run(&kernel, pid, "panic");
    let seen = events.until(pid, "restarted").await;
    assert!(seen.iter().any(|e| e.pid == pid
        && matches!(
            e.kind,
            EventKind::Exited {
                exit_code: EXIT_PANICKED,
                ..
            }
        )));
    run(&kernel, pid, "exit 3 gave up");
    let seen = events.until(pid, "restarted").await;
    assert!(seen.iter().any(|e| e.pid == pid
        && matches!(&e.kind, EventKind::Exited { exit_code: 3, reason, .. } if &**reason == "gave up")));
    assert_eq!(info(&kernel, pid).await.restarts, 3);

    run(&kernel, pid, "exit 0 done");
    let exited = events.next(pid, "exited").await;
    assert!(matches!(
        exited.kind,
        EventKind::Exited { exit_code: 0, .. }
    ));
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(restarted(&events.drain()).is_empty());
    let info = info(&kernel, pid).await;
    assert_eq!(info.state, ProcessState::Zombie);
    assert_eq!(info.restarts, 3);
    assert_eq!(info.exit.unwrap().reason, "done");
}

#[tokio::test(start_paused = true)]
async fn permanent_restarts_even_after_a_normal_exit() {
    let (kernel, _) = kernel().await;
    let mut events = Events::new(&kernel);
    let pid = spawn(
        &kernel,
        ROOT,
        "permanent",
        Some(restart(Permanent, 10)),
        None,
    )
    .await;
    run(&kernel, pid, "exit 0");
    let seen = events.until(pid, "restarted").await;
    assert!(
        seen.iter()
            .any(|e| e.pid == pid && matches!(e.kind, EventKind::Exited { exit_code: 0, .. }))
    );
    assert_eq!(info(&kernel, pid).await.state, ProcessState::Idle);
}

#[tokio::test(start_paused = true)]
async fn temporary_processes_are_never_restarted() {
    let (kernel, _) = kernel().await;
    let mut events = Events::new(&kernel);
    let explicit = spawn(
        &kernel,
        ROOT,
        "explicit",
        Some(restart(Temporary, 10)),
        None,
    )
    .await;
    // With no restart spec and no role default, a process is temporary.
    let default = spawn(&kernel, ROOT, "default", None, None).await;
    crash(&kernel, explicit).await;
    run(&kernel, default, "panic");
    events.next(explicit, "exited").await;
    events.next(default, "exited").await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(restarted(&events.drain()).is_empty());
    for pid in [explicit, default] {
        let info = info(&kernel, pid).await;
        assert_eq!((info.state, info.restarts), (ProcessState::Zombie, 0));
    }
}

#[tokio::test(start_paused = true)]
async fn an_explicit_kill_never_restarts() {
    let (kernel, _) = kernel().await;
    let mut events = Events::new(&kernel);
    let spec = Some(restart(Permanent, 10));
    // By the admin (gRPC Kill, CLI kill).
    let by_admin = spawn(&kernel, ROOT, "by_admin", spec, None).await;
    kernel.kill(Caller::Admin, by_admin, "").await.unwrap();
    // By its parent, through the kill syscall.
    let parent = spawn(&kernel, ROOT, "parent", None, Some(Strategy::OneForAll)).await;
    let by_parent = spawn(&kernel, parent, "by_parent", spec, None).await;
    let sibling = spawn(&kernel, parent, "sibling", spec, None).await;
    let (_, reply) = kernel
        .execute_task(
            Caller::Admin,
            TaskSpec::new(parent, format!("kill {by_parent}")),
        )
        .await
        .unwrap();
    assert_eq!(reply.unwrap(), format!("[{by_parent:?}]"));
    // While it waits to be restarted: the kill ends it for good.
    let waiting = spawn(&kernel, ROOT, "waiting", spec, None).await;
    crash(&kernel, waiting).await;
    events.next(waiting, "exited").await;
    assert_eq!(info(&kernel, waiting).await.state, ProcessState::Restarting);
    kernel.kill(Caller::Admin, waiting, "enough").await.unwrap();

    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(restarted(&events.drain()).is_empty());
    for pid in [by_admin, by_parent, waiting] {
        let info = info(&kernel, pid).await;
        assert_eq!(info.state, ProcessState::Zombie, "{pid}");
        assert_eq!(info.exit.unwrap().exit_code, EXIT_KILLED);
        assert_eq!(info.restarts, 0);
    }
    // An explicit kill does not set off the parent's strategy either.
    let sibling = info(&kernel, sibling).await;
    assert_eq!((sibling.state, sibling.restarts), (ProcessState::Idle, 0));
    let record = kernel
        .wait_child(Caller::Admin, waiting, None)
        .await
        .unwrap();
    assert_eq!(record.reason, "enough");
}

#[tokio::test(start_paused = true)]
async fn escalation_to_pid_1_leaves_the_child_dead_and_the_kernel_running() {
    let (kernel, _) = kernel().await;
    let mut events = Events::new(&kernel);
    let child = spawn(&kernel, ROOT, "child", Some(restart(Permanent, 1)), None).await;
    let sibling = spawn(&kernel, ROOT, "sibling", Some(restart(Permanent, 1)), None).await;
    let never = spawn(&kernel, ROOT, "never", Some(restart(Permanent, 0)), None).await;

    crash(&kernel, child).await;
    events.next(child, "restarted").await;
    crash(&kernel, child).await;
    let escalated = events.next(ROOT, "escalated").await;
    assert!(matches!(
        escalated.kind,
        EventKind::Escalated { child: c, restarts: 1, .. } if c == child
    ));
    // max_restarts 0: the first failure escalates.
    crash(&kernel, never).await;
    let escalated = events.next(ROOT, "escalated").await;
    assert!(matches!(
        escalated.kind,
        EventKind::Escalated { child: c, restarts: 0, .. } if c == never
    ));

    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(restarted(&events.drain()).is_empty());
    for pid in [child, never] {
        let info = info(&kernel, pid).await;
        assert_eq!(info.state, ProcessState::Zombie);
        assert_eq!(info.exit.unwrap().exit_code, EXIT_FAILED);
    }
    assert!(!kernel.is_stopping());
    let sibling = info(&kernel, sibling).await;
    assert_eq!((sibling.state, sibling.restarts), (ProcessState::Idle, 0));
    let (_, reply) = kernel
        .execute_task(Caller::Admin, TaskSpec::new(sibling.pid, "alive"))
        .await
        .unwrap();
    assert_eq!(reply.unwrap(), "alive");
}

#[tokio::test(start_paused = true)]
async fn an_escalated_parent_is_restarted_under_its_own_policy() {
    let (kernel, _) = kernel().await;
    let mut events = Events::new(&kernel);
    let parent = spawn(&kernel, ROOT, "parent", Some(restart(Permanent, 5)), None).await;
    let child = spawn(&kernel, parent, "child", Some(restart(Transient, 1)), None).await;
    crash(&kernel, child).await;
    events.next(child, "restarted").await;
    crash(&kernel, child).await;
    let seen = events.until(parent, "restarted").await;
    let names: Vec<(Pid, &str)> = seen
        .iter()
        .filter(|e| e.pid == parent || e.pid == child)
        .map(|e| (e.pid, e.kind.name()))
        .collect();
    assert_eq!(
        names,
        [
            (child, "exited"),
            (parent, "exited"),
            (child, "reaped"),
            (parent, "escalated"),
            (parent, "restarted"),
        ]
    );
    let parent_exit = seen
        .iter()
        .find(|e| e.pid == parent && e.kind.name() == "exited")
        .unwrap();
    let EventKind::Exited { reason, .. } = &parent_exit.kind else {
        unreachable!()
    };
    assert!(
        reason.starts_with("restart intensity exceeded: child"),
        "{reason}"
    );
    let info = info(&kernel, parent).await;
    assert_eq!(
        (info.state, info.restarts, info.children),
        (ProcessState::Idle, 1, 0)
    );
    assert!(is_gone(&kernel, child).await);
}

#[tokio::test(start_paused = true)]
async fn role_defaults_come_from_the_settings_and_a_request_overrides_them() {
    let mut settings = test_settings();
    settings.roles.insert(
        Role::Worker,
        RoleSettings {
            restart: Some(restart(Permanent, 3)),
            ..RoleSettings::default()
        },
    );
    settings.roles.insert(
        Role::Lead,
        RoleSettings {
            strategy: Some(Strategy::OneForAll),
            ..RoleSettings::default()
        },
    );
    let (kernel, _) = kernel_with(settings).await;
    let mut events = Events::new(&kernel);
    // A lead: one_for_all by its role; its workers permanent by theirs.
    let lead = spawn(&kernel, ROOT, "lead", None, None).await;
    let worker = |name: &'static str| probe_request(lead, name, Role::Worker);
    let w1 = kernel.spawn(Caller::Admin, worker("w1")).await.unwrap();
    let mut request = worker("w2");
    request.restart = Some(restart(Temporary, 0));
    let w2 = kernel.spawn(Caller::Admin, request).await.unwrap();
    let w3 = kernel.spawn(Caller::Admin, worker("w3")).await.unwrap();

    crash(&kernel, w3).await;
    let seen = events.until(w3, "restarted").await;
    assert_eq!(restarted(&seen), [(w1, 1), (w3, 1)]);
    assert_eq!(info(&kernel, w2).await.state, ProcessState::Zombie);
    // A lead's own role default names no restart: it stays temporary.
    crash(&kernel, lead).await;
    events.next(lead, "exited").await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(info(&kernel, lead).await.state, ProcessState::Zombie);
}

#[tokio::test]
async fn spawn_refuses_an_unsound_restart_spec_naming_the_field() {
    let (kernel, _) = kernel().await;
    type Edit = fn(&mut RestartSpec);
    let cases: [(Edit, &str); 3] = [
        (|s| s.backoff_ms = [500, 100], "restart.backoff_ms"),
        (|s| s.within_seconds = 0, "restart.within_seconds"),
        (|s| s.max_restarts = 1_000_000, "restart.max_restarts"),
    ];
    for (edit, field) in cases {
        let mut spec = restart(Permanent, 3);
        edit(&mut spec);
        let mut request = probe_request(ROOT, "bad", Role::Agent);
        request.restart = Some(spec);
        let err = kernel.spawn(Caller::Admin, request).await.unwrap_err();
        assert!(matches!(err, KernelError::InvalidArgument(_)), "{err}");
        assert!(err.to_string().contains(field), "{err} should name {field}");
    }
    assert_eq!(kernel.live_count(), 1);
}

#[tokio::test(start_paused = true)]
async fn shutdown_forces_what_still_runs_after_the_grace_period() {
    let mut settings = test_settings();
    settings.shutdown_grace_ms = 500;
    let (kernel, _) = kernel_with(settings).await;
    let quick = spawn(&kernel, ROOT, "quick", None, None).await;
    let stubborn = spawn(&kernel, ROOT, "stubborn", None, None).await;
    let ask = |pid: Pid, task: &'static str| {
        let kernel = kernel.clone();
        tokio::spawn(async move {
            let (_, reply) = kernel
                .execute_task(Caller::Admin, TaskSpec::new(pid, task))
                .await?;
            Ok::<_, KernelError>(reply)
        })
    };
    let quick_reply = ask(quick, "sleep 200");
    let stubborn_reply = ask(stubborn, "sleep 3600000");
    for pid in [quick, stubborn] {
        wait_until("the task to start", Duration::from_secs(1), || async {
            info(&kernel, pid).await.state == ProcessState::Running
        })
        .await;
    }
    let start = Instant::now();
    kernel.shutdown().await;
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_millis(510),
        "shutdown took {took:?}"
    );
    assert_eq!(quick_reply.await.unwrap().unwrap().unwrap(), "slept 200");
    assert!(
        stubborn_reply.await.unwrap().is_err(),
        "forced, not answered"
    );
    assert!(kernel.tracker().is_closed() && kernel.tracker().is_empty());
}

#[tokio::test(start_paused = true)]
async fn shutdown_cancels_pending_restarts() {
    let (kernel, _) = kernel().await;
    let mut events = Events::new(&kernel);
    let spec = RestartSpec {
        backoff_ms: [60_000, 60_000],
        ..restart(Permanent, 3)
    };
    let pid = spawn(&kernel, ROOT, "slow_to_return", Some(spec), None).await;
    crash(&kernel, pid).await;
    events.next(pid, "exited").await;
    let start = Instant::now();
    kernel.shutdown().await;
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "waited for the timer"
    );
    assert!(restarted(&events.drain()).is_empty());
    assert_eq!(kernel.live_count(), 1);
    assert!(kernel.tracker().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simultaneous_failures_under_one_for_all_settle_with_every_child_running() {
    let (kernel, _) = kernel().await;
    let parent = spawn(&kernel, ROOT, "parent", None, Some(Strategy::OneForAll)).await;
    let spec = RestartSpec {
        backoff_ms: [0, 0],
        ..restart(Permanent, 1000)
    };
    let mut children = Vec::new();
    for i in 0..5 {
        children.push(spawn(&kernel, parent, &format!("c{i}"), Some(spec), None).await);
    }
    for round in 1..=10 {
        let crashes = children.iter().map(|&pid| {
            let kernel = kernel.clone();
            // A child already stopped by a sibling's failure refuses the message.
            async move {
                let _ = kernel
                    .send_message(Caller::Admin, Outgoing::new(pid, "crash"))
                    .await;
            }
        });
        futures::future::join_all(crashes).await;
        // Every round restarts every child at least once, all together.
        wait_until(
            "every child to run again",
            Duration::from_secs(10),
            || async {
                let infos = kernel.infos(&children).await;
                infos.len() == children.len()
                    && infos.iter().all(|i| {
                        i.state == ProcessState::Idle && i.mailbox_len == 0 && i.restarts >= round
                    })
            },
        )
        .await;
    }
    for info in kernel.infos(&children).await {
        assert!(info.restarts >= 10, "{info:?}");
        assert_eq!(info.ppid, parent);
    }
    assert_eq!(info(&kernel, parent).await.children, 5);
    assert_eq!(kernel.live_count(), 7);
    kernel.shutdown().await;
    assert!(kernel.tracker().is_empty());
}

#[tokio::test(start_paused = true)]
async fn manual_restarts_take_no_place_in_the_restart_intensity_window() {
    let (kernel, _journal) = kernel().await;
    let mut events = Events::new(&kernel);
    let pid = spawn(&kernel, ROOT, "steady", Some(restart(Permanent, 1)), None).await;
    for attempt in 1..=3 {
        assert_eq!(kernel.restart(Caller::Admin, pid, "").await, Ok(attempt));
        let event = events.next(pid, "restarted").await;
        assert_eq!(
            event.kind,
            EventKind::Restarted {
                attempt,
                delay_ms: 0,
                manual: true,
            }
        );
    }
    // Its one supervised restart in the window is still there: the crash is
    // restarted after the first backoff, not escalated.
    crash(&kernel, pid).await;
    let event = events.next(pid, "restarted").await;
    assert_eq!(
        event.kind,
        EventKind::Restarted {
            attempt: 4,
            delay_ms: 100,
            manual: false,
        }
    );
    // And that one was counted: the next crash exceeds the intensity.
    crash(&kernel, pid).await;
    events.next(ROOT, "escalated").await;
    assert_eq!(info(&kernel, pid).await.state, ProcessState::Zombie);
}
