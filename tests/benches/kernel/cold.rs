//! Cold start: exec of `hivekernel start` until its first RPC answers,
//! beside exec of `/bin/true`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hivekernel_proto::v1 as pb;
use hivekernel_proto::v1::kernel_client::KernelClient;

use crate::Sizes;
use crate::report::{Row, Target, Unit};
use crate::serve::{Bearer, connect};
use crate::stats::{nanos_since, warm_median};

pub(crate) const FLOOR: &str = "exec of /bin/true, spawn and wait (std::process::Command)";

/// One echo agent; the data directory sits beside the config in a fresh temp dir.
const CONFIG: &str = r#"{
  "kernel": { "listen": "127.0.0.1:0", "data_dir": "data" },
  "agents": [ { "name": "echo", "role": "agent", "cognitive_tier": "operational", "runtime": "echo" } ]
}"#;

/// How often the bench looks for `kernel.addr`.
const POLL: Duration = Duration::from_micros(100);
/// How long a start may take before the bench gives up on it.
const START_LIMIT: Duration = Duration::from_secs(20);

pub(crate) async fn run(sizes: &Sizes) -> Vec<Row> {
    let bin = tokio::task::spawn_blocking(binary)
        .await
        .expect("locate the hivekernel binary");
    let fresh = warm_median(sizes.cold_runs, || async {
        let home = tempfile::tempdir().expect("temp dir");
        cold_start(&bin, home.path()).await
    })
    .await;
    // The warm-up creates the data directory; every run after it restarts on it.
    let home = tempfile::tempdir().expect("temp dir");
    let restart = warm_median(sizes.cold_runs, || cold_start(&bin, home.path())).await;
    let floor = warm_median(sizes.cold_runs, || async {
        tokio::task::spawn_blocking(|| {
            let start = Instant::now();
            let status = Command::new("/bin/true").status().expect("run /bin/true");
            assert!(status.success(), "/bin/true failed");
            nanos_since(start)
        })
        .await
        .expect("/bin/true runner")
    })
    .await;
    vec![
        Row::new(
            "cold",
            "cold start: exec to first GetProcess answered, new data dir",
            Unit::Nanos,
            fresh,
            Some(floor),
        )
        .target(Target::at_most(10e6, Unit::Nanos))
        .note("creates the admin token and the SQLite store"),
        Row::new(
            "cold",
            "cold start: exec to first GetProcess answered, existing data dir",
            Unit::Nanos,
            restart,
            Some(floor),
        )
        .target(Target::at_most(10e6, Unit::Nanos))
        .note("a restart: token and store opened, state recovered"),
    ]
}

/// Starts the kernel with its config and data directory in `home`, waits for
/// its address, answers one GetProcess with the admin token, then kills it.
/// Returns exec-to-answer time.
async fn cold_start(bin: &Path, home: &Path) -> f64 {
    let config = home.join("config.json");
    std::fs::write(&config, CONFIG).expect("write the config");
    let data = home.join("data");
    // A killed kernel leaves its address behind: not the next one's.
    let _ = std::fs::remove_file(data.join("kernel.addr"));
    let log_path = home.join("kernel.log");
    let log = std::fs::File::create(&log_path).expect("create the kernel log");

    let start = Instant::now();
    let child = Command::new(bin)
        .arg("start")
        .arg(&config)
        .env_remove("HIVEKERNEL_DATA_DIR")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("exec hivekernel start");
    let addr_file = data.join("kernel.addr");
    let (mut child, addr) = tokio::task::spawn_blocking(move || {
        let mut child = child;
        let addr = wait_for_addr(&mut child, &addr_file, &log_path);
        (child, addr)
    })
    .await
    .expect("address poller");
    let token = std::fs::read_to_string(data.join("admin.token")).expect("read admin.token");
    let mut client =
        KernelClient::with_interceptor(connect(&addr).await, Bearer::new(token.trim()));
    let info = client
        .get_process(pb::GetProcessRequest { pid: 1 })
        .await
        .expect("GetProcess on a started kernel")
        .into_inner();
    let ns = nanos_since(start);
    assert_eq!(info.pid, 1);

    drop(client);
    let _ = child.kill();
    let _ = child.wait();
    ns
}

/// Polls for `kernel.addr`, complete (it ends in a newline), and returns the address.
fn wait_for_addr(child: &mut Child, file: &Path, log: &Path) -> String {
    let deadline = Instant::now() + START_LIMIT;
    loop {
        if let Ok(addr) = std::fs::read_to_string(file)
            && addr.ends_with('\n')
        {
            return addr.trim().to_owned();
        }
        if let Some(status) = child.try_wait().expect("poll the kernel") {
            panic!(
                "hivekernel exited early ({status}):\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(
            Instant::now() < deadline,
            "no kernel.addr after {START_LIMIT:?}"
        );
        std::thread::sleep(POLL);
    }
}

/// The `hivekernel` binary, rebuilt first (a no-op when fresh) so a stale
/// kernel is never measured. A failed rebuild falls back to the existing binary.
pub(crate) fn binary() -> PathBuf {
    match hivekernel_tests::build_hivekernel() {
        Ok(bin) => bin,
        Err((bin, why)) if bin.exists() => {
            eprintln!(
                "bench: rebuilding hivekernel failed ({why}); measuring the existing {}",
                bin.display()
            );
            bin
        }
        Err((bin, why)) => panic!("building {} failed: {why}", bin.display()),
    }
}
