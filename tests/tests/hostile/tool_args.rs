//! Every built-in tool, called as a real process, with arguments of every
//! wrong shape its schema allows to build: not an object, a required field
//! missing, an unknown field, each field of the wrong type, and each string
//! field megabytes long. Each call is refused with a message naming the tool
//! and the field, no message echoes a huge argument back, and the kernel is
//! unchanged afterwards but for what the calls that were accepted did.

use hivekernel_agents::tools::{ToolContext, ToolRegistry};
use hivekernel_kernel::Caller;
use hivekernel_tests::capture::captured_process;
use serde_json::{Map, Value, json};

/// Longest refusal a model should ever get back for bad arguments.
const MAX_MESSAGE: usize = 8 * 1024;

/// A value of `schema`'s type that names nothing real (a PID that does not
/// exist, an empty list), so a call that gets past decoding does no work.
fn inert(schema: &Value) -> Value {
    if let Some(first) = schema["enum"].get(0) {
        return first.clone();
    }
    match schema["type"].as_str() {
        Some("string") => json!("x"),
        Some("integer") => json!(u64::MAX),
        Some("boolean") => json!(false),
        Some("array") => json!([]),
        Some("object") => json!({}),
        _ => Value::Null,
    }
}

/// Values that are not of `schema`'s type.
fn wrong(schema: &Value) -> Vec<Value> {
    match schema["type"].as_str() {
        Some("string") => vec![json!(5), json!(["x"]), json!({"x": 1}), json!(true)],
        Some("integer") => vec![json!("5"), json!(-1), json!(1.5), json!([1])],
        Some("boolean") => vec![json!("yes"), json!(1)],
        Some("array") => vec![json!("x"), json!({"x": 1}), json!(7)],
        Some("object") => vec![json!("x"), json!([1]), json!(7)],
        _ => Vec::new(),
    }
}

#[tokio::test]
async fn every_tool_refuses_malformed_arguments_by_name_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("agent");
    let (kernel, process) = captured_process("agent").await;
    let tools = ToolRegistry::builtin();
    let ctx = ToolContext {
        process: &process,
        workspace: Some(&ws),
        checkpoint: None,
    };
    let live = kernel.live_count();
    let huge = "h".repeat(2 << 20);
    let mut calls = 0;
    let mut spawned = 0;
    for name in tools.names() {
        let tool = tools.get(name).unwrap();
        let schema = tool.parameters();
        let properties = schema["properties"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        let required: Vec<&str> = schema["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let base: Map<String, Value> = required
            .iter()
            .map(|f| ((*f).to_owned(), inert(&properties[*f])))
            .collect();
        let prefix = format!("invalid arguments for {name}: ");

        let mut cases: Vec<(Value, String)> = Vec::new();
        for not_object in [
            json!("read it"),
            json!(5),
            json!([base.clone()]),
            json!(true),
        ] {
            cases.push((not_object, "invalid type".to_owned()));
        }
        for field in &required {
            let mut args = base.clone();
            args.remove(*field);
            cases.push((Value::Object(args), format!("missing field `{field}`")));
        }
        let mut extra = base.clone();
        extra.insert("__extra".into(), json!(1));
        cases.push((Value::Object(extra), "unknown field `__extra`".to_owned()));
        for (field, property) in &properties {
            for bad in wrong(property) {
                let mut args = base.clone();
                args.insert(field.clone(), bad);
                cases.push((Value::Object(args), format!("`{field}`")));
            }
        }
        for (args, says) in cases {
            calls += 1;
            let shown = args.to_string();
            let err = match tool.call(&ctx, args).await {
                Ok(out) => panic!("{name} {shown} was accepted: {out}"),
                Err(err) => err.0,
            };
            assert!(
                err.starts_with(&prefix) && err.contains(&says),
                "{name} {shown}: {says:?} not in {err:?}"
            );
            assert!(
                err.len() < MAX_MESSAGE,
                "{name} {shown}: {} bytes",
                err.len()
            );
        }

        // Megabytes in each string field: refused or harmless, and never echoed back whole.
        for (field, property) in &properties {
            if property["type"] != "string" {
                continue;
            }
            let mut args = base.clone();
            args.insert(field.clone(), json!(huge));
            calls += 1;
            let answer = match tool.call(&ctx, Value::Object(args)).await {
                // Valid arguments with a long prompt or model name: a real child.
                Ok(out) if name == "spawn_child" => {
                    spawned += 1;
                    out
                }
                Ok(out) => panic!("{name} with a huge `{field}` was accepted: {out:.200}"),
                Err(err) => err.0,
            };
            assert!(
                answer.len() < MAX_MESSAGE,
                "{name} with a huge `{field}` answered {} bytes: {}...",
                answer.len(),
                &answer[..200.min(answer.len())]
            );
        }
    }
    assert!(calls > 200, "only {calls} calls");
    // Only the accepted spawns changed the tree.
    assert_eq!(kernel.live_count(), live + spawned);
    assert!(kernel.cron().list(Caller::Admin).is_empty());
    // No file tool wrote anything (the workspace, if created, is empty).
    let written: Vec<_> = std::fs::read_dir(&ws)
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(written.is_empty(), "{written:?}");
    kernel.shutdown().await;
}
