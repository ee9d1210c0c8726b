//! Memory the kernel keeps of what callers and models send it, measured on
//! the real binary: a text that is cut must not keep its whole buffer.
//!
//! Once, a 1 MiB message to PID 1 was cut to a 4 KiB event but the event
//! kept the 1 MiB allocation, so 1,100 of them grew the kernel by 1.1 GB
//! for good. Now a cut text is a new, right-sized buffer, whether the text
//! came over gRPC with a process token or from a model's tool call.

use std::path::Path;
use std::time::{Duration, Instant};

use hivekernel_tests::binary::Binary;
use hivekernel_tests::llm_server::{LlmServer, Scripted};
use hivekernel_tests::served::{Bearer, Client};
use serde_json::{Value, json};

/// Messages each case sends, and the bytes of each payload (the most
/// `kernel.limits.payload_bytes` allows by default).
const MESSAGES: usize = 1_100;
const PAYLOAD: usize = 1 << 20;
/// The most the kernel may grow over a case.
const GROWTH_LIMIT: u64 = 50 << 20;

fn binary() -> std::path::PathBuf {
    match hivekernel_tests::build_hivekernel() {
        Ok(bin) => bin,
        Err((bin, why)) => panic!("cannot build {}: {why}", bin.display()),
    }
}

/// Resident memory of `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    kib * 1024
}

/// The kernel's resident memory once it has settled: the lowest reading
/// of a few, a moment apart (the allocator gives freed pages back after a
/// short delay).
fn settled_rss(pid: u32) -> u64 {
    let mut lowest = u64::MAX;
    for _ in 0..5 {
        lowest = lowest.min(rss(pid));
        std::thread::sleep(Duration::from_millis(100));
    }
    lowest
}

/// A client of the kernel at `addr` (`http://host:port`) presenting `token`.
async fn connect(addr: &str, token: &str) -> Client {
    let addr = if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    };
    let channel = tonic::transport::Endpoint::from_shared(addr)
        .unwrap()
        .connect()
        .await
        .unwrap();
    hivekernel_proto::v1::kernel_client::KernelClient::with_interceptor(channel, Bearer::new(token))
}

fn write_config(dir: &Path, config: &Value) {
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
}

/// Checks what a case did to the kernel's memory: less than
/// [`GROWTH_LIMIT`] of growth after it.
fn check_memory(case: &str, pid: u32, before: u64) {
    check_memory_within(case, pid, before, GROWTH_LIMIT);
}

/// [`check_memory`] with a growth limit of `limit` bytes.
fn check_memory_within(case: &str, pid: u32, before: u64, limit: u64) {
    let after = settled_rss(pid);
    let growth = after.saturating_sub(before);
    eprintln!(
        "{case}: {MESSAGES} messages of {PAYLOAD} bytes: RSS {} -> {} MB (+{} MB)",
        before >> 20,
        after >> 20,
        growth >> 20
    );
    assert!(
        growth < limit,
        "{case}: the kernel grew by {growth} bytes over {MESSAGES} messages of {PAYLOAD} bytes"
    );
}

#[test]
fn a_process_token_flooding_pid_1_keeps_only_what_the_events_show() {
    let bin = binary();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    write_config(
        dir.path(),
        &json!({"kernel": {"listen": "127.0.0.1:0", "default_runtime": "echo"}}),
    );
    let kernel = Binary::start(&bin, dir.path());
    // An exec agent hands its process token to the test, as an attacker's would.
    let script = format!(
        "printf %s \"$HIVEKERNEL_TOKEN\" > {0}.tmp && mv {0}.tmp {0}; exec sleep 600",
        token_file.display()
    );
    kernel.cli(&[
        "spawn", "--parent", "1", "--name", "attacker", "--", "sh", "-c", &script,
    ]);
    let deadline = Instant::now() + Duration::from_secs(20);
    let token = loop {
        if let Ok(token) = std::fs::read_to_string(&token_file)
            && !token.trim().is_empty()
        {
            break token.trim().to_owned();
        }
        assert!(Instant::now() < deadline, "the agent never wrote its token");
        std::thread::sleep(Duration::from_millis(20));
    };

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let pid = kernel.child.id();
    runtime.block_on(async {
        let mut client = connect(&kernel.addr, &token).await;
        let payload = "x".repeat(PAYLOAD);
        let send = |client: &mut Client| {
            let request = hivekernel_proto::v1::SendMessageRequest {
                to: 1,
                payload: payload.clone(),
                ..Default::default()
            };
            let mut client = client.clone();
            async move { client.send_message(request).await }
        };
        // Warm up: the first messages size the buffers that stay.
        for _ in 0..20 {
            send(&mut client).await.unwrap();
        }
        let before = settled_rss(pid);
        for i in 0..MESSAGES {
            send(&mut client)
                .await
                .unwrap_or_else(|status| panic!("message {i} refused: {status:?}"));
        }
        check_memory("SendMessage with a process token", pid, before);
    });
    // The events show each message, cut.
    let events = kernel.cli(&["events", "--tail", "5", "--json"]);
    assert!(
        events.contains("bytes in all]"),
        "{}",
        &events[..events.len().min(2000)]
    );
}

#[test]
fn a_model_flooding_pid_1_through_send_message_keeps_only_what_the_events_show() {
    // Each task: up to 9 rounds of two send_message calls to PID 1, then an answer.
    const CALLS: usize = 2;
    const ROUNDS: usize = 9;
    let payload = "x".repeat(PAYLOAD);
    let arguments = json!({"pid": 1, "message": payload}).to_string();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = runtime.block_on(LlmServer::answering(move |request: &Value| {
        // The round this turn is in, from the ids of its latest calls
        // (`call-ROUND-I`): the request keeps the latest round whatever
        // else it leaves out to fit the context window.
        let messages = request["messages"].as_array().cloned().unwrap_or_default();
        let round = messages
            .iter()
            .rev()
            .take_while(|m| m["role"] != "user")
            .find_map(|m| m["tool_calls"][0]["id"].as_str().map(str::to_owned))
            .and_then(|id| id.split('-').nth(1)?.parse::<usize>().ok())
            .map_or(0, |round| round + 1);
        if round >= ROUNDS {
            return Scripted::content("sent");
        }
        let calls: Vec<(String, &str, &str)> = (0..CALLS)
            .map(|i| {
                (
                    format!("call-{round}-{i}"),
                    "send_message",
                    arguments.as_str(),
                )
            })
            .collect();
        let calls: Vec<(&str, &str, &str)> = calls
            .iter()
            .map(|(id, name, args)| (id.as_str(), *name, *args))
            .collect();
        Scripted::tool_calls(&calls)
    }));
    let bin = binary();
    let dir = tempfile::tempdir().unwrap();
    write_config(
        dir.path(),
        &json!({
            "kernel": {"listen": "127.0.0.1:0"},
            "llm": {"provider": "openai", "base_url": server.base_url(),
                    "api_key_env": "HIVEKERNEL_TEST_NO_KEY", "max_retries": 0},
            "tool_agent": {"max_tool_iterations": ROUNDS + 1},
            "agents": [{
                "name": "chatty", "role": "task", "runtime": "tool_agent", "model": "test-model",
                "system_prompt": "You send messages.", "tools": ["send_message"]
            }]
        }),
    );
    let kernel = Binary::start(&bin, dir.path());
    let pid = kernel.child.id();
    let task = |kernel: &Binary| {
        let out = kernel.cli(&["exec", "chatty", "send them"]);
        assert!(out.contains("sent"), "{out}");
    };
    task(&kernel);
    let before = settled_rss(pid);
    for _ in 0..MESSAGES.div_ceil(CALLS * ROUNDS) {
        task(&kernel);
    }
    // Each round's request carries megabytes of arguments, whose buffers
    // the allocator keeps for the next ones: the bound here is what a kept
    // megabyte per message (1.1 GB) would break, not the settled figure.
    check_memory_within("send_message from a model", pid, before, 2 * GROWTH_LIMIT);
    drop(runtime);
}
