//! The store end to end, in process: a kernel with a real SQLite file is
//! stopped and a second kernel is started on the same file, as `hivekernel
//! start` does after a restart. (kernel/tests/restart.rs does the same with
//! the real binary and `kill -9`.)

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use hivekernel_agents::message::kinds;
use hivekernel_agents::tool_agent::AgentSettings;
use hivekernel_agents::tools::ToolSettings;
use hivekernel_agents::{
    ExitRecord, NewArtifact, NewMemory, Pid, Role, SpawnRequest, TaskSpec, Visibility,
};
use hivekernel_kernel::config::KernelSettings;
use hivekernel_kernel::store::Recovered;
use hivekernel_kernel::{Caller, Declared, KERNEL_RESTART, Kernel, KernelError, Restored};
use hivekernel_proto::v1 as pb;
use hivekernel_tests::llm_server::{LlmServer, Scripted};
use hivekernel_tests::{
    Journal, agent_registry, open_store, probe_request, test_settings, wait_until,
};
use serde_json::Value;

const STEP: Duration = Duration::from_secs(10);

/// A kernel brought up on `<dir>/hivekernel.db` as `hivekernel start` does,
/// with `agents` as its config agents, and what starting it read and did.
struct Up {
    kernel: Kernel,
    journal: Journal,
    recovered: Recovered,
    agents: Vec<Pid>,
    restored: Restored,
}

/// A durable kernel on `<dir>/hivekernel.db` whose agents talk to `server`.
async fn durable(dir: &std::path::Path, server: &LlmServer, agents: &[SpawnRequest]) -> Up {
    durable_with(dir, server, agents, test_settings()).await
}

/// [`durable`] with `settings` (its workspace under `dir`).
async fn durable_with(
    dir: &std::path::Path,
    server: &LlmServer,
    agents: &[SpawnRequest],
    settings: KernelSettings,
) -> Up {
    let provider = server.provider();
    let settings = KernelSettings {
        workspace: Some(dir.join("workspace")),
        ..settings
    };
    let (registry, journal) = agent_registry(AgentSettings::default(), &ToolSettings::default());
    let (store, recovered) = open_store(dir).await;
    let started = Kernel::builder(settings)
        .runtimes(registry)
        .llm(Arc::new(provider))
        .store(store, recovered.clone())
        .agents(agents.iter().cloned().map(Declared::new).collect())
        .start()
        .await
        .unwrap();
    Up {
        kernel: started.kernel,
        journal,
        recovered,
        agents: started.agents,
        restored: started.restored,
    }
}

fn agent(name: &str, role: Role) -> SpawnRequest {
    let mut request = SpawnRequest::new(Pid::KERNEL, name);
    request.role = role;
    request.model = "test-model".into();
    request.runtime = Some("tool_agent".into());
    request.system_prompt = format!("You are {name}.");
    request
}

async fn run(kernel: &Kernel, pid: Pid, task: &str) -> String {
    let (_, reply) = kernel
        .execute_task(Caller::Admin, TaskSpec::new(pid, task))
        .await
        .unwrap();
    reply.unwrap()
}

/// Kills `pid` (a child of PID 1) and collects it, so it is reaped.
async fn kill_and_collect(kernel: &Kernel, pid: Pid) {
    kernel.kill(Caller::Admin, pid, "done").await.unwrap();
    kernel
        .wait_child(Caller::Admin, pid, Some(STEP))
        .await
        .unwrap();
}

/// Every user message the model was sent, in order, across all requests.
fn user_texts(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_keeps_its_pid_and_its_conversation_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = LlmServer::answering(|_: &Value| Scripted::content("noted")).await;

    let Up { kernel, agents, .. } =
        durable(dir.path(), &server, &[agent("queen", Role::Daemon)]).await;
    let queen = agents[0];
    run(&kernel, queen, "remember the word apricot").await;
    kernel.shutdown().await;

    let Up { kernel, agents, .. } =
        durable(dir.path(), &server, &[agent("queen", Role::Daemon)]).await;
    let again = agents[0];
    assert_eq!(again, queen, "a config agent comes back with its PID");
    run(&kernel, queen, "which word was it?").await;

    let last = server.requests().pop().unwrap();
    let users = user_texts(&last);
    assert_eq!(users.len(), 2, "{users:?}");
    assert!(users[0].contains("apricot"), "history lost: {users:?}");
    assert!(users[1].contains("which word"), "{users:?}");
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_clean_stop_every_process_is_back_and_unanswered_requests_fail() {
    let dir = tempfile::tempdir().unwrap();
    let server = LlmServer::answering(|_: &Value| Scripted::content("unused")).await;

    let mut lead = probe_request(Pid::KERNEL, "lead", Role::Lead);
    lead.role = Role::Lead;
    let Up { kernel, agents, .. } = durable(dir.path(), &server, std::slice::from_ref(&lead)).await;
    let lead_pid = agents[0];
    let (_, worker) = kernel
        .execute_task(
            Caller::Admin,
            TaskSpec::new(lead_pid, "spawn slowpoke worker"),
        )
        .await
        .unwrap();
    let worker = Pid(worker.unwrap().parse().unwrap());
    // The lead delegates a task the worker is still on when the kernel stops.
    let (_, request) = kernel
        .execute_task(
            Caller::Admin,
            TaskSpec::new(lead_pid, format!("delegate {} sleep 600000", worker.0)),
        )
        .await
        .unwrap();
    let request: u64 = request.unwrap().parse().unwrap();
    wait_until("the worker is on the task", STEP, || async {
        kernel
            .get_process(Caller::Admin, worker)
            .await
            .is_ok_and(|p| p.state == hivekernel_agents::ProcessState::Running)
    })
    .await;
    kernel.shutdown().await;

    let Up {
        kernel,
        journal,
        recovered,
        agents,
        restored,
        ..
    } = durable(dir.path(), &server, &[lead]).await;
    let alive: Vec<Pid> = recovered.processes.iter().map(|p| p.pid).collect();
    assert_eq!(alive, [lead_pid, worker], "a clean stop is not an exit");
    assert_eq!(recovered.requests.len(), 1, "{:?}", recovered.requests);
    let back = agents[0];
    assert_eq!(back, lead_pid);
    assert_eq!(
        restored,
        Restored {
            processes: 1,
            failed_requests: 1,
            ..Restored::default()
        }
    );
    wait_until("the lead hears of its request", STEP, || async {
        journal
            .of(lead_pid)
            .iter()
            .any(|m| m.kind == kinds::TASK_RESPONSE)
    })
    .await;
    let response = journal
        .of(lead_pid)
        .into_iter()
        .find(|m| m.kind == kinds::TASK_RESPONSE)
        .unwrap();
    let body: Value = serde_json::from_str(&response.payload).unwrap();
    assert_eq!(body["request_id"], request);
    assert_eq!(body["success"], false);
    assert!(
        body["error"].as_str().unwrap().contains(KERNEL_RESTART),
        "{body}"
    );
    let info = kernel.get_process(Caller::Admin, worker).await.unwrap();
    assert_eq!(
        (info.ppid, info.name.as_str(), info.role),
        (lead_pid, "slowpoke", Role::Worker),
        "the worker is back as it was"
    );
    // The event log says which task the restart failed.
    let events = kernel
        .store()
        .unwrap()
        .events_between(0, u64::MAX, 100_000)
        .await
        .unwrap();
    let failed = events
        .iter()
        .find(|e| e.pid == worker && e.kind.name() == "task_finished")
        .unwrap_or_else(|| panic!("no task_finished of {worker}: {events:?}"));
    let detail = serde_json::to_value(&failed.kind).unwrap();
    assert_eq!(detail["success"], false, "{detail}");
    assert!(
        detail["error"].as_str().unwrap().contains(KERNEL_RESTART),
        "{detail}"
    );
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_cannot_come_back_is_reported_to_its_restored_parent() {
    let dir = tempfile::tempdir().unwrap();
    let server = LlmServer::answering(|_: &Value| Scripted::content("unused")).await;
    let lead = probe_request(Pid::KERNEL, "lead", Role::Lead);
    let Up { kernel, agents, .. } = durable(dir.path(), &server, std::slice::from_ref(&lead)).await;
    let lead_pid = agents[0];
    let (_, child) = kernel
        .execute_task(
            Caller::Admin,
            TaskSpec::new(lead_pid, "spawn scratch worker"),
        )
        .await
        .unwrap();
    let child = Pid(child.unwrap().parse().unwrap());
    // A crash: the store has everything, but nothing was stopped.
    kernel.store().unwrap().flush().await.unwrap();
    let (_, recovered_now) = open_store(dir.path()).await;
    assert_eq!(
        recovered_now
            .processes
            .iter()
            .map(|p| p.pid)
            .collect::<Vec<_>>(),
        [lead_pid, child],
        "both alive in the store"
    );

    // The child is temporary, and temporary processes now stay dead.
    let settings = KernelSettings {
        restore_temporary: false,
        ..test_settings()
    };
    let Up {
        kernel: second,
        journal,
        agents,
        restored,
        ..
    } = durable_with(dir.path(), &server, &[lead], settings).await;
    let back = agents[0];
    assert_eq!(back, lead_pid);
    assert_eq!((restored.processes, restored.ended), (0, 1));
    wait_until("the lead hears of its child", STEP, || async {
        journal
            .of(lead_pid)
            .iter()
            .any(|m| m.kind == kinds::CHILD_EXITED)
    })
    .await;
    let notice = journal
        .of(lead_pid)
        .into_iter()
        .find(|m| m.kind == kinds::CHILD_EXITED)
        .unwrap();
    let record: ExitRecord = serde_json::from_str(&notice.payload).unwrap();
    assert_eq!(record.pid, child);
    assert!(
        record.reason.starts_with(KERNEL_RESTART) && record.reason.contains("restore_temporary"),
        "{}",
        record.reason
    );
    let fresh = second
        .spawn(
            Caller::Admin,
            probe_request(lead_pid, "fresh", Role::Worker),
        )
        .await
        .unwrap();
    assert!(fresh > child, "PID {fresh} handed out twice");
    second.shutdown().await;
    kernel.shutdown().await;
}

#[tokio::test]
async fn process_state_refuses_bad_keys_and_oversized_values() {
    let dir = tempfile::tempdir().unwrap();
    let server = LlmServer::answering(|_: &Value| Scripted::content("unused")).await;
    let Up { kernel, .. } = durable(dir.path(), &server, &[]).await;
    let pid = Pid(2);
    for key in [
        "",
        "a\nb",
        &"k".repeat(hivekernel_kernel::MAX_STATE_KEY_BYTES + 1),
    ] {
        let err = kernel.load_state(pid, key).await.unwrap_err();
        assert!(matches!(err, KernelError::InvalidArgument(_)), "{err}");
    }
    let big = "x".repeat(hivekernel_kernel::MAX_STATE_VALUE_BYTES + 1);
    let err = kernel.save_state(pid, "k", Some(big)).await.unwrap_err();
    assert!(err.to_string().contains("at most"), "{err}");
    assert_eq!(kernel.load_state(pid, "k").await.unwrap(), None);
    kernel.save_state(pid, "k", Some("v".into())).await.unwrap();
    assert_eq!(
        kernel.load_state(pid, "k").await.unwrap().as_deref(),
        Some("v")
    );
    kernel.save_state(pid, "k", None).await.unwrap();
    assert_eq!(kernel.load_state(pid, "k").await.unwrap(), None);
    kernel.shutdown().await;
}

/// A permanent `probe` lead under PID 1, restarted at most `max_restarts`
/// times a minute, after 1 to 10 ms.
fn phoenix(max_restarts: u32) -> SpawnRequest {
    let mut request = probe_request(Pid::KERNEL, "phoenix", Role::Lead);
    request.restart = Some(hivekernel_agents::RestartSpec {
        policy: hivekernel_agents::RestartPolicy::Permanent,
        max_restarts,
        within_seconds: 60,
        backoff_ms: [1, 10],
    });
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_process_is_alive_again_in_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let server = LlmServer::answering(|_: &Value| Scripted::content("unused")).await;
    let Up { kernel, .. } = durable(dir.path(), &server, &[]).await;
    let pid = kernel.spawn(Caller::Admin, phoenix(3)).await.unwrap();
    kernel
        .send_message(
            Caller::Admin,
            hivekernel_agents::Outgoing::new(pid, "crash"),
        )
        .await
        .unwrap();
    wait_until("the process is restarted", STEP, || async {
        kernel.get_process(Caller::Admin, pid).await.is_ok_and(|p| {
            p.restarts == 1 && p.state != hivekernel_agents::ProcessState::Restarting
        })
    })
    .await;
    kernel.store().unwrap().flush().await.unwrap();
    let (_, recovered) = open_store(dir.path()).await;
    assert_eq!(
        recovered
            .processes
            .iter()
            .map(|p| p.pid)
            .collect::<Vec<_>>(),
        [pid],
        "restarted, so alive: {recovered:?}"
    );
    assert!(recovered.zombies.is_empty(), "{recovered:?}");
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_loop_across_kernel_restarts_still_escalates_at_its_intensity() {
    let dir = tempfile::tempdir().unwrap();
    let server = LlmServer::answering(|_: &Value| Scripted::content("unused")).await;
    let Up { kernel, .. } = durable(dir.path(), &server, &[]).await;
    // One restart a minute; the second failure in the window escalates.
    let pid = kernel.spawn(Caller::Admin, phoenix(1)).await.unwrap();
    let crash = |kernel: Kernel| async move {
        kernel
            .send_message(
                Caller::Admin,
                hivekernel_agents::Outgoing::new(pid, "crash"),
            )
            .await
            .unwrap();
    };
    crash(kernel.clone()).await;
    wait_until("the process is restarted", STEP, || async {
        kernel.get_process(Caller::Admin, pid).await.is_ok_and(|p| {
            p.restarts == 1 && p.state != hivekernel_agents::ProcessState::Restarting
        })
    })
    .await;
    let first = kernel.get_process(Caller::Admin, pid).await.unwrap();
    let last_exit = first
        .last_exit
        .clone()
        .expect("the exit its restart followed");
    assert_ne!(last_exit.exit_code, 0, "{last_exit:?}");
    assert!(!first.restored);
    kernel.shutdown().await;

    let Up {
        kernel,
        recovered,
        restored,
        ..
    } = durable(dir.path(), &server, &[]).await;
    assert_eq!(restored.processes, 1);
    let kept = &recovered.history[&pid];
    assert_eq!(
        (kept.restarts, kept.recent_ms.len(), kept.pending),
        (1, 1, false)
    );
    let back = kernel.get_process(Caller::Admin, pid).await.unwrap();
    assert_eq!(back.restarts, 1, "its restart count came back");
    assert_eq!(back.last_exit, Some(last_exit), "and its last exit");
    assert!(back.restored);
    crash(kernel.clone()).await;
    wait_until("the process stays dead", STEP, || async {
        kernel
            .get_process(Caller::Admin, pid)
            .await
            .is_ok_and(|p| p.exit.is_some())
    })
    .await;
    kernel.store().unwrap().flush().await.unwrap();
    let events = kernel
        .store()
        .unwrap()
        .events_between(0, u64::MAX, 100_000)
        .await
        .unwrap();
    let kinds: Vec<&str> = events
        .iter()
        .filter(|e| e.kind.name() == "restarted" || e.kind.name() == "escalated")
        .map(|e| e.kind.name())
        .collect();
    assert_eq!(
        kinds,
        ["restarted", "escalated"],
        "the window outlived the restart"
    );
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_restart_does_not_refill_a_rate_limit() {
    let dir = tempfile::tempdir().unwrap();
    let server = LlmServer::answering(|_: &Value| Scripted::content("unused")).await;
    let mut lead = probe_request(Pid::KERNEL, "lead", Role::Lead);
    lead.limits.spawns_per_minute = Some(2);
    let Up { kernel, agents, .. } = durable(dir.path(), &server, std::slice::from_ref(&lead)).await;
    let pid = agents[0];
    let spawn = |kernel: Kernel, name: &'static str| async move {
        kernel
            .execute_task(
                Caller::Admin,
                TaskSpec::new(pid, format!("spawn {name} worker")),
            )
            .await
            .unwrap()
            .1
    };
    for name in ["one", "two"] {
        spawn(kernel.clone(), name).await.unwrap();
    }
    kernel.shutdown().await;

    let Up { kernel, agents, .. } = durable(dir.path(), &server, &[lead]).await;
    assert_eq!(agents[0], pid);
    let refused = spawn(kernel.clone(), "three").await.unwrap_err();
    assert!(refused.contains("spawns_per_minute"), "{refused}");
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_agent_keeps_its_artifacts_and_memory_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = LlmServer::answering(|_: &Value| Scripted::content("unused")).await;
    let keeper = || probe_request(Pid::KERNEL, "keeper", Role::Lead);

    let Up { kernel, agents, .. } = durable(dir.path(), &server, &[keeper()]).await;
    let pid = agents[0];
    let me = Caller::Process(pid);
    let mut private = NewArtifact::text("diary", "dear diary");
    private.visibility = Some(Visibility::Private);
    let diary = kernel.artifacts().store(me, None, private).await.unwrap();
    let worker = kernel
        .spawn(Caller::Admin, probe_request(pid, "worker", Role::Worker))
        .await
        .unwrap();
    let mut shared = NewArtifact::text("report", "for my parent");
    shared.visibility = Some(Visibility::Subtree);
    let report = kernel
        .artifacts()
        .store(Caller::Process(worker), None, shared)
        .await
        .unwrap();
    let note = NewMemory {
        text: "The release train leaves on Thursdays.".into(),
        key: Some("release".into()),
        tags: vec!["schedule".into()],
    };
    let remembered = kernel.memory().store(me, note).await.unwrap();
    kernel.shutdown().await;

    let Up { kernel, agents, .. } = durable(dir.path(), &server, &[keeper()]).await;
    let again = agents[0];
    assert_eq!(again, pid, "a config agent comes back with its PID");

    let got = kernel.artifacts().get(me, diary.id).await.unwrap();
    assert_eq!(got.content, b"dear diary");
    assert_eq!(got.info, diary);
    // The worker did not come back; its artifact did, and its parent still reads it.
    let got = kernel.artifacts().get(me, report.id).await.unwrap();
    assert_eq!(got.info.owner, worker);
    assert_eq!(got.content, b"for my parent");
    let hits = kernel
        .memory()
        .recall(me, "release train", None)
        .await
        .unwrap();
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(hits[0].entry, remembered);

    // Ids keep growing across the restart.
    let later = kernel
        .artifacts()
        .store(me, None, NewArtifact::text("later", "x"))
        .await
        .unwrap();
    assert!(later.id > report.id, "{later:?}");
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_agent_keeps_its_usage_and_what_its_budget_spent_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    // Every call costs 50 tokens, whatever it is asked.
    let server =
        LlmServer::answering(|_: &Value| Scripted::content_with_usage("done", 30, 20)).await;
    let thrifty = || {
        let mut request = agent("thrifty", Role::Lead);
        request.limits.max_tokens_total = Some(120);
        request
    };
    let usage_of = |kernel: &Kernel, pid: Pid| {
        let kernel = kernel.clone();
        async move { kernel.get_process(Caller::Admin, pid).await.unwrap() }
    };

    let Up { kernel, agents, .. } = durable(dir.path(), &server, &[thrifty()]).await;
    let pid = agents[0];
    run(&kernel, pid, "one").await;
    // A child without a budget of its own draws on its parent's.
    let mut helper = agent("helper", Role::Worker);
    helper.parent = pid;
    let child = kernel.spawn(Caller::Admin, helper).await.unwrap();
    run(&kernel, child, "two").await;
    let before = usage_of(&kernel, pid).await;
    assert_eq!(before.usage.total_tokens(), 50);
    assert_eq!(before.subtree_usage.total_tokens(), 100);
    assert_eq!(before.budget.unwrap().remaining, 20);
    kernel.shutdown().await;

    let Up {
        kernel,
        recovered,
        agents,
        ..
    } = durable(dir.path(), &server, &[thrifty()]).await;
    let kept: std::collections::BTreeSet<Pid> = recovered.usage.keys().copied().collect();
    assert_eq!(
        kept,
        [Pid::KERNEL, pid, child].into(),
        "{:?}",
        recovered.usage
    );
    assert_eq!(agents[0], pid);
    let back = usage_of(&kernel, child).await;
    assert_eq!(
        back.usage.total_tokens(),
        50,
        "the child is back with its usage"
    );
    let after = usage_of(&kernel, pid).await;
    assert_eq!(after.usage, before.usage, "its own calls are still counted");
    assert_eq!(after.subtree_usage, before.subtree_usage);
    let budget = after.budget.unwrap();
    assert_eq!(
        (budget.max_tokens_total, budget.used, budget.remaining),
        (120, 100, 20),
        "the restart did not give the spent tokens back"
    );
    let whole = usage_of(&kernel, Pid::KERNEL).await;
    assert_eq!(
        whole.subtree_usage.total_tokens(),
        100,
        "PID 1 counts the whole kernel"
    );

    // 20 tokens left: one more call, then the budget is spent for good.
    run(&kernel, pid, "three").await;
    let calls = server.request_count();
    let (_, reply) = kernel
        .execute_task(Caller::Admin, TaskSpec::new(pid, "four"))
        .await
        .unwrap();
    let err = reply.unwrap_err();
    assert!(err.starts_with("budget_exceeded: "), "{err}");
    assert_eq!(server.request_count(), calls, "no call past the budget");
    kernel.shutdown().await;

    let Up {
        kernel, recovered, ..
    } = durable(dir.path(), &server, &[]).await;
    assert_eq!(recovered.usage[&pid].subtree.total_tokens(), 150);
    assert_eq!(recovered.usage[&Pid::KERNEL].subtree.total_tokens(), 150);
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reaped_config_agent_comes_back_with_its_memory_usage_and_spent_budget() {
    let dir = tempfile::tempdir().unwrap();
    let server =
        LlmServer::answering(|_: &Value| Scripted::content_with_usage("done", 30, 20)).await;
    let keeper = |budget: Option<u64>| {
        let mut request = agent("keeper", Role::Lead);
        request.limits.max_tokens_total = budget;
        request
    };

    // First life: no budget of its own; one call, one note; then killed and collected.
    let Up { kernel, agents, .. } = durable(dir.path(), &server, &[keeper(None)]).await;
    let pid = agents[0];
    run(&kernel, pid, "one").await;
    let note = NewMemory {
        text: "The deploy key rotates monthly.".into(),
        key: Some("deploy".into()),
        tags: vec![],
    };
    kernel
        .memory()
        .store(Caller::Process(pid), note)
        .await
        .unwrap();
    kill_and_collect(&kernel, pid).await;
    kernel.shutdown().await;

    // Back as the same PID, now with a budget: it starts whole, since
    // nothing was spent from it; memory and usage are still there.
    let Up {
        kernel,
        recovered,
        agents,
        ..
    } = durable(dir.path(), &server, &[keeper(Some(120))]).await;
    assert_eq!(recovered.usage[&pid].budget_spent, None);
    let again = agents[0];
    assert_eq!(again, pid);
    let info = kernel.get_process(Caller::Admin, pid).await.unwrap();
    assert_eq!(
        info.usage.total_tokens(),
        50,
        "its usage outlived the reaping"
    );
    assert_eq!(info.budget.unwrap().remaining, 120);
    let hits = kernel
        .memory()
        .recall(Caller::Process(pid), "deploy key", None)
        .await
        .unwrap();
    assert_eq!(hits.len(), 1, "its memory outlived the reaping: {hits:?}");
    run(&kernel, pid, "two").await;
    kill_and_collect(&kernel, pid).await;
    kernel.shutdown().await;

    // What the budget spent comes back with it.
    let Up {
        kernel, recovered, ..
    } = durable(dir.path(), &server, &[keeper(Some(120))]).await;
    assert_eq!(recovered.usage[&pid].budget_spent, Some(50));
    let info = kernel.get_process(Caller::Admin, pid).await.unwrap();
    assert_eq!(info.usage.total_tokens(), 100);
    let budget = info.budget.unwrap();
    assert_eq!((budget.used, budget.remaining), (50, 70), "{budget:?}");
    kernel.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_log_keeps_the_newest_events_within_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (store, recovered) = open_store(dir.path()).await;
    let settings = KernelSettings {
        max_children: 10_000,
        event_log_limit: 1_000,
        ..test_settings()
    };
    let (runtimes, _) = hivekernel_tests::registry();
    let kernel = hivekernel_tests::start(
        Kernel::builder(settings)
            .runtimes(runtimes)
            .store(store.clone(), recovered.clone()),
    )
    .await;
    let lead = kernel
        .spawn(
            Caller::Admin,
            probe_request(Pid::KERNEL, "lead", Role::Lead),
        )
        .await
        .unwrap();
    for i in 0..4_000 {
        let mut request = SpawnRequest::new(lead, format!("w{i}"));
        request.runtime = Some("echo".into());
        kernel.spawn(Caller::Admin, request).await.unwrap();
    }
    kernel.kill(Caller::Admin, lead, "done").await.unwrap();
    store.flush().await.unwrap();
    // One more batch after the pruning point.
    kernel
        .spawn(
            Caller::Admin,
            probe_request(Pid::KERNEL, "late", Role::Agent),
        )
        .await
        .unwrap();
    store.flush().await.unwrap();
    let last = kernel.last_event_seq();
    assert!(last > 12_000, "{last}");
    kernel.shutdown().await;

    let db = rusqlite::Connection::open(dir.path().join("hivekernel.db")).unwrap();
    let (rows, first): (i64, i64) = db
        .query_row("SELECT count(*), min(seq) FROM events", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert!(rows < 12_000, "nothing pruned: {rows} rows");
    assert!(first > 1, "the oldest events are still there");
    let newest: i64 = db
        .query_row("SELECT max(seq) FROM events", [], |r| r.get(0))
        .unwrap();
    assert!(newest as u64 >= last, "the newest events were pruned");
    drop(db);

    // After a restart, a replay from the start says what it can no longer give.
    let pruned = first as u64 - 1;
    let (store, recovered) = open_store(dir.path()).await;
    assert_eq!(recovered.events_pruned_through, pruned);
    let (runtimes, _) = hivekernel_tests::registry();
    let kernel = hivekernel_tests::start(
        Kernel::builder(test_settings())
            .runtimes(runtimes)
            .store(store, recovered.clone()),
    )
    .await;
    let served = hivekernel_tests::served::Served::start(&kernel).await;
    let mut stream = served
        .admin()
        .subscribe_events(pb::SubscribeEventsRequest {
            since_seq: 0,
            replay: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let marker = stream.message().await.unwrap().unwrap();
    assert_eq!(
        (marker.seq, marker.r#type.as_str()),
        (0, "pruned"),
        "{marker:?}"
    );
    let detail: Value = serde_json::from_str(&marker.detail).unwrap();
    assert_eq!(detail["missed"], pruned, "{detail}");
    let oldest = stream.message().await.unwrap().unwrap();
    assert_eq!(
        oldest.seq,
        pruned + 1,
        "the replay goes on from the oldest kept"
    );
    // A replay from within the log has nothing to report.
    let mut stream = served
        .admin()
        .subscribe_events(pb::SubscribeEventsRequest {
            since_seq: pruned,
            replay: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let next = stream.message().await.unwrap().unwrap();
    assert_eq!(next.seq, pruned + 1, "{next:?}");
    drop(stream);
    kernel.shutdown().await;
    served.stopped().await;
}
