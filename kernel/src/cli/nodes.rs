//! `hivekernel nodes`: the cluster's live nodes as the node asked sees them.

use hivekernel_proto::v1::{ListNodesRequest, Node};
use serde_json::{Value, json};

use super::client::Session;
use super::{CliError, ClientArgs, human, output};

/// Lists the nodes, as a table or as JSON.
pub(super) async fn run(json: bool, client: &ClientArgs) -> Result<(), CliError> {
    let mut session = Session::connect(client).await?;
    let nodes = session
        .client
        .list_nodes(ListNodesRequest {})
        .await
        .map_err(|status| session.error(status))?
        .into_inner()
        .nodes;
    if json {
        let all: Vec<Value> = nodes.iter().map(node_json).collect();
        output::print(&output::line(&Value::Array(all).to_string()))
    } else {
        output::print(&table(&nodes, human::now_ms()))
    }
}

/// `cluster secret FILE`: a new cluster secret, written to a file created
/// with mode 600 (an existing one is left as it is: it may be the
/// cluster's, which every node holds).
pub(super) fn new_secret(file: &std::path::Path) -> Result<(), CliError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let secret = crate::cluster::new_secret().map_err(CliError::Refused)?;
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(file)
        .map_err(|err| match err.kind() {
            std::io::ErrorKind::AlreadyExists => CliError::Usage(format!(
                "{} exists already: a cluster secret is never overwritten (every node holds \
                 the same one); remove it first to make a new one",
                file.display()
            )),
            _ => CliError::Usage(format!("cannot create {}: {err}", file.display())),
        })?;
    out.write_all(format!("{secret}\n").as_bytes())
        .and_then(|()| out.sync_all())
        .map_err(|err| CliError::Refused(format!("cannot write {}: {err}", file.display())))?;
    output::print(&format!(
        "wrote a cluster secret to {} (mode 600): copy it to every node, and set \
         kernel.cluster.secret_file to it\n",
        file.display()
    ))
}

/// NODE EPOCH ADDRESS PROCS RUNNING CPU AGE HEARTBEAT LABELS; the node
/// that answered marked with `*`.
fn table(nodes: &[Node], now: u64) -> String {
    let mut rows = vec![
        [
            "NODE",
            "EPOCH",
            "ADDRESS",
            "PROCS",
            "RUNNING",
            "CPU",
            "AGE",
            "HEARTBEAT",
            "LABELS",
        ]
        .map(str::to_owned),
    ];
    for node in nodes {
        let mut labels: Vec<String> = node
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        labels.sort();
        rows.push([
            if node.this_node {
                format!("{} *", node.name)
            } else {
                node.name.clone()
            },
            node.epoch.to_string(),
            node.address.clone(),
            human::count(node.processes),
            human::count(node.running),
            format!("{:.0}%", node.cpu_percent),
            human::age(node.started_unix_ms, now),
            format!("{} ago", human::duration(node.seen_ms_ago)),
            if labels.is_empty() {
                "-".to_owned()
            } else {
                labels.join(",")
            },
        ]);
    }
    output::aligned(&rows)
}

fn node_json(node: &Node) -> Value {
    json!({
        "name": node.name,
        "epoch": node.epoch,
        "address": node.address,
        "labels": node.labels,
        "started_unix_ms": node.started_unix_ms,
        "seen_ms_ago": node.seen_ms_ago,
        "processes": node.processes,
        "running": node.running,
        "cpu_percent": node.cpu_percent,
        "this_node": node.this_node,
    })
}

/// `nodes forget NAME`: frees a gone node's name, through NATS.
pub(super) async fn forget(
    name: &str,
    config: Option<std::path::PathBuf>,
    cluster: super::ClusterArgs,
) -> Result<(), CliError> {
    let settings = crate::daemon::cluster_of(
        config.as_deref(),
        cluster.cluster,
        cluster.insecure_cluster,
        cluster.cluster_secret,
    )
    .map_err(|err| match err {
        crate::daemon::StartError::Config(err) => CliError::Config(err),
        other => CliError::Usage(other.to_string()),
    })?;
    match crate::cluster::forget(&settings, name).await {
        Ok(gone) => output::print(&format!(
            "forgot node {name} (epoch {}, serving at {}, silent for {:.1} s): it can start \
             again at once; that start of it, should it run on, finds itself declared lost \
             and stops\n",
            gone.epoch,
            gone.address,
            gone.silent.as_secs_f64()
        )),
        Err(err) => Err(CliError::Refused(err.to_string())),
    }
}
