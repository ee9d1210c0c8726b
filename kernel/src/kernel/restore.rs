//! Coming back after a restart: config agents keep their PIDs, every other
//! process alive before comes back from its kept spawn request as the PID
//! it had, with its usage, budget, restart history and rate limits; what
//! cannot come back is recorded dead, acknowledged messages are delivered,
//! turns that waited for a person carry on waiting, and unanswered
//! requests are failed.
//!
//! The order matters: [`Kernel::spawn_declared`] for every config agent
//! first (kernel/declared.rs), then [`Kernel::restore`] once, before the control plane opens.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hivekernel_agents::{
    ExecCommand, ExitRecord, MessageId, Pid, RestartPolicy, SpawnRequest, TraceContext,
};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use futures::StreamExt;

use crate::cluster::SpecKey;
use crate::events::{EventKind, ReapCause, unix_ms};
use crate::inbox::InboxRequest;
use crate::kernel::mail::Kept;
use crate::kernel::spawn::Birth;
use crate::kernel::supervisor::EXIT_KILLED;
use crate::kernel::{Caller, Kernel};
use crate::mailbox::{Envelope, Item, ReplyTo, Resume};
use crate::store::{
    BucketKind, Counter, Recovered, StoredInbox, StoredProcess, StoredUsage, Write,
};
use crate::trace::Origin;

/// Roots whose keys a restarted node takes back at once.
const RECLAIMS_AT_ONCE: usize = 32;

/// Why processes that did not come back are dead.
pub const KERNEL_RESTART: &str = "kernel restart";

/// What coming back after a restart did (see [`Started::restored`](super::Started)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restored {
    /// Processes alive before the restart that came back from their kept
    /// spawn request (config agents not counted).
    pub processes: usize,
    /// Processes alive before the restart that did not come back.
    pub ended: usize,
    /// Acknowledged messages put back into mailboxes.
    pub requeued: usize,
    /// Messages whose receiver did not come back (or that expired meanwhile).
    pub dropped: usize,
    /// Unanswered requests reported failed to their requesters.
    pub failed_requests: usize,
    /// Turns that waited for a person, resumed (their requests pending again).
    pub resumed: usize,
    /// Inbox requests withdrawn: their process or their turn did not come back.
    pub withdrawn: usize,
}

impl Kernel {
    /// Keeps the `level` a rate-limit bucket of `pid` was left at, so a
    /// restart does not refill it (nothing without a limit or a store).
    pub(crate) fn keep_bucket(&self, pid: Pid, kind: BucketKind, level: Option<f64>) {
        let store = self.inner.store();
        if let Some(level) = level
            && store.is_durable()
        {
            let at_ms = unix_ms(SystemTime::now());
            store.submit(Write::Bucket {
                pid,
                kind,
                level,
                at_ms,
            });
        }
    }

    /// Every process alive before the restart that is not back yet (the
    /// config agents are) and whose spawn request the store kept, spawned
    /// again as the PID it had, parents before children. Answers why each
    /// one that could not come back did not, and which of those another
    /// node reported ended already.
    ///
    /// On a node of a cluster whose previous start (`earlier_epoch`) another
    /// node declared lost, its `temporary` processes stay dead: that node
    /// reported them ended (`node_lost`) when it judged the loss.
    async fn respawn(
        &self,
        processes: &[StoredProcess],
        earlier_epoch: u64,
    ) -> (usize, HashMap<Pid, String>, HashSet<Pid>) {
        let mut back = 0;
        let mut failed = HashMap::new();
        let mut reported = HashSet::new();
        let restore_temporary = self.inner.settings().restore_temporary;
        let cluster = self.inner.cluster();
        let lost_by = match cluster {
            Some(cluster) if earlier_epoch != 0 && earlier_epoch != cluster.epoch() => cluster
                .loss_claimant(cluster.node(), earlier_epoch)
                .await
                .filter(|by| by != cluster.node() && by != crate::cluster::FORGOTTEN_BY),
            _ => None,
        };
        // On a node of a cluster a tree is this node's while its root's
        // key says so (another node may have taken it over): every root's
        // key is taken back at once, before the first spawn.
        let mut reclaimed: HashMap<Pid, std::result::Result<bool, String>> = HashMap::new();
        if let Some(cluster) = cluster {
            // A root: under PID 1, or under a parent on another node. Only
            // roots that move have keys (a temporary one has none).
            let here: std::collections::HashSet<Pid> = processes.iter().map(|p| p.pid).collect();
            let roots: Vec<Pid> = processes
                .iter()
                .filter(|p| {
                    p.pid != Pid::KERNEL && (p.ppid == Pid::KERNEL || !here.contains(&p.ppid))
                })
                .filter(|p| {
                    p.spec
                        .as_deref()
                        .and_then(|spec| read_spec(spec, p.ppid).ok())
                        .is_some_and(|request| self.may_move(&request))
                })
                .map(|p| p.pid)
                .collect();
            let cluster = cluster.clone();
            reclaimed = futures::stream::iter(roots)
                .map(move |pid| {
                    let cluster = cluster.clone();
                    async move { (pid, reclaim(&cluster, pid).await) }
                })
                .buffer_unordered(RECLAIMS_AT_ONCE)
                .collect()
                .await;
        }
        for process in in_tree_order(processes) {
            let pid = process.pid;
            if pid == Pid::KERNEL || self.inner.table().read().get(pid).is_some() {
                continue;
            }
            let Some(spec) = &process.spec else {
                // A config agent no longer in the config, or kept by an older kernel.
                continue;
            };
            let request = match read_spec(spec, process.ppid) {
                Ok(request) => request,
                Err(why) => {
                    tracing::warn!(%pid, error = %why, "cannot read the kept spawn request; process recorded dead");
                    failed.insert(pid, format!("its kept spawn request is unreadable: {why}"));
                    continue;
                }
            };
            let temporary = self
                .supervision_for(&request)
                .is_ok_and(|(spec, _)| spec.policy == RestartPolicy::Temporary);
            if temporary && let Some(by) = &lost_by {
                tracing::info!(%pid, name = %process.name, by = %by, "temporary process stays dead: node {by} declared this node's earlier start lost and reported it ended");
                failed.insert(
                    pid,
                    format!("temporary, and node {by} declared this node's earlier start lost"),
                );
                reported.insert(pid);
                continue;
            }
            if temporary && !restore_temporary {
                failed.insert(
                    pid,
                    "temporary, and kernel.restore_temporary is false".to_owned(),
                );
                continue;
            }
            // Whether its key names this node's new epoch already.
            let claimed = match reclaimed.remove(&pid) {
                Some(Err(why)) => {
                    tracing::info!(%pid, name = %process.name, why, "process not brought back");
                    failed.insert(pid, why);
                    continue;
                }
                Some(Ok(claimed)) => claimed,
                None => false,
            };
            // Only a process that moves has mail in the cluster: under PID 1
            // or a parent that moves, as spawn decides (a parent on another
            // node is read when it lends; what waits is read in case).
            let moving = cluster.is_some()
                && self.may_move(&request)
                && (process.ppid == Pid::KERNEL
                    || self
                        .inner
                        .table()
                        .read()
                        .get(process.ppid)
                        .is_none_or(|entry| entry.proc.spec_in_cluster));
            let letters = self.node().letters_for(moving.then_some(pid)).await;
            match self
                .spawn_as(Caller::Admin, request, Birth::Restored(pid))
                .await
            {
                Ok(_) => {
                    back += 1;
                    self.node().deliver_letters(letters);
                    let moves = self
                        .inner
                        .table()
                        .read()
                        .get(pid)
                        .is_some_and(|entry| entry.proc.spec_in_cluster);
                    if let Some(cluster) = cluster
                        && moves
                        && !claimed
                    {
                        let kept =
                            cluster.spec_here(process.ppid, None, BTreeMap::new(), spec.clone());
                        if let Err(err) = cluster.keep_spec(pid, &kept).await {
                            tracing::warn!(%pid, error = %err, "cluster: spec of a process brought back not kept");
                        }
                    }
                }
                Err(err) => {
                    tracing::warn!(%pid, name = %process.name, error = %err, "process did not come back after the restart");
                    failed.insert(pid, err.to_string());
                }
            }
        }
        (back, failed, reported)
    }

    /// Everyone back carries on with the usage, budget, restart history and
    /// rate limits it had. A budget's spending is split as it was: what
    /// the live children it lent to spent is theirs (the loan covers it),
    /// the rest its own. A budget added to the config since starts whole.
    fn carry_kept(&self, recovered: &Recovered) {
        let now = Instant::now();
        let now_ms = unix_ms(SystemTime::now());
        let at = |ms: u64| now.checked_sub(Duration::from_millis(now_ms.saturating_sub(ms)));
        let durable = self.inner.store().is_durable();
        let mut pending_done = Vec::new();
        let mut table = self.inner.table().write();
        // What each budget's live borrowers spent, by lender.
        let mut borrowed: HashMap<Pid, u64> = HashMap::new();
        for (pid, entry) in table.iter() {
            if let Some(pool) = entry.proc.own_budget()
                && let Some(lender) = pool.lender_owner()
                && let Some(spent) = recovered.usage.get(&pid).and_then(|u| u.budget_spent)
            {
                *borrowed.entry(lender).or_default() += spent;
            }
        }
        let pids: Vec<Pid> = table
            .iter()
            .filter(|(pid, _)| *pid != Pid::KERNEL)
            .map(|(pid, _)| pid)
            .collect();
        for pid in pids {
            let Some(entry) = table.get_mut(pid) else {
                continue;
            };
            if let Some(kept) = recovered.usage.get(&pid) {
                carry_usage(entry, kept, borrowed.get(&pid).copied());
            }
            let Some(history) = recovered.history.get(&pid) else {
                continue;
            };
            entry.proc.usage.restore_buckets(
                history
                    .llm_bucket
                    .and_then(|(level, ms)| Some((level, at(ms)?))),
                history
                    .spawn_bucket
                    .and_then(|(level, ms)| Some((level, at(ms)?))),
            );
            if let Some(sup) = entry.sup.as_mut() {
                // A restart decided before the crash is this comeback.
                let restarts = history.restarts.saturating_add(u32::from(history.pending));
                let recent = history.recent_ms.iter().filter_map(|&ms| at(ms));
                sup.carry(restarts, recent, history.last_exit.clone());
            }
            if history.pending && durable {
                pending_done.push(entry.history_write(pid, false));
            }
        }
        drop(table);
        self.inner.store().submit_all(pending_done);
    }

    /// Settles what the store remembers from before the restart, once the
    /// config agents are back: every other process comes back, then
    /// messages and requests.
    pub(crate) async fn restore(&self, recovered: Recovered) -> Restored {
        let mut restored = Restored::default();
        if let Some(cluster) = self.inner.cluster() {
            self.inner.store().submit(Write::Reserve {
                counter: Counter::NodeEpoch,
                until: cluster.epoch(),
            });
        }
        let earlier_epoch = recovered.next(Counter::NodeEpoch);
        let (back, failed, reported) = self.respawn(&recovered.processes, earlier_epoch).await;
        restored.processes = back;
        self.carry_kept(&recovered);
        self.node().reopen_loans().await;
        let alive: HashSet<Pid> = {
            let table = self.inner.table().read();
            table
                .iter()
                .filter(|(pid, entry)| *pid != Pid::KERNEL && entry.is_alive())
                .map(|(pid, _)| pid)
                .collect()
        };
        let now = unix_ms(SystemTime::now());

        // Alive before, not back now: dead, and their parents are told.
        let plain: Arc<str> = KERNEL_RESTART.into();
        let mut events = Vec::new();
        for process in recovered
            .processes
            .iter()
            .filter(|p| !alive.contains(&p.pid))
        {
            restored.ended += 1;
            // Its end was published by the node that judged the loss,
            // which told its parent too.
            if reported.contains(&process.pid) {
                continue;
            }
            let reason = match failed.get(&process.pid) {
                Some(why) => Arc::from(format!("{KERNEL_RESTART}: did not come back: {why}")),
                None => plain.clone(),
            };
            events.push((
                process.pid,
                EventKind::Exited {
                    ppid: process.ppid,
                    name: process.name.as_str().into(),
                    exit_code: EXIT_KILLED,
                    reason: reason.clone(),
                },
            ));
            events.push((
                process.pid,
                EventKind::Reaped {
                    by: ReapCause::KernelRestart,
                },
            ));
            // A parent here, or on another node (whose slot it frees).
            if alive.contains(&process.ppid) || self.node().held_elsewhere(process.ppid).is_some() {
                self.tell_parent(process.pid, process.ppid, &process.name, &reason, now);
            }
        }
        // Zombies nobody collected before the restart are gone with it.
        events.extend(
            recovered
                .zombies
                .iter()
                .filter(|pid| !alive.contains(pid))
                .map(|pid| {
                    let kind = EventKind::Reaped {
                        by: ReapCause::KernelRestart,
                    };
                    (*pid, kind)
                }),
        );
        self.inner.events().emit_all(events);

        // Acknowledged, undelivered messages: back into their mailboxes, once.
        for stored in recovered.messages {
            let receiver = self
                .inner
                .table()
                .read()
                .get(stored.to)
                .filter(|entry| alive.contains(&stored.to) && entry.is_alive())
                .map(|entry| entry.proc.clone());
            let kept = Kept {
                id: stored.id,
                to: stored.to,
                message: stored.message,
                expires_ms: stored.expires_ms,
            };
            let absent = || format!("process {} did not come back after the restart", stored.to);
            match self.node().requeue(kept, receiver, now, absent) {
                true => restored.requeued += 1,
                false => restored.dropped += 1,
            }
        }

        let answering = self.resume_turns(recovered.inbox, &alive, &mut restored);

        // Requests nobody answered before the restart: failed, not lost,
        // and the event log says which; a resumed turn answers its own.
        for request in recovered
            .requests
            .into_iter()
            .filter(|request| !answering.contains(&request.id))
        {
            restored.failed_requests += 1;
            let error = format!(
                "{KERNEL_RESTART}: process {} did not answer before the kernel stopped",
                request.to
            );
            self.inner.events().emit(
                request.to,
                EventKind::TaskFinished {
                    request_id: request.id,
                    from: request.from,
                    success: false,
                    duration_ms: 0,
                    error: Some(Arc::from(error.as_str())),
                },
            );
            self.deliver_reply(
                request.to,
                request.id,
                ReplyTo::Mailbox(request.from),
                Err(error),
            );
        }
        restored
    }
}

impl Kernel {
    /// Whether a process spawned from `request` moves with its tree after
    /// a node loss, as far as its own restart policy says (not
    /// `temporary`).
    fn may_move(&self, request: &SpawnRequest) -> bool {
        self.supervision_for(request)
            .is_ok_and(|(spec, _)| spec.policy != RestartPolicy::Temporary)
    }

    /// Tells live parent `ppid` that its child `pid` (`name`) ended for
    /// `reason` while its kernel was away (`child_exited`, exit code 137).
    pub(super) fn tell_parent(&self, pid: Pid, ppid: Pid, name: &str, reason: &str, now: u64) {
        let record = ExitRecord {
            pid,
            ppid,
            name: name.to_owned(),
            exit_code: EXIT_KILLED,
            output: String::new(),
            reason: reason.to_owned(),
            exited_at_unix_ms: now,
        };
        self.tell_child_exited(&record, None);
    }

    /// Reports that `pid` (`name`, a child of `ppid`), which lived on a
    /// node now lost, ended for `reason` (an `exited` event here; its
    /// parent told when it lives here).
    pub(super) fn report_ended(&self, pid: Pid, ppid: Pid, name: &str, reason: &str, now: u64) {
        self.inner.events().emit(
            pid,
            EventKind::Exited {
                ppid,
                name: name.into(),
                exit_code: EXIT_KILLED,
                reason: reason.into(),
            },
        );
        let parent_here = self
            .inner
            .table()
            .read()
            .get(ppid)
            .is_some_and(|entry| entry.is_alive());
        if ppid != Pid::KERNEL && parent_here {
            // A child it held a slot for elsewhere, gone with its node.
            self.node().release_child(ppid, pid);
            self.tell_parent(pid, ppid, name, reason, now);
        }
    }

    /// Files again the inbox requests pending before the restart and
    /// resumes the turns that waited for them; a request whose process or
    /// turn did not come back is withdrawn. Answers the `delegate_async`
    /// requests the resumed turns answer.
    fn resume_turns(
        &self,
        rows: Vec<StoredInbox>,
        alive: &HashSet<Pid>,
        restored: &mut Restored,
    ) -> HashSet<hivekernel_agents::RequestId> {
        let mut answering = HashSet::new();
        for row in rows {
            let request = match serde_json::from_str::<InboxRequest>(&row.request) {
                Ok(request) if request.id == row.id && request.pid == row.pid => request,
                Ok(_) | Err(_) => {
                    tracing::warn!(request = row.id, pid = %row.pid, "kept inbox request unreadable; dropped");
                    self.inner.store().submit(Write::InboxDone(row.id));
                    restored.withdrawn += 1;
                    continue;
                }
            };
            let proc = self
                .inner
                .table()
                .read()
                .get(row.pid)
                .filter(|entry| alive.contains(&row.pid) && entry.is_alive())
                .map(|entry| entry.proc.clone());
            let trace = request.trace.map(|trace_id| TraceContext {
                trace_id,
                ..TraceContext::new_root()
            });
            let approvals = hivekernel_agents::approval::Carried::from(request.asked_under.clone());
            self.inbox().refile(request);
            let (Some(proc), Some(checkpoint)) = (proc, row.checkpoint) else {
                self.inbox().withdraw(row.id, KERNEL_RESTART);
                restored.withdrawn += 1;
                continue;
            };
            let origin = row
                .origin
                .map(|(request_id, from)| Origin { request_id, from });
            let resume = Resume {
                request: row.id,
                checkpoint,
                origin,
                trace,
                approvals,
            };
            let env = Envelope::new(
                MessageId(self.next_id()),
                Item::Resume(Box::new(resume)),
                None,
            );
            match proc.mailbox.push_restored(env, || self.start_runner(&proc)) {
                Ok(()) => {
                    restored.resumed += 1;
                    answering.extend(origin.map(|o| o.request_id));
                }
                Err(_) => {
                    self.inbox().withdraw(row.id, KERNEL_RESTART);
                    restored.withdrawn += 1;
                }
            }
        }
        answering
    }
}

/// `processes` with every parent before its children (a process that
/// moved here from another node keeps its PID, so PIDs do not say).
fn in_tree_order(processes: &[StoredProcess]) -> Vec<&StoredProcess> {
    let parent: HashMap<Pid, Pid> = processes.iter().map(|p| (p.pid, p.ppid)).collect();
    let depth = |pid: Pid| {
        let (mut at, mut depth) = (pid, 0usize);
        while let Some(up) = parent.get(&at) {
            depth += 1;
            if depth > parent.len() {
                break;
            }
            at = *up;
        }
        depth
    };
    let mut ordered: Vec<(usize, &StoredProcess)> =
        processes.iter().map(|p| (depth(p.pid), p)).collect();
    ordered.sort_by_key(|(depth, p)| (*depth, p.pid));
    ordered.into_iter().map(|(_, p)| p).collect()
}

/// Takes root `pid` back for this node after its restart: its key in
/// `hk_specs` names this node (an earlier epoch) and this node wins it, or
/// it has none (spawned before this node joined a cluster, or its write
/// failed: it is this node's, and moves from now on). True when its key
/// names this node's epoch now; why not, when it does not come back.
async fn reclaim(cluster: &crate::cluster::Cluster, pid: Pid) -> Result<bool, String> {
    let mut tries = 0;
    let key = loop {
        match cluster.spec_key(pid).await {
            Ok(key) => break key,
            Err(err) if tries >= 2 => {
                tracing::error!(%pid, error = %err, "cluster: whether a process runs elsewhere could not be read");
                return Err(format!("the cluster could not be asked: {err}"));
            }
            Err(_) => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    match key {
        SpecKey::Kept(kept, revision) if kept.node == cluster.node() => {
            match cluster.claim_spec(pid, &kept, revision).await {
                Ok(true) => Ok(true),
                Ok(false) => Err("another node took it over as this node started".to_owned()),
                Err(err) => Err(format!("the cluster could not be asked: {err}")),
            }
        }
        SpecKey::Kept(kept, _) => Err(format!(
            "it runs on node {} now (taken over while this node was gone)",
            kept.node
        )),
        SpecKey::Removed => {
            Err("it ended on the node that took it over while this node was gone".to_owned())
        }
        // Written once it runs: a restored process's spawn writes none.
        SpecKey::Never => Ok(false),
    }
}

/// A process back as `pid` carries on with the usage it had, and its own
/// budget with what it had spent, less what its live borrowers spent
/// (`borrowed`), which their loans already hold.
pub(super) fn carry_usage(
    entry: &crate::process::Entry,
    kept: &StoredUsage,
    borrowed: Option<u64>,
) {
    entry.proc.usage.add_kept(kept.own, kept.subtree);
    if let Some(pool) = entry.proc.own_budget()
        && let Some(spent) = kept.budget_spent
    {
        pool.carry(spent, borrowed.unwrap_or(0));
    }
}

/// A spawn request as the store keeps it: the request, and what a request
/// carries but never serializes (it is not taken from clients): the
/// workspace, the exec command and the skill directories.
#[derive(Serialize)]
struct SpecRef<'a> {
    request: &'a SpawnRequest,
    #[serde(skip_serializing_if = "Option::is_none")]
    workspace: Option<&'a Path>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exec: Option<ExecRef<'a>>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    skills: &'a [PathBuf],
}

#[derive(Serialize)]
struct ExecRef<'a> {
    argv: &'a [String],
    env: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cwd: Option<&'a Path>,
}

/// [`SpecRef`], read back.
#[derive(Deserialize)]
struct Spec {
    request: SpawnRequest,
    #[serde(default)]
    workspace: Option<PathBuf>,
    #[serde(default)]
    exec: Option<SpecExec>,
    #[serde(default)]
    skills: Vec<PathBuf>,
}

#[derive(Deserialize)]
struct SpecExec {
    argv: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    cwd: Option<PathBuf>,
}

/// `request` as the store keeps it.
pub(super) fn spec_json(request: &SpawnRequest) -> String {
    let spec = SpecRef {
        request,
        workspace: request.workspace.as_deref(),
        exec: request.exec.as_ref().map(|exec| ExecRef {
            argv: &exec.argv,
            env: &exec.env,
            cwd: exec.cwd.as_deref(),
        }),
        skills: &request.skills,
    };
    // Strings, numbers and maps of strings: serializing cannot fail.
    serde_json::to_string(&spec).unwrap_or_default()
}

/// A kept spawn request, read back; its parent must be the one the store
/// recorded.
pub(super) fn read_spec(json: &str, ppid: Pid) -> std::result::Result<SpawnRequest, String> {
    let spec: Spec = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let mut request = spec.request;
    if request.parent != ppid {
        return Err(format!(
            "it names parent {} where the process table says {ppid}",
            request.parent
        ));
    }
    request.workspace = spec.workspace;
    request.skills = spec.skills;
    request.exec = spec.exec.map(|exec| ExecCommand {
        argv: exec.argv,
        env: exec.env,
        cwd: exec.cwd,
    });
    Ok(request)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_kept_spawn_request_reads_back_whole_with_its_exec_command_workspace_and_skills() {
        let mut request = SpawnRequest::new(Pid(7), "worker");
        request.skills = vec!["/srv/skills".into()];
        request.model = "small".into();
        request.tools = vec!["shell".into()];
        request.metadata.insert("team".into(), "blue".into());
        request.workspace = Some("/srv/work".into());
        request.exec = Some(ExecCommand {
            argv: vec!["python3".into(), "agent.py".into()],
            env: BTreeMap::from([("MODE".into(), "fast".into())]),
            cwd: Some("/srv".into()),
        });
        let back = read_spec(&spec_json(&request), Pid(7)).unwrap();
        assert_eq!(back, request);
        assert_eq!(back.exec, request.exec);
        assert_eq!(back.workspace, request.workspace);
        assert_eq!(back.skills, request.skills);
    }

    #[test]
    fn stored_processes_come_back_parents_first_whatever_their_pids() {
        let stored = |pid: u64, ppid: u64| StoredProcess {
            pid: Pid(pid),
            ppid: Pid(ppid),
            name: format!("p{pid}"),
            role: "worker".into(),
            spec: Some(String::new()),
        };
        // 3000 moved here from another node, then spawned 1100.
        let processes = vec![
            stored(1101, 1100),
            stored(1100, 3000),
            stored(3000, 1),
            stored(5, 1),
        ];
        let order: Vec<u64> = in_tree_order(&processes).iter().map(|p| p.pid.0).collect();
        assert_eq!(order, vec![5, 3000, 1100, 1101]);
    }

    #[test]
    fn a_kept_spawn_request_that_cannot_be_read_says_why() {
        let why = read_spec("{\"request\": 3}", Pid(2)).unwrap_err();
        assert!(why.contains("invalid type"), "{why}");
        let other = spec_json(&SpawnRequest::new(Pid(3), "w"));
        let why = read_spec(&other, Pid(2)).unwrap_err();
        assert!(why.contains("parent 3") && why.contains("says 2"), "{why}");
    }
}
