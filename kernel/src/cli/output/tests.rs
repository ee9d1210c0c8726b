use hivekernel_proto::v1 as pb;

use super::*;

fn proc(pid: u64, ppid: u64, name: &str, role: pb::Role, state: pb::ProcessState) -> ProcessInfo {
    ProcessInfo {
        pid,
        ppid,
        name: name.to_owned(),
        role: role as i32,
        tier: pb::CognitiveTier::Tactical as i32,
        state: state as i32,
        runtime: "echo".to_owned(),
        ..ProcessInfo::default()
    }
}

fn sample() -> Vec<ProcessInfo> {
    use pb::ProcessState::{Idle, Zombie};
    vec![
        proc(1, 0, "kernel", pb::Role::Kernel, Idle),
        proc(2, 1, "queen", pb::Role::Daemon, Idle),
        proc(4, 2, "w1", pb::Role::Worker, Idle),
        proc(5, 2, "w2", pb::Role::Worker, Zombie),
        proc(6, 4, "t", pb::Role::Task, Idle),
        proc(3, 1, "assistant", pb::Role::Agent, Idle),
    ]
}

#[test]
fn tree_draws_branches_in_pid_order() {
    let expected = "\
kernel (1) kernel/tactical idle
├─ queen (2) daemon/tactical idle
│  ├─ w1 (4) worker/tactical idle
│  │  └─ t (6) task/tactical idle
│  └─ w2 (5) worker/tactical zombie
└─ assistant (3) agent/tactical idle
";
    assert_eq!(tree(&sample()), expected);
}

#[test]
fn tree_of_a_subtree_roots_at_the_first_process_without_a_listed_parent() {
    let procs: Vec<_> = sample()
        .into_iter()
        .filter(|p| [4, 6].contains(&p.pid))
        .collect();
    assert_eq!(
        tree(&procs),
        "w1 (4) worker/tactical idle\n└─ t (6) task/tactical idle\n"
    );
}

#[test]
fn tree_never_drops_a_process_in_a_parent_cycle() {
    let procs = vec![
        proc(7, 8, "a", pb::Role::Agent, pb::ProcessState::Idle),
        proc(8, 7, "b", pb::Role::Agent, pb::ProcessState::Idle),
    ];
    let text = tree(&procs);
    assert!(text.contains("a (7)") && text.contains("b (8)"), "{text}");
    assert!(tree(&[]).is_empty());
}

#[test]
fn table_aligns_columns_under_the_header() {
    let mut procs = sample();
    procs[1].started_at_unix_ms = 1_000;
    procs[1].usage = Some(pb::LlmUsage {
        calls: 3,
        prompt_tokens: 12_000,
        completion_tokens: 345,
        cost_usd: 0.0,
    });
    procs[1].model = "sonnet".to_owned();
    let text = table(&procs, 1_000 + 3_725_000);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 7);
    assert!(lines[0].starts_with("PID  PPID  NAME"), "{}", lines[0]);
    assert!(
        lines[0].ends_with("MAILBOX  TOKENS  MODEL   RUNTIME"),
        "{}",
        lines[0]
    );
    let state_col = lines[0].find("STATE");
    assert_eq!(lines[4].find("zombie"), state_col);
    assert!(lines[0].contains("STATE   AGE    RESTARTS"), "{}", lines[0]);
    // Human figures: its age and its tokens.
    let row: Vec<&str> = lines[2].split_whitespace().collect();
    assert!(
        row.contains(&"1h02m") && row.contains(&"12,345") && row.contains(&"sonnet"),
        "{row:?}"
    );
}

#[test]
fn process_json_uses_lowercase_names_and_null_exit() {
    let mut p = proc(2, 1, "queen", pb::Role::Daemon, pb::ProcessState::Idle);
    p.metadata
        .insert("purpose".to_owned(), "coordinator".to_owned());
    let value = process_json(&p);
    assert_eq!(value["role"], "daemon");
    assert_eq!(value["tier"], "tactical");
    assert_eq!(value["state"], "idle");
    assert_eq!(value["metadata"]["purpose"], "coordinator");
    assert!(value["exit"].is_null());
    assert_eq!(value["restarts"], 0);

    p.exit = Some(ExitRecord {
        pid: 2,
        exit_code: 137,
        reason: "killed".to_owned(),
        ..ExitRecord::default()
    });
    assert_eq!(process_json(&p)["exit"]["exit_code"], 137);
    assert_eq!(
        exit_text(p.exit.as_ref().unwrap_or(&ExitRecord::default())),
        "pid 2 exited with code 137: killed"
    );
}

#[test]
fn event_json_merges_detail_and_keeps_the_envelope() {
    let event = Event {
        seq: 9,
        at_unix_ms: 1_700_000_000_123,
        pid: 4,
        r#type: "spawned".to_owned(),
        detail: r#"{"type":"spawned","name":"w1","seq":"bogus"}"#.to_owned(),
        trace_id: String::new(),
        node: String::new(),
    };
    let value = event_json(&event);
    assert_eq!(value["seq"], 9);
    assert_eq!(value["name"], "w1");
    assert_eq!(value["type"], "spawned");
    assert_eq!(
        event_text(&event),
        "9 2023-11-14T22:13:20.123Z pid=4 spawned name=w1 seq=bogus"
    );
    let call = Event {
        r#type: "llm_call".to_owned(),
        detail:
            r#"{"type":"llm_call","model":"gpt 4o","cost_nano_usd":4200000,"duration_ms":1500}"#
                .to_owned(),
        ..event.clone()
    };
    assert_eq!(
        event_text(&call),
        r#"9 2023-11-14T22:13:20.123Z pid=4 llm_call cost=$0.0042 duration=1.5s model="gpt 4o""#
    );

    // In a cluster each event says its node, after its process.
    let elsewhere = Event {
        node: "b".to_owned(),
        ..event.clone()
    };
    assert_eq!(
        event_text(&elsewhere),
        "9 2023-11-14T22:13:20.123Z pid=4 node=b spawned name=w1 seq=bogus"
    );
    assert_eq!(event_json(&elsewhere)["node"], "b");
    assert!(event_json(&event).get("node").is_none());

    let odd = Event {
        detail: "not json".to_owned(),
        ..event
    };
    assert_eq!(event_json(&odd)["detail"], "not json");
}

#[test]
fn timestamps_are_utc_rfc3339() {
    assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00.000Z");
    assert_eq!(rfc3339_utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
    assert_eq!(rfc3339_utc(1_709_251_199_999), "2024-02-29T23:59:59.999Z");
    assert_eq!(rfc3339_utc(4_102_444_800_000), "2100-01-01T00:00:00.000Z");
}

#[test]
fn control_characters_from_processes_are_made_visible() {
    let name = "evil\x1b]0;pwned\x07\x1b[2J\u{9b}31m\r";
    assert_eq!(
        visible(name),
        "evil\\u001b]0;pwned\\u0007\\u001b[2J\\u009b31m\\u000d"
    );
    assert_eq!(visible("tab\tand\nnewline é"), "tab\tand\nnewline é");
    // JSON output stays JSON, and means the same.
    let json = serde_json::json!({ "name": name }).to_string();
    let shown = visible(&json);
    let back: Value = serde_json::from_str(&shown).expect("valid JSON");
    assert_eq!(back["name"], name);
}
