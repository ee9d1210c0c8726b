//! Small statistics and process measurements shared by the benches.

use std::future::Future;
use std::time::{Duration, Instant};

/// The median of `values` (the mean of the middle two for an even count).
pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    assert!(!values.is_empty(), "median of nothing");
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// The `p`-th percentile (0..=100) of `sorted`, nearest rank.
pub(crate) fn percentile(sorted: &[u64], p: f64) -> f64 {
    assert!(!sorted.is_empty(), "percentile of nothing");
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64
}

/// Latencies of single operations, in nanoseconds.
#[derive(Debug, Default)]
pub(crate) struct Latencies(Vec<u64>);

impl Latencies {
    pub(crate) fn with_capacity(n: usize) -> Self {
        Latencies(Vec::with_capacity(n))
    }

    pub(crate) fn record(&mut self, took: Duration) {
        self.0.push(took.as_nanos() as u64);
    }

    pub(crate) fn extend(&mut self, other: Latencies) {
        self.0.extend(other.0);
    }

    /// p50 and p99, in nanoseconds.
    pub(crate) fn p50_p99(mut self) -> (f64, f64) {
        self.0.sort_unstable();
        (percentile(&self.0, 50.0), percentile(&self.0, 99.0))
    }
}

/// Runs `run` once to warm up, then `runs` times, and returns what the measured runs reported.
pub(crate) async fn warm_runs<T, F, Fut>(runs: usize, mut run: F) -> Vec<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = T>,
{
    run().await;
    let mut values = Vec::with_capacity(runs);
    for _ in 0..runs {
        values.push(run().await);
    }
    values
}

/// [`warm_runs`] reduced to the median.
pub(crate) async fn warm_median<F, Fut>(runs: usize, run: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: Future<Output = f64>,
{
    median(warm_runs(runs, run).await)
}

/// Like [`warm_runs`] for a measurement and its floor, alternating them so
/// that drift on a shared machine weighs on both alike.
pub(crate) async fn warm_pairs<T, U, A, FA, B, FB>(
    runs: usize,
    mut ours: A,
    mut floor: B,
) -> (Vec<T>, Vec<U>)
where
    A: FnMut() -> FA,
    FA: Future<Output = T>,
    B: FnMut() -> FB,
    FB: Future<Output = U>,
{
    ours().await;
    floor().await;
    let (mut a, mut b) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    for _ in 0..runs {
        a.push(ours().await);
        b.push(floor().await);
    }
    (a, b)
}

/// [`warm_pairs`] reduced to the two medians.
pub(crate) async fn paired_medians<A, FA, B, FB>(runs: usize, ours: A, floor: B) -> (f64, f64)
where
    A: FnMut() -> FA,
    FA: Future<Output = f64>,
    B: FnMut() -> FB,
    FB: Future<Output = f64>,
{
    let (a, b) = warm_pairs(runs, ours, floor).await;
    (median(a), median(b))
}

/// Nanoseconds since `start`, as a float.
pub(crate) fn nanos_since(start: Instant) -> f64 {
    start.elapsed().as_nanos() as f64
}

/// This process's resident set size in bytes, from /proc/self/status.
pub(crate) fn rss_bytes() -> u64 {
    let status =
        std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status (Linux only)");
    let kb: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS line in /proc/self/status");
    kb * 1024
}
