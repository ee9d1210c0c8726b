//! The process table: one entry per live or zombie process, and tree queries.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use hivekernel_agents::{
    Capabilities, ExitRecord, Limits, Pid, ProcessContext, ProcessInfo, ProcessState, Runtime,
};
use tokio::sync::oneshot;

use crate::budget::Pool;
use crate::mailbox::Mailbox;
use crate::usage::Meter;

mod supervision;
pub(crate) use supervision::Supervision;

/// The part of a process that its runner, senders and readers share without
/// taking the table lock.
#[derive(Debug)]
pub(crate) struct ProcShared {
    /// Identity and syscalls, as handed to the runtime.
    pub(crate) ctx: ProcessContext,
    pub(crate) runtime_name: Arc<str>,
    /// What runs inside it, once its first mailbox item starts its runner;
    /// `None` for PID 1, which runs nothing.
    pub(crate) runtime: Option<Arc<dyn Runtime>>,
    pub(crate) limits: Limits,
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) started_at_unix_ms: u64,
    pub(crate) mailbox: Mailbox,
    /// Tasks being worked on now.
    pub(crate) running: AtomicU32,
    /// Calls this process is blocked in (execute_task, wait_child).
    pub(crate) blocked: AtomicU32,
    /// Inbox requests it waits on (a tool call's approval, `ask_human`).
    pub(crate) waiting: AtomicU32,
    /// Tool calls that need a person's approval: its role's, its own and
    /// its parent's rules; `None`: none do.
    pub(crate) approvals: Option<Arc<Vec<hivekernel_agents::ApprovalRule>>>,
    /// Directories of skills it sees besides the kernel's: its ancestors',
    /// oldest first, then its config agent's own (a later one's skill wins
    /// over an earlier one's); `None`: only the kernel's.
    pub(crate) skill_dirs: Option<Arc<[std::path::PathBuf]>>,
    /// Model calls made through the kernel, their tokens and cost; rate limits.
    pub(crate) usage: Meter,
    /// The token budget it draws on (its own, or its nearest ancestor's).
    pub(crate) budget: Option<Arc<Pool>>,
    /// What it may do: its role's capabilities, narrowed to its parent's.
    pub(crate) caps: Capabilities,
    /// It came back after a kernel restart as the PID it had (a config
    /// agent too), in this incarnation or an earlier one.
    pub(crate) restored: bool,
    /// Its acknowledged messages are kept in the cluster's mail stream
    /// (`HK_MAIL`) instead of this node's store, as it may move to another
    /// node: a config agent of a cluster node, or a spawned process whose
    /// spec is in `hk_specs`.
    pub(crate) mail_in_cluster: bool,
    /// Its spawn spec is in the cluster's `hk_specs`: it moves with its
    /// tree when its node is lost (a spawned process that is not
    /// `temporary`, under PID 1 or a process that moves too).
    pub(crate) spec_in_cluster: bool,
}

/// What a process is made of when it is created; [`ProcShared::new`] adds
/// the counters every incarnation starts from.
#[derive(Debug)]
pub(crate) struct NewProc {
    pub(crate) ctx: ProcessContext,
    pub(crate) runtime_name: Arc<str>,
    pub(crate) runtime: Option<Arc<dyn Runtime>>,
    pub(crate) limits: Limits,
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) started_at_unix_ms: u64,
    pub(crate) mailbox: Mailbox,
    pub(crate) usage: Meter,
    pub(crate) budget: Option<Arc<Pool>>,
    pub(crate) caps: Capabilities,
    pub(crate) restored: bool,
    pub(crate) mail_in_cluster: bool,
    pub(crate) spec_in_cluster: bool,
    pub(crate) approvals: Option<Arc<Vec<hivekernel_agents::ApprovalRule>>>,
    pub(crate) skill_dirs: Option<Arc<[std::path::PathBuf]>>,
}

impl ProcShared {
    /// The token budget it owns (`None`: it has none, or draws on an
    /// ancestor's).
    pub(crate) fn own_budget(&self) -> Option<&Pool> {
        self.budget
            .as_deref()
            .filter(|pool| pool.owner() == self.ctx.pid)
    }

    /// The one way a process (PID 1, a spawn, a restart) comes to be: idle,
    /// with nothing running or blocked.
    #[inline]
    pub(crate) fn new(new: NewProc) -> Self {
        ProcShared {
            ctx: new.ctx,
            runtime_name: new.runtime_name,
            runtime: new.runtime,
            limits: new.limits,
            metadata: new.metadata,
            started_at_unix_ms: new.started_at_unix_ms,
            mailbox: new.mailbox,
            running: AtomicU32::new(0),
            blocked: AtomicU32::new(0),
            waiting: AtomicU32::new(0),
            approvals: new.approvals,
            skill_dirs: new.skill_dirs,
            usage: new.usage,
            budget: new.budget,
            caps: new.caps,
            restored: new.restored,
            mail_in_cluster: new.mail_in_cluster,
            spec_in_cluster: new.spec_in_cluster,
        }
    }

    /// Its next incarnation after a restart: the same identity, limits,
    /// metadata, usage and budget, with a fresh runtime and mailbox.
    pub(crate) fn reincarnated(
        &self,
        runtime: Arc<dyn Runtime>,
        mailbox: Mailbox,
        started_at_unix_ms: u64,
    ) -> Self {
        ProcShared::new(NewProc {
            ctx: self.ctx.clone(),
            runtime_name: self.runtime_name.clone(),
            runtime: Some(runtime),
            limits: self.limits,
            metadata: self.metadata.clone(),
            started_at_unix_ms,
            mailbox,
            usage: self.usage.carried(),
            budget: self.budget.clone(),
            caps: self.caps,
            restored: self.restored,
            mail_in_cluster: self.mail_in_cluster,
            spec_in_cluster: self.spec_in_cluster,
            approvals: self.approvals.clone(),
            skill_dirs: self.skill_dirs.clone(),
        })
    }

    /// State of a live process, derived from counters so the hot path never
    /// writes the table.
    pub(crate) fn state(&self) -> ProcessState {
        let running = self.running.load(Ordering::Relaxed);
        let blocked = self.blocked.load(Ordering::Relaxed);
        if self.waiting.load(Ordering::Relaxed) > 0 {
            ProcessState::Waiting
        } else if blocked > 0 && blocked >= running {
            ProcessState::Blocked
        } else if running > 0 {
            ProcessState::Running
        } else {
            ProcessState::Idle
        }
    }
}

/// Decrements a counter when dropped; marks time spent running or blocked.
#[derive(Debug)]
pub(crate) struct CountGuard<'a>(&'a AtomicU32);

impl<'a> CountGuard<'a> {
    pub(crate) fn enter(counter: &'a AtomicU32) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        CountGuard(counter)
    }
}

impl Drop for CountGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A process's children in PID order, and the order they came in. Most
/// processes never have one, so the set is allocated with the first: no
/// children cost one word of the table entry.
#[derive(Debug, Default)]
pub(crate) struct Children(Option<Box<ChildSet>>);

#[derive(Debug, Default)]
struct ChildSet {
    pids: BTreeSet<Pid>,
    /// The highest PID that came: one below it came out of PID order.
    highest: u64,
    /// Every child in the order it came, once one came with a PID below
    /// another's (a child spawned on another node of a cluster, which
    /// takes PIDs from blocks of its own); until then PID order is that
    /// order, and nothing more is kept.
    arrival: Option<Box<Arrival>>,
}

/// Children in the order they came: each with its place in line.
#[derive(Debug, Default)]
struct Arrival {
    next: u64,
    line: BTreeMap<u64, Pid>,
    place: HashMap<Pid, u64>,
}

impl Arrival {
    fn push(&mut self, pid: Pid) {
        let place = self.next;
        self.next += 1;
        self.line.insert(place, pid);
        self.place.insert(pid, place);
    }

    fn remove(&mut self, pid: Pid) {
        if let Some(place) = self.place.remove(&pid) {
            self.line.remove(&place);
        }
    }

    fn after(&self, pid: Pid) -> Vec<Pid> {
        let Some(&place) = self.place.get(&pid) else {
            return Vec::new();
        };
        self.line.range(place + 1..).map(|(_, &pid)| pid).collect()
    }
}

impl Children {
    /// Adds `pid`; whether it was not there yet.
    pub(crate) fn insert(&mut self, pid: Pid) -> bool {
        let set = self.0.get_or_insert_default();
        if !set.pids.insert(pid) {
            return false;
        }
        let below = pid.0 < set.highest;
        set.highest = set.highest.max(pid.0);
        match &mut set.arrival {
            Some(arrival) => arrival.push(pid),
            None if below => {
                // Until now PID order was the order they came in.
                let mut arrival = Box::<Arrival>::default();
                for &earlier in set.pids.iter().filter(|&&p| p != pid) {
                    arrival.push(earlier);
                }
                arrival.push(pid);
                set.arrival = Some(arrival);
            }
            None => {}
        }
        true
    }

    pub(crate) fn contains(&self, pid: Pid) -> bool {
        self.0.as_ref().is_some_and(|set| set.pids.contains(&pid))
    }

    pub(crate) fn remove(&mut self, pid: Pid) {
        if let Some(set) = &mut self.0
            && set.pids.remove(&pid)
            && let Some(arrival) = &mut set.arrival
        {
            arrival.remove(pid);
        }
    }

    pub(crate) fn clear(&mut self) {
        self.0 = None;
    }

    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = Pid> + '_ {
        self.0.iter().flat_map(|set| set.pids.iter().copied())
    }

    /// The children that came after `pid`: those spawned after it (PID
    /// order, unless one came with a lower PID than another).
    pub(crate) fn after(&self, pid: Pid) -> Vec<Pid> {
        let Some(set) = &self.0 else {
            return Vec::new();
        };
        match &set.arrival {
            Some(arrival) => arrival.after(pid),
            None => set
                .pids
                .range(Pid(pid.0.saturating_add(1))..)
                .copied()
                .collect(),
        }
    }
}

/// One row of the process table.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) ppid: Pid,
    pub(crate) depth: u32,
    /// Children, live and zombie, and the order they came in.
    pub(crate) children: Children,
    pub(crate) live_children: u32,
    pub(crate) proc: Arc<ProcShared>,
    /// Set once the process has exited (it is then a zombie).
    pub(crate) exit: Option<Box<ExitRecord>>,
    /// Callers of wait_child waiting for it to exit; rare, so boxed.
    #[expect(
        clippy::box_collection,
        reason = "one word in every table row instead of three; the extra allocation is only ever made for a wait_child"
    )]
    pub(crate) exit_waiters: Option<Box<Vec<oneshot::Sender<ExitRecord>>>>,
    /// Restart policy, strategy and restart history; `None` is the common
    /// case (temporary, one_for_one, never restarted) and costs one word.
    pub(crate) sup: Option<Box<Supervision>>,
}

impl Entry {
    pub(crate) fn is_alive(&self) -> bool {
        self.exit.is_none()
    }

    /// What `ps` shows: zombie, restarting, or what its counters say.
    pub(crate) fn state(&self) -> ProcessState {
        if self.exit.is_some() {
            ProcessState::Zombie
        } else if self.is_restarting() {
            ProcessState::Restarting
        } else {
            self.proc.state()
        }
    }

    pub(crate) fn info(&self, pid: Pid) -> ProcessInfo {
        let p = &self.proc;
        ProcessInfo {
            pid,
            ppid: self.ppid,
            name: p.ctx.name.to_string(),
            role: p.ctx.role,
            tier: p.ctx.tier,
            state: self.state(),
            model: p.ctx.model.to_string(),
            runtime: p.runtime_name.to_string(),
            tools: p.ctx.tools.to_vec(),
            limits: p.limits,
            depth: self.depth,
            children: self.live_children,
            mailbox_len: u32::try_from(p.mailbox.len()).unwrap_or(u32::MAX),
            started_at_unix_ms: p.started_at_unix_ms,
            metadata: p.metadata.clone(),
            usage: p.usage.snapshot(),
            subtree_usage: p.usage.subtree(),
            capabilities: p.caps,
            budget: p.budget.as_ref().map(|pool| pool.info()),
            exit: self.exit.as_deref().cloned(),
            restarts: self.restarts(),
            restart: self.restart_spec(),
            strategy: self.strategy(),
            last_exit: self.last_exit().cloned(),
            restored: p.restored,
            log_path: None,
            node: None,
        }
    }
}

/// All live and zombie processes, keyed by PID.
#[derive(Debug, Default)]
pub(crate) struct ProcessTable {
    /// Keyed by PID with a fast non-cryptographic hash: PIDs are kernel-chosen,
    /// never attacker-chosen, so SipHash's flood resistance buys nothing here.
    entries: rustc_hash::FxHashMap<Pid, Entry>,
    /// The rows whose parent is not in the table (a parent on another
    /// node of a cluster), by parent.
    foreign: rustc_hash::FxHashMap<Pid, BTreeSet<Pid>>,
}

impl ProcessTable {
    /// A table holding only `kernel`, PID 1's row.
    pub(crate) fn with_kernel(kernel: Entry) -> Self {
        let mut entries = rustc_hash::FxHashMap::default();
        entries.insert(Pid::KERNEL, kernel);
        ProcessTable {
            entries,
            foreign: Default::default(),
        }
    }

    /// Adds a row; the caller has linked it into its parent's children
    /// (when its parent is in the table).
    pub(crate) fn insert(&mut self, pid: Pid, entry: Entry) {
        if pid != Pid::KERNEL && !self.entries.contains_key(&entry.ppid) {
            self.foreign.entry(entry.ppid).or_default().insert(pid);
        }
        self.entries.insert(pid, entry);
    }

    /// Takes a row out (reaping); the caller unlinks it from its parent.
    pub(crate) fn remove(&mut self, pid: Pid) -> Option<Entry> {
        let entry = self.entries.remove(&pid)?;
        if !self.foreign.is_empty()
            && let Some(siblings) = self.foreign.get_mut(&entry.ppid)
            && siblings.remove(&pid)
            && siblings.is_empty()
        {
            self.foreign.remove(&entry.ppid);
        }
        Some(entry)
    }

    /// Each parent not in the table (on another node) with its rows, in
    /// PID order.
    pub(crate) fn foreign(&self) -> impl Iterator<Item = (Pid, &BTreeSet<Pid>)> + '_ {
        self.foreign
            .iter()
            .map(|(parent, children)| (*parent, children))
    }

    /// The rows whose parent `parent` is not in the table (it lives on
    /// another node), in PID order.
    pub(crate) fn foreign_children(&self, parent: Pid) -> impl Iterator<Item = Pid> + '_ {
        self.foreign
            .get(&parent)
            .into_iter()
            .flat_map(|children| children.iter().copied())
    }

    /// Every row, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Pid, &Entry)> + '_ {
        self.entries.iter().map(|(pid, entry)| (*pid, entry))
    }

    pub(crate) fn get(&self, pid: Pid) -> Option<&Entry> {
        self.entries.get(&pid)
    }

    pub(crate) fn get_mut(&mut self, pid: Pid) -> Option<&mut Entry> {
        self.entries.get_mut(&pid)
    }

    /// Whether `ancestor` is a strict ancestor of `pid`.
    pub(crate) fn is_ancestor(&self, ancestor: Pid, pid: Pid) -> bool {
        let (Some(a), Some(p)) = (self.get(ancestor), self.get(pid)) else {
            return false;
        };
        a.depth < p.depth && self.ancestor_at(pid, a.depth) == Some(ancestor)
    }

    /// The PIDs from PID 1 down to `pid`, both included; `None` if `pid`
    /// is not in the table. On a node of a cluster, the line starts below
    /// the first ancestor another node holds.
    pub(crate) fn lineage(&self, pid: Pid) -> Option<Vec<Pid>> {
        let mut line = vec![pid];
        let mut entry = self.get(pid)?;
        while entry.depth > 0 {
            let Some(parent) = self.get(entry.ppid) else {
                break;
            };
            line.push(entry.ppid);
            entry = parent;
        }
        line.reverse();
        Some(line)
    }

    /// The ancestor of `pid` (or `pid` itself) at `depth`, walking up the tree.
    fn ancestor_at(&self, pid: Pid, depth: u32) -> Option<Pid> {
        let mut cur = pid;
        let mut entry = self.get(cur)?;
        while entry.depth > depth {
            cur = entry.ppid;
            entry = self.get(cur)?;
        }
        (entry.depth == depth).then_some(cur)
    }

    /// `root` and everything below it, children before their parent (post-order).
    pub(crate) fn subtree_leaves_first(&self, root: Pid) -> Vec<Pid> {
        let mut out = Vec::new();
        // Iterative post-order: (pid, children expanded?)
        let mut stack = vec![(root, false)];
        while let Some((pid, expanded)) = stack.pop() {
            if expanded {
                out.push(pid);
                continue;
            }
            stack.push((pid, true));
            if let Some(entry) = self.entries.get(&pid) {
                for child in entry.children.iter().rev() {
                    stack.push((child, false));
                }
            }
        }
        out
    }

    /// `root` and everything below it, parents first (pre-order), at most `max_depth` levels below root.
    pub(crate) fn subtree_preorder(&self, root: Pid, max_depth: Option<u32>) -> Vec<Pid> {
        let mut out = Vec::new();
        let mut stack = vec![(root, 0u32)];
        while let Some((pid, level)) = stack.pop() {
            let Some(entry) = self.entries.get(&pid) else {
                continue;
            };
            out.push(pid);
            if max_depth.is_some_and(|max| level >= max) {
                continue;
            }
            for child in entry.children.iter().rev() {
                stack.push((child, level + 1));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_come_after_each_other_in_the_order_they_came() {
        let mut children = Children::default();
        assert!(children.after(Pid(1)).is_empty());
        for pid in [4, 5, 9] {
            assert!(children.insert(Pid(pid)));
        }
        assert!(!children.insert(Pid(5)));
        assert_eq!(children.after(Pid(5)), vec![Pid(9)]);
        // A child from another node's PID block: lower, yet later.
        children.insert(Pid(1030));
        children.insert(Pid(6));
        assert_eq!(children.after(Pid(5)), vec![Pid(9), Pid(1030), Pid(6)]);
        assert_eq!(children.after(Pid(1030)), vec![Pid(6)]);
        children.remove(Pid(9));
        assert_eq!(children.after(Pid(4)), vec![Pid(5), Pid(1030), Pid(6)]);
        // Listed in PID order all the same.
        let listed: Vec<u64> = children.iter().map(|pid| pid.0).collect();
        assert_eq!(listed, vec![4, 5, 6, 1030]);
        assert!(children.after(Pid(77)).is_empty());
        children.clear();
        assert!(!children.contains(Pid(6)));
    }

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_table_row_fits_one_cache_line() {
        // Spawn writes one row into a table of up to 100k+ rows; a row that
        // straddles two lines costs a second miss per insert and per lookup.
        assert!(
            size_of::<(Pid, Entry)>() <= 64,
            "{} bytes",
            size_of::<(Pid, Entry)>()
        );
    }

    #[test]
    fn children_list_in_pid_order_and_split_in_the_order_they_came() {
        let mut children = Children::default();
        assert_eq!(children.iter().count(), 0);
        for pid in [7, 3, 9, 5] {
            children.insert(Pid(pid));
        }
        children.remove(Pid(9));
        let all: Vec<u64> = children.iter().map(|p| p.0).collect();
        assert_eq!(all, [3, 5, 7]);
        let reversed: Vec<u64> = children.iter().rev().map(|p| p.0).collect();
        assert_eq!(reversed, [7, 5, 3]);
        // After 3 in the order they came: 7 came before it.
        let after: Vec<u64> = children.after(Pid(3)).iter().map(|p| p.0).collect();
        assert_eq!(after, [5]);
        children.clear();
        assert!(children.after(Pid(0)).is_empty());
    }

    /// An idle process's shared state, in its `Arc`, fits the allocator's
    /// 448-byte size class: 8 bytes more cost every process 64 (the next
    /// class is 512), about 8% of an idle agent's memory. mimalloc places
    /// an allocation of `size` aligned to `align` (what Rust asks of it)
    /// by `size + align - 1` whenever its page has no free block yet, so
    /// that is what must fit.
    #[test]
    fn a_process_fits_its_size_class() {
        use std::mem::{align_of, size_of};
        let arc = size_of::<super::ProcShared>() + 2 * size_of::<usize>();
        let placed = arc + align_of::<super::ProcShared>().max(align_of::<usize>()) - 1;
        assert!(
            placed <= 448,
            "an Arc<ProcShared> takes {arc} bytes, placed as {placed}"
        );
    }
}
