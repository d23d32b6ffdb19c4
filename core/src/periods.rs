//! Billing periods: a period here is a calendar month in UTC, what finance closes.

use crate::time::{calendar_month, to_datetime, Interval, Secs};

/// `YYYY-MM` as its calendar month in UTC.
pub fn parse_month(s: &str) -> Result<Interval, String> {
    let bad = || format!("period: `{s}` is not a month such as 2026-11 (YYYY-MM)");
    if s.len() != 7 {
        return Err(bad());
    }
    let date =
        chrono::NaiveDate::parse_from_str(&format!("{s}-01"), "%Y-%m-%d").map_err(|_| bad())?;
    let start = date
        .and_hms_opt(0, 0, 0)
        .expect("midnight exists")
        .and_utc()
        .timestamp();
    Ok(calendar_month(start))
}

/// A month as `YYYY-MM`.
pub fn month_name(period: Interval) -> String {
    to_datetime(period.start).format("%Y-%m").to_string()
}

/// The last month whose end is at least `settle` seconds before `now`.
pub fn due_month(now: Secs, settle: Secs) -> Interval {
    let current = calendar_month(now - settle);
    calendar_month(current.start - 1)
}

/// The months from `from` (a month's start) through `through`, in order.
pub fn months_between(from: Secs, through: Interval) -> Vec<Interval> {
    let mut out = Vec::new();
    let mut m = calendar_month(from);
    while m.start <= through.start {
        out.push(m);
        m = calendar_month(m.end);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::format_rfc3339;

    fn month(s: &str) -> Interval {
        parse_month(s).unwrap()
    }

    #[test]
    fn months_parse_strictly() {
        let nov = month("2026-11");
        assert_eq!(format_rfc3339(nov.start), "2026-11-01T00:00:00Z");
        assert_eq!(format_rfc3339(nov.end), "2026-12-01T00:00:00Z");
        assert_eq!(month_name(nov), "2026-11");
        for bad in ["2026-13", "2026-1", "26-11", "2026-11-01", "", "november"] {
            assert!(parse_month(bad).is_err(), "{bad}");
        }
        let feb = month("2028-02");
        assert_eq!(feb.len(), 29 * 86_400);
    }

    #[test]
    fn the_due_month_waits_for_the_settling_delay() {
        let dec1 = month("2026-12").start;
        assert_eq!(due_month(dec1 + 3_600, 3_600), month("2026-11"));
        assert_eq!(due_month(dec1 + 3_599, 3_600), month("2026-10"));
    }

    #[test]
    fn months_between_runs_through_year_ends() {
        let got: Vec<String> = months_between(month("2026-11").start, month("2027-02"))
            .into_iter()
            .map(month_name)
            .collect();
        assert_eq!(got, ["2026-11", "2026-12", "2027-01", "2027-02"]);
        assert!(months_between(month("2027-03").start, month("2027-02")).is_empty());
    }
}
