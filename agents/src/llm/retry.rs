//! When to try a model call again: exponential backoff with jitter, and `Retry-After`.

use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, RETRY_AFTER};

/// Wait before the first retry.
const BASE: Duration = Duration::from_millis(200);
/// Longest backoff between two attempts when the provider names no wait.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// Longest wait a provider's `Retry-After` can impose.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// How long to sleep before retry number `retry` (0 for the first retry).
///
/// Exponential backoff (200 ms, x2, capped at 10 s) with "equal jitter": half
/// the step is fixed and half random, so clients that failed together spread
/// out but still wait a predictable minimum. A `Retry-After` from the provider
/// is honoured as a lower bound, capped at 60 s.
pub(super) fn delay(retry: u32, retry_after: Option<Duration>) -> Duration {
    let step = BASE
        .saturating_mul(2u32.saturating_pow(retry.min(16)))
        .min(MAX_BACKOFF);
    let half = step / 2;
    let backoff = half + jitter(half);
    match retry_after {
        Some(asked) => backoff.max(asked.min(MAX_RETRY_AFTER)),
        None => backoff,
    }
}

/// A random duration in `0..=max`.
fn jitter(max: Duration) -> Duration {
    // Every `RandomState` is freshly keyed, which is all the randomness jitter needs.
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(random % nanos.saturating_add(1))
}

/// The wait a response asks for: `retry-after-ms` (OpenAI, Azure), else
/// `Retry-After` as seconds or as an HTTP date.
pub(super) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let text = |name| headers.get(name).and_then(|value| value.to_str().ok());
    if let Some(ms) = text("retry-after-ms").and_then(parse_number) {
        return Some(capped_seconds(ms / 1000.0));
    }
    text(RETRY_AFTER.as_str()).and_then(parse_retry_after)
}

fn parse_retry_after(value: &str) -> Option<Duration> {
    if let Some(seconds) = parse_number(value) {
        return Some(capped_seconds(seconds));
    }
    let when = httpdate::parse_http_date(value.trim()).ok()?;
    Some(
        when.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

/// A finite, non-negative number (fractions allowed).
fn parse_number(value: &str) -> Option<f64> {
    let number: f64 = value.trim().parse().ok()?;
    (number.is_finite() && number >= 0.0).then_some(number)
}

/// `seconds` as a duration, capped before conversion so huge values cannot overflow.
fn capped_seconds(seconds: f64) -> Duration {
    Duration::from_secs_f64(seconds.min(MAX_RETRY_AFTER.as_secs_f64()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        for retry in 0..40 {
            let step = BASE
                .saturating_mul(2u32.saturating_pow(retry.min(16)))
                .min(MAX_BACKOFF);
            let wait = delay(retry, None);
            assert!(wait >= step / 2 && wait <= step, "retry {retry}: {wait:?}");
        }
        assert!(delay(0, None) <= Duration::from_millis(200));
        assert!(delay(30, None) >= Duration::from_secs(5));
    }

    #[test]
    fn retry_after_is_a_lower_bound_capped_at_a_minute() {
        assert!(delay(0, Some(Duration::from_secs(1))) >= Duration::from_secs(1));
        assert_eq!(
            delay(0, Some(Duration::from_secs(3600))),
            Duration::from_secs(60)
        );
    }

    #[test]
    fn parses_retry_after_forms() {
        assert_eq!(parse_retry_after("2"), Some(Duration::from_secs(2)));
        assert_eq!(
            parse_retry_after(" 1.5 "),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(parse_retry_after("-1"), None);
        assert_eq!(parse_retry_after("1e300"), Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after("soon"), None);
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO)
        );
        let later = SystemTime::now() + Duration::from_secs(30);
        let wait = parse_retry_after(&httpdate::fmt_http_date(later)).unwrap_or_default();
        assert!(wait > Duration::from_secs(25) && wait <= Duration::from_secs(30));
    }

    #[test]
    fn prefers_retry_after_ms() {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, "7".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(7)));
        headers.insert("retry-after-ms", "250".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(250)));
    }
}
