//! What one transaction books: the sessions' new state, the hourly rollups, the spans
//! closed. Gathered in key order, so that concurrent writers take their row locks in one
//! order; the store writes it as it is.

use std::collections::BTreeMap;

use crate::ledger::{split_hours, Effects, Span};
use crate::session::Session;
use crate::time::Secs;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Booking {
    /// Seconds by `(org, hour)`.
    pub org_hours: BTreeMap<(String, Secs), i64>,
    /// Seconds by `(org, hour, session)`.
    pub session_hours: BTreeMap<(String, Secs, String), i64>,
    /// `(org, session, span)` of each span closed.
    pub spans: Vec<(String, String, Span)>,
    /// Each session changed, as it now stands, by id.
    pub sessions: BTreeMap<String, Session>,
}

impl Booking {
    /// Add what applying one event to `session` did (`session` as it stands after it).
    pub fn add(&mut self, session: &Session, fx: &Effects) {
        if let Some(billed) = fx.billed {
            for (hour, secs) in split_hours(billed) {
                *self
                    .org_hours
                    .entry((session.org_id.clone(), hour))
                    .or_default() += secs;
                *self
                    .session_hours
                    .entry((session.org_id.clone(), hour, session.session_id.clone()))
                    .or_default() += secs;
            }
        }
        for span in &fx.closed {
            self.spans
                .push((session.org_id.clone(), session.session_id.clone(), *span));
        }
        self.sessions
            .insert(session.session_id.clone(), session.clone());
    }

    /// Seconds booked in all.
    pub fn billed_seconds(&self) -> i64 {
        self.org_hours.values().sum()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{apply_heartbeat, Observation, Rules, VmState};

    #[test]
    fn both_rollups_hold_what_was_billed_split_by_hour() {
        let rules = Rules {
            interval: 15,
            lease: 45,
        };
        let mut s = Session::admitted("o", "s", 3590);
        let mut booking = Booking::default();
        for (seq, at, state) in [
            (1, 3590, VmState::Running),
            (2, 3605, VmState::Running),
            (3, 3620, VmState::Parked),
        ] {
            let (led, fx) = apply_heartbeat(&s.ledger, &Observation { seq, at, state }, &rules);
            s.ledger = led;
            booking.add(&s, &fx);
        }
        assert_eq!(booking.billed_seconds(), 30);
        assert_eq!(
            booking.org_hours.into_iter().collect::<Vec<_>>(),
            [(("o".into(), 0), 10), (("o".into(), 3600), 20)]
        );
        assert_eq!(booking.session_hours.values().sum::<i64>(), 30);
        assert_eq!(
            booking.spans.len(),
            1,
            "the running span closed at the park"
        );
        assert_eq!(booking.sessions["s"].ledger.billed_seconds, 30);
    }
}
