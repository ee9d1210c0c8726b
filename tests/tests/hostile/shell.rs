//! `shell_exec` against commands that try to outlive or outgrow the call.
//!
//! Survivors are looked for in `/proc`: every command carries a marker (a
//! `sleep` duration no other process uses), so a process of the command
//! still running shows it in its command line.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use hivekernel_agents::ProcessContext;
use hivekernel_agents::tools::workspace::{self, SHELL_OUTPUT_LIMIT};
use hivekernel_agents::tools::{ToolContext, ToolError, ToolRegistry};
use hivekernel_kernel::Kernel;
use hivekernel_tests::capture::captured_process;
use hivekernel_tests::wait_until;
use serde_json::{Value, json};

struct Shell {
    _dir: tempfile::TempDir,
    ws: PathBuf,
    kernel: Kernel,
    process: ProcessContext,
    tools: ToolRegistry,
}

impl Shell {
    async fn start() -> Shell {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("agent");
        let (kernel, process) = captured_process("agent").await;
        let mut tools = ToolRegistry::default();
        workspace::register(&mut tools);
        Shell {
            _dir: dir,
            ws,
            kernel,
            process,
            tools,
        }
    }

    async fn run(&self, args: Value) -> Result<String, ToolError> {
        let ctx = ToolContext {
            process: &self.process,
            workspace: Some(&self.ws),
        };
        self.tools.get("shell_exec").unwrap().call(&ctx, args).await
    }
}

/// A `sleep` duration of about `seconds` that no other process uses.
fn marker(seconds: u32) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{seconds}.{:07}{n:03}1", std::process::id())
}

/// PIDs and command lines of the live processes whose command line has `marker`.
fn running_with(marker: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        // A process gone meanwhile, or a zombie (empty command line), is not running.
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(marker) {
            found.push((name, cmdline));
        }
    }
    found
}

/// Waits (generously) until no process carries `marker`.
async fn none_left(marker: &str) {
    wait_until(
        "every process of the command to be gone",
        Duration::from_secs(10),
        || async { running_with(marker).is_empty() },
    )
    .await;
}

#[tokio::test]
async fn a_command_ignoring_sigterm_is_killed_at_the_timeout() {
    let sh = Shell::start().await;
    let mark = marker(100);
    let command = format!("trap '' TERM; echo started; sleep {mark}");
    let start = Instant::now();
    let call = sh.run(json!({"command": command, "timeout_seconds": 1}));
    // While it runs, the marker is there to be found (the check can see it).
    let (result, seen) = tokio::join!(call, async {
        wait_until("the command to start", Duration::from_secs(10), || async {
            !running_with(&mark).is_empty()
        })
        .await;
        true
    });
    assert!(seen);
    let err = result.unwrap_err().0;
    let took = start.elapsed();
    assert!(took < Duration::from_secs(10), "returned after {took:?}");
    assert!(
        took >= Duration::from_millis(900),
        "returned after {took:?}"
    );
    assert!(
        err.starts_with("command timed out after 1s; its whole process group was killed")
            && err.contains("started"),
        "{err}"
    );
    none_left(&mark).await;
    sh.kernel.shutdown().await;
}

#[tokio::test]
async fn a_backgrounded_child_does_not_outlive_the_call() {
    let sh = Shell::start().await;
    let mark = marker(100);
    let command = format!("sleep {mark} & trap '' TERM; (trap '' TERM; sleep {mark}) & echo bye");
    let start = Instant::now();
    let out = sh.run(json!({"command": command})).await.unwrap();
    let took = start.elapsed();
    // Well before the 30 s default timeout: the shell's exit ends the call.
    assert!(took < Duration::from_secs(10), "returned after {took:?}");
    assert_eq!(out, "exit code: 0\nbye\n");
    none_left(&mark).await;

    // The same with a timeout that fires first.
    let mark = marker(101);
    let command = format!("sleep {mark} & sleep {mark}");
    let err = sh
        .run(json!({"command": command, "timeout_seconds": 1}))
        .await
        .unwrap_err()
        .0;
    assert!(err.starts_with("command timed out after 1s"), "{err}");
    none_left(&mark).await;
    sh.kernel.shutdown().await;
}

/// The process's peak resident set, in KiB (`VmHWM`).
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test]
async fn a_100_mib_flood_is_capped_and_never_held_in_memory() {
    let _heavy = crate::HEAVY.lock().await;
    let sh = Shell::start().await;
    // Reset the peak where the kernel allows it, so earlier work does not hide growth.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = peak_rss_kib();
    let start = Instant::now();
    let out = sh
        .run(json!({"command": "head -c 100M /dev/zero; echo done >&2"}))
        .await
        .unwrap();
    assert!(start.elapsed() < Duration::from_secs(60));
    let grown = peak_rss_kib().saturating_sub(before);
    assert!(out.starts_with("exit code: 0\n"), "{}", &out[..40]);
    assert!(out.len() < SHELL_OUTPUT_LIMIT + 200, "{}", out.len());
    assert!(
        out.ends_with(&format!(
            "[output truncated: first {SHELL_OUTPUT_LIMIT} of 104857605 bytes shown]"
        )),
        "{}",
        &out[out.len() - 100..]
    );
    // 100 MiB went through; the peak grew by far less (the tests that
    // allocate megabytes wait on `HEAVY`; the slack is for the rest).
    assert!(grown < 48 * 1024, "peak RSS grew by {grown} KiB");

    // `yes` never ends: the timeout ends it, output still capped.
    let mark = marker(1);
    let err = sh
        .run(json!({"command": format!("yes {mark}"), "timeout_seconds": 1}))
        .await
        .unwrap_err()
        .0;
    assert!(
        err.starts_with("command timed out after 1s") && err.contains("[output truncated: first"),
        "{}",
        &err[..80]
    );
    assert!(err.len() < SHELL_OUTPUT_LIMIT + 300, "{}", err.len());
    none_left(&mark).await;
    sh.kernel.shutdown().await;
}
