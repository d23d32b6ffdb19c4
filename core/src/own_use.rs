//! A member's own use, for its own page: its agent time by day and in its org's month and
//! week windows, from the member rollup's hours and its running sessions' time since their
//! last heartbeat (counted as the limits count it: `members`, and as the breakdown does).

use crate::ledger::split_hours;
use crate::time::{Interval, Secs, Windows};

const DAY: Secs = 86_400;
#[cfg(test)]
const HOUR: Secs = 3_600;

/// A member's use: in each window, and by UTC day over a range.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnUse {
    pub month_seconds: i64,
    pub week_seconds: i64,
    /// `(day start, seconds)`, oldest first, days with time only.
    pub days: Vec<(Secs, i64)>,
}

/// The use of a member whose rollup holds `hours` (`(hour, seconds)`, covering `range` and
/// both windows) and whose running sessions have the unbooked `running` stretches: in the
/// windows by hour bucket (an hour counts in the window it starts in, as the limits read
/// counts it), by day over `range` (whole hours, as the usage breakdown's range is), so
/// that the days add up to the member's row of the breakdown by user over `range`.
pub fn own_use(
    hours: &[(Secs, i64)],
    running: &[Interval],
    windows: &Windows,
    range: Interval,
) -> OwnUse {
    let booked_in = |w: Interval| -> i64 {
        hours
            .iter()
            .filter(|(h, _)| w.contains(*h))
            .map(|(_, s)| s)
            .sum()
    };
    let running_in = |w: Interval| -> i64 {
        running
            .iter()
            .filter_map(|r| r.clip(&w))
            .map(|i| i.len())
            .sum()
    };
    let mut days: std::collections::BTreeMap<Secs, i64> = Default::default();
    for &(h, s) in hours.iter().filter(|(h, _)| range.contains(*h)) {
        *days.entry(h.div_euclid(DAY) * DAY).or_default() += s;
    }
    for stretch in running.iter().filter_map(|r| r.clip(&range)) {
        // Split at each hour, as the breakdown's provisional pieces are.
        for (hour, seconds) in split_hours(stretch) {
            *days.entry(hour.div_euclid(DAY) * DAY).or_default() += seconds;
        }
    }
    OwnUse {
        month_seconds: booked_in(windows.month) + running_in(windows.month),
        week_seconds: booked_in(windows.week) + running_in(windows.week),
        days: days.into_iter().filter(|(_, s)| *s != 0).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(a: Secs, b: Secs) -> Interval {
        Interval::new(a, b).unwrap()
    }

    #[test]
    fn days_and_windows_add_up() {
        // Windows: the month from day 0, the week from day 3; the range is the month.
        let w = Windows {
            month: iv(0, 30 * DAY),
            week: iv(3 * DAY, 10 * DAY),
        };
        let hours = [(HOUR, 600), (2 * DAY + 5 * HOUR, 300), (3 * DAY, 60)];
        // A running stretch across midnight into day 4.
        let running = [iv(4 * DAY - 10, 4 * DAY + 20)];
        let u = own_use(&hours, &running, &w, w.month);
        assert_eq!(u.month_seconds, 600 + 300 + 60 + 30);
        assert_eq!(u.week_seconds, 60 + 30);
        assert_eq!(
            u.days,
            [(0, 600), (2 * DAY, 300), (3 * DAY, 60 + 10), (4 * DAY, 20)]
        );
        let total: i64 = u.days.iter().map(|d| d.1).sum();
        assert_eq!(total, u.month_seconds);
    }

    #[test]
    fn nothing_used_is_nothing() {
        let w = Windows {
            month: iv(0, DAY),
            week: iv(0, DAY),
        };
        assert_eq!(own_use(&[], &[], &w, w.month), OwnUse::default());
    }
}
