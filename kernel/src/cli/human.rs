//! Figures as people read them in text output: ages, sizes, counts,
//! dollars. `--json` keeps the exact numbers.

/// `250ms`, `1.5s`, `45s`, `12m05s`, `3h05m`, `2d04h`: the two largest units
/// of a duration in milliseconds.
pub(super) fn duration(ms: u64) -> String {
    let secs = ms / 1000;
    match ms {
        0..1000 => return format!("{ms}ms"),
        1000..10_000 => return format!("{:.1}s", ms as f64 / 1000.0),
        _ => {}
    }
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        3600..86_400 => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
        _ => format!("{}d{:02}h", secs / 86_400, secs % 86_400 / 3600),
    }
}

/// How long ago `at_unix_ms` was, as [`duration`]; `-` for 0 (never).
pub(super) fn age(at_unix_ms: u64, now_unix_ms: u64) -> String {
    if at_unix_ms == 0 {
        return "-".to_owned();
    }
    duration(now_unix_ms.saturating_sub(at_unix_ms))
}

/// `512 B`, `1.5 KiB`, `16 MiB`, `1.0 GiB`.
pub(super) fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value < 10.0 {
        format!("{value:.1} {}", UNITS[unit])
    } else {
        format!("{value:.0} {}", UNITS[unit])
    }
}

/// `1,234,567`.
pub(super) fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `$0.0042`, `$12.50`: four decimals below a dollar, two above.
pub(super) fn usd(amount: f64) -> String {
    if amount < 1.0 {
        format!("${amount:.4}")
    } else {
        format!("${amount:.2}")
    }
}

/// Current Unix time in milliseconds.
pub(super) fn now_ms() -> u64 {
    crate::event::unix_ms(std::time::SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_read_as_people_write_them() {
        assert_eq!(duration(0), "0ms");
        assert_eq!(duration(250), "250ms");
        assert_eq!(duration(1500), "1.5s");
        assert_eq!(duration(45_000), "45s");
        assert_eq!(duration(12 * 60_000 + 5_000), "12m05s");
        assert_eq!(duration(3 * 3_600_000 + 5 * 60_000), "3h05m");
        assert_eq!(duration(2 * 86_400_000 + 4 * 3_600_000), "2d04h");
        assert_eq!(age(0, 5), "-");
        assert_eq!(age(1_000, 61_000), "1m00s");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(16 << 20), "16 MiB");
        assert_eq!(bytes(1 << 30), "1.0 GiB");
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(usd(0.00421), "$0.0042");
        assert_eq!(usd(12.5), "$12.50");
    }
}
