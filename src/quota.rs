//! Quota windows and the arithmetic of ceilings. Pure: the store supplies the totals.
//!
//! - Monthly window: the org's Stripe billing period while `now` lies inside it, otherwise
//!   the calendar month in UTC.
//! - Weekly window: the ISO week, Monday 00:00 UTC to the next Monday. A fixed reset that
//!   a person can be told ("resets Monday 00:00 UTC") and that lines up with the hourly
//!   rollups; a rolling 7 days would make the reset time a moving target.

use chrono::{DateTime, Datelike, Duration, NaiveDate, TimeZone, Utc};
use rust_decimal::{Decimal, RoundingStrategy};
use serde::Serialize;

use crate::ledger::{Interval, Secs};

/// `[first day of this month, first day of next month)` in UTC, containing `now`.
pub fn calendar_month(now: Secs) -> Interval {
    let d = to_datetime(now).date_naive();
    let start = NaiveDate::from_ymd_opt(d.year(), d.month(), 1).expect("day 1 exists");
    let next = if d.month() == 12 {
        NaiveDate::from_ymd_opt(d.year() + 1, 1, 1)
    } else {
        NaiveDate::from_ymd_opt(d.year(), d.month() + 1, 1)
    }
    .expect("day 1 exists");
    Interval {
        start: midnight(start),
        end: midnight(next),
    }
}

/// The ISO week (Monday 00:00 UTC onwards) containing `now`.
pub fn iso_week(now: Secs) -> Interval {
    let d = to_datetime(now).date_naive();
    let monday = d - Duration::days(i64::from(d.weekday().num_days_from_monday()));
    let start = midnight(monday);
    Interval {
        start,
        end: start + 7 * 86_400,
    }
}

/// The monthly window at `now`: the subscription's current period if `now` is inside it.
pub fn month_window(now: Secs, billing_period: Option<Interval>) -> Interval {
    billing_period
        .filter(|p| p.start <= now && now < p.end)
        .unwrap_or_else(|| calendar_month(now))
}

/// The two windows a decision or a usage page looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Windows {
    pub month: Interval,
    pub week: Interval,
}

impl Windows {
    pub fn at(now: Secs, billing_period: Option<Interval>) -> Windows {
        Windows {
            month: month_window(now, billing_period),
            week: iso_week(now),
        }
    }
}

/// One window's figures, as every reader shows them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct WindowUsage {
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub start: Secs,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub end: Secs,
    pub used_seconds: i64,
    pub limit_seconds: i64,
    pub remaining_seconds: i64,
    pub used_hours: String,
    pub limit_hours: String,
    pub remaining_hours: String,
    /// When this window's count starts again from zero.
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub resets_at: Secs,
}

impl WindowUsage {
    pub fn new(window: Interval, used_seconds: i64, limit_seconds: i64) -> WindowUsage {
        let remaining = (limit_seconds - used_seconds).max(0);
        WindowUsage {
            start: window.start,
            end: window.end,
            used_seconds,
            limit_seconds,
            remaining_seconds: remaining,
            used_hours: hours(used_seconds),
            limit_hours: hours(limit_seconds),
            remaining_hours: hours(remaining),
            resets_at: window.end,
        }
    }

    pub fn exhausted(&self) -> bool {
        self.used_seconds >= self.limit_seconds
    }
}

/// Seconds as decimal hours with 4 places, rounded half away from zero (the rule every
/// reader uses: 1 s is 0.0003 h, 2 s is 0.0006 h, 18 s is 0.0050 h).
pub fn hours(seconds: i64) -> String {
    let h = (Decimal::from(seconds) / Decimal::from(3600))
        .round_dp_with_strategy(4, RoundingStrategy::MidpointAwayFromZero);
    format!("{h:.4}")
}

/// A key's concurrency limit in force: the one set for it, or the plan's default, and
/// never above the plan's maximum (a downgrade lowers it at once).
pub fn effective_concurrency_limit(set: Option<i64>, plan: &crate::plans::Plan) -> i64 {
    set.unwrap_or(plan.concurrency_default)
        .min(plan.concurrency_max)
}

pub fn to_datetime(secs: Secs) -> DateTime<Utc> {
    Utc.timestamp_opt(secs, 0)
        .single()
        .expect("timestamps in range")
}

fn midnight(d: NaiveDate) -> Secs {
    d.and_hms_opt(0, 0, 0)
        .expect("midnight exists")
        .and_utc()
        .timestamp()
}

/// RFC 3339 in UTC with a `Z`, whole seconds: the one time format of the API.
pub fn format_rfc3339(secs: Secs) -> String {
    to_datetime(secs).format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Serde adapters between Unix seconds and RFC 3339.
pub mod rfc3339 {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::format_rfc3339;
    use crate::ledger::Secs;

    pub fn serialize<S: Serializer>(secs: &Secs, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_rfc3339(*secs))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Secs, D::Error> {
        let text = String::deserialize(d)?;
        parse(&text).map_err(serde::de::Error::custom)
    }

    /// Accepts any RFC 3339 offset and keeps whole seconds (fractions are dropped).
    pub fn parse(text: &str) -> Result<Secs, String> {
        chrono::DateTime::parse_from_rfc3339(text)
            .map(|t| t.timestamp())
            .map_err(|_| format!("`{text}` is not an RFC 3339 time such as 2026-11-30T21:04:05Z"))
    }

    pub mod option {
        use serde::Serializer;

        use crate::ledger::Secs;

        pub fn serialize<S: Serializer>(v: &Option<Secs>, s: S) -> Result<S::Ok, S::Error> {
            match v {
                Some(secs) => super::serialize(secs, s),
                None => s.serialize_none(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Secs {
        rfc3339::parse(s).unwrap()
    }

    #[test]
    fn month_ends() {
        let m = calendar_month(t("2026-01-31T23:59:59Z"));
        assert_eq!(
            (m.start, m.end),
            (t("2026-01-01T00:00:00Z"), t("2026-02-01T00:00:00Z"))
        );
        let m = calendar_month(t("2028-02-29T12:00:00Z"));
        assert_eq!(m.end, t("2028-03-01T00:00:00Z"));
        let m = calendar_month(t("2026-02-28T23:00:00Z"));
        assert_eq!(m.end, t("2026-03-01T00:00:00Z"));
        let m = calendar_month(t("2026-12-31T23:59:59Z"));
        assert_eq!(
            (m.start, m.end),
            (t("2026-12-01T00:00:00Z"), t("2027-01-01T00:00:00Z"))
        );
        let m = calendar_month(t("2027-01-01T00:00:00Z"));
        assert_eq!(m.start, t("2027-01-01T00:00:00Z"));
    }

    #[test]
    fn iso_weeks_start_monday_and_may_span_two_months_and_years() {
        // 2026-12-31 is a Thursday; its ISO week runs Mon 28 Dec to Mon 4 Jan.
        let w = iso_week(t("2026-12-31T10:00:00Z"));
        assert_eq!(
            (w.start, w.end),
            (t("2026-12-28T00:00:00Z"), t("2027-01-04T00:00:00Z"))
        );
        let w = iso_week(t("2026-11-30T00:00:00Z"));
        assert_eq!(w.start, t("2026-11-30T00:00:00Z"));
        let w = iso_week(t("2026-11-29T23:59:59Z"));
        assert_eq!(w.start, t("2026-11-23T00:00:00Z"));
    }

    #[test]
    fn billing_period_wins_only_while_current() {
        let p = Interval::new(t("2026-11-14T09:23:17Z"), t("2026-12-14T09:23:17Z")).unwrap();
        assert_eq!(month_window(t("2026-12-01T00:00:00Z"), Some(p)), p);
        assert_eq!(
            month_window(t("2026-12-20T00:00:00Z"), Some(p)),
            calendar_month(t("2026-12-20T00:00:00Z"))
        );
    }

    #[test]
    fn hours_are_four_places_half_away_from_zero() {
        assert_eq!(hours(4500), "1.2500");
        assert_eq!(hours(18_000), "5.0000");
        assert_eq!(hours(1), "0.0003");
        assert_eq!(hours(18), "0.0050");
        assert_eq!(hours(0), "0.0000");
        // 0.00005 h = 0.18 s cannot occur; the tie case is 9 s * k / 3600 at the 5th place.
        assert_eq!(hours(9), "0.0025");
    }

    #[test]
    fn remaining_never_negative() {
        let w = WindowUsage::new(Interval::new(0, 10).unwrap(), 30, 18);
        assert_eq!(w.remaining_seconds, 0);
        assert!(w.exhausted());
    }
}
