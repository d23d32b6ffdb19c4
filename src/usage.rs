//! How a window's used seconds are read from the ledger: whole hours from the hourly
//! rollup, part-hours at a window's edges (a Stripe period starts at any second) from the
//! spans, and running sessions counted up to now. Pure: the store supplies the rows.

use crate::ledger::{Interval, Rules, Secs, SessionLedger};

const HOUR: Secs = 3600;

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

/// What the store read for one org at one snapshot.
#[derive(Clone, Debug, Default)]
pub struct LedgerSlice {
    /// Sum of the hour rows in each window's `full_hours`, in the order of the windows.
    pub full_hours: Vec<i64>,
    /// Closed running spans that touch a partial hour of some window.
    pub closed_spans: Vec<Interval>,
    /// The org's running sessions (`span_start`, `last_at`).
    pub running: Vec<SessionLedger>,
}

impl LedgerSlice {
    /// Seconds used in window `i`, `w`, at `now`.
    pub fn used(&self, i: usize, w: Interval, now: Secs, rules: &Rules) -> i64 {
        let booked_open = self
            .running
            .iter()
            .filter_map(|s| Interval::new(s.span_start, s.last_at));
        let edges: i64 = partial_hours(w)
            .iter()
            .map(|edge| {
                self.closed_spans
                    .iter()
                    .copied()
                    .chain(booked_open.clone())
                    .filter_map(|s| s.clip(edge))
                    .map(|c| c.len())
                    .sum::<i64>()
            })
            .sum();
        let provisional: i64 = self
            .running
            .iter()
            .filter_map(|s| s.provisional(now, rules)?.clip(&w))
            .map(|c| c.len())
            .sum();
        self.full_hours.get(i).copied().unwrap_or(0) + edges + provisional
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn used_adds_edges_and_running_time_up_to_now() {
        let rules = Rules {
            interval: 15,
            lease: 45,
        };
        let w = Interval::new(1800, 3 * HOUR).unwrap();
        let mut running = SessionLedger::admitted(0);
        running.phase = crate::ledger::Phase::Running;
        running.span_start = 3 * HOUR - 100;
        running.last_at = 3 * HOUR - 30;
        let slice = LedgerSlice {
            full_hours: vec![500],
            closed_spans: vec![Interval::new(1000, 2000).unwrap()],
            running: vec![running],
        };
        // 500 from hours, 200 of the span inside [1800, 3600), 15 provisional at now.
        assert_eq!(slice.used(0, w, 3 * HOUR - 10, &rules), 500 + 200 + 15);
    }
}
