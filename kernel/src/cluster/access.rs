//! The node's connection to NATS: signed in as `kernel.cluster` says
//! (credentials in the server URLs, a credentials file, an nkey seed, a
//! client certificate), over TLS when asked, and refused when a server
//! lets a node without credentials in and the network was not declared
//! trusted (`--insecure-cluster`).
//!
//! Anything that can publish on `hk.node.>` is trusted as a node (it may
//! spawn `exec` commands on every node), so a server open to all is open
//! to anyone who can reach it.

use async_nats::ConnectErrorKind;
use bytes::Bytes;

use super::{ClusterError, REQUEST_TIMEOUT};
use crate::config::ClusterSettings;
use crate::nats::{self, UrlCredentials};

/// What to set to give a node credentials, as the messages say it.
const HOW_TO_SIGN_IN: &str = "user:password@ or token@ in the server URLs, \
     kernel.cluster.creds_file, kernel.cluster.nkey_file, or a client certificate in \
     kernel.cluster.tls_cert and tls_key";

/// A connection to one of the servers `settings` lists, with JetStream on,
/// signed in as `settings` says.
pub(super) async fn connect(
    settings: &ClusterSettings,
) -> Result<async_nats::Client, ClusterError> {
    let servers = nats::shown_servers(&settings.servers);
    let unreachable = |reason: String| ClusterError::Connect {
        servers: servers.clone(),
        reason,
    };
    let (urls, options) = options(settings)?;
    let client = options
        .connect(urls.as_slice())
        .await
        .map_err(|err| unreachable(connect_failure(&err, settings.has_credentials())))?;
    if !settings.has_credentials() && !settings.insecure {
        let _ = client.drain().await;
        return Err(ClusterError::Unauthenticated { servers });
    }
    match client.request("$JS.API.INFO", Bytes::new()).await {
        Ok(_) => Ok(client),
        Err(err) if err.kind() == async_nats::RequestErrorKind::NoResponders => Err(unreachable(
            "JetStream is not enabled there (start nats-server with -js)".into(),
        )),
        Err(err) => Err(unreachable(format!("JetStream does not answer: {err}"))),
    }
}

/// Says at start that the node joins NATS without credentials, as it was
/// told it may (`insecure`).
pub(super) fn warn_if_insecure(settings: &ClusterSettings) {
    if settings.insecure && !settings.has_credentials() {
        tracing::warn!(
            node = %settings.node,
            servers = %nats::shown_servers(&settings.servers),
            "cluster: joining NATS without credentials (--insecure-cluster, \
             kernel.cluster.insecure): anyone who can reach these servers can run commands \
             as this kernel's user on every node"
        );
    }
}

/// The servers' URLs without their credentials, and the client's options:
/// its name, timeouts, event log, credentials and TLS. Every file is read
/// again here, as the config read it.
fn options(
    settings: &ClusterSettings,
) -> Result<(Vec<String>, async_nats::ConnectOptions), ClusterError> {
    let access = |field: &str, problem: String| ClusterError::Access {
        setting: format!("kernel.cluster.{field}"),
        problem,
    };
    let mut urls = Vec::with_capacity(settings.servers.len());
    for url in &settings.servers {
        let (bare, _) = nats::split_credentials(url)
            .map_err(|problem| access("servers", format!("{}: {problem}", nats::redacted(url))))?;
        urls.push(bare);
    }
    if let Some(issue) = settings.access_issues("kernel.cluster.servers").pop() {
        return Err(ClusterError::Access {
            setting: issue.location,
            problem: issue.message,
        });
    }
    let node = settings.node.clone();
    let mut options = async_nats::ConnectOptions::new()
        .name(format!("hivekernel node {node}"))
        .connection_timeout(REQUEST_TIMEOUT)
        .request_timeout(Some(REQUEST_TIMEOUT))
        .event_callback(move |event| {
            let node = node.clone();
            async move { log_event(&node, event) }
        });
    match nats::url_credentials(&settings.servers) {
        Ok(Some(UrlCredentials::UserPassword { user, password })) => {
            options = options.user_and_password(user, password);
        }
        Ok(Some(UrlCredentials::Token(token))) => options = options.token(token),
        Ok(None) => {}
        Err((_, problem)) => return Err(access("servers", problem)),
    }
    if let Some(path) = &settings.creds_file {
        let text = nats::read_creds(path).map_err(|problem| access("creds_file", problem))?;
        options = options
            .credentials(&text)
            .map_err(|err| access("creds_file", err.to_string()))?;
    }
    if let Some(path) = &settings.nkey_file {
        let seed = nats::read_nkey_seed(path).map_err(|problem| access("nkey_file", problem))?;
        options = options.nkey(seed);
    }
    let identity = match (&settings.tls_cert, &settings.tls_key) {
        (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
        (Some(_), None) => return Err(access("tls_key", "missing beside tls_cert".into())),
        (None, Some(_)) => return Err(access("tls_cert", "missing beside tls_key".into())),
        (None, None) => None,
    };
    if settings.tls_ca.is_some() || identity.is_some() {
        let tls = nats::client_tls(settings.tls_ca.as_deref(), identity)
            .map_err(|(field, err)| access(field, err.to_string()))?;
        options = options.tls_client_config(tls).require_tls(true);
    }
    Ok((urls, options))
}

/// Why connecting failed, with what to change when NATS refused the node.
fn connect_failure(err: &async_nats::ConnectError, signed_in: bool) -> String {
    match err.kind() {
        // The kind alone: the server's error only repeats it.
        kind @ (ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication)
            if signed_in =>
        {
            format!(
                "{kind}: NATS refused this node's credentials; check them ({HOW_TO_SIGN_IN}) \
                 against the server's authorization"
            )
        }
        kind @ (ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication) => {
            format!(
                "{kind}: the server requires credentials and this node has none; give them \
                 ({HOW_TO_SIGN_IN})"
            )
        }
        ConnectErrorKind::Tls => format!(
            "{err} (kernel.cluster.tls_ca names the CA of the servers' certificates; \
             tls_cert and tls_key the node's own)"
        ),
        _ => err.to_string(),
    }
}

/// The client's connection events in the kernel's log.
fn log_event(node: &str, event: async_nats::Event) {
    match event {
        async_nats::Event::Connected => tracing::info!(node, "cluster: connected to NATS"),
        async_nats::Event::Disconnected => {
            tracing::warn!(node, "cluster: disconnected from NATS; reconnecting");
        }
        other => tracing::debug!(node, event = %other, "cluster: NATS client event"),
    }
}

/// The refusal of a node without credentials: why, and what to set.
pub(super) fn unauthenticated(servers: &str) -> String {
    format!(
        "NATS at {servers} let this node in without credentials, so anyone who can reach \
         it can act as a node and run commands as this kernel's user on every node. Give the \
         node credentials ({HOW_TO_SIGN_IN}) and have nats-server require them; or, on a \
         network only trusted hosts can reach, pass --insecure-cluster (or set \
         kernel.cluster.insecure: true)"
    )
}
