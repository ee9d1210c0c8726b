//! Support for tests of external (`exec`) agents: an in-process kernel with
//! the `exec` runtime and a real gRPC server, clients with any token, the
//! Python examples, and what `/proc` says about OS processes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use hivekernel_kernel::auth::Authenticator;
use hivekernel_kernel::exec::ExecRuntime;
use hivekernel_kernel::{Kernel, grpc};
use hivekernel_proto::v1::kernel_client::KernelClient;
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint};

/// The admin token of every [`ExecKernel`].
pub const ADMIN_TOKEN: &str = "exec-tests-admin-token-0123456789abcdef";

pub use crate::served::{Bearer, Client};

/// A kernel with the `exec` runtime, served on loopback, with its own data directory.
#[derive(Debug)]
pub struct ExecKernel {
    /// The kernel.
    pub kernel: Kernel,
    /// Where the server listens.
    pub addr: SocketAddr,
    channel: Channel,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    data_dir: TempDir,
}

impl ExecKernel {
    /// Starts one with [`crate::test_settings`], a fresh data directory and a
    /// 500 ms grace between SIGTERM and SIGKILL.
    pub async fn start() -> ExecKernel {
        ExecKernel::start_with(|runtime| runtime).await
    }

    /// [`ExecKernel::start`] with the `exec` runtime as `configure` makes it.
    pub async fn start_with(configure: impl FnOnce(ExecRuntime) -> ExecRuntime) -> ExecKernel {
        let data_dir = tempfile::tempdir().unwrap();
        let mut settings = crate::test_settings();
        settings.data_dir = data_dir.path().to_owned();
        settings.shutdown_grace_ms = 500;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let auth = Authenticator::new(ADMIN_TOKEN.to_owned());
        let (registry, _journal) = crate::registry();
        let kernel = crate::start(
            Kernel::builder(settings)
                .runtimes(registry)
                .exec(configure(ExecRuntime::new(auth.clone(), addr))),
        )
        .await;
        let stop = kernel.shutdown_token();
        let server = tokio::spawn(grpc::serve(kernel.clone(), listener, auth, async move {
            stop.cancelled().await
        }));
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        ExecKernel {
            kernel,
            addr,
            channel,
            server,
            data_dir,
        }
    }

    /// A client acting with the admin token.
    pub fn admin(&self) -> Client {
        self.client(ADMIN_TOKEN)
    }

    /// A client acting with `token`.
    pub fn client(&self, token: &str) -> Client {
        KernelClient::with_interceptor(self.channel.clone(), Bearer::new(token))
    }

    /// The kernel's data directory.
    pub fn data_dir(&self) -> &Path {
        self.data_dir.path()
    }

    /// Shuts the kernel down and waits for the server to end.
    pub async fn stop(self) {
        self.kernel.shutdown().await;
        tokio::time::timeout(Duration::from_secs(10), self.server)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
}

/// The Python examples' directory.
pub fn python_examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk-examples/python")
}

/// The Python interpreter with grpcio to run the examples with, stubs
/// generated; `None` (skip) only when `HIVEKERNEL_SKIP_PYTHON_EXAMPLES=1`.
///
/// The interpreter is `$HIVEKERNEL_PYTHON` (CI points it at a venv), else
/// the venv `target/py-venv` at the repository root when there is one, else
/// `python3`. One without grpcio fails the test with how to fix it.
pub fn python() -> Option<PathBuf> {
    if std::env::var("HIVEKERNEL_SKIP_PYTHON_EXAMPLES").is_ok_and(|v| v == "1") {
        eprintln!("skipped: HIVEKERNEL_SKIP_PYTHON_EXAMPLES=1");
        return None;
    }
    static READY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match READY.get_or_init(prepare_python) {
        Ok(python) => Some(python.clone()),
        Err(why) => panic!("{why}"),
    }
}

fn prepare_python() -> Result<PathBuf, String> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/py-venv/bin/python");
    let python = match std::env::var_os("HIVEKERNEL_PYTHON") {
        Some(python) => PathBuf::from(python),
        None if venv.exists() => venv,
        None => PathBuf::from("python3"),
    };
    let fix = "create a venv with the examples' requirements at the repository root:\n  \
         python3 -m venv target/py-venv && target/py-venv/bin/pip install -r sdk-examples/python/requirements.txt\n\
         (target/py-venv is found by itself; any other interpreter: HIVEKERNEL_PYTHON=/path/to/python)\n\
         (or set HIVEKERNEL_SKIP_PYTHON_EXAMPLES=1 to skip these tests; CI's .ci/run installs them)";
    let check = std::process::Command::new(&python)
        .args(["-c", "import grpc, grpc_tools"])
        .output()
        .map_err(|err| format!("cannot run {}: {err}\n{fix}", python.display()))?;
    if !check.status.success() {
        return Err(format!(
            "{} cannot import grpcio / grpcio-tools: {}\n{fix}",
            python.display(),
            String::from_utf8_lossy(&check.stderr).trim()
        ));
    }
    let generated = std::process::Command::new(&python)
        .arg("generate_stubs.py")
        .current_dir(python_examples())
        .output()
        .map_err(|err| format!("cannot run generate_stubs.py: {err}"))?;
    if !generated.status.success() {
        return Err(format!(
            "generate_stubs.py failed: {}",
            String::from_utf8_lossy(&generated.stderr)
        ));
    }
    Ok(python)
}

/// What a Python example printed and how it exited.
#[derive(Debug)]
pub struct PyRun {
    /// Exit code (-1 when ended by a signal).
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl PyRun {
    /// Stdout, trimmed, after checking the run succeeded.
    pub fn ok(&self) -> &str {
        assert_eq!(self.code, 0, "python example failed: {self:#?}");
        self.stdout.trim()
    }
}

/// Runs `client.py` against `kernel` with the admin token.
pub async fn client_py(python: &Path, kernel: &ExecKernel, args: &[&str]) -> PyRun {
    let addr = kernel.addr.to_string();
    let output = tokio::process::Command::new(python)
        .arg("client.py")
        .args(["--addr", &addr, "--token", ADMIN_TOKEN])
        .args(args)
        .current_dir(python_examples())
        .env_remove("HIVEKERNEL_ADDR")
        .env_remove("HIVEKERNEL_TOKEN")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(60), output)
        .await
        .expect("client.py finished within 60 s")
        .unwrap();
    PyRun {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Whether OS process `pid` exists and is not a zombie.
pub fn os_alive(pid: u32) -> bool {
    stat(pid).is_some_and(|(state, _)| state != 'Z')
}

/// Live (non-zombie) processes whose process group is `pgid`.
pub fn group_members(pgid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| stat(*pid).is_some_and(|(state, group)| state != 'Z' && group == pgid))
        .collect()
}

/// State letter and process group of `pid`, from /proc/<pid>/stat.
fn stat(pid: u32) -> Option<(char, u32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let group = fields.next()?.parse().ok()?;
    Some((state, group))
}

/// The first `key=value` or `key value` found after `key` in the file at `path`.
pub fn find_after(path: &Path, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let start = text.find(key)? + key.len();
    let value: String = text[start..]
        .trim_start_matches(['=', ' '])
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != ',')
        .collect();
    (!value.is_empty()).then_some(value)
}
