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
//!     "node_ttl_ms": 5000
//!   }
//! }
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::ConfigIssue;
use super::parse::section;

/// Longest node name, label key or label value, in bytes.
pub(super) const MAX_NODE_NAME_BYTES: usize = 64;

/// How this kernel joins a cluster; absent: it runs alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSettings {
    /// NATS servers to connect to (`nats://HOST:PORT`, `tls://HOST:PORT`); any one is enough.
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
        }
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

/// Why `url` is not a NATS server address, if it is not.
pub(super) fn server_problem(url: &str) -> Option<String> {
    let shown = || hivekernel_agents::text::shown(url);
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

/// `--cluster`'s comma-separated list as server URLs, each checked.
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
    match servers.iter().find_map(|url| server_problem(url)) {
        Some(problem) => Err(problem),
        None => Ok(servers),
    }
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
    issues: &mut Vec<ConfigIssue>,
) -> Option<ClusterSettings> {
    if value.is_none_or(Value::is_null) {
        return None;
    }
    let before = issues.len();
    let parsed = section::<RawCluster>(value, "kernel.cluster", issues);
    let servers_ok = parsed.is_ok("servers");
    let raw = parsed.value;
    let servers = match raw.servers {
        Some(servers) if !servers.is_empty() => {
            for (i, url) in servers.iter().enumerate() {
                if let Some(problem) = server_problem(url) {
                    issues.push(ConfigIssue::new(
                        format!("kernel.cluster.servers[{i}]"),
                        problem,
                    ));
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
    (issues.len() == before).then_some(ClusterSettings {
        servers,
        node,
        labels: raw.labels,
        heartbeat_ms,
        node_ttl_ms,
        replicas: raw.replicas,
    })
}
