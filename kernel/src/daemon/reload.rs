//! `hivekernel config reload`, `ReloadConfig` and SIGHUP: read the config
//! file the kernel was started with again, check it as `start` does, and
//! apply what a running kernel can take: its agents and their cron entries.
//!
//! Everything else (the `kernel` section, `roles`, `llm`, `tool_agent`,
//! `templates`) is read once at start, shared without a lock on the hot
//! paths; a reload reports each such setting that differs as needing a
//! restart, and the kernel keeps running with what it started with.

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use hivekernel_agents::{CronSpec, Pid, ProcessState, Role};

use super::{StartError, StartOptions, declared, load_tls, settings, spawn_request};
use crate::caller::Scope;
use crate::config::{AgentSpec, Config, ConfigIssue, KernelSettings, RoleSettings};
use crate::error::KernelError;
use crate::kernel::{Caller, Kernel, Placed, cron};
use crate::llm::choose_provider;
use crate::reload::{Change, ConfigReload, Outcome, ReloadReport};
use crate::runtime::RuntimeRegistry;

/// Reloads the config of one kernel; one reload at a time.
#[derive(Debug)]
pub(crate) struct Reloader {
    kernel: Kernel,
    options: StartOptions,
    running: tokio::sync::Mutex<Running>,
}

/// What the kernel runs with.
#[derive(Debug)]
struct Running {
    /// The config it started with: the settings a reload cannot change.
    started: Config,
    /// Its kernel settings, the command line's flags included.
    settings: KernelSettings,
    /// Each config agent as it runs now, and its PID, in config order.
    agents: Vec<(AgentSpec, Pid)>,
}

impl Reloader {
    /// A reloader for `kernel`, started by `options` from `config` (flags
    /// applied into `settings`), running `agents` (in config order; on a
    /// node of a cluster, those no other node runs).
    pub(crate) fn new(
        kernel: Kernel,
        options: StartOptions,
        config: Config,
        settings: KernelSettings,
        agents: Vec<(AgentSpec, Pid)>,
    ) -> Self {
        let running = Running {
            agents,
            started: config,
            settings,
        };
        Reloader {
            kernel,
            options,
            running: tokio::sync::Mutex::new(running),
        }
    }

    /// Reads, checks and applies the config file; see the module docs.
    async fn reload_as(&self, caller: Caller) -> Result<ReloadReport, KernelError> {
        if caller.scope() < Scope::Admin {
            return Err(KernelError::PermissionDenied(
                "only the admin scope may reload the config".into(),
            ));
        }
        self.kernel.check_running()?;
        // Held across the reload: two reloads never interleave.
        let mut running = self.running.lock().await;
        let mut report = ReloadReport {
            config: self.options.config.clone(),
            ..ReloadReport::default()
        };
        let (config, settings) = match checked(&self.options) {
            Ok(checked) => checked,
            Err(issues) => {
                report.issues = issues;
                return Ok(report);
            }
        };
        report.needs_restart = needs_restart(&running, &config, &settings);
        // Before the agents: one restarted for its role's sake gets the new one.
        report.roles = self.kernel.reload_roles(settings.roles.clone());
        let old_roles = std::mem::replace(&mut running.settings.roles, settings.roles);
        // Templates are read once at start (a change needs a restart), so
        // cron children keep the directories of the templates running now.
        let declared = config.agents.iter().chain(&running.started.templates);
        let sources = crate::skills::Sources::new(
            &settings.skills,
            declared.map(|agent| (agent.name.as_str(), agent.skills.as_slice())),
        );
        let had_skills = !running.settings.skills.is_empty()
            || running
                .started
                .templates
                .iter()
                .any(|t| !t.skills.is_empty())
            || running
                .agents
                .iter()
                .any(|(agent, _)| !agent.skills.is_empty());
        if had_skills || !sources.is_empty() {
            report.skills = vec![self.kernel.skills().reload(sources).await];
        }
        running.settings.skills = settings.skills.clone();
        report.agents = self.apply_agents(&mut running, &config, &old_roles).await;
        let declared: Vec<(Pid, CronSpec)> = running
            .agents
            .iter()
            .flat_map(|(agent, pid)| cron::declared(*pid, &agent.cron))
            .collect();
        report.cron = self.kernel.cron().reload(declared).await;
        Ok(report)
    }

    /// Stops the agents gone from the config, restarts the changed ones
    /// with their new spec, spawns the new ones; `running` follows what
    /// runs. Reports each agent in the new config's order, then those removed.
    async fn apply_agents(
        &self,
        running: &mut Running,
        config: &Config,
        old_roles: &HashMap<Role, RoleSettings>,
    ) -> Vec<Change> {
        let new_roles = running.settings.roles.clone();
        let role_changed = |agent: &AgentSpec| {
            let role = agent.role;
            old_roles.get(&role) != new_roles.get(&role)
        };
        let mut before: HashMap<String, (AgentSpec, Pid)> = running
            .agents
            .drain(..)
            .map(|(agent, pid)| (agent.name.clone(), (agent, pid)))
            .collect();
        let mut removed = Vec::new();
        let gone: Vec<String> = before
            .keys()
            .filter(|name| !config.agents.iter().any(|a| &a.name == *name))
            .cloned()
            .collect();
        for name in gone {
            let Some((agent, pid)) = before.remove(&name) else {
                continue;
            };
            let reason = "config reload: removed from the config";
            match self.kernel.stop_declared(pid, reason).await {
                Ok(()) => removed.push(Change::new(name, Some(pid), Outcome::Removed)),
                Err(err) => {
                    let why = format!("could not be stopped: {err}");
                    removed.push(Change::new(name, Some(pid), Outcome::Failed).detail(why));
                    running.agents.push((agent, pid));
                }
            }
        }
        let mut changes = Vec::new();
        for agent in &config.agents {
            let name = agent.name.clone();
            let change = match before.remove(&name) {
                Some((old, pid))
                    if spawn_request(&old) == spawn_request(agent) && !role_changed(agent) =>
                {
                    // The spec is the same; its cron entries are the cron's to compare.
                    running.agents.push((agent.clone(), pid));
                    let change = Change::new(name, Some(pid), Outcome::Unchanged);
                    if self.is_running(pid).await {
                        change
                    } else {
                        change.detail("not running: it has exited (left as it is)")
                    }
                }
                Some((old, pid)) => {
                    let mut fields: Vec<String> = changed_fields(&old, agent);
                    if role_changed(agent) {
                        fields.push(format!("roles.{}", agent.role.as_str()));
                    }
                    if fields.is_empty() {
                        fields.push("its spec".into());
                    }
                    let fields = fields.join(", ");
                    let respawned = self
                        .kernel
                        .respawn_declared(pid, spawn_request(&old), spawn_request(agent))
                        .await;
                    match respawned {
                        Ok(()) => {
                            running.agents.push((agent.clone(), pid));
                            Change::new(name, Some(pid), Outcome::Restarted)
                                .detail(format!("changed: {fields}"))
                        }
                        Err(why) => {
                            running.agents.push((old, pid));
                            Change::new(name, Some(pid), Outcome::Failed).detail(why)
                        }
                    }
                }
                None => match self.kernel.spawn_declared(&declared(agent), None).await {
                    Ok(Placed::Here(pid)) => {
                        running.agents.push((agent.clone(), pid));
                        Change::new(name, Some(pid), Outcome::Added)
                    }
                    // One this node took over from a node that went: its
                    // spec is the one this node started with, and from
                    // now on it is reloaded here (its cron entries too).
                    Ok(Placed::Held {
                        node,
                        pid: Some(pid),
                    }) if self.kernel.cluster().is_some_and(|c| c.node() == node) => {
                        let change = Change::new(name, Some(pid), Outcome::Unchanged);
                        if self.is_running(pid).await {
                            running.agents.push((agent.clone(), pid));
                            change.detail("taken over from a node that went; runs here")
                        } else {
                            change.detail(
                                "being taken over from a node that went; it starts here after \
                                 its restart delay",
                            )
                        }
                    }
                    // Another node's to reload.
                    Ok(Placed::Held { node, pid }) => Change::new(name, pid, Outcome::Unchanged)
                        .detail(format!("runs on node {node}; that node's config applies")),
                    Ok(Placed::Unplaced { wants }) => Change::new(name, None, Outcome::Unchanged)
                        .detail(format!(
                            "not on this node: it wants {wants}, and no such node runs it yet"
                        )),
                    Err(err) => Change::new(name, None, Outcome::Failed)
                        .detail(format!("could not be started: {err}")),
                },
            };
            changes.push(change);
        }
        changes.extend(removed);
        changes
    }
}

impl Reloader {
    /// Whether `pid` is alive (not a zombie, not gone).
    async fn is_running(&self, pid: Pid) -> bool {
        self.kernel
            .get_process(Caller::Admin, pid)
            .await
            .is_ok_and(|info| info.state != ProcessState::Zombie)
    }
}

impl ConfigReload for Reloader {
    fn reload(
        self: Arc<Self>,
        caller: Caller,
    ) -> BoxFuture<'static, Result<ReloadReport, KernelError>> {
        // On a task the kernel owns: a caller that gives up (a cancelled
        // RPC) cannot leave a reload half applied and `running` out of step.
        let tracker = self.kernel.tracker().clone();
        let task = tracker.spawn(async move { self.reload_as(caller).await });
        Box::pin(async move {
            task.await.unwrap_or_else(|_| {
                Err(KernelError::FailedPrecondition(
                    "the config reload failed; see the kernel's log".into(),
                ))
            })
        })
    }
}

/// The config file read and checked as `start` checks it, with the
/// command line's flags applied to its settings; or every issue found.
fn checked(options: &StartOptions) -> Result<(Config, KernelSettings), Vec<ConfigIssue>> {
    let known = RuntimeRegistry::builtin().known();
    let mut config = Config::load(&options.config, &known).map_err(|err| err.issues)?;
    config.serve_all(options.model.as_deref());
    let mut issues = Vec::new();
    let issue = |location: &str, message: String| ConfigIssue {
        location: location.to_owned(),
        message,
    };
    if let Err(why) = choose_provider(&config.llm, &config.kernel.models, |name| {
        std::env::var(name).ok()
    }) {
        issues.push(issue("llm", why));
    }
    let settings = match settings(&config, options) {
        Ok(settings) => settings,
        Err(err) => {
            issues.push(issue("kernel.tls", err.to_string()));
            return Err(issues);
        }
    };
    config.tools.shell.keep_out = settings.keep_out();
    // As `start`'s check_grants, every issue rather than the first.
    let grants = [
        (&config.tools.shell.grants, "tool_agent.shell"),
        (&settings.exec.grants, "kernel.exec"),
    ];
    for (grants, section) in grants {
        crate::config::check_grants(grants, section, &settings.data_dir, &mut issues);
    }
    match load_tls(&settings, options.insecure_remote) {
        Ok(_) => {}
        Err(StartError::Tls(err)) => issues.push(issue("kernel.tls", err.to_string())),
        Err(err) => issues.push(issue("kernel.listen", err.to_string())),
    }
    if issues.is_empty() {
        Ok((config, settings))
    } else {
        Err(issues)
    }
}

/// The settings that differ from what the kernel runs with, each of which
/// only a kernel restart applies.
fn needs_restart(running: &Running, config: &Config, settings: &KernelSettings) -> Vec<String> {
    // Every field named, so a new setting cannot be forgotten here.
    let KernelSettings {
        listen,
        data_dir,
        max_depth,
        max_children,
        mailbox_capacity,
        mailbox_max_bytes,
        mailbox_aging_ms,
        zombie_timeout_seconds,
        task_timeout_seconds,
        max_concurrent_tasks,
        shutdown_grace_ms,
        default_runtime,
        workspace,
        synchronous,
        event_log_limit,
        // Applied by the reload (`reload_roles`).
        roles: _,
        storage,
        artifacts,
        memory,
        transcripts,
        limits,
        connections,
        prices,
        models,
        tls,
        exec,
        notify,
        metrics,
        dashboard,
        cluster,
        log,
        otel,
        restore_temporary,
        // Applied by the reload (`reload_skills`).
        skills: _,
    } = &running.settings;
    let new = settings;
    let fields = [
        ("kernel.listen", *listen != new.listen),
        ("kernel.data_dir", *data_dir != new.data_dir),
        ("kernel.max_depth", *max_depth != new.max_depth),
        ("kernel.max_children", *max_children != new.max_children),
        (
            "kernel.mailbox_capacity",
            *mailbox_capacity != new.mailbox_capacity,
        ),
        (
            "kernel.mailbox_max_bytes",
            *mailbox_max_bytes != new.mailbox_max_bytes,
        ),
        (
            "kernel.mailbox_aging_ms",
            *mailbox_aging_ms != new.mailbox_aging_ms,
        ),
        (
            "kernel.zombie_timeout_seconds",
            *zombie_timeout_seconds != new.zombie_timeout_seconds,
        ),
        (
            "kernel.task_timeout_seconds",
            *task_timeout_seconds != new.task_timeout_seconds,
        ),
        (
            "kernel.max_concurrent_tasks",
            *max_concurrent_tasks != new.max_concurrent_tasks,
        ),
        (
            "kernel.shutdown_grace_ms",
            *shutdown_grace_ms != new.shutdown_grace_ms,
        ),
        (
            "kernel.default_runtime",
            *default_runtime != new.default_runtime,
        ),
        ("kernel.workspace", *workspace != new.workspace),
        ("kernel.synchronous", *synchronous != new.synchronous),
        (
            "kernel.event_log_limit",
            *event_log_limit != new.event_log_limit,
        ),
        ("kernel.storage", *storage != new.storage),
        ("kernel.artifacts", *artifacts != new.artifacts),
        ("kernel.memory", *memory != new.memory),
        ("kernel.transcripts", *transcripts != new.transcripts),
        ("kernel.limits", *limits != new.limits),
        ("kernel.cluster", *cluster != new.cluster),
        ("kernel.connections", *connections != new.connections),
        ("kernel.tls", *tls != new.tls),
        ("kernel.exec", *exec != new.exec),
        ("kernel.notify", *notify != new.notify),
        ("kernel.metrics", *metrics != new.metrics),
        ("kernel.dashboard", *dashboard != new.dashboard),
        ("kernel.log", *log != new.log),
        ("kernel.otel", *otel != new.otel),
        (
            "kernel.restore_temporary",
            *restore_temporary != new.restore_temporary,
        ),
        ("llm.prices", *prices != new.prices),
        ("llm (models)", !models.sends_like(&new.models)),
        ("llm", running.started.llm != config.llm),
        ("tool_agent", running.started.agent != config.agent),
        ("tool_agent (tools)", running.started.tools != config.tools),
        ("templates", running.started.templates != config.templates),
        ("mcp_servers", running.started.mcp != config.mcp),
    ];
    fields
        .into_iter()
        .filter(|(_, differs)| *differs)
        .map(|(name, _)| name.to_owned())
        .collect()
}

/// The fields of an agent's spawn spec that differ, by name.
fn changed_fields(old: &AgentSpec, new: &AgentSpec) -> Vec<String> {
    let as_json = |agent: &AgentSpec| serde_json::to_value(spawn_request(agent)).ok();
    let (Some(serde_json::Value::Object(old)), Some(serde_json::Value::Object(new))) =
        (as_json(old), as_json(new))
    else {
        return Vec::new();
    };
    new.iter()
        .filter(|(key, value)| old.get(*key) != Some(value))
        .map(|(key, _)| key.clone())
        .collect()
}
