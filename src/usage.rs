//! How a window's used seconds are read from the ledger: whole hours from the hourly
//! rollup, part hours at a window's edges (a Stripe period starts at any second) from the
//! spans, and running sessions counted up to now. This module cuts a window into those
//! parts; the store sums them (`store::queries::window_usage`).

use crate::ledger::{Interval, Secs};

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
}
