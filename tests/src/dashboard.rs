//! A client of the dashboard of a [`Binary`], over plain HTTP/1.0 (each
//! request its own connection, each body ending with it): login, the
//! Kernel service's methods as JSON, and its live streams read event by
//! event, as a page makes them.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::binary::Binary;

/// One answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    /// The first header called `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// The body as JSON (a panic naming the body when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|err| panic!("not JSON ({err}): {} {}", self.status, self.body))
    }
}

/// Where a kernel's dashboard is: `host:port`, from `<data>/dashboard.url`.
pub fn address(kernel: &Binary) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(url) = std::fs::read_to_string(kernel.dir.join("data/dashboard.url"))
            && let Some(addr) = url.trim().strip_prefix("http://")
        {
            return addr.trim_end_matches('/').to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no dashboard.url:\n{}",
            kernel.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One request to `addr`.
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<Reply> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    // `Host: addr` unless the caller names another.
    let mut head = format!("{method} {path} HTTP/1.0\r\n");
    if !headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("host"))
    {
        head.push_str(&format!("Host: {addr}\r\n"));
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let response = String::from_utf8_lossy(&response).into_owned();
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, response.clone());
    let (head, body) = response.split_once("\r\n\r\n").ok_or_else(bad)?;
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or_else(bad)?;
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_owned(), value.trim().to_owned()))
        .collect();
    Ok(Reply {
        status,
        headers,
        body: body.to_owned(),
    })
}

/// A logged-in session: its cookie and its session key (sent as
/// `X-CSRF-Token`).
#[derive(Debug, Clone)]
pub struct Session {
    pub addr: String,
    /// `name=value`, as the browser sends it back.
    pub cookie: String,
    pub csrf: String,
    /// What `/api/login` said.
    pub described: serde_json::Value,
}

/// Logs in with `token`: the session, or the refusal.
pub fn login(addr: &str, token: &str) -> Result<Session, Reply> {
    let body = serde_json::json!({ "token": token }).to_string();
    let reply = request(
        addr,
        "POST",
        "/api/login",
        &[("Content-Type", "application/json")],
        &body,
    )
    .unwrap();
    if reply.status != 200 {
        return Err(reply);
    }
    let cookie = reply
        .header("set-cookie")
        .and_then(|cookie| cookie.split(';').next())
        .unwrap_or_else(|| panic!("no cookie: {reply:?}"))
        .to_owned();
    let described = reply.json();
    Ok(Session {
        addr: addr.to_owned(),
        cookie,
        csrf: described["csrf"].as_str().unwrap_or_default().to_owned(),
        described,
    })
}

impl Session {
    /// `POST /api/rpc/<method>` with `body`, as the page sends it.
    pub fn rpc(&self, method: &str, body: &serde_json::Value) -> Reply {
        self.post(&format!("/api/rpc/{method}"), body, &[])
    }

    /// A POST with this session's cookie, its CSRF token and `extra` headers.
    pub fn post(&self, path: &str, body: &serde_json::Value, extra: &[(&str, &str)]) -> Reply {
        let mut headers = vec![
            ("Cookie", self.cookie.as_str()),
            ("Content-Type", "application/json"),
            ("X-CSRF-Token", self.csrf.as_str()),
        ];
        headers.extend_from_slice(extra);
        request(&self.addr, "POST", path, &headers, &body.to_string()).unwrap()
    }

    /// A GET with this session's cookie and key.
    pub fn get(&self, path: &str) -> Reply {
        let headers = [
            ("Cookie", self.cookie.as_str()),
            ("X-CSRF-Token", &self.csrf),
        ];
        request(&self.addr, "GET", path, &headers, "").unwrap()
    }

    /// A single-use ticket for a live stream.
    pub fn ticket(&self) -> String {
        let reply = self.post("/api/ticket", &serde_json::json!({}), &[]);
        assert_eq!(reply.status, 200, "{reply:?}");
        reply.json()["ticket"]
            .as_str()
            .unwrap_or_else(|| panic!("no ticket: {reply:?}"))
            .to_owned()
    }

    /// `GET /api/watch/<method>?q=<request>` with a new ticket, read as it
    /// comes.
    pub fn watch(&self, method: &str, request: &serde_json::Value) -> Watch {
        let ticket = self.ticket();
        self.watch_with(method, request, &ticket)
    }

    /// `GET /api/watch/<method>?q=<request>&ticket=<ticket>`, read as it
    /// comes.
    pub fn watch_with(&self, method: &str, request: &serde_json::Value, ticket: &str) -> Watch {
        let encode = |text: &str| -> String {
            text.bytes()
                .map(|b| match b {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {
                        (b as char).to_string()
                    }
                    _ => format!("%{b:02X}"),
                })
                .collect()
        };
        let query = encode(&request.to_string());
        let ticket = encode(ticket);
        let mut stream = TcpStream::connect(&self.addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        write!(
            stream,
            "GET /api/watch/{method}?q={query}&ticket={ticket} HTTP/1.0\r\nHost: {}\r\nCookie: {}\r\nAccept: text/event-stream\r\n\r\n",
            self.addr, self.cookie
        )
        .unwrap();
        Watch {
            reader: BufReader::new(stream),
            line: String::new(),
            status: None,
        }
    }
}

/// A live stream's server-sent events.
#[derive(Debug)]
pub struct Watch {
    reader: BufReader<TcpStream>,
    line: String,
    /// The HTTP status, once read.
    pub status: Option<u16>,
}

/// One server-sent event: its name (`message` unless named) and data.
#[derive(Debug, Clone, PartialEq)]
pub struct SentEvent {
    pub event: String,
    pub data: String,
}

impl Watch {
    /// The next event within `wait`, `None` if none came (or the stream ended).
    pub fn next(&mut self, wait: Duration) -> Option<SentEvent> {
        let deadline = Instant::now() + wait;
        let mut event = String::from("message");
        let mut data = String::new();
        loop {
            match self.reader.read_line(&mut self.line) {
                Ok(0) => return None,
                Ok(_) if self.line.ends_with('\n') => {
                    let line = std::mem::take(&mut self.line);
                    let line = line.trim_end_matches(['\r', '\n']);
                    if self.status.is_none() {
                        self.status = line.split(' ').nth(1).and_then(|code| code.parse().ok());
                        continue;
                    }
                    if line.is_empty() {
                        if !data.is_empty() {
                            return Some(SentEvent { event, data });
                        }
                        continue;
                    }
                    if let Some(name) = line.strip_prefix("event:") {
                        event = name.trim().to_owned();
                    } else if let Some(more) = line.strip_prefix("data:") {
                        data.push_str(more.strip_prefix(' ').unwrap_or(more));
                    }
                }
                Ok(_) => {}
                Err(err)
                    if matches!(
                        err.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => return None,
            }
            if Instant::now() >= deadline {
                return None;
            }
        }
    }

    /// Events until one satisfies `wanted` (within `wait` in all).
    pub fn until(
        &mut self,
        wait: Duration,
        wanted: impl Fn(&SentEvent) -> bool,
    ) -> Option<SentEvent> {
        let deadline = Instant::now() + wait;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.next(left) {
                Some(event) if wanted(&event) => return Some(event),
                Some(_) => {}
                None => return None,
            }
        }
        None
    }
}

/// playwright-core's directory, installed from npm into `target/browser`
/// (`.ci/run` does it); `$HIVEKERNEL_PLAYWRIGHT` points elsewhere.
pub fn playwright() -> std::path::PathBuf {
    let dir = match std::env::var_os("HIVEKERNEL_PLAYWRIGHT") {
        Some(dir) => std::path::PathBuf::from(dir),
        None => std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target/browser/node_modules/playwright-core"),
    };
    assert!(
        dir.join("package.json").exists(),
        "{} is missing; install it at the repository root:\n  \
         npm install --prefix target/browser playwright-core@{PLAYWRIGHT_VERSION}\n\
         (or point HIVEKERNEL_PLAYWRIGHT at it; CI's .ci/run installs it)",
        dir.display()
    );
    dir
}

/// The playwright-core release the browser test is written against.
pub const PLAYWRIGHT_VERSION: &str = "1.64.1";

/// The Chromium the browser test drives: `$HIVEKERNEL_CHROMIUM`, else
/// Debian's package.
pub fn chromium() -> std::path::PathBuf {
    let path = std::env::var_os("HIVEKERNEL_CHROMIUM")
        .map_or_else(|| std::path::PathBuf::from("/usr/bin/chromium"), Into::into);
    assert!(
        path.exists(),
        "{} is missing: `apt-get install chromium` (CI's .ci/run installs it), or set HIVEKERNEL_CHROMIUM",
        path.display()
    );
    path
}
