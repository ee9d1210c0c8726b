//! Cron expressions: standard 5-field crontab lines, and 6/7-field lines
//! with seconds (and a year), as the `cron` crate reads them.
//!
//! A 5-field line gets a `0` seconds field in front. Its day-of-week field
//! is crontab's (0 or 7 is Sunday, 1 Monday, ... 6 Saturday), so numbers
//! there are turned into day names before parsing; 6/7-field lines are
//! passed through unchanged (there, as in the `cron` crate, 1 is Sunday).
//! `@hourly`, `@daily`, `@weekly`, `@monthly` and `@yearly` are accepted.

use std::str::FromStr;

use chrono::{DateTime, TimeZone, Utc};
use cron::Schedule;

/// Longest expression accepted, in bytes.
const MAX_EXPRESSION_BYTES: usize = 256;

/// Parses `expression`, or says what is wrong with it.
pub(crate) fn parse(expression: &str) -> Result<Schedule, String> {
    let text = expression.trim();
    if text.is_empty() {
        return Err("expression is empty".into());
    }
    if text.len() > MAX_EXPRESSION_BYTES {
        return Err(format!(
            "expression is {} bytes (at most {MAX_EXPRESSION_BYTES})",
            text.len()
        ));
    }
    let normalized = if text.starts_with('@') {
        text.to_owned()
    } else {
        let fields: Vec<&str> = text.split_whitespace().collect();
        match fields.len() {
            5 => {
                let dow = crontab_weekdays(fields[4])?;
                format!(
                    "0 {} {} {} {} {dow}",
                    fields[0], fields[1], fields[2], fields[3]
                )
            }
            6 | 7 => fields.join(" "),
            n => {
                return Err(format!(
                    "expected 5 fields (minute hour day-of-month month day-of-week), or 6 or 7 \
                     with seconds first (and a year last); got {n}"
                ));
            }
        }
    };
    Schedule::from_str(&normalized).map_err(|err| {
        // The parser draws a caret under the 6-field form; its last line says what is wrong.
        let err = err.to_string();
        let why = err
            .lines()
            .map(str::trim)
            .rfind(|l| !l.is_empty())
            .unwrap_or("invalid");
        format!("cannot parse {text:?}: {why}")
    })
}

/// The first time `schedule` fires strictly after `after_ms` (Unix ms).
pub(crate) fn next_after(schedule: &Schedule, after_ms: u64) -> Option<u64> {
    let millis = i64::try_from(after_ms).ok()?;
    let after: DateTime<Utc> = Utc.timestamp_millis_opt(millis).single()?;
    let next = schedule.after(&after).next()?;
    u64::try_from(next.timestamp_millis()).ok()
}

/// Crontab's numeric weekdays (0-7, Sunday twice) as names the `cron` crate reads.
fn crontab_weekdays(field: &str) -> Result<String, String> {
    const NAMES: [&str; 8] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN"];
    let mut out = String::with_capacity(field.len() + 8);
    let mut number = String::new();
    let mut after_slash = false;
    let flush = |number: &mut String, out: &mut String, after_slash: bool| -> Result<(), String> {
        if number.is_empty() {
            return Ok(());
        }
        if after_slash {
            out.push_str(number);
        } else {
            let day: usize = number
                .parse()
                .ok()
                .filter(|d| *d <= 7)
                .ok_or_else(|| format!("day-of-week {number} is not 0-7"))?;
            out.push_str(NAMES[day]);
        }
        number.clear();
        Ok(())
    };
    for c in field.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        flush(&mut number, &mut out, after_slash)?;
        match c {
            '/' => after_slash = true,
            ',' | '-' => after_slash = false,
            _ => {}
        }
        out.push(c);
    }
    flush(&mut number, &mut out, after_slash)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// 2026-11-23 00:00:00 UTC, a Monday.
    const MONDAY: u64 = 1_795_392_000_000;

    #[test]
    fn five_fields_are_crontab_with_seconds_at_zero() {
        let every_5_min = parse("*/5 * * * *").unwrap();
        assert_eq!(next_after(&every_5_min, MONDAY), Some(MONDAY + 300_000));
        // 0 is Sunday in crontab: the next one is 6 days on.
        let sundays = parse("0 0 * * 0").unwrap();
        assert_eq!(next_after(&sundays, MONDAY), Some(MONDAY + 6 * 86_400_000));
        let weekdays = parse("30 9 * * 1-5").unwrap();
        assert_eq!(
            next_after(&weekdays, MONDAY),
            Some(MONDAY + 9 * 3_600_000 + 1_800_000)
        );
    }

    #[test]
    fn six_and_seven_fields_carry_seconds_and_a_year() {
        let every_10_s = parse("*/10 * * * * *").unwrap();
        assert_eq!(next_after(&every_10_s, MONDAY), Some(MONDAY + 10_000));
        let once = parse("0 0 12 1 1 * 2030").unwrap();
        assert!(next_after(&once, MONDAY).unwrap() > MONDAY);
        let hourly = parse("@hourly").unwrap();
        assert_eq!(next_after(&hourly, MONDAY), Some(MONDAY + 3_600_000));
    }

    #[test]
    fn bad_expressions_say_what_is_wrong() {
        for (text, says) in [
            ("", "empty"),
            ("* * *", "got 3"),
            ("* * * * * * * *", "got 8"),
            ("61 * * * *", "cannot parse"),
            ("* * * * 9", "day-of-week 9"),
            ("a b c d e", "cannot parse"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(says), "{text:?}: {err}");
        }
        assert!(parse(&"* ".repeat(200)).unwrap_err().contains("bytes"));
    }
}
