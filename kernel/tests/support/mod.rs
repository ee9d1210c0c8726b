//! Shared harness for the binary's end-to-end tests: `hivekernel start` in a
//! child process on 127.0.0.1:0 with a fresh data directory, and the client
//! commands run exactly as a user would run them.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

/// The `hivekernel` binary. Cargo builds it with these tests, from the same
/// artifacts and features, so it is never stale and never built twice.
pub fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_hivekernel"))
}

/// What one CLI run printed and how it exited.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Stdout, after checking the run exited 0.
    pub fn ok(&self) -> &str {
        assert_eq!(self.code, 0, "expected success: {self:#?}");
        &self.stdout
    }

    /// Stdout parsed as one JSON document, after checking the run exited 0.
    pub fn json(&self) -> Value {
        serde_json::from_str(self.ok()).unwrap_or_else(|err| panic!("bad JSON ({err}): {self:#?}"))
    }

    /// Checks the exit code and that stderr carries an `error:` line.
    pub fn failed(&self, code: i32) -> &str {
        assert_eq!(self.code, code, "wrong exit code: {self:#?}");
        assert!(
            self.stderr.contains("error:"),
            "no error on stderr: {self:#?}"
        );
        &self.stderr
    }
}

/// Runs the binary with `args`, ignoring any HIVEKERNEL_* connection settings in the environment.
pub fn hivekernel(args: &[&str]) -> Run {
    hivekernel_with(args, &[])
}

/// [`hivekernel`] with the variables `env` set.
pub fn hivekernel_with(args: &[&str], env: &[(&str, &str)]) -> Run {
    let output = Command::new(binary())
        .args(args)
        .env_remove("HIVEKERNEL_ADDR")
        .env_remove("HIVEKERNEL_TOKEN")
        .env_remove("HIVEKERNEL_TOKEN_FILE")
        .env_remove("HIVEKERNEL_DATA_DIR")
        .env_remove("HIVEKERNEL_TLS_CA")
        .env_remove("HIVEKERNEL_TLS_CERT")
        .env_remove("HIVEKERNEL_TLS_KEY")
        .envs(env.iter().copied())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// A config with two echo agents: `queen` (daemon, tactical) and `helper` (agent, operational).
pub const CONFIG: &str = r#"{
  "kernel": { "listen": "127.0.0.1:0", "data_dir": "unused", "shutdown_grace_ms": 500,
              "default_runtime": "echo" },
  "agents": [
    { "name": "queen", "role": "daemon", "cognitive_tier": "tactical", "runtime": "echo",
      "model": "sonnet", "system_prompt": "You coordinate.", "tools": ["spawn_child", "read_file"],
      "limits": { "max_children": 8, "max_depth": 3 }, "metadata": { "purpose": "coordinator" } },
    { "name": "helper", "role": "agent", "cognitive_tier": "operational",
      "system_prompt": "You answer." }
  ]
}"#;

/// Writes `text` as `config.json` in `dir`.
pub fn write_config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("config.json");
    std::fs::write(&path, text).unwrap();
    path
}

/// A running `hivekernel start`, killed when dropped.
pub struct Kernel {
    pub child: Child,
    pub dir: TempDir,
    pub addr: String,
    config: PathBuf,
    extra: Vec<String>,
    /// The open-file limit it runs under, when not the test's own.
    open_files: Option<u64>,
}

/// Runs `hivekernel start` with data in `<dir>/data`, appending its log to `<dir>/kernel.log`.
/// With `open_files`, under that open-file limit (soft and hard), as `ulimit -n` sets it.
fn launch(dir: &Path, config: &Path, extra: &[&str], open_files: Option<u64>) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("kernel.log"))
        .unwrap();
    let mut command = match open_files {
        None => Command::new(binary()),
        Some(limit) => {
            let mut sh = Command::new("sh");
            sh.arg("-c")
                .arg(format!("ulimit -n {limit} && exec \"$0\" \"$@\""))
                .arg(binary());
            sh
        }
    };
    command
        .arg("start")
        .arg(config)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .args(extra)
        .env_remove("HIVEKERNEL_DATA_DIR")
        .env_remove("HIVEKERNEL_LLM_BASE_URL")
        .env_remove("OPENAI_API_KEY")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

impl Kernel {
    /// Starts the kernel with [`CONFIG`] and waits until it has written its address.
    pub fn start() -> Kernel {
        let dir = tempfile::tempdir().unwrap();
        let config = write_config(dir.path(), CONFIG);
        Kernel::start_with(dir, &config, &[])
    }

    /// Starts the kernel with the config at `config`, data in `<dir>/data`, and `extra` arguments.
    pub fn start_with(dir: TempDir, config: &Path, extra: &[&str]) -> Kernel {
        Kernel::start_limited(dir, config, extra, None)
    }

    /// [`Kernel::start_with`], under an open-file limit of `open_files` when given.
    pub fn start_limited(
        dir: TempDir,
        config: &Path,
        extra: &[&str],
        open_files: Option<u64>,
    ) -> Kernel {
        let mut kernel = Kernel {
            child: launch(dir.path(), config, extra, open_files),
            dir,
            addr: String::new(),
            config: config.to_owned(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            open_files,
        };
        kernel.addr = kernel.wait_for_addr();
        kernel
    }

    /// Stops the kernel with SIGKILL: no chance to flush or clean up.
    pub fn kill_9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Stops the kernel with SIGTERM and waits for a clean exit.
    pub fn stop(&mut self) {
        let pid = self.child.id().to_string();
        let signal = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(signal.success());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "exit {status}:\n{}", self.log());
                return;
            }
            assert!(
                Instant::now() < deadline,
                "still running 20 s after SIGTERM:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the kernel again on the same data directory and config, after
    /// [`Kernel::kill_9`] or [`Kernel::stop`]; the log continues in the same file.
    pub fn restart(&mut self) {
        // A killed kernel leaves its address file behind: not the new one's.
        let _ = std::fs::remove_file(self.data_dir().join("kernel.addr"));
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        self.child = launch(self.dir.path(), &self.config, &extra, self.open_files);
        self.addr = self.wait_for_addr();
    }

    /// The admin token the kernel wrote.
    pub fn token(&self) -> String {
        std::fs::read_to_string(self.data_dir().join("admin.token"))
            .unwrap()
            .trim()
            .to_owned()
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("kernel.log")).unwrap_or_default()
    }

    pub fn wait_for_addr(&mut self) -> String {
        let file = self.data_dir().join("kernel.addr");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(addr) = std::fs::read_to_string(&file)
                && !addr.trim().is_empty()
            {
                return addr.trim().to_owned();
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("kernel exited early ({status}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "no kernel.addr after 20 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs a client command against this kernel (`--addr` and `--data-dir` appended).
    pub fn cli(&self, args: &[&str]) -> Run {
        let data = self.data_dir();
        let mut all = args.to_vec();
        all.extend(["--addr", &self.addr, "--data-dir", data.to_str().unwrap()]);
        hivekernel(&all)
    }

    /// `ps --json`, as an array.
    pub fn ps(&self) -> Vec<Value> {
        match self.cli(&["ps", "--json"]).json() {
            Value::Array(procs) => procs,
            other => panic!("ps --json is not an array: {other}"),
        }
    }

    /// The PID of the process named `name`.
    pub fn pid_of(&self, name: &str) -> u64 {
        let procs = self.ps();
        let found = procs.iter().find(|p| p["name"] == name);
        found
            .and_then(|p| p["pid"].as_u64())
            .unwrap_or_else(|| panic!("no {name} in {procs:?}"))
    }

    /// `spawn ... ` and the PID it printed.
    pub fn spawn(&self, args: &[&str]) -> u64 {
        let mut all = vec!["spawn"];
        all.extend(args);
        let run = self.cli(&all);
        run.ok()
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("not a PID: {run:#?}"))
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn find(procs: &[Value], pid: u64) -> Option<&Value> {
    procs.iter().find(|p| p["pid"] == pid)
}
