//! Supervision vocabulary, as in OTP: when a process is restarted, how often
//! it may be, and how a failed child affects its siblings.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use serde::{Deserialize, Serialize};

use crate::named::named_enum;

named_enum!(
    /// When the kernel restarts a process after it exits. An explicit kill
    /// and kernel shutdown never restart anything.
    RestartPolicy, "restart policy" {
        /// After any exit.
        Permanent = "permanent",
        /// Only after an abnormal exit (a runtime error or panic, a nonzero exit code).
        Transient = "transient",
        /// Never.
        Temporary = "temporary",
    }
);

impl RestartPolicy {
    /// Whether an exit (`abnormal` or not) calls for a restart.
    pub fn restarts_after(self, abnormal: bool) -> bool {
        match self {
            RestartPolicy::Permanent => true,
            RestartPolicy::Transient => abnormal,
            RestartPolicy::Temporary => false,
        }
    }
}

named_enum!(
    /// How a parent's children are restarted when one of them fails.
    Strategy, "strategy" {
        /// Only the failed child.
        OneForOne = "one_for_one",
        /// Every child: the others are stopped, then all are restarted in spawn order.
        OneForAll = "one_for_all",
        /// The failed child and the ones spawned after it.
        RestForOne = "rest_for_one",
    }
);

impl Default for Strategy {
    /// What a process without a supervision config has.
    fn default() -> Self {
        Strategy::OneForOne
    }
}

/// Most restarts a restart window may allow; it bounds each process's restart history.
pub const MAX_RESTARTS: u32 = 1000;
/// Longest restart window: 30 days.
pub const MAX_WITHIN_SECONDS: u64 = 30 * 24 * 3600;
/// Longest restart delay: one hour.
pub const MAX_BACKOFF_MS: u64 = 3_600_000;

/// When and how often a process is restarted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestartSpec {
    /// When it is restarted.
    pub policy: RestartPolicy,
    /// Restarts allowed within `within_seconds`; one more failure escalates
    /// to the parent (0: the first failure does).
    pub max_restarts: u32,
    /// Length of the sliding restart window.
    pub within_seconds: u64,
    /// `[first, most]` restart delay: it starts at `first` and doubles with
    /// each restart still in the window, up to `most`.
    pub backoff_ms: [u64; 2],
}

impl Default for RestartSpec {
    fn default() -> Self {
        RestartSpec::new(RestartPolicy::Temporary)
    }
}

impl RestartSpec {
    /// `policy` with the default intensity: 3 restarts in 5 s, backoff 100 ms to 30 s.
    pub fn new(policy: RestartPolicy) -> Self {
        RestartSpec {
            policy,
            max_restarts: 3,
            within_seconds: 5,
            backoff_ms: [100, 30_000],
        }
    }

    /// Admits one more restart at `now` given `recent`, when the restarts
    /// still counted were decided (oldest first; those older than the window
    /// are dropped), and returns its delay; or refuses it with the number of
    /// restarts already in the window. The one intensity rule, for processes
    /// and MCP servers alike.
    pub fn admit(&self, recent: &mut VecDeque<Instant>, now: Instant) -> Result<Duration, u32> {
        let window = Duration::from_secs(self.within_seconds);
        while recent
            .front()
            .is_some_and(|&at| now.saturating_duration_since(at) >= window)
        {
            recent.pop_front();
        }
        let count = u32::try_from(recent.len()).unwrap_or(u32::MAX);
        if count >= self.max_restarts {
            return Err(count);
        }
        recent.push_back(now);
        Ok(self.delay(count))
    }

    /// The delay before a restart when `recent` restarts are still in the window.
    pub fn delay(&self, recent: u32) -> Duration {
        let [first, most] = self.backoff_ms;
        let factor = 1u64.checked_shl(recent).unwrap_or(u64::MAX);
        Duration::from_millis(first.saturating_mul(factor).min(most))
    }

    /// Every problem with the numbers, as `(field, message)`.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        if self.max_restarts > MAX_RESTARTS {
            problems.push((
                "max_restarts",
                format!(
                    "must be between 0 and {MAX_RESTARTS}, got {}",
                    self.max_restarts
                ),
            ));
        }
        if !(1..=MAX_WITHIN_SECONDS).contains(&self.within_seconds) {
            problems.push((
                "within_seconds",
                format!(
                    "must be between 1 and {MAX_WITHIN_SECONDS}, got {}",
                    self.within_seconds
                ),
            ));
        }
        let [first, most] = self.backoff_ms;
        if most > MAX_BACKOFF_MS {
            problems.push((
                "backoff_ms",
                format!("the longest delay must be at most {MAX_BACKOFF_MS} ms, got {most}"),
            ));
        } else if first > most {
            problems.push((
                "backoff_ms",
                format!("the first delay {first} ms is longer than the longest {most} ms"),
            ));
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn policies_restart_as_documented() {
        use RestartPolicy::*;
        let table = [
            (Permanent, false, true),
            (Permanent, true, true),
            (Transient, false, false),
            (Transient, true, true),
            (Temporary, false, false),
            (Temporary, true, false),
        ];
        for (policy, abnormal, restarts) in table {
            assert_eq!(
                policy.restarts_after(abnormal),
                restarts,
                "{policy} abnormal={abnormal}"
            );
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let mut spec = RestartSpec::new(RestartPolicy::Permanent);
        spec.backoff_ms = [100, 1000];
        let delays: Vec<u128> = (0..6).map(|n| spec.delay(n).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(spec.delay(200).as_millis(), 1000, "no overflow");
        spec.backoff_ms = [0, 0];
        assert_eq!(spec.delay(5), Duration::ZERO);
    }

    #[test]
    fn problems_name_the_field() {
        let spec = RestartSpec {
            policy: RestartPolicy::Permanent,
            max_restarts: MAX_RESTARTS + 1,
            within_seconds: 0,
            backoff_ms: [500, 100],
        };
        let fields: Vec<&str> = spec.problems().iter().map(|(f, _)| *f).collect();
        assert_eq!(fields, ["max_restarts", "within_seconds", "backoff_ms"]);
        assert!(
            spec.problems()[2]
                .1
                .contains("500 ms is longer than the longest 100 ms")
        );
        assert!(RestartSpec::default().problems().is_empty());
        let names: Vec<&str> = Strategy::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(names, ["one_for_one", "one_for_all", "rest_for_one"]);
        let err = "forever".parse::<RestartPolicy>().unwrap_err();
        assert!(err.contains("permanent, transient, temporary"), "{err}");
    }
}
