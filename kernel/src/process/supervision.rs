//! The supervision part of a table row: a process's restart policy, its
//! strategy for its children, and its restart history. The decisions that
//! use it are the supervisor's (supervisor/restart.rs).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use hivekernel_agents::{ExitRecord, RestartSpec, Strategy};
use tokio::time::Instant;

use super::{Entry, ProcShared};

/// A process's restart policy, its strategy for its children, and its restart history.
#[derive(Debug)]
pub(crate) struct Supervision {
    restart: RestartSpec,
    strategy: Strategy,
    /// Restarts so far.
    restarts: u32,
    /// When the restarts still in the window were decided, oldest first;
    /// never longer than `restart.max_restarts`.
    recent: VecDeque<Instant>,
    /// The restart group it waits in, while it waits to be restarted.
    pending: Option<u64>,
    /// The exit its latest restart followed.
    last_exit: Option<Box<ExitRecord>>,
}

impl Supervision {
    /// What a new process carries; `None` for the defaults, which cost nothing.
    pub(crate) fn for_spawn(restart: RestartSpec, strategy: Strategy) -> Option<Box<Supervision>> {
        let default = !restart.policy.restarts_after(true) && strategy == Strategy::OneForOne;
        (!default).then(|| Box::new(Supervision::new(restart, strategy)))
    }

    pub(crate) fn new(restart: RestartSpec, strategy: Strategy) -> Self {
        Supervision {
            restart,
            strategy,
            restarts: 0,
            recent: VecDeque::new(),
            pending: None,
            last_exit: None,
        }
    }

    /// Counts a restart that has happened; it no longer waits in a group.
    /// Returns the restarts so far.
    pub(crate) fn restarted(&mut self) -> u32 {
        self.pending = None;
        self.restarts = self.restarts.saturating_add(1);
        self.restarts
    }

    /// Admits one more restart at `now` and returns its delay, or refuses
    /// it with the number of restarts already in the window.
    pub(crate) fn admit(&mut self, now: Instant) -> Result<Duration, u32> {
        self.restart.admit(&mut self.recent, now)
    }

    /// Carries on after a kernel restart with the restarts it had and those
    /// still in its window (when they were decided, oldest first), so a
    /// crash loop across kernel restarts escalates at its intensity.
    pub(crate) fn carry(
        &mut self,
        restarts: u32,
        recent: impl Iterator<Item = Instant>,
        last_exit: Option<ExitRecord>,
    ) {
        self.restarts = restarts;
        self.last_exit = last_exit.map(Box::new);
        self.recent = recent.collect();
        let keep = usize::try_from(self.restart.max_restarts).unwrap_or(usize::MAX);
        while self.recent.len() > keep {
            self.recent.pop_front();
        }
    }
}

impl Entry {
    /// Its restart policy and intensity.
    pub(crate) fn restart_spec(&self) -> RestartSpec {
        self.sup
            .as_ref()
            .map_or_else(RestartSpec::default, |s| s.restart)
    }

    /// How its children are restarted when one fails.
    pub(crate) fn strategy(&self) -> Strategy {
        self.sup
            .as_ref()
            .map_or(Strategy::OneForOne, |s| s.strategy)
    }

    /// Times it has been restarted.
    pub(crate) fn restarts(&self) -> u32 {
        self.sup.as_ref().map_or(0, |s| s.restarts)
    }

    /// The exit its latest restart followed.
    pub(crate) fn last_exit(&self) -> Option<&ExitRecord> {
        self.sup.as_ref().and_then(|s| s.last_exit.as_deref())
    }

    /// Its restart history as the store keeps it (`pending`: a restart is
    /// decided and not yet done).
    pub(crate) fn history_write(
        &self,
        pid: hivekernel_agents::Pid,
        pending: bool,
    ) -> crate::store::Write {
        let now = Instant::now();
        let now_ms = crate::events::unix_ms(std::time::SystemTime::now());
        let recent_ms = self
            .sup
            .as_ref()
            .map(|s| {
                s.recent
                    .iter()
                    .map(|at| {
                        let ago = now.saturating_duration_since(*at).as_millis();
                        now_ms.saturating_sub(u64::try_from(ago).unwrap_or(u64::MAX))
                    })
                    .collect()
            })
            .unwrap_or_default();
        crate::store::Write::Restarts {
            pid,
            restarts: self.restarts(),
            recent_ms,
            pending,
            last_exit: self
                .last_exit()
                .and_then(|record| serde_json::to_string(record).ok()),
        }
    }

    /// Whether it has exited and waits to be restarted.
    pub(crate) fn is_restarting(&self) -> bool {
        self.pending_group().is_some()
    }

    /// Whether `proc` is its live, running incarnation.
    pub(crate) fn is_running(&self, proc: &Arc<ProcShared>) -> bool {
        self.is_alive() && !self.is_restarting() && Arc::ptr_eq(&self.proc, proc)
    }

    pub(crate) fn pending_group(&self) -> Option<u64> {
        self.sup.as_ref().and_then(|s| s.pending)
    }

    pub(crate) fn wait_in_group(&mut self, group: u64) {
        self.sup_mut().pending = Some(group);
    }

    /// Records the exit a restart follows.
    pub(crate) fn exited_for_restart(&mut self, record: ExitRecord) {
        self.sup_mut().last_exit = Some(Box::new(record));
    }

    fn sup_mut(&mut self) -> &mut Supervision {
        self.sup.get_or_insert_with(|| {
            Box::new(Supervision::new(
                RestartSpec::default(),
                Strategy::OneForOne,
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use hivekernel_agents::RestartPolicy;

    use super::*;

    fn supervision(max_restarts: u32, within_seconds: u64) -> Supervision {
        let mut spec = RestartSpec::new(RestartPolicy::Permanent);
        spec.max_restarts = max_restarts;
        spec.within_seconds = within_seconds;
        spec.backoff_ms = [100, 1000];
        Supervision::new(spec, Strategy::OneForOne)
    }

    #[test]
    fn intensity_admits_max_restarts_per_window_then_refuses() {
        let start = Instant::now();
        let mut sup = supervision(3, 5);
        let delays: Vec<u128> = (0..3)
            .map(|i| {
                sup.admit(start + Duration::from_millis(i))
                    .unwrap()
                    .as_millis()
            })
            .collect();
        assert_eq!(delays, [100, 200, 400]);
        assert_eq!(sup.admit(start + Duration::from_secs(1)), Err(3));
        // Once the window has moved past the first restart, one more is allowed.
        assert_eq!(
            sup.admit(start + Duration::from_secs(5))
                .map(|d| d.as_millis()),
            Ok(400)
        );
    }

    #[test]
    fn an_empty_window_resets_the_backoff() {
        let start = Instant::now();
        let mut sup = supervision(3, 5);
        sup.admit(start).unwrap();
        sup.admit(start).unwrap();
        let later = start + Duration::from_secs(60);
        assert_eq!(sup.admit(later), Ok(Duration::from_millis(100)));
    }

    #[test]
    fn max_restarts_zero_refuses_the_first_restart() {
        let mut sup = supervision(0, 5);
        assert_eq!(sup.admit(Instant::now()), Err(0));
    }

    #[test]
    fn defaults_cost_nothing() {
        let temporary = RestartSpec::default();
        assert!(Supervision::for_spawn(temporary, Strategy::OneForOne).is_none());
        assert!(Supervision::for_spawn(temporary, Strategy::OneForAll).is_some());
        let permanent = RestartSpec::new(RestartPolicy::Permanent);
        assert!(Supervision::for_spawn(permanent, Strategy::OneForOne).is_some());
    }
}
