//! A real NATS cluster for the clustering tests: `nats-server` (Debian's
//! package; CI installs it, v2.9.10) with JetStream, one server or a few
//! routed together on loopback, each with its own config, JetStream store
//! and log in a temporary directory. Tests kill, stop, resume and restart
//! single servers; dropping the cluster kills every server and removes the
//! directory.
//!
//! Clients sign in as nodes must: with a user and a password made for the
//! cluster by default ([`NatsCluster::start`]; [`NatsCluster::url`] carries
//! them, as a node's `--cluster` does), or as [`Access`] says
//! ([`NatsCluster::start_with`]): a token, nkeys, TLS client certificates,
//! or nothing at all.
//!
//! Readiness is read from each server's monitoring port: `/healthz` says
//! `ok` once JetStream is current with the meta leader, `/routez` counts the
//! routes and `/jsz` names the meta leader (`meta_cluster.leader`) and the
//! meta group's size (`meta_cluster.cluster_size`).
//!
//! The methods block (they poll with `std::thread::sleep`); from a tokio test
//! whose in-process kernels must keep running meanwhile, call them through
//! `tokio::task::spawn_blocking` or `tokio::task::block_in_place`.

use std::collections::BTreeSet;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

/// The NATS cluster's name (`cluster { name }`), as the servers' `INFO` and
/// `/jsz` report it.
pub const CLUSTER_NAME: &str = "hk";

/// How long [`NatsCluster::start`] and [`NatsCluster::restart`] wait for the
/// servers to be ready.
pub const READY_LIMIT: Duration = Duration::from_secs(30);

/// The variable that points at a `nats-server` binary to use instead of the
/// one on `PATH`.
pub const NATS_SERVER_ENV: &str = "HIVEKERNEL_NATS_SERVER";

/// The user [`Access::Password`] signs in as.
pub const USER: &str = "hk";

/// How clients sign in to the servers of a [`NatsCluster`] (each server's
/// `authorization` or `tls` block).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// User [`USER`] with a password made for the cluster
    /// ([`NatsCluster::secret`]): what [`NatsCluster::start`] asks for.
    Password,
    /// A token made for the cluster ([`NatsCluster::secret`]).
    Token,
    /// The users of these public nkeys (`U...`), none other.
    Nkeys(Vec<String>),
    /// TLS on the client port with this certificate and key (PEM files),
    /// every client presenting a certificate signed by `ca` (`verify: true`).
    Tls {
        /// The servers' certificate.
        cert: PathBuf,
        /// Its private key.
        key: PathBuf,
        /// The CA of the clients' certificates.
        ca: PathBuf,
    },
    /// No authorization: whoever reaches the port is in.
    Open,
}

/// How long one monitoring request may take (a stopped server never answers).
const MONITOR_TIMEOUT: Duration = Duration::from_secs(2);

/// Ports handed to clusters of this test process and not yet released.
static TAKEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// The `nats-server` binary: `$HIVEKERNEL_NATS_SERVER` if set (`None` when it
/// names no file), else `nats-server` on `PATH`, else Debian's
/// `/usr/sbin/nats-server` (`/usr/sbin` is not on every user's `PATH`).
pub fn nats_server() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os(NATS_SERVER_ENV) {
        let bin = PathBuf::from(bin);
        return bin.is_file().then_some(bin);
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("nats-server"))
        .chain([PathBuf::from("/usr/sbin/nats-server")])
        .find(|bin| bin.is_file())
}

/// One server of a [`NatsCluster`]: its ports, its directory and, while it
/// runs, its process.
#[derive(Debug)]
struct Server {
    /// `server_name`, `n0`, `n1`, ...
    name: String,
    /// The client port (`listen`).
    port: u16,
    /// The route port (`cluster { listen }`).
    route_port: u16,
    /// The monitoring port (`http`).
    http_port: u16,
    /// Holds `nats.conf`, `nats.log` and the JetStream store `js`.
    dir: PathBuf,
    /// `None` once killed (or exited).
    child: Option<Child>,
    /// Whether it is stopped by SIGSTOP.
    stopped: bool,
}

impl Server {
    fn config(&self) -> PathBuf {
        self.dir.join("nats.conf")
    }

    fn log_file(&self) -> PathBuf {
        self.dir.join("nats.log")
    }

    /// Started and not stopped, so it answers.
    fn running(&self) -> bool {
        self.child.is_some() && !self.stopped
    }

    fn pid(&self) -> u32 {
        match &self.child {
            Some(child) => child.id(),
            None => panic!("nats-server {} is not running", self.name),
        }
    }
}

/// `servers` `nats-server`s with JetStream on loopback, routed into the
/// cluster [`CLUSTER_NAME`] when there are several; each killed when the
/// cluster is dropped, and their directory removed.
///
/// Servers are numbered from 0; server `i` is named `n{i}`.
#[derive(Debug)]
pub struct NatsCluster {
    bin: PathBuf,
    servers: Vec<Server>,
    dir: TempDir,
    access: Access,
    /// The password or token of [`Access::Password`] and [`Access::Token`].
    secret: String,
}

impl NatsCluster {
    /// Starts `servers` servers (1: one server without a `cluster` block)
    /// and waits (up to [`READY_LIMIT`]) until every one has its routes to
    /// all the others, says `/healthz` ok, and they agree on a JetStream
    /// meta leader of a group of `servers`. Panics, with the servers' logs,
    /// if they are not ready by then, and with "nats-server not found" if
    /// there is no [`nats_server`]. Clients sign in with [`Access::Password`].
    pub fn start(servers: usize) -> NatsCluster {
        NatsCluster::start_with(servers, Access::Password)
    }

    /// [`NatsCluster::start`] with clients signing in as `access` says.
    pub fn start_with(servers: usize, access: Access) -> NatsCluster {
        assert!(servers >= 1, "a NATS cluster needs at least one server");
        let Some(bin) = nats_server() else {
            panic!(
                "nats-server not found: install Debian's nats-server package \
                 (or point ${NATS_SERVER_ENV} at a nats-server binary)"
            );
        };
        // A port found free can be taken before the server binds it; then
        // start over on other ports.
        let mut attempt = 1;
        loop {
            let mut cluster = NatsCluster::configure(bin.clone(), servers, access.clone());
            for i in 0..servers {
                cluster.spawn(i);
            }
            match cluster.wait(READY_LIMIT) {
                Ok(()) => return cluster,
                Err(_) if attempt < 3 && cluster.logs().contains("address already in use") => {
                    attempt += 1;
                }
                Err(why) => panic!("the NATS cluster did not start: {why}"),
            }
        }
    }

    /// Picks the ports and writes every server's config.
    fn configure(bin: PathBuf, count: usize, access: Access) -> NatsCluster {
        let dir = tempfile::Builder::new()
            .prefix("hivekernel-nats-")
            .tempdir()
            .expect("a temporary directory for the NATS cluster");
        let ports = free_ports(3 * count);
        let servers: Vec<Server> = ports
            .chunks(3)
            .enumerate()
            .map(|(i, ports)| Server {
                name: format!("n{i}"),
                port: ports[0],
                route_port: ports[1],
                http_port: ports[2],
                dir: dir.path().join(format!("n{i}")),
                child: None,
                stopped: false,
            })
            .collect();
        let random = RandomState::new();
        let secret = format!("{:016x}{:016x}", random.hash_one(1), random.hash_one(2));
        let config_of = |server: &Server| config(server, &servers, &access, &secret);
        for server in &servers {
            std::fs::create_dir_all(&server.dir).expect("a NATS server's directory");
            std::fs::write(server.config(), config_of(server)).expect("a NATS server's config");
        }
        NatsCluster {
            bin,
            servers,
            dir,
            access,
            secret,
        }
    }

    /// The temporary directory of the cluster: server `i`'s config, log and
    /// JetStream store are `n{i}/nats.conf`, `n{i}/nats.log` and `n{i}/js`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// How many servers the cluster has (running or not).
    pub fn servers(&self) -> usize {
        self.servers.len()
    }

    /// Server `i`'s client URL, `nats://127.0.0.1:PORT`, with the
    /// credentials of [`Access::Password`] (`hk:SECRET@`) or
    /// [`Access::Token`] (`SECRET@`); `tls://` with [`Access::Tls`].
    pub fn url(&self, i: usize) -> String {
        self.url_at(&self.addr(i))
    }

    /// A client URL of `addr` (`host:port`: a relay to a server) as
    /// [`NatsCluster::url`] makes them.
    pub fn url_at(&self, addr: &str) -> String {
        match &self.access {
            Access::Password => format!("nats://{USER}:{}@{addr}", self.secret),
            Access::Token => format!("nats://{}@{addr}", self.secret),
            Access::Tls { .. } => format!("tls://{addr}"),
            Access::Nkeys(_) | Access::Open => format!("nats://{addr}"),
        }
    }

    /// Server `i`'s client address, `127.0.0.1:PORT`.
    pub fn addr(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.servers[i].port)
    }

    /// The password of [`Access::Password`] or the token of [`Access::Token`].
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// A client of server `i`, signed in with the password or the token
    /// (for [`Access::Password`] and [`Access::Token`]).
    pub async fn client(&self, i: usize) -> Result<async_nats::Client, async_nats::ConnectError> {
        let options = match self.access {
            Access::Password => {
                async_nats::ConnectOptions::with_user_and_password(USER.into(), self.secret.clone())
            }
            Access::Token => async_nats::ConnectOptions::with_token(self.secret.clone()),
            _ => async_nats::ConnectOptions::new(),
        };
        options.connect(format!("nats://{}", self.addr(i))).await
    }

    /// Every server's client URL, comma separated, as a kernel's `--cluster`
    /// flag takes them (killed servers included: the list is the cluster's,
    /// not who is up).
    pub fn urls(&self) -> String {
        (0..self.servers.len())
            .map(|i| self.url(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Server `i`'s `server_name`, `n{i}`, as `/jsz` and `INFO` name it.
    pub fn name(&self, i: usize) -> &str {
        &self.servers[i].name
    }

    /// Server `i`'s monitoring address (`host:port`), for `GET /varz`, `/jsz`, ...
    pub fn monitor_addr(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.servers[i].http_port)
    }

    /// The JSON body of `GET path` (with its query) on server `i`'s
    /// monitoring port, whatever the status (`/healthz` answers 503 with a
    /// JSON error); `None` if it does not answer within 2 s or not in JSON.
    pub fn monitor(&self, i: usize, path: &str) -> Option<Value> {
        get_json(self.servers[i].http_port, path)
    }

    /// What server `i` has written to its stdout and stderr so far, every
    /// run of it (restarts append).
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.servers[i].log_file()).unwrap_or_default()
    }

    /// Kills server `i` (SIGKILL, even when stopped) and reaps it; its ports
    /// stay reserved for [`NatsCluster::restart`]. Does nothing if it is not
    /// running.
    pub fn kill(&mut self, i: usize) {
        let server = &mut self.servers[i];
        if let Some(mut child) = server.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        server.stopped = false;
    }

    /// Starts server `i` again (killing it first if it runs) with the same
    /// config, ports and JetStream store, and waits (up to [`READY_LIMIT`])
    /// until it has rejoined: every running server has its routes, says
    /// `/healthz` ok and names the same meta leader. Stopped servers are not
    /// waited for. Panics with the logs if that does not happen.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
        if let Err(why) = self.wait(READY_LIMIT) {
            panic!("nats-server {} did not rejoin: {why}", self.servers[i].name);
        }
    }

    /// Stops server `i` with SIGSTOP: its sockets stay open but it answers
    /// nothing (to clients, routes or monitoring) until [`NatsCluster::resume`].
    pub fn stop(&mut self, i: usize) {
        signal(self.servers[i].pid(), "STOP");
        self.servers[i].stopped = true;
    }

    /// Continues server `i` after [`NatsCluster::stop`] (SIGCONT), not
    /// waiting for anything: see [`NatsCluster::wait_ready`].
    pub fn resume(&mut self, i: usize) {
        signal(self.servers[i].pid(), "CONT");
        self.servers[i].stopped = false;
    }

    /// Waits up to `limit` until the running servers (neither killed nor
    /// stopped) are ready: each has a route to every other running server
    /// and says `/healthz` ok, and all of them name the same running server
    /// as the JetStream meta leader, whose meta group has every server of
    /// the cluster. Panics with the reason and the logs after `limit`, or
    /// if a server exits.
    pub fn wait_ready(&mut self, limit: Duration) {
        if let Err(why) = self.wait(limit) {
            panic!("the NATS cluster is not ready: {why}");
        }
    }

    /// The server the running servers all name as the JetStream meta leader,
    /// if they agree on a running one (a lone server leads itself once its
    /// `/healthz` says ok); `None` while there is none, e.g. during an
    /// election.
    pub fn leader(&self) -> Option<usize> {
        if self.servers.len() == 1 {
            let ok = self.servers[0].running()
                && self
                    .monitor(0, "/healthz")
                    .is_some_and(|h| h["status"] == "ok");
            return ok.then_some(0);
        }
        let mut leader = None;
        for i in self.running() {
            let jsz = self.monitor(i, "/jsz")?;
            let named = jsz["meta_cluster"]["leader"].as_str()?;
            let index = self.servers.iter().position(|s| s.name == named)?;
            if leader.is_some_and(|l| l != index) {
                return None;
            }
            leader = Some(index);
        }
        leader.filter(|&l| self.servers[l].running())
    }

    /// The indexes of the servers that run and are not stopped.
    fn running(&self) -> Vec<usize> {
        (0..self.servers.len())
            .filter(|&i| self.servers[i].running())
            .collect()
    }

    /// Starts server `i`'s process, its output appended to its log.
    fn spawn(&mut self, i: usize) {
        let server = &mut self.servers[i];
        assert!(
            server.child.is_none(),
            "nats-server {} is running",
            server.name
        );
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(server.log_file())
            .expect("a NATS server's log");
        let child = Command::new(&self.bin)
            .arg("--config")
            .arg(server.config())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("a NATS server's log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|err| panic!("cannot run {}: {err}", self.bin.display()));
        server.child = Some(child);
        server.stopped = false;
    }

    /// [`NatsCluster::wait_ready`], with an error instead of a panic.
    fn wait(&mut self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            for server in &mut self.servers {
                let exited = match server.child.as_mut() {
                    Some(child) => child.try_wait().ok().flatten(),
                    None => None,
                };
                if let Some(status) = exited {
                    server.child = None;
                    let name = server.name.clone();
                    return Err(format!(
                        "nats-server {name} exited ({status})\n{}",
                        self.logs()
                    ));
                }
            }
            let why = match self.ready() {
                Ok(()) => return Ok(()),
                Err(why) => why,
            };
            if Instant::now() >= deadline {
                return Err(format!("after {limit:?}: {why}\n{}", self.logs()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `Ok` when the running servers are ready, else what is missing.
    fn ready(&self) -> Result<(), String> {
        let running = self.running();
        if running.is_empty() {
            return Err("no server is running".into());
        }
        let mut leader: Option<usize> = None;
        for &i in &running {
            let name = &self.servers[i].name;
            let health = self
                .monitor(i, "/healthz")
                .ok_or_else(|| format!("{name}: no answer on /healthz"))?;
            if health["status"] != "ok" {
                return Err(format!("{name}: /healthz says {health}"));
            }
            if self.servers.len() == 1 {
                continue;
            }
            let routez = self
                .monitor(i, "/routez")
                .ok_or_else(|| format!("{name}: no answer on /routez"))?;
            let routes = routez["num_routes"].as_u64().unwrap_or(0);
            if routes < (running.len() - 1) as u64 {
                return Err(format!("{name}: {routes} routes"));
            }
            let jsz = self
                .monitor(i, "/jsz")
                .ok_or_else(|| format!("{name}: no answer on /jsz"))?;
            let Some(named) = jsz["meta_cluster"]["leader"].as_str() else {
                return Err(format!("{name}: no meta leader"));
            };
            let Some(index) = running
                .iter()
                .copied()
                .find(|&r| self.servers[r].name == named)
            else {
                return Err(format!("{name}: meta leader {named} is not running"));
            };
            if leader.is_some_and(|l| l != index) {
                return Err(format!("{name}: meta leader {named}, others name another"));
            }
            leader = Some(index);
            let size = jsz["meta_cluster"]["cluster_size"].as_u64().unwrap_or(0);
            if index == i && size != self.servers.len() as u64 {
                return Err(format!("{name}: meta group of {size}"));
            }
        }
        Ok(())
    }

    /// Every server's log, each under its name.
    fn logs(&self) -> String {
        (0..self.servers.len())
            .map(|i| {
                format!(
                    "--- nats-server {} log ---\n{}",
                    self.servers[i].name,
                    self.log(i)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for i in 0..self.servers.len() {
            self.kill(i);
        }
        let mut taken = TAKEN.lock().unwrap_or_else(PoisonError::into_inner);
        for server in &self.servers {
            for port in [server.port, server.route_port, server.http_port] {
                taken.remove(&port);
            }
        }
        // `dir`, a `TempDir`, is removed as the fields drop.
    }
}

/// Server `server`'s config: its name, client, monitoring and (with other
/// servers) route ports, routes to every other server, JetStream with a
/// store in its directory and modest limits, and who clients may be
/// (`access`, with `secret`).
fn config(server: &Server, servers: &[Server], access: &Access, secret: &str) -> String {
    let quoted = |text: &str| Value::from(text).to_string();
    let store = server.dir.join("js");
    let mut config = format!(
        "server_name: {name}\n\
         listen: \"127.0.0.1:{port}\"\n\
         http: \"127.0.0.1:{http}\"\n\
         jetstream {{\n  store_dir: {store}\n  max_memory_store: 64MB\n  max_file_store: 256MB\n}}\n",
        name = quoted(&server.name),
        port = server.port,
        http = server.http_port,
        store = quoted(&store.to_string_lossy()),
    );
    let path = |path: &Path| quoted(&path.to_string_lossy());
    match access {
        Access::Password => config.push_str(&format!(
            "authorization {{\n  user: {}\n  password: {}\n}}\n",
            quoted(USER),
            quoted(secret)
        )),
        Access::Token => config.push_str(&format!(
            "authorization {{\n  token: {}\n}}\n",
            quoted(secret)
        )),
        Access::Nkeys(keys) => {
            let users: Vec<String> = keys
                .iter()
                .map(|key| format!("    {{ nkey: {} }}\n", quoted(key)))
                .collect();
            config.push_str(&format!(
                "authorization {{\n  users = [\n{}  ]\n}}\n",
                users.concat()
            ));
        }
        Access::Tls { cert, key, ca } => config.push_str(&format!(
            "tls {{\n  cert_file: {}\n  key_file: {}\n  ca_file: {}\n  verify: true\n}}\n",
            path(cert),
            path(key),
            path(ca)
        )),
        Access::Open => {}
    }
    if servers.len() > 1 {
        let routes: Vec<String> = servers
            .iter()
            .filter(|other| other.name != server.name)
            .map(|other| format!("    \"nats://127.0.0.1:{}\"\n", other.route_port))
            .collect();
        config.push_str(&format!(
            "cluster {{\n  name: {name}\n  listen: \"127.0.0.1:{port}\"\n  routes: [\n{routes}  ]\n}}\n",
            name = quoted(CLUSTER_NAME),
            port = server.route_port,
            routes = routes.concat(),
        ));
    }
    config
}

/// `count` distinct loopback ports free now and not handed to another
/// cluster of this process, reserved until that cluster drops.
///
/// They are picked below the kernel's ephemeral range (where the port-0
/// harnesses and every outgoing connection take theirs), so that a killed
/// server's port is still free when it restarts.
fn free_ports(count: usize) -> Vec<u16> {
    let range = below_ephemeral();
    let random = std::collections::hash_map::RandomState::new();
    let mut taken = TAKEN.lock().unwrap_or_else(PoisonError::into_inner);
    let mut held = Vec::with_capacity(count);
    let mut ports = Vec::with_capacity(count);
    for attempt in 0u64..100_000 {
        if ports.len() == count {
            break;
        }
        let port = match range {
            Some((low, high)) => {
                let span = u64::from(high - low);
                low + u16::try_from(random.hash_one(attempt) % span).unwrap_or(0)
            }
            None => 0,
        };
        if port != 0 && taken.contains(&port) {
            continue;
        }
        let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) else {
            continue;
        };
        let Ok(port) = listener.local_addr().map(|addr| addr.port()) else {
            continue;
        };
        if taken.insert(port) {
            ports.push(port);
            held.push(listener);
        }
    }
    assert!(ports.len() == count, "no {count} free loopback ports");
    ports
}

/// The ports from half the start of the ephemeral range up to it (16384 to
/// 32767 with Linux's default), or `None` (use port 0) if that is unknown
/// or too small.
fn below_ephemeral() -> Option<(u16, u16)> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let low: u16 = range.split_whitespace().next()?.parse().ok()?;
    (low >= 4096).then_some((low / 2, low))
}

/// The JSON body of an HTTP/1.0 `GET path` from `127.0.0.1:port`, whatever
/// the status; `None` if it does not answer within [`MONITOR_TIMEOUT`].
fn get_json(port: u16, path: &str) -> Option<Value> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, MONITOR_TIMEOUT).ok()?;
    stream.set_read_timeout(Some(MONITOR_TIMEOUT)).ok()?;
    stream.set_write_timeout(Some(MONITOR_TIMEOUT)).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let response = String::from_utf8_lossy(&response);
    let (_, body) = response.split_once("\r\n\r\n")?;
    serde_json::from_str(body).ok()
}

/// Sends `SIG<name>` to `pid` with kill(1) (this crate has no unsafe code
/// for kill(2)); panics if that fails.
fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .unwrap_or_else(|err| panic!("cannot run kill: {err}"));
    assert!(status.success(), "kill -{name} {pid}: {status}");
}
