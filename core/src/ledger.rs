//! The accrual core: how one session's observations become billed running time.
//!
//! Pure: no I/O, no clock. Every function takes the meter's time as an argument, so the
//! property tests and the fleet simulation drive it exactly as the store does.
//!
//! The rules (DESIGN.md 1–5, 7), as this module keeps them:
//! - Only the host side's `running` state bills; billing starts at the first running
//!   heartbeat (never at admission) and stops at the observation that ends it.
//! - Between a running observation at `t` and the next observation at `u`, `[t, u)` is
//!   billed when `u - t <= lease`; otherwise only `[t, t + interval)` is, the session is
//!   presumed gone, and the rest of the silence stays unbilled.
//! - Observations are ordered by the reporter's per-session `seq`. One whose `seq` is not
//!   above the last applied is a duplicate or was overtaken: it changes nothing. A late
//!   heartbeat therefore costs at most what a lost one costs.
//! - Times are whole Unix seconds and never run backwards within a session.

pub use crate::time::{Interval, Secs};

/// How long a parked session may stay idle before it is ended as `expired`.
pub const PARKED_EXPIRY_SECS: Secs = 7 * 24 * 3600;

named! {
    /// The state a host-side supervisor reports for its microVM.
    pub enum VmState {
        /// Billed.
        Running = "running",
        /// Free.
        Parked = "parked",
    }
}

named! {
    /// Where a session stands in the meter's view.
    pub enum Phase {
        /// Admitted by the gate, no heartbeat yet: nothing bills.
        Admitted = "admitted",
        Running = "running",
        Parked = "parked",
        /// Was running, then silent past the lease: billed one interval past its last
        /// heartbeat and presumed gone until it speaks again.
        Silent = "silent",
        Ended = "ended",
    }
}

named! {
    /// How a session ended.
    pub enum EndStatus {
        Completed = "completed",
        NeedsReview = "needs_review",
        Cancelled = "cancelled",
        Failed = "failed",
        Expired = "expired",
    }
}

/// The timing rules, from configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    pub interval: Secs,
    pub lease: Secs,
}

impl Rules {
    /// A reporter's `sent_at`, trusted only within the last lease of the meter's clock:
    /// a supervisor that batches or retries keeps its beats' own times, and no reporter
    /// can place a beat in the future or further back than the lease.
    pub fn clamp_sent_at(&self, sent_at: Secs, now: Secs) -> Secs {
        sent_at.clamp(now - self.lease, now)
    }
}

/// One session's ledger state, as stored in its row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionLedger {
    pub phase: Phase,
    /// Highest `seq` applied; `None` before the first heartbeat.
    pub last_seq: Option<i64>,
    /// Time of the last observation (admission time while `Admitted`).
    pub last_at: Secs,
    /// Start of the current span: running, parked, or the silence after a running span.
    pub span_start: Secs,
    pub billed_seconds: i64,
    /// Heartbeats applied (duplicates and overtaken ones excluded).
    pub heartbeats: i64,
    /// Times the session spoke again after a silence past the lease.
    pub silences: i64,
    pub ended_at: Option<Secs>,
    pub end_status: Option<EndStatus>,
}

impl SessionLedger {
    /// A session the gate admitted at `at`: it holds a slot but bills nothing yet.
    pub fn admitted(at: Secs) -> Self {
        SessionLedger {
            phase: Phase::Admitted,
            last_seq: None,
            last_at: at,
            span_start: at,
            billed_seconds: 0,
            heartbeats: 0,
            silences: 0,
            ended_at: None,
            end_status: None,
        }
    }

    /// Running time not yet booked but counted by reads at `now`: a running session is
    /// counted up to `now`, at most one interval past its last heartbeat (what it would be
    /// billed if it never spoke again), so a read never shows more than the ledger books.
    pub fn provisional(&self, now: Secs, rules: &Rules) -> Option<Interval> {
        (self.phase == Phase::Running)
            .then(|| Interval::new(self.last_at, now.min(self.last_at + rules.interval)))
            .flatten()
    }
}

/// A closed span of a session's timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Span {
    pub kind: VmState,
    pub interval: Interval,
}

/// One heartbeat as the ledger sees it: time already clamped to the meter's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observation {
    pub seq: i64,
    pub at: Secs,
    pub state: VmState,
}

/// What applying one event did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// Running time to book (at most one interval per event).
    pub billed: Option<Interval>,
    /// Spans that this event closed.
    pub closed: Vec<Span>,
    /// The event changed nothing: a repeated or overtaken `seq`, or a session already ended.
    pub ignored: bool,
}

impl Effects {
    fn ignored() -> Self {
        Effects {
            ignored: true,
            ..Effects::default()
        }
    }
}

/// Apply one heartbeat. The caller persists the returned state and effects together.
pub fn apply_heartbeat(
    led: &SessionLedger,
    obs: &Observation,
    rules: &Rules,
) -> (SessionLedger, Effects) {
    if led.phase == Phase::Ended || led.last_seq.is_some_and(|s| obs.seq <= s) {
        return (led.clone(), Effects::ignored());
    }
    let at = obs.at.max(led.last_at);
    let mut next = led.clone();
    let mut fx = Effects::default();
    next.last_seq = Some(obs.seq);
    next.heartbeats += 1;

    let continuing = match led.phase {
        Phase::Running => {
            let stop = running_stop(led, at, rules);
            fx.billed = Interval::new(led.last_at, stop);
            if stop < at {
                // Silent past the lease and back: the gap stays unbilled.
                next.silences += 1;
                close(&mut fx, VmState::Running, led.span_start, stop);
                false
            } else if obs.state == VmState::Running {
                true
            } else {
                close(&mut fx, VmState::Running, led.span_start, at);
                false
            }
        }
        Phase::Parked => {
            if obs.state == VmState::Parked {
                true
            } else {
                close(&mut fx, VmState::Parked, led.span_start, at);
                false
            }
        }
        Phase::Silent => {
            next.silences += 1;
            false
        }
        Phase::Admitted => false,
        Phase::Ended => unreachable!("handled above"),
    };
    if !continuing {
        next.span_start = at;
    }
    next.phase = match obs.state {
        VmState::Running => Phase::Running,
        VmState::Parked => Phase::Parked,
    };
    next.last_at = at;
    if let Some(b) = fx.billed {
        next.billed_seconds += b.len();
    }
    (next, fx)
}

/// Close a session at `at` with `status`. Repeating it changes nothing.
pub fn end_session(
    led: &SessionLedger,
    at: Secs,
    status: EndStatus,
    rules: &Rules,
) -> (SessionLedger, Effects) {
    if led.phase == Phase::Ended {
        return (led.clone(), Effects::ignored());
    }
    let at = at.max(led.last_at);
    let mut next = led.clone();
    let mut fx = Effects::default();
    let end = match led.phase {
        Phase::Running => {
            let stop = running_stop(led, at, rules);
            fx.billed = Interval::new(led.last_at, stop);
            close(&mut fx, VmState::Running, led.span_start, stop);
            stop
        }
        Phase::Parked => {
            close(&mut fx, VmState::Parked, led.span_start, at);
            at
        }
        Phase::Silent | Phase::Admitted => at,
        Phase::Ended => unreachable!("handled above"),
    };
    if let Some(b) = fx.billed {
        next.billed_seconds += b.len();
    }
    next.phase = Phase::Ended;
    next.last_at = end.max(led.last_at);
    next.ended_at = Some(at);
    next.end_status = Some(status);
    (next, fx)
}

/// Leases of silence after which a running session becomes `Silent` (`expire`).
///
/// Three, not one: a heartbeat may arrive up to a lease after it was sent and keep its own
/// time, and wait up to a lease more between its arrival and its commit (in a group
/// commit's queue, behind a slow group), so only after three leases can no heartbeat still
/// land within a lease of the last one. (With two, one sent a lease late and committed a
/// second after arriving found its session made silent, and went unbilled.)
pub const SILENT_AFTER_LEASES: i64 = 3;

/// The last heartbeat before which a running session is silent at `now` (`expire`).
pub fn silent_before(now: Secs, rules: &Rules) -> Secs {
    now - SILENT_AFTER_LEASES * rules.lease
}

/// Time passing with no event: a running session silent for `SILENT_AFTER_LEASES` leases
/// becomes `Silent` (its last interval booked), and one idle for `PARKED_EXPIRY_SECS`
/// (parked, admitted and never started, or silent) ends as `expired`.
///
/// Running this at any moment changes no total, unless a heartbeat's commit waited more
/// than a lease: `apply_heartbeat` books the same either way. (A session silent past one
/// lease already holds no slot and counts as gone: that is read from `last_at`, not from
/// this phase.)
pub fn expire(led: &SessionLedger, now: Secs, rules: &Rules) -> Option<(SessionLedger, Effects)> {
    match led.phase {
        Phase::Running if led.last_at < silent_before(now, rules) => {
            let stop = led.last_at + rules.interval;
            let mut next = led.clone();
            let mut fx = Effects {
                billed: Interval::new(led.last_at, stop),
                ..Effects::default()
            };
            close(&mut fx, VmState::Running, led.span_start, stop);
            next.billed_seconds += fx.billed.map_or(0, |b| b.len());
            next.phase = Phase::Silent;
            next.span_start = stop;
            // Whatever arrives later is timed after what was just booked, even a
            // heartbeat sent earlier whose commit was delayed: nothing bills twice.
            next.last_at = stop;
            Some((next, fx))
        }
        // Idle for 7 days: parked, admitted but never started, or silent since.
        Phase::Parked | Phase::Admitted | Phase::Silent
            if now - led.span_start >= PARKED_EXPIRY_SECS =>
        {
            Some(end_session(
                led,
                led.span_start + PARKED_EXPIRY_SECS,
                EndStatus::Expired,
                rules,
            ))
        }
        _ => None,
    }
}

/// Where a running stretch that began at `led.last_at` stops when the next event is at `at`.
fn running_stop(led: &SessionLedger, at: Secs, rules: &Rules) -> Secs {
    if at - led.last_at <= rules.lease {
        at
    } else {
        led.last_at + rules.interval
    }
}

fn close(fx: &mut Effects, kind: VmState, start: Secs, end: Secs) {
    if let Some(interval) = Interval::new(start, end) {
        fx.closed.push(Span { kind, interval });
    }
}

/// Seconds of `interval` in each UTC hour it touches, as `(hour_start, seconds)`.
pub fn split_hours(interval: Interval) -> impl Iterator<Item = (Secs, i64)> {
    let first = interval.start.div_euclid(3600) * 3600;
    (first..interval.end).step_by(3600).filter_map(move |h| {
        Interval::new(h, h + 3600)
            .and_then(|hour| interval.clip(&hour))
            .map(|part| (h, part.len()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: Rules = Rules {
        interval: 15,
        lease: 45,
    };

    fn hb(seq: i64, at: Secs, state: VmState) -> Observation {
        Observation { seq, at, state }
    }

    fn run(led: SessionLedger, events: &[Observation]) -> SessionLedger {
        events.iter().fold(led, |l, o| apply_heartbeat(&l, o, &R).0)
    }

    #[test]
    fn billing_starts_at_first_running_heartbeat_not_admission() {
        let led = run(
            SessionLedger::admitted(0),
            &[
                hb(1, 100, VmState::Running),
                hb(2, 115, VmState::Running),
                hb(3, 130, VmState::Parked),
            ],
        );
        assert_eq!(led.billed_seconds, 30);
        assert_eq!(led.phase, Phase::Parked);
    }

    #[test]
    fn parked_time_is_never_billed() {
        let led = run(
            SessionLedger::admitted(0),
            &[
                hb(1, 0, VmState::Parked),
                hb(2, 1000, VmState::Parked),
                hb(3, 1010, VmState::Running),
                hb(4, 1020, VmState::Parked),
                hb(5, 5000, VmState::Parked),
            ],
        );
        assert_eq!(led.billed_seconds, 10);
    }

    #[test]
    fn silence_past_lease_bills_one_interval_and_flags() {
        let led = run(
            SessionLedger::admitted(0),
            &[hb(1, 0, VmState::Running), hb(2, 100, VmState::Running)],
        );
        assert_eq!(led.billed_seconds, 15);
        assert_eq!(led.silences, 1);
        assert_eq!(led.span_start, 100);
    }

    #[test]
    fn silence_of_exactly_the_lease_is_billed_whole() {
        let led = run(
            SessionLedger::admitted(0),
            &[hb(1, 0, VmState::Running), hb(2, 45, VmState::Running)],
        );
        assert_eq!(led.billed_seconds, 45);
        assert_eq!(led.silences, 0);
    }

    #[test]
    fn repeated_and_overtaken_seq_change_nothing() {
        let a = run(
            SessionLedger::admitted(0),
            &[hb(1, 0, VmState::Running), hb(3, 30, VmState::Running)],
        );
        let (b, fx) = apply_heartbeat(&a, &hb(2, 15, VmState::Parked), &R);
        assert!(fx.ignored);
        assert_eq!(a, b);
        let (c, fx) = apply_heartbeat(&a, &hb(3, 30, VmState::Running), &R);
        assert!(fx.ignored);
        assert_eq!(a, c);
    }

    #[test]
    fn end_closes_running_span_and_repeats_are_noops() {
        let a = run(SessionLedger::admitted(0), &[hb(1, 10, VmState::Running)]);
        let (b, fx) = end_session(&a, 20, EndStatus::Completed, &R);
        assert_eq!(b.billed_seconds, 10);
        assert_eq!(fx.closed.len(), 1);
        let (c, fx) = end_session(&b, 999, EndStatus::Failed, &R);
        assert!(fx.ignored);
        assert_eq!(b, c);
        let (d, fx) = apply_heartbeat(&c, &hb(2, 1000, VmState::Running), &R);
        assert!(fx.ignored);
        assert_eq!(c, d);
    }

    #[test]
    fn expiry_books_one_interval_then_parked_sessions_expire_after_seven_days() {
        let a = run(SessionLedger::admitted(0), &[hb(1, 10, VmState::Running)]);
        let silent = 10 + SILENT_AFTER_LEASES * R.lease;
        assert!(expire(&a, silent, &R).is_none());
        let (b, _) = expire(&a, silent + 1, &R).unwrap();
        assert_eq!((b.phase, b.billed_seconds), (Phase::Silent, 15));

        let p = run(SessionLedger::admitted(0), &[hb(1, 10, VmState::Parked)]);
        assert!(expire(&p, 10 + PARKED_EXPIRY_SECS - 1, &R).is_none());
        let (e, _) = expire(&p, 10 + PARKED_EXPIRY_SECS + 500, &R).unwrap();
        assert_eq!(e.end_status, Some(EndStatus::Expired));
        assert_eq!(e.ended_at, Some(10 + PARKED_EXPIRY_SECS));
    }

    /// A heartbeat sent a lease late (the latest the ingest takes it with its own time)
    /// whose commit waits a little more is still billed in full: the expiry job running
    /// meanwhile does not make its session silent first.
    #[test]
    fn a_heartbeat_a_lease_late_and_queued_keeps_its_time() {
        let a = run(SessionLedger::admitted(0), &[hb(1, 100, VmState::Running)]);
        let sent = 100 + R.lease;
        let arrived = sent + R.lease;
        for now in [arrived + 1, arrived + R.lease - 1] {
            assert!(expire(&a, now, &R).is_none(), "expired at {now}");
        }
        let (b, fx) = apply_heartbeat(&a, &hb(2, sent, VmState::Running), &R);
        assert_eq!(
            (b.billed_seconds, fx.billed),
            (45, Interval::new(100, sent))
        );
    }

    #[test]
    fn a_heartbeat_committed_after_expiry_never_bills_twice() {
        let a = run(SessionLedger::admitted(0), &[hb(1, 100, VmState::Running)]);
        let (b, fx) = expire(&a, 300, &R).unwrap();
        assert_eq!(fx.billed, Interval::new(100, 115));
        // Sent at 105, its commit delayed past the expiry: it is timed after what was booked.
        let (c, _) = apply_heartbeat(&b, &hb(2, 105, VmState::Running), &R);
        assert_eq!((c.span_start, c.last_at), (115, 115));
        let (d, fx) = apply_heartbeat(&c, &hb(3, 130, VmState::Parked), &R);
        assert_eq!(fx.billed, Interval::new(115, 130));
        assert_eq!(d.billed_seconds, 30);
    }

    #[test]
    fn split_hours_covers_interval_exactly() {
        let parts: Vec<_> = split_hours(Interval::new(3500, 7300).unwrap()).collect();
        assert_eq!(parts, vec![(0, 100), (3600, 3600), (7200, 100)]);
        let parts: Vec<_> = split_hours(Interval::new(-10, 5).unwrap()).collect();
        assert_eq!(parts, vec![(-3600, 10), (0, 5)]);
    }

    #[test]
    fn clamp_keeps_reporter_time_within_one_lease() {
        assert_eq!(R.clamp_sent_at(1000, 1005), 1000);
        assert_eq!(R.clamp_sent_at(2000, 1005), 1005);
        assert_eq!(R.clamp_sent_at(0, 1005), 960);
    }
}
