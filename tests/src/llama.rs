//! A real model server for the real-model tests (`with_llama`): llama.cpp's
//! `llama-server`, built from source, serving SmolLM2-135M-Instruct on
//! loopback. `tests/real-model/setup.sh` puts both in `target/llama`
//! (`.ci/run` runs it; `$HIVEKERNEL_LLAMA` points elsewhere).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The name the server answers to (`--alias`), the one the configs send.
pub const MODEL: &str = "smollm2";

/// How long a test waits for a setup still running (`.ci/run` builds
/// llama-server while the other tests run).
const SETUP_WAIT: Duration = Duration::from_secs(20 * 60);

/// Where the setup script left llama.cpp: `build/bin/llama-server`, the
/// model, and the source tree with its chat templates. Waits for a setup
/// still running (its PID in `building`); panics with what to run when
/// it is missing, or when the setup ended without finishing.
pub fn home() -> PathBuf {
    let dir = match std::env::var_os("HIVEKERNEL_LLAMA") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/llama"),
    };
    let deadline = Instant::now() + SETUP_WAIT;
    while !dir.join("ready").is_file() {
        let Ok(pid) = std::fs::read_to_string(dir.join("building")) else {
            break;
        };
        assert!(
            Path::new("/proc").join(pid.trim()).exists(),
            "tests/real-model/setup.sh (PID {}) ended without finishing {}: see its output \
             (target/llama-setup.log under .ci/run), and run it again",
            pid.trim(),
            dir.display()
        );
        assert!(
            Instant::now() < deadline,
            "tests/real-model/setup.sh (PID {}) still fills {} after {} minutes",
            pid.trim(),
            dir.display(),
            SETUP_WAIT.as_secs() / 60
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(
        dir.join("ready").is_file(),
        "llama-server and the model are not in {}: run tests/real-model/setup.sh \
         (or point HIVEKERNEL_LLAMA at a directory it filled; CI's .ci/run runs it)",
        dir.display()
    );
    dir
}

/// A running `llama-server` on a loopback port, its log in a file; killed
/// when dropped.
#[derive(Debug)]
pub struct LlamaServer {
    child: Option<Child>,
    port: u16,
    args: Vec<String>,
    log: PathBuf,
}

impl LlamaServer {
    /// Starts the server with one slot of `context` tokens, `--jinja` and
    /// the chat template `template` (a file of llama.cpp's
    /// `models/templates`, without `.jinja`; `None`: the server's built-in
    /// templates, which render no tools) and `extra` arguments (`--temp 0`,
    /// `--ignore-eos`), logging to `dir/llama-server.log`, and waits until
    /// it has loaded the model.
    pub fn start(dir: &Path, template: Option<&str>, context: u32, extra: &[&str]) -> LlamaServer {
        let home = home();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut args: Vec<String> = vec![
            "-m".into(),
            home.join("SmolLM2-135M-Instruct.Q4_1.gguf")
                .to_string_lossy()
                .into_owned(),
        ];
        if let Some(template) = template {
            let file = home
                .join("src/models/templates")
                .join(format!("{template}.jinja"));
            args.extend(["--jinja".into(), "--chat-template-file".into()]);
            args.push(file.to_string_lossy().into_owned());
        }
        let rest = [
            "-c",
            &context.to_string(),
            "-np",
            "1",
            "-t",
            "1",
            "--alias",
            MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ];
        args.extend(rest.iter().chain(extra).map(|arg| (*arg).to_owned()));
        let mut server = LlamaServer {
            child: None,
            port,
            args,
            log: dir.join("llama-server.log"),
        };
        server.resume();
        server.wait_ready();
        server
    }

    /// The API root the kernel's `llm.base_url` names.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// What the server has logged so far (every run, restarts included).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills the server (`kill -9`): its port refuses connections.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, not waiting for it.
    pub fn resume(&mut self) {
        assert!(self.child.is_none(), "the server is running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("the server's log");
        let child = Command::new(home().join("build/bin/llama-server"))
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the server's log"))
            .stderr(log)
            .spawn()
            .expect("start llama-server");
        self.child = Some(child);
    }

    /// Waits (up to 60 s) until `/health` says the model is loaded.
    pub fn wait_ready(&mut self) {
        let addr = format!("127.0.0.1:{}", self.port);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok((200, _, _)) = crate::binary::http_get(&addr, "/health") {
                return;
            }
            if let Some(child) = self.child.as_mut() {
                assert!(
                    child.try_wait().ok().flatten().is_none(),
                    "llama-server exited: {}",
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "llama-server not ready: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether its one slot is generating now (`GET /slots`).
    pub fn generating(&self) -> bool {
        let addr = format!("127.0.0.1:{}", self.port);
        match crate::binary::http_get(&addr, "/slots") {
            Ok((200, _, body)) => serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|slots| {
                    slots.as_array().map(|slots| {
                        slots
                            .iter()
                            .any(|slot| slot["is_processing"].as_bool() == Some(true))
                    })
                })
                .unwrap_or(false),
            _ => false,
        }
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        self.kill();
    }
}
