//! A session's timeline for the console: its closed running and parked spans as booked,
//! and the stretch it is in now (a running one counted up to now as every reader counts
//! it, a parked one up to now and free).

use serde::Serialize;

use crate::ledger::{Phase, Rules, SessionLedger};
use crate::time::{rfc3339, Secs};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Stretch {
    /// `running` (billed) or `parked` (free).
    pub kind: String,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub start: Secs,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub end: Secs,
    /// Still going: `end` is now (or, running, as far as is counted so far).
    pub open: bool,
}

/// Closed spans `(start, end, kind)` in start order, then the open stretch.
pub fn timeline(
    closed: &[(Secs, Secs, String)],
    led: &SessionLedger,
    now: Secs,
    rules: &Rules,
) -> Vec<Stretch> {
    let mut out: Vec<Stretch> = closed
        .iter()
        .map(|(start, end, kind)| Stretch {
            kind: kind.clone(),
            start: *start,
            end: *end,
            open: false,
        })
        .collect();
    let open = match led.phase {
        Phase::Running => {
            let end = led.provisional(now, rules).map_or(led.last_at, |p| p.end);
            Some(("running", end))
        }
        Phase::Parked => Some(("parked", now.max(led.span_start))),
        Phase::Admitted | Phase::Silent | Phase::Ended => None,
    };
    if let Some((kind, end)) = open.filter(|(_, end)| *end > led.span_start) {
        out.push(Stretch {
            kind: kind.into(),
            start: led.span_start,
            end,
            open: true,
        });
    }
    out
}

/// Seconds of `kind` in a timeline.
pub fn seconds_of(t: &[Stretch], kind: &str) -> i64 {
    t.iter()
        .filter(|s| s.kind == kind)
        .map(|s| s.end - s.start)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: Rules = Rules {
        interval: 15,
        lease: 45,
    };

    #[test]
    fn closed_spans_then_the_open_stretch() {
        let closed = vec![
            (0, 100, "running".to_owned()),
            (100, 400, "parked".to_owned()),
        ];
        let mut led = SessionLedger::admitted(0);
        led.phase = Phase::Running;
        led.span_start = 400;
        led.last_at = 430;
        let t = timeline(&closed, &led, 500, &RULES);
        assert_eq!(t.len(), 3);
        assert_eq!(
            (t[2].start, t[2].end, t[2].open),
            (400, 445, true),
            "counted one interval past the last beat"
        );
        assert_eq!(seconds_of(&t, "running"), 100 + 45);
        assert_eq!(seconds_of(&t, "parked"), 300);
        led.phase = Phase::Parked;
        let t = timeline(&closed, &led, 500, &RULES);
        assert_eq!((t[2].kind.as_str(), t[2].end), ("parked", 500));
        led.phase = Phase::Ended;
        assert_eq!(timeline(&closed, &led, 500, &RULES).len(), 2);
    }
}
