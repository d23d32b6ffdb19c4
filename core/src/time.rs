//! Time as the meter keeps it: whole Unix seconds, half-open intervals, the month and
//! week windows ceilings count in, and the two forms people read (decimal hours, RFC 3339).
//!
//! - Monthly window: the org's Stripe billing period while `now` lies inside it, otherwise
//!   the calendar month in UTC.
//! - Weekly window: the ISO week, Monday 00:00 UTC to the next Monday. A fixed reset that
//!   a person can be told ("resets Monday 00:00 UTC") and that lines up with the hourly
//!   rollups; a rolling 7 days would make the reset time a moving target.

use chrono::{DateTime, Datelike, Duration, Months, NaiveDate, TimeZone, Utc};

/// Unix time in whole seconds (UTC).
pub type Secs = i64;

/// An hour in seconds: the grain of the hourly rollups.
pub const HOUR: Secs = 3600;

/// A half-open interval `[start, end)` of Unix seconds, never empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Interval {
    pub start: Secs,
    pub end: Secs,
}

impl Interval {
    pub fn new(start: Secs, end: Secs) -> Option<Interval> {
        (end > start).then_some(Interval { start, end })
    }

    pub fn len(&self) -> i64 {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }

    pub fn clip(&self, window: &Interval) -> Option<Interval> {
        Interval::new(self.start.max(window.start), self.end.min(window.end))
    }

    pub fn contains(&self, t: Secs) -> bool {
        self.start <= t && t < self.end
    }
}

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

/// The monthly window at `now`: the subscription's current period if `now` is inside it,
/// the period it renews into once `now` is past its end (`renewal_at`: Stripe's renewal
/// not heard of yet, a webhook late), and the calendar month without a subscription.
/// (The calendar month in that gap would be a window of its own, with fresh plan hours
/// and a spend cap of its own beside the renewed period's.)
pub fn month_window(now: Secs, billing_period: Option<Interval>) -> Interval {
    match billing_period {
        Some(p) if p.contains(now) => p,
        Some(p) if now >= p.end => renewal_at(p, now).unwrap_or_else(|| calendar_month(now)),
        _ => calendar_month(now),
    }
}

/// The period that `period` (of whole months) renews into and that contains `now`, as
/// Stripe renews a subscription: as many months on, on the anchor day (the later of the
/// period's days of the month, so that a period ending on a short month's last day still
/// renews on the 31st), clamped to a month's last day (chrono's `checked_add_months`).
/// None for a period of less than a month.
fn renewal_at(period: Interval, now: Secs) -> Option<Interval> {
    let (start, end) = (to_datetime(period.start), to_datetime(period.end));
    let months = (end.year() - start.year()) * 12 + end.month0() as i32 - start.month0() as i32;
    let months = u32::try_from(months).ok().filter(|m| *m >= 1)?;
    // The bound on the anchor day, and how many months after it the period ended.
    let (anchor, ended) = if start.day() >= end.day() {
        (start, months)
    } else {
        (end, 0)
    };
    let end_of = |renewals: u32| {
        let after = ended.checked_add(renewals.checked_mul(months)?)?;
        Some(anchor.checked_add_months(Months::new(after))?.timestamp())
    };
    let mut from = period.end;
    for renewals in 1.. {
        let to = end_of(renewals)?;
        if now < to {
            return Interval::new(from, to);
        }
        from = to;
    }
    None
}

/// The two windows a decision or a usage page looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
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

/// Seconds as decimal hours with 4 places, rounded half away from zero (the rule every
/// reader uses: 1 s is 0.0003 h, 2 s is 0.0006 h, 18 s is 0.0050 h).
pub fn hours(seconds: i64) -> String {
    // In whole ten-thousandths of an hour, seconds * 10,000 / 3,600 = seconds * 25 / 9,
    // in integers (a breakdown writes one per row, and a `Decimal` division cost 186 ns
    // a call). A remainder of 5 to 8 ninths rounds away from zero; 9 is odd, so there is
    // no exact tie. Tested against the `Decimal` rule over the whole i64 range.
    let n = i128::from(seconds) * 25;
    let (q, r) = (n / 9, n % 9);
    let t = q + i128::from(r.abs() >= 5) * n.signum();
    let sign = if t < 0 { "-" } else { "" };
    let t = t.unsigned_abs();
    format!("{sign}{}.{:04}", t / 10_000, t % 10_000)
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
    // `2026-11-01T00:00:00Z`, as `format("%Y-%m-%dT%H:%M:%SZ")` wrote it, without parsing
    // a format string each call: 58 ns against 435 (a month's hour breakdown formats 720).
    to_datetime(secs).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Serde adapters between Unix seconds and RFC 3339.
pub mod rfc3339 {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::format_rfc3339;
    use crate::time::Secs;

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

        use crate::time::Secs;

        pub fn serialize<S: Serializer>(v: &Option<Secs>, s: S) -> Result<S::Ok, S::Error> {
            match v {
                Some(secs) => super::serialize(secs, s),
                None => s.serialize_none(),
            }
        }
    }
}

// ----- windows cut into the hourly rollup's grain -----
//
// A window's used seconds are read as whole hours from the hourly rollup, and part hours
// at its edges (a Stripe period starts at any second) from the spans.

/// The hour rows `[from, to)` that lie wholly inside `w` (`from >= to` when none do).
pub fn full_hours(w: Interval) -> (Secs, Secs) {
    let from = ceil_hour(w.start);
    let to = w.end.div_euclid(HOUR) * HOUR;
    if from < to {
        (from, to)
    } else {
        (0, 0)
    }
}

/// The parts of `w` not covered by `full_hours(w)`: at most one at each end.
pub fn partial_hours(w: Interval) -> Vec<Interval> {
    let (from, to) = full_hours(w);
    if from >= to {
        return vec![w];
    }
    [Interval::new(w.start, from), Interval::new(to, w.end)]
        .into_iter()
        .flatten()
        .collect()
}

fn ceil_hour(t: Secs) -> Secs {
    (t + HOUR - 1).div_euclid(HOUR) * HOUR
}

/// `secs` as `YYYY-MM-DDTHH:MM:SSZ` (what `format_rfc3339` writes, without chrono's
/// formatter): the civil date from days since 1970 (Howard Hinnant's algorithm).
pub fn write_rfc3339(secs: Secs, out: &mut Vec<u8>) {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    if !(0..=9999).contains(&year) {
        out.extend_from_slice(format_rfc3339(secs).as_bytes());
        return;
    }
    let two = |v: i64, out: &mut Vec<u8>| {
        out.push(b'0' + (v / 10) as u8);
        out.push(b'0' + (v % 10) as u8);
    };
    two(year / 100, out);
    two(year % 100, out);
    out.push(b'-');
    two(month, out);
    out.push(b'-');
    two(day, out);
    out.push(b'T');
    two(rem / 3600, out);
    out.push(b':');
    two(rem / 60 % 60, out);
    out.push(b':');
    two(rem % 60, out);
    out.push(b'Z');
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

    fn period(start: &str, end: &str) -> Interval {
        Interval::new(t(start), t(end)).unwrap()
    }

    #[test]
    fn billing_period_wins_while_current_and_renews_past_its_end() {
        let p = period("2026-11-14T09:23:17Z", "2026-12-14T09:23:17Z");
        assert_eq!(month_window(t("2026-12-01T00:00:00Z"), Some(p)), p);
        // The renewal not heard of yet: the period Stripe renews into, not the calendar.
        assert_eq!(
            month_window(t("2026-12-20T00:00:00Z"), Some(p)),
            period("2026-12-14T09:23:17Z", "2027-01-14T09:23:17Z")
        );
        assert_eq!(
            month_window(t("2026-12-14T09:23:17Z"), Some(p)).start,
            p.end
        );
        // Two renewals on.
        assert_eq!(
            month_window(t("2027-02-01T00:00:00Z"), Some(p)),
            period("2027-01-14T09:23:17Z", "2027-02-14T09:23:17Z")
        );
        // Before the period: the calendar month; without one too.
        let before = t("2026-11-01T00:00:00Z");
        assert_eq!(month_window(before, Some(p)), calendar_month(before));
        assert_eq!(month_window(before, None), calendar_month(before));
    }

    #[test]
    fn a_renewal_keeps_the_anchor_day_through_short_months() {
        // Anchored on the 31st: February's period ends on its last day, March's on the 31st.
        let p = period("2027-01-31T00:00:00Z", "2027-02-28T00:00:00Z");
        assert_eq!(
            month_window(t("2027-03-05T00:00:00Z"), Some(p)),
            period("2027-02-28T00:00:00Z", "2027-03-31T00:00:00Z")
        );
        assert_eq!(
            month_window(t("2027-04-05T00:00:00Z"), Some(p)),
            period("2027-03-31T00:00:00Z", "2027-04-30T00:00:00Z")
        );
        let p = period("2027-02-28T00:00:00Z", "2027-03-31T00:00:00Z");
        assert_eq!(
            month_window(t("2027-04-05T00:00:00Z"), Some(p)),
            period("2027-03-31T00:00:00Z", "2027-04-30T00:00:00Z")
        );
        // A yearly period renews by a year; one shorter than a month is not renewed.
        let y = period("2025-06-01T00:00:00Z", "2026-06-01T00:00:00Z");
        assert_eq!(
            month_window(t("2026-07-01T00:00:00Z"), Some(y)),
            period("2026-06-01T00:00:00Z", "2027-06-01T00:00:00Z")
        );
        let short = period("2026-06-01T00:00:00Z", "2026-06-20T00:00:00Z");
        let now = t("2026-06-25T00:00:00Z");
        assert_eq!(month_window(now, Some(short)), calendar_month(now));
    }

    proptest::proptest! {
        /// Renewals tile the time after a period: each contains the instant asked, and the
        /// first starts where the period ended.
        #[test]
        fn renewals_contain_now_and_follow_the_period(
            start in 1_700_000_000i64..1_900_000_000,
            months in 1i32..13,
            later in 0i64..200_000_000,
        ) {
            let s = to_datetime(start);
            let total = s.year() * 12 + s.month0() as i32 + months;
            let (year, month) = (total.div_euclid(12), total.rem_euclid(12) as u32 + 1);
            let day = (1..=s.day()).rev().find(|d| NaiveDate::from_ymd_opt(year, month, *d).is_some()).unwrap();
            let end = NaiveDate::from_ymd_opt(year, month, day).unwrap().and_time(s.time()).and_utc().timestamp();
            let p = Interval::new(start, end).unwrap();
            let now = end + later;
            let w = month_window(now, Some(p));
            proptest::prop_assert!(w.contains(now), "{w:?} {now}");
            proptest::prop_assert!(w.start >= p.end);
            let first = month_window(p.end, Some(p));
            proptest::prop_assert_eq!(first.start, p.end);
            proptest::prop_assert!(first.end > first.start);
        }
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

    /// The rule as `Decimal` states it: what `hours` must equal.
    fn decimal_hours(seconds: i64) -> String {
        use rust_decimal::{Decimal, RoundingStrategy};
        let h = (Decimal::from(seconds) / Decimal::from(3600))
            .round_dp_with_strategy(4, RoundingStrategy::MidpointAwayFromZero);
        format!("{h:.4}")
    }

    #[test]
    fn hours_in_integers_equal_the_decimal_rule() {
        let edges = [
            i64::MIN,
            i64::MIN + 1,
            -3601,
            -18,
            -9,
            -5,
            -1,
            0,
            1,
            5,
            9,
            3599,
            i64::MAX,
        ];
        for s in edges.into_iter().chain(-40_000..40_000) {
            assert_eq!(hours(s), decimal_hours(s), "{s} s");
        }
    }

    proptest::proptest! {
        #[test]
        fn hours_agree_with_the_decimal_rule_anywhere(s in proptest::num::i64::ANY) {
            proptest::prop_assert_eq!(hours(s), decimal_hours(s));
        }
    }

    #[test]
    fn aligned_windows_have_no_partial_hours() {
        let w = Interval::new(0, 7 * 86_400).unwrap();
        assert_eq!(full_hours(w), (0, 7 * 86_400));
        assert!(partial_hours(w).is_empty());
    }

    #[test]
    fn unaligned_window_splits_into_edges_and_hours() {
        let w = Interval::new(100, 3 * HOUR + 5).unwrap();
        assert_eq!(full_hours(w), (HOUR, 3 * HOUR));
        assert_eq!(
            partial_hours(w),
            vec![
                Interval::new(100, HOUR).unwrap(),
                Interval::new(3 * HOUR, 3 * HOUR + 5).unwrap()
            ]
        );
        let inside = Interval::new(100, 200).unwrap();
        assert_eq!(full_hours(inside), (0, 0));
        assert_eq!(partial_hours(inside), vec![inside]);
    }

    #[test]
    fn rfc3339_is_the_strftime_it_replaced_even_past_four_digit_years() {
        let strftime = |t| to_datetime(t).format("%Y-%m-%dT%H:%M:%SZ").to_string();
        for t in [
            -62_167_219_201, // the last second of 1 BCE (year 0000 in ISO 8601)
            -62_135_596_800, // 0001-01-01
            0,
            1_796_083_199,
            253_402_300_799, // 9999-12-31T23:59:59Z
            253_402_300_800, // 10000-01-01
        ] {
            assert_eq!(format_rfc3339(t), strftime(t), "{t}");
        }
    }

    #[test]
    fn rfc3339_matches_chrono_for_any_second() {
        let mut t: i64 = -62_135_596_800; // 0001-01-01
        while t < 253_402_300_800 {
            let mut out = Vec::new();
            write_rfc3339(t, &mut out);
            assert_eq!(String::from_utf8(out).unwrap(), format_rfc3339(t), "{t}");
            t += 7_919_993; // about three months, a prime: every day of year and time of day comes up
        }
        for t in [
            0,
            951_782_400,
            951_868_799,
            1_709_164_800,
            1_796_083_199,
            1_796_083_200,
        ] {
            let mut out = Vec::new();
            write_rfc3339(t, &mut out);
            assert_eq!(String::from_utf8(out).unwrap(), format_rfc3339(t), "{t}");
        }
    }
}
