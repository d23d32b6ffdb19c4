//! Property tests of the accrual core (src/ledger.rs), through the entry points the store
//! calls (`receive`, `pass_time`, `close_session`).

use proptest::prelude::*;
use rush_meter_core::ledger::*;

const R: Rules = Rules {
    interval: 15,
    lease: 45,
};

#[derive(Clone, Debug)]
enum Ev {
    Beat {
        dt: i64,
        state: VmState,
    },
    Expire {
        dt: i64,
    },
    End {
        dt: i64,
    },
    /// Deliver again the k-th heartbeat sent so far (a duplicate or a late one).
    Replay {
        k: usize,
    },
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        6 => (0i64..120, prop_oneof![Just(VmState::Running), Just(VmState::Parked)])
            .prop_map(|(dt, state)| Ev::Beat { dt, state }),
        1 => (0i64..200).prop_map(|dt| Ev::Expire { dt }),
        1 => (0i64..60).prop_map(|dt| Ev::End { dt }),
        2 => (0usize..50).prop_map(|k| Ev::Replay { k }),
    ]
}

/// What a run of events produced.
#[derive(Debug, Default)]
struct Run {
    led: Option<SessionLedger>,
    billed: Vec<Interval>,
    closed: Vec<Span>,
    sent: Vec<Observation>,
    /// Applied observations `(at, state)`.
    applied: Vec<(Secs, VmState)>,
}

fn run(events: &[Ev], with_expiry: bool) -> Run {
    let mut r = Run::default();
    let mut t = 1_000_000;
    let mut seq = 0;
    for e in events {
        // Time passes the same whether or not the expiry job runs.
        if let Ev::Expire { dt } = e {
            t += dt;
        }
        let step = match (e, &r.led) {
            (Ev::Beat { dt, state }, _) => {
                t += dt;
                seq += 1;
                let obs = Observation {
                    seq,
                    at: t,
                    state: *state,
                };
                r.sent.push(obs);
                let base = r.led.clone().unwrap_or_else(|| SessionLedger::admitted(t));
                receive(&base, &obs, t, &R)
            }
            (Ev::Replay { k }, Some(led)) if !r.sent.is_empty() => {
                let obs = r.sent[k % r.sent.len()];
                receive(led, &obs, t, &R)
            }
            (Ev::Expire { .. }, Some(led)) if with_expiry => match pass_time(led, t, &R) {
                Some(x) => x,
                None => continue,
            },
            (Ev::End { dt }, Some(led)) => {
                t += dt;
                close_session(led, t, EndStatus::Completed, &R)
            }
            _ => continue,
        };
        r.take(step);
    }
    // Let time run out, so every open running stretch is booked.
    if let Some(led) = &r.led {
        if let Some(step) = pass_time(led, t + 10 * R.lease, &R) {
            r.take(step);
        }
    }
    r
}

impl Run {
    fn take(&mut self, step: Step) {
        for fx in step.effects {
            self.billed.extend(fx.billed);
            self.closed.extend(fx.closed);
        }
        self.applied.extend(step.applied);
        self.led = Some(step.ledger);
    }
}

fn total(r: &Run) -> i64 {
    r.billed.iter().map(Interval::len).sum()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// The booked total is the sum of the pieces, the pieces never overlap (no double
    /// count), and every piece lies inside a closed running span.
    #[test]
    fn billing_is_conserved_and_never_overlaps(events in prop::collection::vec(ev(), 0..80)) {
        let r = run(&events, true);
        let billed_total = r.led.as_ref().map_or(0, |l| l.billed_seconds);
        prop_assert_eq!(billed_total, total(&r));
        for w in r.billed.windows(2) {
            prop_assert!(w[0].end <= w[1].start, "overlap: {:?}", w);
        }
        let running: Vec<Interval> = r.closed.iter().filter(|s| s.kind == VmState::Running).map(|s| s.interval).collect();
        prop_assert_eq!(total(&r), running.iter().map(Interval::len).sum::<i64>());
        for b in &r.billed {
            prop_assert!(running.iter().any(|s| s.start <= b.start && b.end <= s.end), "{:?} outside running spans", b);
        }
    }

    /// Duplicates and late deliveries of heartbeats already sent change nothing.
    #[test]
    fn replays_change_nothing(events in prop::collection::vec(ev(), 0..80)) {
        let without: Vec<Ev> = events.iter().filter(|e| !matches!(e, Ev::Replay { .. })).cloned().collect();
        let a = run(&events, true);
        let b = run(&without, true);
        prop_assert_eq!(a.led, b.led);
        prop_assert_eq!(a.billed, b.billed);
    }

    /// When the expiry job runs changes no total: booking a silence at expiry or at the
    /// next heartbeat comes to the same.
    #[test]
    fn expiry_timing_is_invisible(events in prop::collection::vec(ev(), 0..80)) {
        let swept = run(&events, true);
        let lazy = run(&events, false);
        prop_assert_eq!(total(&swept), total(&lazy));
        prop_assert_eq!(swept.billed, lazy.billed);
    }

    /// Every billed piece starts at an applied running heartbeat and lasts at most a
    /// lease; one longer than an interval ends at the next applied event.
    #[test]
    fn billing_follows_running_evidence(events in prop::collection::vec(ev(), 0..80)) {
        let r = run(&events, true);
        for b in &r.billed {
            prop_assert!(r.applied.contains(&(b.start, VmState::Running)), "{:?} starts without a running beat", b);
            prop_assert!(b.len() <= R.lease);
        }
    }

    /// A session only ever reported parked bills nothing.
    #[test]
    fn parked_time_is_free(dts in prop::collection::vec(0i64..100_000, 0..60)) {
        let events: Vec<Ev> = dts.into_iter().map(|dt| Ev::Beat { dt, state: VmState::Parked }).collect();
        prop_assert_eq!(total(&run(&events, true)), 0);
    }

    /// After the end nothing bills, whatever arrives.
    #[test]
    fn nothing_bills_after_the_end(before in prop::collection::vec(ev(), 0..40), after in prop::collection::vec(ev(), 0..40)) {
        let mut events = vec![Ev::Beat { dt: 0, state: VmState::Running }];
        events.extend(before);
        events.push(Ev::End { dt: 1 });
        let ended = run(&events, true);
        events.extend(after);
        let later = run(&events, true);
        prop_assert_eq!(total(&ended), total(&later));
    }

    /// Hour splitting loses and invents nothing.
    #[test]
    fn split_hours_is_exact(start in -100_000i64..100_000, len in 1i64..20_000) {
        let iv = Interval::new(start, start + len).unwrap();
        let parts: Vec<(Secs, i64)> = split_hours(iv).collect();
        prop_assert_eq!(parts.iter().map(|p| p.1).sum::<i64>(), len);
        for (h, s) in parts {
            prop_assert_eq!(h.rem_euclid(3600), 0);
            prop_assert!(s > 0 && s <= 3600);
        }
    }
}

/// Beats of one session sent in `seq` order at increasing times, each `(dt, state)` after
/// the last.
fn beats() -> impl Strategy<Value = Vec<(i64, VmState)>> {
    prop::collection::vec(
        (
            1i64..40,
            prop_oneof![Just(VmState::Running), Just(VmState::Parked)],
        ),
        1..60,
    )
}

/// Deliver `sent` at the given arrival times (a beat keeps its own time: it arrives within
/// a lease of being sent), in arrival order; then let time run out.
fn deliver(sent: &[Observation], arrivals: &[Secs]) -> Run {
    let mut order: Vec<usize> = (0..sent.len()).collect();
    order.sort_by_key(|&i| (arrivals[i], sent[i].seq));
    let mut r = Run::default();
    let mut led = SessionLedger::admitted(sent[0].at);
    for i in order {
        let step = receive(&led, &sent[i], arrivals[i], &R);
        led = step.ledger.clone();
        r.take(step);
    }
    let end = arrivals.iter().max().copied().unwrap_or(0) + 10 * R.lease;
    if let Some(step) = pass_time(&led, end, &R) {
        r.take(step);
    }
    r
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Heartbeats (but a session's first) overtaken by later ones (retried requests, say),
    /// each arriving within a lease of being sent, bill exactly as if none had been: a
    /// `parked` one late never lets its parked time be billed, a `running` one late never
    /// leaves its time out.
    #[test]
    fn heartbeats_late_within_a_lease_bill_as_if_on_time(
        beats in beats(),
        delays in prop::collection::vec(prop_oneof![3 => Just(0i64), 1 => 1i64..R.lease], 60),
    ) {
        let mut t = 1_000_000;
        let sent: Vec<Observation> = beats
            .iter()
            .enumerate()
            .map(|(i, (dt, state))| {
                t += dt;
                Observation { seq: i as i64 + 1, at: t, state: *state }
            })
            .collect();
        let on_time: Vec<Secs> = sent.iter().map(|o| o.at).collect();
        // Nothing can tell a first heartbeat overtaken from one lost: it is on time.
        let arrivals: Vec<Secs> = on_time
            .iter()
            .enumerate()
            .map(|(i, at)| if i == 0 { *at } else { at + delays[i] })
            .collect();
        let (a, b) = (deliver(&sent, &on_time), deliver(&sent, &arrivals));
        prop_assert_eq!(total(&a), total(&b));
        prop_assert_eq!(a.billed, b.billed);
        prop_assert_eq!(a.closed, b.closed);
    }
}
