//! What one transaction books: the sessions' new state, the hourly rollups, the spans
//! closed. Gathered in key order, so that concurrent writers take their row locks in one
//! order; the store writes it as it is.

use std::collections::BTreeMap;

use crate::funding::{self, Grant, Source, WindowFunds};
use crate::ledger::{split_hours, Effects, Span};
use crate::members::{buckets, member_of, Dimension};
use crate::session::{Session, SessionKey};
use crate::time::{Interval, Secs};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Booking {
    /// Seconds by `(org, hour)`.
    pub org_hours: BTreeMap<(String, Secs), i64>,
    /// Seconds by `(org, hour, session)`.
    pub session_hours: BTreeMap<(String, Secs, String), i64>,
    /// `(org, session, span)` of each span closed.
    pub spans: Vec<(String, String, Span)>,
    /// Each session changed, as it now stands, by org and id.
    pub sessions: BTreeMap<SessionKey, Session>,
    /// `(org, session, interval)` of each stretch billed, in the order booked.
    pub billed: Vec<(String, String, Interval)>,
    /// Who pays for what was billed: filled in by `fund`, under the orgs' locks.
    pub funding: Funding,
    /// Seconds by `(org, bucket, dimension, member)` (`members::buckets`): filled in by
    /// `fund`, which knows each org's windows.
    pub member_hours: BTreeMap<(String, Secs, Dimension, String), i64>,
}

/// What funding what a booking billed changes (`funding::State::fund`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Funding {
    /// Each window's funds as they now stand, by org.
    pub windows: Vec<(String, WindowFunds)>,
    /// Grants used by this booking, as they now stand.
    pub grants: Vec<Grant>,
    /// Seconds and charge units not paid by the plan, by `(org, hour, source, grant id)`.
    pub hourly: BTreeMap<(String, Secs, Source, String), (i64, i64)>,
}

impl Funding {
    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }
}

impl Booking {
    /// Add what applying one event to `session` did (`session` as it stands after it).
    pub fn add(&mut self, session: &Session, fx: &Effects) {
        if let Some(billed) = fx.billed {
            self.billed
                .push((session.org_id.clone(), session.session_id.clone(), billed));
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
        self.sessions.insert(session.key(), session.clone());
    }

    /// The orgs that were billed, in byte order.
    pub fn billed_orgs(&self) -> Vec<&str> {
        let mut orgs: Vec<&str> = self.billed.iter().map(|(o, _, _)| o.as_str()).collect();
        orgs.sort_unstable();
        orgs.dedup();
        orgs
    }

    /// Attribute everything billed: each org's stretches in time order (then session),
    /// funded from `states` (each org's state, read under its lock).
    pub fn fund(&mut self, states: &mut BTreeMap<String, funding::State>) {
        let mut billed: Vec<&(String, String, Interval)> = self.billed.iter().collect();
        billed.sort_by(|a, b| (&a.0, a.2.start, &a.1).cmp(&(&b.0, b.2.start, &b.1)));
        let mut pieces: BTreeMap<&str, Vec<funding::Piece>> = BTreeMap::new();
        let mut members: BTreeMap<(String, Secs, Dimension, String), i64> = BTreeMap::new();
        for (org, session, interval) in billed {
            let state = states
                .get_mut(org)
                .expect("the funding state of every org billed was read");
            pieces
                .entry(org.as_str())
                .or_default()
                .extend(state.fund(session, *interval));
            let s = &self.sessions[&(org.clone(), session.clone())];
            // Funded in the open month (late time is an adjustment there), but rolled up
            // where it ran, as org_hourly is: a member's use in a window never passes its
            // org's, which the gate relies on (`members::within_reach`).
            let ran_in = |t| crate::time::Windows::at(t, state.billing_period);
            for (bucket, seconds) in buckets(*interval, ran_in) {
                for dim in Dimension::ALL {
                    *members
                        .entry((org.clone(), bucket, *dim, member_of(s, *dim).to_owned()))
                        .or_default() += seconds;
                }
            }
        }
        self.member_hours = members;
        let mut out = Funding::default();
        for (org, pieces) in pieces {
            let state = &states[org];
            out.windows
                .extend(state.windows.values().map(|w| (org.to_owned(), *w)));
            let used: Vec<&str> = pieces
                .iter()
                .filter_map(|p| p.grant_id.as_deref())
                .collect();
            out.grants.extend(
                state
                    .grants
                    .iter()
                    .filter(|g| used.contains(&g.grant_id.as_str()))
                    .cloned(),
            );
            for ((hour, source, grant), v) in funding::hourly(&pieces) {
                let e = out
                    .hourly
                    .entry((org.to_owned(), hour, source, grant))
                    .or_default();
                e.0 += v.0;
                e.1 += v.1;
            }
        }
        self.funding = out;
    }

    /// Seconds booked in all.
    pub fn billed_seconds(&self) -> i64 {
        self.org_hours.values().sum()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// The booking cut by `key` of each row's org (the shard its rows live on, say): one
    /// booking a key, each written by statements of its own.
    pub fn split_by<K: Ord>(self, key: impl Fn(&str) -> K) -> BTreeMap<K, Booking> {
        let mut out: BTreeMap<K, Booking> = BTreeMap::new();
        for ((org, hour), secs) in self.org_hours {
            out.entry(key(&org))
                .or_default()
                .org_hours
                .insert((org, hour), secs);
        }
        for ((org, hour, session), secs) in self.session_hours {
            out.entry(key(&org))
                .or_default()
                .session_hours
                .insert((org, hour, session), secs);
        }
        for span in self.spans {
            out.entry(key(&span.0)).or_default().spans.push(span);
        }
        for (k, s) in self.sessions {
            out.entry(key(&s.org_id)).or_default().sessions.insert(k, s);
        }
        for b in self.billed {
            out.entry(key(&b.0)).or_default().billed.push(b);
        }
        for w in self.funding.windows {
            out.entry(key(&w.0)).or_default().funding.windows.push(w);
        }
        for g in self.funding.grants {
            out.entry(key(&g.org_id))
                .or_default()
                .funding
                .grants
                .push(g);
        }
        for (k, v) in self.funding.hourly {
            out.entry(key(&k.0))
                .or_default()
                .funding
                .hourly
                .insert(k, v);
        }
        for (k, v) in self.member_hours {
            out.entry(key(&k.0)).or_default().member_hours.insert(k, v);
        }
        out
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
        assert_eq!(
            booking.sessions[&crate::session::key("o", "s")]
                .ledger
                .billed_seconds,
            30
        );
    }

    /// Time that arrives after its month closed is funded in the open month but rolled up
    /// by member in the hour it ran, as by org: the two rollups hold the same seconds in the
    /// same hours.
    #[test]
    fn late_member_time_keeps_its_hour_as_the_org_rollup_does() {
        const DEC: Secs = 1_796_083_200; // 2026-12-01 00:00 UTC; November closed
        let late = Interval::new(DEC - 2 * 3600, DEC - 2 * 3600 + 1800).unwrap();
        let mut s = Session::admitted("o", "s", late.start);
        s.started_by = Some("ann".into());
        s.project_id = Some("web".into());
        let mut b = Booking::default();
        let fx = Effects {
            billed: Some(late),
            closed: vec![],
            ignored: false,
        };
        b.add(&s, &fx);
        let terms = funding::Terms {
            month_limit: 36_000,
            week_limit: 36_000,
            price_units: 0,
            cap_units: 0,
        };
        let state = funding::State::new(terms, None, DEC, [], vec![]);
        let mut states = BTreeMap::from([("o".to_owned(), state)]);
        b.fund(&mut states);
        let december = crate::time::calendar_month(DEC);
        let funds = states["o"].funds(funding::WindowKind::Month, december);
        assert_eq!(funds.plan, 1800, "funded in the open month");
        assert_eq!(
            b.org_hours,
            BTreeMap::from([(("o".into(), DEC - 7200), 1800)])
        );
        for dim in Dimension::ALL {
            let key = (
                "o".to_owned(),
                DEC - 7200,
                *dim,
                member_of(&s, *dim).to_owned(),
            );
            assert_eq!(b.member_hours.get(&key), Some(&1800), "{dim:?}");
        }
    }

    #[test]
    fn a_booking_splits_by_org_without_losing_a_row() {
        let mut b = Booking::default();
        for org in ["a", "b", "c"] {
            let s = Session::admitted(org, &format!("s_{org}"), 0);
            let fx = Effects {
                billed: crate::time::Interval::new(0, 10),
                closed: vec![Span {
                    kind: VmState::Running,
                    interval: crate::time::Interval::new(0, 10).unwrap(),
                }],
                ignored: false,
            };
            b.add(&s, &fx);
        }
        let parts = b.clone().split_by(|org| org == "b");
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[&true].billed_seconds(), 10);
        assert_eq!(parts[&false].billed_seconds(), 20);
        let rows = |b: &Booking| (b.sessions.len(), b.spans.len(), b.session_hours.len());
        let (t, f) = (rows(&parts[&true]), rows(&parts[&false]));
        assert_eq!((t.0 + f.0, t.1 + f.1, t.2 + f.2), rows(&b));
    }
}
