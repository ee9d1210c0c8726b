//! Cron on a node of a cluster (docs/CLUSTER.md, "Events and cron"). A
//! config agent's entries run where the agent runs, and follow it when it
//! moves; each slot is claimed in the cluster before it fires, so a slot
//! fires once even while two nodes hold an entry (an agent briefly running
//! on two nodes, a paused node not yet fenced, catching up on its slots).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use cron::Schedule;
use hivekernel_agents::Pid;

use super::{CronHandle, CronRun, CronSource, CronSpec, Entry, Firing, Missed};
use crate::cluster::{CLAIM_AGE, Cluster, KeptCron, Lease};
use crate::crontab;
use crate::kernel::Caller;
use crate::reload::Outcome;
use crate::store::Write;

/// The windows, newest first, a missed slot is looked for in: the first
/// with a slot bounds the search to its own span, so a schedule every
/// second is not walked over a whole day.
const LOOKBACK: [Duration; 3] = [
    Duration::from_secs(60),
    Duration::from_secs(3600),
    CLAIM_AGE,
];

impl CronHandle<'_> {
    /// Whether this node fires slot `slot` of entry `name` of `owner` (of
    /// `generation`): it won the slot's claim and recorded the slot.
    /// Otherwise its run ends here: a slot another node fired is recorded
    /// as skipped (not when it was a missed slot looked for after a
    /// move), one whose claim failed as failed; either way the slot has
    /// passed for the entry.
    pub(super) async fn leased(
        self,
        cluster: &Cluster,
        (owner, target, name): (Pid, Pid, &str),
        slot: u64,
        generation: u64,
        why: Firing,
    ) -> bool {
        // An entry that follows its target is claimed under it.
        let follows = self.follows(target).map(|_| target);
        let (status, output) = match cluster.lease_slot((owner, follows), name, slot).await {
            Ok(Lease::Won) => return self.commit_slot(name, slot, generation).await.is_ok(),
            Ok(Lease::Taken(_)) if why == Firing::Missed => (None, String::new()),
            Ok(Lease::Taken(node)) if node.is_empty() => {
                (Some("skipped"), "another node fired this slot".to_owned())
            }
            Ok(Lease::Taken(node)) => (Some("skipped"), format!("node {node} fired this slot")),
            Err(err) => (
                Some("failed"),
                format!("not fired: the slot could not be claimed in the cluster: {err}"),
            ),
        };
        self.kernel.inner.store().submit(Write::CronFired {
            name: name.to_owned(),
            at_ms: slot,
        });
        let mut state = self.kernel.inner.cron().state.lock();
        if state.ended(name, generation)
            && let Some(status) = status
        {
            let run = CronRun {
                at_unix_ms: slot,
                status: status.into(),
                duration_ms: 0,
                output,
            };
            self.record_run(&mut state, name, run);
        }
        false
    }

    /// The slot a `run_once` entry fires for slots missed since `since_ms`:
    /// `now_ms` on a kernel alone; on a node of a cluster the latest slot
    /// that passed, so that it is claimed as the same slot whichever node
    /// looks (the node that ran the entry may have fired it).
    pub(super) fn missed_slot(self, schedule: &Schedule, since_ms: u64, now_ms: u64) -> u64 {
        if self.kernel.inner.cluster().is_none() {
            return now_ms;
        }
        latest_slot(schedule, since_ms, now_ms).unwrap_or(now_ms)
    }

    /// On a node that took config agent `pid` over from another: its config
    /// entries `entries`, which follow it. A `run_once` entry fires its
    /// latest slot of the last day now, unless a node fired it already (the
    /// claim tells): its node may have gone before it could.
    pub(crate) async fn adopt(self, pid: Pid, entries: &[CronSpec]) {
        if entries.is_empty() {
            return;
        }
        let declared = crate::kernel::cron::declared(pid, entries).collect();
        for change in self.declare(declared, false).await {
            if change.outcome == Outcome::Failed {
                tracing::warn!(cron = %change.name, %pid, detail = %change.detail, "cron entry of a config agent taken over not loaded");
            }
        }
        let now = self.now_ms();
        let since = now.saturating_sub(CLAIM_AGE.as_millis() as u64);
        let missed: Vec<(String, u64)> = {
            let state = self.kernel.inner.cron().state.lock();
            entries
                .iter()
                .filter(|spec| spec.missed == Missed::RunOnce)
                .filter_map(|spec| {
                    let entry = state.entries.get(&spec.name)?;
                    // Its own, not an API entry of the same name kept instead.
                    if entry.source != CronSource::Config || entry.owner != pid {
                        return None;
                    }
                    let after = since.max(entry.last_fire_ms.unwrap_or(0));
                    let slot = latest_slot(&entry.schedule, after, now)?;
                    entry.enabled().then(|| (spec.name.clone(), slot))
                })
                .collect()
        };
        for (name, slot) in missed {
            self.fire(&name, slot, Firing::Missed).await;
        }
    }

    /// On a node whose copy of config agent `pid` stood down (another node
    /// runs it): the agent's config entries, and the API entries aimed at
    /// it (kept in `hk_cron`, where the other node read them), which go
    /// with it.
    pub(crate) fn forget(self, pid: Pid) {
        let mut state = self.kernel.inner.cron().state.lock();
        let names: Vec<String> = state
            .entries
            .values()
            .filter(|entry| match entry.source {
                CronSource::Config => entry.owner == pid,
                CronSource::Api => entry.spec.target == pid,
            })
            .map(|entry| entry.spec.name.clone())
            .collect();
        for name in names {
            state.remove(&name);
            self.kernel.inner.store().submit(Write::CronRemove(name));
        }
    }
}

impl CronHandle<'_> {
    /// The cluster, when an API entry aimed at `target` follows it: a
    /// process this node runs that may move (docs/CLUSTER.md, "Events and
    /// cron").
    pub(super) fn follows(self, target: Pid) -> Option<Arc<Cluster>> {
        let cluster = self.kernel.inner.cluster()?;
        self.kernel
            .node()
            .moves_from_here(target)
            .then(|| cluster.clone())
    }

    /// Takes on the API entries the cluster keeps for `targets`, processes
    /// this node has just started after their node was lost (or a config
    /// agent it started): each runs here from now on (its history stayed
    /// behind), and a slot it missed meanwhile is handled by its `missed`
    /// policy, claimed under its target as on the node before. Waits for
    /// this node's cron to have started. An entry here already is left as
    /// it is; one whose name another entry here has, or that does not
    /// pass the checks of an add, is left out, said in the log.
    pub(crate) async fn take(self, targets: &[Pid]) {
        let Some(cluster) = self.kernel.inner.cluster().cloned() else {
            return;
        };
        if targets.is_empty() {
            return;
        }
        let mut ready = self.kernel.inner.cron().ready.subscribe();
        tokio::select! {
            () = self.kernel.inner.stop_begun().cancelled() => return,
            started = ready.wait_for(|ready| *ready) => if started.is_err() { return },
        }
        let wanted: HashSet<Pid> = targets.iter().copied().collect();
        let kept = match cluster.crons_of(&wanted).await {
            Ok(kept) => kept,
            Err(err) => {
                tracing::error!(error = %err, "cluster: cron entries of processes taken over not read; they do not run here");
                return;
            }
        };
        if kept.is_empty() {
            return;
        }
        let admin = self.kernel.inner.cron().admin.clone().lock_owned().await;
        let now = self.now_ms();
        let mut taken = Vec::new();
        for (target, kept) in kept {
            let KeptCron {
                owner,
                created_ms,
                spec,
                ..
            } = kept;
            let name = spec.name.clone();
            if spec.target != target || self.follows(target).is_none() {
                tracing::warn!(cron = name, %target, aimed_at = %spec.target, "cluster: a cron entry in hk_cron is not for a process that moved here; left out");
                continue;
            }
            let here = self
                .kernel
                .inner
                .cron()
                .state
                .lock()
                .entries
                .get(&name)
                .map(|entry| (entry.source, entry.spec.target));
            match here {
                Some((CronSource::Api, aimed)) if aimed == target => continue,
                Some(_) => {
                    tracing::warn!(cron = name, %target, "cluster: a cron entry taken over has the name of another here; left out");
                    continue;
                }
                None => {}
            }
            let as_owner = if owner == Pid::KERNEL {
                Caller::Admin
            } else {
                Caller::Process(owner)
            };
            let schedule = match self.check(as_owner, &spec) {
                Ok(schedule) => schedule,
                Err(err) => {
                    tracing::warn!(cron = name, error = %err, "cluster: a cron entry taken over is refused here; left out");
                    continue;
                }
            };
            let generation = self.kernel.inner.cron().generation();
            let entry = Entry::added(spec, schedule, owner, created_ms, generation);
            // Written again as this node's: the key names who holds it.
            if let Err(err) = cluster.keep_cron(owner, &entry.spec, created_ms).await {
                tracing::warn!(cron = name, error = %err, "cluster: a cron entry taken over not written back");
            }
            if let Err(err) = self.kernel.inner.store().commit(entry.put()).await {
                tracing::error!(cron = name, error = %err, "store: a cron entry taken over not recorded; it runs until this node stops");
            }
            let catch_up = entry.spec.missed == Missed::RunOnce && entry.enabled();
            let mut state = self.kernel.inner.cron().state.lock();
            state.insert(entry);
            state.reschedule(&name, now);
            if catch_up && let Some(entry) = state.entries.get(&name) {
                let since = now.saturating_sub(CLAIM_AGE.as_millis() as u64);
                if let Some(slot) = latest_slot(&entry.schedule, since.max(created_ms), now) {
                    taken.push((name.clone(), slot));
                }
            }
            tracing::info!(cron = name, %target, "cluster: cron entry taken over with its target");
        }
        drop(admin);
        self.kernel.inner.cron().wake.notify_one();
        for (name, slot) in taken {
            self.fire(&name, slot, Firing::Missed).await;
        }
    }

    /// Marks this node's cron as started: entries taken over may join it.
    pub(crate) fn started(self) {
        self.kernel.inner.cron().ready.send_replace(true);
    }
}

/// The latest slot of `schedule` in `(after_ms, now_ms]`.
fn latest_slot(schedule: &Schedule, after_ms: u64, now_ms: u64) -> Option<u64> {
    let window = LOOKBACK.iter().find_map(|span| {
        let from = after_ms.max(now_ms.saturating_sub(span.as_millis() as u64));
        crontab::next_after(schedule, from)
            .filter(|slot| *slot <= now_ms)
            .map(|first| (from, first))
    });
    let (_, mut latest) = window?;
    while let Some(next) = crontab::next_after(schedule, latest).filter(|slot| *slot <= now_ms) {
        latest = next;
    }
    Some(latest)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::latest_slot;

    #[test]
    fn the_latest_slot_is_the_last_one_at_or_before_now() {
        let every_second = crate::crontab::parse("* * * * * *").unwrap();
        let now = 1_700_000_000_500;
        assert_eq!(latest_slot(&every_second, 0, now), Some(1_700_000_000_000));
        // Nothing passed since the last slot fired.
        assert_eq!(latest_slot(&every_second, 1_700_000_000_000, now), None);
        let hourly = crate::crontab::parse("0 * * * *").unwrap();
        let hour = 3_600_000;
        let top = (now / hour) * hour;
        assert_eq!(latest_slot(&hourly, 0, now), Some(top));
        assert_eq!(latest_slot(&hourly, top, now), None);
        // Beyond the last day nothing is looked for.
        let yearly = crate::crontab::parse("0 0 1 1 *").unwrap();
        assert_eq!(latest_slot(&yearly, 0, now), None);
    }
}
