//! `kernel.cluster`: this kernel as one node of several on NATS JetStream
//! (docs/CLUSTER.md).
//!
//! ```json
//! "kernel": {
//!   "cluster": {
//!     "servers": ["nats://127.0.0.1:4222"],
//!     "node": "a",
//!     "labels": { "gpu": "true" },
//!     "heartbeat_ms": 1000,
//!     "node_ttl_ms": 5000,
//!     "nkey_file": "nats/node-a.nk",
//!     "tls_ca": "nats/ca.pem",
//!     "secret_file": "nats/cluster.secret"
//!   }
//! }
//! ```
//!
//! How a node signs in to NATS: `user:password@` or `token@` in the
//! server URLs, a credentials file (`creds_file`) or an nkey seed
//! (`nkey_file`), one of these; and a client certificate (`tls_cert`,
//! `tls_key`) beside or instead. And the cluster secret nodes sign what
//! they publish with (`secret_file`). Every file is read and checked here.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;
use serde_json::Value;

use super::ConfigIssue;
use super::parse::section;
use super::validate::Context;
use crate::nats;

/// Longest node name, label key or label value, in bytes.
pub(super) const MAX_NODE_NAME_BYTES: usize = 64;

/// How this kernel joins a cluster; absent: it runs alone.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterSettings {
    /// NATS servers to connect to (`nats://HOST:PORT`, `tls://HOST:PORT`),
    /// with the node's credentials in their user info when it signs in
    /// with a user and password or a token; any one server is enough.
    /// Shown only through [`nats::redacted`].
    pub servers: Vec<String>,
    /// This node's name, unique among live nodes.
    pub node: String,
    /// Labels a spawn's placement may select on.
    pub labels: BTreeMap<String, String>,
    /// How often the node refreshes its record.
    pub heartbeat_ms: u64,
    /// How long a record may go unrefreshed before its node is declared lost.
    pub node_ttl_ms: u64,
    /// Replicas of the buckets the cluster keeps; `None`: 3, or fewer where
    /// the cluster has fewer servers.
    pub replicas: Option<usize>,
    /// A NATS credentials file (a user JWT and its nkey seed) to sign in with.
    pub creds_file: Option<PathBuf>,
    /// A file holding the nkey seed of a NATS user to sign in with.
    pub nkey_file: Option<PathBuf>,
    /// The CA the NATS servers' certificates are checked against (PEM);
    /// `None`: the system's roots. Given, or with `tls_cert`, TLS is required.
    pub tls_ca: Option<PathBuf>,
    /// The client certificate the node presents to NATS (PEM), with `tls_key`.
    pub tls_cert: Option<PathBuf>,
    /// The private key of `tls_cert` (PEM).
    pub tls_key: Option<PathBuf>,
    /// Join a NATS server that lets the node in without credentials
    /// (`--insecure-cluster`): only on a network that only trusted hosts reach.
    pub insecure: bool,
    /// The cluster secret (at least 32 random bytes, the same file on
    /// every node, mode 600) every node signs what it publishes with;
    /// `None`: nothing is signed, and NATS credentials act as any node.
    pub secret_file: Option<PathBuf>,
}

impl std::fmt::Debug for ClusterSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let servers: Vec<_> = self.servers.iter().map(|url| nats::redacted(url)).collect();
        f.debug_struct("ClusterSettings")
            .field("servers", &servers)
            .field("node", &self.node)
            .field("labels", &self.labels)
            .field("heartbeat_ms", &self.heartbeat_ms)
            .field("node_ttl_ms", &self.node_ttl_ms)
            .field("replicas", &self.replicas)
            .field("creds_file", &self.creds_file)
            .field("nkey_file", &self.nkey_file)
            .field("tls_ca", &self.tls_ca)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .field("insecure", &self.insecure)
            .field("secret_file", &self.secret_file)
            .finish()
    }
}

impl ClusterSettings {
    /// Default refresh interval.
    pub const HEARTBEAT_MS: u64 = 1_000;
    /// Default time to loss.
    pub const NODE_TTL_MS: u64 = 5_000;

    /// Settings for `servers` and `node`, everything else defaulted.
    pub fn new(servers: Vec<String>, node: String) -> Self {
        ClusterSettings {
            servers,
            node,
            labels: BTreeMap::new(),
            heartbeat_ms: Self::HEARTBEAT_MS,
            node_ttl_ms: Self::NODE_TTL_MS,
            replicas: None,
            creds_file: None,
            nkey_file: None,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            insecure: false,
            secret_file: None,
        }
    }

    /// Whether the node proves who it is to NATS: credentials in a server
    /// URL, a credentials file, an nkey seed or a client certificate. A
    /// server that lets a node without any in is open to anyone who can
    /// reach it.
    pub fn has_credentials(&self) -> bool {
        self.creds_file.is_some()
            || self.nkey_file.is_some()
            || self.tls_cert.is_some()
            || matches!(nats::url_credentials(&self.servers), Ok(Some(_)) | Err(_))
    }

    /// What is wrong with how the node signs in, each with its setting
    /// (`servers_at` names where the servers came from): URLs carrying
    /// different credentials, or more than one way to sign in.
    pub fn access_issues(&self, servers_at: &str) -> Vec<ConfigIssue> {
        access_issues(
            &self.servers,
            servers_at,
            self.creds_file.is_some(),
            self.nkey_file.is_some(),
        )
    }

    /// A silence of this node's own heartbeat or watch longer than this is
    /// a gap, after which it judges nobody until it has seen the cluster
    /// again.
    pub fn gap(&self) -> std::time::Duration {
        std::time::Duration::from_millis((self.node_ttl_ms / 3).max(2 * self.heartbeat_ms))
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawCluster {
    servers: Option<Vec<String>>,
    node: Option<String>,
    labels: BTreeMap<String, String>,
    heartbeat_ms: Option<u64>,
    node_ttl_ms: Option<u64>,
    replicas: Option<usize>,
    creds_file: Option<String>,
    nkey_file: Option<String>,
    tls_ca: Option<String>,
    tls_cert: Option<String>,
    tls_key: Option<String>,
    insecure: bool,
    secret_file: Option<String>,
}

/// Why `name` cannot name a node or a label, if it cannot: node names
/// become parts of NATS subjects and keys.
pub fn node_name_problem(name: &str) -> Option<String> {
    let shown = || hivekernel_agents::text::shown(name);
    if name.is_empty() {
        Some("must not be empty".to_owned())
    } else if name.len() > MAX_NODE_NAME_BYTES {
        Some(format!(
            "{} is {} bytes long, at most {MAX_NODE_NAME_BYTES} allowed",
            shown(),
            name.len()
        ))
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        Some(format!(
            "{} may hold only ASCII letters, digits, '-' and '_'",
            shown()
        ))
    } else {
        None
    }
}

/// Why `url` is not a NATS server address, if it is not; the URL shown
/// without its secrets.
pub(super) fn server_problem(url: &str) -> Option<String> {
    let shown = || hivekernel_agents::text::shown(&nats::redacted(url));
    let Some((scheme, rest)) = url.split_once("://") else {
        return Some(format!(
            "{} is not a NATS URL (expected nats://HOST:PORT)",
            shown()
        ));
    };
    if !matches!(scheme, "nats" | "tls") {
        return Some(format!(
            "{} has scheme {scheme:?} (expected nats:// or tls://)",
            shown()
        ));
    }
    if let Err(problem) = nats::split_credentials(url) {
        return Some(format!("{} {problem}", shown()));
    }
    let host_port = rest.rsplit('@').next().unwrap_or(rest);
    let Some((host, port)) = host_port.rsplit_once(':') else {
        return Some(format!("{} names no port (such as :4222)", shown()));
    };
    if host.is_empty() || port.parse::<u16>().map_or(true, |port| port == 0) {
        return Some(format!(
            "{} needs a host and a port from 1 to 65535",
            shown()
        ));
    }
    None
}

/// `--cluster`'s comma-separated list as server URLs, each checked (the
/// credentials they carry too).
pub fn parse_servers(list: &str) -> Result<Vec<String>, String> {
    let servers: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    if servers.is_empty() {
        return Err("names no server (expected nats://HOST:PORT[,...])".to_owned());
    }
    if let Some(problem) = servers.iter().find_map(|url| server_problem(url)) {
        return Err(problem);
    }
    if let Err((i, problem)) = nats::url_credentials(&servers) {
        return Err(format!("{}: {problem}", nats::redacted(&servers[i])));
    }
    Ok(servers)
}

/// What is wrong with how a node signs in to NATS, each with its setting:
/// URLs carrying different credentials, or two ways to sign in at once.
fn access_issues(
    servers: &[String],
    servers_at: &str,
    creds_file: bool,
    nkey_file: bool,
) -> Vec<ConfigIssue> {
    let mut issues = Vec::new();
    let in_urls = match nats::url_credentials(servers) {
        Ok(found) => found.is_some(),
        Err((i, problem)) => {
            issues.push(ConfigIssue::new(format!("{servers_at}[{i}]"), problem));
            true
        }
    };
    let one_way = "a node signs in one way: credentials in the server URLs, creds_file or \
                   nkey_file (a client certificate may go with any)";
    if creds_file && nkey_file {
        issues.push(ConfigIssue::new(
            "kernel.cluster.nkey_file",
            format!("is set beside creds_file, which holds its own nkey seed: {one_way}"),
        ));
    }
    for (set, field) in [(creds_file, "creds_file"), (nkey_file, "nkey_file")] {
        if set && in_urls {
            issues.push(ConfigIssue::new(
                format!("kernel.cluster.{field}"),
                format!("is set beside credentials in {servers_at}: {one_way}"),
            ));
        }
    }
    issues
}

/// This machine's host name (its first label), the default node name, or
/// why it cannot be one.
pub fn host_name() -> Result<String, String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_err(|err| format!("this machine's host name cannot be read ({err})"))?;
    let name = name.trim().split('.').next().unwrap_or_default().to_owned();
    match node_name_problem(&name) {
        None => Ok(name),
        Some(problem) => Err(format!("this machine's host name cannot be one: {problem}")),
    }
}

/// Parses and checks `kernel.cluster`; `None` when absent.
pub(super) fn cluster(
    value: Option<&Value>,
    checks: &Context<'_>,
    issues: &mut Vec<ConfigIssue>,
) -> Option<ClusterSettings> {
    if value.is_none_or(Value::is_null) {
        return None;
    }
    let before = issues.len();
    let parsed = section::<RawCluster>(value, "kernel.cluster", issues);
    // A parser's message quotes the value, which may be a URL with a secret.
    for issue in &mut issues[before..] {
        issue.message = nats::redacted_in(&issue.message);
    }
    let mut servers_ok = parsed.is_ok("servers");
    let raw = parsed.value;
    let access = access(&raw, checks, issues);
    let servers = match raw.servers {
        Some(servers) if !servers.is_empty() => {
            for (i, url) in servers.iter().enumerate() {
                if let Some(problem) = server_problem(url) {
                    issues.push(ConfigIssue::new(
                        format!("kernel.cluster.servers[{i}]"),
                        problem,
                    ));
                    servers_ok = false;
                }
            }
            servers
        }
        _ if !servers_ok => Vec::new(),
        _ => {
            issues.push(ConfigIssue::new(
                "kernel.cluster.servers",
                "is required when kernel.cluster is given: the NATS servers, such as [\"nats://127.0.0.1:4222\"]",
            ));
            Vec::new()
        }
    };
    // Without a name, the host's; when that cannot be one, `--node` may
    // still give it, so the problem is said at start.
    let node = match raw.node {
        Some(node) => {
            if let Some(problem) = node_name_problem(&node) {
                issues.push(ConfigIssue::new("kernel.cluster.node", problem));
            }
            node
        }
        None => host_name().unwrap_or_default(),
    };
    for (key, value) in &raw.labels {
        if let Some(problem) = node_name_problem(key) {
            issues.push(ConfigIssue::new(
                "kernel.cluster.labels",
                format!("key {problem}"),
            ));
        }
        if value.len() > MAX_NODE_NAME_BYTES {
            issues.push(ConfigIssue::new(
                format!("kernel.cluster.labels.{key}"),
                format!(
                    "is {} bytes long, at most {MAX_NODE_NAME_BYTES} allowed",
                    value.len()
                ),
            ));
        }
    }
    let heartbeat_ms = raw.heartbeat_ms.unwrap_or(ClusterSettings::HEARTBEAT_MS);
    if !(100..=60_000).contains(&heartbeat_ms) {
        issues.push(ConfigIssue::new(
            "kernel.cluster.heartbeat_ms",
            format!("{heartbeat_ms} is out of range (100 to 60000)"),
        ));
    }
    let node_ttl_ms = raw.node_ttl_ms.unwrap_or(ClusterSettings::NODE_TTL_MS);
    if node_ttl_ms < heartbeat_ms.saturating_mul(3) || node_ttl_ms > 600_000 {
        issues.push(ConfigIssue::new(
            "kernel.cluster.node_ttl_ms",
            format!(
                "{node_ttl_ms} is out of range (at least 3 heartbeats, {} ms, and at most 600000)",
                heartbeat_ms.saturating_mul(3)
            ),
        ));
    }
    if let Some(replicas) = raw.replicas
        && !(1..=5).contains(&replicas)
    {
        issues.push(ConfigIssue::new(
            "kernel.cluster.replicas",
            format!("{replicas} is out of range (1 to 5)"),
        ));
    }
    if servers_ok {
        issues.extend(access_issues(
            &servers,
            "kernel.cluster.servers",
            access.creds_file.is_some(),
            access.nkey_file.is_some(),
        ));
    }
    (issues.len() == before).then_some(ClusterSettings {
        servers,
        node,
        labels: raw.labels,
        heartbeat_ms,
        node_ttl_ms,
        replicas: raw.replicas,
        insecure: raw.insecure,
        ..access
    })
}

/// The credential and TLS files of `raw`, each resolved against the
/// config's directory, read and checked (the rest of the settings empty).
fn access(
    raw: &RawCluster,
    checks: &Context<'_>,
    issues: &mut Vec<ConfigIssue>,
) -> ClusterSettings {
    let at = |field: &str| format!("kernel.cluster.{field}");
    let mut path = |text: &Option<String>, field: &str| {
        text.as_deref()
            .and_then(|text| checks.path_field(text, &at(field), issues))
    };
    let mut settings = ClusterSettings::new(Vec::new(), String::new());
    settings.creds_file = path(&raw.creds_file, "creds_file");
    settings.nkey_file = path(&raw.nkey_file, "nkey_file");
    settings.tls_ca = path(&raw.tls_ca, "tls_ca");
    settings.tls_cert = path(&raw.tls_cert, "tls_cert");
    settings.tls_key = path(&raw.tls_key, "tls_key");
    settings.secret_file = path(&raw.secret_file, "secret_file");
    if let Some(file) = &settings.secret_file
        && let Err(problem) = read_secret(file)
    {
        issues.push(ConfigIssue::new(at("secret_file"), problem));
    }
    if let Some(file) = &settings.creds_file
        && let Err(problem) = nats::read_creds(file)
    {
        issues.push(ConfigIssue::new(at("creds_file"), problem));
    }
    if let Some(file) = &settings.nkey_file
        && let Err(problem) = nats::read_nkey_seed(file)
    {
        issues.push(ConfigIssue::new(at("nkey_file"), problem));
    }
    let identity = match (&settings.tls_cert, &settings.tls_key) {
        (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
        (Some(_), None) => {
            let message =
                "missing: a client certificate (tls_cert) needs its private key (tls_key)";
            issues.push(ConfigIssue::new(at("tls_key"), message));
            return settings;
        }
        (None, Some(_)) => {
            let message =
                "missing: a private key (tls_key) needs its client certificate (tls_cert)";
            issues.push(ConfigIssue::new(at("tls_cert"), message));
            return settings;
        }
        (None, None) => None,
    };
    if (settings.tls_ca.is_some() || identity.is_some())
        && let Err((field, err)) = nats::client_tls(settings.tls_ca.as_deref(), identity)
    {
        issues.push(ConfigIssue::new(at(field), err.to_string()));
    }
    settings
}

/// The fewest bytes a cluster secret holds.
pub const MIN_SECRET_BYTES: usize = 32;

/// The cluster secret in the file at `path`: a regular file only its
/// owner may read, of at least [`MIN_SECRET_BYTES`] (a final line end
/// is not counted). The error never quotes the file.
pub fn read_secret(path: &std::path::Path) -> Result<Vec<u8>, String> {
    let mut bytes = crate::files::read_private(path, 64 * 1024).map_err(|problem| {
        format!(
            "cannot read cluster secret file {}: {problem}",
            path.display()
        )
    })?;
    while bytes.last().is_some_and(|&b| b == b'\n' || b == b'\r') {
        bytes.pop();
    }
    if bytes.len() < MIN_SECRET_BYTES {
        return Err(format!(
            "cluster secret file {} holds {} bytes, at least {MIN_SECRET_BYTES} random ones \
             needed (`hivekernel cluster secret FILE` makes one)",
            path.display(),
            bytes.len()
        ));
    }
    Ok(bytes)
}
