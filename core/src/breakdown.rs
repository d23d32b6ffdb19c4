//! The console's usage breakdown: an org's agent time in a range of whole hours, grouped
//! by hour, day, session, project, user or agent. Read from the per-session hourly rollup,
//! plus each running session counted up to now as every reader counts it
//! (`SessionLedger::provisional`), so that its total equals the usage page's to the second.

use std::collections::BTreeMap;

use crate::funding::Source;
use crate::ledger::split_hours;
use crate::time::{iso_week, month_window, Interval, Secs};

pub use crate::time::HOUR;

named! {
    /// What rows are keyed by.
    pub enum GroupBy {
        Hour = "hour",
        Day = "day",
        Session = "session",
        Project = "project",
        User = "user",
        Agent = "agent",
        /// Who paid: plan, grant, overage, grace.
        Funding = "funding",
    }
}

/// Agent seconds of one session in one hour, with what the session is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    pub hour: Secs,
    pub session_id: String,
    pub project_id: Option<String>,
    pub started_by: Option<String>,
    pub agent: Option<String>,
    pub seconds: i64,
}

/// The key a piece falls under: a time (hour or UTC day start) or a name (`None` when the
/// session has none, e.g. no project).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Key {
    Time(Secs),
    Name(Option<String>),
}

fn key(p: &Piece, by: GroupBy) -> Key {
    match by {
        // By funding, pieces come by hour; `by_funding` makes the rows.
        GroupBy::Hour | GroupBy::Funding => Key::Time(p.hour),
        GroupBy::Day => Key::Time(p.hour.div_euclid(86_400) * 86_400),
        GroupBy::Session => Key::Name(Some(p.session_id.clone())),
        GroupBy::Project => Key::Name(p.project_id.clone()),
        GroupBy::User => Key::Name(p.started_by.clone()),
        GroupBy::Agent => Key::Name(p.agent.clone()),
    }
}

/// Seconds per key, in key order (times ascending; names with `None` first).
pub fn group(pieces: &[Piece], by: GroupBy) -> Vec<(Key, i64)> {
    let mut rows: BTreeMap<Key, i64> = BTreeMap::new();
    for p in pieces {
        *rows.entry(key(p, by)).or_default() += p.seconds;
    }
    rows.into_iter().filter(|(_, s)| *s != 0).collect()
}

/// Rows by who paid, in the sources' order: the plan's seconds are what the others leave
/// of `total` (the rollup holds the others only).
pub fn by_funding(total: i64, not_plan: &BTreeMap<Source, i64>) -> Vec<(Key, i64)> {
    let others: i64 = not_plan.values().sum();
    Source::ALL
        .iter()
        .map(|s| {
            let seconds = match s {
                Source::Plan => total - others,
                _ => not_plan.get(s).copied().unwrap_or(0),
            };
            (Key::Name(Some(s.as_str().to_owned())), seconds)
        })
        .filter(|(_, seconds)| *seconds != 0)
        .collect()
}

/// The provisional stretch of a running session inside `range`, as hourly pieces.
pub fn provisional_pieces(template: &Piece, stretch: Interval, range: Interval) -> Vec<Piece> {
    let Some(inside) = Interval::new(stretch.start.max(range.start), stretch.end.min(range.end))
    else {
        return Vec::new();
    };
    split_hours(inside)
        .map(|(hour, seconds)| Piece {
            hour,
            seconds,
            ..template.clone()
        })
        .collect()
}

/// Check a requested range: whole hours, `from < to`, at most `max_days` long.
pub fn check_range(from: Secs, to: Secs, max_days: i64) -> Result<Interval, String> {
    if from % HOUR != 0 || to % HOUR != 0 {
        return Err(
            "from and to must be whole hours (the rollup's grain), e.g. 2026-11-01T00:00:00Z"
                .into(),
        );
    }
    let range = Interval::new(from, to).ok_or("from must be before to")?;
    if to - from > max_days * 86_400 {
        return Err(format!("the range may span at most {max_days} days"));
    }
    Ok(range)
}

/// The month windows (the billing period where it is current, else calendar months) and
/// ISO weeks that `range` touches, in order.
pub fn windows_touched(
    range: Interval,
    billing_period: Option<Interval>,
) -> (Vec<Interval>, Vec<Interval>) {
    let walk = |f: &dyn Fn(Secs) -> Interval| {
        let mut out = Vec::new();
        let mut t = range.start;
        while t < range.end {
            let w = f(t);
            out.push(w);
            t = w.end;
        }
        out
    };
    (walk(&|t| month_window(t, billing_period)), walk(&iso_week))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(hour: Secs, session: &str, project: Option<&str>, agent: &str, seconds: i64) -> Piece {
        Piece {
            hour,
            session_id: session.into(),
            project_id: project.map(Into::into),
            started_by: None,
            agent: Some(agent.into()),
            seconds,
        }
    }

    #[test]
    fn every_grouping_sums_to_the_same_total() {
        let pieces = vec![
            piece(0, "s1", Some("web"), "codex", 100),
            piece(3600, "s1", Some("web"), "codex", 3600),
            piece(86_400, "s2", None, "claude", 50),
            piece(86_400 + 3600, "s3", Some("api"), "claude", 7),
        ];
        let total: i64 = pieces.iter().map(|p| p.seconds).sum();
        for name in GroupBy::NAMES {
            let rows = group(&pieces, GroupBy::parse(name).unwrap());
            assert_eq!(rows.iter().map(|r| r.1).sum::<i64>(), total, "{name}");
        }
        assert_eq!(
            group(&pieces, GroupBy::Day),
            vec![(Key::Time(0), 3700), (Key::Time(86_400), 57)]
        );
        assert_eq!(
            group(&pieces, GroupBy::Project),
            vec![
                (Key::Name(None), 50),
                (Key::Name(Some("api".into())), 7),
                (Key::Name(Some("web".into())), 3700)
            ]
        );
        assert_eq!(GroupBy::parse("week"), None);
    }

    #[test]
    fn a_running_stretch_is_cut_to_the_range_and_split_by_hour() {
        let t = piece(0, "s", None, "codex", 0);
        let stretch = Interval::new(3500, 3700).unwrap();
        let got = provisional_pieces(&t, stretch, Interval::new(0, 7200).unwrap());
        assert_eq!(
            got.iter().map(|p| (p.hour, p.seconds)).collect::<Vec<_>>(),
            vec![(0, 100), (3600, 100)]
        );
        assert!(provisional_pieces(&t, stretch, Interval::new(7200, 10_800).unwrap()).is_empty());
    }

    #[test]
    fn ranges_are_whole_hours_and_bounded() {
        assert!(check_range(0, 3600, 1).is_ok());
        assert!(check_range(1, 3600, 1).is_err());
        assert!(check_range(3600, 3600, 1).is_err());
        assert!(check_range(0, 2 * 86_400, 1).is_err());
    }

    #[test]
    fn the_windows_a_range_touches() {
        // 2026-11-30T00:00Z (a Monday) to 2026-12-08T00:00Z.
        let (from, to) = (
            1_796_000_000 - 1_796_000_000 % 86_400,
            1_796_000_000 - 1_796_000_000 % 86_400 + 8 * 86_400,
        );
        let (months, weeks) = windows_touched(Interval::new(from, to).unwrap(), None);
        assert_eq!(months.len(), 2);
        assert_eq!(weeks.len(), 2);
        assert!(months[0].end == months[1].start && weeks[0].end == weeks[1].start);
    }
}
