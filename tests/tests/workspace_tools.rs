//! The workspace tools against real files and real processes, and every
//! escape attempt from the hostile-input list.
//!
//! Layout per test: `<tmp>/ws/agent` is the agent's workspace,
//! `<tmp>/ws/agent-evil` a sibling whose name shares the workspace's prefix,
//! and `<tmp>/sentinel/secret.txt` a file that must stay byte-identical.
//! Each test snapshots everything under `<tmp>` outside the workspace
//! before and after, and asserts nothing changed there.
//!
//! The `ToolContext` holds a real `ProcessContext`: a kernel with a
//! `capture` runtime whose factory keeps the context the kernel hands it.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hivekernel_agents::ProcessContext;
use hivekernel_agents::sandbox::KeepOut;
use hivekernel_agents::tools::workspace::{
    self, LIST_LIMIT, READ_LIMIT, SHELL_OUTPUT_LIMIT, WRITE_LIMIT,
};
use hivekernel_agents::tools::{ToolContext, ToolError, ToolRegistry};
use hivekernel_kernel::Kernel;
use hivekernel_tests::capture::captured_process;
use serde_json::{Value, json};

const SECRET: &[u8] = b"top secret\n";

struct Fixture {
    _dir: tempfile::TempDir,
    tmp: PathBuf,
    ws: PathBuf,
    kernel: Kernel,
    process: ProcessContext,
    tools: ToolRegistry,
    before: BTreeMap<PathBuf, String>,
}

/// A fixture whose workspace directory already exists.
async fn fixture() -> Fixture {
    let fx = fixture_without_workspace().await;
    std::fs::create_dir(&fx.ws).unwrap();
    fx
}

/// A fixture whose workspace directory is not created yet.
async fn fixture_without_workspace() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().canonicalize().unwrap();
    let ws = tmp.join("ws/agent");
    std::fs::create_dir_all(tmp.join("ws/agent-evil")).unwrap();
    std::fs::write(tmp.join("ws/agent-evil/loot.txt"), "evil").unwrap();
    std::fs::create_dir(tmp.join("sentinel")).unwrap();
    std::fs::write(tmp.join("sentinel/secret.txt"), SECRET).unwrap();

    let (kernel, process) = captured_process("agent").await;

    let mut tools = ToolRegistry::default();
    workspace::register(
        &mut tools,
        hivekernel_tests::shell_settings(KeepOut {
            forbidden: vec![tmp.join("sentinel")],
            hidden: Vec::new(),
        }),
    );
    let before = snapshot(&tmp, &ws);
    Fixture {
        _dir: dir,
        tmp,
        ws,
        kernel,
        process,
        tools,
        before,
    }
}

impl Fixture {
    async fn call(&self, tool: &str, args: Value) -> Result<String, ToolError> {
        let ctx = ToolContext {
            process: &self.process,
            workspace: Some(&self.ws),
            checkpoint: None,
        };
        self.tools.get(tool).unwrap().call(&ctx, args).await
    }

    /// Calls `tool` and returns its error, failing the test if it succeeded.
    async fn refused(&self, tool: &str, args: Value) -> String {
        match self.call(tool, args.clone()).await {
            Ok(out) => panic!("{tool} {args} succeeded: {out}"),
            Err(err) => err.0,
        }
    }

    fn sentinel(&self) -> PathBuf {
        self.tmp.join("sentinel")
    }

    /// Asserts nothing outside the workspace changed, then stops the kernel.
    async fn finish(self) {
        assert_eq!(
            std::fs::read(self.sentinel().join("secret.txt")).unwrap(),
            SECRET
        );
        assert_eq!(snapshot(&self.tmp, &self.ws), self.before);
        self.kernel.shutdown().await;
    }
}

/// Everything under `root` but outside `skip`: path to kind, content and
/// modification time, links not followed. (The directories holding `skip`
/// are listed without their time: creating the workspace touches them.)
fn snapshot(root: &Path, skip: &Path) -> BTreeMap<PathBuf, String> {
    let mut seen = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.starts_with(skip) {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let mtime = meta.modified().unwrap();
            let what = if meta.is_symlink() {
                format!(
                    "link {} {mtime:?}",
                    std::fs::read_link(&path).unwrap().display()
                )
            } else if meta.is_dir() {
                stack.push(path.clone());
                if skip.starts_with(&path) {
                    "dir".to_owned()
                } else {
                    format!("dir {mtime:?}")
                }
            } else {
                format!("file {:?} {mtime:?}", std::fs::read(&path).unwrap())
            };
            seen.insert(path, what);
        }
    }
    seen
}

#[tokio::test]
async fn write_read_edit_list_happy_paths() {
    let fx = fixture_without_workspace().await;
    let out = fx
        .call(
            "write_file",
            json!({"path": "notes/todo.md", "content": "one\ntwo\nthree\n"}),
        )
        .await
        .unwrap();
    assert!(out.contains("wrote 14 bytes"), "{out}");
    assert_eq!(
        std::fs::read_to_string(fx.ws.join("notes/todo.md")).unwrap(),
        "one\ntwo\nthree\n"
    );

    let text = fx
        .call("read_file", json!({"path": "notes/todo.md"}))
        .await
        .unwrap();
    assert_eq!(text, "one\ntwo\nthree\n");
    let part = fx
        .call(
            "read_file",
            json!({"path": "./notes//todo.md", "offset": 4, "limit": 3}),
        )
        .await
        .unwrap();
    assert!(
        part.starts_with("two\n[truncated: bytes 4..7 of 14"),
        "{part}"
    );

    let out = fx
        .call(
            "edit_file",
            json!({"path": "notes/todo.md", "old": "two", "new": "2"}),
        )
        .await
        .unwrap();
    assert!(out.contains("replaced 1 occurrence"), "{out}");
    assert_eq!(
        std::fs::read_to_string(fx.ws.join("notes/todo.md")).unwrap(),
        "one\n2\nthree\n"
    );

    fx.call("write_file", json!({"path": "a.txt", "content": "x"}))
        .await
        .unwrap();
    fx.call(
        "write_file",
        json!({"path": "a.txt", "content": "replaced"}),
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(fx.ws.join("a.txt")).unwrap(),
        "replaced"
    );
    // A link that stays inside the workspace is fine.
    symlink("notes/todo.md", fx.ws.join("todo-link")).unwrap();
    assert_eq!(
        fx.call("read_file", json!({"path": "todo-link"}))
            .await
            .unwrap(),
        "one\n2\nthree\n"
    );

    let listing = fx.call("list_dir", json!({})).await.unwrap();
    let lines: Vec<&str> = listing.lines().collect();
    assert_eq!(lines[0], "\".\": 3 entries");
    assert!(
        lines[1].starts_with("file") && lines[1].contains(" 8  a.txt"),
        "{listing}"
    );
    assert!(
        lines[2].starts_with("dir") && lines[2].ends_with("notes/"),
        "{listing}"
    );
    assert!(
        lines[3].starts_with("symlink") && lines[3].ends_with("todo-link"),
        "{listing}"
    );
    let listing = fx.call("list_dir", json!({"path": "notes"})).await.unwrap();
    assert!(listing.contains("12  todo.md"), "{listing}");
    fx.finish().await;
}

#[tokio::test]
async fn read_file_caps_each_call_and_errors_name_the_path() {
    let fx = fixture().await;
    let big = READ_LIMIT + 1000;
    std::fs::write(fx.ws.join("big.txt"), vec![b'a'; big]).unwrap();
    let text = fx
        .call("read_file", json!({"path": "big.txt"}))
        .await
        .unwrap();
    assert!(text.starts_with(&"a".repeat(READ_LIMIT)));
    assert!(
        text.ends_with(&format!(
            "[truncated: bytes 0..{READ_LIMIT} of {big} shown; continue with offset={READ_LIMIT}]"
        )),
        "{}",
        &text[READ_LIMIT..]
    );
    let rest = fx
        .call(
            "read_file",
            json!({"path": "big.txt", "offset": READ_LIMIT, "limit": 10_000_000}),
        )
        .await
        .unwrap();
    assert_eq!(rest, "a".repeat(1000));
    let past = fx
        .call(
            "read_file",
            json!({"path": "big.txt", "offset": 10_000_000}),
        )
        .await
        .unwrap();
    assert!(past.contains("past the end"), "{past}");

    let err = fx
        .refused("read_file", json!({"path": "missing.txt"}))
        .await;
    assert!(
        err.contains("\"missing.txt\"") && err.contains("no such file"),
        "{err}"
    );
    std::fs::create_dir(fx.ws.join("sub")).unwrap();
    let err = fx.refused("read_file", json!({"path": "sub"})).await;
    assert!(
        err.contains("\"sub\"") && err.contains("directory"),
        "{err}"
    );
    let err = fx.refused("read_file", json!({"path": "."})).await;
    assert!(err.contains("workspace directory itself"), "{err}");
    fx.finish().await;
}

#[tokio::test]
async fn write_file_refuses_oversized_content_and_directories() {
    let fx = fixture().await;
    let err = fx
        .refused(
            "write_file",
            json!({"path": "big", "content": "x".repeat(WRITE_LIMIT + 1)}),
        )
        .await;
    assert!(err.contains("at most 1048576"), "{err}");
    assert!(!fx.ws.join("big").exists());
    fx.call(
        "write_file",
        json!({"path": "max", "content": "x".repeat(WRITE_LIMIT)}),
    )
    .await
    .unwrap();
    std::fs::create_dir(fx.ws.join("d")).unwrap();
    let err = fx
        .refused("write_file", json!({"path": "d", "content": "x"}))
        .await;
    assert!(err.contains("is a directory"), "{err}");
    std::fs::write(fx.ws.join("f"), "x").unwrap();
    let err = fx
        .refused("write_file", json!({"path": "f/g", "content": "x"}))
        .await;
    assert!(err.contains("not a directory"), "{err}");
    fx.finish().await;
}

#[tokio::test]
async fn edit_file_refuses_missing_ambiguous_and_empty_old() {
    let fx = fixture().await;
    std::fs::write(fx.ws.join("f.txt"), "cat dog cat").unwrap();
    let err = fx
        .refused(
            "edit_file",
            json!({"path": "f.txt", "old": "bird", "new": "x"}),
        )
        .await;
    assert!(err.contains("not found"), "{err}");
    let err = fx
        .refused(
            "edit_file",
            json!({"path": "f.txt", "old": "cat", "new": "x"}),
        )
        .await;
    assert!(err.contains("occurs 2 times"), "{err}");
    let err = fx
        .refused("edit_file", json!({"path": "f.txt", "old": "", "new": "x"}))
        .await;
    assert!(err.contains("`old` is empty"), "{err}");
    let err = fx
        .refused(
            "edit_file",
            json!({"path": "nope.txt", "old": "a", "new": "b"}),
        )
        .await;
    assert!(err.contains("no such file"), "{err}");
    assert_eq!(
        std::fs::read_to_string(fx.ws.join("f.txt")).unwrap(),
        "cat dog cat"
    );
    fx.call(
        "edit_file",
        json!({"path": "f.txt", "old": "cat dog", "new": "cow"}),
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(fx.ws.join("f.txt")).unwrap(),
        "cow cat"
    );
    fx.finish().await;
}

#[tokio::test]
async fn list_dir_is_sorted_and_capped() {
    let fx = fixture().await;
    let count = LIST_LIMIT + 5;
    for i in 0..count {
        std::fs::write(fx.ws.join(format!("f{i:05}")), "").unwrap();
    }
    let listing = fx.call("list_dir", json!({"path": "."})).await.unwrap();
    let lines: Vec<&str> = listing.lines().collect();
    assert_eq!(lines[0], format!("\".\": {count} entries"));
    assert_eq!(lines.len(), 1 + LIST_LIMIT + 1);
    assert!(lines[1].ends_with("f00000") && lines[LIST_LIMIT].ends_with("f00999"));
    assert_eq!(
        lines[LIST_LIMIT + 1],
        format!("[truncated: first {LIST_LIMIT} of {count} entries shown]")
    );
    let err = fx.refused("list_dir", json!({"path": "f00001"})).await;
    assert!(err.contains("not a directory"), "{err}");
    fx.finish().await;
}

#[tokio::test]
async fn traversal_forms_are_refused_for_every_file_tool() {
    let fx = fixture().await;
    std::fs::write(fx.ws.join("ok.txt"), "ok").unwrap();
    let sentinel = fx.sentinel().join("secret.txt");
    let bad = [
        "..".to_owned(),
        "../x".to_owned(),
        "a/../../x".to_owned(),
        "ok.txt/../../../sentinel/secret.txt".to_owned(),
        "../agent-evil/loot.txt".to_owned(),
        "/etc/passwd".to_owned(),
        sentinel.display().to_string(),
        "\\..\\x".to_owned(),
        "..\\..\\x".to_owned(),
        "\\etc\\passwd".to_owned(),
        "..\\..\\sentinel\\secret.txt".to_owned(),
        "C:\\x".to_owned(),
        "C:/x".to_owned(),
        "a\0b".to_owned(),
        "ok.txt\0".to_owned(),
        String::new(),
    ];
    for path in &bad {
        let shown = format!("{path:?}");
        for (tool, args) in [
            ("read_file", json!({"path": path})),
            ("write_file", json!({"path": path, "content": "pwned"})),
            (
                "edit_file",
                json!({"path": path, "old": "top", "new": "pwned"}),
            ),
            ("list_dir", json!({"path": path})),
        ] {
            let err = fx.refused(tool, args).await;
            assert!(
                err.contains("refused") && err.contains(&shown),
                "{tool} {shown}: {err}"
            );
        }
    }
    assert_eq!(std::fs::read_to_string(fx.ws.join("ok.txt")).unwrap(), "ok");
    fx.finish().await;
}

#[tokio::test]
async fn leaf_symlink_to_the_sentinel_is_refused() {
    let fx = fixture().await;
    symlink(fx.sentinel().join("secret.txt"), fx.ws.join("leak")).unwrap();
    symlink("../../sentinel/secret.txt", fx.ws.join("leak-relative")).unwrap();
    for link in ["leak", "leak-relative"] {
        for (tool, args) in [
            ("read_file", json!({"path": link})),
            ("write_file", json!({"path": link, "content": "pwned"})),
            (
                "edit_file",
                json!({"path": link, "old": "top", "new": "pwned"}),
            ),
            ("list_dir", json!({"path": link})),
        ] {
            let err = fx.refused(tool, args).await;
            assert!(
                err.contains("outside the workspace"),
                "{tool} {link}: {err}"
            );
        }
    }
    fx.finish().await;
}

#[tokio::test]
async fn middle_symlink_to_the_sentinel_is_refused() {
    let fx = fixture().await;
    symlink(fx.sentinel(), fx.ws.join("dir")).unwrap();
    std::fs::create_dir(fx.ws.join("real")).unwrap();
    symlink("../../../sentinel", fx.ws.join("real/up")).unwrap();
    for base in ["dir", "real/up"] {
        for (tool, args) in [
            ("read_file", json!({"path": format!("{base}/secret.txt")})),
            (
                "write_file",
                json!({"path": format!("{base}/secret.txt"), "content": "pwned"}),
            ),
            (
                "write_file",
                json!({"path": format!("{base}/new.txt"), "content": "pwned"}),
            ),
            (
                "write_file",
                json!({"path": format!("{base}/sub/deeper/new.txt"), "content": "x"}),
            ),
            (
                "edit_file",
                json!({"path": format!("{base}/secret.txt"), "old": "top", "new": "x"}),
            ),
            ("list_dir", json!({"path": base})),
        ] {
            let err = fx.refused(tool, args.clone()).await;
            assert!(
                err.contains("outside the workspace"),
                "{tool} {args}: {err}"
            );
        }
    }
    fx.finish().await;
}

#[tokio::test]
async fn dangling_symlinks_are_never_followed_to_create_files() {
    let fx = fixture().await;
    symlink(fx.sentinel().join("created.txt"), fx.ws.join("dangle")).unwrap();
    symlink(fx.tmp.join("nowhere"), fx.ws.join("dangle-dir")).unwrap();
    // Dangling but pointing inside: still not followed for a write.
    symlink("not-yet.txt", fx.ws.join("dangle-inside")).unwrap();
    for (tool, args) in [
        ("write_file", json!({"path": "dangle", "content": "pwned"})),
        (
            "write_file",
            json!({"path": "dangle-dir/x", "content": "pwned"}),
        ),
        (
            "write_file",
            json!({"path": "dangle-inside", "content": "x"}),
        ),
        ("read_file", json!({"path": "dangle"})),
        (
            "edit_file",
            json!({"path": "dangle", "old": "a", "new": "b"}),
        ),
    ] {
        let err = fx.refused(tool, args.clone()).await;
        assert!(err.contains("dangling"), "{tool} {args}: {err}");
    }
    assert!(!fx.ws.join("not-yet.txt").exists());
    fx.finish().await;
}

#[tokio::test]
async fn a_link_made_by_the_shell_is_not_written_through() {
    let fx = fixture().await;
    let command = format!("ln -s {} escape", fx.sentinel().display());
    let out = fx
        .call("shell_exec", json!({"command": command}))
        .await
        .unwrap();
    assert!(out.starts_with("exit code: 0"), "{out}");
    assert!(
        std::fs::symlink_metadata(fx.ws.join("escape"))
            .unwrap()
            .is_symlink()
    );
    for (tool, args) in [
        (
            "write_file",
            json!({"path": "escape/pwned", "content": "pwned"}),
        ),
        (
            "write_file",
            json!({"path": "escape/secret.txt", "content": "pwned"}),
        ),
        ("read_file", json!({"path": "escape/secret.txt"})),
        (
            "edit_file",
            json!({"path": "escape/secret.txt", "old": "top", "new": "x"}),
        ),
        ("list_dir", json!({"path": "escape"})),
    ] {
        let err = fx.refused(tool, args.clone()).await;
        assert!(
            err.contains("outside the workspace"),
            "{tool} {args}: {err}"
        );
    }
    assert!(!fx.sentinel().join("pwned").exists());

    // A leaf link to the secret itself, made the same way.
    let command = format!("ln -s {} leaf", fx.sentinel().join("secret.txt").display());
    let out = fx
        .call("shell_exec", json!({"command": command}))
        .await
        .unwrap();
    assert!(out.starts_with("exit code: 0"), "{out}");
    for (tool, args) in [
        ("write_file", json!({"path": "leaf", "content": "pwned"})),
        (
            "edit_file",
            json!({"path": "leaf", "old": "top", "new": "x"}),
        ),
        ("read_file", json!({"path": "leaf"})),
    ] {
        let err = fx.refused(tool, args.clone()).await;
        assert!(
            err.contains("outside the workspace"),
            "{tool} {args}: {err}"
        );
    }
    fx.finish().await;
}

#[tokio::test]
async fn a_sibling_directory_sharing_the_prefix_is_outside() {
    let fx = fixture().await;
    symlink(fx.tmp.join("ws/agent-evil"), fx.ws.join("evil")).unwrap();
    symlink("../agent-evil", fx.ws.join("evil-relative")).unwrap();
    for base in ["evil", "evil-relative"] {
        for (tool, args) in [
            ("read_file", json!({"path": format!("{base}/loot.txt")})),
            (
                "write_file",
                json!({"path": format!("{base}/loot.txt"), "content": "pwned"}),
            ),
            (
                "write_file",
                json!({"path": format!("{base}/new.txt"), "content": "pwned"}),
            ),
            ("list_dir", json!({"path": base})),
        ] {
            let err = fx.refused(tool, args.clone()).await;
            assert!(
                err.contains("outside the workspace"),
                "{tool} {args}: {err}"
            );
        }
    }
    let err = fx
        .refused(
            "write_file",
            json!({"path": "../agent-evil/new.txt", "content": "x"}),
        )
        .await;
    assert!(err.contains("`..`"), "{err}");
    fx.finish().await;
}

#[tokio::test]
async fn shell_reports_output_exit_code_and_runs_in_the_workspace() {
    let fx = fixture_without_workspace().await;
    let out = fx
        .call(
            "shell_exec",
            json!({"command": "echo hi; echo oops >&2; pwd; echo \"$HOME\"; env; exit 3"}),
        )
        .await
        .unwrap();
    assert!(out.starts_with("exit code: 3\n"), "{out}");
    assert!(out.contains("hi\n") && out.contains("oops\n"), "{out}");
    let ws = fx.ws.display().to_string();
    assert_eq!(
        out.lines().filter(|l| *l == ws).count(),
        2,
        "pwd and $HOME: {out}"
    );
    assert!(out.contains(&format!("\nHOME={ws}\n")), "{out}");
    // The kernel's environment (cargo's variables here) is not handed down.
    assert!(!out.contains("CARGO"), "{out}");
    let out = fx
        .call("shell_exec", json!({"command": "echo made > made.txt"}))
        .await
        .unwrap();
    assert!(out.starts_with("exit code: 0"), "{out}");
    assert_eq!(
        std::fs::read_to_string(fx.ws.join("made.txt")).unwrap(),
        "made\n"
    );
    let out = fx
        .call("shell_exec", json!({"command": "kill -9 $$"}))
        .await
        .unwrap();
    assert!(out.starts_with("killed by signal 9"), "{out}");
    fx.finish().await;
}

#[tokio::test]
async fn shell_timeout_kills_a_process_that_ignores_sigterm() {
    let fx = fixture().await;
    let marker = fx.tmp.join("sentinel-timeout");
    let command = format!(
        "trap '' TERM; (trap '' TERM; sleep 3; touch {}) & echo started; sleep 100",
        marker.display()
    );
    let start = Instant::now();
    let err = fx
        .refused(
            "shell_exec",
            json!({"command": command, "timeout_seconds": 1}),
        )
        .await;
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
    assert!(
        err.contains("timed out after 1s") && err.contains("started"),
        "{err}"
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        !marker.exists(),
        "a process of the timed-out command survived"
    );
    fx.finish().await;
}

#[tokio::test]
async fn shell_leaves_no_backgrounded_grandchild() {
    let fx = fixture().await;
    let marker = fx.tmp.join("sentinel-grandchild");
    let command = format!("(sleep 3; touch {}) & echo bye", marker.display());
    let start = Instant::now();
    let out = fx
        .call("shell_exec", json!({"command": command}))
        .await
        .unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(out, "exit code: 0\nbye\n");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!marker.exists(), "the backgrounded grandchild survived");
    fx.finish().await;
}

#[tokio::test]
async fn shell_output_flood_is_capped() {
    let fx = fixture().await;
    let start = Instant::now();
    let out = fx
        .call("shell_exec", json!({"command": "yes | head -c 10000000"}))
        .await
        .unwrap();
    assert!(start.elapsed() < Duration::from_secs(20));
    assert!(out.len() < SHELL_OUTPUT_LIMIT + 200, "{}", out.len());
    assert!(
        out.ends_with(&format!(
            "[output truncated: first {SHELL_OUTPUT_LIMIT} of 10000000 bytes shown]"
        )),
        "{}",
        &out[out.len() - 100..]
    );
    // An endless flood ends at the timeout, still capped.
    let start = Instant::now();
    let err = fx
        .refused(
            "shell_exec",
            json!({"command": "yes", "timeout_seconds": 1}),
        )
        .await;
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
    assert!(err.len() < SHELL_OUTPUT_LIMIT + 200 && err.contains("output truncated"));
    fx.finish().await;
}

#[tokio::test]
async fn bad_arguments_are_clear_errors() {
    let fx = fixture().await;
    for (tool, args, expect) in [
        (
            "read_file",
            json!({"path": "a", "bogus": 1}),
            "unknown field `bogus`",
        ),
        ("read_file", json!({}), "missing field `path`"),
        (
            "read_file",
            json!({"path": 5}),
            "field `path` must be a string",
        ),
        (
            "read_file",
            json!({"path": "a", "offset": -1}),
            "field `offset` must be a non-negative integer",
        ),
        (
            "read_file",
            json!({"path": "a", "limit": "10"}),
            "field `limit`",
        ),
        ("read_file", json!("a"), "invalid arguments for read_file"),
        (
            "write_file",
            json!({"path": "a"}),
            "missing field `content`",
        ),
        (
            "write_file",
            json!({"path": "a", "content": ["x"]}),
            "field `content` must be a string",
        ),
        (
            "edit_file",
            json!({"path": "a", "old": "x", "new": "y", "all": true}),
            "unknown field `all`",
        ),
        ("list_dir", json!({"dir": "."}), "unknown field `dir`"),
        ("list_dir", json!({"path": null}), ""),
        ("shell_exec", json!({"cmd": "ls"}), "unknown field `cmd`"),
        (
            "shell_exec",
            json!({"command": "ls", "cwd": "/"}),
            "unknown field `cwd`",
        ),
        (
            "shell_exec",
            json!({"command": "ls", "timeout_seconds": 0}),
            "between 1 and 600",
        ),
        (
            "shell_exec",
            json!({"command": "ls", "timeout_seconds": 601}),
            "between 1 and 600",
        ),
        (
            "shell_exec",
            json!({"command": "ls", "timeout_seconds": 1.5}),
            "field `timeout_seconds`",
        ),
        ("shell_exec", json!({"command": "  "}), "`command` is empty"),
        ("shell_exec", json!({"command": "ls\0"}), "NUL byte"),
    ] {
        let result = fx.call(tool, args.clone()).await;
        if expect.is_empty() {
            assert!(result.is_ok(), "{tool} {args}: {result:?}");
            continue;
        }
        let err = result.unwrap_err().0;
        assert!(err.contains(expect), "{tool} {args}: {err}");
    }
    fx.finish().await;
}

#[tokio::test]
async fn the_builtin_registry_offers_the_workspace_tools_with_schemas() {
    let tools = ToolRegistry::builtin();
    for name in [
        "read_file",
        "write_file",
        "edit_file",
        "list_dir",
        "shell_exec",
    ] {
        let schema = tools.get(name).unwrap().schema();
        assert_eq!(schema.name, name);
        assert!(!schema.description.is_empty());
        assert_eq!(schema.parameters["type"], "object");
        assert_eq!(schema.parameters["additionalProperties"], false);
    }
}
