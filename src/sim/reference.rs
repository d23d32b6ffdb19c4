//! The reference ledger of a simulated fleet: the pure core applied to exactly the
//! heartbeats the meter acknowledged. What the store must match to the second, and the
//! bound on what a crash may be billed past what truly ran.

use rush_meter_core::ledger::{
    self, Effects, EndStatus, Observation, Rules, SessionLedger, VmState,
};
use rush_meter_core::time::{Interval, Secs};

use super::model::{Beat, Delivery, Fleet, Truth};

/// The meter's view of a beat delivered at `now`: its time clamped to the meter's clock.
pub fn observation(beat: &Beat, now: Secs, rules: &Rules) -> Observation {
    Observation {
        seq: beat.seq,
        at: rules.clamp_sent_at(beat.sent_at, now),
        state: beat.state,
    }
}

/// The ledger the pure core computes for a fleet: each session's state, what it billed,
/// and the observations it applied. The reference the store must match exactly.
#[derive(Clone, Debug, Default)]
pub struct Reference {
    pub sessions: std::collections::BTreeMap<String, RefSession>,
}

#[derive(Clone, Debug)]
pub struct RefSession {
    pub org: String,
    pub ledger: SessionLedger,
    pub billed: Vec<Interval>,
    /// `(at, state)` of every applied heartbeat, in order.
    pub applied: Vec<(Secs, VmState)>,
    pub ended_at: Option<Secs>,
}

impl Reference {
    fn record(&mut self, session: &str, step: &ledger::Step) {
        let entry = self.sessions.get_mut(session).expect("known");
        entry
            .billed
            .extend(step.effects.iter().filter_map(|fx: &Effects| fx.billed));
        entry.applied.extend(step.applied.iter().copied());
        entry.ledger = step.ledger.clone();
    }

    pub fn heartbeat(&mut self, beat: &Beat, now: Secs, rules: &Rules) {
        let obs = observation(beat, now, rules);
        let entry = self
            .sessions
            .entry(beat.session.clone())
            .or_insert_with(|| RefSession {
                org: beat.org.clone(),
                ledger: SessionLedger::admitted(obs.at),
                billed: Vec::new(),
                applied: Vec::new(),
                ended_at: None,
            });
        let step = ledger::receive(&entry.ledger, &obs, now, rules);
        self.record(&beat.session, &step);
    }

    pub fn end(&mut self, session: &str, now: Secs, status: EndStatus, rules: &Rules) {
        let Some(entry) = self.sessions.get_mut(session) else {
            return;
        };
        let step = ledger::close_session(&entry.ledger, now, status, rules);
        if !step.duplicate {
            entry.ended_at = step.ledger.ended_at;
        }
        self.record(session, &step);
    }

    pub fn expire(&mut self, now: Secs, rules: &Rules) {
        let ids: Vec<String> = self.sessions.keys().cloned().collect();
        for id in ids {
            let entry = self.sessions.get_mut(&id).expect("listed");
            if let Some(step) = ledger::pass_time(&entry.ledger, now, rules) {
                self.record(&id, &step);
            }
        }
    }

    /// Replay a whole fleet through the pure core, expiring every `expire_every` seconds.
    pub fn of(fleet: &Fleet, expire_every: Secs) -> Reference {
        let rules = fleet.params.rules;
        let mut r = Reference::default();
        let mut next_expiry = fleet.params.start + expire_every;
        for d in &fleet.deliveries {
            while next_expiry <= d.at() {
                r.expire(next_expiry, &rules);
                next_expiry += expire_every;
            }
            match d {
                Delivery::Batch { at, beats } => {
                    let mut sorted: Vec<&Beat> = beats.iter().collect();
                    sorted.sort_by(|a, b| (&a.session, a.seq).cmp(&(&b.session, b.seq)));
                    for beat in sorted {
                        r.heartbeat(beat, *at, &rules);
                    }
                }
                Delivery::End {
                    at,
                    session,
                    status,
                    ..
                } => r.end(session, *at, *status, &rules),
            }
        }
        r
    }
}

/// Seconds of `a` not covered by `b` (both sorted, each internally disjoint).
pub fn uncovered(a: &[Interval], b: &[Interval]) -> i64 {
    a.iter()
        .map(|x| {
            x.len()
                - b.iter()
                    .filter_map(|y| x.clip(y))
                    .map(|c| c.len())
                    .sum::<i64>()
        })
        .sum()
}

/// The error the ledger rules allow for one session, from what the meter applied
/// (docs/ledger.md states it):
/// - over-billing only follows a true stop (park or crash) at `T`: up to the first applied
///   heartbeat after it, or, when that comes more than a lease after the last applied
///   running heartbeat `t`, up to `t + interval`;
/// - under-billing only precedes the first applied running heartbeat after a true start,
///   and fills silences past the lease beyond their first interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bound {
    pub over: i64,
    pub under: i64,
}

pub fn bound(
    truth: &Truth,
    applied: &[(Secs, VmState)],
    ended_at: Option<Secs>,
    rules: &Rules,
) -> Bound {
    let mut b = Bound::default();
    let times: Vec<Secs> = applied.iter().map(|(t, _)| *t).chain(ended_at).collect();
    for &stop in &truth.stops {
        let last_running = applied
            .iter()
            .rev()
            .find(|(t, _)| *t <= stop)
            .filter(|(_, s)| *s == VmState::Running)
            .map(|(t, _)| *t);
        let Some(t) = last_running else { continue };
        let next = times.iter().copied().find(|u| *u > stop);
        b.over += match next {
            Some(u) if u - t <= rules.lease => u - stop,
            _ => (t + rules.interval - stop).max(0),
        };
    }
    for (i, &start) in truth.starts.iter().enumerate() {
        let run_end = truth.running[i].end;
        let first = applied
            .iter()
            .find(|(t, s)| *t >= start && *s == VmState::Running)
            .map_or(run_end, |(t, _)| (*t).min(run_end));
        b.under += first - start;
    }
    // Silences between applied events (the end counts as one), beyond their first interval.
    let events: Vec<(Secs, VmState)> = applied
        .iter()
        .copied()
        .chain(ended_at.map(|e| (e, VmState::Parked)))
        .collect();
    for w in events.windows(2) {
        let ((t, s), (u, _)) = (w[0], w[1]);
        if s == VmState::Running && u - t > rules.lease {
            b.under += u - t - rules.interval;
        }
    }
    // A silence never broken (the supervisor lost its network, then the VM stopped).
    if let Some(&(t, VmState::Running)) = events.last() {
        if let Some(run) = truth.running.iter().find(|r| r.start <= t && t < r.end) {
            b.under += (run.end - t - rules.interval).max(0);
        }
    }
    b
}
