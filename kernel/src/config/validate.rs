//! Phase 2: semantic checks on what parsed, resolving paths and loading prompt files.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use hivekernel_agents::{
    Capability, ExecCommand, LimitOverrides, McpSelector, Role, SkillSelector, Tier,
};
use serde_json::Value;

use super::cluster::{MAX_NODE_NAME_BYTES, node_name_problem};
use super::parse::{Agent, RawAgent, settings};
use super::{AgentSpec, ConfigIssue, KernelSettings, Known, McpServerSpec, at};
use crate::command::{self, EXEC_RUNTIME};
use crate::files::FileProblem;

/// Kernel values that agents are checked against; `None` when the kernel's own value was bad.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ceilings {
    max_depth: Option<u32>,
    max_children: Option<u32>,
    max_concurrent_tasks: Option<u32>,
    task_timeout_seconds: Option<u64>,
}

/// An agent after phase 2, remembered for the checks across agents.
#[derive(Debug)]
pub(super) struct Checked {
    index: usize,
    label: String,
    name_ok: bool,
    spec: AgentSpec,
    /// The entry had a `cron` field (read separately, by `cron::agent_entries`).
    has_cron: bool,
}

impl Checked {
    pub(super) fn has_cron(&self) -> bool {
        self.has_cron
    }

    /// Its location label and spec.
    pub(super) fn into_parts(self) -> (String, AgentSpec) {
        (self.label, self.spec)
    }
}

/// What every check needs: where relative paths start and which runtimes,
/// tools and MCP servers exist.
#[derive(Debug)]
pub(super) struct Context<'a> {
    base: &'a Path,
    known: &'a Known,
    /// The checked `mcp_servers`, which agents' `mcp:` tool entries name.
    mcp: &'a [McpServerSpec],
}

impl<'a> Context<'a> {
    pub(super) fn new(base: &'a Path, known: &'a Known) -> Self {
        Context {
            base,
            known,
            mcp: &[],
        }
    }

    /// These checks, with `servers` as the MCP servers agents may name.
    pub(super) fn with_mcp(self, servers: &'a [McpServerSpec]) -> Self {
        Context {
            mcp: servers,
            ..self
        }
    }

    /// Reads and checks the `kernel` section (`env` for the sections that
    /// read variables) and returns the settings and the ceilings for agents.
    pub(super) fn kernel(
        &self,
        value: Option<&Value>,
        env: &dyn Fn(&str) -> Option<String>,
        issues: &mut Vec<ConfigIssue>,
    ) -> (KernelSettings, Ceilings) {
        let section = settings::<KernelSettings>(value, "kernel", issues);
        // A kernel value that is itself wrong would only produce noise about the agents.
        let trusted = |field: &str| section.is_ok(field);
        let k = &section.value;
        let ceilings = Ceilings {
            max_depth: trusted("max_depth").then_some(k.max_depth),
            max_children: trusted("max_children").then_some(k.max_children),
            max_concurrent_tasks: trusted("max_concurrent_tasks").then_some(k.max_concurrent_tasks),
            task_timeout_seconds: trusted("task_timeout_seconds").then_some(k.task_timeout_seconds),
        };
        let mut k = section.value;
        k.data_dir = self
            .path_field(&k.data_dir, "kernel.data_dir", issues)
            .unwrap_or_default();
        k.workspace = k
            .workspace
            .and_then(|dir| self.path_field(&dir, "kernel.workspace", issues));
        if let Some(problem) = self.runtime_problem(&k.default_runtime) {
            issues.push(ConfigIssue::new("kernel.default_runtime", problem));
        } else if k.default_runtime == EXEC_RUNTIME {
            let message = "exec cannot be the default: every exec agent needs its own command \
                           (name runtime exec on those agents)";
            issues.push(ConfigIssue::new("kernel.default_runtime", message));
        }
        super::observe::check_dashboard(&mut k.dashboard, issues);
        k.skills = super::skills::dirs(&k.skills, "kernel.skills", self, issues);
        // The sections read apart, with the environment or the config's directory.
        let apart = |key: &str| value.and_then(|kernel| kernel.get(key));
        k.tls = super::tls::tls(apart("tls"), self, issues);
        k.exec = super::sandbox::exec(apart("exec"), self, issues);
        k.notify = super::notify::notify(apart("notify"), env, issues);
        k.metrics = super::observe::metrics(apart("metrics"), issues);
        k.cluster = super::cluster::cluster(apart("cluster"), self, issues);
        k.otel = super::observe::otel(apart("otel"), env, issues);

        (k, ceilings)
    }

    /// Checks one agent and builds its spec (the spec is only used if no issue was found).
    pub(super) fn agent(
        &self,
        agent: Agent,
        ceilings: &Ceilings,
        kernel: &KernelSettings,
        issues: &mut Vec<ConfigIssue>,
    ) -> Checked {
        let Agent {
            index,
            label,
            fields,
            limits,
            metadata,
        } = agent;
        let raw = &fields.value;
        let loc = |field: &str| at(&label, field);

        let mut name_ok = false;
        match &raw.name {
            Some(name) => match name_problem(name) {
                Some(problem) => issues.push(ConfigIssue::new(loc("name"), problem)),
                None => name_ok = true,
            },
            None if fields.is_ok("name") => {
                issues.push(ConfigIssue::new(
                    loc("name"),
                    "missing required field `name`",
                ));
            }
            None => {}
        }

        let role = parse_named(raw.role.as_deref(), Role::Agent, &loc("role"), issues);
        if role == Role::Kernel {
            let message = "role \"kernel\" is reserved for PID 1";
            issues.push(ConfigIssue::new(loc("role"), message));
        }
        let tier = raw.cognitive_tier.as_deref();
        let tier = parse_named(tier, Tier::Operational, &loc("cognitive_tier"), issues);
        if let Some(problem) = raw.runtime.as_deref().and_then(|r| self.runtime_problem(r)) {
            issues.push(ConfigIssue::new(loc("runtime"), problem));
        }

        let system_prompt_file = raw
            .system_prompt_file
            .as_deref()
            .and_then(|file| self.path_field(file, &loc("system_prompt_file"), issues));
        let system_prompt = match &system_prompt_file {
            Some(path) => read_prompt(
                path,
                &loc("system_prompt_file"),
                kernel.limits.prompt_bytes,
                issues,
            ),
            None => raw.system_prompt.clone(),
        };
        let workspace = raw
            .workspace
            .as_deref()
            .and_then(|dir| self.path_field(dir, &loc("workspace"), issues));
        if let Some(dir) = &workspace
            && let Some(problem) = super::sandbox::overlap(dir, &kernel.data_dir)
        {
            issues.push(ConfigIssue::new(loc("workspace"), problem));
        }

        let exec = self.exec_command(raw, &loc, issues);
        let input = &kernel.limits;
        let sizes = [
            input.check_model("model", &raw.model),
            raw.runtime
                .as_deref()
                .map_or(Ok(()), |runtime| input.check_model("runtime", runtime)),
            input.check_prompt(&system_prompt),
            input.check_metadata(&metadata.value),
            exec.as_ref()
                .map_or(Ok(()), |exec| input.check_command(exec)),
            // Duplicates are reported by `check_tools`, each where it is.
            input.check_tool_count(&raw.tools),
        ];
        for err in sizes.into_iter().filter_map(Result::err) {
            issues.push(ConfigIssue::new(loc(err.field), err.problem));
        }
        self.check_tools(&raw.tools, &loc("tools"), issues);
        self.check_tool_capabilities(&raw.tools, kernel, role, &loc("tools"), issues);
        check_limits(&limits.value, ceilings, &loc("limits"), issues);
        let restart = super::supervision::restart(raw.restart.as_ref(), &loc("restart"), issues);
        let strategy = raw.strategy.as_deref();
        let strategy = super::supervision::strategy(strategy, &loc("strategy"), issues);
        let approval = super::approval::rules(raw.approval.as_ref(), &loc("approval"), issues);
        self.check_approval_tools(&approval, &loc("approval"), issues);

        let skills = super::skills::dirs(&raw.skills, &loc("skills"), self, issues);
        let (node, node_labels) = placement(raw, &loc, issues);
        let spec = AgentSpec {
            name: raw.name.clone().unwrap_or_default(),
            role,
            tier,
            model: raw.model.clone(),
            runtime: raw.runtime.clone(),
            system_prompt,
            system_prompt_file,
            tools: raw.tools.clone(),
            workspace,
            limits: limits.value,
            metadata: metadata.value,
            restart,
            strategy,
            exec,
            // Filled from the raw entry by `cron::agent_entries`.
            cron: Vec::new(),
            approval,
            skills,
            node,
            node_labels,
        };
        Checked {
            index,
            label,
            name_ok,
            spec,
            has_cron: raw.cron.is_some(),
        }
    }

    /// The OS command of an `exec` agent: `command` and `env` go with runtime
    /// `exec` only (which `command` implies when no runtime is named). A
    /// relative program path with a slash resolves against the config's
    /// directory, which is also the command's working directory.
    fn exec_command(
        &self,
        raw: &RawAgent,
        loc: &dyn Fn(&str) -> String,
        issues: &mut Vec<ConfigIssue>,
    ) -> Option<ExecCommand> {
        let exec = match raw.runtime.as_deref() {
            Some(runtime) => runtime == EXEC_RUNTIME,
            None => raw.command.is_some(),
        };
        if !exec {
            for (field, given) in [
                ("command", raw.command.is_some()),
                ("env", raw.env.is_some()),
            ] {
                if given {
                    let runtime = raw.runtime.as_deref().unwrap_or("the default runtime");
                    issues.push(ConfigIssue::new(
                        loc(field),
                        format!("{field} is only for runtime exec, not {runtime}"),
                    ));
                }
            }
            return None;
        }
        let Some(mut argv) = raw.command.clone() else {
            issues.push(ConfigIssue::new(
                loc("command"),
                "runtime exec needs a command: the program and its arguments",
            ));
            return None;
        };
        let base = self.absolute_base();
        if let Some(program) = argv.first_mut() {
            resolve_program(program, &base);
        }
        let command = ExecCommand {
            argv,
            env: raw.env.clone().unwrap_or_default(),
            cwd: Some(base),
        };
        if let Err(problem) = command::check(&command) {
            let field = if problem.starts_with("env") {
                "env"
            } else {
                "command"
            };
            issues.push(ConfigIssue::new(loc(field), problem));
        }
        Some(command)
    }

    /// The config file's directory, absolute, so that a program or working
    /// directory resolved against it does not depend on where the kernel runs.
    pub(super) fn absolute_base(&self) -> PathBuf {
        if self.base.as_os_str().is_empty() {
            std::env::current_dir().unwrap_or_default()
        } else {
            std::path::absolute(self.base).unwrap_or_else(|_| self.base.to_owned())
        }
    }

    /// Why `name` is not a registered runtime, listing the ones that are.
    pub(super) fn runtime_problem(&self, name: &str) -> Option<String> {
        if self.known.runtimes.iter().any(|known| known == name) {
            return None;
        }
        let known = if self.known.runtimes.is_empty() {
            "none are registered".to_owned()
        } else {
            format!("known runtimes: {}", self.known.runtimes.join(", "))
        };
        Some(format!("unknown runtime {name:?} ({known})"))
    }

    /// Checks a tool list: names known (built-in tools, `skills` and
    /// `skill:<name>` entries, or `mcp:` entries naming an enabled server),
    /// non-empty, no duplicates.
    fn check_tools(&self, tools: &[String], location: &str, issues: &mut Vec<ConfigIssue>) {
        let mut first_seen: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, tool) in tools.iter().enumerate() {
            let here = format!("{location}[{i}]");
            if tool.trim().is_empty() {
                issues.push(ConfigIssue::new(
                    here,
                    format!("tool name must not be empty, got {tool:?}"),
                ));
            } else if let Some(first) = first_seen.get(tool.as_str()) {
                issues.push(ConfigIssue::new(
                    here,
                    format!("duplicate tool {tool:?} (also {location}[{first}])"),
                ));
            } else if let Some(selector) = SkillSelector::parse(tool) {
                match selector {
                    Ok(_) => {
                        first_seen.insert(tool, i);
                    }
                    Err(problem) => issues.push(ConfigIssue::new(here, problem)),
                }
            } else if let Some(selector) = McpSelector::parse(tool) {
                match selector.map(|selector| self.mcp_problem(&selector.server)) {
                    Ok(None) => {
                        first_seen.insert(tool, i);
                    }
                    Ok(Some(problem)) | Err(problem) => {
                        issues.push(ConfigIssue::new(here, problem));
                    }
                }
            } else if !self.known.tools.contains(tool) {
                issues.push(ConfigIssue::new(
                    here,
                    format!(
                        "unknown tool {tool:?} (known tools: {})",
                        self.known.tools.join(", ")
                    ),
                ));
            } else {
                first_seen.insert(tool, i);
            }
        }
    }

    /// Why agents cannot use the MCP server `server`: it is not configured,
    /// or disabled. Its tools are known only once it runs, so a selector's
    /// tool part is not checked here.
    fn mcp_problem(&self, server: &str) -> Option<String> {
        match self.mcp.iter().find(|spec| spec.name == server) {
            Some(spec) if spec.enabled => None,
            Some(_) => Some(format!(
                "MCP server {server:?} is disabled (mcp_servers.{server}.enabled is false)"
            )),
            None if self.mcp.is_empty() => Some(format!(
                "unknown MCP server {server:?} (no mcp_servers configured)"
            )),
            None => {
                let known: Vec<&str> = self.mcp.iter().map(|spec| spec.name.as_str()).collect();
                Some(format!(
                    "unknown MCP server {server:?} (known: {})",
                    known.join(", ")
                ))
            }
        }
    }

    /// Checks that each approval rule names a tool there is: a built-in
    /// one, or an MCP entry of a configured, enabled server.
    pub(super) fn check_approval_tools(
        &self,
        rules: &[hivekernel_agents::ApprovalRule],
        location: &str,
        issues: &mut Vec<ConfigIssue>,
    ) {
        for (i, rule) in rules.iter().enumerate() {
            let mut found = Vec::new();
            if SkillSelector::parse(&rule.tool).is_some() {
                let message = format!(
                    "{:?} selects skills, it is no tool call: name the skill tools \
                     (\"skill_view\", \"skill_read\") to approve their calls",
                    rule.tool
                );
                issues.push(ConfigIssue::new(format!("{location}[{i}].tool"), message));
                continue;
            }
            if hivekernel_agents::tool_agent::SKILL_TOOLS.contains(&rule.tool.as_str()) {
                continue;
            }
            self.check_tools(std::slice::from_ref(&rule.tool), "", &mut found);
            for issue in found {
                issues.push(ConfigIssue::new(
                    format!("{location}[{i}].tool"),
                    issue.message,
                ));
            }
        }
    }

    /// Checks that `role` grants every capability the tools need (an `mcp:`
    /// entry needs `mcp_tools`).
    fn check_tool_capabilities(
        &self,
        tools: &[String],
        kernel: &KernelSettings,
        role: Role,
        location: &str,
        issues: &mut Vec<ConfigIssue>,
    ) {
        let granted = kernel.capabilities(role);
        for (i, tool) in tools.iter().enumerate() {
            let needed = match McpSelector::parse(tool) {
                Some(Ok(_)) => Some(Capability::McpTools),
                // A malformed entry is reported by `check_tools`.
                Some(Err(_)) => None,
                None => self.known.tool_capabilities.get(tool).copied(),
            };
            if let Some(needed) = needed
                && !granted.contains(needed)
            {
                issues.push(ConfigIssue::new(
                    format!("{location}[{i}]"),
                    format!(
                        "tool {tool:?} needs capability {needed}, which role {role} does not \
                         have: grant it in roles.{role}.capabilities"
                    ),
                ));
            }
        }
    }

    /// Resolves a path relative to the config file's directory; empty is an error.
    pub(super) fn path_field(
        &self,
        value: impl AsRef<Path>,
        location: &str,
        issues: &mut Vec<ConfigIssue>,
    ) -> Option<PathBuf> {
        let value = value.as_ref();
        if value.as_os_str().is_empty() {
            issues.push(ConfigIssue::new(location, "must not be empty"));
            return None;
        }
        // `join` keeps an absolute path as it is.
        Some(self.base.join(value))
    }
}

/// `program` resolved against `base` when it is a relative path with a
/// slash; a bare name is left for PATH lookup, an absolute path as it is.
pub(super) fn resolve_program(program: &mut String, base: &Path) {
    if program.contains('/') && !Path::new(program.as_str()).is_absolute() {
        *program = base.join(program.as_str()).display().to_string();
    }
}

/// Checks what spans agents: their count under PID 1 and unique names.
pub(super) fn across_agents(
    agents: Vec<Checked>,
    count: usize,
    ceilings: &Ceilings,
    issues: &mut Vec<ConfigIssue>,
) -> Vec<AgentSpec> {
    if let Some(max) = ceilings.max_children
        && count > max as usize
    {
        issues.push(ConfigIssue::new(
            "agents",
            format!("{count} agents exceed kernel.max_children {max} (PID 1 is their parent)"),
        ));
    }
    let mut first_seen: BTreeMap<&str, usize> = BTreeMap::new();
    for agent in agents.iter().filter(|a| a.name_ok) {
        let name = agent.spec.name.as_str();
        match first_seen.get(name) {
            Some(first) => issues.push(ConfigIssue::new(
                at(&agent.label, "name"),
                format!("duplicate agent name {name:?} (also agents[{first}])"),
            )),
            None => {
                first_seen.insert(name, agent.index);
            }
        }
    }
    agents.into_iter().map(|a| a.spec).collect()
}

/// Why `name` cannot name an agent, if it cannot.
pub(super) fn name_problem(name: &str) -> Option<String> {
    hivekernel_agents::check_name(name).err()
}

/// Parses a role or tier, defaulting when absent; the error lists the valid names.
fn parse_named<T: FromStr<Err = String>>(
    value: Option<&str>,
    default: T,
    location: &str,
    issues: &mut Vec<ConfigIssue>,
) -> T {
    match value.map(str::parse) {
        None => default,
        Some(Ok(parsed)) => parsed,
        Some(Err(problem)) => {
            issues.push(ConfigIssue::new(location, problem));
            default
        }
    }
}

/// Reads a prompt file of at most `max` bytes (`kernel.limits.prompt_bytes`).
pub(super) fn read_prompt(
    path: &Path,
    location: &str,
    max: usize,
    issues: &mut Vec<ConfigIssue>,
) -> String {
    let problem = match crate::files::read_capped(path, max as u64) {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) => return text,
            Err(_) => format!("cannot read {}: it is not UTF-8 text", path.display()),
        },
        Err(FileProblem::TooLarge { size, .. }) => format!(
            "{} is {size} bytes, at most {max} (kernel.limits.prompt_bytes)",
            path.display()
        ),
        Err(problem) => format!("cannot read {}: {problem}", path.display()),
    };
    issues.push(ConfigIssue::new(location, problem));
    String::new()
}

/// Checks requested limits against the kernel's; a config agent sits at depth 1 under PID 1.
fn check_limits(
    limits: &LimitOverrides,
    ceilings: &Ceilings,
    location: &str,
    issues: &mut Vec<ConfigIssue>,
) {
    let mut push = |field: &str, message: String| {
        issues.push(ConfigIssue::new(at(location, field), message));
    };
    if let Some(depth) = limits.max_depth
        && let Some(kernel) = ceilings.max_depth.filter(|&k| depth > k.saturating_sub(1))
    {
        push(
            "max_depth",
            format!(
                "max_depth {depth} exceeds {} (kernel.max_depth {kernel} minus the agent's own level)",
                kernel.saturating_sub(1)
            ),
        );
    }
    if let Some(children) = limits.max_children
        && let Some(kernel) = ceilings.max_children.filter(|&k| children > k)
    {
        push(
            "max_children",
            format!("max_children {children} exceeds kernel.max_children {kernel}"),
        );
    }
    if let Some(tasks) = limits.max_concurrent_tasks {
        if tasks == 0 {
            push(
                "max_concurrent_tasks",
                "must be at least 1, got 0".to_owned(),
            );
        } else if let Some(kernel) = ceilings.max_concurrent_tasks.filter(|&k| tasks > k) {
            push(
                "max_concurrent_tasks",
                format!(
                    "max_concurrent_tasks {tasks} exceeds kernel.max_concurrent_tasks {kernel}"
                ),
            );
        }
    }
    if limits.max_storage_bytes == Some(0) {
        push(
            "max_storage_bytes",
            "must be at least 1, got 0 (leave it out for kernel.storage.max_bytes_per_subtree)"
                .to_owned(),
        );
    }
    if let Some(timeout) = limits.timeout_seconds {
        if timeout == 0 {
            push("timeout_seconds", "must be at least 1, got 0".to_owned());
        } else if let Some(kernel) = ceilings.task_timeout_seconds.filter(|&k| timeout > k) {
            push(
                "timeout_seconds",
                format!("timeout_seconds {timeout} exceeds kernel.task_timeout_seconds {kernel}"),
            );
        }
    }
}

/// Pushes an issue unless `value` lies in `range`; returns whether it does.
pub(super) fn in_range<T: PartialOrd + Display>(
    value: T,
    range: RangeInclusive<T>,
    location: &str,
    issues: &mut Vec<ConfigIssue>,
) -> bool {
    let ok = range.contains(&value);
    if !ok {
        issues.push(ConfigIssue::new(
            location,
            format!(
                "must be between {} and {}, got {value}",
                range.start(),
                range.end()
            ),
        ));
    }
    ok
}

/// Most labels an agent's `where` may ask for.
const MAX_WHERE_LABELS: usize = 32;

/// An agent's `node` and `where`, checked as `kernel.cluster`'s node name
/// and labels are (they are compared with them).
fn placement(
    raw: &RawAgent,
    loc: &dyn Fn(&str) -> String,
    issues: &mut Vec<ConfigIssue>,
) -> (Option<String>, BTreeMap<String, String>) {
    if let Some(problem) = raw.node.as_deref().and_then(node_name_problem) {
        issues.push(ConfigIssue::new(loc("node"), problem));
    }
    let labels = raw.node_labels.clone().unwrap_or_default();
    if labels.len() > MAX_WHERE_LABELS {
        issues.push(ConfigIssue::new(
            loc("where"),
            format!("at most {MAX_WHERE_LABELS} labels, got {}", labels.len()),
        ));
    }
    for (key, value) in &labels {
        if let Some(problem) = node_name_problem(key) {
            issues.push(ConfigIssue::new(loc("where"), format!("key {problem}")));
        } else if value.len() > MAX_NODE_NAME_BYTES {
            issues.push(ConfigIssue::new(
                at(&loc("where"), key),
                format!(
                    "is {} bytes long, at most {MAX_NODE_NAME_BYTES} allowed",
                    value.len()
                ),
            ));
        }
    }
    (raw.node.clone(), labels)
}
