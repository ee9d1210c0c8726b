//! Cron end to end under a paused clock: real kernels, real `probe` agents,
//! real SQLite stores; time moves only when the test says so.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use hivekernel_agents::{Pid, Role};
use hivekernel_kernel::config::KernelSettings;
use hivekernel_kernel::cron::{CronAction, CronInfo, CronSpec, Missed, Overlap};
use hivekernel_kernel::{Caller, Declared, Kernel, KernelError};
use hivekernel_tests::{granting_all, open_store, registry, spawn_probe, test_settings};

/// Every ten seconds, on the wall clock's multiples of ten.
const EVERY_10_S: &str = "*/10 * * * * *";

/// Leads and agents here schedule their own entries.
fn settings() -> KernelSettings {
    let settings = KernelSettings {
        task_timeout_seconds: 120,
        ..test_settings()
    };
    granting_all(settings, &[Role::Lead, Role::Agent])
}

fn spec(name: &str, target: Pid, description: &str) -> CronSpec {
    CronSpec {
        name: name.into(),
        expression: EVERY_10_S.into(),
        action: CronAction::Execute,
        target,
        template: None,
        description: description.into(),
        enabled: true,
        overlap: Overlap::Skip,
        missed: Missed::Skip,
        approvals: Vec::new(),
    }
}

/// A kernel on the store in `dir` with one config agent, a probe named
/// `agent`, brought up as `hivekernel start` does (its cron clock that of
/// `earlier`, when given); what the store read back, and the cron entries
/// it could not load.
async fn durable(
    dir: &std::path::Path,
    earlier: Option<&Kernel>,
) -> (
    Kernel,
    Pid,
    hivekernel_kernel::store::Recovered,
    Vec<String>,
) {
    declaring(dir, earlier, Vec::new()).await
}

/// [`durable`], its agent declaring `cron` in the config.
async fn declaring(
    dir: &std::path::Path,
    earlier: Option<&Kernel>,
    cron: Vec<CronSpec>,
) -> (
    Kernel,
    Pid,
    hivekernel_kernel::store::Recovered,
    Vec<String>,
) {
    let (store, recovered) = open_store(dir).await;
    let (runtimes, _) = registry();
    let mut agent = Declared::new(hivekernel_tests::probe_request(
        Pid::KERNEL,
        "agent",
        Role::Agent,
    ));
    agent.cron = cron;
    let mut builder = Kernel::builder(settings())
        .runtimes(runtimes)
        .store(store, recovered.clone())
        .agents(vec![agent]);
    if let Some(earlier) = earlier {
        builder = builder.cron_clock_of(earlier);
    }
    let started = builder.start().await.unwrap();
    (
        started.kernel,
        started.agents[0],
        recovered,
        started.cron_problems,
    )
}

fn info(kernel: &Kernel, name: &str) -> CronInfo {
    kernel
        .cron()
        .list(Caller::Admin)
        .into_iter()
        .find(|i| i.spec.name == name)
        .unwrap_or_else(|| panic!("no cron entry {name}"))
}

/// Slots of a 10 s schedule in `(from, to]`.
fn slots(from: u64, to: u64) -> u64 {
    to / 10_000 - from / 10_000
}

/// Lets time pass on the paused clock, in steps, so work scheduled meanwhile
/// runs; each step also gives the store's writer thread a real millisecond,
/// since the paused clock does not wait for threads.
async fn pass(ms: u64) {
    for _ in 0..ms / 100 {
        std::thread::sleep(Duration::from_millis(1));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn statuses(info: &CronInfo) -> Vec<&str> {
    info.history.iter().map(|r| r.status.as_str()).collect()
}

#[tokio::test(start_paused = true)]
async fn an_entry_runs_its_task_at_every_slot_and_keeps_the_answers() {
    let (runtimes, _) = registry();
    let kernel = hivekernel_tests::start(Kernel::builder(settings()).runtimes(runtimes)).await;
    let agent = spawn_probe(&kernel, Pid::KERNEL, "agent", Role::Agent).await;
    let start = kernel.cron().now_ms();
    let added = kernel
        .cron()
        .add(Caller::Admin, spec("tick", agent, "tock"))
        .await
        .unwrap();
    assert_eq!(added.next_run_unix_ms, Some((start / 10_000 + 1) * 10_000));

    pass(35_000).await;
    let now = kernel.cron().now_ms();
    let tick = info(&kernel, "tick");
    assert_eq!(tick.runs, slots(start, now), "{tick:?}");
    assert!(
        tick.history
            .iter()
            .all(|r| r.status == "ok" && r.output == "tock")
    );
    let at: Vec<u64> = tick.history.iter().map(|r| r.at_unix_ms).collect();
    assert!(at.iter().all(|t| t % 10_000 == 0), "{at:?}");
    assert!(tick.next_run_unix_ms.unwrap() > now);
    kernel.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_slot_that_comes_while_the_last_run_goes_on_is_skipped_unless_overlap_is_allowed() {
    let (runtimes, _) = registry();
    let kernel = hivekernel_tests::start(Kernel::builder(settings()).runtimes(runtimes)).await;
    let agent = spawn_probe(&kernel, Pid::KERNEL, "agent", Role::Agent).await;
    let mut slow = spec("slow", agent, "sleep 25000");
    kernel
        .cron()
        .add(Caller::Admin, slow.clone())
        .await
        .unwrap();
    slow.name = "slow-overlapping".into();
    slow.overlap = Overlap::Allow;
    kernel.cron().add(Caller::Admin, slow).await.unwrap();

    // From the first slot: +10 and +20 come while its run (25 s) goes on.
    let first = info(&kernel, "slow").next_run_unix_ms.unwrap();
    let wait = first.saturating_sub(kernel.cron().now_ms()) + 26_000;
    pass(wait).await;

    let skip = info(&kernel, "slow");
    assert_eq!(statuses(&skip), ["skipped", "skipped", "ok"], "{skip:?}");
    let allow = info(&kernel, "slow-overlapping");
    assert_eq!(statuses(&allow), ["ok"], "{allow:?}");
    assert!(allow.running, "the later runs are still going");
    kernel.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn slots_missed_while_down_are_skipped_or_run_once_and_entries_survive() {
    let dir = tempfile::tempdir().unwrap();
    let (first, agent, _, _) = durable(dir.path(), None).await;
    first
        .cron()
        .add(Caller::Admin, spec("skipper", agent, "s"))
        .await
        .unwrap();
    let mut once = spec("catcher", agent, "c");
    once.missed = Missed::RunOnce;
    first.cron().add(Caller::Admin, once).await.unwrap();
    pass(12_000).await;
    assert!(info(&first, "catcher").runs >= 1);
    let last = info(&first, "catcher").last_run_unix_ms.unwrap();
    first.shutdown().await;

    // A minute of downtime: six slots pass.
    pass(60_000).await;

    let (second, back, recovered, problems) = durable(dir.path(), Some(&first)).await;
    assert_eq!(back, agent);
    assert_eq!(recovered.cron.len(), 2);
    assert!(problems.is_empty(), "{problems:?}");
    pass(500).await;

    // Waiting on the store lets the paused clock jump, so regular slots may
    // have run too; the catch-up is the one run off the 10 s grid.
    let catcher = info(&second, "catcher");
    let catch_up: Vec<_> = catcher
        .history
        .iter()
        .filter(|r| r.at_unix_ms > last + 60_000 && r.at_unix_ms % 10_000 != 0)
        .collect();
    assert_eq!(catch_up.len(), 1, "{catcher:?}");
    assert_eq!(catch_up[0].status, "ok");
    let skipper = info(&second, "skipper");
    let missed: Vec<_> = skipper
        .history
        .iter()
        .filter(|r| r.status == "missed")
        .collect();
    assert_eq!(missed.len(), 1, "{skipper:?}");
    assert!(
        skipper
            .history
            .iter()
            .all(|r| r.status != "ok" || r.at_unix_ms % 10_000 == 0),
        "the skipper caught up: {skipper:?}"
    );
    second.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_slot_fired_before_a_crash_is_not_fired_again_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let (first, agent, _, _) = durable(dir.path(), None).await;
    first
        .cron()
        .add(Caller::Admin, spec("long", agent, "sleep 100000"))
        .await
        .unwrap();
    // Waiting on the store lets the paused clock jump: take the slot that
    // fired, whichever it was.
    pass(12_000).await;
    let fired = info(&first, "long");
    assert!(fired.running, "{fired:?}");
    let slot = fired.last_run_unix_ms.unwrap();
    // The crash: the store has the slot, nothing else finished.
    first.store().unwrap().flush().await.unwrap();

    let (second, back, _, _) = durable(dir.path(), Some(&first)).await;
    let long = info(&second, "long");
    assert!(long.last_run_unix_ms >= Some(slot), "{long:?}");
    assert!(long.next_run_unix_ms.unwrap() > slot, "{long:?}");
    pass(2_000).await;
    // Waiting on the store may let the paused clock reach later slots; the
    // one fired before the crash must never run again.
    let long = info(&second, "long");
    // The first kernel's own run of the slot may have finished and been
    // recorded meanwhile; a second record of it would be a second firing.
    let records = long.history.iter().filter(|r| r.at_unix_ms == slot).count();
    assert!(
        records <= 1,
        "slot {slot} ran again after the restart: {long:?}"
    );
    assert_eq!(back, agent);
    second.shutdown().await;
    first.shutdown().await;
}

#[tokio::test]
async fn bad_entries_are_refused_and_change_nothing() {
    let (runtimes, _) = registry();
    let kernel = hivekernel_tests::start(Kernel::builder(settings()).runtimes(runtimes)).await;
    let agent = spawn_probe(&kernel, Pid::KERNEL, "agent", Role::Lead).await;
    let other = spawn_probe(&kernel, Pid::KERNEL, "other", Role::Agent).await;
    let child = kernel
        .spawn(
            Caller::Admin,
            hivekernel_tests::probe_request(agent, "child", Role::Worker),
        )
        .await
        .unwrap();
    let cases: Vec<(CronSpec, Caller, &str)> = vec![
        (spec("", agent, "x"), Caller::Admin, "cron name"),
        (
            CronSpec {
                expression: "* * *".into(),
                ..spec("e", agent, "x")
            },
            Caller::Admin,
            "got 3",
        ),
        (
            CronSpec {
                expression: "99 * * * *".into(),
                ..spec("e", agent, "x")
            },
            Caller::Admin,
            "cannot parse",
        ),
        (
            CronSpec {
                action: CronAction::Spawn,
                ..spec("s", agent, "x")
            },
            Caller::Admin,
            "needs a template",
        ),
        (
            CronSpec {
                action: CronAction::Spawn,
                template: Some("ghost".into()),
                ..spec("s", agent, "x")
            },
            Caller::Admin,
            "unknown template \"ghost\"",
        ),
        (
            spec("k", Pid::KERNEL, "x"),
            Caller::Admin,
            "aim at an agent",
        ),
        (spec("n", Pid(999), "x"), Caller::Admin, "999"),
        (
            spec("p", other, "x"),
            Caller::Process(agent),
            "only schedule cron",
        ),
    ];
    for (spec, caller, says) in cases {
        let err = kernel.cron().add(caller, spec.clone()).await.unwrap_err();
        assert!(err.to_string().contains(says), "{spec:?}: {err}");
    }
    assert!(kernel.cron().list(Caller::Admin).is_empty());

    // A process may schedule for its descendants; names are unique.
    kernel
        .cron()
        .add(Caller::Process(agent), spec("mine", child, "x"))
        .await
        .unwrap();
    let dup = kernel
        .cron()
        .add(Caller::Admin, spec("mine", agent, "y"))
        .await
        .unwrap_err();
    assert!(dup.to_string().contains("already exists"), "{dup}");
    assert_eq!(kernel.cron().list(Caller::Process(agent)).len(), 1);
    assert!(kernel.cron().list(Caller::Process(other)).is_empty());
    let denied = kernel
        .cron()
        .remove(Caller::Process(other), "mine")
        .await
        .unwrap_err();
    assert!(
        matches!(denied, KernelError::PermissionDenied(_)),
        "{denied}"
    );
    let missing = kernel
        .cron()
        .remove(Caller::Admin, "ghost")
        .await
        .unwrap_err();
    assert!(matches!(missing, KernelError::NoSuchCron(_)), "{missing}");
    kernel
        .cron()
        .remove(Caller::Process(agent), "mine")
        .await
        .unwrap();
    assert!(kernel.cron().list(Caller::Admin).is_empty());
    kernel.shutdown().await;
}

#[tokio::test]
async fn the_cron_tools_schedule_list_and_remove_as_the_calling_process() {
    use hivekernel_agents::tools::{ToolContext, ToolRegistry};
    use serde_json::json;

    let (kernel, process) =
        hivekernel_tests::capture::captured_process_with("planner", settings()).await;
    let tools = ToolRegistry::builtin();
    let call = |tool: &'static str, args: serde_json::Value| {
        let tools = &tools;
        let process = &process;
        async move {
            let ctx = ToolContext {
                process,
                workspace: None,
                checkpoint: None,
            };
            tools.get(tool).unwrap().call(&ctx, args).await
        }
    };
    let scheduled = call(
        "schedule_cron",
        json!({"name": "nightly", "expression": "0 3 * * *", "task": "tidy up"}),
    )
    .await
    .unwrap();
    assert!(scheduled.starts_with("scheduled nightly"), "{scheduled}");
    let entries = kernel.cron().list(Caller::Admin);
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].owner, process.pid);
    assert_eq!(entries[0].spec.target, process.pid);

    let listed: serde_json::Value =
        serde_json::from_str(&call("list_cron", json!({})).await.unwrap()).unwrap();
    assert_eq!(listed[0]["name"], "nightly");
    assert_eq!(listed[0]["pid"], process.pid.0);

    for (args, says) in [
        (
            json!({"name": "x", "expression": "* *", "task": "t"}),
            "got 2",
        ),
        (
            json!({"name": "x", "expression": "@daily", "task": "t", "pid": 1}),
            "aim at an agent",
        ),
        (
            json!({"name": "x", "expression": "@daily", "task": "t", "action": "launch"}),
            "action",
        ),
        (json!({"name": "x", "expression": "@daily"}), "task"),
        (
            json!({"name": "nightly", "expression": "@daily", "task": "t"}),
            "already exists",
        ),
    ] {
        let err = call("schedule_cron", args.clone()).await.unwrap_err();
        assert!(err.to_string().contains(says), "{args}: {err}");
    }
    assert_eq!(kernel.cron().list(Caller::Admin).len(), 1);

    assert_eq!(
        call("remove_cron", json!({"name": "nightly"}))
            .await
            .unwrap(),
        "removed nightly"
    );
    assert!(kernel.cron().list(Caller::Admin).is_empty());
    let gone = call("remove_cron", json!({"name": "nightly"}))
        .await
        .unwrap_err();
    assert!(gone.to_string().contains("no cron entry"), "{gone}");
    kernel.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_spawn_action_runs_a_fresh_agent_from_a_template_and_reaps_it() {
    let (runtimes, _) = registry();
    let template = hivekernel_tests::probe_request(Pid::KERNEL, "checker", Role::Task);
    let kernel = hivekernel_tests::start(
        Kernel::builder(settings())
            .runtimes(runtimes)
            .cron_templates([("checker".to_owned(), template)].into()),
    )
    .await;
    let lead = spawn_probe(&kernel, Pid::KERNEL, "lead", Role::Lead).await;
    let mut entry = spec("audit", lead, "all clear");
    entry.action = CronAction::Spawn;
    entry.template = Some("checker".into());
    kernel.cron().add(Caller::Admin, entry).await.unwrap();

    pass(25_000).await;
    let audit = info(&kernel, "audit");
    assert!(audit.runs >= 2, "{audit:?}");
    assert!(
        audit
            .history
            .iter()
            .all(|r| r.status == "ok" && r.output == "all clear"),
        "{audit:?}"
    );
    let left = kernel
        .list_processes(Caller::Admin, lead, None)
        .await
        .unwrap();
    assert_eq!(left.len(), 1, "spawned agents left behind: {left:?}");
    kernel.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_name_changes_hands_cleanly_and_only_its_latest_entry_fires() {
    let (runtimes, _) = registry();
    let kernel = hivekernel_tests::start(Kernel::builder(settings()).runtimes(runtimes)).await;
    let agent = spawn_probe(&kernel, Pid::KERNEL, "agent", Role::Agent).await;
    // Two adds of one name at once: exactly one wins.
    let (a, b) = tokio::join!(
        kernel.cron().add(Caller::Admin, spec("x", agent, "first")),
        kernel.cron().add(Caller::Admin, spec("x", agent, "second")),
    );
    assert_eq!(a.is_ok() as u8 + b.is_ok() as u8, 1, "{a:?} {b:?}");
    // Removed and added again with another schedule before its slot: the
    // old slot must neither fire nor linger.
    kernel.cron().remove(Caller::Admin, "x").await.unwrap();
    let mut again = spec("x", agent, "third");
    again.expression = "0 0 * * * *".into();
    let added = kernel.cron().add(Caller::Admin, again).await.unwrap();
    pass(25_000).await;
    let x = info(&kernel, "x");
    assert_eq!(x.spec.description, "third");
    let hour = added.next_run_unix_ms.unwrap();
    assert!(
        x.history.iter().all(|r| r.at_unix_ms == hour),
        "a slot of the removed entry fired: {x:?}"
    );
    assert!(!x.running);
    kernel.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_entry_is_switched_off_and_on_and_run_now_by_whoever_may_change_it() {
    let (runtimes, _) = registry();
    let kernel = hivekernel_tests::start(Kernel::builder(settings()).runtimes(runtimes)).await;
    let agent = spawn_probe(&kernel, Pid::KERNEL, "agent", Role::Agent).await;
    let other = spawn_probe(&kernel, Pid::KERNEL, "other", Role::Agent).await;
    kernel
        .cron()
        .add(Caller::Admin, spec("tick", agent, "tock"))
        .await
        .unwrap();

    let off = kernel
        .cron()
        .set_enabled(Caller::Admin, "tick", false)
        .await
        .unwrap();
    assert!(!off.spec.enabled && !off.switched, "{off:?}");
    assert_eq!(off.next_run_unix_ms, None);
    pass(25_000).await;
    assert_eq!(info(&kernel, "tick").runs, 0, "a disabled entry fired");

    // Run now: enabled or not, once, and the schedule stays off.
    let started = kernel.cron().run_now(Caller::Admin, "tick").await.unwrap();
    assert!(started.running, "{started:?}");
    pass(1_000).await;
    let tick = info(&kernel, "tick");
    assert_eq!((tick.runs, statuses(&tick)), (1, vec!["ok"]), "{tick:?}");
    assert_eq!(tick.history[0].output, "tock");
    assert_eq!(tick.next_run_unix_ms, None);

    let on = kernel
        .cron()
        .set_enabled(Caller::Admin, "tick", true)
        .await
        .unwrap();
    assert!(on.spec.enabled && on.next_run_unix_ms.unwrap() > kernel.cron().now_ms());
    // Switching to what it is already changes nothing.
    let again = kernel
        .cron()
        .set_enabled(Caller::Admin, "tick", true)
        .await
        .unwrap();
    assert_eq!(again.next_run_unix_ms, on.next_run_unix_ms);

    // A process changes only its own entries.
    kernel
        .cron()
        .add(Caller::Process(agent), spec("own", agent, "mine"))
        .await
        .unwrap();
    for result in [
        kernel
            .cron()
            .set_enabled(Caller::Process(other), "own", false)
            .await,
        kernel.cron().run_now(Caller::Process(other), "own").await,
    ] {
        assert!(
            matches!(result, Err(KernelError::PermissionDenied(_))),
            "{result:?}"
        );
    }
    assert!(info(&kernel, "own").spec.enabled);
    let off = kernel
        .cron()
        .set_enabled(Caller::Process(agent), "own", false)
        .await
        .unwrap();
    assert!(!off.spec.enabled);
    let missing = kernel.cron().run_now(Caller::Admin, "nope").await;
    assert!(
        matches!(missing, Err(KernelError::NoSuchCron(_))),
        "{missing:?}"
    );

    // While a run of an entry that skips overlaps goes on, run now is refused.
    let mut slow = spec("slow", agent, "sleep 5000");
    slow.enabled = false;
    kernel.cron().add(Caller::Admin, slow).await.unwrap();
    kernel.cron().run_now(Caller::Admin, "slow").await.unwrap();
    let busy = kernel.cron().run_now(Caller::Admin, "slow").await;
    match busy {
        Err(KernelError::FailedPrecondition(why)) => assert!(why.contains("running"), "{why}"),
        other => panic!("{other:?}"),
    }
    pass(6_000).await;
    assert_eq!(statuses(&info(&kernel, "slow")), ["ok"]);
    kernel.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_config_entry_switched_by_hand_stays_so_across_restarts_until_the_config_changes_it() {
    let dir = tempfile::tempdir().unwrap();
    let declared = |description: &str| {
        let mut entry = spec("nightly", Pid::KERNEL, description);
        entry.expression = "0 0 3 * * *".into();
        vec![entry]
    };
    let (first, agent, _, _) = declaring(dir.path(), None, declared("report")).await;
    let off = first
        .cron()
        .set_enabled(Caller::Admin, "nightly", false)
        .await
        .unwrap();
    assert!(!off.spec.enabled && off.switched && off.next_run_unix_ms.is_none());
    // Still the config's to remove.
    let removed = first.cron().remove(Caller::Admin, "nightly").await;
    assert!(
        matches!(removed, Err(KernelError::FailedPrecondition(_))),
        "{removed:?}"
    );
    first.shutdown().await;

    // The config as it was: the switch holds.
    let (second, back, _, problems) = declaring(dir.path(), Some(&first), declared("report")).await;
    assert_eq!((back, problems.len()), (agent, 0));
    let kept = info(&second, "nightly");
    assert!(!kept.spec.enabled && kept.switched, "{kept:?}");
    assert_eq!(kept.next_run_unix_ms, None);
    // Back to as declared by hand: no switch left.
    let on = second
        .cron()
        .set_enabled(Caller::Admin, "nightly", true)
        .await
        .unwrap();
    assert!(on.spec.enabled && !on.switched && on.next_run_unix_ms.is_some());
    second
        .cron()
        .set_enabled(Caller::Admin, "nightly", false)
        .await
        .unwrap();
    second.shutdown().await;

    // The config changed the entry: its word wins.
    let (third, _, _, _) = declaring(dir.path(), Some(&second), declared("a new report")).await;
    let changed = info(&third, "nightly");
    assert!(changed.spec.enabled && !changed.switched, "{changed:?}");
    assert_eq!(changed.spec.description, "a new report");
    assert!(changed.next_run_unix_ms.is_some());
    third.shutdown().await;
}
