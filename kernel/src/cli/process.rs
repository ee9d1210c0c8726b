//! `spawn`, `kill`, `restart` and `wait`, and listing a subtree.

use std::time::Duration;

use hivekernel_proto::v1::{
    KillRequest, KillResponse, ListProcessesRequest, ProcessInfo, RestartProcessRequest,
    RestartSpec, Role as PbRole, SpawnRequest, Strategy as PbStrategy, UnansweredNode,
    WaitChildRequest,
};
use serde_json::json;

use super::client::Session;
use hivekernel_agents::{RestartPolicy, Role, Strategy, Tier};

use super::{CliError, KillArgs, RestartArgs, SpawnArgs, WaitArgs, names, output};

/// The subtree under `root` (0: PID 1), parents first.
pub(super) async fn list(session: &mut Session, root: u64) -> Result<Vec<ProcessInfo>, CliError> {
    let request = ListProcessesRequest {
        root,
        max_depth: 0,
        batch_size: 0,
    };
    let mut stream = session
        .client
        .list_processes(request)
        .await
        .map_err(|status| session.error(status))?
        .into_inner();
    let mut procs = Vec::new();
    let mut unanswered: Vec<UnansweredNode> = Vec::new();
    while let Some(batch) = stream
        .message()
        .await
        .map_err(|status| session.error(status))?
    {
        procs.extend(batch.processes);
        for gap in batch.unanswered {
            match unanswered.iter_mut().find(|seen| seen.node == gap.node) {
                Some(seen) => seen.processes = seen.processes.saturating_add(gap.processes),
                None => unanswered.push(gap),
            }
        }
    }
    // On stderr: what is listed stays as it is (a table, JSON) for whatever reads it.
    for gap in &unanswered {
        eprintln!("{}", unanswered_warning(gap));
    }
    Ok(procs)
}

/// The warning for a node that did not answer for its processes.
fn unanswered_warning(gap: &UnansweredNode) -> String {
    let count = match gap.processes {
        1 => "1 process".to_owned(),
        n => format!("{n} processes"),
    };
    format!(
        "warning: node {} did not answer; {count} of it not shown ({})",
        gap.node, gap.error
    )
}

/// Spawns one process and prints its PID.
pub(super) async fn spawn(args: SpawnArgs) -> Result<(), CliError> {
    // Local input first: a bad prompt file is a usage error even with no kernel.
    let system_prompt = match (args.prompt, &args.prompt_file) {
        (Some(text), _) => text,
        (None, Some(path)) => std::fs::read_to_string(path).map_err(|err| {
            CliError::Usage(format!("cannot read prompt file {}: {err}", path.display()))
        })?,
        (None, None) => String::new(),
    };
    let mut session = Session::connect(&args.client).await?;
    let new = NewProcess {
        parent: session.pid(&args.parent).await?,
        name: args.name,
        role: args.role,
        tier: args.tier,
        model: args.model,
        runtime: args.runtime,
        system_prompt,
        tools: args.tools,
        restart: args.restart,
        strategy: args.strategy,
        command: args.command,
        cwd: args.cwd,
        env: args.env,
        node: args.node,
        node_labels: args.node_labels,
    };
    let pid = session
        .client
        .spawn(new.request()?)
        .await
        .map_err(|status| session.error(status))?
        .into_inner()
        .pid;
    let text = if args.json {
        json!({ "pid": pid }).to_string()
    } else {
        pid.to_string()
    };
    output::print(&output::line(&text))
}

/// What a spawn from outside the kernel asks for (`spawn`, and `mcp serve`'s
/// `spawn` tool): everything not given is the kernel's default.
#[derive(Debug, Default)]
pub(super) struct NewProcess {
    pub(super) parent: u64,
    pub(super) name: String,
    pub(super) role: Option<Role>,
    pub(super) tier: Option<Tier>,
    pub(super) model: Option<String>,
    pub(super) runtime: Option<String>,
    pub(super) system_prompt: String,
    pub(super) tools: Vec<String>,
    pub(super) restart: Option<RestartPolicy>,
    pub(super) strategy: Option<Strategy>,
    /// An exec agent's command line; empty for an in-kernel runtime.
    pub(super) command: Vec<String>,
    /// The exec command's working directory [default: the current one].
    pub(super) cwd: Option<std::path::PathBuf>,
    pub(super) env: Vec<(String, String)>,
    /// On a node of a cluster: the node to run on.
    pub(super) node: Option<String>,
    /// On a node of a cluster: labels its node must have.
    pub(super) node_labels: Vec<(String, String)>,
}

impl NewProcess {
    /// The gRPC request: tool names trimmed, blank ones dropped, an exec
    /// command's directory and relative program made absolute.
    pub(super) fn request(self) -> Result<SpawnRequest, CliError> {
        let tools = self
            .tools
            .iter()
            .map(|tool| tool.trim())
            .filter(|tool| !tool.is_empty())
            .map(str::to_owned)
            .collect();
        let cwd = exec_cwd(&self.command, self.cwd)?;
        Ok(SpawnRequest {
            parent: self.parent,
            name: self.name,
            role: self.role.map_or(PbRole::Unspecified, names::role_to_proto) as i32,
            // The lowest tier unless asked: a spawn from outside does not
            // inherit PID 1's strategic tier by accident.
            tier: names::tier_to_proto(self.tier.unwrap_or(Tier::Operational)) as i32,
            model: self.model.unwrap_or_default(),
            runtime: self.runtime.unwrap_or_default(),
            system_prompt: self.system_prompt,
            tools,
            limits: None,
            metadata: Default::default(),
            restart: self.restart.map(|policy| RestartSpec {
                policy: names::policy_to_proto(policy) as i32,
                ..RestartSpec::default()
            }),
            strategy: self
                .strategy
                .map_or(PbStrategy::Unspecified, names::strategy_to_proto)
                as i32,
            command: program_in(self.command, &cwd),
            cwd,
            env: self.env.into_iter().collect(),
            node: self.node.unwrap_or_default(),
            node_labels: self.node_labels.into_iter().collect(),
        })
    }
}

/// `command` with a relative program path (one with a `/`) joined to
/// `cwd`, as a config agent's is to the config's directory.
fn program_in(mut command: Vec<String>, cwd: &str) -> Vec<String> {
    if let Some(program) = command.first_mut()
        && program.contains('/')
        && !std::path::Path::new(program.as_str()).is_absolute()
    {
        *program = std::path::Path::new(cwd)
            .join(program.as_str())
            .display()
            .to_string();
    }
    command
}

/// The working directory sent with an exec command: `--cwd` made absolute,
/// else the current directory, so the command's relative paths mean what
/// they mean in the shell it was typed in. Empty without a command.
fn exec_cwd(command: &[String], cwd: Option<std::path::PathBuf>) -> Result<String, CliError> {
    if command.is_empty() {
        return match cwd {
            Some(_) => Err(CliError::Usage(
                "--cwd is for an exec command, given after `--`".into(),
            )),
            None => Ok(String::new()),
        };
    }
    let dir = match cwd {
        Some(dir) => std::path::absolute(&dir),
        None => std::env::current_dir(),
    }
    .map_err(|err| CliError::Usage(format!("cannot tell the working directory: {err}")))?;
    dir.into_os_string().into_string().map_err(|dir| {
        CliError::Usage(format!(
            "--cwd {} is not valid UTF-8",
            dir.to_string_lossy()
        ))
    })
}

/// Kills a subtree and prints the PIDs that exited, leaves first, one per
/// line; processes of it on a node that did not answer are named after
/// them, and make it fail as unavailable (exit 3): they may still run.
pub(super) async fn kill(args: KillArgs) -> Result<(), CliError> {
    let mut session = Session::connect(&args.client).await?;
    let pid = session.pid(&args.pid).await?;
    let killed = kill_subtree(&mut session, pid, args.reason.unwrap_or_default()).await?;
    let text: String = killed.killed.iter().map(|pid| format!("{pid}\n")).collect();
    output::print(&text)?;
    if killed.unreached.is_empty() {
        return Ok(());
    }
    let named: Vec<String> = killed
        .unreached
        .iter()
        .map(|gone| {
            format!(
                "process {} on node {} ({})",
                gone.pid, gone.node, gone.error
            )
        })
        .collect();
    Err(CliError::Unavailable {
        addr: session.addr().to_owned(),
        message: format!(
            "not reached, and may still run: {}; the rest of the subtree was killed",
            named.join("; ")
        ),
    })
}

/// Kills `pid` and its subtree: the PIDs that exited, leaves first, and
/// what could not be reached.
pub(super) async fn kill_subtree(
    session: &mut Session,
    pid: u64,
    reason: String,
) -> Result<KillResponse, CliError> {
    let killed = session
        .client
        .kill(KillRequest { pid, reason })
        .await
        .map_err(|status| session.error(status))?
        .into_inner();
    Ok(killed)
}

/// Restarts a process and says how many restarts it has had.
pub(super) async fn restart(args: RestartArgs) -> Result<(), CliError> {
    let mut session = Session::connect(&args.client).await?;
    let request = RestartProcessRequest {
        pid: session.pid(&args.pid).await?,
        reason: args.reason.unwrap_or_default(),
    };
    let answer = session
        .client
        .restart_process(request)
        .await
        .map_err(|status| session.error(status))?
        .into_inner();
    let text = if args.json {
        json!({ "pid": answer.pid, "attempt": answer.attempt }).to_string()
    } else {
        format!("restarted {} (restart {})", answer.pid, answer.attempt)
    };
    output::print(&output::line(&text))
}

/// Waits for a child to exit and prints its exit record.
pub(super) async fn wait(args: WaitArgs) -> Result<(), CliError> {
    let mut session = Session::connect(&args.client).await?;
    let request = WaitChildRequest {
        pid: session.pid(&args.pid).await?,
        timeout_ms: args.timeout.map_or(0, millis),
    };
    let exit = session
        .client
        .wait_child(request)
        .await
        .map_err(|status| session.error(status))?
        .into_inner();
    let text = if args.json {
        output::exit_json(&exit).to_string()
    } else {
        output::exit_text(&exit)
    };
    output::print(&output::line(&text))
}

/// Whole milliseconds, at least 1 (0 means "no limit" on the wire).
pub(super) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}
