//! A `hivekernel start` of the real binary, for tests that need the daemon
//! itself: its CLI, its HTTP endpoints, a `kill -9` and a restart.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `hivekernel start DIR/config.json --data-dir DIR/data` of the real
/// binary, its stderr appended to `DIR/kernel.log`; killed when dropped.
#[derive(Debug)]
pub struct Binary {
    pub bin: PathBuf,
    pub dir: PathBuf,
    pub child: Child,
    /// The gRPC address the daemon wrote to `DIR/data/kernel.addr`.
    pub addr: String,
}

impl Binary {
    pub fn start(bin: &Path, dir: &Path) -> Binary {
        Binary::start_with(bin, dir, &[])
    }

    /// Starts the daemon with `extra` arguments after the usual ones and
    /// waits (up to 30 s) until it has written its address.
    pub fn start_with(bin: &Path, dir: &Path, extra: &[&str]) -> Binary {
        Binary::start_with_env(bin, dir, extra, &[])
    }

    /// [`Binary::start_with`], with `env` set for the daemon.
    pub fn start_with_env(bin: &Path, dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Binary {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("kernel.log"))
            .unwrap();
        let _ = std::fs::remove_file(dir.join("data/kernel.addr"));
        let child = Command::new(bin)
            .arg("start")
            .arg(dir.join("config.json"))
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(extra)
            .env_remove("HIVEKERNEL_LLM_BASE_URL")
            .env_remove("HIVEKERNEL_LLM_MODEL")
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut kernel = Binary {
            bin: bin.to_owned(),
            dir: dir.to_owned(),
            child,
            addr: String::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        kernel.addr = loop {
            if let Ok(addr) = std::fs::read_to_string(dir.join("data/kernel.addr"))
                && !addr.trim().is_empty()
            {
                break addr.trim().to_owned();
            }
            assert!(
                kernel.child.try_wait().unwrap().is_none(),
                "{}",
                kernel.log()
            );
            assert!(Instant::now() < deadline, "{}", kernel.log());
            std::thread::sleep(Duration::from_millis(20));
        };
        kernel
    }

    /// Stops the daemon as an operator does (SIGTERM) and waits for it to exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        self.child.wait().unwrap()
    }

    /// What the daemon has written to its stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("kernel.log")).unwrap_or_default()
    }

    /// A client command aimed at this daemon (its flags go before a `--`
    /// and what follows it, an exec agent's command).
    pub fn command(&self, args: &[&str]) -> Command {
        let at = args
            .iter()
            .position(|arg| *arg == "--")
            .unwrap_or(args.len());
        let mut command = Command::new(&self.bin);
        command
            .args(&args[..at])
            .args(["--addr", &self.addr, "--data-dir"])
            .arg(self.dir.join("data"))
            .args(&args[at..]);
        command
    }

    /// Runs a client command; its stdout, or a panic with its stderr.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = self.command(args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        serde_json::from_str(&self.cli(args)).unwrap()
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP/1.0 GET of `path` from `addr` (`host:port`): the status, the
/// `Content-Type` and the body. HTTP/1.0, so the body ends with the
/// connection rather than in chunks.
pub fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let response = String::from_utf8_lossy(&response).into_owned();
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, response.clone());
    let (head, body) = response.split_once("\r\n\r\n").ok_or_else(bad)?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(bad)?;
    let content_type = head
        .lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("content-type"))
        .map(|(_, value)| value.trim().to_owned())
        .unwrap_or_default();
    Ok((status, content_type, body.to_owned()))
}
