//! The operator's HTTP listener of the real binary: `/metrics` read by
//! `promtool` and scraped by a real Prometheus, `/healthz`, and `/readyz`
//! turning 503 as soon as a stop begins.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hivekernel_tests::binary::{Binary, http_get};
use hivekernel_tests::llm_server::{LlmServer, Scripted};

/// Where the daemon's log says `/metrics` is served.
fn metrics_addr(kernel: &Binary) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = kernel.log();
        if let Some(rest) = log.split("metrics on http://").nth(1)
            && let Some((addr, _)) = rest.split_once("/metrics")
        {
            return addr.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no metrics address logged:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The value of the one sample of `family` whose labels include all of
/// `labels` (`name="value"` each).
fn sample(text: &str, family: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| {
            line.strip_prefix(family)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|line| labels.iter().all(|label| line.contains(label)))
        .find_map(|line| line.rsplit_once(' ')?.1.parse().ok())
}

fn program(name: &str) -> &str {
    let found = Command::new(name)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    assert!(
        found,
        "`{name}` is not installed: `apt-get install prometheus` provides it (see .ci/run)"
    );
    name
}

/// A real Prometheus scraping `target` every second; killed when dropped.
struct Prometheus {
    child: Child,
    addr: String,
}

impl Prometheus {
    fn start(dir: &Path, target: &str) -> Prometheus {
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
                 scrape_configs:\n  - job_name: hivekernel\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new(program("prometheus"))
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Prometheus { child, addr }
    }

    /// The single value `query` (an instant PromQL query, URL-encoded)
    /// returns, once it returns one.
    fn value(&self, query: &str) -> Option<f64> {
        let (status, _, body) =
            http_get(&self.addr, &format!("/api/v1/query?query={query}")).ok()?;
        if status != 200 {
            return None;
        }
        let answer: serde_json::Value = serde_json::from_str(&body).ok()?;
        answer["data"]["result"][0]["value"][1]
            .as_str()?
            .parse()
            .ok()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_valid_prometheus_text_scraped_by_prometheus_and_readyz_fails_once_a_stop_begins()
 {
    let bin = match hivekernel_tests::build_hivekernel() {
        Ok(bin) => bin,
        Err((bin, why)) => panic!("cannot build {}: {why}", bin.display()),
    };
    let dir = tempfile::tempdir().unwrap();
    // The first task is answered at once; the second holds its answer, so
    // a stop begun meanwhile waits for it.
    let calls = AtomicUsize::new(0);
    let server = LlmServer::answering(move |_| {
        let answer = Scripted::content_with_usage("done", 1234, 56);
        match calls.fetch_add(1, Ordering::SeqCst) {
            0 => answer,
            _ => answer.after(Duration::from_secs(4)),
        }
    })
    .await;
    let config = serde_json::json!({
        "kernel": { "listen": "127.0.0.1:0", "shutdown_grace_ms": 30000,
                    "metrics": { "listen": "127.0.0.1:0" } },
        "llm": { "provider": "openai", "base_url": server.base_url(),
                 "api_key_env": "HIVEKERNEL_TEST_NO_KEY", "max_retries": 0 },
        "agents": [{
            "name": "writer", "role": "daemon", "runtime": "tool_agent", "model": "test-model",
            "system_prompt": "You write."
        }]
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let mut kernel = Binary::start(&bin, dir.path());
    let addr = metrics_addr(&kernel);
    assert_eq!(
        kernel
            .cli(&["exec", "writer", "summarise the quarterly figures"])
            .trim(),
        "done"
    );

    let (status, content_type, text) = http_get(&addr, "/metrics").unwrap();
    assert_eq!(status, 200, "{text}");
    assert_eq!(content_type, "text/plain; version=0.0.4");
    let tokens = |kind: &str| {
        let kind = format!("type=\"{kind}\"");
        sample(
            &text,
            "hivekernel_llm_tokens_total",
            &["model=\"test-model\"", "role=\"daemon\"", &kind],
        )
    };
    assert_eq!(tokens("prompt"), Some(1234.0), "{text}");
    assert_eq!(tokens("completion"), Some(56.0), "{text}");
    let ok_calls = ["model=\"test-model\"", "outcome=\"ok\""];
    assert_eq!(
        sample(&text, "hivekernel_llm_calls_total", &ok_calls),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "hivekernel_llm_call_duration_seconds_count",
            &["model=\"test-model\""]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "hivekernel_tasks_total", &["outcome=\"ok\""]),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "hivekernel_processes",
            &["role=\"daemon\"", "state=\"idle\""]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "hivekernel_spawns_total", &["role=\"daemon\""]),
        Some(1.0),
        "{text}"
    );
    let execute = [
        "service=\"hivekernel.v1.Kernel\"",
        "method=\"ExecuteTask\"",
        "code=\"OK\"",
    ];
    assert!(
        sample(&text, "hivekernel_grpc_requests_total", &execute).is_some_and(|n| n >= 1.0),
        "{text}"
    );
    assert!(
        sample(&text, "hivekernel_store_commit_duration_seconds_count", &[])
            .is_some_and(|n| n >= 1.0)
    );
    assert_eq!(
        sample(
            &text,
            "hivekernel_build_info",
            &[&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))]
        ),
        Some(1.0)
    );
    // No secret, no name and no message reaches the page.
    let token = std::fs::read_to_string(dir.path().join("data/admin.token")).unwrap();
    assert!(
        !text.contains(token.trim()) && !text.contains("quarterly"),
        "{text}"
    );
    assert!(!text.contains("writer"), "{text}");

    // promtool, Prometheus's own linter, accepts the page as it is.
    let mut check = Command::new(program("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut check.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let checked = check.wait_with_output().unwrap();
    assert!(
        checked.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    assert_eq!(http_get(&addr, "/healthz").unwrap().0, 200);
    assert_eq!(http_get(&addr, "/readyz").unwrap().0, 200);
    let (status, _, body) = http_get(&addr, "/metrics/../secret").unwrap();
    assert_eq!(status, 404, "{body}");

    // A real Prometheus scrapes the page and sums what it read.
    let prometheus = Prometheus::start(dir.path(), &addr);
    let query = "sum%28hivekernel_llm_tokens_total%7Btype%3D%22prompt%22%7D%29";
    let deadline = Instant::now() + Duration::from_secs(60);
    while prometheus.value(query) != Some(1234.0) {
        assert!(
            Instant::now() < deadline,
            "Prometheus never read 1234 prompt tokens: {:?}\n{}",
            prometheus.value(query),
            std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        prometheus.value("up%7Bjob%3D%22hivekernel%22%7D"),
        Some(1.0)
    );
    drop(prometheus);

    // A stop begun while a task runs: /readyz says 503 at once, /healthz
    // and /metrics still answer, and the task finishes before the exit.
    let slow = kernel
        .command(&["exec", "writer", "write slowly"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    hivekernel_tests::wait_until("the second model call", Duration::from_secs(10), || async {
        server.request_count() == 2
    })
    .await;
    let term = Command::new("kill")
        .args(["-TERM", &kernel.child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let deadline = Instant::now() + Duration::from_secs(3);
    while http_get(&addr, "/readyz").unwrap().0 != 503 {
        assert!(
            Instant::now() < deadline,
            "/readyz still ready after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(http_get(&addr, "/healthz").unwrap().0, 200);
    assert_eq!(http_get(&addr, "/metrics").unwrap().0, 200);
    let slow = slow.wait_with_output().unwrap();
    assert!(
        slow.status.success(),
        "{}",
        String::from_utf8_lossy(&slow.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&slow.stdout).trim(), "done");
    assert!(kernel.child.wait().unwrap().success(), "{}", kernel.log());
    assert!(
        http_get(&addr, "/healthz").is_err(),
        "the listener outlived the kernel"
    );
}
