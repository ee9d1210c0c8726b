//! The process tools, called as a real process of a real in-process kernel.
//!
//! The caller is `lead` (role lead, a child of PID 1), spawned with a
//! `capture` runtime that hands the test its real `ProcessContext` and runs
//! it as a `probe`, so messages it receives land in the kernel's journal.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use hivekernel_agents::message::kinds;
use hivekernel_agents::tools::{ToolContext, ToolError, ToolRegistry};
use hivekernel_agents::{Pid, Priority, ProcessContext, RequestId, Role, SpawnRequest};
use hivekernel_kernel::{Caller, Kernel};
use hivekernel_tests::capture::Capture;
use hivekernel_tests::probe::ProbeFactory;
use hivekernel_tests::{Journal, registry, spawn_probe, test_settings, wait_until};
use serde_json::{Value, json};

struct Fixture {
    kernel: Kernel,
    journal: Journal,
    capture: Arc<Capture>,
    lead: ProcessContext,
    tools: ToolRegistry,
}

async fn fixture() -> Fixture {
    let (mut runtimes, journal) = registry();
    let probe = ProbeFactory {
        journal: journal.clone(),
    };
    let capture = Arc::new(Capture::wrapping(Arc::new(probe)));
    runtimes.register("capture", capture.clone());
    // The model the tests give children, as a config would name it.
    let mut settings = test_settings();
    settings.models.configured.insert("small".into());
    let kernel = hivekernel_tests::start(Kernel::builder(settings).runtimes(runtimes)).await;
    Fixture {
        lead: captured_with(
            &kernel,
            &capture,
            Pid::KERNEL,
            "lead",
            Role::Lead,
            &["read_file"],
        )
        .await,
        kernel,
        journal,
        capture,
        tools: ToolRegistry::builtin(),
    }
}

/// Spawns a `capture` process as the admin and returns its context.
async fn captured(
    kernel: &Kernel,
    capture: &Capture,
    parent: Pid,
    name: &str,
    role: Role,
) -> ProcessContext {
    captured_with(kernel, capture, parent, name, role, &[]).await
}

/// [`captured`], given `tools` (which its children may be given too).
async fn captured_with(
    kernel: &Kernel,
    capture: &Capture,
    parent: Pid,
    name: &str,
    role: Role,
    tools: &[&str],
) -> ProcessContext {
    let mut request = SpawnRequest::new(parent, name);
    request.role = role;
    request.tools = tools.iter().map(|t| (*t).to_owned()).collect();
    request.runtime = Some("capture".into());
    kernel.spawn(Caller::Admin, request).await.unwrap();
    capture.take().unwrap()
}

impl Fixture {
    async fn call_as(
        &self,
        process: &ProcessContext,
        tool: &str,
        args: Value,
    ) -> Result<String, ToolError> {
        let ctx = ToolContext {
            process,
            workspace: None,
            checkpoint: None,
        };
        self.tools.get(tool).unwrap().call(&ctx, args).await
    }

    async fn call(&self, tool: &str, args: Value) -> String {
        match self.call_as(&self.lead, tool, args.clone()).await {
            Ok(out) => out,
            Err(err) => panic!("{tool} {args} failed: {err}"),
        }
    }

    async fn refused(&self, tool: &str, args: Value) -> String {
        match self.call_as(&self.lead, tool, args.clone()).await {
            Ok(out) => panic!("{tool} {args} succeeded: {out}"),
            Err(err) => err.0,
        }
    }

    /// Spawns a child of `lead` through the tool; returns its PID.
    async fn spawn(&self, name: &str, runtime: &str) -> Pid {
        let out = self
            .call(
                "spawn_child",
                json!({"name": name, "role": "worker", "runtime": runtime}),
            )
            .await;
        let pid = out
            .strip_prefix(&format!("spawned {name} as pid "))
            .unwrap_or_else(|| panic!("unexpected answer {out:?}"));
        Pid(pid.parse().unwrap())
    }
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[tokio::test]
async fn spawn_child_then_list_children_and_get_process_info_show_it() {
    let fx = fixture().await;
    let out = fx
        .call(
            "spawn_child",
            json!({
                "name": "w1", "role": "worker", "tier": "operational", "prompt": "be brief",
                "tools": ["read_file"], "model": "small", "runtime": "echo",
                "limits": {"max_children": 2, "max_depth": 1, "timeout_seconds": 5}
            }),
        )
        .await;
    let pid: u64 = out
        .strip_prefix("spawned w1 as pid ")
        .unwrap()
        .parse()
        .unwrap();

    let children = parse(&fx.call("list_children", json!({})).await);
    assert_eq!(
        children,
        json!([{"pid": pid, "name": "w1", "role": "worker", "tier": "operational", "state": "idle"}])
    );

    let info = parse(&fx.call("get_process_info", json!({"pid": pid})).await);
    assert_eq!(info["ppid"], json!(fx.lead.pid.0));
    assert_eq!(info["model"], "small");
    assert_eq!(info["runtime"], "echo");
    assert_eq!(info["tools"], json!(["read_file"]));
    assert_eq!(info["limits"]["max_children"], 2);
    assert_eq!(info["limits"]["timeout_seconds"], 5);

    // No pid (or no arguments at all) describes the caller.
    let me = parse(&fx.call("get_process_info", Value::Null).await);
    assert_eq!(me["pid"], json!(fx.lead.pid.0));
    assert_eq!(me["name"], "lead");
    assert_eq!(me["role"], "lead");
    assert_eq!(me["children"], 1);
    assert_eq!(me["mailbox_len"], 0);
    let keys: Vec<&String> = me.as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 12, "{keys:?}");
    fx.kernel.shutdown().await;
}

#[tokio::test]
async fn execute_task_returns_output_and_a_failure_is_a_tool_error() {
    let fx = fixture().await;
    let echo = fx.spawn("echo", "echo").await;
    let out = fx
        .call(
            "execute_task",
            json!({"pid": echo.0, "task": "hello there", "timeout_seconds": 5}),
        )
        .await;
    assert_eq!(out, "hello there");

    let probe = fx.spawn("probe", "probe").await;
    let err = fx
        .refused("execute_task", json!({"pid": probe.0, "task": "fail boom"}))
        .await;
    assert_eq!(err, "task failed: boom");
    fx.kernel.shutdown().await;
}

#[tokio::test]
async fn delegate_async_answer_lands_in_the_callers_mailbox() {
    let fx = fixture().await;
    let echo = fx.spawn("echo", "echo").await;
    let out = fx
        .call("delegate_async", json!({"pid": echo.0, "task": "later"}))
        .await;
    let request: u64 = out
        .strip_prefix("delegated as request ")
        .and_then(|rest| rest.split(';').next())
        .unwrap()
        .parse()
        .unwrap();
    assert!(out.ends_with("the answer will arrive as a task_response message naming it"));

    let lead = fx.lead.pid;
    let journal = fx.journal.clone();
    wait_until("the task_response", Duration::from_secs(5), || {
        let journal = journal.clone();
        async move {
            journal.of(lead).iter().any(|m| {
                m.kind == kinds::TASK_RESPONSE
                    && m.request_id == Some(RequestId(request))
                    && m.payload.contains("later")
            })
        }
    })
    .await;
    fx.kernel.shutdown().await;
}

#[tokio::test]
async fn kill_child_then_wait_child_returns_exit_code_137() {
    let fx = fixture().await;
    let child = fx.spawn("doomed", "echo").await;
    let out = fx
        .call(
            "kill_child",
            json!({"pid": child.0, "reason": "no longer needed"}),
        )
        .await;
    assert_eq!(out, format!("killed [{child}]"));

    let record = parse(
        &fx.call("wait_child", json!({"pid": child.0, "timeout_seconds": 5}))
            .await,
    );
    assert_eq!(record["exit_code"], 137);
    assert_eq!(record["pid"], json!(child.0));
    assert_eq!(record["name"], "doomed");
    assert_eq!(record["reason"], "no longer needed");
    assert_eq!(parse(&fx.call("list_children", json!({})).await), json!([]));
    fx.kernel.shutdown().await;
}

#[tokio::test]
async fn list_siblings_shows_the_parents_other_children() {
    let fx = fixture().await;
    let peer = spawn_probe(&fx.kernel, Pid::KERNEL, "peer", Role::Worker).await;
    fx.spawn("own-child", "echo").await; // a child, not a sibling
    let siblings = parse(&fx.call("list_siblings", json!({})).await);
    assert_eq!(
        siblings,
        json!([{"pid": peer.0, "name": "peer", "role": "worker", "tier": "strategic", "state": "idle"}])
    );
    fx.kernel.shutdown().await;
}

#[tokio::test]
async fn send_message_delivers_with_type_and_priority() {
    let fx = fixture().await;
    let child = fx.spawn("inbox", "probe").await;
    let out = fx
        .call(
            "send_message",
            json!({"pid": child.0, "message": "hi", "type": "note", "priority": "high"}),
        )
        .await;
    let id: u64 = out
        .strip_prefix("sent as message ")
        .unwrap()
        .parse()
        .unwrap();

    let journal = fx.journal.clone();
    wait_until("the message", Duration::from_secs(5), || {
        let journal = journal.clone();
        async move { !journal.of(child).is_empty() }
    })
    .await;
    let got = &fx.journal.of(child)[0];
    assert_eq!(got.id.0, id);
    assert_eq!(got.from, fx.lead.pid);
    assert_eq!(
        (got.kind.as_str(), got.payload.as_str(), got.priority),
        ("note", "hi", Priority::High)
    );
    fx.kernel.shutdown().await;
}

#[tokio::test]
async fn kernel_refusals_come_back_as_tool_errors() {
    let fx = fixture().await;
    let task = captured(&fx.kernel, &fx.capture, fx.lead.pid, "t", Role::Task).await;
    let err = fx
        .call_as(&task, "spawn_child", json!({"name": "nope"}))
        .await
        .unwrap_err()
        .0;
    assert!(err.contains("lacks capability spawn_children"), "{err}");

    let peer = spawn_probe(&fx.kernel, Pid::KERNEL, "peer", Role::Worker).await;
    let err = fx.refused("kill_child", json!({"pid": peer.0})).await;
    assert!(err.contains("may only kill its descendants"), "{err}");
    let err = fx.refused("wait_child", json!({"pid": peer.0})).await;
    assert!(err.contains("not the parent"), "{err}");
    let err = fx
        .refused("execute_task", json!({"pid": 9999, "task": "x"}))
        .await;
    assert!(err.contains("9999"), "{err}");
    let err = fx
        .refused("spawn_child", json!({"name": "x", "runtime": "nosuch"}))
        .await;
    assert!(err.contains("unknown runtime"), "{err}");
    fx.kernel.shutdown().await;
}

#[tokio::test]
async fn bad_arguments_are_clear_errors() {
    let fx = fixture().await;
    let cases: [(&str, Value, &[&str]); 12] = [
        (
            "spawn_child",
            json!({"name": "a", "colour": "red"}),
            &["unknown field `colour`"],
        ),
        ("spawn_child", json!({"name": 7}), &["`name`", "a string"]),
        (
            "spawn_child",
            json!({"name": "a", "tools": "read_file"}),
            &["`tools`", "an array"],
        ),
        (
            "spawn_child",
            json!({"name": "a", "limits": {"max_depth": -1}}),
            &["`limits.max_depth`"],
        ),
        (
            "spawn_child",
            json!({"name": "a", "limits": {"depth": 1}}),
            &["unknown field `depth`"],
        ),
        (
            "spawn_child",
            json!({"name": "a", "role": "boss"}),
            &["field `role`", "\"boss\"", "lead, worker, task"],
        ),
        (
            "spawn_child",
            json!({"name": "a", "tier": "top"}),
            &["field `tier`", "strategic, tactical, operational"],
        ),
        ("kill_child", json!({}), &["missing field `pid`"]),
        (
            "kill_child",
            json!({"pid": "5"}),
            &["`pid`", "non-negative integer"],
        ),
        (
            "execute_task",
            json!({"pid": 5, "task": "x", "timeout_seconds": 0}),
            &["`timeout_seconds`", "between 1 and 3600"],
        ),
        (
            "wait_child",
            json!({"pid": 5, "timeout_seconds": 3601}),
            &["`timeout_seconds`", "between 1 and 3600"],
        ),
        (
            "send_message",
            json!({"pid": 5, "message": "x", "priority": "asap"}),
            &["field `priority`", "critical, high, normal, low"],
        ),
    ];
    for (tool, args, wanted) in cases {
        let err = fx.refused(tool, args.clone()).await;
        assert!(
            err.starts_with(&format!("invalid arguments for {tool}")),
            "{tool} {args}: {err}"
        );
        for part in wanted {
            assert!(err.contains(part), "{tool} {args}: {err:?} lacks {part:?}");
        }
    }
    let err = fx.refused("list_children", json!({"all": true})).await;
    assert!(err.contains("unknown field `all`"), "{err}");
    // Nothing was spawned by any of them.
    assert_eq!(parse(&fx.call("list_children", json!({})).await), json!([]));
    fx.kernel.shutdown().await;
}

#[test]
fn the_builtin_registry_offers_the_process_tools_with_closed_schemas() {
    let registry = ToolRegistry::builtin();
    let names = registry.names();
    for name in [
        "spawn_child",
        "kill_child",
        "execute_task",
        "delegate_async",
        "wait_child",
        "list_children",
        "list_siblings",
        "get_process_info",
        "send_message",
    ] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
        let schema = registry.get(name).unwrap().schema();
        assert_eq!(schema.parameters["type"], "object", "{name}");
        assert_eq!(schema.parameters["additionalProperties"], false, "{name}");
        assert!(!schema.description.is_empty());
    }
}
