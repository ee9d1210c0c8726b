//! The startup config as `Config::load` reads it: every key, range and
//! cross-section check, and the located report of every problem at once.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;

use hivekernel_agents::{Capabilities, Capability, Role, Tier};
use hivekernel_kernel::config::*;

fn known() -> Known {
    Known {
        runtimes: vec!["echo".into(), "exec".into(), "tool_agent".into()],
        tools: vec![
            "execute_task".into(),
            "read_file".into(),
            "schedule_cron".into(),
            "shell_exec".into(),
            "spawn_child".into(),
            "web_fetch".into(),
        ],
        tool_capabilities: [
            ("read_file".into(), Capability::FileRead),
            ("schedule_cron".into(), Capability::ManageCron),
            ("shell_exec".into(), Capability::ShellExec),
            ("spawn_child".into(), Capability::SpawnChildren),
            ("web_fetch".into(), Capability::NetworkAccess),
        ]
        .into(),
    }
}

/// A temporary directory holding `configs/config.json`, with room for prompt files beside it.
struct Fixture {
    dir: TempDir,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("configs")).unwrap();
        Fixture { dir }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn config_path(&self) -> PathBuf {
        self.root().join("configs/config.json")
    }

    fn write(&self, relative: &str, text: &str) -> PathBuf {
        let path = self.root().join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path
    }

    fn load(&self, json: &str) -> Result<Config, ConfigError> {
        self.write("configs/config.json", json);
        Config::load(&self.config_path(), &known())
    }

    /// Loads `json` with `vars` as the whole environment `mcp_servers` sees.
    fn load_env(&self, json: &str, vars: &[(&str, &str)]) -> Result<Config, Vec<ConfigIssue>> {
        let env = |name: &str| {
            let found = vars.iter().find(|(var, _)| *var == name);
            found.map(|(_, value)| (*value).to_owned())
        };
        Config::from_str_with_env(json, &self.config_path(), &known(), &env)
            .map_err(|err| err.issues)
    }

    fn issues(&self, json: &str) -> Vec<ConfigIssue> {
        match self.load(json) {
            Ok(config) => panic!("expected issues, got {config:#?}"),
            Err(err) => {
                assert_eq!(err.file, self.config_path());
                err.issues
            }
        }
    }
}

fn issues(json: &str) -> Vec<ConfigIssue> {
    Fixture::new().issues(json)
}

/// Asserts exactly one issue at `location` and that its message contains every fragment.
#[track_caller]
fn assert_issue(issues: &[ConfigIssue], location: &str, fragments: &[&str]) {
    let found: Vec<_> = issues.iter().filter(|i| i.location == location).collect();
    assert_eq!(found.len(), 1, "one issue at {location:?} in {issues:#?}");
    for fragment in fragments {
        assert!(
            found[0].message.contains(fragment),
            "{:?} should contain {fragment:?}",
            found[0].message
        );
    }
}

#[test]
fn missing_file_names_the_path_and_os_error() {
    let fixture = Fixture::new();
    let path = fixture.root().join("nope.json");
    let err = Config::load(&path, &known()).unwrap_err();
    assert_issue(&err.issues, "", &[&path.display().to_string(), "os error"]);
}

#[test]
fn json_syntax_error_names_line_and_column() {
    let found = issues("{\n  \"kernel\": {\n    \"max_depth\": 8,\n  }\n}");
    assert_issue(&found, "", &["invalid JSON", "line 4 column 3"]);
}

#[test]
fn top_level_must_be_an_object() {
    let found = issues("[1, 2]");
    assert_issue(&found, "", &["must be a JSON object", "an array"]);
}

#[test]
fn unknown_top_level_key_lists_the_sections() {
    let found = issues(r#"{"agent": []}"#);
    assert_issue(
        &found,
        "agent",
        &["unknown field `agent`", "`kernel`", "`agents`"],
    );
}

#[test]
fn an_empty_key_has_a_location_too() {
    let found = issues(r#"{"": 1, "kernel": {"": 2}}"#);
    assert_issue(&found, "\"\"", &["unknown field ``"]);
    assert_issue(&found, "kernel.\"\"", &["unknown field ``"]);
}

#[test]
fn unknown_fields_are_errors_at_every_level() {
    let found = issues(
        r#"{"kernel": {"listen_addr": "x"},
            "agents": [{"name": "a", "tier": "tactical", "limits": {"depth": 2}}]}"#,
    );
    assert_issue(
        &found,
        "kernel.listen_addr",
        &["unknown field `listen_addr`", "`listen`"],
    );
    assert_issue(
        &found,
        "agents[0] (a).tier",
        &["unknown field `tier`", "`cognitive_tier`"],
    );
    assert_issue(
        &found,
        "agents[0] (a).limits.depth",
        &["unknown field `depth`", "`max_depth`"],
    );
    assert_eq!(found.len(), 3, "{found:#?}");
}

#[test]
fn wrong_types_name_the_field_and_value() {
    let found = issues(
        r#"{"kernel": {"max_depth": "deep", "mailbox_capacity": -1},
            "agents": [{"name": "a", "tools": "spawn_child", "metadata": {"team": 7}},
                       "not an agent"]}"#,
    );
    assert_issue(&found, "kernel.max_depth", &["invalid type", "\"deep\""]);
    assert_issue(&found, "kernel.mailbox_capacity", &["-1"]);
    assert_issue(
        &found,
        "agents[0] (a).tools",
        &["invalid type", "\"spawn_child\""],
    );
    assert_issue(
        &found,
        "agents[0] (a).metadata.team",
        &["invalid type", "7"],
    );
    assert_issue(
        &found,
        "agents[1]",
        &["must be a JSON object", "\"not an agent\""],
    );
    assert_eq!(found.len(), 5, "{found:#?}");
}

#[test]
fn a_section_of_the_wrong_type_is_named_without_rust_types() {
    let found = issues(
        r#"{"kernel": {"storage": 5, "log": [], "max_depth": 0},
            "llm": {"prices": {"mini": [1, 2]}}}"#,
    );
    assert_issue(
        &found,
        "llm.prices.mini",
        &["invalid type: sequence, expected a JSON object"],
    );
    assert_issue(
        &found,
        "kernel.storage",
        &["invalid type: integer `5`, expected a JSON object"],
    );
    // serde's derive alone would read an array as the fields in order.
    assert_issue(
        &found,
        "kernel.log",
        &["invalid type: sequence, expected a JSON object"],
    );
    assert_issue(&found, "kernel.max_depth", &["between 1 and 64, got 0"]);
    assert_eq!(found.len(), 4, "{found:#?}");
    assert!(
        found
            .iter()
            .all(|issue| !issue.message.contains("Settings")),
        "{found:#?}"
    );
}

#[test]
fn listen_must_be_a_socket_address() {
    let found = issues(r#"{"kernel": {"listen": "localhost:50051"}}"#);
    assert_issue(
        &found,
        "kernel.listen",
        &["invalid socket address", "\"localhost:50051\""],
    );
}

#[test]
fn kernel_numbers_out_of_range_are_all_reported() {
    let found = issues(
        r#"{"kernel": {"max_depth": 65, "max_children": 0, "mailbox_capacity": 1000001,
            "mailbox_aging_ms": 0, "task_timeout_seconds": 0, "max_concurrent_tasks": 0}}"#,
    );
    assert_issue(&found, "kernel.max_depth", &["between 1 and 64", "65"]);
    assert_issue(
        &found,
        "kernel.max_children",
        &["between 1 and 100000", "got 0"],
    );
    assert_issue(&found, "kernel.mailbox_capacity", &["1000000", "1000001"]);
    assert_issue(
        &found,
        "kernel.mailbox_aging_ms",
        &["between 1 and", "got 0"],
    );
    assert_issue(
        &found,
        "kernel.task_timeout_seconds",
        &["between 1 and 2592000", "got 0"],
    );
    assert_issue(
        &found,
        "kernel.max_concurrent_tasks",
        &["at least 1", "got 0"],
    );
    assert_eq!(found.len(), 6, "{found:#?}");
}

#[test]
fn default_runtime_must_be_known() {
    let found = issues(r#"{"kernel": {"default_runtime": "python"}}"#);
    assert_issue(
        &found,
        "kernel.default_runtime",
        &["\"python\"", "echo, exec, tool_agent"],
    );
}

#[test]
fn agent_name_is_required() {
    let found = issues(r#"{"agents": [{"role": "worker"}]}"#);
    assert_issue(&found, "agents[0].name", &["missing required field `name`"]);
}

#[test]
fn agent_name_must_not_be_blank() {
    let found = issues(r#"{"agents": [{"name": ""}, {"name": "  "}]}"#);
    assert_issue(&found, "agents[0].name", &["must not be empty", "\"\""]);
    assert_issue(&found, "agents[1].name", &["must not be empty", "\"  \""]);
}

#[test]
fn agent_name_must_not_contain_control_characters() {
    let found = issues(r#"{"agents": [{"name": "bad\nname"}]}"#);
    assert_issue(
        &found,
        "agents[0].name",
        &["control characters", "\"bad\\nname\""],
    );
}

#[test]
fn agent_name_is_at_most_128_bytes() {
    let name = "n".repeat(129);
    let found = issues(&format!(r#"{{"agents": [{{"name": "{name}"}}]}}"#));
    assert_issue(
        &found,
        "agents[0].name",
        &["129 bytes", "at most 128", "nnnn"],
    );
    // 128 bytes is fine.
    let name = "n".repeat(128);
    let config = Fixture::new()
        .load(&format!(r#"{{"agents": [{{"name": "{name}"}}]}}"#))
        .unwrap();
    assert_eq!(config.agents[0].name, name);
}

#[test]
fn duplicate_agent_names_name_both_indexes() {
    let found = issues(r#"{"agents": [{"name": "a"}, {"name": "b"}, {"name": "a"}]}"#);
    assert_issue(
        &found,
        "agents[2] (a).name",
        &["duplicate agent name \"a\"", "agents[0]"],
    );
    assert_eq!(found.len(), 1, "{found:#?}");
}

#[test]
fn unknown_role_lists_the_valid_roles() {
    let found = issues(r#"{"agents": [{"name": "a", "role": "boss"}]}"#);
    assert_issue(&found, "agents[0] (a).role", &["\"boss\"", "daemon, agent"]);
}

#[test]
fn unknown_tier_lists_the_valid_tiers() {
    let found = issues(r#"{"agents": [{"name": "a", "cognitive_tier": "genius"}]}"#);
    assert_issue(
        &found,
        "agents[0] (a).cognitive_tier",
        &["\"genius\"", "strategic, tactical, operational"],
    );
}

#[test]
fn kernel_role_is_reserved_for_pid_1() {
    let found = issues(r#"{"agents": [{"name": "a", "role": "kernel"}]}"#);
    assert_issue(
        &found,
        "agents[0] (a).role",
        &["\"kernel\"", "reserved for PID 1"],
    );
}

#[test]
fn agent_runtime_must_be_known() {
    let found = issues(r#"{"agents": [{"name": "a", "runtime": "docker"}]}"#);
    assert_issue(
        &found,
        "agents[0] (a).runtime",
        &["\"docker\"", "echo, exec, tool_agent"],
    );
}

#[test]
fn missing_prompt_file_names_the_resolved_path() {
    let fixture = Fixture::new();
    let found = fixture.issues(r#"{"agents": [{"name": "a", "system_prompt_file": "../p/x.md"}]}"#);
    let resolved = fixture.root().join("configs").join("../p/x.md");
    assert_issue(
        &found,
        "agents[0] (a).system_prompt_file",
        &[&resolved.display().to_string(), "os error"],
    );
}

#[test]
fn a_prompt_over_kernel_limits_prompt_bytes_is_an_error() {
    let fixture = Fixture::new();
    fixture.write("big.md", &"x".repeat(256 * 1024 + 1));
    let found = fixture.issues(r#"{"agents": [{"name": "a", "system_prompt_file": "../big.md"}]}"#);
    assert_issue(
        &found,
        "agents[0] (a).system_prompt_file",
        &[
            "big.md",
            "262145 bytes",
            "at most 262144 (kernel.limits.prompt_bytes)",
        ],
    );
    let inline = format!(
        r#"{{"agents": [{{"name": "a", "system_prompt": "{}"}}]}}"#,
        "x".repeat(256 * 1024 + 1)
    );
    let found = fixture.issues(&inline);
    assert_issue(
        &found,
        "agents[0] (a).system_prompt",
        &["262145 bytes", "kernel.limits.prompt_bytes"],
    );
    // The limit is the operator's to raise.
    fixture.write("bigger.md", &"x".repeat(1024 * 1024 + 1));
    let config = fixture.load(
        r#"{"kernel": {"limits": {"prompt_bytes": 2097152}},
            "agents": [{"name": "a", "system_prompt_file": "../bigger.md"}]}"#,
    );
    let config = config.unwrap();
    assert_eq!(config.agents[0].system_prompt.len(), 1024 * 1024 + 1);
}

#[test]
fn kernel_limits_are_checked_and_apply_to_config_agents() {
    let fixture = Fixture::new();
    let found = fixture.issues(
        r#"{"kernel": {"limits": {"type_bytes": 0, "payload_bytes": 17000000, "tool": 3},
                       "mailbox_max_bytes": 100}}"#,
    );
    assert_issue(
        &found,
        "kernel.limits.type_bytes",
        &["between 1 and 65536", "got 0"],
    );
    assert_issue(
        &found,
        "kernel.limits.payload_bytes",
        &["16777216", "17000000"],
    );
    assert_issue(&found, "kernel.limits.tool", &["unknown field"]);
    assert_issue(
        &found,
        "kernel.mailbox_max_bytes",
        &["between 1024", "got 100"],
    );

    let found = fixture.issues(
        r#"{"kernel": {"limits": {"metadata_entries": 1, "model_bytes": 3, "tools": 1}},
            "agents": [{"name": "a", "model": "sonnet", "tools": ["read_file", "write_file"],
                        "metadata": {"a": "1", "b": "2"}}]}"#,
    );
    assert_issue(
        &found,
        "agents[0] (a).model",
        &["6 bytes, at most 3 (kernel.limits.model_bytes)"],
    );
    assert_issue(
        &found,
        "agents[0] (a).tools",
        &["2 entries, at most 1 (kernel.limits.tools)"],
    );
    assert_issue(&found, "agents[0] (a).metadata", &["2 entries, at most 1"]);
}

#[test]
fn limits_may_not_exceed_the_kernel() {
    let found = issues(
        r#"{"kernel": {"max_depth": 4, "max_children": 10, "max_concurrent_tasks": 2,
                       "task_timeout_seconds": 60},
            "agents": [{"name": "a", "limits": {"max_depth": 4, "max_children": 11,
                        "max_concurrent_tasks": 3, "timeout_seconds": 61}}]}"#,
    );
    assert_issue(
        &found,
        "agents[0] (a).limits.max_depth",
        &["max_depth 4 exceeds 3", "kernel.max_depth 4"],
    );
    assert_issue(
        &found,
        "agents[0] (a).limits.max_children",
        &["11", "kernel.max_children 10"],
    );
    assert_issue(
        &found,
        "agents[0] (a).limits.max_concurrent_tasks",
        &["3", "kernel.max_concurrent_tasks 2"],
    );
    assert_issue(
        &found,
        "agents[0] (a).limits.timeout_seconds",
        &["61", "kernel.task_timeout_seconds 60"],
    );
    assert_eq!(found.len(), 4, "{found:#?}");
}

#[test]
fn limits_of_zero_tasks_or_zero_timeout_are_errors() {
    let found = issues(
        r#"{"agents": [{"name": "a", "limits": {"max_concurrent_tasks": 0, "timeout_seconds": 0}}]}"#,
    );
    assert_issue(
        &found,
        "agents[0] (a).limits.max_concurrent_tasks",
        &["at least 1", "got 0"],
    );
    assert_issue(
        &found,
        "agents[0] (a).limits.timeout_seconds",
        &["at least 1", "got 0"],
    );
}

#[test]
fn a_task_may_set_max_depth() {
    let config = Fixture::new()
        .load(r#"{"agents": [{"name": "t", "role": "task", "limits": {"max_depth": 2}}]}"#)
        .unwrap();
    assert_eq!(config.agents[0].role, Role::Task);
    assert_eq!(config.agents[0].limits.max_depth, Some(2));
}

#[test]
fn a_bad_kernel_value_is_not_used_to_judge_agents() {
    let found = issues(
        r#"{"kernel": {"max_depth": "eight"}, "agents": [{"name": "a", "limits": {"max_depth": 20}}]}"#,
    );
    assert_issue(&found, "kernel.max_depth", &["\"eight\""]);
    assert_eq!(found.len(), 1, "{found:#?}");
}

#[test]
fn more_agents_than_kernel_max_children_is_an_error() {
    let found = issues(
        r#"{"kernel": {"max_children": 2}, "agents": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}"#,
    );
    assert_issue(&found, "agents", &["3 agents", "kernel.max_children 2"]);
}

#[test]
fn tools_must_be_non_empty_and_unique() {
    let found = issues(r#"{"agents": [{"name": "a", "tools": ["read_file", "", "read_file"]}]}"#);
    assert_issue(
        &found,
        "agents[0] (a).tools[1]",
        &["must not be empty", "\"\""],
    );
    assert_issue(
        &found,
        "agents[0] (a).tools[2]",
        &["duplicate tool \"read_file\"", "agents[0] (a).tools[0]"],
    );
}

#[test]
fn errors_in_three_agents_are_all_reported() {
    let found = issues(
        r#"{"agents": [{"name": "a", "role": "boss"},
                       {"name": "b", "runtime": "docker"},
                       {"name": "c", "limits": {"max_children": 1000}}]}"#,
    );
    assert_eq!(found.len(), 3, "{found:#?}");
    assert_issue(&found, "agents[0] (a).role", &["\"boss\""]);
    assert_issue(&found, "agents[1] (b).runtime", &["\"docker\""]);
    assert_issue(&found, "agents[2] (c).limits.max_children", &["1000"]);
}

#[test]
fn valid_config_loads_with_defaults_and_resolved_paths() {
    let fixture = Fixture::new();
    fixture.write("prompts/q.md", "You are the queen.");
    let config = fixture
        .load(
            r#"{"kernel": {"listen": "0.0.0.0:7000", "data_dir": "../data"},
                "agents": [{"name": "queen", "role": "daemon", "cognitive_tier": "tactical",
                            "model": "sonnet", "system_prompt_file": "../prompts/q.md",
                            "tools": ["spawn_child"], "workspace": "/srv/ws",
                            "limits": {"max_children": 8}, "metadata": {"team": "core"}},
                           {"name": "plain"}]}"#,
        )
        .unwrap();
    let configs = fixture.root().join("configs");
    assert_eq!(config.path, fixture.config_path());
    assert_eq!(config.kernel.listen, "0.0.0.0:7000".parse().unwrap());
    assert_eq!(config.kernel.data_dir, configs.join("../data"));
    assert_eq!(config.kernel.max_depth, 8);
    assert_eq!(config.kernel.mailbox_capacity, 1024);
    assert_eq!(config.kernel.default_runtime, "tool_agent");
    assert_eq!(config.kernel.workspace, None);
    // Beside the data directory, never inside it.
    assert_eq!(
        config.kernel.workspace_root(),
        fixture.root().join("data-workspace")
    );
    assert_eq!(
        config.tools.shell.keep_out.forbidden,
        [fixture.root().join("data")]
    );
    assert_eq!(
        config.tools.shell.keep_out.hidden,
        [fixture.root().join("data-workspace")]
    );
    assert_eq!(config.llm, LlmConfig::default());
    assert_eq!(config.agent.max_tool_iterations, 10);
    assert_eq!(config.tools.orchestrate.max_workers, 8);

    let queen = &config.agents[0];
    assert_eq!((queen.role, queen.tier), (Role::Daemon, Tier::Tactical));
    assert_eq!(queen.system_prompt, "You are the queen.");
    assert_eq!(
        queen.system_prompt_file,
        Some(configs.join("../prompts/q.md"))
    );
    assert_eq!(queen.workspace, Some(PathBuf::from("/srv/ws")));
    assert_eq!(queen.limits.max_children, Some(8));
    assert_eq!(queen.limits.max_depth, None);
    assert_eq!(queen.metadata.get("team").map(String::as_str), Some("core"));

    let plain = &config.agents[1];
    assert_eq!((plain.role, plain.tier), (Role::Agent, Tier::Operational));
    assert_eq!((plain.model.as_str(), plain.runtime.as_deref()), ("", None));
    assert!(plain.tools.is_empty() && plain.metadata.is_empty());
}

#[test]
fn empty_file_object_gives_the_default_kernel() {
    let fixture = Fixture::new();
    let config = fixture.load("{}").unwrap();
    let expected = KernelSettings {
        data_dir: fixture.root().join("configs/.hivekernel"),
        ..KernelSettings::default()
    };
    assert_eq!(config.kernel, expected);
    assert!(config.agents.is_empty());
}

#[test]
fn prompt_file_wins_over_inline_prompt() {
    let fixture = Fixture::new();
    fixture.write("configs/p.md", "from the file");
    let config = fixture
        .load(r#"{"agents": [{"name": "a", "system_prompt": "inline", "system_prompt_file": "p.md"}]}"#)
        .unwrap();
    assert_eq!(config.agents[0].system_prompt, "from the file");
    let config = fixture
        .load(r#"{"agents": [{"name": "a", "system_prompt": "inline"}]}"#)
        .unwrap();
    assert_eq!(config.agents[0].system_prompt, "inline");
}

#[test]
fn error_display_is_one_line_per_issue() {
    let err = Config::from_str_at(
        r#"{"bogus": 1, "kernel": {"max_depth": 0}}"#,
        Path::new("cfg/startup.json"),
        &known(),
    )
    .unwrap_err();
    let text = err.to_string();
    let lines: Vec<_> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].starts_with("cfg/startup.json: bogus: unknown field `bogus`"),
        "{text}"
    );
    assert_eq!(
        lines[1],
        "cfg/startup.json: kernel.max_depth: must be between 1 and 64, got 0"
    );

    let err = Config::from_str_at("nope", Path::new("c.json"), &known()).unwrap_err();
    assert!(
        err.to_string().starts_with("c.json: invalid JSON: "),
        "{err}"
    );
    assert_eq!(err.issues[0].to_string(), err.issues[0].message);
}

#[test]
fn shipped_configs_are_valid() {
    let known = hivekernel_kernel::runtime::RuntimeRegistry::builtin().known();
    for file in ["startup.json", "startup-openai.json", "startup-local.json"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../configs")
            .join(file);
        let config = Config::load(&path, &known).unwrap_or_else(|err| panic!("{err}"));
        let names: Vec<_> = config.agents.iter().map(|a| a.name.as_str()).collect();
        assert!(names.contains(&"queen"), "{file}: {names:?}");
        assert!(config.agents.iter().all(|a| !a.system_prompt.is_empty()));
        assert!(config.kernel.data_dir.ends_with(".hivekernel"));
        assert!(config.tools.orchestrate.worker_prompt.contains("worker"));
        // Daemons come back after any exit; tasks never do.
        let policy = |role| config.kernel.roles[&role].restart.map(|r| r.policy);
        use hivekernel_agents::RestartPolicy::{Permanent, Temporary};
        assert_eq!(policy(Role::Daemon), Some(Permanent), "{file}");
        assert_eq!(policy(Role::Task), Some(Temporary), "{file}");
    }
}

#[test]
fn unknown_tools_are_refused_with_the_known_ones() {
    let found = issues(r#"{"agents": [{"name": "a", "tools": ["read_file", "teleport"]}]}"#);
    assert_issue(
        &found,
        "agents[0] (a).tools[1]",
        &[
            "unknown tool \"teleport\"",
            "execute_task, read_file, schedule_cron, shell_exec, spawn_child, web_fetch",
        ],
    );
}

#[test]
fn the_llm_section_is_checked_field_by_field() {
    let found = issues(
        r#"{"llm": {"provider": "anthropic", "base_url": "api.example.com",
                    "api_key_env": "sk-123 secret", "request_timeout_seconds": 0,
                    "idle_timeout_seconds": 100000, "unavailable_wait_seconds": 3601,
                    "stream": "yes", "max_in_flight": 0, "default_context_tokens": 10,
                    "parallel_tool_calls": "no", "max_answer_bytes": 100,
                    "max_tool_calls": 0, "max_tool_definition_bytes": 1073741824,
                    "models": {"sonnet": ""}, "temperature": 1}}"#,
    );
    assert_issue(
        &found,
        "llm.provider",
        &["\"anthropic\"", "auto, scripted, openai"],
    );
    assert_issue(
        &found,
        "llm.base_url",
        &["must start with http:// or https://"],
    );
    assert_issue(
        &found,
        "llm.api_key_env",
        &["not an environment variable name"],
    );
    assert_issue(
        &found,
        "llm.request_timeout_seconds",
        &["between 1 and 86400, got 0"],
    );
    assert_issue(&found, "llm.idle_timeout_seconds", &["got 100000"]);
    assert_issue(&found, "llm.stream", &["expected a boolean"]);
    assert_issue(&found, "llm.parallel_tool_calls", &["expected a boolean"]);
    assert_issue(&found, "llm.unavailable_wait_seconds", &["got 3601"]);
    assert_issue(&found, "llm.max_in_flight", &["got 0"]);
    assert_issue(&found, "llm.default_context_tokens", &["got 10"]);
    assert_issue(&found, "llm.models.sonnet", &["must not be empty"]);
    assert_issue(&found, "llm.temperature", &["unknown field `temperature`"]);
    assert_issue(
        &found,
        "llm.max_answer_bytes",
        &["between 4096 and 268435456, got 100"],
    );
    assert_issue(&found, "llm.max_tool_calls", &["between 1 and 4096, got 0"]);
    assert_issue(
        &found,
        "llm.max_tool_definition_bytes",
        &["between 65536 and 67108864, got 1073741824"],
    );
    assert_eq!(found.len(), 15, "{found:#?}");
}

#[test]
fn a_price_is_checked_at_its_own_field() {
    let found = issues(
        r#"{"llm": {"prices": {"gpt": {"input": 1}, "mini": {"output_per_million": -2},
                               "nano": "free"}}}"#,
    );
    // All three at once, each at its own field.
    assert_issue(&found, "llm.prices.gpt.input", &["unknown field `input`"]);
    assert_issue(
        &found,
        "llm.prices.nano",
        &["invalid type: string \"free\", expected a JSON object"],
    );
    assert_issue(
        &found,
        "llm.prices.mini.output_per_million",
        &["between 0 and 1000000 dollars, got -2"],
    );
    assert_eq!(found.len(), 3, "{found:#?}");
}

#[test]
fn the_tool_agent_section_is_checked_and_reads_the_worker_prompt() {
    let found = issues(
        r#"{"tool_agent": {"max_tool_iterations": 0,
                           "orchestrate": {"max_workers": 0, "worker_prompt_file": "missing.md",
                                           "worker_runtime": "docker"},
                           "web": {"timeout_seconds": 0, "allow_private": true}}}"#,
    );
    assert_issue(&found, "tool_agent.web.timeout_seconds", &["got 0"]);
    assert_issue(
        &found,
        "tool_agent.web.allow_private",
        &["unknown field", "allow_private_networks"],
    );
    assert_issue(&found, "tool_agent.max_tool_iterations", &["got 0"]);
    assert_issue(&found, "tool_agent.orchestrate.max_workers", &["got 0"]);
    assert_issue(
        &found,
        "tool_agent.orchestrate.worker_prompt_file",
        &["cannot read", "missing.md"],
    );
    assert_issue(
        &found,
        "tool_agent.orchestrate.worker_runtime",
        &["\"docker\""],
    );
    assert_eq!(found.len(), 6, "{found:#?}");

    let fixture = Fixture::new();
    fixture.write("prompts/w.md", "You are a worker.");
    let config = fixture
        .load(
            r#"{"llm": {"provider": "openai", "base_url": "http://127.0.0.1:8080/v1",
                        "models": {"sonnet": "qwen"}, "context_tokens": {"sonnet": 32768},
                        "max_answer_bytes": 65536, "max_tool_calls": 8,
                        "max_tool_definition_bytes": 100000},
                "tool_agent": {"max_tool_iterations": 4,
                               "web": {"allow_private_networks": true, "max_bytes": 1000},
                               "orchestrate": {"worker_prompt_file": "../prompts/w.md",
                                               "max_workers": 3, "subtask_timeout_seconds": 9}}}"#,
        )
        .unwrap();
    assert_eq!(config.llm.provider, ProviderChoice::OpenAi);
    assert_eq!(
        config.llm.limits(),
        hivekernel_agents::llm::Limits {
            answer_bytes: 65536,
            tool_calls: 8,
            tool_definition_bytes: 100_000,
        }
    );
    assert_eq!(config.agent.max_tool_definition_bytes, 100_000);
    assert_eq!(config.kernel.models.served("sonnet"), "qwen");
    assert_eq!(config.agent.budget("sonnet"), 32768 - 4096);
    assert_eq!(config.agent.max_tool_iterations, 4);
    assert_eq!(
        &*config.tools.orchestrate.worker_prompt,
        "You are a worker."
    );
    assert_eq!(config.tools.orchestrate.max_workers, 3);
    assert_eq!(
        config.tools.orchestrate.subtask_timeout(),
        Duration::from_secs(9)
    );
}

#[test]
fn web_allow_addresses_are_ip_addresses() {
    let config = Fixture::new()
        .load(r#"{"tool_agent": {"web": {"allow_addresses": ["10.0.0.7", "::1"]}}}"#)
        .unwrap();
    assert_eq!(
        config.tools.web.allow_addresses,
        [
            "10.0.0.7".parse::<std::net::IpAddr>().unwrap(),
            "::1".parse().unwrap()
        ]
    );
    assert!(!config.tools.web.allow_private_networks);
    let found =
        issues(r#"{"tool_agent": {"web": {"allow_addresses": ["10.0.0.7", "intranet.local"]}}}"#);
    // At the entry that is wrong.
    assert_issue(
        &found,
        "tool_agent.web.allow_addresses[1]",
        &["invalid IP address syntax"],
    );
    let found = issues(r#"{"tool_agent": {"web": {"allow_addresses": "10.0.0.7"}}}"#);
    assert_issue(&found, "tool_agent.web.allow_addresses", &["a sequence"]);
}

#[test]
fn roles_and_agents_carry_restart_specs_and_strategies() {
    use hivekernel_agents::{RestartPolicy, RestartSpec, Strategy};
    let config = Fixture::new()
        .load(
            r#"{"roles": {"daemon": {"restart": {"policy": "permanent", "max_restarts": 5,
                                                  "within_seconds": 60, "backoff_ms": [1000, 30000]}},
                          "lead": {"strategy": "one_for_all"},
                          "task": {"restart": {"policy": "temporary"}}},
                "agents": [{"name": "a", "restart": {"policy": "transient", "max_restarts": 0},
                            "strategy": "rest_for_one"},
                           {"name": "b"}]}"#,
        )
        .unwrap();
    let roles = &config.kernel.roles;
    assert_eq!(roles.len(), 3);
    let daemon = roles[&Role::Daemon].restart.unwrap();
    assert_eq!(
        daemon,
        RestartSpec {
            policy: RestartPolicy::Permanent,
            max_restarts: 5,
            within_seconds: 60,
            backoff_ms: [1000, 30000],
        }
    );
    assert_eq!(roles[&Role::Daemon].strategy, None);
    assert_eq!(roles[&Role::Lead].strategy, Some(Strategy::OneForAll));
    assert_eq!(roles[&Role::Lead].restart, None);
    // Numbers left out take the defaults.
    assert_eq!(
        roles[&Role::Task].restart,
        Some(RestartSpec::new(RestartPolicy::Temporary))
    );
    let a = &config.agents[0];
    let mut expected = RestartSpec::new(RestartPolicy::Transient);
    expected.max_restarts = 0;
    assert_eq!(a.restart, Some(expected), "max_restarts 0 is allowed");
    assert_eq!(a.strategy, Some(Strategy::RestForOne));
    assert_eq!(
        (config.agents[1].restart, config.agents[1].strategy),
        (None, None)
    );
    let request = hivekernel_kernel::daemon::spawn_request(a);
    assert_eq!((request.restart, request.strategy), (a.restart, a.strategy));
}

#[test]
fn restart_and_strategy_mistakes_are_all_reported_where_they_are() {
    let found = issues(
        r#"{"roles": {"boss": {},
                      "kernel": {"strategy": "one_for_one"},
                      "daemon": {"restart": {"policy": "forever"}},
                      "task": {"restart": {"policy": "temporary", "backoff_ms": [500, 100]}},
                      "worker": {"restart": {"max_restarts": 2}},
                      "agent": {"capabilities": ["root", "file_read", "file_read"], "limits": {}},
                      "lead": {"strategy": "all_for_one"}},
            "agents": [{"name": "a",
                        "restart": {"policy": "permanent", "within_seconds": 0,
                                    "max_restarts": 5000, "backoff_ms": [1, 2, 3], "jitter": 1},
                        "strategy": "one_for_none"},
                       {"name": "b", "restart": {"policy": "permanent",
                                                 "backoff_ms": [10, 7200000]}}]}"#,
    );
    assert_issue(&found, "roles.boss", &["unknown role \"boss\"", "daemon"]);
    assert_issue(&found, "roles.kernel", &["reserved for PID 1"]);
    assert_issue(
        &found,
        "roles.daemon.restart.policy",
        &["\"forever\"", "permanent, transient, temporary"],
    );
    assert_issue(
        &found,
        "roles.task.restart.backoff_ms",
        &["first delay 500 ms is longer than the longest 100 ms"],
    );
    assert_issue(
        &found,
        "roles.worker.restart.policy",
        &[
            "missing required field `policy`",
            "permanent, transient, temporary",
        ],
    );
    assert_issue(
        &found,
        "roles.agent.limits",
        &["unknown field `limits`", "`capabilities`", "`restart`"],
    );
    assert_issue(
        &found,
        "roles.agent.capabilities[0]",
        &["unknown capability \"root\"", "spawn_children"],
    );
    assert_issue(
        &found,
        "roles.agent.capabilities[2]",
        &["duplicate capability \"file_read\""],
    );
    assert_issue(
        &found,
        "roles.lead.strategy",
        &["\"all_for_one\"", "one_for_one, one_for_all, rest_for_one"],
    );
    assert_issue(
        &found,
        "agents[0] (a).restart.within_seconds",
        &["between 1 and 2592000, got 0"],
    );
    assert_issue(
        &found,
        "agents[0] (a).restart.max_restarts",
        &["between 0 and 1000, got 5000"],
    );
    assert_issue(
        &found,
        "agents[0] (a).restart.backoff_ms",
        &["expected [first, most]", "got 3 values"],
    );
    assert_issue(
        &found,
        "agents[0] (a).restart.jitter",
        &["unknown field `jitter`"],
    );
    assert_issue(&found, "agents[0] (a).strategy", &["\"one_for_none\""]);
    assert_issue(
        &found,
        "agents[1] (b).restart.backoff_ms",
        &["at most 3600000 ms, got 7200000"],
    );
    assert_eq!(found.len(), 15, "{found:#?}");
}

#[test]
fn roles_must_be_an_object() {
    let found = issues(r#"{"roles": ["daemon"]}"#);
    assert_issue(&found, "roles", &["expected a JSON object"]);
}

#[test]
fn exec_agents_take_a_command_relative_to_the_config() {
    use std::os::unix::fs::PermissionsExt;

    let fixture = Fixture::new();
    let agent = fixture.write("agents/run.sh", "#!/bin/sh\n");
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = fixture
        .load(
            r#"{"agents": [
                {"name": "sh", "runtime": "exec", "command": ["../agents/run.sh", "--flag"],
                 "env": {"MODE": "test"}},
                {"name": "implied", "command": ["sh", "../agents/run.sh"]}]}"#,
        )
        .unwrap();
    let configs = std::path::absolute(fixture.root().join("configs")).unwrap();
    let exec = config.agents[0].exec.clone().unwrap();
    assert_eq!(
        exec.argv,
        [
            configs.join("../agents/run.sh").display().to_string(),
            "--flag".into()
        ]
    );
    assert_eq!(exec.env.get("MODE").map(String::as_str), Some("test"));
    assert_eq!(exec.cwd, Some(configs.clone()));
    let implied = config.agents[1].exec.clone().unwrap();
    assert_eq!(implied.argv, ["sh", "../agents/run.sh"]);
    assert_eq!(implied.cwd, Some(configs));
}

#[test]
fn exec_fields_are_checked_with_their_runtime() {
    let issues = issues(
        r#"{"agents": [
            {"name": "a", "runtime": "exec"},
            {"name": "b", "runtime": "echo", "command": ["sh"], "env": {"A": "1"}},
            {"name": "c", "runtime": "exec", "command": ["no-such-program-hk"]},
            {"name": "d", "command": ["sh"], "env": {"HIVEKERNEL_PID": "1"}}]}"#,
    );
    assert_issue(&issues, "agents[0] (a).command", &["needs a command"]);
    assert_issue(
        &issues,
        "agents[1] (b).command",
        &["only for runtime exec", "echo"],
    );
    assert_issue(&issues, "agents[1] (b).env", &["only for runtime exec"]);
    assert_issue(&issues, "agents[2] (c).command", &["not found in PATH"]);
    assert_issue(&issues, "agents[3] (d).env", &["set by the kernel"]);
    assert_eq!(issues.len(), 5, "{issues:#?}");
    let issues = self::issues(r#"{"kernel": {"default_runtime": "exec"}}"#);
    assert_issue(&issues, "kernel.default_runtime", &["its own command"]);
}

#[test]
fn shipped_python_agent_config_is_valid() {
    let known = hivekernel_kernel::runtime::RuntimeRegistry::builtin().known();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/python-agent.json");
    let config = Config::load(&path, &known).unwrap_or_else(|err| panic!("{err}"));
    let exec = config.agents[0].exec.clone().unwrap();
    assert_eq!(exec.argv[1], "../sdk-examples/python/echo_agent.py");
    let cwd = exec.cwd.unwrap();
    assert!(cwd.join(&exec.argv[1]).is_file(), "{cwd:?}");
}

#[test]
fn agents_carry_cron_entries_and_templates_are_parsed_but_not_started() {
    use hivekernel_kernel::cron::{CronAction, Missed, Overlap};
    let config = Fixture::new()
        .load(
            r#"{"templates": [{"name": "checker", "role": "task", "system_prompt": "Check."}],
                "agents": [{"name": "maid", "role": "daemon", "cron": [
                    {"name": "health-check", "expression": "0 */5 * * * *",
                     "description": "Check the health of every agent"},
                    {"name": "audit", "expression": "30 2 * * 1-5", "action": "spawn",
                     "template": "checker", "overlap": "allow", "missed": "run_once"},
                    {"name": "nudge", "expression": "@hourly", "action": "message",
                     "enabled": false}]}]}"#,
        )
        .unwrap();
    assert_eq!(config.templates.len(), 1);
    assert_eq!(config.templates[0].name, "checker");
    let cron = &config.agents[0].cron;
    assert_eq!(cron.len(), 3);
    assert_eq!(cron[0].action, CronAction::Execute);
    assert_eq!(cron[0].description, "Check the health of every agent");
    assert_eq!(cron[1].action, CronAction::Spawn);
    assert_eq!(cron[1].template.as_deref(), Some("checker"));
    assert_eq!(
        (cron[1].overlap, cron[1].missed),
        (Overlap::Allow, Missed::RunOnce)
    );
    assert!(!cron[2].enabled);
}

#[test]
fn cron_mistakes_are_all_reported_where_they_are() {
    let found = issues(
        r#"{"templates": [{"name": "t"}, {"name": "t", "cron": []}],
            "agents": [{"name": "a", "cron": [
                {"name": "x", "expression": "* * *"},
                {"name": "y", "expression": "* * * * *", "action": "launch"},
                {"name": "z", "expression": "* * * * *", "action": "spawn", "template": "ghost"},
                {"name": "w", "expression": "* * * * *", "overlap": "queue", "missed": "all"},
                {"name": "v", "expression": "* * * * *", "when": "now"},
                {"name": "fine", "expression": "@daily"}]},
              {"name": "b", "cron": [{"name": "fine", "expression": "@daily"}]},
              {"name": "c", "cron": {"name": "q"}}]}"#,
    );
    assert_issue(&found, "agents[0] (a).cron[0].expression", &["got 3"]);
    assert_issue(
        &found,
        "agents[0] (a).cron[1].action",
        &["\"launch\"", "execute, spawn, message"],
    );
    assert_issue(
        &found,
        "agents[0] (a).cron[2].template",
        &["\"ghost\"", "known: t"],
    );
    assert_issue(&found, "agents[0] (a).cron[3].overlap", &["\"queue\""]);
    assert_issue(&found, "agents[0] (a).cron[3].missed", &["\"all\""]);
    assert_issue(&found, "agents[0] (a).cron[4]", &["unknown field `when`"]);
    assert_issue(
        &found,
        "agents[1] (b).cron[0].name",
        &["duplicate cron name \"fine\""],
    );
    assert_issue(&found, "agents[2] (c).cron", &["JSON array"]);
    assert_issue(
        &found,
        "templates[1] (t).name",
        &["duplicate template name \"t\""],
    );
    assert_issue(&found, "templates[1] (t).cron", &["take no cron entries"]);
}

#[test]
fn artifact_and_memory_limits_load_and_are_checked_by_name() {
    let fixture = Fixture::new();
    let config = fixture
        .load(
            r#"{ "kernel": {
                "artifacts": { "max_bytes": 2048, "max_bytes_per_owner": 8192 },
                "memory": { "max_entry_bytes": 512, "max_bytes_per_agent": 4096, "max_results": 7 }
            } }"#,
        )
        .unwrap();
    assert_eq!(
        config.kernel.artifacts,
        ArtifactSettings {
            max_bytes: 2048,
            max_bytes_per_owner: 8192
        }
    );
    assert_eq!(
        config.kernel.memory,
        MemorySettings {
            max_entry_bytes: 512,
            max_bytes_per_agent: 4096,
            max_results: 7
        }
    );
    let defaults = fixture.load("{}").unwrap().kernel;
    assert_eq!(defaults.artifacts, ArtifactSettings::default());
    assert_eq!(defaults.memory, MemorySettings::default());

    let found = issues(
        r#"{ "kernel": {
            "artifacts": { "max_bytes": 0, "max_bytes_per_owner": "lots", "colour": 1 },
            "memory": { "max_entry_bytes": 2000000, "max_results": 0 }
        } }"#,
    );
    assert_issue(
        &found,
        "kernel.artifacts.max_bytes",
        &["between 1 and 67108864", "got 0"],
    );
    assert_issue(&found, "kernel.artifacts.max_bytes_per_owner", &["lots"]);
    assert_issue(&found, "kernel.artifacts.colour", &["unknown field"]);
    assert_issue(&found, "kernel.memory.max_entry_bytes", &["got 2000000"]);
    assert_issue(&found, "kernel.memory.max_results", &["between 1 and 1000"]);
    assert_eq!(found.len(), 5, "{found:#?}");
}

#[test]
fn every_range_of_the_derived_sections_is_reported_at_its_path() {
    let found = issues(
        r#"{ "kernel": {
            "storage": { "max_bytes": 5, "max_bytes_per_subtree": 0 },
            "transcripts": { "max_age_hours": 0, "max_text_bytes": 10, "enabled": "yes" },
            "connections": { "keepalive_timeout_seconds": 3601, "http_idle_timeout_ms": 99 },
            "limits": { "tools": 0, "metadata_entries": 10001 },
            "exec": { "log": { "max_bytes": 10, "keep": 101 } }
        },
        "tool_agent": { "web": { "max_redirects": 21, "max_bytes": 0 } } }"#,
    );
    assert_issue(
        &found,
        "kernel.storage.max_bytes",
        &["must be between 1048576 and 1099511627776, got 5"],
    );
    assert_issue(&found, "kernel.storage.max_bytes_per_subtree", &["got 0"]);
    assert_issue(
        &found,
        "kernel.transcripts.max_age_hours",
        &["between 1 and 876000"],
    );
    assert_issue(
        &found,
        "kernel.transcripts.max_text_bytes",
        &["between 256 and 1048576, got 10"],
    );
    assert_issue(
        &found,
        "kernel.transcripts.enabled",
        &["expected a boolean"],
    );
    assert_issue(
        &found,
        "kernel.connections.keepalive_timeout_seconds",
        &["between 1 and 3600, got 3601"],
    );
    assert_issue(
        &found,
        "kernel.connections.http_idle_timeout_ms",
        &["got 99"],
    );
    assert_issue(
        &found,
        "kernel.limits.tools",
        &["between 1 and 10000, got 0"],
    );
    assert_issue(&found, "kernel.limits.metadata_entries", &["got 10001"]);
    assert_issue(
        &found,
        "kernel.exec.log.max_bytes",
        &["10 is too small (at least 65536, or 0 never to rotate)"],
    );
    assert_issue(
        &found,
        "kernel.exec.log.keep",
        &["must be at most 100, got 101"],
    );
    assert_issue(
        &found,
        "tool_agent.web.max_redirects",
        &["between 0 and 20, got 21"],
    );
    assert_issue(&found, "tool_agent.web.max_bytes", &["got 0"]);
    assert_eq!(found.len(), 13, "{found:#?}");
}

#[test]
fn a_tool_needs_a_capability_its_role_grants() {
    let found = issues(
        r#"{"roles": {"worker": {"capabilities": ["send_message"]}},
            "agents": [{"name": "w", "role": "worker", "tools": ["execute_task", "read_file"]},
                       {"name": "a", "role": "agent", "tools": ["read_file", "spawn_child"]}]}"#,
    );
    assert_issue(
        &found,
        "agents[0] (w).tools[1]",
        &[
            "tool \"read_file\" needs capability file_read",
            "role worker",
            "roles.worker.capabilities",
        ],
    );
    // A role the config does not list has its default: an agent may read and spawn.
    assert_eq!(found.len(), 1, "{found:#?}");
}

#[test]
fn an_unlisted_role_gets_its_least_privilege_default() {
    let found = issues(
        r#"{"agents": [{"name": "t", "role": "task", "tools": ["read_file", "spawn_child",
                                                            "shell_exec", "web_fetch",
                                                            "schedule_cron"]}]}"#,
    );
    for (i, needed) in [
        (1, "spawn_children"),
        (2, "shell_exec"),
        (3, "network_access"),
        (4, "manage_cron"),
    ] {
        assert_issue(
            &found,
            &format!("agents[0] (t).tools[{i}]"),
            &[
                &format!("needs capability {needed}"),
                "roles.task.capabilities",
            ],
        );
    }
    assert_eq!(found.len(), 4, "{found:#?}");
}

#[test]
fn capabilities_all_grants_every_capability_and_other_shapes_are_refused() {
    let config = Fixture::new()
        .load(
            r#"{"roles": {"task": {"capabilities": "all"}},
                "agents": [{"name": "t", "role": "task",
                            "tools": ["shell_exec", "schedule_cron"]}]}"#,
        )
        .unwrap();
    assert_eq!(config.kernel.capabilities(Role::Task), Capabilities::ALL);
    assert_eq!(
        config.kernel.capabilities(Role::Worker),
        Capabilities::role_default(Role::Worker)
    );
    let found = issues(
        r#"{"roles": {"task": {"capabilities": "everything"},
                      "worker": {"capabilities": ["file_read", 7]}}}"#,
    );
    assert_issue(
        &found,
        "roles.task.capabilities",
        &[
            "list of capability names or \"all\"",
            "string \"everything\"",
        ],
    );
    assert_issue(
        &found,
        "roles.worker.capabilities[1]",
        &["expected a capability name", "number 7"],
    );
    assert_eq!(found.len(), 2, "{found:#?}");
}

#[test]
fn kernel_tls_resolves_paths_and_reports_every_problem() {
    let fixture = Fixture::new();
    let pair = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    fixture.write("configs/tls/server.pem", &pair.cert.pem());
    fixture.write("configs/tls/server.key", &pair.signing_key.serialize_pem());
    let config = fixture
        .load(r#"{"kernel": {"tls": {"cert": "tls/server.pem", "key": "tls/server.key"}}}"#)
        .unwrap();
    let tls = config.kernel.tls.unwrap();
    assert_eq!(tls.cert, fixture.root().join("configs/tls/server.pem"));
    assert_eq!((tls.client_ca, tls.ca), (None, None));

    let found = fixture.issues(
        r#"{"kernel": {"tls": {"cert": "tls/server.key", "key": "tls/server.pem",
                               "client_ca": "tls/none.pem", "crl": "x"}}}"#,
    );
    assert_issue(&found, "kernel.tls.crl", &["unknown field"]);
    assert_issue(&found, "kernel.tls.cert", &["server.key", "no certificate"]);
    assert_issue(&found, "kernel.tls.key", &["server.pem", "no private key"]);
    assert_issue(
        &found,
        "kernel.tls.client_ca",
        &["cannot read TLS client CA"],
    );

    let found = fixture.issues(r#"{"kernel": {"tls": {"key": "k.pem", "ca": "ca.pem"}}}"#);
    assert_issue(&found, "kernel.tls.cert", &["missing"]);
    let found = fixture.issues(r#"{"kernel": {"tls": {"ca": "ca.pem"}}}"#);
    assert_issue(&found, "kernel.tls.ca", &["needs cert and key"]);
}

#[test]
fn sandbox_grants_are_resolved_and_may_not_reach_into_the_data_directory() {
    let fixture = Fixture::new();
    let config = fixture
        .load(
            r#"{"kernel": {"data_dir": "../data",
                           "exec": {"sandbox": true, "read_only": ["../venv", "/opt/tools"]}},
                "tool_agent": {"shell": {"read_only": [".."], "read_write": ["/srv/scratch"]}}}"#,
        )
        .unwrap();
    let configs = fixture.root().join("configs");
    assert!(config.kernel.exec.sandbox);
    assert_eq!(
        config.kernel.exec.grants.read_only,
        [configs.join("../venv"), PathBuf::from("/opt/tools")]
    );
    // A grant around the data directory is fine: it is cut out of it.
    assert_eq!(config.tools.shell.grants.read_only, [configs.join("..")]);
    assert_eq!(
        config.tools.shell.grants.read_write,
        [PathBuf::from("/srv/scratch")]
    );
    assert!(!config.tools.shell.unsandboxed);

    let found = fixture.issues(
        r#"{"kernel": {"data_dir": "../data", "workspace": "../data/ws",
                       "exec": {"read_write": ["../data/logs"], "network": true}},
            "tool_agent": {"shell": {"read_only": ["../data"], "read_write": [""],
                                     "unsandboxed": "yes"}}}"#,
    );
    assert_issue(&found, "kernel.exec.network", &["unknown field"]);
    assert_issue(&found, "tool_agent.shell.unsandboxed", &["boolean"]);
    let found = fixture.issues(
        r#"{"kernel": {"data_dir": "../data", "workspace": "../data/ws",
                       "exec": {"read_write": ["../data/logs"]}},
            "tool_agent": {"shell": {"read_only": ["../data"], "read_write": [""]}}}"#,
    );
    assert_issue(
        &found,
        "kernel.exec.read_write[0]",
        &["inside the kernel's data directory", "admin token"],
    );
    assert_issue(
        &found,
        "tool_agent.shell.read_only[0]",
        &["inside the kernel's data directory"],
    );
    assert_issue(
        &found,
        "tool_agent.shell.read_write[0]",
        &["must not be empty"],
    );
    assert_issue(
        &found,
        "kernel.workspace",
        &["inside the data directory", "data-workspace"],
    );
    assert_eq!(found.len(), 4, "{found:#?}");

    // A workspace root around the data directory, and an agent's own
    // workspace inside it, are refused as well.
    let found = fixture.issues(
        r#"{"kernel": {"data_dir": "../run/data", "workspace": "../run"},
            "agents": [{"name": "a", "workspace": "../run/data/a"}]}"#,
    );
    assert_issue(&found, "kernel.workspace", &["holds the data directory"]);
    assert_issue(
        &found,
        "agents[0] (a).workspace",
        &["inside the data directory"],
    );
    assert_eq!(found.len(), 2, "{found:#?}");
}

#[test]
fn mcp_servers_load_stdio_and_http_with_env_references_expanded() {
    use hivekernel_agents::{RestartPolicy, RestartSpec};
    let fixture = Fixture::new();
    let config = fixture
        .load_env(
            r#"{"mcp_servers": {
                "web": {"url": "http://127.0.0.1:3001/mcp",
                        "headers": {"Authorization": "Bearer ${API_TOKEN}"}},
                "fs": {"command": ["npx", "-y", "@modelcontextprotocol/server-filesystem", "/tmp/x"],
                       "env": {"TOKEN": "${GITHUB_TOKEN}", "PRICE": "$$5 in $HOME"}, "cwd": "work",
                       "timeout_seconds": 120, "startup_timeout_seconds": 10,
                       "restart": {"policy": "transient", "max_restarts": 2},
                       "tools": {"include": ["read_*", "list_*"], "exclude": ["*_write"]},
                       "enabled": false, "max_output_bytes": 1048576},
                "local": {"command": ["../bin/server", "--stdio"]}}}"#,
            &[("API_TOKEN", "s3cret"), ("GITHUB_TOKEN", "ghp_1")],
        )
        .unwrap();
    let names: Vec<&str> = config.mcp.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["fs", "local", "web"], "sorted by name");

    let configs = fixture.root().join("configs");
    let fs = &config.mcp[0];
    assert_eq!(
        fs.transport,
        McpTransport::Stdio {
            command: vec![
                "npx".into(),
                "-y".into(),
                "@modelcontextprotocol/server-filesystem".into(),
                "/tmp/x".into()
            ],
            env: [
                ("PRICE".to_owned(), "$5 in $HOME".to_owned()),
                ("TOKEN".to_owned(), "ghp_1".to_owned())
            ]
            .into(),
            cwd: Some(configs.join("work")),
        }
    );
    assert_eq!(fs.call_timeout, Duration::from_secs(120));
    assert_eq!(fs.startup_timeout, Duration::from_secs(10));
    // Restart fields left out take the MCP defaults, not a process's.
    assert_eq!(
        fs.restart,
        RestartSpec {
            policy: RestartPolicy::Transient,
            max_restarts: 2,
            within_seconds: 60,
            backoff_ms: [500, 30_000],
        }
    );
    assert!(fs.tools.allows("read_file") && !fs.tools.allows("read_write"));
    assert!(!fs.tools.allows("delete"));
    assert_eq!((fs.enabled, fs.max_output_bytes), (false, 1 << 20));

    let local = &config.mcp[1];
    let program = std::path::absolute(&configs).unwrap().join("../bin/server");
    assert_eq!(
        local.transport,
        McpTransport::Stdio {
            command: vec![program.display().to_string(), "--stdio".into()],
            env: BTreeMap::new(),
            cwd: None,
        }
    );
    assert_eq!(local.call_timeout, Duration::from_secs(60));
    assert_eq!(local.startup_timeout, Duration::from_secs(30));
    assert_eq!(
        local.restart,
        RestartSpec {
            policy: RestartPolicy::Permanent,
            max_restarts: 5,
            within_seconds: 60,
            backoff_ms: [500, 30_000],
        }
    );
    assert_eq!(local.tools, McpToolFilter::default());
    assert_eq!((local.enabled, local.max_output_bytes), (true, 4 << 20));

    assert_eq!(
        config.mcp[2].transport,
        McpTransport::Http {
            url: "http://127.0.0.1:3001/mcp".into(),
            headers: [("Authorization".to_owned(), "Bearer s3cret".to_owned())].into(),
        }
    );
    assert!(Fixture::new().load("{}").unwrap().mcp.is_empty());
}

#[test]
fn mcp_server_mistakes_are_all_reported_where_they_are() {
    let long = "x".repeat(4097);
    let glob = "g".repeat(129);
    let json = r#"{"mcp_servers": {
        "both": {"command": ["sh"], "url": "http://h/mcp"},
        "none": {},
        "bad name": {"url": "http://h/mcp"},
        "empty": {"command": []},
        "args": {"command": ["", "a\u0000b", "LONG"]},
        "stdio": {"command": ["sh"], "env": {"": "x", "A=B": "y", "NUL": "a\u0000"},
                  "headers": {"X": "y"}, "cwd": ""},
        "http": {"url": "ftp://h/mcp", "env": {"A": "1"}, "cwd": "w",
                 "headers": {"Bad Name": "v", "X-Ok": "a\r\nb"}},
        "nohost": {"url": "https://"},
        "off": {"enabled": false, "command": ["sh"], "timeout_seconds": 0,
                "startup_timeout_seconds": 3601, "max_output_bytes": 1024,
                "restart": {"policy": "forever", "backoff_ms": [1]},
                "tools": {"include": [""], "exclude": ["GLOB"], "only": []}, "colour": 1}}}"#
        .replace("LONG", &long)
        .replace("GLOB", &glob);
    let found = issues(&json);
    assert_issue(&found, "mcp_servers.both", &["either command", "not both"]);
    assert_issue(&found, "mcp_servers.none", &["missing", "command", "url"]);
    assert_issue(
        &found,
        "mcp_servers[\"bad name\"]",
        &["ASCII letters, digits", "' '"],
    );
    assert_issue(&found, "mcp_servers.empty.command", &["must not be empty"]);
    assert_issue(
        &found,
        "mcp_servers.args.command[0]",
        &["program must not be empty"],
    );
    assert_issue(&found, "mcp_servers.args.command[1]", &["NUL"]);
    assert_issue(
        &found,
        "mcp_servers.args.command[2]",
        &["4097 bytes", "at most 4096"],
    );
    assert_issue(
        &found,
        "mcp_servers.stdio.env.\"\"",
        &["\"\" is not a variable name"],
    );
    assert_issue(
        &found,
        "mcp_servers.stdio.env.A=B",
        &["\"A=B\" is not a variable name"],
    );
    assert_issue(&found, "mcp_servers.stdio.env.NUL", &["NUL byte"]);
    assert_issue(
        &found,
        "mcp_servers.stdio.headers",
        &["only for a server with url"],
    );
    assert_issue(&found, "mcp_servers.stdio.cwd", &["must not be empty"]);
    assert_issue(
        &found,
        "mcp_servers.http.url",
        &["\"ftp://h/mcp\"", "http:// or https://"],
    );
    assert_issue(
        &found,
        "mcp_servers.http.env",
        &["only for a server with command"],
    );
    assert_issue(
        &found,
        "mcp_servers.http.cwd",
        &["only for a server with command"],
    );
    assert_issue(
        &found,
        "mcp_servers.http.headers.Bad Name",
        &["\"Bad Name\" is not an HTTP header name"],
    );
    assert_issue(
        &found,
        "mcp_servers.http.headers.X-Ok",
        &["control character"],
    );
    assert_issue(&found, "mcp_servers.nohost.url", &["has no host"]);
    // A disabled server is checked all the same.
    assert_issue(
        &found,
        "mcp_servers.off.timeout_seconds",
        &["between 1 and 86400, got 0"],
    );
    assert_issue(
        &found,
        "mcp_servers.off.startup_timeout_seconds",
        &["between 1 and 3600, got 3601"],
    );
    assert_issue(
        &found,
        "mcp_servers.off.max_output_bytes",
        &["between 4096 and 268435456, got 1024"],
    );
    assert_issue(
        &found,
        "mcp_servers.off.restart.policy",
        &["\"forever\"", "permanent, transient, temporary"],
    );
    assert_issue(
        &found,
        "mcp_servers.off.restart.backoff_ms",
        &["expected [first, most]", "got 1 values"],
    );
    assert_issue(
        &found,
        "mcp_servers.off.tools.include[0]",
        &["1 to 128 bytes, got 0"],
    );
    assert_issue(
        &found,
        "mcp_servers.off.tools.exclude[0]",
        &["got 129 bytes"],
    );
    assert_issue(&found, "mcp_servers.off.tools.only", &["unknown field"]);
    assert_issue(&found, "mcp_servers.off.colour", &["unknown field"]);
    assert_eq!(found.len(), 27, "{found:#?}");

    let found = issues(r#"{"mcp_servers": ["fs"]}"#);
    assert_issue(&found, "mcp_servers", &["expected a JSON object"]);
    let found = issues(r#"{"mcp_servers": {"fs": "npx"}}"#);
    assert_issue(&found, "mcp_servers.fs", &["expected a JSON object"]);
    assert_eq!(found.len(), 1, "{found:#?}");
}

#[test]
fn a_missing_variable_is_an_issue_where_it_is_named() {
    let found = Fixture::new()
        .load_env(
            r#"{"mcp_servers": {
                "gh": {"url": "${GH_URL}", "headers": {"Authorization": "Bearer ${GITHUB_TOKEN}"}},
                "fs": {"command": ["${FS_BIN}"], "env": {"K": "${X"}}}}"#,
            &[("GH_URL", "ftp://secret@host")],
        )
        .unwrap_err();
    assert_issue(
        &found,
        "mcp_servers.gh.headers.Authorization",
        &["environment variable GITHUB_TOKEN is not set"],
    );
    // The expanded URL is never quoted: it may hold a secret.
    assert_issue(
        &found,
        "mcp_servers.gh.url",
        &["\"${GH_URL}\" (expanded)", "http:// or https://"],
    );
    assert!(!found.iter().any(|i| i.message.contains("secret")));
    assert_issue(
        &found,
        "mcp_servers.fs.command[0]",
        &["environment variable FS_BIN is not set"],
    );
    assert_issue(&found, "mcp_servers.fs.env.K", &["without a closing"]);
    assert_eq!(found.len(), 4, "{found:#?}");
}

#[test]
fn agents_name_mcp_servers_in_their_tools() {
    let servers = r#""mcp_servers": {"fs": {"command": ["sh"]},
                                      "web": {"url": "http://h/mcp"},
                                      "off": {"command": ["sh"], "enabled": false}}"#;
    let config = Fixture::new()
        .load(&format!(
            r#"{{{servers},
                "roles": {{"agent": {{"capabilities": ["file_read", "mcp_tools"]}}}},
                "agents": [{{"name": "a", "tools": ["read_file", "mcp:fs", "mcp:fs/read_file"]}}],
                "templates": [{{"name": "t", "tools": ["mcp:web/search"]}}]}}"#
        ))
        .unwrap();
    assert_eq!(
        config.agents[0].tools,
        ["read_file", "mcp:fs", "mcp:fs/read_file"]
    );
    assert_eq!(config.templates[0].tools, ["mcp:web/search"]);

    let found = issues(&format!(
        r#"{{{servers},
            "roles": {{"worker": {{"capabilities": ["file_read"]}}, "agent": {{"capabilities": "all"}}}},
            "agents": [{{"name": "a", "tools": ["mcp:nope", "mcp:off/x", "mcp:", "mcp:fs", "mcp:fs"]}},
                       {{"name": "w", "role": "worker", "tools": ["read_file", "mcp:fs/read"]}}],
            "templates": [{{"name": "t", "tools": ["mcp:a b"]}}]}}"#
    ));
    assert_issue(
        &found,
        "agents[0] (a).tools[0]",
        &["unknown MCP server \"nope\" (known: fs, off, web)"],
    );
    assert_issue(
        &found,
        "agents[0] (a).tools[1]",
        &["MCP server \"off\" is disabled", "mcp_servers.off.enabled"],
    );
    assert_issue(&found, "agents[0] (a).tools[2]", &["\"mcp:\"", "1 to 64"]);
    assert_issue(
        &found,
        "agents[0] (a).tools[4]",
        &["duplicate tool \"mcp:fs\"", "tools[3]"],
    );
    assert_issue(
        &found,
        "agents[1] (w).tools[1]",
        &[
            "tool \"mcp:fs/read\" needs capability mcp_tools",
            "role worker",
            "roles.worker.capabilities",
        ],
    );
    assert_issue(&found, "templates[0] (t).tools[0]", &["\"mcp:a b\""]);
    assert_eq!(found.len(), 6, "{found:#?}");

    let found = issues(
        r#"{"roles": {"agent": {"capabilities": ["mcp_tools"]}},
            "agents": [{"name": "a", "tools": ["mcp:fs"]}]}"#,
    );
    assert_issue(
        &found,
        "agents[0] (a).tools[0]",
        &["unknown MCP server \"fs\" (no mcp_servers configured)"],
    );
}

#[test]
fn approval_rules_are_read_per_role_and_agent_and_bad_ones_are_named() {
    let config = Fixture::new()
        .load(
            r#"{"roles": {"agent": {"capabilities": "all",
                                    "approval": [{"tool": "shell_exec", "arguments": "rm *"}]}},
                "agents": [{"name": "a", "tools": ["shell_exec"],
                            "approval": [{"tool": "spawn_child", "timeout_seconds": 30,
                                          "on_timeout": "approve"}]}]}"#,
        )
        .unwrap();
    let role = &config.kernel.roles[&Role::Agent].approval;
    assert_eq!(role.len(), 1);
    assert_eq!(role[0].arguments.as_deref(), Some("rm *"));
    assert_eq!(
        role[0].timeout_seconds,
        hivekernel_agents::approval::DEFAULT_APPROVAL_TIMEOUT_SECONDS
    );
    let own = &config.agents[0].approval;
    assert_eq!(
        (own[0].tool.as_str(), own[0].timeout_seconds),
        ("spawn_child", 30)
    );
    assert_eq!(own[0].on_timeout, hivekernel_agents::OnTimeout::Approve);

    let found = issues(
        r#"{"roles": {"agent": {"approval": [{"tool": "teleport"}, {"arguments": "x"}]}},
            "agents": [{"name": "a", "approval": [{"tool": "read_file", "timeout_seconds": 0,
                                                    "on_timeout": "shrug", "when": 1}]},
                       {"name": "b", "approval": {"tool": "read_file"}}]}"#,
    );
    assert_issue(
        &found,
        "roles.agent.approval[0].tool",
        &["unknown tool \"teleport\""],
    );
    assert_issue(
        &found,
        "roles.agent.approval[1].tool",
        &["missing required field `tool`"],
    );
    assert_issue(
        &found,
        "agents[0] (a).approval[0].timeout_seconds",
        &["between 1 and 86400"],
    );
    assert_issue(
        &found,
        "agents[0] (a).approval[0].on_timeout",
        &["\"shrug\"", "deny, approve"],
    );
    assert_issue(
        &found,
        "agents[0] (a).approval[0].when",
        &["unknown field `when`"],
    );
    assert_issue(
        &found,
        "agents[1] (b).approval",
        &["expected a list of approval rules"],
    );
    assert_eq!(found.len(), 6, "{found:#?}");
}

#[test]
fn the_notify_webhook_is_read_with_its_secrets_from_the_environment_and_bad_ones_are_named() {
    let vars = [
        ("NOTIFY_URL", "https://hooks.example.com/T0/B0/s3cret"),
        ("NOTIFY_AUTH", "Bearer abc"),
    ];
    let fixture = Fixture::new();
    let issues = |json: &str| fixture.load_env(json, &vars).unwrap_err();
    let config = fixture
        .load_env(
            r#"{"kernel": {"notify": {"url_env": "NOTIFY_URL",
                                      "headers_env": {"Authorization": "NOTIFY_AUTH"},
                                      "retries": 2}}}"#,
            &vars,
        )
        .unwrap();
    let notify = config.kernel.notify.unwrap();
    assert_eq!(
        notify.url.as_str(),
        "https://hooks.example.com/T0/B0/s3cret"
    );
    assert_eq!(
        notify.headers,
        [("Authorization".to_owned(), "Bearer abc".to_owned())]
    );
    assert_eq!((notify.retries, notify.timeout.as_secs()), (2, 10));
    // Its secrets stay out of logs.
    let shown = format!("{notify:?}");
    assert!(
        !shown.contains("s3cret") && !shown.contains("abc"),
        "{shown}"
    );
    assert_eq!(notify.shown(), "https://hooks.example.com");

    let found = issues(r#"{"kernel": {"notify": {"url": "not a url"}}}"#);
    assert_issue(&found, "kernel.notify.url", &["not a URL"]);
    let found = issues(r#"{"kernel": {"notify": {"url": "http://127.0.0.1:9/hook"}}}"#);
    assert_issue(
        &found,
        "kernel.notify.url",
        &["127.0.0.1", "allow_private_networks"],
    );
    let found = issues(r#"{"kernel": {"notify": {"url": "ftp://example.com/x"}}}"#);
    assert_issue(&found, "kernel.notify.url", &["only http and https"]);
    let found = issues(
        r#"{"kernel": {"notify": {"url_env": "NOTIFY_UNSET",
                                  "headers_env": {"Bad Header": "NOTIFY_AUTH",
                                                  "X-Token": "NOTIFY_UNSET"},
                                  "timeout_seconds": 0}}}"#,
    );
    assert_issue(
        &found,
        "kernel.notify.url_env",
        &["NOTIFY_UNSET is not set"],
    );
    assert_issue(
        &found,
        "kernel.notify.headers_env.Bad Header",
        &["not a valid header name"],
    );
    assert_issue(
        &found,
        "kernel.notify.headers_env.X-Token",
        &["NOTIFY_UNSET is not set"],
    );
    assert_issue(
        &found,
        "kernel.notify.timeout_seconds",
        &["between 1 and 300"],
    );
    let found = issues(r#"{"kernel": {"notify": {"retries": 1}}}"#);
    assert_issue(&found, "kernel.notify.url", &["missing"]);
    // Loopback when asked for.
    let config = fixture
        .load_env(
            r#"{"kernel": {"notify": {"url": "http://127.0.0.1:9/hook",
                                      "allow_private_networks": true}}}"#,
            &vars,
        )
        .unwrap();
    assert!(config.kernel.notify.is_some());
}

#[test]
fn the_dashboard_is_on_beside_a_loopback_control_plane_unless_told_otherwise() {
    let at = |listen: &str| listen.parse::<std::net::SocketAddr>().unwrap();
    let default = DashboardSettings::default();
    assert_eq!(
        default.address(at("127.0.0.1:50051")),
        Some((at("127.0.0.1:50052"), false))
    );
    assert_eq!(
        default.address(at("[::1]:7000")),
        Some((at("[::1]:7001"), false))
    );
    assert_eq!(
        default.address(at("127.0.0.1:0")),
        Some((at("127.0.0.1:0"), false))
    );
    assert_eq!(
        default.address(at("127.0.0.1:65535")),
        Some((at("127.0.0.1:0"), false))
    );
    // Off beside a control plane others reach, unless asked for.
    assert_eq!(default.address(at("0.0.0.0:50051")), None);
    let asked = DashboardSettings {
        enabled: Some(true),
        listen: None,
        ..DashboardSettings::default()
    };
    assert_eq!(
        asked.address(at("0.0.0.0:50051")),
        Some((at("0.0.0.0:50052"), true))
    );
    let placed = DashboardSettings {
        enabled: None,
        listen: Some(at("127.0.0.1:8080")),
        ..DashboardSettings::default()
    };
    assert_eq!(
        placed.address(at("10.0.0.1:50051")),
        Some((at("127.0.0.1:8080"), true))
    );
    let off = DashboardSettings {
        enabled: Some(false),
        listen: None,
        ..DashboardSettings::default()
    };
    assert_eq!(off.address(at("127.0.0.1:50051")), None);
}

#[test]
fn skill_directories_resolve_beside_the_config_and_tool_lists_select_skills() {
    let fixture = Fixture::new();
    let config = fixture
        .load(
            r#"{"kernel": {"skills": ["../skills", "/srv/skills"]},
                "tool_agent": {"skills": {"catalogue_tokens": 900}},
                "agents": [
                  {"name": "ops", "tools": ["skills"], "skills": ["../ops-skills"]},
                  {"name": "one", "tools": ["skill:triage-build", "read_file"]}
                ]}"#,
        )
        .unwrap();
    let configs = fixture.root().join("configs");
    assert_eq!(
        config.kernel.skills,
        [configs.join("../skills"), PathBuf::from("/srv/skills")]
    );
    assert_eq!(config.agents[0].skills, [configs.join("../ops-skills")]);
    assert!(config.agents[1].skills.is_empty());
    assert_eq!(config.agent.skills.catalogue_tokens, 900);
    assert_eq!(config.agent.skills.active_tokens, 16_000);
    let request = hivekernel_kernel::daemon::spawn_request(&config.agents[0]);
    assert_eq!(request.skills, config.agents[0].skills);
}

#[test]
fn skill_mistakes_are_all_reported_where_they_are() {
    let issues = issues(
        r#"{"kernel": {"skills": ["", "a", "a"]},
            "tool_agent": {"skills": {"catalogue_tokens": 5, "active": 1}},
            "agents": [
              {"name": "x", "tools": ["skill:", "skill:a b", "skills", "skills"],
               "skills": "not-a-list"}
            ]}"#,
    );
    assert_issue(&issues, "kernel.skills[0]", &["must not be empty"]);
    assert_issue(
        &issues,
        "kernel.skills[2]",
        &["duplicate directory", "kernel.skills[1]"],
    );
    assert_issue(&issues, "tool_agent.skills.catalogue_tokens", &["100"]);
    assert_issue(&issues, "tool_agent.skills.active", &["unknown field"]);
    assert_issue(&issues, "agents[0] (x).tools[0]", &["skill name is empty"]);
    assert_issue(&issues, "agents[0] (x).tools[1]", &["no spaces"]);
    assert_issue(&issues, "agents[0] (x).tools[3]", &["duplicate tool"]);
    assert_issue(&issues, "agents[0] (x).skills", &["sequence"]);
}

#[test]
fn approval_rules_name_the_skill_tools_not_skill_entries() {
    let issues = issues(
        r#"{"agents": [{"name": "x", "tools": ["skills"],
              "approval": [{"tool": "skill_read"}, {"tool": "skills"}]}]}"#,
    );
    assert_issue(
        &issues,
        "agents[0] (x).approval[1].tool",
        &["selects skills", "skill_view"],
    );
    assert_eq!(issues.len(), 1, "{issues:#?}");
}

#[test]
fn one_served_model_a_default_and_prices_only_where_set() {
    let fixture = Fixture::new();
    let json = r#"{
        "llm": {"models": {"sonnet": "gpt-4o", "mini": "gpt-4o-mini"},
                "default_model": "sonnet",
                "prices": {"gpt-4o": {"input_per_million": 2.5, "output_per_million": 10}}},
        "agents": [
            {"name": "named", "role": "daemon", "model": "mini", "system_prompt": "x"},
            {"name": "unnamed", "role": "daemon", "system_prompt": "x"},
            {"name": "cmd", "role": "daemon", "runtime": "exec", "command": ["true"]}
        ]}"#;
    let config = fixture.load_env(json, &[]).unwrap();
    let names = &config.kernel.models;
    assert_eq!(names.model_of(""), "sonnet");
    assert_eq!(names.model_of("mini"), "mini");
    assert_eq!(names.served("sonnet"), "gpt-4o");
    assert_eq!(names.served("other"), "other");
    // Priced by the logical name, which carries its served id's price.
    assert!(config.kernel.prices.contains_key(names.priced_as("sonnet")));
    let (lines, warnings) = config.model_lines();
    assert!(lines.contains("named    mini, sent as gpt-4o"), "{lines}");
    assert!(
        lines.contains("unnamed  sonnet (the default), sent as gpt-4o"),
        "{lines}"
    );
    assert!(
        lines.contains("cmd      none (the exec runtime calls no model)"),
        "{lines}"
    );
    assert!(warnings.is_empty(), "{warnings:?}");

    // One served model for every name: prices only for it (none here).
    let config = fixture
        .load_env(json, &[(MODEL_ENV, " qwen2.5:0.5b ")])
        .unwrap();
    let names = &config.kernel.models;
    assert_eq!(names.served("sonnet"), "qwen2.5:0.5b");
    assert_eq!(names.served("anything"), "qwen2.5:0.5b");
    assert!(!config.kernel.prices.contains_key(names.priced_as("sonnet")));
    let (lines, _) = config.model_lines();
    assert!(
        lines.starts_with("models (every one sent as qwen2.5:0.5b)"),
        "{lines}"
    );
    // The flag wins over the environment.
    let mut config = config;
    config.serve_all(Some("gpt-4o"));
    assert_eq!(config.kernel.models.served("mini"), "gpt-4o");
    assert!(
        config
            .kernel
            .prices
            .contains_key(config.kernel.models.priced_as("mini"))
    );

    // Without a default, a model-calling agent that names none is warned of.
    let bare = json.replace(r#""default_model": "sonnet","#, "");
    let config = fixture.load_env(&bare, &[]).unwrap();
    let (lines, warnings) = config.model_lines();
    assert!(
        lines.contains("unnamed  none (set its model or llm.default_model)"),
        "{lines}"
    );
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("unnamed"), "{warnings:?}");

    let issues = fixture
        .load_env(
            &json.replace(r#""default_model": "sonnet""#, r#""default_model": " ""#),
            &[],
        )
        .unwrap_err();
    assert!(
        issues
            .iter()
            .any(|issue| issue.location == "llm.default_model"),
        "{issues:?}"
    );
}

#[test]
fn a_cluster_section_is_read_with_its_defaults() {
    let config = Fixture::new()
        .load(
            r#"{"kernel": {"cluster": {"servers": ["nats://10.0.0.1:4222", "tls://nats.example:4443"],
                "node": "gpu-1", "labels": {"gpu": "true"}}}, "agents": []}"#,
        )
        .unwrap();
    let cluster = config.kernel.cluster.unwrap();
    assert_eq!(
        cluster.servers,
        ["nats://10.0.0.1:4222", "tls://nats.example:4443"]
    );
    assert_eq!(cluster.node, "gpu-1");
    assert_eq!(cluster.labels.get("gpu").map(String::as_str), Some("true"));
    assert_eq!(cluster.heartbeat_ms, 1_000);
    assert_eq!(cluster.node_ttl_ms, 5_000);
    assert_eq!(cluster.replicas, None);
    let alone = Fixture::new().load(r#"{"agents": []}"#).unwrap();
    assert_eq!(alone.kernel.cluster, None);
}

#[test]
fn a_node_signs_in_to_nats_with_files_beside_the_config() {
    use std::os::unix::fs::PermissionsExt;
    let fixture = Fixture::new();
    let seed = fixture.write(
        "configs/nats/node.nk",
        &nkeys::KeyPair::new_user().seed().unwrap(),
    );
    std::fs::set_permissions(&seed, std::fs::Permissions::from_mode(0o600)).unwrap();
    let config = fixture
        .load(
            r#"{"kernel": {"cluster": {"servers": ["nats://10.0.0.1:4222"], "node": "a",
                "nkey_file": "nats/node.nk", "insecure": true}}, "agents": []}"#,
        )
        .unwrap();
    let cluster = config.kernel.cluster.unwrap();
    assert_eq!(
        cluster.nkey_file,
        Some(fixture.root().join("configs/nats/node.nk"))
    );
    assert!(cluster.insecure && cluster.has_credentials());

    let with_password =
        ClusterSettings::new(vec!["nats://alice:s3cret@10.0.0.1:4222".into()], "a".into());
    assert!(with_password.has_credentials());
    let shown = format!("{with_password:?}");
    assert!(
        shown.contains("alice:***@") && !shown.contains("s3cret"),
        "{shown}"
    );
    assert!(!ClusterSettings::new(vec!["nats://h:1".into()], "a".into()).has_credentials());
}

#[test]
fn the_cluster_secret_is_a_private_file_of_32_bytes_at_least() {
    use std::os::unix::fs::PermissionsExt;
    let fixture = Fixture::new();
    let private = |relative: &str, text: &str, mode: u32| {
        let path = fixture.write(relative, text);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    };
    let secret = private(
        "configs/nats/cluster.secret",
        &format!("{}\n", "ab".repeat(32)),
        0o600,
    );
    private("configs/open.secret", &"ab".repeat(32), 0o640);
    private(
        "configs/short.secret",
        "0123456789abcdef0123456789abcde\n",
        0o600,
    );
    let cluster = |file: &str| {
        format!(
            r#"{{"kernel": {{"cluster": {{"servers": ["nats://10.0.0.1:4222"], "node": "a",
                "insecure": true, "secret_file": "{file}"}}}}, "agents": []}}"#
        )
    };
    let config = fixture.load(&cluster("nats/cluster.secret")).unwrap();
    assert_eq!(config.kernel.cluster.unwrap().secret_file, Some(secret));
    let issues = fixture.issues(&cluster("open.secret"));
    assert_issue(
        &issues,
        "kernel.cluster.secret_file",
        &["mode 640", "chmod 600"],
    );
    let issues = fixture.issues(&cluster("short.secret"));
    assert_issue(
        &issues,
        "kernel.cluster.secret_file",
        &["holds 31 bytes, at least 32", "hivekernel cluster secret"],
    );
    let issues = fixture.issues(&cluster("missing.secret"));
    assert_issue(
        &issues,
        "kernel.cluster.secret_file",
        &["cannot read cluster secret file"],
    );
    let text = format!("{issues:?}");
    assert!(!text.contains("abab"), "{text}");
}

#[test]
fn a_bad_way_to_sign_in_to_nats_is_refused_at_its_setting() {
    let fixture = Fixture::new();
    fixture.write(
        "configs/open.nk",
        &nkeys::KeyPair::new_user().seed().unwrap(),
    );
    let issues = fixture.issues(
        r#"{"kernel": {"cluster": {"servers": ["nats://10.0.0.1:4222"], "node": "a",
            "creds_file": "missing.creds", "tls_cert": "client.pem"}}}"#,
    );
    assert_issue(
        &issues,
        "kernel.cluster.creds_file",
        &["cannot read credentials file", "missing.creds"],
    );
    assert_issue(&issues, "kernel.cluster.tls_key", &["missing", "tls_cert"]);
    let issues = fixture.issues(
        r#"{"kernel": {"cluster": {"servers": ["nats://10.0.0.1:4222"], "node": "a",
            "nkey_file": "open.nk"}}}"#,
    );
    assert_issue(
        &issues,
        "kernel.cluster.nkey_file",
        &["mode 644", "chmod 600"],
    );

    let issues = self::issues(
        r#"{"kernel": {"cluster": {"servers": ["nats://10.0.0.1:4222"], "node": "a",
            "tls_key": "client.key", "tls_ca": "nowhere/ca.pem"}}}"#,
    );
    assert_issue(&issues, "kernel.cluster.tls_cert", &["missing", "tls_key"]);

    let issues = self::issues(
        r#"{"kernel": {"cluster": {"servers": ["nats://10.0.0.1:4222"], "node": "a",
            "tls_ca": "nowhere/ca.pem"}}}"#,
    );
    assert_issue(
        &issues,
        "kernel.cluster.tls_ca",
        &["cannot read NATS TLS CA", "ca.pem"],
    );

    // Two ways at once, and URLs that disagree; no secret is ever quoted.
    let fixture = Fixture::new();
    let seed = fixture.write(
        "configs/node.nk",
        &nkeys::KeyPair::new_user().seed().unwrap(),
    );
    std::fs::set_permissions(&seed, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let issues = fixture.issues(
        r#"{"kernel": {"cluster": {"node": "a", "nkey_file": "node.nk",
            "servers": ["nats://alice:s3cret@10.0.0.1:4222", "nats://alice:other@10.0.0.2:4222",
                        "nats://bob:s3cret@10.0.0.3"]}}}"#,
    );
    assert_issue(
        &issues,
        "kernel.cluster.servers[2]",
        &["bob:***@", "names no port"],
    );
    let issues = fixture.issues(
        r#"{"kernel": {"cluster": {"node": "a", "nkey_file": "node.nk",
            "servers": ["nats://alice:s3cret@10.0.0.1:4222", "nats://alice:other@10.0.0.2:4222"]}}}"#,
    );
    assert_issue(
        &issues,
        "kernel.cluster.servers[1]",
        &["other credentials than server [0]"],
    );
    assert_issue(
        &issues,
        "kernel.cluster.nkey_file",
        &["beside credentials in"],
    );
    let text = format!("{issues:?}");
    assert!(
        !text.contains("s3cret") && !text.contains("other@"),
        "{text}"
    );
    // A value of the wrong type is quoted by the parser, its secret hidden.
    let issues = self::issues(r#"{"kernel": {"cluster": {"servers": "nats://alice:s3cret@h:1"}}}"#);
    assert_issue(
        &issues,
        "kernel.cluster.servers",
        &["\"nats://alice:***@h:1\""],
    );
}

#[test]
fn config_agents_may_be_placed_on_a_node_or_by_labels() {
    let config = Fixture::new()
        .load(
            r#"{"agents": [
                {"name": "pinned", "node": "gpu-1"},
                {"name": "labelled", "where": {"gpu": "true", "zone": "eu-1"}},
                {"name": "free"}]}"#,
        )
        .unwrap();
    let [pinned, labelled, free] = &config.agents[..] else {
        panic!("{:?}", config.agents);
    };
    assert_eq!(pinned.node.as_deref(), Some("gpu-1"));
    assert!(pinned.node_labels.is_empty());
    assert_eq!(labelled.node, None);
    assert_eq!(
        labelled.node_labels.get("zone").map(String::as_str),
        Some("eu-1")
    );
    assert_eq!((&free.node, free.node_labels.len()), (&None, 0));

    let long = "v".repeat(65);
    let issues = issues(&format!(
        r#"{{"agents": [
            {{"name": "a", "node": "a.b"}},
            {{"name": "b", "where": {{"bad key": "1"}}}},
            {{"name": "c", "where": {{"zone": "{long}"}}}},
            {{"name": "d", "where": "gpu"}}],
          "templates": [{{"name": "t", "node": "x"}}]}}"#
    ));
    assert_issue(
        &issues,
        "agents[0] (a).node",
        &["only ASCII letters, digits"],
    );
    assert_issue(&issues, "agents[1] (b).where", &["key", "\"bad key\""]);
    assert_issue(
        &issues,
        "agents[2] (c).where.zone",
        &["65 bytes", "at most 64"],
    );
    assert_issue(&issues, "agents[3] (d).where", &["expected a map"]);
    assert_issue(&issues, "templates[0] (t).node", &["not placed", "--node"]);
}

#[test]
fn a_bad_cluster_section_is_refused_field_by_field() {
    let issues = issues(
        r#"{"kernel": {"cluster": {"servers": ["http://x:1", "nats://host"], "node": "a.b",
            "labels": {"bad key": "v"}, "heartbeat_ms": 50, "node_ttl_ms": 100, "replicas": 9}}}"#,
    );
    assert_issue(
        &issues,
        "kernel.cluster.servers[0]",
        &["scheme \"http\"", "nats://"],
    );
    assert_issue(&issues, "kernel.cluster.servers[1]", &["names no port"]);
    assert_issue(
        &issues,
        "kernel.cluster.node",
        &["only ASCII letters, digits"],
    );
    assert_issue(&issues, "kernel.cluster.labels", &["\"bad key\""]);
    assert_issue(
        &issues,
        "kernel.cluster.heartbeat_ms",
        &["50", "100 to 60000"],
    );
    assert_issue(
        &issues,
        "kernel.cluster.node_ttl_ms",
        &["at least 3 heartbeats"],
    );
    assert_issue(&issues, "kernel.cluster.replicas", &["1 to 5"]);
    let missing = self::issues(r#"{"kernel": {"cluster": {"node": "a"}}}"#);
    assert_issue(&missing, "kernel.cluster.servers", &["is required"]);
    let wrong_type = self::issues(r#"{"kernel": {"cluster": {"servers": "nats://a:1"}}}"#);
    assert_issue(
        &wrong_type,
        "kernel.cluster.servers",
        &["expected a sequence"],
    );
}

#[test]
fn dashboard_hosts_are_names_without_ports() {
    let config = Fixture::new()
        .load(r#"{"kernel": {"dashboard": {"hosts": ["Kernel.Example", "ops-1.internal"]}}}"#)
        .unwrap();
    assert_eq!(
        config.kernel.dashboard.hosts,
        ["kernel.example", "ops-1.internal"]
    );
    let found = issues(
        r#"{"kernel": {"dashboard": {"hosts": ["ok.example", "evil.example:80", "", "a b"]}}}"#,
    );
    assert_issue(
        &found,
        "kernel.dashboard.hosts[1]",
        &["\"evil.example:80\" is not a host name", "no port"],
    );
    assert_issue(&found, "kernel.dashboard.hosts[2]", &["is not a host name"]);
    assert_issue(&found, "kernel.dashboard.hosts[3]", &["is not a host name"]);
    assert_eq!(found.len(), 3, "{found:#?}");
}
