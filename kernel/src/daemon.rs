//! `hivekernel start`: load the config, start the kernel and its agents,
//! serve gRPC, reload the config on SIGHUP (and `ReloadConfig`: `reload`),
//! and shut down gracefully on SIGINT or SIGTERM.

mod reload;
mod systemd;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hivekernel_agents::sandbox::Sandbox;
use hivekernel_agents::tool_agent::ToolAgentFactory;
use hivekernel_agents::tools::ToolRegistry;
use hivekernel_agents::{Pid, SpawnRequest};
use tokio::net::TcpListener;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::task::JoinHandle;

use crate::auth::{Authenticator, load_or_create_admin_token};
use crate::cluster::Cluster;
use crate::config::KernelSettings;
use crate::config::{AgentSpec, Config, ConfigError, ConfigIssue, ModelNames};
use crate::exec::{ExecRuntime, ExecSandbox};
use crate::grpc;
use crate::kernel::Restored;
use crate::kernel::{AgentRefused, Caller, Declared, Kernel};
use crate::llm::{ChosenProvider, choose_provider};
use crate::reload::{ConfigReload, Outcome, ReloadReport};
use crate::runtime::RuntimeRegistry;
use crate::store::{DB_FILE, Recovered, Store, Synchronous};
use crate::tls::{ServerTls, TRUST_FILE, TlsError, TlsFlags};
use reload::Reloader;

/// What `hivekernel start` was asked to do.
#[derive(Debug, Clone)]
pub struct StartOptions {
    /// The startup config file.
    pub config: PathBuf,
    /// Overrides `kernel.listen`.
    pub listen: Option<SocketAddr>,
    /// Overrides `kernel.data_dir` (relative to the working directory).
    pub data_dir: Option<PathBuf>,
    /// Allows listening on a non-loopback address without TLS.
    pub insecure_remote: bool,
    /// TLS files given on the command line; each replaces the config's.
    pub tls: TlsFlags,
    /// Overrides `kernel.metrics.listen` (and turns metrics on).
    pub metrics_listen: Option<SocketAddr>,
    /// `--model`: every model sent as this one.
    pub model: Option<String>,
    /// `--dashboard[=ADDR]` or `--no-dashboard`: on or off; an address
    /// given replaces `kernel.dashboard.listen`.
    pub dashboard: Option<crate::config::DashboardSettings>,
    /// `--cluster`: the NATS servers (comma-separated), replacing
    /// `kernel.cluster.servers` (and making the kernel a node).
    pub cluster: Option<String>,
    /// `--node`: this node's name, replacing `kernel.cluster.node`.
    pub node: Option<String>,
    /// `--insecure-cluster`: join NATS servers that let the node in
    /// without credentials (`kernel.cluster.insecure`).
    pub insecure_cluster: bool,
    /// `--cluster-secret`: the cluster secret file, replacing
    /// `kernel.cluster.secret_file`.
    pub cluster_secret: Option<std::path::PathBuf>,
}

/// Why the kernel did not start or did not stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The config is invalid; nothing was started.
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// The command line asks for something refused.
    #[error("{0}")]
    Usage(String),
    /// A TLS file is missing or unusable; nothing was started.
    #[error("{0}")]
    Tls(#[from] TlsError),
    /// The model provider cannot be set up (a missing key, a bad endpoint).
    #[error("model provider: {0}")]
    Provider(String),
    /// The trace exporter cannot be set up (`kernel.otel`, `OTEL_*`).
    #[error("traces: {0}")]
    Traces(String),
    /// A file in the data directory could not be read or written.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The listen address could not be bound.
    #[error(
        "cannot listen on {addr}: {source} (is another kernel running? pass --{flag} to pick another address)"
    )]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The flag that picks another (`listen`, `metrics-listen`).
        flag: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// A config agent was refused by the kernel.
    #[error("{0}")]
    Spawn(#[from] AgentRefused),
    /// The store could not be opened.
    #[error("{0}")]
    Store(String),
    /// The gRPC server failed.
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
    /// The gRPC server stopped without being asked to.
    #[error("gRPC server stopped unexpectedly")]
    ServerStopped,
    /// Joining the cluster failed (`--cluster`, `kernel.cluster`).
    #[error("cluster: {0}")]
    Cluster(#[from] crate::cluster::ClusterError),
    /// Another node declared this one lost: its processes are not its own
    /// any more. It stopped; started again, it is a new node.
    #[error("fenced: {0}")]
    Fenced(String),
}

impl StartError {
    /// 2 for config and usage errors, 1 for everything else.
    pub fn exit_code(&self) -> i32 {
        match self {
            StartError::Config(_)
            | StartError::Usage(_)
            | StartError::Tls(_)
            | StartError::Provider(_)
            | StartError::Traces(_) => 2,
            StartError::Fenced(_) => 3,
            _ => 1,
        }
    }
}

/// Runs the kernel in the foreground until SIGINT or SIGTERM; SIGHUP reloads the config.
pub async fn run(options: StartOptions) -> Result<(), StartError> {
    let mut signals = Signals::install();
    crate::grpc::raise_open_file_limit();
    let mut config = Config::load(&options.config, &RuntimeRegistry::builtin().known())?;
    config.serve_all(options.model.as_deref());
    let chosen = choose_provider(&config.llm, &config.kernel.models, |name| {
        std::env::var(name).ok()
    })
    .map_err(StartError::Provider)?;
    let settings = settings(&config, &options)?;
    // `--data-dir` may have moved what commands must not reach.
    config.tools.shell.keep_out = settings.keep_out();
    check_grants(&config, &settings)?;
    let tls = load_tls(&settings, options.insecure_remote)?;
    let data_dir = settings.data_dir.clone();
    check_data_dir(&data_dir)?;
    let auth = Authenticator::new(admin_token(&data_dir)?);
    let (listener, addr) = bind(settings.listen, "listen").await?;
    let metrics_listener = match &settings.metrics {
        Some(metrics) => Some(bind(metrics.listen, "metrics-listen").await?),
        None => None,
    };
    let dashboard_listener = bind_dashboard(&settings).await?;
    let _lock = lock_data_dir(&data_dir)?;
    let trust_file = write_trust_file(&data_dir, tls.as_ref())?;
    let (store, recovered) = open_store(&data_dir, settings.synchronous).await?;
    // Probed before joining: what can refuse the start now does so before
    // the cluster sees this node.
    let sandbox = exec_sandbox(&settings).await?;
    let cluster = match &settings.cluster {
        Some(cluster) => Some(
            Cluster::join(
                cluster.clone(),
                client_url(addr, tls.is_some()),
                recovered.next(crate::store::Counter::Pid),
                settings.event_log_limit,
            )
            .await?,
        ),
        None => None,
    };
    // A token another node issued to its process is honoured here too.
    if let Some(cluster) = &cluster {
        let weak = Arc::downgrade(cluster);
        auth.honour_elsewhere(Arc::new(move |pid| {
            let cluster = weak.upgrade()?;
            let listings = cluster.listings();
            let listing = listings.get(pid).filter(|listing| !listing.exited)?;
            listing.token.clone()
        }));
    }
    let exec = ExecRuntime::new(auth.clone(), addr)
        .with_tls_ca(trust_file)
        .with_sandbox(sandbox)
        .with_log_rotation(settings.exec.log);
    let started = start_kernel(
        &config,
        settings.clone(),
        chosen,
        (store, recovered),
        exec,
        cluster.clone(),
    )
    .await;
    let (kernel, agents) = match started {
        Ok(started) => started,
        Err(err) => {
            if let Some(cluster) = &cluster {
                cluster.leave().await;
            }
            return Err(err);
        }
    };
    let reloader = Arc::new(Reloader::new(
        kernel.clone(),
        options,
        config,
        settings,
        agents,
    ));
    let mut published = match publish_addr(&data_dir, addr, tls.as_ref()) {
        Ok(file) => vec![file],
        Err(err) => {
            kernel.shutdown().await;
            if let Some(cluster) = kernel.cluster() {
                cluster.leave().await;
            }
            return Err(err);
        }
    };
    if let Some((listener, addr)) = metrics_listener {
        serve_metrics(&kernel, listener, addr);
    }
    if let Some((listener, addr)) = dashboard_listener {
        let options = crate::dashboard::Options {
            kernel: kernel.clone(),
            auth: auth.clone(),
            reload: Some(reloader.clone()),
            addr,
            tls: tls.as_ref().map(ServerTls::http_config),
        };
        published.extend(serve_dashboard(options, listener, &data_dir));
    }
    let server = serve(&kernel, listener, auth, tls, reloader.clone());
    systemd::notify(&format!(
        "READY=1\nSTATUS=serving on {addr}\nMAINPID={}",
        std::process::id()
    ));
    stop_on_signal(kernel, server, &mut signals, &reloader, &published).await
}

/// What `start` would refuse in this config that the config alone cannot
/// say, checked as `start` checks it (without its flags): the model
/// provider (reads the environment: the key variable and
/// `HIVEKERNEL_LLM_BASE_URL`), the TLS files (reads them) and a plain-text
/// listen address that is not loopback, and the `exec` sandbox when asked
/// for (probes this host). Each problem with the setting it concerns.
pub async fn environment_issues(config: &Config) -> Vec<ConfigIssue> {
    let mut issues = Vec::new();
    if let Err(why) = choose_provider(&config.llm, &config.kernel.models, |name| {
        std::env::var(name).ok()
    }) {
        issues.push(ConfigIssue {
            location: "llm".into(),
            message: format!("{why} (read from this environment, as start would)"),
        });
    }
    match load_tls(&config.kernel, false) {
        Err(StartError::Tls(err)) => issues.push(ConfigIssue {
            location: "kernel.tls".into(),
            message: err.to_string(),
        }),
        Err(err) => issues.push(ConfigIssue {
            location: "kernel.listen".into(),
            message: err.to_string(),
        }),
        Ok(_) => {}
    }
    if let Err(err) = exec_sandbox(&config.kernel).await {
        issues.push(ConfigIssue {
            location: "kernel.exec.sandbox".into(),
            message: err.to_string(),
        });
    }
    if let Some(cluster) = &config.kernel.cluster
        && cluster.node.is_empty()
        && let Err(why) = crate::config::host_name()
    {
        issues.push(ConfigIssue {
            location: "kernel.cluster.node".into(),
            message: format!("is not given, and {why} (give it here, or --node at start)"),
        });
    }
    if let Some(cluster) = &config.kernel.cluster
        && let Err(err) = Cluster::probe(cluster).await
    {
        use crate::cluster::ClusterError;
        let (location, message) = match err {
            ClusterError::Access { setting, problem } => (setting, problem),
            ClusterError::Unauthenticated { .. } => ("kernel.cluster".to_owned(), err.to_string()),
            err => ("kernel.cluster.servers".to_owned(), err.to_string()),
        };
        issues.push(ConfigIssue {
            location,
            message: format!("{message} (tried from this machine, as start would)"),
        });
    }
    issues
}

/// The `exec` sandbox, when `kernel.exec.sandbox` asks for one: probed
/// here, and refused where the host cannot give it (the config promises a
/// confinement it would not get). `shell_exec` probes on its first call.
async fn exec_sandbox(settings: &KernelSettings) -> Result<Option<ExecSandbox>, StartError> {
    if !settings.exec.sandbox {
        return Ok(None);
    }
    let sandbox = Sandbox::this_executable();
    let shortfall = match sandbox.probe().await {
        Ok(support) => {
            tracing::info!(sandbox = %support, "exec agents run in the sandbox");
            support.shortfall().map(str::to_owned)
        }
        Err(problem) => Some(format!("the sandbox cannot be probed: {problem}")),
    };
    if let Some(why) = shortfall {
        return Err(StartError::Usage(format!(
            "kernel.exec.sandbox is true, but exec agents cannot be confined here: {why}; turn \
             it off to run them unconfined"
        )));
    }
    Ok(Some(ExecSandbox {
        sandbox,
        grants: settings.exec.grants.clone(),
        keep_out: settings.keep_out(),
    }))
}

/// Refuses sandbox grants inside the data directory actually used (the
/// config check saw the config's; `--data-dir` may name another).
fn check_grants(config: &Config, settings: &KernelSettings) -> Result<(), StartError> {
    let mut issues = Vec::new();
    crate::config::check_grants(
        &config.tools.shell.grants,
        "tool_agent.shell",
        &settings.data_dir,
        &mut issues,
    );
    crate::config::check_grants(
        &settings.exec.grants,
        "kernel.exec",
        &settings.data_dir,
        &mut issues,
    );
    match issues.into_iter().next() {
        Some(issue) => Err(StartError::Usage(format!(
            "{}: {}",
            issue.location, issue.message
        ))),
        None => Ok(()),
    }
}

/// The config's kernel settings with the command line's flags over them.
fn settings(config: &Config, options: &StartOptions) -> Result<KernelSettings, StartError> {
    let mut settings = config.kernel.clone();
    if let Some(listen) = options.listen {
        settings.listen = listen;
    }
    if let Some(dir) = &options.data_dir {
        settings.data_dir = dir.clone();
    }
    if let Some(listen) = options.metrics_listen {
        settings.metrics = Some(crate::config::MetricsSettings { listen });
    }
    if let Some(dashboard) = &options.dashboard {
        settings.dashboard.enabled = dashboard.enabled;
        settings.dashboard.listen = dashboard.listen.or(settings.dashboard.listen);
        if dashboard.enabled == Some(false) {
            settings.dashboard.listen = None;
        }
    }
    settings.tls = options
        .tls
        .clone()
        .over(settings.tls)
        .map_err(StartError::Usage)?;
    settings.cluster = cluster_settings(settings.cluster.take(), options)?;
    Ok(settings)
}

/// The cluster a command that is no node reaches (`nodes forget`): the
/// `kernel.cluster` of `config` when given, with the flags over it, checked
/// as `start` checks it.
pub fn cluster_of(
    config: Option<&std::path::Path>,
    servers: Option<String>,
    insecure_cluster: bool,
    cluster_secret: Option<PathBuf>,
) -> Result<crate::config::ClusterSettings, StartError> {
    let from_config = match config {
        Some(path) => Config::load(path, &RuntimeRegistry::builtin().known())?
            .kernel
            .cluster
            .clone(),
        None => None,
    };
    if servers.is_none() && from_config.is_none() {
        return Err(StartError::Usage(match config {
            Some(path) => format!(
                "{} has no kernel.cluster: give --cluster nats://HOST:PORT",
                path.display()
            ),
            None => "no cluster to reach: give --cluster nats://HOST:PORT, or --config FILE \
                     with kernel.cluster"
                .to_owned(),
        }));
    }
    let options = StartOptions {
        config: config.map(PathBuf::from).unwrap_or_default(),
        listen: None,
        data_dir: None,
        insecure_remote: false,
        tls: TlsFlags::default(),
        metrics_listen: None,
        model: None,
        dashboard: None,
        cluster: servers,
        // What it writes, it signs as the operator, not as a node.
        node: Some(crate::cluster::FORGOTTEN_BY.to_owned()),
        insecure_cluster,
        cluster_secret,
    };
    cluster_settings(from_config, &options)?
        .ok_or_else(|| StartError::Usage("no cluster to reach".to_owned()))
}

/// `kernel.cluster` with `--cluster` and `--node` over it.
fn cluster_settings(
    config: Option<crate::config::ClusterSettings>,
    options: &StartOptions,
) -> Result<Option<crate::config::ClusterSettings>, StartError> {
    use crate::config::{ClusterSettings, host_name, node_name_problem, parse_servers};
    let mut cluster = match (&options.cluster, config) {
        (Some(list), config) => {
            let servers =
                parse_servers(list).map_err(|why| StartError::Usage(format!("--cluster {why}")))?;
            let mut settings =
                config.unwrap_or_else(|| ClusterSettings::new(Vec::new(), String::new()));
            settings.servers = servers;
            settings
        }
        (None, Some(config)) => config,
        (None, None)
            if options.node.is_some()
                || options.insecure_cluster
                || options.cluster_secret.is_some() =>
        {
            let flag = if options.node.is_some() {
                "--node names this kernel's node"
            } else if options.insecure_cluster {
                "--insecure-cluster is about this kernel's NATS servers"
            } else {
                "--cluster-secret is what this kernel's node signs with"
            };
            return Err(StartError::Usage(format!(
                "{flag} in a cluster: give --cluster nats://HOST:PORT (or kernel.cluster) too"
            )));
        }
        (None, None) => return Ok(None),
    };
    if let Some(node) = &options.node {
        cluster.node = node.clone();
    }
    cluster.insecure |= options.insecure_cluster;
    if let Some(file) = &options.cluster_secret {
        crate::cluster::read_secret(file)
            .map_err(|why| StartError::Usage(format!("--cluster-secret: {why}")))?;
        cluster.secret_file = Some(file.clone());
    }
    // `--cluster` may bring credentials the config's files then double.
    let servers_at = match options.cluster {
        Some(_) => "--cluster",
        None => "kernel.cluster.servers",
    };
    if let Some(issue) = cluster.access_issues(servers_at).pop() {
        return Err(StartError::Usage(issue.to_string()));
    }
    if cluster.node.is_empty() {
        cluster.node = host_name().map_err(|why| {
            StartError::Usage(format!(
                "no node name given, and {why}: give one with --node NAME"
            ))
        })?;
    }
    if let Some(problem) = node_name_problem(&cluster.node) {
        return Err(StartError::Usage(format!(
            "node name {problem} (give one with --node NAME)"
        )));
    }
    Ok(Some(cluster))
}

/// The TLS files, loaded and checked; plain text on a non-loopback address
/// is refused unless `insecure_remote`.
fn load_tls(
    settings: &KernelSettings,
    insecure_remote: bool,
) -> Result<Option<ServerTls>, StartError> {
    let tls = settings.tls.as_ref().map(ServerTls::load).transpose()?;
    if !settings.listen.ip().is_loopback() && tls.is_none() {
        if !insecure_remote {
            return Err(StartError::Usage(format!(
                "refusing to listen on {}, which is not a loopback address, in plain text: anyone \
                 who can reach it may read the tokens and try the control plane; pass --tls-cert \
                 and --tls-key to serve TLS, or --insecure-remote to allow plain text",
                settings.listen
            )));
        }
        tracing::warn!(listen = %settings.listen, "listening on a non-loopback address in plain text (--insecure-remote)");
    }
    Ok(tls)
}

/// Refuses a data directory path that names something else (a usage
/// error, exit 2); a missing one is created with the admin token.
fn check_data_dir(data_dir: &Path) -> Result<(), StartError> {
    match std::fs::metadata(data_dir) {
        Ok(meta) if !meta.is_dir() => Err(StartError::Usage(format!(
            "the data directory {} is not a directory: point kernel.data_dir or --data-dir at \
             a directory (a missing one is created)",
            data_dir.display()
        ))),
        _ => Ok(()),
    }
}

/// The admin token in `data_dir`, made on first start.
fn admin_token(data_dir: &Path) -> Result<String, StartError> {
    load_or_create_admin_token(data_dir).map_err(|source| StartError::Io {
        what: "cannot prepare the admin token in",
        path: data_dir.to_owned(),
        source,
    })
}

/// The control plane's listener and the address it got.
async fn bind(
    listen: SocketAddr,
    flag: &'static str,
) -> Result<(TcpListener, SocketAddr), StartError> {
    let bind_error = |source| StartError::Bind {
        addr: listen,
        flag,
        source,
    };
    let listener = TcpListener::bind(listen).await.map_err(bind_error)?;
    let addr = listener.local_addr().map_err(bind_error)?;
    Ok((listener, addr))
}

/// The kernel with the config's runtimes, agents and templates, on the
/// store, and the agents it runs with their PIDs, in config order (on a
/// node of a cluster, those no other node runs); logs what starting it did.
async fn start_kernel(
    config: &Config,
    settings: KernelSettings,
    chosen: ChosenProvider,
    (store, recovered): (Store, Recovered),
    exec: ExecRuntime,
    cluster: Option<Arc<Cluster>>,
) -> Result<(Kernel, Vec<(AgentSpec, Pid)>), StartError> {
    let mut agent_settings = config.agent.clone();
    agent_settings.provider = chosen.provider.name().to_owned();
    if let Some(openai) = &chosen.openai {
        crate::llm::check_served(openai, config, &mut agent_settings)
            .await
            .map_err(StartError::Provider)?;
    }
    let registry = RuntimeRegistry::with_tool_agent(ToolAgentFactory::new(
        ToolRegistry::configured(&config.tools),
        agent_settings,
    ));
    tracing::info!(provider = %chosen.description, "model provider");
    let traces = match &settings.otel {
        Some(otel) => {
            let traces = crate::otel::Traces::start(otel).map_err(StartError::Traces)?;
            tracing::info!(
                endpoint = %otel.endpoint.as_deref().unwrap_or("from OTEL_EXPORTER_OTLP_*"),
                protocol = otel.protocol.as_str(),
                capture_content = otel.capture_content,
                "exporting traces over OTLP"
            );
            Some(Arc::new(traces))
        }
        None => None,
    };
    let mut builder = Kernel::builder(settings);
    if let Some(traces) = traces {
        builder = builder.traces(traces);
    }
    if let Some(cluster) = cluster {
        builder = builder.cluster(cluster);
    }
    let started = builder
        .runtimes(registry)
        .llm(chosen.provider)
        .store(store, recovered)
        .exec(exec)
        .cron_templates(
            config
                .templates
                .iter()
                .map(|t| (t.name.clone(), spawn_request(t)))
                .collect(),
        )
        .agents(config.agents.iter().map(declared).collect())
        .mcp_servers(config.mcp.clone())
        .start()
        .await?;
    let kernel = started.kernel;
    let here: Vec<(AgentSpec, Pid)> = config
        .agents
        .iter()
        .filter(|agent| !started.elsewhere.contains_key(&agent.name))
        .cloned()
        .zip(started.agents.iter().copied())
        .collect();
    log_agents(&kernel, &config.kernel.models, &here).await;
    for (agent, node) in &started.elsewhere {
        tracing::info!(name = %agent, %node, "agent runs on another node");
    }
    if started.restored != Restored::default() {
        let restored = &started.restored;
        tracing::info!(
            ended = restored.ended,
            requeued = restored.requeued,
            dropped = restored.dropped,
            failed_requests = restored.failed_requests,
            resumed_turns = restored.resumed,
            withdrawn_requests = restored.withdrawn,
            "restored state from the store"
        );
    }
    for problem in &started.cron_problems {
        tracing::warn!(%problem, "cron entry not loaded");
    }
    Ok((kernel, here))
}

/// Writes `<data_dir>/kernel.addr`, where clients find the kernel, and says
/// where it listens; returns the file, removed again at shutdown.
fn publish_addr(
    data_dir: &Path,
    addr: SocketAddr,
    tls: Option<&ServerTls>,
) -> Result<PathBuf, StartError> {
    let addr_file = data_dir.join("kernel.addr");
    let url = client_url(addr, tls.is_some());
    write_addr_file(&addr_file, &url)?;
    let security = match tls {
        None => "plain text",
        Some(tls) if tls.is_mutual() => "TLS, client certificates required",
        Some(_) => "TLS",
    };
    tracing::info!(
        data_dir = %data_dir.display(),
        admin_token = %crate::auth::admin_token_path(data_dir).display(),
        security,
        "listening on {addr} ({url})"
    );
    Ok(addr_file)
}

/// The gRPC server, owned by the kernel's tracker, stopping with the kernel.
fn serve(
    kernel: &Kernel,
    listener: TcpListener,
    auth: Authenticator,
    tls: Option<ServerTls>,
    reloader: Arc<Reloader>,
) -> JoinHandle<Result<(), tonic::transport::Error>> {
    let token_cancelled = kernel.shutdown_token();
    kernel.tracker().spawn(grpc::serve_with_tls(
        kernel.clone(),
        listener,
        auth,
        tls.map(|tls| tls.config()),
        Some(reloader),
        async move { token_cancelled.cancelled().await },
    ))
}

/// The metrics listener, owned by the kernel's tracker; it answers until
/// the processes have stopped, `/readyz` saying 503 meanwhile.
fn serve_metrics(kernel: &Kernel, listener: TcpListener, addr: SocketAddr) {
    if !addr.ip().is_loopback() {
        tracing::warn!(%addr, "metrics listener on a non-loopback address: anyone who reaches it reads the metrics");
    }
    tracing::info!("metrics on http://{addr}/metrics (also /healthz, /readyz)");
    let stopped = kernel.shutdown_token();
    kernel.tracker().spawn({
        let kernel = kernel.clone();
        async move {
            let served = crate::http::serve(kernel, listener, async move {
                stopped.cancelled().await;
            });
            if let Err(err) = served.await {
                tracing::error!(error = %err, "the metrics listener failed");
            }
        }
    });
}

/// The dashboard's listener, when it is on: where `kernel.dashboard` says,
/// else beside the control plane (see [`crate::config::DashboardSettings`]).
/// An address it was not asked for that is taken only warns.
async fn bind_dashboard(
    settings: &KernelSettings,
) -> Result<Option<(TcpListener, SocketAddr)>, StartError> {
    let Some((listen, asked)) = settings.dashboard.address(settings.listen) else {
        return Ok(None);
    };
    match bind(listen, "dashboard=ADDR").await {
        Ok(bound) => Ok(Some(bound)),
        Err(err) if asked => Err(err),
        Err(err) => {
            tracing::warn!(
                "the dashboard is off: {err} (or set kernel.dashboard.listen, or --no-dashboard)"
            );
            Ok(None)
        }
    }
}

/// The dashboard, owned by the kernel's tracker; its URL is said and
/// written to `<data_dir>/dashboard.url`, which is returned (removed again
/// at shutdown).
fn serve_dashboard(
    options: crate::dashboard::Options,
    listener: TcpListener,
    data_dir: &Path,
) -> Option<PathBuf> {
    let addr = options.addr;
    if !addr.ip().is_loopback() && options.tls.is_none() {
        tracing::warn!(%addr, "dashboard on a non-loopback address without TLS: its session cookie and tokens cross the network in plain text");
    }
    let scheme = if options.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let url = format!("{scheme}://{addr}/");
    tracing::info!(
        admin_token = %crate::auth::admin_token_path(data_dir).display(),
        "dashboard on {url} (log in with a token)"
    );
    let kernel = options.kernel.clone();
    let stopped = kernel.shutdown_token();
    kernel.tracker().spawn(async move {
        let served = crate::dashboard::serve(options, listener, async move {
            stopped.cancelled().await;
        });
        if let Err(err) = served.await {
            tracing::error!(error = %err, "the dashboard failed");
        }
    });
    let file = data_dir.join("dashboard.url");
    match write_addr_file(&file, &url) {
        Ok(()) => Some(file),
        Err(err) => {
            tracing::warn!(error = %err, "the dashboard's URL file");
            None
        }
    }
}

/// Serves until SIGINT or SIGTERM (or until the server fails, which is as
/// fatal as a signal), reloading the config on each SIGHUP, then stops the
/// kernel, leaves first.
async fn stop_on_signal(
    kernel: Kernel,
    mut server: JoinHandle<Result<(), tonic::transport::Error>>,
    signals: &mut Signals,
    reloader: &Arc<Reloader>,
    published: &[PathBuf],
) -> Result<(), StartError> {
    let mut fenced = kernel.cluster().map(|cluster| cluster.fenced());
    let mut fence = None;
    let early = loop {
        tokio::select! {
            signal = signals.recv() => match signal {
                Received::Stop => break None,
                Received::Reload => reload_on_signal(&kernel, reloader),
            },
            served = &mut server => break Some(served),
            why = fenced_now(fenced.as_mut()) => {
                fence = Some(why);
                break None;
            }
        }
    };
    let unexpected = early.is_some();
    systemd::notify("STOPPING=1\nSTATUS=stopping processes, leaves first");
    tracing::info!("shutting down: stopping processes, leaves first");
    kernel.shutdown().await;
    if let Some(cluster) = kernel.cluster() {
        cluster.leave().await;
    }
    for file in published {
        let _ = std::fs::remove_file(file);
    }
    let served = match early {
        Some(served) => served,
        None => server.await,
    };
    match served {
        Ok(Ok(())) if !unexpected => {}
        Ok(Ok(())) => return Err(StartError::ServerStopped),
        Ok(Err(err)) => return Err(err.into()),
        Err(join) => {
            tracing::error!(error = %join, "gRPC server task failed");
            return Err(StartError::ServerStopped);
        }
    }
    if let Some(why) = fence {
        return Err(StartError::Fenced(why));
    }
    tracing::info!("kernel stopped");
    Ok(())
}

/// Once the cluster fences this node: why. Never, without a cluster.
async fn fenced_now(fenced: Option<&mut tokio::sync::watch::Receiver<Option<String>>>) -> String {
    let Some(fenced) = fenced else {
        return std::future::pending().await;
    };
    match fenced.wait_for(Option::is_some).await {
        Ok(why) => why.clone().unwrap_or_default(),
        // The cluster is gone (the kernel is stopping anyway).
        Err(_) => std::future::pending().await,
    }
}

/// Takes `<data_dir>/kernel.lock` for as long as the returned file lives:
/// two kernels on one store would each believe they own it.
pub(crate) fn lock_data_dir(data_dir: &Path) -> Result<std::fs::File, StartError> {
    let path = data_dir.join("kernel.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| StartError::Io {
            what: "cannot open",
            path: path.clone(),
            source,
        })?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(StartError::Usage(format!(
            "data directory {} is in use by another kernel (it holds {}); stop it or pass \
             another --data-dir",
            data_dir.display(),
            path.display()
        ))),
        Err(std::fs::TryLockError::Error(source)) => Err(StartError::Io {
            what: "cannot lock",
            path,
            source,
        }),
    }
}

/// Opens `<data_dir>/hivekernel.db` off the async threads.
async fn open_store(
    data_dir: &Path,
    synchronous: Synchronous,
) -> Result<(Store, Recovered), StartError> {
    let path = data_dir.join(DB_FILE);
    let opened = tokio::task::spawn_blocking(move || Store::open(&path, synchronous))
        .await
        .map_err(|err| StartError::Store(err.to_string()))?;
    opened.map_err(|err| StartError::Store(err.to_string()))
}

/// Says which agents started, and for `tool_agent`s which provider they talk to.
async fn log_agents(kernel: &Kernel, names: &ModelNames, agents: &[(AgentSpec, Pid)]) {
    for (agent, pid) in agents {
        let (runtime, model) = kernel
            .get_process(Caller::Admin, *pid)
            .await
            .map(|info| (info.runtime, info.model))
            .unwrap_or_default();
        if runtime == crate::exec::EXEC_RUNTIME {
            tracing::info!(%pid, name = %agent.name, role = %agent.role, %runtime, "agent started");
            continue;
        }
        // Only the tool_agent talks to a model; say which, per agent.
        let provider = match (runtime.as_str(), kernel.provider_name()) {
            (crate::config::TOOL_AGENT, Some(provider)) => provider,
            _ => "none",
        };
        let served = names.served(&model);
        tracing::info!(%pid, name = %agent.name, role = %agent.role, %runtime, %provider, %model, %served, "agent started");
    }
}

/// A config agent as the builder takes it: its spawn request and its cron entries.
pub fn declared(agent: &AgentSpec) -> Declared {
    Declared {
        request: spawn_request(agent),
        cron: agent.cron.clone(),
        placement: crate::kernel::Placement {
            node: agent.node.clone(),
            labels: agent.node_labels.clone(),
        },
    }
}

/// The spawn request for a config-declared agent (a child of PID 1).
pub fn spawn_request(agent: &AgentSpec) -> SpawnRequest {
    let mut request = SpawnRequest::new(hivekernel_agents::Pid::KERNEL, agent.name.clone());
    request.role = agent.role;
    request.tier = Some(agent.tier);
    request.model = agent.model.clone();
    request.runtime = agent.runtime.clone();
    request.system_prompt = agent.system_prompt.clone();
    request.tools = agent.tools.clone();
    request.limits = agent.limits;
    request.metadata = agent.metadata.clone();
    request.workspace = agent.workspace.clone();
    request.restart = agent.restart;
    request.strategy = agent.strategy;
    request.exec = agent.exec.clone();
    request.approval = agent.approval.clone();
    request.skills = agent.skills.clone();
    request
}

/// The URL local clients use: `https` with TLS, and loopback for an
/// unspecified address (a certificate never names 0.0.0.0).
fn client_url(mut addr: SocketAddr, tls: bool) -> String {
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let scheme = if tls { "https" } else { "http" };
    format!("{scheme}://{addr}")
}

fn write_addr_file(path: &Path, url: &str) -> Result<(), StartError> {
    std::fs::write(path, format!("{url}\n")).map_err(|source| StartError::Io {
        what: "cannot write",
        path: path.to_owned(),
        source,
    })
}

/// Writes `<data_dir>/tls-ca.pem`, what local clients and exec agents trust
/// for this kernel, and returns its absolute path; without TLS, removes a
/// stale one so nothing trusts a kernel that is gone.
fn write_trust_file(
    data_dir: &Path,
    tls: Option<&ServerTls>,
) -> Result<Option<PathBuf>, StartError> {
    let path = data_dir.join(TRUST_FILE);
    let io = |what, source| StartError::Io {
        what,
        path: path.clone(),
        source,
    };
    let Some(tls) = tls else {
        return match std::fs::remove_file(&path) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => Err(io("cannot remove", err)),
            _ => Ok(None),
        };
    };
    std::fs::write(&path, tls.trust_pem()).map_err(|err| io("cannot write", err))?;
    // Exec agents may run in another directory.
    let absolute = std::path::absolute(&path).map_err(|err| io("cannot resolve", err))?;
    Ok(Some(absolute))
}

/// SIGINT and SIGTERM, listened for from the moment `start` begins: one
/// that arrives while the kernel is still starting (or just after
/// `kernel.addr` appears) stops it cleanly once started, instead of killing
/// it with the signal's default action. SIGHUP too, which asks for a
/// reload (one that came during start is acted on once started).
struct Signals {
    term: Option<Signal>,
    int: Option<Signal>,
    hup: Option<Signal>,
}

/// What a signal asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Received {
    /// SIGINT or SIGTERM.
    Stop,
    /// SIGHUP.
    Reload,
}

impl Signals {
    fn install() -> Self {
        let listen = |kind: SignalKind, name: &str| match signal(kind) {
            Ok(signal) => Some(signal),
            Err(err) => {
                tracing::error!(error = %err, "cannot listen for {name}");
                None
            }
        };
        Signals {
            term: listen(SignalKind::terminate(), "SIGTERM"),
            int: listen(SignalKind::interrupt(), "SIGINT"),
            hup: listen(SignalKind::hangup(), "SIGHUP"),
        }
    }

    /// Resolves on the next SIGINT, SIGTERM or SIGHUP.
    async fn recv(&mut self) -> Received {
        async fn next(signal: &mut Option<Signal>) {
            match signal {
                Some(signal) => {
                    signal.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            () = next(&mut self.term) => Received::Stop,
            () = next(&mut self.int) => Received::Stop,
            () = next(&mut self.hup) => Received::Reload,
        }
    }
}

/// Reloads the config on a task the kernel owns (serving and the signals
/// go on meanwhile; reloads queue behind each other), and logs the result.
fn reload_on_signal(kernel: &Kernel, reloader: &Arc<Reloader>) {
    tracing::info!("SIGHUP: reloading the config");
    let reloader = reloader.clone();
    kernel.tracker().spawn(async move {
        match reloader.reload(Caller::Admin).await {
            Ok(report) => log_reload(&report),
            Err(err) => tracing::error!(error = %err, "config reload failed"),
        }
    });
}

/// Logs what a reload did: each issue of a refused config, or each agent
/// and cron entry and the settings that need a restart.
fn log_reload(report: &ReloadReport) {
    let config = report.config.display();
    if !report.applied() {
        for issue in &report.issues {
            tracing::error!(%config, %issue, "config reload refused: nothing changed");
        }
        return;
    }
    for change in &report.agents {
        let pid = change.pid.map_or_else(String::new, |pid| pid.to_string());
        let (name, outcome, detail) = (&change.name, change.outcome, &change.detail);
        if outcome == Outcome::Failed {
            tracing::error!(agent = %name, %pid, %outcome, %detail, "config reload");
        } else {
            tracing::info!(agent = %name, %pid, %outcome, %detail, "config reload");
        }
    }
    for change in &report.cron {
        let (name, outcome, detail) = (&change.name, change.outcome, &change.detail);
        tracing::info!(cron = %name, %outcome, %detail, "config reload");
    }
    for change in &report.roles {
        let (name, outcome, detail) = (&change.name, change.outcome, &change.detail);
        tracing::info!(role = %name, %outcome, %detail, "config reload");
    }
    if !report.needs_restart.is_empty() {
        tracing::warn!(
            settings = %report.needs_restart.join(", "),
            "config reload: these settings changed and take effect only when the kernel restarts"
        );
    }
    tracing::info!(%config, "config reloaded");
}
