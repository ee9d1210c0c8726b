//! Model usage per process and per subtree, and per-process rate limits.
//!
//! Most processes never call a model or spawn, so their meter is allocated
//! on first use: an idle process pays one word and a flag.

use std::num::NonZeroU32;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hivekernel_agents::LlmUsage;
use hivekernel_agents::llm::Usage;
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::error::{KernelError, Result};

/// Usage counters and rate-limit state of one process.
#[derive(Debug, Default)]
pub(crate) struct Meter(OnceLock<Box<Counters>>);

#[derive(Debug, Default)]
struct Counters {
    own: Counts,
    subtree: Counts,
    llm_calls: Mutex<Bucket>,
    spawns: Mutex<Bucket>,
}

#[derive(Debug, Default)]
struct Counts {
    calls: AtomicU64,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    cost_nano_usd: AtomicU64,
}

impl Counts {
    fn add(&self, usage: Usage, cost_nano_usd: u64) {
        self.add_all(LlmUsage {
            calls: 1,
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            cost_nano_usd,
        });
    }

    fn add_all(&self, usage: LlmUsage) {
        self.calls.fetch_add(usage.calls, Ordering::Relaxed);
        self.prompt_tokens
            .fetch_add(usage.prompt_tokens, Ordering::Relaxed);
        self.completion_tokens
            .fetch_add(usage.completion_tokens, Ordering::Relaxed);
        self.cost_nano_usd
            .fetch_add(usage.cost_nano_usd, Ordering::Relaxed);
    }

    fn snapshot(&self) -> LlmUsage {
        LlmUsage {
            calls: self.calls.load(Ordering::Relaxed),
            prompt_tokens: self.prompt_tokens.load(Ordering::Relaxed),
            completion_tokens: self.completion_tokens.load(Ordering::Relaxed),
            cost_nano_usd: self.cost_nano_usd.load(Ordering::Relaxed),
        }
    }
}

impl Meter {
    fn counters(&self) -> &Counters {
        self.0.get_or_init(Box::default)
    }

    /// Records one call of this process (its subtree's count included).
    pub(crate) fn record_own(&self, usage: Usage, cost_nano_usd: u64) {
        let counters = self.counters();
        counters.own.add(usage, cost_nano_usd);
        counters.subtree.add(usage, cost_nano_usd);
    }

    /// Records one call of a descendant.
    pub(crate) fn record_descendant(&self, usage: Usage, cost_nano_usd: u64) {
        self.counters().subtree.add(usage, cost_nano_usd);
    }

    /// This process's own usage.
    pub(crate) fn snapshot(&self) -> LlmUsage {
        self.0.get().map(|c| c.own.snapshot()).unwrap_or_default()
    }

    /// This process's usage plus every descendant's.
    pub(crate) fn subtree(&self) -> LlmUsage {
        self.0
            .get()
            .map(|c| c.subtree.snapshot())
            .unwrap_or_default()
    }

    /// A meter starting where this one stands: a restarted process keeps its usage.
    pub(crate) fn carried(&self) -> Meter {
        let meter = Meter::default();
        if let Some(counters) = self.0.get() {
            meter.add_kept(counters.own.snapshot(), counters.subtree.snapshot());
        }
        meter
    }

    /// Adds what the store kept from before a restart to what is counted now.
    pub(crate) fn add_kept(&self, own: LlmUsage, subtree: LlmUsage) {
        let counters = self.counters();
        counters.own.add_all(own);
        counters.subtree.add_all(subtree);
    }

    /// Takes one model call from the `per_minute` allowance, if there is
    /// one; answers the level left, to keep.
    pub(crate) fn take_llm_call(
        &self,
        per_minute: Option<NonZeroU32>,
        what: &str,
    ) -> Result<Option<f64>> {
        let Some(per_minute) = per_minute.map(NonZeroU32::get) else {
            return Ok(None);
        };
        self.counters()
            .llm_calls
            .lock()
            .take(per_minute, Instant::now())
            .map(Some)
            .map_err(|wait| rate_limited(what, "llm_calls_per_minute", per_minute, wait))
    }

    /// Takes one spawn from the `per_minute` allowance, if there is one;
    /// answers the level left, to keep.
    pub(crate) fn take_spawn(
        &self,
        per_minute: Option<NonZeroU32>,
        what: &str,
    ) -> Result<Option<f64>> {
        let Some(per_minute) = per_minute.map(NonZeroU32::get) else {
            return Ok(None);
        };
        self.counters()
            .spawns
            .lock()
            .take(per_minute, Instant::now())
            .map(Some)
            .map_err(|wait| rate_limited(what, "spawns_per_minute", per_minute, wait))
    }

    /// Sets the buckets to the levels kept before a restart (each as of an
    /// instant), so a restart does not refill them.
    pub(crate) fn restore_buckets(
        &self,
        llm_calls: Option<(f64, Instant)>,
        spawns: Option<(f64, Instant)>,
    ) {
        if llm_calls.is_none() && spawns.is_none() {
            return;
        }
        let counters = self.counters();
        let sane = |(level, at): (f64, Instant)| {
            (level.is_finite() && level >= 0.0).then_some((level, at))
        };
        if let Some(level) = llm_calls.and_then(sane) {
            counters.llm_calls.lock().level = Some(level);
        }
        if let Some(level) = spawns.and_then(sane) {
            counters.spawns.lock().level = Some(level);
        }
    }
}

fn rate_limited(what: &str, limit: &str, per_minute: u32, wait: Duration) -> KernelError {
    KernelError::RateLimited(format!(
        "{what}: rate limit {limit} = {per_minute} reached; the next one is allowed in {} ms",
        wait.as_millis().max(1)
    ))
}

/// A token bucket holding up to a minute's allowance, refilled continuously.
#[derive(Debug, Default)]
struct Bucket {
    /// Tokens as of `at`; `None` until first used (it starts full).
    level: Option<(f64, Instant)>,
}

impl Bucket {
    /// Takes one token and answers the level left, or says how long until
    /// one is there.
    fn take(&mut self, per_minute: u32, now: Instant) -> std::result::Result<f64, Duration> {
        let capacity = f64::from(per_minute);
        let per_second = capacity / 60.0;
        let level = match self.level {
            None => capacity,
            Some((level, at)) => {
                let refill = now.saturating_duration_since(at).as_secs_f64() * per_second;
                (level + refill).min(capacity)
            }
        };
        if level >= 1.0 {
            self.level = Some((level - 1.0, now));
            Ok(level - 1.0)
        } else {
            self.level = Some((level, now));
            Err(Duration::from_secs_f64((1.0 - level) / per_second))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_bucket_allows_a_minutes_worth_then_refills() {
        let start = Instant::now();
        let mut bucket = Bucket::default();
        for _ in 0..3 {
            bucket.take(3, start).unwrap();
        }
        let wait = bucket.take(3, start).unwrap_err();
        assert_eq!(wait, Duration::from_secs(20));
        bucket.take(3, start + Duration::from_secs(20)).unwrap();
        assert!(bucket.take(3, start + Duration::from_secs(21)).is_err());
        // A long pause refills it to capacity, not beyond.
        let later = start + Duration::from_secs(3600);
        for _ in 0..3 {
            bucket.take(3, later).unwrap();
        }
        assert!(bucket.take(3, later).is_err());
    }

    #[test]
    fn usage_counts_for_the_process_and_its_subtree() {
        let meter = Meter::default();
        assert_eq!(meter.snapshot(), LlmUsage::default());
        let usage = Usage {
            prompt_tokens: 10,
            completion_tokens: 5,
        };
        meter.record_own(usage, 7);
        meter.record_descendant(usage, 3);
        assert_eq!(meter.snapshot().total_tokens(), 15);
        assert_eq!(meter.subtree().total_tokens(), 30);
        assert_eq!(meter.subtree().cost_nano_usd, 10);
        let carried = meter.carried();
        assert_eq!(carried.subtree(), meter.subtree());
    }
}
