//! Spawn: every rule a new process must pass, then the table insert.

use std::sync::{Arc, LazyLock};
use std::time::SystemTime;

use hivekernel_agents::approval::join;
use hivekernel_agents::{
    ApprovalRule, Capabilities, Capability, Limits, Pid, ProcessContext, RestartPolicy,
    RestartSpec, Role, Runtime, SpawnRequest, Strategy, Tier, Workspace, check_name,
};

use crate::budget::Pool;
use crate::error::{KernelError, Result};
use crate::events::{EventKind, unix_ms};
use crate::exec::{EXEC_RUNTIME, Launch};
use crate::kernel::acl::ChildGrant;
use crate::kernel::across::ParentGrant;
use crate::kernel::placement::Placement;
use crate::kernel::restore::spec_json;
use crate::kernel::syscalls::KernelSyscalls;
use crate::kernel::{Caller, Kernel};
use crate::mailbox::Mailbox;
use crate::process::Supervision;
use crate::process::{Entry, NewProc, ProcShared};
use crate::runtime::Maker;
use crate::store::{BucketKind, Write};

/// How long a spawn on a node of a cluster waits for its directory listing.
const LISTING_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl Kernel {
    /// Creates a child of `request.parent`, acting as `caller`.
    ///
    /// Refused when: the name is empty or malformed; the runtime is unknown;
    /// the caller is not the parent (or the admin); the parent is not alive;
    /// the parent lacks `spawn_children`; a tool is not the parent's or needs
    /// a capability the child does not get; the child's tier is above the
    /// parent's; the child would be deeper than allowed; the parent has its
    /// maximum of live children; a requested limit exceeds the parent's.
    /// Refusals by policy are also reported as `denied` events of the parent.
    ///
    /// With a store, it answers once the child's spawn request is committed,
    /// so a child whose PID was answered comes back after a crash.
    pub async fn spawn(&self, caller: Caller, request: SpawnRequest) -> Result<Pid> {
        let request = asked_under(caller, request);
        self.spawn_at(caller, request, None).await
    }

    /// [`Kernel::spawn`] here, for a spawn `placement` placed on this node
    /// (kept with its spec, so that a move after a node loss honours it).
    pub(crate) async fn spawn_at(
        &self,
        caller: Caller,
        request: SpawnRequest,
        placement: Option<&Placement>,
    ) -> Result<Pid> {
        let birth = Birth::New { acknowledged: true };
        match self.inner.traces() {
            None => {
                self.spawn_placed_as(caller, request, birth, placement)
                    .await
            }
            Some(_) => Box::pin(self.spawn_traced(caller, request, birth, placement)).await,
        }
    }

    /// [`Kernel::spawn`] for a process's own `spawn` syscall: answers without
    /// waiting for the commit. The request is queued before anything the
    /// caller writes later (its conversation, a message naming the child),
    /// so whatever of the caller survives a crash finds the child back too.
    pub(crate) async fn spawn_queued(&self, caller: Caller, request: SpawnRequest) -> Result<Pid> {
        let request = asked_under(caller, request);
        let birth = Birth::New {
            acknowledged: false,
        };
        match self.inner.traces() {
            None => self.spawn_as(caller, request, birth).await,
            Some(_) => Box::pin(self.spawn_traced(caller, request, birth, None)).await,
        }
    }

    /// [`Kernel::spawn_as`] in a `create_agent` span, when the kernel
    /// exports traces: a new process, asked for by a caller. Spawn is a hot
    /// path: without traces its future is what it was, and with them this
    /// one is boxed.
    async fn spawn_traced(
        &self,
        caller: Caller,
        request: SpawnRequest,
        birth: Birth,
        placement: Option<&Placement>,
    ) -> Result<Pid> {
        let Some(traces) = self.inner.traces() else {
            return self
                .spawn_placed_as(caller, request, birth, placement)
                .await;
        };
        let mut span = traces.create_agent(crate::trace::current(), &request);
        let spawned = self
            .spawn_placed_as(caller, request, birth, placement)
            .await;
        crate::otel::Traces::created(&mut span, &spawned);
        spawned
    }

    /// Spawns a process that comes to be as `birth` says.
    pub(crate) async fn spawn_as(
        &self,
        caller: Caller,
        request: SpawnRequest,
        birth: Birth,
    ) -> Result<Pid> {
        self.spawn_placed_as(caller, request, birth, None).await
    }

    /// [`Kernel::spawn_as`], for a spawn `placement` put on this node.
    async fn spawn_placed_as(
        &self,
        caller: Caller,
        mut request: SpawnRequest,
        birth: Birth,
        placement: Option<&Placement>,
    ) -> Result<Pid> {
        self.check_running()?;
        validate_name(&request.name)?;
        self.inner.settings().limits.check_spawn(&request)?;
        if request.role == Role::Kernel {
            return Err(KernelError::InvalidArgument(
                "role kernel is reserved for PID 1".into(),
            ));
        }
        self.mcp().check_tools(&request.tools)?;
        // A working directory is read-granted to a sandboxed command and
        // created if missing: the admin's to choose, not a process's.
        if let Caller::Process(me) = caller
            && request.exec.as_ref().is_some_and(|exec| exec.cwd.is_some())
        {
            return Err(KernelError::PermissionDenied(format!(
                "process {me} may not choose an exec command's working directory (cwd); \
                 only the admin may"
            )));
        }
        let requested = match (&request.runtime, &request.exec) {
            (Some(name), _) => name.as_str(),
            (None, Some(_)) => EXEC_RUNTIME,
            (None, None) => self.inner.settings().default_runtime.as_str(),
        };
        // A process that names no model gets the default (an exec command
        // calls none through the kernel).
        if request.model.is_empty()
            && requested != EXEC_RUNTIME
            && let Some(default) = &self.inner.settings().models.default_model
        {
            request.model = default.clone();
        }
        self.check_model_choice(caller, &request.model)?;
        let supervision = self.supervision_for(&request)?;
        // On a node of a cluster, a process its supervisor would start
        // again (not `temporary`) may move after a loss: its spec and
        // mail are the cluster's (a spawned one only under a parent that
        // moves too: `admit` decides).
        let may_move = self.inner.cluster().is_some()
            && match birth {
                Birth::Declared(_) | Birth::Replaced(_) => true,
                Birth::New { .. } | Birth::Restored(_) => {
                    supervision.0.policy != RestartPolicy::Temporary
                }
            };
        let kept_in_cluster = may_move && matches!(birth, Birth::New { .. });
        // Kept before the request is taken apart; only by a kernel that keeps it.
        let spec = match birth {
            Birth::New { .. } if self.inner.store().is_durable() || kept_in_cluster => {
                Some(spec_json(&request))
            }
            _ => None,
        };
        let (runtime_name, maker) = self
            .inner
            .runtimes()
            .maker(requested, request.exec.take())?;
        // A node of a cluster takes a new PID from its cluster-wide blocks
        // (waiting only when a burst used them up).
        let assigned = match (self.inner.cluster(), &birth) {
            (Some(cluster), Birth::New { .. } | Birth::Declared(None)) => {
                Some(Pid(cluster.pids().next().await.map_err(|err| {
                    KernelError::ClusterUnavailable(err.to_string())
                })?))
            }
            _ => None,
        };
        let parent = request.parent;
        // A parent on another node lends what its child takes from it, and
        // holds a child slot for it there.
        let tokens = request.limits.max_tokens_total;
        let lent = match (assigned, birth) {
            (_, Birth::Restored(pid)) if self.inner.cluster().is_some() => {
                Box::pin(self.node().borrow_parent(parent, pid, true, tokens)).await?
            }
            (Some(pid), _) => {
                Box::pin(self.node().borrow_parent(parent, pid, false, tokens)).await?
            }
            _ => None,
        };
        let admitted = Admitted {
            runtime_name,
            maker,
            supervision,
            birth,
            assigned,
            may_move,
            lent: lent.as_ref(),
        };
        let admitted = self.admit(caller, request, admitted);
        // A new child's slot and loan are freed; a child coming back keeps
        // them (its parent hears that it did not come back).
        if admitted.is_err()
            && let (Some(lent), Some(pid), Birth::New { .. }) = (&lent, assigned, birth)
        {
            Box::pin(self.node().give_back(lent.pid, pid)).await;
        }
        let (pid, launch, spec_in_cluster) =
            self.report_denial(Caller::Process(parent), "spawn", admitted)?;
        // In memory there is nothing to wait for, and spawn is a hot path.
        if self.inner.store().is_durable()
            && assigned.is_none()
            && let Err(err) = self.inner.pids().committed(self.inner.store(), pid.0).await
        {
            tracing::error!(%pid, error = %err, "store: PID reservation not committed");
        }
        let in_cluster = match (&spec, self.inner.cluster()) {
            (Some(spec), Some(cluster)) if kept_in_cluster && spec_in_cluster => {
                let placement = placement.cloned().unwrap_or_default();
                Some((
                    cluster,
                    cluster.spec_here(parent, placement.node, placement.labels, spec.clone()),
                ))
            }
            _ => None,
        };
        if let Some(spec) = spec.filter(|_| self.inner.store().is_durable()) {
            let kept = self.inner.store().commit(Write::Spec { pid, spec });
            if matches!(birth, Birth::New { acknowledged: true })
                && let Err(err) = kept.await
            {
                tracing::error!(%pid, error = %err, "store: spawn request not committed");
            }
        }
        // Where the node that takes the process over after a loss finds it.
        if let Some((cluster, kept)) = in_cluster
            && let Err(err) = cluster.keep_spec(pid, &kept).await
        {
            tracing::error!(%pid, error = %err, "cluster: spawn spec not kept; the process does not move if its node is lost");
        }
        // A node of a cluster answers once every node can find the child.
        if let Some(cluster) = self.inner.cluster()
            && matches!(birth, Birth::New { acknowledged: true })
            && tokio::time::timeout(LISTING_WAIT, cluster.publish(pid))
                .await
                .is_err()
        {
            tracing::warn!(%pid, "cluster: the directory did not list the new process in time");
        }
        // Listed now: a parent elsewhere that ended meanwhile finds it.
        if lent.is_some() && matches!(birth, Birth::New { .. }) {
            Box::pin(self.node().confirm_child(parent, pid)).await;
        }
        if let Some(launch) = launch {
            self.exec().launch(launch).await;
        }
        Ok(pid)
    }

    /// The checks that need the table, then the insert; sync, so the table
    /// lock can never be held across an await.
    fn admit(
        &self,
        caller: Caller,
        request: SpawnRequest,
        admitted: Admitted<'_>,
    ) -> Result<(Pid, Option<Launch>, bool)> {
        let Admitted {
            runtime_name,
            maker,
            supervision: (restart, strategy),
            birth,
            assigned,
            may_move,
            lent,
        } = admitted;
        let parent = request.parent;
        let mut table = self.inner.table().write();
        // Checked again under the lock: shutdown's last pass holds it too.
        self.check_running()?;
        let from = match lent {
            Some(lent) => Grantor::lent(lent),
            None => Grantor::of(parent, table.get(parent))?,
        };
        if let Caller::Process(me) = caller
            && me != parent
        {
            return Err(KernelError::PermissionDenied(format!(
                "process {me} may only spawn its own children, not children of {parent}"
            )));
        }
        let parent_caps = from.caps;
        if !parent_caps.contains(Capability::SpawnChildren) {
            return Err(KernelError::MissingCapability {
                pid: parent,
                role: from.role,
                capability: Capability::SpawnChildren,
                action: "spawn children",
            });
        }
        let grant = ChildGrant {
            parent,
            parent_role: from.role,
            parent_caps,
            parent_tools: from.tools,
            role_caps: self.inner.role_capabilities(request.role),
        };
        let caps = grant.check(request.role, &request.tools, self.inner.runtimes())?;
        let approvals = approval_rules(
            from.approvals,
            self.inner
                .role(request.role)
                .map(|r| r.approval)
                .unwrap_or_default(),
            &request.approval,
        );
        let skill_dirs = skill_dirs(from.skill_dirs, &request.skills);
        let tier = request.tier.unwrap_or(from.tier);
        if tier.rank() > from.tier.rank() {
            return Err(KernelError::TierAboveParent {
                child: tier.as_str(),
                parent: from.tier.as_str(),
            });
        }
        // A spawned process moves with its tree: under PID 1, or under a
        // parent that moves (a config agent's children do not follow it).
        let spec_in_cluster = may_move
            && matches!(birth, Birth::New { .. } | Birth::Restored(_))
            && (parent == Pid::KERNEL || from.spec_in_cluster);
        let moves = may_move
            && (spec_in_cluster || !matches!(birth, Birth::New { .. } | Birth::Restored(_)));
        // Lent by a peer: no overflow, whatever it says.
        let depth = from.depth.saturating_add(1);
        let kernel_max_depth = self.inner.settings().max_depth;
        if depth > kernel_max_depth {
            return Err(KernelError::DepthExceeded {
                parent,
                depth,
                why: format!("beyond the kernel's max_depth {kernel_max_depth}"),
            });
        }
        let plimits = from.limits;
        if plimits.max_depth == 0 {
            return Err(KernelError::DepthExceeded {
                parent,
                depth,
                why: format!("process {parent} allows no levels below it (max_depth 0)"),
            });
        }
        // A lent parent holds the child's slot on its own node already; so
        // does a parent here for a child coming back to it.
        let held = match birth {
            Birth::Restored(pid) => table
                .get(parent)
                .is_some_and(|entry| entry.children.contains(pid)),
            _ => false,
        };
        if let Some(count) = from.live_children
            && count >= plimits.max_children
            && !held
        {
            return Err(KernelError::TooManyChildren {
                parent,
                count,
                max: plimits.max_children,
            });
        }
        let limits = narrow_limits(&plimits, &request)?;
        let lender = from.lender.cloned();
        if let Some(amount) = limits.max_tokens_total {
            if matches!(caller, Caller::Process(_))
                && !parent_caps.contains(Capability::BudgetAllocate)
            {
                return Err(KernelError::MissingCapability {
                    pid: parent,
                    role: from.role,
                    capability: Capability::BudgetAllocate,
                    action: "give a child its own token budget",
                });
            }
            // Checked before a PID is taken, so a refusal uses none.
            if let Some(lender) = &lender {
                lender.can_lend(amount)?;
            }
        }
        if matches!(caller, Caller::Process(_))
            && let Some(usage) = from.usage
        {
            let what = format!("process {parent} may not spawn now");
            let level = usage.take_spawn(plimits.spawns_per_minute, &what)?;
            self.keep_bucket(parent, BucketKind::Spawns, level);
        }

        let pid = match birth {
            Birth::Declared(Some(pid)) | Birth::Restored(pid) | Birth::Replaced(pid) => pid,
            Birth::New { .. } | Birth::Declared(None) => assigned.unwrap_or_else(|| {
                Pid(self
                    .inner
                    .pids()
                    .take(self.inner.store(), self.inner.tracker()))
            }),
        };
        let budget = match limits.max_tokens_total {
            // Lent on its parent's node, which keeps the loan.
            Some(amount) if lent.is_some_and(|lent| lent.loaned) => {
                let node = lent.map(|lent| lent.node.clone()).unwrap_or_default();
                Some(Pool::on_loan(pid, amount, parent, node))
            }
            Some(amount) => match self.node().loan_back(pid, birth, amount, lender.as_ref()) {
                Some(loan) => Some(loan),
                None => Some(Pool::allocate(pid, amount, lender.as_ref())?),
            },
            None => lender,
        };
        let ctx = ProcessContext {
            pid,
            name: Arc::from(request.name.as_str()),
            role: request.role,
            tier,
            model: shared_str(&request.model, from.model),
            system_prompt: shared_str(&request.system_prompt, from.system_prompt),
            tools: shared_tools(request.tools, from.tools),
            workspace: Some(match request.workspace {
                Some(dir) => Workspace::At(Arc::from(dir)),
                None => Workspace::Under(self.inner.workspace_root().clone()),
            }),
            syscalls: Arc::new(KernelSyscalls::new(self.downgrade(), pid)),
        };
        let settings = &self.inner.settings();
        let (runtime, launch): (Arc<dyn Runtime>, _) = match maker {
            Maker::Factory(factory) => match factory.create(&ctx) {
                Ok(runtime) => (runtime, None),
                Err(err) => {
                    if let Some(pool) = &budget
                        && pool.owner() == pid
                    {
                        pool.close();
                    }
                    return Err(KernelError::InvalidArgument(format!(
                        "runtime {runtime_name}: {err}"
                    )));
                }
            },
            Maker::Exec(exec, command) => {
                let timeout = std::time::Duration::from_secs(limits.timeout_seconds.max(1));
                let (agent, launch) = exec.prepare(&ctx, command, timeout, &settings.data_dir);
                (Arc::new(agent), Some(launch))
            }
        };
        // One clock read for the start time and the spawned event.
        let now = unix_ms(SystemTime::now());
        let proc = Arc::new(ProcShared::new(NewProc {
            ctx,
            runtime_name,
            runtime: Some(runtime),
            limits,
            metadata: request.metadata,
            started_at_unix_ms: now,
            mailbox: new_mailbox(settings),
            usage: Default::default(),
            budget,
            caps,
            restored: matches!(birth, Birth::Restored(_) | Birth::Declared(Some(_))),
            mail_in_cluster: moves,
            spec_in_cluster,
            approvals,
            skill_dirs,
        }));
        // A child brought back to its parent's node after a loss holds its
        // slot already.
        if lent.is_none()
            && let Some(parent_entry) = table.get_mut(parent)
            && parent_entry.children.insert(pid)
        {
            parent_entry.live_children += 1;
        }
        let event = EventKind::Spawned {
            ppid: parent,
            name: proc.ctx.name.clone(),
            role: proc.ctx.role,
            tier,
            runtime: proc.runtime_name.clone(),
            restored: proc.restored,
        };
        let (children, live_children) = self.node().children_listed(&table, pid, birth);
        table.insert(
            pid,
            Entry {
                ppid: parent,
                depth,
                children,
                live_children,
                proc,
                exit: None,
                exit_waiters: None,
                sup: Supervision::for_spawn(restart, strategy),
            },
        );
        drop(table);
        self.inner.events().emit_at(pid, event, now);
        Ok((pid, launch, spec_in_cluster))
    }
}

/// How a process comes to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Birth {
    /// A new process; its spawn request is kept for restarts, and the spawn
    /// answers only once it is committed when `acknowledged`.
    New { acknowledged: bool },
    /// A config agent, as the PID it had when the store knows one (the
    /// caller makes sure no live process has it); the config keeps its spec.
    Declared(Option<Pid>),
    /// Back after a kernel restart as the PID it had, from its kept request.
    Restored(Pid),
    /// A config agent spawned again as its PID with a changed spec (a
    /// config reload); the config keeps its spec.
    Replaced(Pid),
}

/// What `admit` needs besides the request.
struct Admitted<'f> {
    runtime_name: Arc<str>,
    maker: Maker<'f>,
    supervision: (RestartSpec, Strategy),
    birth: Birth,
    /// The PID a cluster node took for a new process beforehand.
    assigned: Option<Pid>,
    /// It may move to another node after a loss, if its parent does.
    may_move: bool,
    /// What its parent on another node lent it.
    lent: Option<&'f ParentGrant>,
}

/// Parent `pid`'s row, when it may have a child spawned under it: alive,
/// and not waiting to be restarted.
pub(super) fn alive_parent(pid: Pid, entry: Option<&Entry>) -> Result<&Entry> {
    let entry = entry.ok_or(KernelError::NotFound(pid))?;
    if !entry.is_alive() {
        return Err(KernelError::ParentNotAlive {
            pid,
            state: "zombie",
        });
    }
    if entry.is_restarting() {
        return Err(KernelError::ParentNotAlive {
            pid,
            state: "restarting",
        });
    }
    Ok(entry)
}

/// What a spawn takes from the parent: read from its row of the table,
/// or lent by the node holding it (a child on another node).
struct Grantor<'a> {
    role: Role,
    tier: Tier,
    caps: Capabilities,
    tools: &'a Arc<[String]>,
    model: &'a Arc<str>,
    system_prompt: &'a Arc<str>,
    limits: Limits,
    depth: u32,
    approvals: Option<&'a Vec<ApprovalRule>>,
    skill_dirs: Option<&'a Arc<[std::path::PathBuf]>>,
    spec_in_cluster: bool,
    lender: Option<&'a Arc<Pool>>,
    /// Its live children, counted where it lives (`None`: lent, with the
    /// child's slot held there).
    live_children: Option<u32>,
    /// Its spawn rate, metered where it lives.
    usage: Option<&'a crate::usage::Meter>,
}

impl<'a> Grantor<'a> {
    /// Parent `pid`'s row, which must be alive and not restarting.
    fn of(pid: Pid, entry: Option<&'a Entry>) -> Result<Self> {
        let entry = alive_parent(pid, entry)?;
        let proc = &entry.proc;
        Ok(Grantor {
            role: proc.ctx.role,
            tier: proc.ctx.tier,
            caps: proc.caps,
            tools: &proc.ctx.tools,
            model: &proc.ctx.model,
            system_prompt: &proc.ctx.system_prompt,
            limits: proc.limits,
            depth: entry.depth,
            approvals: proc.approvals.as_deref(),
            skill_dirs: proc.skill_dirs.as_ref(),
            spec_in_cluster: proc.spec_in_cluster,
            lender: proc.budget.as_ref(),
            live_children: Some(entry.live_children),
            usage: Some(&proc.usage),
        })
    }

    /// What a parent on another node lent.
    fn lent(lent: &'a ParentGrant) -> Self {
        Grantor {
            role: lent.role,
            tier: lent.tier,
            caps: lent.caps,
            tools: &lent.tools,
            model: &lent.model,
            system_prompt: &lent.system_prompt,
            limits: lent.limits,
            depth: lent.depth,
            approvals: lent.approvals.as_ref(),
            skill_dirs: lent.skill_dirs.as_ref(),
            spec_in_cluster: lent.spec_in_cluster,
            lender: None,
            live_children: None,
            usage: None,
        }
    }
}

/// `value` shared instead of copied where it can be: the parent's when the
/// same (workers mostly run their parent's model), or the one empty string.
fn shared_str(value: &str, parent: &Arc<str>) -> Arc<str> {
    static EMPTY: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from(""));
    if value.is_empty() {
        EMPTY.clone()
    } else if value == &**parent {
        parent.clone()
    } else {
        Arc::from(value)
    }
}

impl Kernel {
    /// A process gives its child a model the config names or one on its
    /// own line (its own, its ancestors'), unless it holds `any_model`: a
    /// name it makes up would reach the provider, the prices and the
    /// metrics' labels.
    fn check_model_choice(&self, caller: Caller, model: &str) -> Result<()> {
        let Caller::Process(me) = caller else {
            return Ok(());
        };
        let names = &self.inner.settings().models;
        if model.is_empty() || names.is_configured(model) {
            return Ok(());
        }
        let (free, on_line) = {
            let table = self.inner.table().read();
            let free = table
                .get(me)
                .is_some_and(|entry| entry.proc.caps.contains(Capability::AnyModel));
            let line = table.lineage(me).unwrap_or_default();
            let on_line = line
                .iter()
                .filter_map(|pid| table.get(*pid))
                .any(|entry| &*entry.proc.ctx.model == model);
            (free, on_line)
        };
        if free || on_line {
            return Ok(());
        }
        let mut named: Vec<&str> = names.configured.iter().map(String::as_str).collect();
        named.extend(names.models.keys().map(String::as_str));
        named.extend(names.default_model.as_deref());
        named.sort_unstable();
        named.dedup();
        let named = match named.is_empty() {
            true => "none".to_owned(),
            false => named.join(", "),
        };
        Err(KernelError::PermissionDenied(format!(
            "process {me} may not give a child the model {}: it is not one the config names \
             ({named}) nor one on its own line; name one of those, or grant its role any_model",
            crate::error::shown(model)
        )))
    }
}

/// [`shared_str`] for a tool list.
fn shared_tools(tools: Vec<String>, parent: &Arc<[String]>) -> Arc<[String]> {
    static NONE: LazyLock<Arc<[String]>> = LazyLock::new(|| Arc::from(Vec::new()));
    if tools.is_empty() {
        NONE.clone()
    } else if tools == **parent {
        parent.clone()
    } else {
        Arc::from(tools)
    }
}

/// Refuses a name [`check_name`] refuses.
pub(crate) fn validate_name(name: &str) -> Result<()> {
    check_name(name).map_err(|why| KernelError::InvalidArgument(format!("name {why}")))
}

/// The child's limits: requested values, which may not exceed the parent's;
/// unrequested ones inherit (max_depth one level narrower than the parent's).
fn narrow_limits(parent: &Limits, request: &SpawnRequest) -> Result<Limits> {
    fn pick<T: Copy + Into<u64> + PartialOrd>(
        field: &'static str,
        requested: Option<T>,
        allowed: T,
        zero: T,
    ) -> Result<T> {
        match requested {
            None => Ok(allowed),
            Some(v) if v > allowed => Err(KernelError::LimitExceedsParent {
                field,
                requested: v.into(),
                allowed: allowed.into(),
            }),
            Some(v) if v == zero && field != "max_depth" && field != "max_children" => Err(
                KernelError::InvalidArgument(format!("limit {field} must be at least 1")),
            ),
            Some(v) => Ok(v),
        }
    }
    let r = &request.limits;
    let rate =
        |field: &'static str, requested: Option<u32>, allowed: Option<std::num::NonZeroU32>| {
            let Some(requested) = requested else {
                return Ok(allowed);
            };
            let Some(requested) = std::num::NonZeroU32::new(requested) else {
                return Err(KernelError::InvalidArgument(format!(
                    "limit {field} must be at least 1 (leave it out for the parent's)"
                )));
            };
            match allowed {
                Some(max) if requested > max => Err(KernelError::LimitExceedsParent {
                    field,
                    requested: requested.get().into(),
                    allowed: max.get().into(),
                }),
                _ => Ok(Some(requested)),
            }
        };
    Ok(Limits {
        max_tokens_total: match r.max_tokens_total {
            Some(0) => {
                return Err(KernelError::InvalidArgument(
                    "limit max_tokens_total must be at least 1 (leave it out to draw on the \
                     parent's budget)"
                        .into(),
                ));
            }
            requested => requested,
        },
        spawns_per_minute: rate(
            "spawns_per_minute",
            r.spawns_per_minute,
            parent.spawns_per_minute,
        )?,
        llm_calls_per_minute: rate(
            "llm_calls_per_minute",
            r.llm_calls_per_minute,
            parent.llm_calls_per_minute,
        )?,
        max_storage_bytes: match r.max_storage_bytes {
            None => None,
            Some(bytes) => Some(std::num::NonZeroU64::new(bytes).ok_or_else(|| {
                KernelError::InvalidArgument(
                    "limit max_storage_bytes must be at least 1 (leave it out to count toward \
                     the nearest ancestor's quota)"
                        .into(),
                )
            })?),
        },
        max_children: pick("max_children", r.max_children, parent.max_children, 0)?,
        max_depth: pick(
            "max_depth",
            r.max_depth,
            parent.max_depth.saturating_sub(1),
            0,
        )?,
        timeout_seconds: pick(
            "timeout_seconds",
            r.timeout_seconds,
            parent.timeout_seconds,
            0,
        )?,
        max_concurrent_tasks: pick(
            "max_concurrent_tasks",
            r.max_concurrent_tasks,
            parent.max_concurrent_tasks,
            0,
        )?,
    })
}

/// An empty mailbox sized by `settings`.
pub(super) fn new_mailbox(settings: &crate::config::KernelSettings) -> Mailbox {
    Mailbox::new(
        settings.mailbox_capacity,
        settings.mailbox_max_bytes,
        std::time::Duration::from_millis(settings.mailbox_aging_ms),
    )
}

/// A child's skill directories: its parent's, then its own (which win), each once.
fn skill_dirs(
    parent: Option<&Arc<[std::path::PathBuf]>>,
    own: &[std::path::PathBuf],
) -> Option<Arc<[std::path::PathBuf]>> {
    if own.is_empty() {
        return parent.cloned();
    }
    let inherited = parent.map(|dirs| dirs.iter()).into_iter().flatten();
    let dirs: Vec<std::path::PathBuf> = inherited
        .filter(|dir| !own.contains(dir))
        .chain(own)
        .cloned()
        .collect();
    Some(Arc::from(dirs))
}

/// A child's approval rules: its parent's, its role's and its own, each
/// once, in that order; `None` when there are none.
/// `request` with the approval rules the caller's work was asked under
/// added to its own (kernel/asked.rs): a child spawned for a requester
/// works under the requester's rules too.
fn asked_under(caller: Caller, mut request: SpawnRequest) -> SpawnRequest {
    if let Caller::Process(_) = caller {
        join(&mut request.approval, &crate::trace::approvals());
    }
    request
}

fn approval_rules(
    parent: Option<&Vec<ApprovalRule>>,
    role: Vec<ApprovalRule>,
    own: &[ApprovalRule],
) -> Option<Arc<Vec<ApprovalRule>>> {
    let mut rules: Vec<ApprovalRule> = parent.cloned().unwrap_or_default();
    join(&mut rules, &role);
    join(&mut rules, own);
    (!rules.is_empty()).then(|| Arc::new(rules))
}
