//! The entries, their next slots, and the timer task that fires them.
//!
//! Next slots sit in a deadline-ordered set; the timer task sleeps until the
//! first one or until a change wakes it (a `Notify`), never polling. Wall
//! time comes from a clock anchored to the system time and advanced by
//! tokio's monotonic clock, so tests drive it with a paused tokio clock; a
//! system clock that jumps ahead (a suspended machine) re-anchors it.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cron::Schedule;
use hivekernel_agents::Capability;
use hivekernel_agents::{Pid, SpawnRequest};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{CronHandle, CronInfo, CronRun, CronSource, CronSpec, HISTORY, Missed, Overlap};
use crate::cluster::rpc::CronChange;
use crate::crontab;
use crate::error::{KernelError, Result};
use crate::events::unix_ms;
use crate::kernel::{Caller, Kernel};
use crate::reload::{Change, Outcome};
use crate::store::{StoredCron, Write};

mod lease;

/// The longest the timer sleeps before looking at the clock again.
const MAX_SLEEP: Duration = Duration::from_secs(60);
/// Longest entry name, in bytes.
pub const MAX_CRON_NAME_BYTES: usize = 128;
/// Entries one process may own (the operator's are not counted).
pub const MAX_CRON_PER_PROCESS: usize = 64;

/// Wall time in Unix ms: system time at the anchor plus tokio time since.
#[derive(Debug)]
struct Clock {
    anchor: Mutex<(u64, Instant)>,
}

impl Clock {
    fn new() -> Self {
        Clock {
            anchor: Mutex::new((unix_ms(SystemTime::now()), Instant::now())),
        }
    }

    fn anchor(&self) -> (u64, Instant) {
        *self.anchor.lock()
    }

    fn set_anchor(&self, anchor: (u64, Instant)) {
        *self.anchor.lock() = anchor;
    }

    fn now_ms(&self) -> u64 {
        let mut anchor = self.anchor.lock();
        let elapsed = Instant::now().saturating_duration_since(anchor.1);
        let computed = anchor.0.saturating_add(elapsed.as_millis() as u64);
        let system = unix_ms(SystemTime::now());
        if system > computed + 1000 {
            *anchor = (system, Instant::now());
            return system;
        }
        computed
    }
}

#[derive(Debug)]
struct Entry {
    spec: CronSpec,
    schedule: Schedule,
    owner: Pid,
    source: CronSource,
    created_ms: u64,
    last_fire_ms: Option<u64>,
    next_ms: Option<u64>,
    running: usize,
    runs: u64,
    history: VecDeque<CronRun>,
    /// Tells this entry apart from an earlier one of the same name, so a
    /// run of the earlier one never counts for it.
    generation: u64,
    /// A config entry switched on or off by hand (`None`: as declared);
    /// kept until the config changes the entry.
    switched: Option<bool>,
}

impl Entry {
    /// An entry of `owner` added through the API at `created_ms`, that
    /// has not run yet.
    fn added(
        spec: CronSpec,
        schedule: Schedule,
        owner: Pid,
        created_ms: u64,
        generation: u64,
    ) -> Self {
        Entry {
            spec,
            schedule,
            owner,
            source: CronSource::Api,
            created_ms,
            last_fire_ms: None,
            next_ms: None,
            running: 0,
            runs: 0,
            history: VecDeque::new(),
            generation,
            switched: None,
        }
    }

    /// Whether it fires on its schedule: the switch, else as declared.
    fn enabled(&self) -> bool {
        self.switched.unwrap_or(self.spec.enabled)
    }

    /// The store's record of it.
    fn put(&self) -> Write {
        self.put_as(&self.spec, self.switched)
    }

    /// The store's record of it with `spec` and `switched` in place of its own.
    fn put_as(&self, spec: &CronSpec, switched: Option<bool>) -> Write {
        Write::CronPut {
            name: self.spec.name.clone(),
            spec: serde_json::to_string(spec).unwrap_or_default(),
            owner: self.owner,
            source: self.source.as_str(),
            created_ms: self.created_ms,
            switched,
        }
    }

    fn info(&self) -> CronInfo {
        let mut spec = self.spec.clone();
        spec.enabled = self.enabled();
        CronInfo {
            spec,
            switched: self.switched.is_some(),
            owner: self.owner,
            source: self.source,
            next_run_unix_ms: self.next_ms,
            last_run_unix_ms: self.last_fire_ms,
            created_unix_ms: self.created_ms,
            runs: self.runs,
            running: self.running > 0,
            history: self.history.iter().cloned().collect(),
            node: None,
        }
    }

    fn record(&mut self, run: CronRun) {
        self.runs += 1;
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(run);
    }
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<String, Entry>,
    /// (slot, name), earliest first.
    due: BTreeSet<(u64, String)>,
}

impl State {
    /// Sets `name`'s next slot to the first after `after_ms` (none when disabled).
    fn reschedule(&mut self, name: &str, after_ms: u64) {
        let Some(entry) = self.entries.get_mut(name) else {
            return;
        };
        if let Some(old) = entry.next_ms.take() {
            self.due.remove(&(old, name.to_owned()));
        }
        if entry.enabled() {
            entry.next_ms = crontab::next_after(&entry.schedule, after_ms);
            if let Some(next) = entry.next_ms {
                self.due.insert((next, name.to_owned()));
            }
        }
    }

    /// Puts `entry` in place of any entry of its name, slot included.
    fn insert(&mut self, entry: Entry) {
        let name = entry.spec.name.clone();
        self.remove(&name);
        self.entries.insert(name, entry);
    }

    /// Ends one run of entry `name` when it is still the entry of
    /// `generation` (not one that replaced it); whether it was.
    fn ended(&mut self, name: &str, generation: u64) -> bool {
        match self.entries.get_mut(name) {
            Some(entry) if entry.generation == generation => {
                entry.running = entry.running.saturating_sub(1);
                true
            }
            _ => false,
        }
    }

    fn remove(&mut self, name: &str) -> Option<Entry> {
        let entry = self.entries.remove(name)?;
        if let Some(next) = entry.next_ms {
            self.due.remove(&(next, name.to_owned()));
        }
        Some(entry)
    }
}

/// Why an entry fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Firing {
    /// Its slot is due.
    Slot,
    /// At start, for slots that passed while the kernel was down (`run_once`).
    Missed,
    /// Someone asked for a run now.
    Asked,
}

/// What [`CronHandle::fire`] did.
#[derive(Debug)]
enum Fired {
    Started,
    /// A run goes on and the entry skips overlaps (a slot is recorded as skipped).
    Busy,
    /// The entry (or that slot of it) is no more.
    Gone,
    /// The store did not take the slot, so nothing ran.
    NotRecorded(String),
}

/// The entry called `name`, when `caller` owns it or sees all.
fn owned<'a>(state: &'a State, caller: Caller, name: &str) -> Result<&'a Entry> {
    let entry = state
        .entries
        .get(name)
        .ok_or_else(|| KernelError::NoSuchCron(name.to_owned()))?;
    if !caller.sees_all() && entry.owner != caller.pid() {
        return Err(KernelError::PermissionDenied(format!(
            "cron entry {name:?} belongs to process {}",
            entry.owner
        )));
    }
    Ok(entry)
}

/// A config entry at a reload: its owner, whether that is alive, its spec.
#[derive(Debug)]
struct Declared {
    owner: Pid,
    spec: CronSpec,
    alive: bool,
}

/// The kernel's cron: entries, templates for `spawn`, the timer's wake-up.
#[derive(Debug)]
pub(crate) struct Cron {
    state: Mutex<State>,
    wake: Arc<Notify>,
    clock: Clock,
    /// `templates` from the config, by name.
    templates: HashMap<String, SpawnRequest>,
    /// Held by add and remove across their store commit, so two changes to
    /// one name never interleave.
    admin: Arc<tokio::sync::Mutex<()>>,
    generations: std::sync::atomic::AtomicU64,
    /// True once the stored and declared entries are loaded: entries taken
    /// over from another node join only then.
    ready: tokio::sync::watch::Sender<bool>,
}

impl Cron {
    /// A cron with no entries yet; `spawn` entries may use `templates`. Its
    /// clock starts at `anchor` (wall time at a tokio instant) when given.
    pub(crate) fn new(
        templates: HashMap<String, SpawnRequest>,
        anchor: Option<(u64, Instant)>,
    ) -> Self {
        let clock = Clock::new();
        if let Some(anchor) = anchor {
            clock.set_anchor(anchor);
        }
        Cron {
            state: Mutex::new(State::default()),
            wake: Arc::new(Notify::new()),
            clock,
            templates,
            admin: Arc::new(tokio::sync::Mutex::new(())),
            generations: std::sync::atomic::AtomicU64::new(1),
            ready: tokio::sync::watch::Sender::new(false),
        }
    }
}

impl Cron {
    fn generation(&self) -> u64 {
        self.generations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn template(&self, name: &str) -> Option<SpawnRequest> {
        self.templates.get(name).cloned()
    }
}

impl CronHandle<'_> {
    /// Wall time as cron sees it (Unix ms).
    pub fn now_ms(self) -> u64 {
        self.kernel.inner.cron().clock.now_ms()
    }

    /// The anchor of this kernel's cron clock (wall time at a tokio instant),
    /// for a kernel started after it in the same process to read the same time.
    pub(crate) fn clock_anchor(self) -> (u64, Instant) {
        self.kernel.inner.cron().clock.anchor()
    }

    /// Adds an entry owned by the caller; a process may only aim it at
    /// itself or its descendants. Its firings carry the approval rules the
    /// caller works under (kernel/asked.rs).
    pub async fn add(self, caller: Caller, mut spec: CronSpec) -> Result<CronInfo> {
        let result = async {
            self.kernel
                .require(caller, Capability::ManageCron, "add cron entries")?;
            spec.approvals = self.kernel.asked_under(caller.pid())?.to_vec();
            if let Some(node) = self.target_elsewhere(caller, spec.target).await? {
                return self.forward_add(&node, spec).await;
            }
            self.add_checked(caller, spec).await
        };
        self.kernel.report_denial(caller, "add_cron", result.await)
    }

    /// [`CronHandle::add`], once the caller holds the capability.
    pub(in crate::kernel) async fn add_checked(
        self,
        caller: Caller,
        mut spec: CronSpec,
    ) -> Result<CronInfo> {
        self.kernel.check_running()?;
        // gRPC and the tools send an empty template for none.
        spec.template = spec.template.filter(|t| !t.is_empty());
        let schedule = self.check(caller, &spec)?;
        let owner = caller.pid();
        if owner != Pid::KERNEL {
            let owned = self
                .kernel
                .inner
                .cron()
                .state
                .lock()
                .entries
                .values()
                .filter(|e| e.owner == owner)
                .count();
            if owned >= MAX_CRON_PER_PROCESS {
                return Err(KernelError::LimitExceeded(format!(
                    "process {owner} already has {owned} cron entries (at most {MAX_CRON_PER_PROCESS})"
                )));
            }
        }
        // In a task the kernel owns: a caller that gives up (a cancelled RPC)
        // cannot leave the store and memory out of step.
        let kernel = self.kernel.clone();
        let task = self.kernel.inner.tracker().spawn(async move {
            let _admin = kernel.inner.cron().admin.clone().lock_owned().await;
            if kernel
                .inner
                .cron()
                .state
                .lock()
                .entries
                .contains_key(&spec.name)
            {
                return Err(KernelError::FailedPrecondition(format!(
                    "a cron entry named {:?} already exists",
                    spec.name
                )));
            }
            let created_ms = kernel.cron().now_ms();
            let generation = kernel.inner.cron().generation();
            let entry = Entry::added(spec, schedule, owner, created_ms, generation);
            // Kept in the cluster first when it follows its target: a
            // failed write there changes nothing here.
            let follows = kernel.cron().follows(entry.spec.target);
            if let Some(cluster) = &follows {
                cluster
                    .keep_cron(owner, &entry.spec, created_ms)
                    .await
                    .map_err(|err| KernelError::ClusterUnavailable(err.to_string()))?;
            }
            if let Err(err) = kernel.inner.store().commit(entry.put()).await {
                if let Some(cluster) = &follows
                    && let Err(left) = cluster.drop_cron(entry.spec.target, &entry.spec.name).await
                {
                    tracing::warn!(cron = entry.spec.name, error = %left, "cluster: a cron entry not added stays in the cluster; it comes back if its target moves");
                }
                return Err(err.into());
            }
            let info = {
                let mut state = kernel.inner.cron().state.lock();
                let name = entry.spec.name.clone();
                state.insert(entry);
                state.reschedule(&name, created_ms);
                state.entries.get(&name).map(Entry::info)
            };
            kernel.inner.cron().wake.notify_one();
            info.ok_or_else(|| KernelError::FailedPrecondition("cron entry vanished".into()))
        });
        task.await
            .unwrap_or_else(|_| Err(KernelError::FailedPrecondition("cron change failed".into())))
    }

    /// Removes an entry the caller owns (the operator may remove any added through the API).
    pub async fn remove(self, caller: Caller, name: &str) -> Result<()> {
        let result = async {
            self.kernel
                .require(caller, Capability::ManageCron, "remove cron entries")?;
            self.change(caller, name, CronChange::Remove)
                .await
                .map(drop)
        };
        self.kernel
            .report_denial(caller, "remove_cron", result.await)
    }

    /// [`CronHandle::remove`], once the caller holds the capability.
    pub(super) async fn remove_checked(self, caller: Caller, name: &str) -> Result<()> {
        let kernel = self.kernel.clone();
        let name = name.to_owned();
        // In a task the kernel owns, like [`CronHandle::add`].
        let task = self.kernel.inner.tracker().spawn(async move {
            let _admin = kernel.inner.cron().admin.clone().lock_owned().await;
            let target = {
                let state = kernel.inner.cron().state.lock();
                let entry = owned(&state, caller, &name)?;
                if entry.source == CronSource::Config {
                    return Err(KernelError::FailedPrecondition(format!(
                        "cron entry {name:?} is declared in the config; remove it there"
                    )));
                }
                entry.spec.target
            };
            // Out of memory first: no run starts or finishes for it meanwhile.
            kernel.inner.cron().state.lock().remove(&name);
            kernel.inner.cron().wake.notify_one();
            kernel
                .inner
                .store()
                .commit(Write::CronRemove(name.clone()))
                .await?;
            if let Some(cluster) = kernel.cron().follows(target)
                && let Err(err) = cluster.drop_cron(target, &name).await
            {
                tracing::warn!(cron = name, error = %err, "cluster: a removed cron entry stays in the cluster; it comes back if its target moves");
            }
            Ok(())
        });
        task.await
            .unwrap_or_else(|_| Err(KernelError::FailedPrecondition("cron change failed".into())))
    }

    /// Switches an entry the caller owns (the operator: any) on or off. An
    /// API entry is changed as if added so; a config entry keeps the
    /// switch, across restarts too, until the config changes it.
    pub async fn set_enabled(self, caller: Caller, name: &str, enabled: bool) -> Result<CronInfo> {
        let result = async {
            self.kernel.require(
                caller,
                Capability::ManageCron,
                "enable or disable cron entries",
            )?;
            self.change(caller, name, CronChange::Enable(enabled))
                .await?
                .ok_or_else(|| KernelError::NoSuchCron(name.to_owned()))
        };
        self.kernel
            .report_denial(caller, "set_cron_enabled", result.await)
    }

    /// [`CronHandle::set_enabled`], once the caller holds the capability.
    pub(super) async fn set_enabled_checked(
        self,
        caller: Caller,
        name: &str,
        enabled: bool,
    ) -> Result<CronInfo> {
        self.kernel.check_running()?;
        let kernel = self.kernel.clone();
        let name = name.to_owned();
        // In a task the kernel owns, like [`CronHandle::add`].
        let task = self.kernel.inner.tracker().spawn(async move {
            // Under the admin lock nothing but runs changes the entry meanwhile.
            let _admin = kernel.inner.cron().admin.clone().lock_owned().await;
            let (spec, switched, put, api) = {
                let state = kernel.inner.cron().state.lock();
                let entry = owned(&state, caller, &name)?;
                if entry.enabled() == enabled {
                    return Ok(entry.info());
                }
                let mut spec = entry.spec.clone();
                let switched = match entry.source {
                    CronSource::Api => {
                        spec.enabled = enabled;
                        None
                    }
                    // Back to as declared clears the switch.
                    CronSource::Config => (enabled != spec.enabled).then_some(enabled),
                };
                let put = entry.put_as(&spec, switched);
                let api =
                    (entry.source == CronSource::Api).then_some((entry.owner, entry.created_ms));
                (spec, switched, put, api)
            };
            // In the cluster and on disk first: a failed write changes
            // nothing (a write to disk that fails after the cluster's
            // leaves the switch there, for the target's next node only).
            if let Some((owner, created_ms)) = api
                && let Some(cluster) = kernel.cron().follows(spec.target)
            {
                cluster
                    .keep_cron(owner, &spec, created_ms)
                    .await
                    .map_err(|err| KernelError::ClusterUnavailable(err.to_string()))?;
            }
            kernel.inner.store().commit(put).await?;
            let info = {
                let mut state = kernel.inner.cron().state.lock();
                let now = kernel.cron().now_ms();
                let entry = state
                    .entries
                    .get_mut(&name)
                    .ok_or_else(|| KernelError::NoSuchCron(name.clone()))?;
                entry.spec = spec;
                entry.switched = switched;
                let after = now.max(entry.last_fire_ms.unwrap_or(0));
                state.reschedule(&name, after);
                state.entries.get(&name).map(Entry::info)
            };
            kernel.inner.cron().wake.notify_one();
            info.ok_or(KernelError::NoSuchCron(name))
        });
        task.await
            .unwrap_or_else(|_| Err(KernelError::FailedPrecondition("cron change failed".into())))
    }

    /// Fires an entry the caller owns (the operator: any) now, enabled or
    /// not, leaving its schedule as it is; the run is recorded as any other.
    pub async fn run_now(self, caller: Caller, name: &str) -> Result<CronInfo> {
        let result = async {
            self.kernel
                .require(caller, Capability::ManageCron, "run cron entries")?;
            self.change(caller, name, CronChange::Run)
                .await?
                .ok_or_else(|| KernelError::NoSuchCron(name.to_owned()))
        };
        self.kernel.report_denial(caller, "run_cron", result.await)
    }

    /// [`CronHandle::run_now`], once the caller holds the capability.
    pub(super) async fn run_checked(self, caller: Caller, name: &str) -> Result<CronInfo> {
        self.kernel.check_running()?;
        owned(&self.kernel.inner.cron().state.lock(), caller, name)?;
        // In a task the kernel owns: a caller that gives up cannot leave
        // a run counted that never started.
        let kernel = self.kernel.clone();
        let name = name.to_owned();
        let task = self.kernel.inner.tracker().spawn(async move {
            let now = kernel.cron().now_ms();
            match kernel.cron().fire(&name, now, Firing::Asked).await {
                Fired::Started => {}
                Fired::Busy => {
                    return Err(KernelError::FailedPrecondition(format!(
                        "cron entry {name:?} is running already (its overlap policy is skip)"
                    )));
                }
                Fired::Gone => return Err(KernelError::NoSuchCron(name)),
                Fired::NotRecorded(why) => {
                    return Err(KernelError::FailedPrecondition(format!(
                        "cron entry {name:?} not run: the store did not record it ({why})"
                    )));
                }
            }
            let state = kernel.inner.cron().state.lock();
            state
                .entries
                .get(&name)
                .map(Entry::info)
                .ok_or(KernelError::NoSuchCron(name))
        });
        task.await
            .unwrap_or_else(|_| Err(KernelError::FailedPrecondition("cron run failed".into())))
    }

    /// Entries the caller owns (every entry for the operator), by name.
    pub fn list(self, caller: Caller) -> Vec<CronInfo> {
        let state = self.kernel.inner.cron().state.lock();
        let mut infos: Vec<CronInfo> = state
            .entries
            .values()
            .filter(|e| caller.sees_all() || e.owner == caller.pid())
            .map(Entry::info)
            .collect();
        infos.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
        infos
    }

    /// At start: takes the stored entries back, replaces the config's with
    /// `declared` (owner, spec), and settles slots missed while down. Call
    /// once, after the config agents are back; returns what could not be
    /// loaded.
    pub(crate) async fn start(
        self,
        stored: Vec<StoredCron>,
        declared: Vec<(Pid, CronSpec)>,
    ) -> Vec<String> {
        let mut problems = Vec::new();
        let now = self.now_ms();
        let mut kept: HashMap<String, StoredCron> =
            stored.into_iter().map(|s| (s.name.clone(), s)).collect();
        let mut entries = Vec::new();
        for (owner, spec) in declared {
            let mut previous = kept.remove(&spec.name);
            match crontab::parse(&spec.expression) {
                Ok(schedule) => {
                    // A switch by hand holds while the config leaves the entry as it was.
                    if let Some(stored) = &mut previous
                        && (stored.owner != owner
                            || serde_json::from_str::<CronSpec>(&stored.spec).ok().as_ref()
                                != Some(&spec))
                    {
                        stored.switched = None;
                    }
                    self.kernel.inner.store().submit(Write::CronPut {
                        name: spec.name.clone(),
                        spec: serde_json::to_string(&spec).unwrap_or_default(),
                        owner,
                        source: CronSource::Config.as_str(),
                        created_ms: previous.as_ref().map_or(now, |p| p.created_ms),
                        switched: previous.as_ref().and_then(|p| p.switched),
                    });
                    entries.push((spec, schedule, owner, CronSource::Config, previous));
                }
                Err(why) => problems.push(format!("cron {:?}: {why}", spec.name)),
            }
        }
        for (name, stored) in kept {
            let spec = serde_json::from_str::<CronSpec>(&stored.spec)
                .map_err(|e| e.to_string())
                .and_then(|spec| crontab::parse(&spec.expression).map(|s| (spec, s)));
            match (stored.source.as_str(), spec) {
                // A config entry no longer in the config goes with it.
                ("config", _) => {
                    self.kernel.inner.store().submit(Write::CronRemove(name));
                }
                (_, Ok((spec, schedule))) => {
                    let owner = stored.owner;
                    // Processes that did not come back take their entries with them.
                    let gone = |pid: Pid| {
                        pid != Pid::KERNEL
                            && !self
                                .kernel
                                .inner
                                .table()
                                .read()
                                .get(pid)
                                .is_some_and(|e| e.is_alive())
                    };
                    if gone(owner) || gone(spec.target) {
                        problems.push(format!(
                            "cron {name:?} removed: its owner {owner} or target {} did not come back",
                            spec.target
                        ));
                        // Its key in the cluster too, unless another node
                        // took the target over and wrote it since.
                        if let Some(cluster) = self.kernel.inner.cluster().cloned() {
                            let (target, name) = (spec.target, name.clone());
                            self.kernel.inner.tracker().spawn(async move {
                                cluster.drop_stale_cron(target, &name).await;
                            });
                        }
                        self.kernel.inner.store().submit(Write::CronRemove(name));
                        continue;
                    }
                    entries.push((spec, schedule, owner, CronSource::Api, Some(stored)));
                }
                (_, Err(why)) => problems.push(format!("stored cron {name:?}: {why}")),
            }
        }

        let mut missed_now = Vec::new();
        {
            let mut state = self.kernel.inner.cron().state.lock();
            for (spec, schedule, owner, source, previous) in entries {
                let name = spec.name.clone();
                let (created_ms, last_fire_ms, runs, history, switched) = match previous {
                    Some(p) => (p.created_ms, p.last_fire_ms, p.runs, p.history, p.switched),
                    None => (now, None, 0, Vec::new(), None),
                };
                // Only a config entry carries a switch; an API entry's is its spec.
                let switched = switched.filter(|_| source == CronSource::Config);
                let since = last_fire_ms.unwrap_or(created_ms);
                let missed = switched.unwrap_or(spec.enabled)
                    && crontab::next_after(&schedule, since).is_some_and(|slot| slot <= now);
                let run_once = missed && spec.missed == Missed::RunOnce;
                let missed_slot = run_once.then(|| self.missed_slot(&schedule, since, now));
                state.insert(Entry {
                    spec,
                    schedule,
                    owner,
                    source,
                    created_ms,
                    last_fire_ms,
                    next_ms: None,
                    running: 0,
                    runs,
                    history: history.into(),
                    generation: self.kernel.inner.cron().generation(),
                    switched,
                });
                // Never a slot at or before the last one fired, whatever the clock says.
                state.reschedule(&name, now.max(last_fire_ms.unwrap_or(0)));
                if let Some(slot) = missed_slot {
                    missed_now.push((name, slot));
                } else if missed {
                    let run = CronRun {
                        at_unix_ms: now,
                        status: "missed".into(),
                        duration_ms: 0,
                        output: "slots passed while the kernel was down".into(),
                    };
                    self.record_run(&mut state, &name, run);
                }
            }
        }
        for (name, slot) in missed_now {
            self.fire(&name, slot, Firing::Missed).await;
        }
        self.kernel.inner.cron().wake.notify_one();
        problems
    }

    /// At a config reload: makes the config's entries `declared` (owner,
    /// spec): new ones are added, changed ones replaced (keeping their
    /// history and last slot), those no longer declared removed. Reports
    /// each entry, by name. In a kernel-owned task under the cron's admin
    /// lock, like [`CronHandle::add`].
    pub(crate) async fn reload(self, declared: Vec<(Pid, CronSpec)>) -> Vec<Change> {
        self.declare(declared, true).await
    }

    /// Makes the config's entries `declared` (owner, spec) as a reload
    /// does; with `prune`, the config entries not among them are removed.
    async fn declare(self, declared: Vec<(Pid, CronSpec)>, prune: bool) -> Vec<Change> {
        let kernel = self.kernel.clone();
        let task = self.kernel.inner.tracker().spawn(async move {
            let _admin = kernel.inner.cron().admin.clone().lock_owned().await;
            let now = kernel.cron().now_ms();
            let mut changes = Vec::new();
            let mut writes = Vec::new();
            // Read before the cron lock: it is never held while taking the table's.
            let alive: Vec<bool> = {
                let table = kernel.inner.table().read();
                let alive = |pid: Pid| table.get(pid).is_some_and(|e| e.is_alive());
                declared.iter().map(|(owner, _)| alive(*owner)).collect()
            };
            {
                let mut state = kernel.inner.cron().state.lock();
                let names: std::collections::HashSet<&str> = declared
                    .iter()
                    .map(|(_, spec)| spec.name.as_str())
                    .collect();
                let gone: Vec<(String, Pid)> = state
                    .entries
                    .values()
                    .filter(|e| {
                        prune
                            && e.source == CronSource::Config
                            && !names.contains(e.spec.name.as_str())
                    })
                    .map(|e| (e.spec.name.clone(), e.owner))
                    .collect();
                for (name, owner) in gone {
                    state.remove(&name);
                    writes.push(Write::CronRemove(name.clone()));
                    changes.push(Change::new(name, Some(owner), Outcome::Removed));
                }
                for ((owner, spec), alive) in declared.into_iter().zip(alive) {
                    let entry = Declared { owner, spec, alive };
                    changes.push(
                        kernel
                            .cron()
                            .reload_entry(&mut state, entry, now, &mut writes),
                    );
                }
            }
            kernel.inner.cron().wake.notify_one();
            for write in writes {
                if let Err(err) = kernel.inner.store().commit(write).await {
                    tracing::error!(error = %err, "store: cron change of a reload not recorded");
                }
            }
            changes.sort_by(|a, b| a.name.cmp(&b.name));
            changes
        });
        task.await.unwrap_or_default()
    }

    /// One declared entry of a reload: added, replaced or left alone.
    fn reload_entry(
        self,
        state: &mut State,
        declared: Declared,
        now: u64,
        writes: &mut Vec<Write>,
    ) -> Change {
        let Declared { owner, spec, alive } = declared;
        let name = spec.name.clone();
        let failed =
            |why: String| Change::new(name.clone(), Some(owner), Outcome::Failed).detail(why);
        let previous = state.entries.get(&name);
        match previous {
            Some(entry) if entry.source != CronSource::Config => {
                return failed(format!(
                    "an entry named {name:?} was added through the API; remove it (hivekernel \
                     cron rm) and reload again"
                ));
            }
            Some(entry) if entry.spec == spec && entry.owner == owner => {
                return Change::new(name, Some(owner), Outcome::Unchanged);
            }
            _ => {}
        }
        if let Some(template) = &spec.template
            && self.kernel.inner.cron().template(template).is_none()
        {
            return failed(format!(
                "template {template:?} is not loaded: templates change only when the kernel \
                 restarts"
            ));
        }
        let schedule = match crontab::parse(&spec.expression) {
            Ok(schedule) => schedule,
            Err(why) => return failed(format!("expression: {why}")),
        };
        if !alive {
            return failed(format!("its agent {owner} is not running"));
        }
        let previous = state.remove(&name);
        let outcome = if previous.is_some() {
            Outcome::Updated
        } else {
            Outcome::Added
        };
        let (created_ms, last_fire_ms, runs, history) = match previous {
            Some(p) => (p.created_ms, p.last_fire_ms, p.runs, p.history),
            None => (now, None, 0, VecDeque::new()),
        };
        // The config changed the entry: its word replaces any switch by hand.
        let entry = Entry {
            spec,
            schedule,
            owner,
            source: CronSource::Config,
            created_ms,
            last_fire_ms,
            next_ms: None,
            running: 0,
            runs,
            history,
            generation: self.kernel.inner.cron().generation(),
            switched: None,
        };
        writes.push(entry.put());
        state.insert(entry);
        // Never a slot at or before the last one fired.
        state.reschedule(&name, now.max(last_fire_ms.unwrap_or(0)));
        Change::new(name, Some(owner), outcome)
    }

    /// Fires whatever is due, then sleeps until the next slot or a change.
    /// The task holds the kernel only while it works, never while it sleeps.
    pub(crate) fn start_timer(self) {
        let weak = self.kernel.downgrade();
        let shutdown = self.kernel.inner.shutdown().clone();
        let wake = self.kernel.inner.cron().wake.clone();
        self.kernel.inner.tracker().spawn(async move {
            loop {
                let notified = wake.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let wait = {
                    let Some(inner) = weak.upgrade() else { return };
                    let kernel = Kernel { inner };
                    if kernel.is_stopping() {
                        return;
                    }
                    let now = kernel.cron().now_ms();
                    let due: Vec<(u64, String)> = {
                        let state = kernel.inner.cron().state.lock();
                        let due = state.due.iter().take_while(|(slot, _)| *slot <= now);
                        due.cloned().collect()
                    };
                    for (slot, name) in &due {
                        kernel.cron().fire(name, *slot, Firing::Slot).await;
                    }
                    if !due.is_empty() {
                        continue;
                    }
                    let state = kernel.inner.cron().state.lock();
                    state.due.first().map_or(MAX_SLEEP, |(slot, _)| {
                        Duration::from_millis(slot.saturating_sub(now)).min(MAX_SLEEP)
                    })
                };
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = &mut notified => {}
                    () = tokio::time::sleep(wait) => {}
                }
            }
        });
    }

    /// Fires `name` for `slot`: reschedules it, then (unless the overlap
    /// policy skips it) commits the slot and starts the action.
    async fn fire(self, name: &str, slot: u64, why: Firing) -> Fired {
        let (spec, generation, owner) = {
            let mut state = self.kernel.inner.cron().state.lock();
            let current = state.entries.get(name).and_then(|e| e.next_ms);
            // A slot of an entry since removed or replaced: drop it, never fire it.
            if why == Firing::Slot && current != Some(slot) {
                state.due.remove(&(slot, name.to_owned()));
                return Fired::Gone;
            }
            let Some(entry) = state.entries.get(name) else {
                return Fired::Gone;
            };
            let busy = entry.running > 0 && entry.spec.overlap == Overlap::Skip;
            // Asked for while a run goes on: refused, and nothing recorded.
            if busy && why == Firing::Asked {
                return Fired::Busy;
            }
            state.reschedule(name, slot.max(self.now_ms()));
            let Some(entry) = state.entries.get_mut(name) else {
                return Fired::Gone;
            };
            if busy {
                let run = CronRun {
                    at_unix_ms: slot,
                    status: "skipped".into(),
                    duration_ms: 0,
                    output: "the previous run was still going".into(),
                };
                self.record_run(&mut state, name, run);
                return Fired::Busy;
            }
            entry.running += 1;
            entry.last_fire_ms = Some(slot);
            (entry.spec.clone(), entry.generation, entry.owner)
        };
        // On a node of a cluster a slot is one node's to fire: it is
        // claimed first, off the timer (the claim waits on NATS).
        let lease = match why {
            Firing::Slot | Firing::Missed => self.kernel.inner.cluster().cloned(),
            Firing::Asked => None,
        };
        if lease.is_none()
            && let Err(why) = self.commit_slot(name, slot, generation).await
        {
            return Fired::NotRecorded(why);
        }
        let kernel = self.kernel.clone();
        let name = name.to_owned();
        // Under the rules of whoever added it.
        let approvals = hivekernel_agents::approval::Carried::from(spec.approvals.clone());
        // Each firing is a trace of its own: its run, and all it causes.
        let opened = match self.kernel.inner.traces() {
            Some(traces) => {
                let (span, trace) = traces.cron(&spec.name, slot);
                (span, Some(trace))
            }
            None => (
                crate::otel::Span::default(),
                Some(hivekernel_agents::TraceContext::new_root()),
            ),
        };
        self.kernel.inner.tracker().spawn(crate::trace::scope_turn(
            opened,
            None,
            None,
            approvals,
            async move {
                if let Some(cluster) = lease
                    && !kernel
                        .cron()
                        .leased(&cluster, (owner, spec.target, &name), slot, generation, why)
                        .await
                {
                    return;
                }
                let started = Instant::now();
                let outcome = kernel.cron().run(&spec).await;
                if let Err(why) = &outcome {
                    crate::trace::fail("cron_failed", why);
                }
                let run = CronRun {
                    at_unix_ms: slot,
                    status: if outcome.is_ok() { "ok" } else { "failed" }.into(),
                    duration_ms: started.elapsed().as_millis() as u64,
                    output: super::run::preview(match &outcome {
                        Ok(text) | Err(text) => text,
                    }),
                };
                let mut state = kernel.inner.cron().state.lock();
                // Only the entry that fired counts the run, not one that replaced it.
                if state.ended(&name, generation) {
                    kernel.cron().record_run(&mut state, &name, run);
                }
            },
        ));
        Fired::Started
    }

    /// Commits slot `slot` of entry `name` before its action starts, so it
    /// fires at most once; when the store refuses, the run (of entry
    /// `generation`) ends there and the error says why.
    async fn commit_slot(
        self,
        name: &str,
        slot: u64,
        generation: u64,
    ) -> std::result::Result<(), String> {
        let fired = Write::CronFired {
            name: name.to_owned(),
            at_ms: slot,
        };
        let Err(err) = self.kernel.inner.store().commit(fired).await else {
            return Ok(());
        };
        tracing::error!(cron = %name, error = %err, "store: cron slot not recorded; not running it");
        self.kernel
            .inner
            .cron()
            .state
            .lock()
            .ended(name, generation);
        Err(err.to_string())
    }

    /// Adds a run to `name`'s history, in memory, in the store and as an event.
    fn record_run(self, state: &mut State, name: &str, run: CronRun) {
        let Some(entry) = state.entries.get_mut(name) else {
            return;
        };
        self.kernel.inner.store().submit(Write::CronRun {
            name: name.to_owned(),
            run: run.clone(),
        });
        self.kernel.inner.events().emit(
            entry.spec.target,
            crate::events::EventKind::CronRun {
                name: Arc::from(name),
                status: run.status.clone(),
                duration_ms: run.duration_ms,
            },
        );
        entry.record(run);
    }

    /// Checks a spec and parses its expression.
    fn check(self, caller: Caller, spec: &CronSpec) -> Result<Schedule> {
        let bad = |what: String| Err(KernelError::InvalidArgument(what));
        if spec.name.trim().is_empty()
            || spec.name.len() > MAX_CRON_NAME_BYTES
            || spec.name.chars().any(char::is_control)
        {
            return bad(format!(
                "cron name must be 1 to {MAX_CRON_NAME_BYTES} bytes without control characters, got {}",
                crate::error::shown(&spec.name)
            ));
        }
        let schedule = crontab::parse(&spec.expression)
            .or_else(|why| bad(format!("cron expression: {why}")))?;
        let limits = &self.kernel.inner.settings().limits;
        limits.check_payload("description", &spec.description)?;
        match (spec.action, &spec.template) {
            (super::CronAction::Spawn, None) => {
                return bad("cron action spawn needs a template".into());
            }
            (super::CronAction::Spawn, Some(template))
                if self.kernel.inner.cron().template(template).is_none() =>
            {
                let known: Vec<String> =
                    self.kernel.inner.cron().templates.keys().cloned().collect();
                return bad(format!(
                    "unknown template {template:?} (known: {})",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ));
            }
            (super::CronAction::Execute | super::CronAction::Message, Some(_)) => {
                return bad("a template is only for the spawn action".into());
            }
            _ => {}
        }
        let target = spec.target;
        let table = self.kernel.inner.table().read();
        let entry = table.get(target).ok_or(KernelError::NotFound(target))?;
        if !entry.is_alive() {
            return Err(KernelError::FailedPrecondition(format!(
                "process {target} has exited"
            )));
        }
        if target == Pid::KERNEL && spec.action != super::CronAction::Spawn {
            return bad("PID 1 runs no tasks and reads no messages; aim at an agent".into());
        }
        if let Caller::Process(me) = caller
            && me != target
            && !table.is_ancestor(me, target)
        {
            return Err(KernelError::PermissionDenied(format!(
                "process {me} may only schedule cron for itself or its descendants, not {target}"
            )));
        }
        Ok(schedule)
    }
}
