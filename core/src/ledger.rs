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
    /// Heartbeats received but not applied yet, in `seq` order: one before the first may
    /// be missing (`receive`).
    pub held: Vec<Observation>,
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
            held: Vec::new(),
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

/// What receiving one event came to: the ledger after it, and what each heartbeat it
/// applied did, in order (none while events are held; several when held ones follow).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub ledger: SessionLedger,
    pub effects: Vec<Effects>,
    /// `(time, state)` of each heartbeat applied, in order.
    pub applied: Vec<(Secs, VmState)>,
    /// The event itself changed nothing: a repeated or overtaken `seq`, or a session
    /// already ended (held events applied meanwhile are in `effects` all the same).
    pub duplicate: bool,
}

/// Events a session holds at most: past it, the oldest is applied as if what is missing
/// before it were lost.
pub const HELD_MAX: usize = 16;

impl Step {
    fn of(led: &SessionLedger) -> Step {
        Step {
            ledger: led.clone(),
            effects: Vec::new(),
            applied: Vec::new(),
            duplicate: false,
        }
    }

    /// Apply `obs` to the ledger as it stands, its held events kept aside.
    fn apply(&mut self, obs: &Observation, rules: &Rules) {
        let held = std::mem::take(&mut self.ledger.held);
        let (mut next, fx) = apply_heartbeat(&self.ledger, obs, rules);
        next.held = held.into_iter().filter(|h| h.seq > obs.seq).collect();
        if !fx.ignored {
            self.applied.push((next.last_at, obs.state));
            self.effects.push(fx);
        }
        self.ledger = next;
    }

    /// Apply the first held event whatever is missing before it.
    fn apply_first(&mut self, rules: &Rules) {
        if let Some(h) = self.ledger.held.first().copied() {
            self.apply(&h, rules);
        }
    }

    /// Apply the held events that follow the ledger with nothing missing before them, and
    /// those whose wait is over at `now` (each with what is missing before it as lost).
    fn drain(&mut self, now: Secs, rules: &Rules) {
        while let Some(h) = self.ledger.held.first().copied() {
            if gap_before(&self.ledger, &h, rules) && !due(&h, now, rules) {
                return;
            }
            self.apply(&h, rules);
        }
    }

    /// Apply every held event, in order.
    fn settle_all(&mut self, rules: &Rules) {
        while !self.ledger.held.is_empty() {
            self.apply_first(rules);
        }
    }
}

/// The longest gap between two events of a running session with none missing between
/// them: a supervisor beats every interval while it runs, and at every transition.
pub fn expected_gap(rules: &Rules) -> Secs {
    rules.interval + rules.interval / 2
}

/// Whether an event may have one missing before it, lost or still on its way: the
/// session's `seq` skipped one (docs/ledger.md, rule 4: a supervisor counts up by one), or
/// a running session's event came more than `expected_gap` after its last.
fn gap_before(led: &SessionLedger, obs: &Observation, rules: &Rules) -> bool {
    led.last_seq.is_some_and(|s| obs.seq > s + 1)
        || (led.phase == Phase::Running && obs.at - led.last_at > expected_gap(rules))
}

/// Whether a held event has waited long enough: any heartbeat sent before it keeps its
/// own time only within a lease of being sent, so after a lease none can land before it.
fn due(held: &Observation, now: Secs, rules: &Rules) -> bool {
    held.at <= held_due_before(now, rules)
}

/// Held events at or before this time have waited long enough at `now` (`pass_time`
/// applies them; the store's expiry job looks them up by it).
pub fn held_due_before(now: Secs, rules: &Rules) -> Secs {
    now - rules.lease
}

/// Receive one heartbeat at `now`. An event that may have one missing before it (the
/// session's `seq` skipped one, or a running session's came more than `expected_gap` after
/// its last) is held, with every later one, instead of applied: a `parked` heartbeat
/// missing between them would stop the bill the gap would otherwise run (DESIGN.md rule
/// 1), a `running` one would start the bill the gap would leave out. Held events are
/// applied in `seq` order as soon as nothing is missing before them, and each once it has
/// waited a lease (whatever arrives, `pass_time` or `close_session` comes first: all book
/// the same), so a lost heartbeat costs what it cost before, only later.
pub fn receive(led: &SessionLedger, obs: &Observation, now: Secs, rules: &Rules) -> Step {
    let mut step = Step::of(led);
    // What has waited long enough is applied first, whatever comes next: when the
    // expiry job runs changes nothing.
    step.drain(now, rules);
    let l = &step.ledger;
    if l.phase == Phase::Ended
        || l.last_seq.is_some_and(|s| obs.seq <= s)
        || l.held.iter().any(|h| h.seq == obs.seq)
    {
        step.duplicate = true;
        return step;
    }
    let at = step.ledger.held.partition_point(|h| h.seq < obs.seq);
    step.ledger.held.insert(at, *obs);
    if step.ledger.held.len() > HELD_MAX {
        step.apply_first(rules);
    }
    step.drain(now, rules);
    step
}

/// Time passing: held events whose wait is over are applied, then `expire` (none while an
/// event is still held: the session spoke). `None` when nothing changes.
pub fn pass_time(led: &SessionLedger, now: Secs, rules: &Rules) -> Option<Step> {
    let mut step = Step::of(led);
    step.drain(now, rules);
    if step.ledger.held.is_empty() {
        if let Some((next, fx)) = expire(&step.ledger, now, rules) {
            step.ledger = next;
            step.effects.push(fx);
        }
    }
    (step.ledger != *led).then_some(step)
}

/// Close a session at `at` (`end_session`), its held events applied first.
pub fn close_session(led: &SessionLedger, at: Secs, status: EndStatus, rules: &Rules) -> Step {
    let mut step = Step::of(led);
    if led.phase != Phase::Ended {
        step.settle_all(rules);
    }
    let (next, fx) = end_session(&step.ledger, at, status, rules);
    step.duplicate = fx.ignored;
    if !fx.ignored {
        step.effects.push(fx);
    }
    step.ledger = next;
    step
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

    /// `receive` each `(heartbeat, arrival)`: what was billed, the spans closed, the last
    /// ledger.
    fn received(events: &[(Observation, Secs)]) -> (i64, Vec<Span>, SessionLedger) {
        let mut led = SessionLedger::admitted(events[0].0.at);
        let mut closed = Vec::new();
        for (obs, now) in events {
            let step = receive(&led, obs, *now, &R);
            closed.extend(step.effects.iter().flat_map(|fx| fx.closed.clone()));
            led = step.ledger;
        }
        (led.billed_seconds, closed, led)
    }

    /// A `parked` heartbeat overtaken by a later one (a retry, say) still stops the bill:
    /// the later one is held until it comes, and applied after it.
    #[test]
    fn a_parked_heartbeat_overtaken_by_a_later_one_still_stops_the_bill() {
        let late_park = |parked_at: Secs| hb(6, parked_at, VmState::Parked);
        let (billed, closed, led) = received(&[
            (hb(4, 85, VmState::Running), 85),
            (hb(5, 100, VmState::Running), 100),
            (hb(7, 140, VmState::Running), 140),
            (late_park(110), 150),
            (hb(8, 155, VmState::Parked), 155),
        ]);
        assert_eq!(
            billed,
            15 + 10 + 15,
            "today's ledger billed the parked 30 s too"
        );
        let span = |kind, start, end| Span {
            kind,
            interval: Interval::new(start, end).unwrap(),
        };
        assert_eq!(
            closed,
            [
                span(VmState::Running, 85, 110),
                span(VmState::Parked, 110, 140),
                span(VmState::Running, 140, 155)
            ]
        );
        assert!(led.held.is_empty());
    }

    /// A held heartbeat: its repeat changes nothing; after a lease with nothing before it,
    /// time alone applies it as if the missing one were lost; so does the session's end.
    #[test]
    fn a_held_heartbeat_is_applied_after_a_lease_or_at_the_end() {
        let (_, _, led) = received(&[
            (hb(1, 100, VmState::Running), 100),
            (hb(3, 130, VmState::Running), 130),
        ]);
        assert_eq!((led.billed_seconds, led.held.len()), (0, 1));
        let again = receive(&led, &hb(3, 130, VmState::Running), 131, &R);
        assert!(again.duplicate && again.effects.is_empty());
        assert_eq!(again.ledger, led);
        assert_eq!(
            pass_time(&led, 130 + R.lease - 1, &R),
            None,
            "still waiting"
        );
        let step = pass_time(&led, 130 + R.lease, &R).unwrap();
        assert_eq!((step.ledger.billed_seconds, step.ledger.last_at), (30, 130));
        assert!(step.ledger.held.is_empty());
        // Its seq 2, late past that, changes nothing.
        let late = receive(&step.ledger, &hb(2, 115, VmState::Parked), 180, &R);
        assert!(late.duplicate);
        let ended = close_session(&led, 140, EndStatus::Completed, &R);
        assert_eq!(ended.ledger.billed_seconds, 30 + 10);
        assert_eq!(ended.applied, [(130, VmState::Running)]);
    }

    /// Heartbeats an interval apart, `seq` counting up by one, are applied as they come:
    /// nothing is held, nothing waits.
    #[test]
    fn heartbeats_in_order_are_never_held() {
        let beats: Vec<(Observation, Secs)> = (0..20)
            .map(|i| (hb(i + 1, 100 + 15 * i, VmState::Running), 100 + 15 * i))
            .collect();
        let mut led = SessionLedger::admitted(100);
        for (obs, now) in &beats {
            let step = receive(&led, obs, *now, &R);
            assert!(step.ledger.held.is_empty());
            led = step.ledger;
        }
        assert_eq!(led.billed_seconds, 15 * 19);
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
