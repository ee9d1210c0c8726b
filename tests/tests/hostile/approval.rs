//! Approval rules against calls that change only the case of what a rule
//! names: the glob holds them all.

use hivekernel_agents::approval::{ApprovalRule, OnTimeout};
use serde_json::json;

fn rule(tool: &str, glob: &str) -> ApprovalRule {
    ApprovalRule {
        tool: tool.to_owned(),
        arguments: Some(glob.to_owned()),
        timeout_seconds: 60,
        on_timeout: OnTimeout::Deny,
    }
}

#[test]
fn an_arguments_glob_holds_every_case_of_what_it_names() {
    let curl = rule("shell_exec", "*curl *");
    for command in [
        "curl http://x",
        "CURL http://x",
        "Curl http://x",
        "/usr/bin/cUrL x",
    ] {
        assert!(
            curl.covers("shell_exec", &json!({ "command": command })),
            "{command}"
        );
    }
    assert!(!curl.covers("shell_exec", &json!({ "command": "ls -l" })));
    let upload = rule("mcp:files/write", "*\"path\":\"/etc/*");
    assert!(upload.covers("mcp:files/write", &json!({ "path": "/ETC/passwd" })));
    assert!(upload.covers("mcp:files/write", &json!({ "PATH": "/etc/passwd" })));
    assert!(!upload.covers("mcp:files/write", &json!({ "path": "/tmp/x" })));
}
