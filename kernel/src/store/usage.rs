//! Model usage over time: every call's tokens and cost added to its UTC
//! day, model and role (`usage_daily`), in the transaction that charges it
//! to its process; read back summed by one of the three.

use hivekernel_agents::LlmUsage;
use hivekernel_agents::llm::Usage;

use super::{Store, StoreError, from_sql_u64, to_sql_u64};

/// What a usage report is summed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageBy {
    /// The model name the kernel knows the call by.
    Model,
    /// The UTC day, `YYYY-MM-DD`.
    Day,
    /// The calling process's role.
    Role,
}

impl UsageBy {
    fn column(self) -> &'static str {
        match self {
            UsageBy::Model => "model",
            UsageBy::Day => "day",
            UsageBy::Role => "role",
        }
    }
}

impl std::str::FromStr for UsageBy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "model" => Ok(UsageBy::Model),
            "day" => Ok(UsageBy::Day),
            "role" => Ok(UsageBy::Role),
            other => Err(format!(
                "cannot sum usage by {} (expected model, day or role)",
                hivekernel_agents::text::shown(other)
            )),
        }
    }
}

/// One line of a usage report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRow {
    /// The model, day or role.
    pub key: String,
    /// What the calls under it used and cost.
    pub usage: LlmUsage,
}

/// Whether `text` is a day as [`utc_day`] writes it (`YYYY-MM-DD`, a
/// month 01-12 and a day 01-31).
pub fn is_day(text: &str) -> bool {
    let bytes = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| bytes[range].iter().all(u8::is_ascii_digit);
    if bytes.len() != 10 || bytes[4] != b'-' || bytes[7] != b'-' {
        return false;
    }
    if !(digits(0..4) && digits(5..7) && digits(8..10)) {
        return false;
    }
    let month = (bytes[5] - b'0') * 10 + (bytes[6] - b'0');
    let day = (bytes[8] - b'0') * 10 + (bytes[9] - b'0');
    (1..=12).contains(&month) && (1..=31).contains(&day)
}

/// The UTC day of a moment, `YYYY-MM-DD`.
pub fn utc_day(unix_ms: u64) -> String {
    let days = i64::try_from(unix_ms / 86_400_000).unwrap_or(i64::MAX);
    let (year, month, day) = civil_from_days(days);
    format!("{year:04}-{month:02}-{day:02}")
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Adds one call's usage to its day, model and role.
pub(crate) fn add(
    tx: &rusqlite::Transaction<'_>,
    day: &str,
    model: &str,
    role: &str,
    usage: Usage,
    cost_nano_usd: u64,
) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO usage_daily (day, model, role, calls, prompt_tokens, completion_tokens,
             cost_nano_usd)
         VALUES (?1, ?2, ?3, 1, ?4, ?5, ?6)
         ON CONFLICT (day, model, role) DO UPDATE SET
             calls = calls + 1,
             prompt_tokens = prompt_tokens + excluded.prompt_tokens,
             completion_tokens = completion_tokens + excluded.completion_tokens,
             cost_nano_usd = cost_nano_usd + excluded.cost_nano_usd",
    )?
    .execute((
        day,
        model,
        role,
        to_sql_u64(usage.prompt_tokens),
        to_sql_u64(usage.completion_tokens),
        to_sql_u64(cost_nano_usd),
    ))?;
    Ok(())
}

impl Store {
    /// Usage from UTC day `since` (`YYYY-MM-DD`; none: all kept) on,
    /// summed `by`, in key order.
    pub async fn usage_report(
        &self,
        by: UsageBy,
        since: Option<String>,
    ) -> Result<Vec<UsageRow>, StoreError> {
        self.read("read usage", move |conn| {
            let sql = format!(
                "SELECT {key}, sum(calls), sum(prompt_tokens), sum(completion_tokens),
                     sum(cost_nano_usd)
                 FROM usage_daily WHERE day >= ?1 GROUP BY {key} ORDER BY {key}",
                key = by.column()
            );
            let mut stmt = conn.prepare_cached(&sql)?;
            let rows = stmt.query_map([since.unwrap_or_default()], |row| {
                Ok(UsageRow {
                    key: row.get(0)?,
                    usage: LlmUsage {
                        calls: from_sql_u64(row.get(1)?),
                        prompt_tokens: from_sql_u64(row.get(2)?),
                        completion_tokens: from_sql_u64(row.get(3)?),
                        cost_nano_usd: from_sql_u64(row.get(4)?),
                    },
                })
            })?;
            rows.collect()
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_day_is_yyyy_mm_dd() {
        assert!(is_day("2026-11-26"));
        for not in [
            "2026-13-01",
            "2026-11-00",
            "26-11-2026",
            "2026-1-26",
            "2026-11-26T",
            "",
            "２026-11-26",
        ] {
            assert!(!is_day(not), "{not}");
        }
    }

    #[test]
    fn days_are_utc_calendar_days() {
        assert_eq!(utc_day(0), "1970-01-01");
        assert_eq!(utc_day(86_399_999), "1970-01-01");
        assert_eq!(utc_day(86_400_000), "1970-01-02");
        // 2024-02-29T23:59:59Z and the next second.
        assert_eq!(utc_day(1_709_251_199_000), "2024-02-29");
        assert_eq!(utc_day(1_709_251_200_000), "2024-03-01");
        assert_eq!(utc_day(1_798_761_599_000), "2026-12-31");
        assert_eq!(utc_day(1_798_761_600_000), "2027-01-01");
    }
}
