//! Property tests of the three parsers hostile input reaches first: the
//! startup config, cron expressions and tool arguments. None may panic
//! whatever it is given; the fuzz targets in `fuzz/` explore the same
//! properties without bounds.

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use hivekernel_agents::ProcessContext;
use hivekernel_agents::tools::{ToolContext, ToolRegistry, decode};
use hivekernel_kernel::config::Config;
use hivekernel_kernel::{Kernel, RuntimeRegistry, cron};
use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{Map, Value};

/// Names the parsers know, so generated objects reach past "unknown field".
const KEYS: &[&str] = &[
    "kernel",
    "agents",
    "llm",
    "tool_agent",
    "roles",
    "templates",
    "name",
    "role",
    "cognitive_tier",
    "model",
    "runtime",
    "tools",
    "limits",
    "max_depth",
    "max_children",
    "timeout_seconds",
    "max_concurrent_tasks",
    "system_prompt",
    "system_prompt_file",
    "cron",
    "expression",
    "action",
    "template",
    "overlap",
    "missed",
    "listen",
    "data_dir",
    "mailbox_capacity",
    "task_timeout_seconds",
    "default_runtime",
    "workspace",
    "web",
    "allow_private_networks",
    "allow_addresses",
    "max_bytes",
    "orchestrate",
    "max_workers",
    "restart",
    "policy",
    "max_restarts",
    "within_seconds",
    "backoff_ms",
    "strategy",
    "exec",
    "command",
    "env",
    "metadata",
    "provider",
    "base_url",
    "models",
    "artifacts",
    "memory",
    "path",
    "content",
    "old",
    "new",
    "offset",
    "limit",
    "url",
    "pid",
    "text",
    "to",
    "priority",
    "description",
    "key",
    "tags",
    "query",
    "goal",
    "id",
    "visibility",
    "reason",
];

fn key() -> impl Strategy<Value = String> {
    prop_oneof![4 => select(KEYS).prop_map(str::to_owned), 1 => "[a-z_]{0,8}"]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (0u64..100).prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "\\PC{0,12}".prop_map(Value::from),
        select(
            &[
                "",
                " ",
                "@daily",
                "*/5 * * * *",
                "0 0 30 2 *",
                "task",
                "lead",
                "x",
                "..",
                "/",
                "127.0.0.1",
                "permanent",
                "one_for_all",
                "strategic",
                "echo",
                "spawn",
                "a\0b"
            ][..]
        )
        .prop_map(Value::from),
    ]
}

/// Any JSON value, a few levels deep, with keys the parsers know.
fn json() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            proptest::collection::btree_map(key(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn check_config(text: &str, top_level_object: bool) -> Result<(), TestCaseError> {
    let dir = Path::new("/nonexistent/hivekernel-props");
    let known = RuntimeRegistry::builtin().known();
    if let Err(err) = Config::from_str_at(text, &dir.join("startup.json"), &known) {
        prop_assert!(!err.issues.is_empty());
        for issue in &err.issues {
            prop_assert!(!issue.message.is_empty(), "{issue:?}");
            // Past the JSON syntax, every issue names where it is.
            prop_assert!(
                !top_level_object || !issue.location.is_empty(),
                "no location: {issue:?} in {text}"
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn config_never_panics_on_json_and_names_every_location(
        sections in proptest::collection::btree_map(key(), json(), 0..6)
    ) {
        let doc = Value::Object(sections.into_iter().collect());
        check_config(&doc.to_string(), true)?;
    }

    #[test]
    fn config_never_panics_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        check_config(&String::from_utf8_lossy(&bytes), false)?;
    }

    #[test]
    fn cron_never_panics_and_fires_after_the_given_time(
        fields in proptest::collection::vec(
            prop_oneof![
                1 => "[0-9*/,\\-?LW#]{1,6}",
                3 => select(&["*", "0", "59", "60", "*/0", "1-5", "5-1", "MON-FRI", "JAN", "L",
                              "31", "29", "2", "1970", "2099", "0-59/7", "1,2,3", "?", "1#5",
                              "99999999999"][..])
                    .prop_map(str::to_owned),
            ],
            0..9,
        ),
        other in prop_oneof![
            3 => Just(None),
            1 => select(&["@daily", "@hourly", "@weekly", "@monthly", "@yearly", "@reboot", "@"][..])
                .prop_map(|s| Some(s.to_owned())),
            1 => "\\PC{0,40}".prop_map(Some),
        ],
        after in 0u64..4_102_444_800_000,
    ) {
        let expression = other.unwrap_or_else(|| fields.join(" "));
        match cron::next_fire(&expression, after) {
            Ok(Some(next)) => prop_assert!(next > after, "{expression:?}: {next} <= {after}"),
            Ok(None) => {}
            Err(why) => prop_assert!(!why.is_empty()),
        }
    }

    #[test]
    fn well_formed_crontab_lines_are_accepted_and_fire_later(
        minute in prop_oneof!["[0-9]|[1-5][0-9]", Just("*".to_owned()), "\\*/[1-9]"],
        hour in prop_oneof!["[0-9]|1[0-9]|2[0-3]", Just("*".to_owned()), "[0-9]-1[0-9]"],
        day in prop_oneof!["[1-9]|[12][0-9]|3[01]", Just("*".to_owned())],
        month in prop_oneof!["[1-9]|1[0-2]", Just("*".to_owned()), select(&["JAN", "FEB", "DEC"][..]).prop_map(str::to_owned)],
        weekday in prop_oneof!["[0-7]", Just("*".to_owned()), Just("1-5".to_owned()), Just("MON,FRI".to_owned())],
        after in 0u64..4_102_444_800_000,
    ) {
        let expression = format!("{minute} {hour} {day} {month} {weekday}");
        match cron::next_fire(&expression, after) {
            // February 30th never comes: accepted, but no next time.
            Ok(next) => prop_assert!(next.is_none_or(|next| next > after), "{expression:?}"),
            Err(why) => prop_assert!(false, "{expression:?} refused: {why}"),
        }
    }
}

/// One kernel and one process for every tool-argument case.
fn agent() -> &'static (tokio::runtime::Runtime, Kernel, ProcessContext) {
    static AGENT: OnceLock<(tokio::runtime::Runtime, Kernel, ProcessContext)> = OnceLock::new();
    AGENT.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (kernel, process) =
            runtime.block_on(hivekernel_tests::capture::captured_process("fuzzed"));
        (runtime, kernel, process)
    })
}

/// Arguments for `tool`: mostly objects of its own field names.
fn arguments() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => proptest::collection::btree_map(key(), json(), 0..5)
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        1 => json(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn tool_arguments_never_panic(args in arguments()) {
        let (runtime, _kernel, process) = agent();
        let tools = ToolRegistry::builtin();
        // No workspace: the workspace tools stop before touching a disk.
        let ctx = ToolContext { process, workspace: None, checkpoint: None };
        for name in tools.names() {
            let tool = tools.get(name).unwrap();
            let decoded = decode::<Value>(tool.as_ref(), args.clone());
            if !(args.is_object() || args.is_null()) {
                prop_assert!(decoded.is_err(), "{name} decoded {args}");
            }
            // web_fetch would go to the network with a valid public URL.
            if name == "web_fetch" {
                continue;
            }
            let answer = runtime.block_on(async {
                tokio::time::timeout(Duration::from_secs(5), tool.call(&ctx, args.clone())).await
            });
            if let Ok(Err(err)) = &answer {
                prop_assert!(!err.0.is_empty());
                if !(args.is_object() || args.is_null()) {
                    prop_assert!(
                        err.0.starts_with(&format!("invalid arguments for {name}: ")),
                        "{name} {args}: {err}"
                    );
                }
            }
        }
    }
}
