//! Arbitrary text through the cron expression parser and the next-fire
//! computation: never a panic, and a next fire time is strictly later.

#![no_main]

use hivekernel_kernel::cron::next_fire;
use libfuzzer_sys::fuzz_target;

/// 2100-01-01T00:00:00Z in Unix ms: later "now"s are not interesting.
const HORIZON_MS: u64 = 4_102_444_800_000;

fuzz_target!(|data: &[u8]| {
    let Some((head, rest)) = data.split_first_chunk::<8>() else {
        return;
    };
    let after = u64::from_le_bytes(*head) % HORIZON_MS;
    let expression = String::from_utf8_lossy(rest);
    match next_fire(&expression, after) {
        Ok(Some(next)) => assert!(next > after, "{expression:?}: {next} <= {after}"),
        Ok(None) => {}
        Err(why) => assert!(!why.is_empty()),
    }
});
