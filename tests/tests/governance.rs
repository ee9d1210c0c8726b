//! Governance: capabilities from the shipped config, tools and budgets that
//! never grow down the tree, token budgets charged from the provider's usage,
//! cost per process and subtree, rate limits, and process tokens over gRPC.
//! A real kernel, a real gRPC server and a real chat-completions server on loopback.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use hivekernel_agents::tool_agent::AgentSettings;
use hivekernel_agents::tools::ToolSettings;
use hivekernel_agents::{
    BudgetInfo, Capability, ErrorKind, LimitOverrides, Pid, Role, SpawnRequest,
};
use hivekernel_kernel::config::{Config, KernelSettings};
use hivekernel_kernel::events::EventKind;
use hivekernel_kernel::{Caller, Kernel, KernelError, Price, RuntimeRegistry};
use hivekernel_proto::v1 as pb;
use hivekernel_tests::llm_server::{LlmServer, Scripted};
use hivekernel_tests::served::Served;
use hivekernel_tests::{agent_kernel, registry, run_task, test_settings};
use tonic::Code;

const ROOT: Pid = Pid::KERNEL;
const MODEL: &str = "test-model";

/// Settings whose roles are the shipped config's (`configs/startup.json`).
fn shipped_settings() -> KernelSettings {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/startup.json");
    let known = RuntimeRegistry::builtin().known();
    let config = Config::load(&path, &known).unwrap();
    KernelSettings {
        roles: config.kernel.roles,
        ..test_settings()
    }
}

/// A kernel whose agents talk to `server`; `test-model` costs $2.50 / $10 per million tokens.
async fn llm_kernel(server: &LlmServer, dir: &tempfile::TempDir) -> Kernel {
    let settings = KernelSettings {
        workspace: Some(dir.path().to_owned()),
        prices: [(
            MODEL.to_owned(),
            Price {
                input_per_million: 2.5,
                output_per_million: 10.0,
            },
        )]
        .into(),
        ..test_settings()
    };
    let provider = Arc::new(server.provider());
    agent_kernel(
        settings,
        provider,
        AgentSettings::default(),
        &ToolSettings::default(),
    )
    .await
    .0
}

fn request(parent: Pid, name: &str, role: Role, runtime: &str) -> SpawnRequest {
    let mut request = SpawnRequest::new(parent, name);
    request.role = role;
    request.runtime = Some(runtime.into());
    request.model = MODEL.into();
    request
}

fn with_budget(mut request: SpawnRequest, tokens: u64) -> SpawnRequest {
    request.limits.max_tokens_total = Some(tokens);
    request
}

fn with_tools(mut request: SpawnRequest, tools: &[&str]) -> SpawnRequest {
    request.tools = tools.iter().map(|t| (*t).to_owned()).collect();
    request
}

async fn budget(kernel: &Kernel, pid: Pid) -> BudgetInfo {
    let info = kernel.get_process(Caller::Admin, pid).await.unwrap();
    info.budget.unwrap()
}

async fn pids(kernel: &Kernel) -> Vec<Pid> {
    let all = kernel.list_processes(Caller::Admin, ROOT, None).await;
    all.unwrap().into_iter().map(|p| p.pid).collect()
}

/// Every `denied` event so far: (pid, action, reason).
fn denials(kernel: &Kernel) -> Vec<(Pid, String, String)> {
    let events = kernel.subscribe(Some(0)).replay;
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::Denied { action, reason } => {
                Some((event.pid, action.clone(), reason.clone()))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn budgets_are_lent_by_the_parent_charged_from_provider_usage_and_returned_on_exit() {
    let server = LlmServer::start(vec![Scripted::content_with_usage("done", 120, 30)]).await;
    let dir = tempfile::tempdir().unwrap();
    let kernel = llm_kernel(&server, &dir).await;
    let lead = request(ROOT, "lead", Role::Lead, "probe");
    let lead = kernel
        .spawn(Caller::Admin, with_budget(lead, 1000))
        .await
        .unwrap();
    let child = request(lead, "child", Role::Worker, "tool_agent");
    let child = kernel
        .spawn(Caller::Admin, with_budget(child, 400))
        .await
        .unwrap();
    assert_eq!(budget(&kernel, lead).await.remaining, 600, "400 lent");

    assert_eq!(run_task(&kernel, child, "work").await.unwrap(), "done");
    let spent = budget(&kernel, child).await;
    assert_eq!(
        (spent.owner, spent.used, spent.remaining),
        (child, 150, 250)
    );

    // More than the parent has left: refused, nothing changes, and it is reported.
    let before = pids(&kernel).await;
    let greedy = with_budget(request(lead, "greedy", Role::Worker, "probe"), 601);
    let err = kernel.spawn(Caller::Admin, greedy).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied);
    let expected = format!("601 exceeds the 600 tokens left in the budget of process {lead}");
    assert!(err.to_string().contains(&expected), "{err}");
    assert_eq!(pids(&kernel).await, before);
    assert_eq!(budget(&kernel, lead).await.remaining, 600);
    assert!(
        denials(&kernel)
            .iter()
            .any(|(pid, action, reason)| *pid == lead
                && action == "spawn"
                && reason.contains(&expected)),
        "{:?}",
        denials(&kernel)
    );

    // A process without a budget of its own draws on its parent's.
    let sharer = kernel
        .spawn(
            Caller::Admin,
            request(lead, "sharer", Role::Worker, "probe"),
        )
        .await
        .unwrap();
    assert_eq!(budget(&kernel, sharer).await.owner, lead);

    // The child exits: its 250 unused tokens go back.
    kernel.kill(Caller::Admin, child, "done").await.unwrap();
    let back = budget(&kernel, lead).await;
    assert_eq!((back.used, back.remaining), (150, 850));
    kernel.shutdown().await;
}

#[tokio::test]
async fn an_exhausted_budget_ends_the_task_with_budget_exceeded_and_calls_no_model() {
    let server = LlmServer::start(vec![
        Scripted::content_with_usage("first", 90, 20),
        Scripted::content_with_usage("never", 1, 1),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let kernel = llm_kernel(&server, &dir).await;
    let agent = request(ROOT, "thrifty", Role::Agent, "tool_agent");
    let agent = kernel
        .spawn(Caller::Admin, with_budget(agent, 100))
        .await
        .unwrap();

    assert_eq!(run_task(&kernel, agent, "one").await.unwrap(), "first");
    // The answer may not take more than the budget has left.
    assert_eq!(server.requests()[0]["max_tokens"], 100);
    let err = run_task(&kernel, agent, "two").await.unwrap_err();
    assert!(err.starts_with("budget_exceeded: "), "{err}");
    assert!(err.contains("max_tokens_total 100"), "{err}");
    assert_eq!(server.request_count(), 1, "no call past the budget");
    let info = kernel.get_process(Caller::Admin, agent).await.unwrap();
    assert_eq!(
        info.usage.total_tokens(),
        110,
        "charged what the provider reported"
    );
    assert_eq!(info.budget.unwrap().remaining, 0);
    assert!(
        denials(&kernel)
            .iter()
            .any(|(pid, action, _)| *pid == agent && action == "llm_call")
    );
    kernel.shutdown().await;
}

#[tokio::test]
async fn cost_comes_from_the_price_table_per_process_and_per_subtree() {
    let server = LlmServer::start(vec![Scripted::content_with_usage("ok", 1000, 100)]).await;
    let dir = tempfile::tempdir().unwrap();
    let kernel = llm_kernel(&server, &dir).await;
    let lead = kernel
        .spawn(Caller::Admin, request(ROOT, "lead", Role::Lead, "probe"))
        .await
        .unwrap();
    let child = kernel
        .spawn(
            Caller::Admin,
            request(lead, "child", Role::Worker, "tool_agent"),
        )
        .await
        .unwrap();
    run_task(&kernel, child, "work").await.unwrap();

    // 1000 * $2.50/M + 100 * $10/M = $0.0035.
    let own = kernel.get_process(Caller::Admin, child).await.unwrap();
    assert_eq!(own.usage.cost_nano_usd, 3_500_000);
    assert!((own.usage.cost_usd() - 0.0035).abs() < 1e-12);
    let parent = kernel.get_process(Caller::Admin, lead).await.unwrap();
    assert_eq!(parent.usage.cost_nano_usd, 0, "the lead made no call");
    assert_eq!(parent.subtree_usage.cost_nano_usd, 3_500_000);
    assert_eq!(parent.subtree_usage.total_tokens(), 1100);

    // An exited child still counts in its ancestors' subtrees.
    kernel.kill(Caller::Admin, child, "done").await.unwrap();
    kernel.wait_child(Caller::Admin, child, None).await.ok();
    let parent = kernel.get_process(Caller::Admin, lead).await.unwrap();
    assert_eq!(parent.subtree_usage.cost_nano_usd, 3_500_000);
    let kernel_info = kernel.get_process(Caller::Admin, ROOT).await.unwrap();
    assert_eq!(kernel_info.subtree_usage.total_tokens(), 1100);
    kernel.shutdown().await;
}

#[tokio::test]
async fn rate_limits_refuse_spawns_and_model_calls_past_the_allowance() {
    let server = LlmServer::start(vec![
        Scripted::content_with_usage("one", 1, 1),
        Scripted::content_with_usage("two", 1, 1),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let kernel = llm_kernel(&server, &dir).await;

    let mut lead = request(ROOT, "lead", Role::Lead, "probe");
    lead.limits.spawns_per_minute = Some(2);
    let lead = kernel.spawn(Caller::Admin, lead).await.unwrap();
    run_task(&kernel, lead, "spawn a").await.unwrap();
    run_task(&kernel, lead, "spawn b").await.unwrap();
    let before = pids(&kernel).await;
    let err = run_task(&kernel, lead, "spawn c").await.unwrap_err();
    assert!(err.contains("rate limit spawns_per_minute = 2"), "{err}");
    assert_eq!(pids(&kernel).await, before);
    // A child may not ask for a higher rate than its parent.
    let mut wide = request(lead, "wide", Role::Worker, "probe");
    wide.limits.spawns_per_minute = Some(3);
    let err = kernel.spawn(Caller::Admin, wide).await.unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::LimitExceedsParent {
                field: "spawns_per_minute",
                ..
            }
        ),
        "{err}"
    );

    let mut agent = request(ROOT, "chatty", Role::Agent, "tool_agent");
    agent.limits.llm_calls_per_minute = Some(1);
    let agent = kernel.spawn(Caller::Admin, agent).await.unwrap();
    assert_eq!(run_task(&kernel, agent, "a").await.unwrap(), "one");
    let err = run_task(&kernel, agent, "b").await.unwrap_err();
    assert!(err.contains("rate limit llm_calls_per_minute = 1"), "{err}");
    assert_eq!(server.request_count(), 1);

    let denied = denials(&kernel);
    assert!(
        denied
            .iter()
            .any(|(pid, a, _)| *pid == lead && a == "spawn")
    );
    assert!(
        denied
            .iter()
            .any(|(pid, a, _)| *pid == agent && a == "llm_call")
    );
    kernel.shutdown().await;
}

#[tokio::test]
async fn without_a_roles_section_a_task_may_not_spawn_shell_fetch_or_schedule() {
    use hivekernel_kernel::cron::{CronAction, CronSpec, Missed, Overlap};
    let (runtimes, _) = registry();
    // No `roles` at all: every role takes its least-privilege default.
    let settings = KernelSettings {
        roles: Default::default(),
        ..test_settings()
    };
    let kernel = hivekernel_tests::start(Kernel::builder(settings).runtimes(runtimes)).await;
    let task = kernel
        .spawn(Caller::Admin, request(ROOT, "t", Role::Task, "probe"))
        .await
        .unwrap();
    let before = pids(&kernel).await;

    let err = kernel
        .spawn(
            Caller::Process(task),
            request(task, "sub", Role::Task, "probe"),
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("lacks capability spawn_children"),
        "{err}"
    );
    for (tool, capability) in [
        ("shell_exec", "shell_exec"),
        ("web_fetch", "network_access"),
        ("schedule_cron", "manage_cron"),
    ] {
        let asks = with_tools(request(ROOT, "greedy", Role::Task, "probe"), &[tool]);
        let err = kernel.spawn(Caller::Admin, asks).await.unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("tool {tool} needs capability {capability}")),
            "{err}"
        );
    }
    let entry = CronSpec {
        name: "sneaky".into(),
        expression: "0 3 * * *".into(),
        action: CronAction::Execute,
        target: task,
        template: None,
        description: "x".into(),
        enabled: true,
        overlap: Overlap::Skip,
        missed: Missed::Skip,
        approvals: Vec::new(),
    };
    let err = kernel
        .cron()
        .add(Caller::Process(task), entry)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("lacks capability manage_cron"),
        "{err}"
    );
    assert!(kernel.cron().list(Caller::Admin).is_empty());
    assert_eq!(pids(&kernel).await, before, "nothing was spawned");
    let info = kernel.get_process(Caller::Admin, task).await.unwrap();
    assert_eq!(
        info.capabilities.names(),
        ["send_message", "write_artifact", "file_read"]
    );
    kernel.shutdown().await;
}

#[tokio::test]
async fn shipped_roles_decide_what_a_process_may_do_and_a_child_never_gets_more() {
    let (runtimes, _) = registry();
    let kernel =
        hivekernel_tests::start(Kernel::builder(shipped_settings()).runtimes(runtimes)).await;
    let probe = |parent, name, role| request(parent, name, role, "probe");

    // A tool needs its capability: a worker may write files, a task may not,
    // and neither may run shell commands.
    let worker = with_tools(probe(ROOT, "w", Role::Worker), &["write_file"]);
    let worker = kernel.spawn(Caller::Admin, worker).await.unwrap();
    let before = pids(&kernel).await;
    let task = with_tools(probe(ROOT, "t", Role::Task), &["write_file"]);
    let err = kernel.spawn(Caller::Admin, task).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("tool write_file needs capability file_write"),
        "{err}"
    );
    let shell = with_tools(probe(ROOT, "sh", Role::Worker), &["shell_exec"]);
    let err = kernel.spawn(Caller::Admin, shell).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("tool shell_exec needs capability shell_exec"),
        "{err}"
    );
    assert_eq!(pids(&kernel).await, before);

    // A worker may not spawn or kill.
    let err = kernel
        .spawn(Caller::Process(worker), probe(worker, "sub", Role::Task))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::MissingCapability {
                capability: Capability::SpawnChildren,
                ..
            }
        ),
        "{err}"
    );
    let err = kernel
        .kill(Caller::Process(worker), worker, "")
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("lacks capability kill_processes"),
        "{err}"
    );

    // A lead's child gets only tools the lead has, and its capabilities narrowed to the lead's.
    let lead = with_tools(probe(ROOT, "lead", Role::Lead), &["read_file"]);
    let lead = with_budget(lead, 500);
    let lead = kernel.spawn(Caller::Admin, lead).await.unwrap();
    let more = with_tools(
        probe(lead, "more", Role::Worker),
        &["read_file", "write_file"],
    );
    let err = kernel.spawn(Caller::Process(lead), more).await.unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("write_file not among the tools of process {lead}")),
        "{err}"
    );
    let child = with_tools(probe(lead, "child", Role::Worker), &["read_file"]);
    let child = kernel
        .spawn(Caller::Process(lead), with_budget(child, 100))
        .await
        .unwrap();
    let info = kernel.get_process(Caller::Admin, child).await.unwrap();
    assert_eq!(
        info.capabilities.names(),
        ["send_message", "write_artifact", "file_read"],
        "a worker's capabilities, without what the lead lacks"
    );
    assert_eq!(info.budget.unwrap().max_tokens_total, 100);

    // An agent may spawn but not give a child a budget of its own.
    let agent = kernel
        .spawn(Caller::Admin, probe(ROOT, "a", Role::Agent))
        .await
        .unwrap();
    let err = kernel
        .spawn(
            Caller::Process(agent),
            with_budget(probe(agent, "rich", Role::Worker), 10),
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("lacks capability budget_allocate"),
        "{err}"
    );

    let denied = denials(&kernel);
    for (pid, action) in [(ROOT, "spawn"), (worker, "spawn"), (worker, "kill")] {
        assert!(
            denied.iter().any(|(p, a, _)| *p == pid && a == action),
            "no {action} denial of {pid} in {denied:?}"
        );
    }
    assert!(denied.iter().any(|(p, _, _)| *p == lead));
    assert!(denied.iter().any(|(p, _, _)| *p == agent));
    kernel.shutdown().await;
}

#[tokio::test]
async fn a_process_token_acts_only_as_its_process_with_its_capabilities() {
    let (runtimes, _) = registry();
    let kernel =
        hivekernel_tests::start(Kernel::builder(shipped_settings()).runtimes(runtimes)).await;
    let served = Served::start(&kernel).await;
    let mut admin = served.admin();
    let mut worker_req = pb::SpawnRequest {
        parent: 1,
        name: "w".into(),
        role: pb::Role::Worker as i32,
        ..Default::default()
    };
    worker_req.limits = Some(pb::Limits::default());
    let worker = admin.spawn(worker_req).await.unwrap().into_inner().pid;
    let token = served.auth.issue(Pid(worker)).unwrap();
    let mut as_worker = served.with_token(&token);

    let spawn = |parent: u64| pb::SpawnRequest {
        parent,
        name: "x".into(),
        ..Default::default()
    };
    let err = as_worker.spawn(spawn(worker)).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(
        err.message().contains("lacks capability spawn_children"),
        "{err:?}"
    );
    let err = as_worker.spawn(spawn(1)).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    let err = as_worker
        .kill(pb::KillRequest {
            pid: worker,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");

    // What the token may do, it does, as its process.
    let info = as_worker
        .get_process(pb::GetProcessRequest { pid: worker })
        .await
        .unwrap()
        .into_inner();
    assert!(info.capabilities.contains(&"send_message".to_owned()));
    assert!(!info.capabilities.contains(&"spawn_children".to_owned()));

    // Forged and missing tokens are not anyone.
    let (_, secret) = token.split_once('.').unwrap();
    for forged in [
        format!("p1.{secret}"),
        format!("p{worker}.00"),
        String::new(),
    ] {
        let err = served
            .with_token(&forged)
            .spawn(spawn(1))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{forged:?}");
    }
    assert_eq!(pids(&kernel).await, [ROOT, Pid(worker)]);
    drop(admin);
    kernel.shutdown().await;
    served.stopped().await;
}

#[tokio::test]
async fn limits_in_a_request_never_exceed_the_parents() {
    let (kernel, _) = hivekernel_tests::kernel().await;
    let mut lead = request(ROOT, "lead", Role::Lead, "probe");
    lead.limits = LimitOverrides {
        llm_calls_per_minute: Some(10),
        ..LimitOverrides::default()
    };
    let lead = kernel.spawn(Caller::Admin, lead).await.unwrap();
    let inherit = kernel
        .spawn(Caller::Admin, request(lead, "c", Role::Worker, "probe"))
        .await
        .unwrap();
    let info = kernel.get_process(Caller::Admin, inherit).await.unwrap();
    assert_eq!(
        info.limits.llm_calls_per_minute,
        std::num::NonZeroU32::new(10),
        "inherited"
    );
    let mut zero = request(lead, "z", Role::Worker, "probe");
    zero.limits.max_tokens_total = Some(0);
    let err = kernel.spawn(Caller::Admin, zero).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    kernel.shutdown().await;
}

#[tokio::test]
async fn an_agent_with_a_budget_reads_its_state_in_its_prompt_and_from_the_budget_tool() {
    let server = LlmServer::start(vec![
        Scripted::content_with_usage("first", 400_000, 100_000),
        Scripted::tool_calls(&[("b1", "budget", "{}")]),
        Scripted::content("second"),
        Scripted::content("unbudgeted"),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let kernel = llm_kernel(&server, &dir).await;
    let mut agent = with_tools(
        request(ROOT, "aware", Role::Agent, "tool_agent"),
        &["budget"],
    );
    agent.limits.llm_calls_per_minute = Some(30);
    let agent = kernel
        .spawn(Caller::Admin, with_budget(agent, 1_000_000))
        .await
        .unwrap();
    assert_eq!(run_task(&kernel, agent, "one").await.unwrap(), "first");
    assert_eq!(run_task(&kernel, agent, "two").await.unwrap(), "second");

    let requests = server.requests();
    let system = |i: usize| hivekernel_tests::llm_server::system_message(&requests[i]);
    let before = system(0);
    assert!(before.contains("## Budget"), "{before}");
    assert!(
        before.contains("- Tokens: 0 used of 1000000, 1000000 left (your own budget"),
        "{before}"
    );
    assert!(
        before.contains("- Rate limits: 30 model calls a minute"),
        "{before}"
    );
    // The second input sees the first's spending: 500k tokens at $2.50/$10 per million.
    let after = system(1);
    assert!(
        after.contains("- Tokens: 500000 used of 1000000, 500000 left"),
        "{after}"
    );
    assert!(
        after.contains("- Spent: 1 model calls, 500000 tokens, $2.0000"),
        "{after}"
    );
    assert_eq!(system(2), after, "the same within one input");
    let answered = &hivekernel_tests::llm_server::tool_results(&requests[2])[0];
    // The tool answers as of now: the call that asked for it is counted.
    assert!(
        answered.contains("used of 1000000") && answered.contains("- Spent: 2 model calls"),
        "{answered}"
    );

    // No budget and no rate limit: no section.
    let free = kernel
        .spawn(
            Caller::Admin,
            request(ROOT, "free", Role::Agent, "tool_agent"),
        )
        .await
        .unwrap();
    assert_eq!(
        run_task(&kernel, free, "three").await.unwrap(),
        "unbudgeted"
    );
    let last = hivekernel_tests::llm_server::system_message(&server.requests()[3]);
    assert!(!last.contains("## Budget"), "{last}");
    kernel.shutdown().await;
}
