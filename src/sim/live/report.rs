//! What the fleet truly ran against what the meter billed, per org, with the difference
//! taken apart (see the module's documentation of `sim::live`).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rush_meter_core::ledger::Rules;
use rush_meter_core::time::Interval;

use super::{now_secs, Fleet, Late, Truth};

/// Per org: truth, bill, and the difference taken apart (seconds).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OrgLine {
    pub org: String,
    pub plan: String,
    pub sessions: u64,
    pub crashed: u64,
    pub ran: i64,
    pub billed: i64,
    pub crash_tails: i64,
    pub late: i64,
    pub unexplained: i64,
    /// Sessions the meter bills against the rules (see the module's documentation).
    pub mismatched: u64,
}

/// The run's outcome: one line an org, and the fleet's figures.
pub struct Outcome {
    pub lines: Vec<OrgLine>,
    pub summary: String,
}

impl Outcome {
    /// Sessions billed against the ledger's rules, in every org.
    pub fn mismatched(&self) -> u64 {
        self.lines.iter().map(|l| l.mismatched).sum()
    }

    /// The table the command prints, with a total line.
    pub fn table(&self) -> String {
        let total = self.lines.iter().fold(
            OrgLine {
                org: "total".into(),
                ..OrgLine::default()
            },
            |mut t, l| {
                t.sessions += l.sessions;
                t.crashed += l.crashed;
                t.ran += l.ran;
                t.billed += l.billed;
                t.crash_tails += l.crash_tails;
                t.late += l.late;
                t.unexplained += l.unexplained;
                t.mismatched += l.mismatched;
                t
            },
        );
        let mut out = format!(
            "{:<24} {:<6} {:>8} {:>7} {:>10} {:>10} {:>8} {:>10} {:>6} {:>11} {:>10}\n",
            "org",
            "plan",
            "sessions",
            "crashed",
            "ran_s",
            "billed_s",
            "diff_s",
            "crash_tail",
            "late",
            "unexplained",
            "mismatched"
        );
        for l in self.lines.iter().chain([&total]) {
            out += &format!(
                "{:<24} {:<6} {:>8} {:>7} {:>10} {:>10} {:>+8} {:>+10} {:>+6} {:>+11} {:>10}\n",
                l.org,
                l.plan,
                l.sessions,
                l.crashed,
                l.ran,
                l.billed,
                l.billed - l.ran,
                l.crash_tails,
                l.late,
                l.unexplained,
                l.mismatched
            );
        }
        out
    }
}

/// Take the bill apart, per org: `billed - ran = crash tails + late + unexplained`, where
/// the first two are the ledger's rules at work on what the meter was told
/// (`reference`), and `unexplained` is the meter against those rules (held to a bound
/// where beats were acknowledged late: see the module's documentation). `billed` maps each
/// session the meter knows of this run to its org and billed seconds.
pub(super) fn reconcile(
    truth: &BTreeMap<String, Truth>,
    reference: &BTreeMap<String, i64>,
    billed: &BTreeMap<String, (String, i64)>,
    plans: &BTreeMap<String, String>,
    late: &BTreeMap<String, Late>,
    rules: &Rules,
) -> (Vec<OrgLine>, Vec<(String, String)>) {
    let mut mismatched = Vec::new();
    let mut lines: BTreeMap<String, OrgLine> = plans
        .iter()
        .map(|(org, plan)| {
            (
                org.clone(),
                OrgLine {
                    org: org.clone(),
                    plan: plan.clone(),
                    ..OrgLine::default()
                },
            )
        })
        .collect();
    for (session, t) in truth {
        let Some(l) = lines.get_mut(&t.org) else {
            continue;
        };
        let ran: i64 = t.running.iter().map(Interval::len).sum();
        let expected = reference.get(session).copied().unwrap_or(0);
        let got = billed.get(session).map_or(0, |b| b.1);
        l.sessions += 1;
        l.ran += ran;
        l.billed += got;
        let lt = late.get(session);
        let arrived_late = lt.is_some_and(Late::arrived_late);
        let against_rules = if arrived_late {
            // When the meter read each late batch is unknown: no more than what ran, what
            // the clamps can add and a crash's interval.
            let crash = if t.crashed { rules.interval } else { 0 };
            (got - (ran + lt.map_or(0, |l| l.shift(rules)) + crash)).max(0)
        } else {
            got - expected
        };
        // What the rules add to what ran: a crash's tail, late beats' clamps.
        let rules_add = got - ran - against_rules;
        let (unexplained, broke_rule_3) = if t.crashed {
            l.crashed += 1;
            l.crash_tails += rules_add;
            // Rule 3 against the truth: at most one interval past the VM's last beat,
            // which is before it died (a late last beat is clamped later: not checked).
            (against_rules, !arrived_late && got - ran > rules.interval)
        } else if lt.is_some() {
            l.late += rules_add;
            (against_rules, false)
        } else {
            // Neither crashed nor late: the rules bill exactly what ran; anything else
            // is unexplained (a beat the meter acknowledged and did not count).
            (got - ran, false)
        };
        l.unexplained += unexplained;
        if unexplained != 0 || broke_rule_3 {
            l.mismatched += 1;
            mismatched.push((t.org.clone(), session.clone()));
            // The table counts by org; the session is what one looks into.
            tracing::warn!(%session, org = %t.org, crashed = t.crashed, late = lt.is_some(),
                ran, expected, billed = got, unexplained, broke_rule_3,
                "a session billed against the ledger's rules");
        }
    }
    // A session the meter bills that the fleet never ran (a denied admission, a beat
    // filed under the wrong session).
    for (session, (org, got)) in billed {
        if *got != 0 && !truth.contains_key(session) {
            if let Some(l) = lines.get_mut(org) {
                l.billed += got;
                l.unexplained += got;
                l.mismatched += 1;
                mismatched.push((org.clone(), session.clone()));
                tracing::warn!(%session, %org, billed = got, "a session billed that the fleet never ran");
            }
        }
    }
    (lines.into_values().collect(), mismatched)
}

/// Sessions explained in full in the log, at most: enough to see a pattern.
const EXPLAINED: usize = 20;

/// Log, for the first mismatched sessions, what one needs to tell the meter's reading
/// from the reference's: the meter's timeline, the observations the reference applied,
/// and the late beats' times.
async fn explain(fleet: &Fleet, sessions: &[(String, String)], late: &BTreeMap<String, Late>) {
    for (org, session) in sessions.iter().take(EXPLAINED) {
        let timeline = match fleet
            .call("GET", &format!("/v1/orgs/{org}/sessions/{session}"), None)
            .await
        {
            Ok(a) => a.body["timeline"].to_string(),
            Err(e) => e,
        };
        let applied = fleet
            .reference
            .lock()
            .unwrap()
            .sessions
            .get(session)
            .map(|s| format!("{:?}", s.applied))
            .unwrap_or_default();
        let late_beats = late
            .get(session)
            .map(|l| format!("{:?}, overslept {}", l.seen, l.overslept))
            .unwrap_or_default();
        let truth = fleet
            .truth
            .lock()
            .unwrap()
            .get(session)
            .map(|t| format!("{:?}", t.running))
            .unwrap_or_default();
        tracing::warn!(%session, %truth, %applied, %late_beats, %timeline,
            "a mismatched session: what truly ran, the observations the reference applied (at, state), its late beats, and the meter's timeline");
    }
}

pub(super) fn percentile(v: &mut [u32], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable();
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    f64::from(v[i]) / 1000.0
}

/// The meter's billed seconds for every session of `org` this run made, with the org.
pub(super) async fn billed_sessions(
    fleet: &Fleet,
    org: &str,
) -> Result<BTreeMap<String, (String, i64)>, String> {
    let mut out = BTreeMap::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/orgs/{org}/sessions?limit=1000");
        if let Some(c) = &cursor {
            path += &format!("&cursor={c}");
        }
        let page = fleet.must("GET", &path, None).await?;
        for s in page["sessions"].as_array().into_iter().flatten() {
            let id = s["session_id"].as_str().unwrap_or_default();
            if id.starts_with(&fleet.opts.run) {
                let secs = s["billed_seconds"].as_i64().unwrap_or(0);
                out.insert(id.to_owned(), (org.to_owned(), secs));
            }
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return Ok(out),
        }
    }
}

pub(super) async fn report(fleet: &Fleet, driven: Duration) -> Result<Outcome, String> {
    let now = now_secs();
    let rules = fleet.opts.rules;
    let expected: BTreeMap<String, i64> = fleet
        .reference
        .lock()
        .unwrap()
        .sessions
        .iter()
        .map(|(id, s)| {
            let open = s.ledger.provisional(now, &rules).map_or(0, |p| p.len());
            (id.clone(), s.ledger.billed_seconds + open)
        })
        .collect();
    let mut billed = BTreeMap::new();
    for org in fleet.org_plans.keys() {
        billed.extend(billed_sessions(fleet, org).await?);
    }
    let truth = fleet.truth.lock().unwrap().clone();
    let late = fleet.late.lock().unwrap().clone();
    let (lines, mismatched) =
        reconcile(&truth, &expected, &billed, &fleet.org_plans, &late, &rules);
    explain(fleet, &mismatched, &late).await;
    let c = &fleet.counters;
    let acked = c.beats_acked.load(Ordering::Relaxed);
    let denials = fleet.denials.lock().unwrap().clone();
    let mut beat_lat = fleet.beat_latency.lock().unwrap().clone();
    let mut gate_lat = fleet.gate_latency.lock().unwrap().clone();
    let summary = format!(
        "{} s driven · {} orgs · {} session slots · {} hosts · interval {} s, lease {} s\n\
         sessions {} · allowed {} · denied {} {:?} · crashed {} · ended {}\n\
         heartbeats sent {} · acknowledged {} in {} batches ({:.0}/s) · retried requests {}\n\
         latency p50/p99: heartbeat batch {:.1}/{:.1} ms · admission {:.1}/{:.1} ms\n\
         late: {} sessions had beats acknowledged more than a lease after they were sent, \
         {} had a beat sent more than a lease after the one before (the fleet behind its schedule)",
        driven.as_secs(),
        fleet.org_plans.len(),
        fleet.opts.sessions,
        fleet.opts.hosts,
        rules.interval,
        rules.lease,
        c.sessions.load(Ordering::Relaxed),
        c.allowed.load(Ordering::Relaxed),
        denials.values().sum::<u64>(),
        denials,
        c.crashes.load(Ordering::Relaxed),
        c.ends.load(Ordering::Relaxed),
        c.beats_sent.load(Ordering::Relaxed),
        acked,
        c.batches.load(Ordering::Relaxed),
        acked as f64 / driven.as_secs_f64(),
        c.retries.load(Ordering::Relaxed),
        percentile(&mut beat_lat, 0.5),
        percentile(&mut beat_lat, 0.99),
        percentile(&mut gate_lat, 0.5),
        percentile(&mut gate_lat, 0.99),
        late.values().filter(|l| l.arrived_late()).count(),
        late.values().filter(|l| l.overslept > 0).count(),
    );
    Ok(Outcome { lines, summary })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rush_meter_core::time::Secs;

    fn truth(org: &str, runs: &[(Secs, Secs)], crashed: bool) -> Truth {
        Truth {
            org: org.into(),
            running: runs
                .iter()
                .filter_map(|&(a, b)| Interval::new(a, b))
                .collect(),
            crashed,
        }
    }

    fn billed(of: &[(&str, &str, i64)]) -> BTreeMap<String, (String, i64)> {
        of.iter()
            .map(|&(s, org, secs)| (s.to_owned(), (org.to_owned(), secs)))
            .collect()
    }

    const RULES: Rules = Rules {
        interval: 15,
        lease: 45,
    };

    fn plans() -> BTreeMap<String, String> {
        BTreeMap::from([("a".into(), "pro".into()), ("b".into(), "free".into())])
    }

    fn truths() -> BTreeMap<String, Truth> {
        BTreeMap::from([
            ("a1".to_owned(), truth("a", &[(0, 100), (200, 260)], false)),
            ("a2".to_owned(), truth("a", &[(0, 37)], true)),
            ("b1".to_owned(), truth("b", &[(0, 50)], false)),
        ])
    }

    /// The rules' bills, by session.
    fn bills(of: &[(&str, i64)]) -> BTreeMap<String, i64> {
        of.iter().map(|&(s, b)| (s.to_owned(), b)).collect()
    }

    /// Reconciled with no late beats, on the orgs of `plans()`.
    fn on_time(
        truths: &BTreeMap<String, Truth>,
        reference: &[(&str, i64)],
        got: &BTreeMap<String, (String, i64)>,
    ) -> Vec<OrgLine> {
        let reference = bills(reference);
        reconcile(truths, &reference, got, &plans(), &BTreeMap::new(), &RULES).0
    }

    #[test]
    fn the_difference_is_taken_apart() {
        // a2 crashed 7 s after its last beat at 30: the rules bill to 45.
        let reference = [("a1", 160), ("a2", 45), ("b1", 50)];
        let ok = billed(&[("a1", "a", 160), ("a2", "a", 45), ("b1", "b", 50)]);
        let lines = on_time(&truths(), &reference, &ok);
        assert_eq!(lines[0].ran, 197);
        assert_eq!(lines[0].billed, 205);
        assert_eq!(lines[0].crash_tails, 8);
        assert_eq!((lines[0].unexplained, lines[0].mismatched), (0, 0));
        assert_eq!((lines[1].unexplained, lines[1].mismatched), (0, 0));
        // The meter billing a second more than the rules allow is unexplained.
        let off = billed(&[("a1", "a", 160), ("a2", "a", 45), ("b1", "b", 51)]);
        let lines = on_time(&truths(), &reference, &off);
        assert_eq!((lines[1].unexplained, lines[1].mismatched), (1, 1));
    }

    #[test]
    fn errors_of_opposite_sign_do_not_cancel() {
        let truths = BTreeMap::from([
            ("a1".to_owned(), truth("a", &[(0, 100)], false)),
            ("a3".to_owned(), truth("a", &[(0, 100)], false)),
        ]);
        let reference = [("a1", 100), ("a3", 100)];
        let got = billed(&[("a1", "a", 105), ("a3", "a", 95)]);
        let lines = on_time(&truths, &reference, &got);
        assert_eq!((lines[0].unexplained, lines[0].mismatched), (0, 2));
    }

    #[test]
    fn a_crash_tail_past_one_interval_is_mismatched_even_if_the_reference_agrees() {
        // Ran to 37, last beat at 30: the meter may bill to 45 at most; 60 is two intervals.
        let reference = [("a1", 160), ("a2", 60), ("b1", 50)];
        let got = billed(&[("a1", "a", 160), ("a2", "a", 60), ("b1", "b", 50)]);
        let lines = on_time(&truths(), &reference, &got);
        assert_eq!((lines[0].unexplained, lines[0].mismatched), (0, 1));
    }

    #[test]
    fn a_session_the_fleet_never_ran_is_mismatched() {
        let reference = [("a1", 160), ("a2", 45), ("b1", 50)];
        let got = billed(&[
            ("a1", "a", 160),
            ("a2", "a", 45),
            ("b1", "b", 50),
            ("b9", "b", 30),
            ("b8", "b", 0),
        ]);
        let lines = on_time(&truths(), &reference, &got);
        assert_eq!(
            (lines[1].billed, lines[1].unexplained, lines[1].mismatched),
            (80, 30, 1)
        );
    }

    fn late(session: &str, l: Late) -> BTreeMap<String, Late> {
        BTreeMap::from([(session.to_owned(), l)])
    }

    /// Beats acknowledged late, each by `shifts` seconds past its lease.
    fn acked_late(shifts: &[i64]) -> Late {
        let seen = shifts
            .iter()
            .zip(1..)
            .map(|(&shift, seq)| crate::sim::live::LateBeat {
                seq,
                sent: 0,
                first_try: 0,
                acked: RULES.lease + shift,
            })
            .collect();
        Late {
            seen,
            ..Late::default()
        }
    }

    #[test]
    fn a_crash_whose_last_beat_came_late_is_held_to_its_bound() {
        // a2 ran to 37; its last beat came 8 s late, which a clamp can add, and a crash
        // may be billed an interval (15) past its last beat: at most 60.
        let late = late("a2", acked_late(&[8]));
        let reference = bills(&[("a1", 160), ("a2", 62), ("b1", 50)]);
        for bill in [20, 45, 60] {
            let got = billed(&[("a1", "a", 160), ("a2", "a", bill), ("b1", "b", 50)]);
            let (lines, _) = reconcile(&truths(), &reference, &got, &plans(), &late, &RULES);
            assert_eq!(
                (
                    lines[0].crash_tails,
                    lines[0].unexplained,
                    lines[0].mismatched
                ),
                (bill - 37, 0, 0)
            );
        }
        // Past it, the meter's, counted once for the session.
        let got = billed(&[("a1", "a", 160), ("a2", "a", 80), ("b1", "b", 50)]);
        let (lines, mismatched) = reconcile(&truths(), &reference, &got, &plans(), &late, &RULES);
        assert_eq!(
            (
                lines[0].crash_tails,
                lines[0].unexplained,
                lines[0].mismatched
            ),
            (23, 20, 1)
        );
        assert_eq!(mismatched, [("a".to_owned(), "a2".to_owned())]);
    }

    #[test]
    fn a_session_with_late_beats_may_be_billed_up_to_what_their_clamps_add_and_no_more() {
        // b1 ran 50 s; its late beats can have been counted up to 4 s later in all.
        let late = late("b1", acked_late(&[2, 1, 1]));
        let reference = bills(&[("a1", 160), ("a2", 45), ("b1", 44)]);
        // Less than ran is the silences the clamps left; up to 54 is the clamps'.
        for bill in [30, 50, 54] {
            let got = billed(&[("a1", "a", 160), ("a2", "a", 45), ("b1", "b", bill)]);
            let (lines, _) = reconcile(&truths(), &reference, &got, &plans(), &late, &RULES);
            assert_eq!(
                (lines[1].late, lines[1].unexplained, lines[1].mismatched),
                (bill - 50, 0, 0)
            );
        }
        let got = billed(&[("a1", "a", 160), ("a2", "a", 45), ("b1", "b", 55)]);
        let (lines, _) = reconcile(&truths(), &reference, &got, &plans(), &late, &RULES);
        assert_eq!(
            (lines[1].late, lines[1].unexplained, lines[1].mismatched),
            (4, 1, 1)
        );
    }

    #[test]
    fn a_session_the_fleet_beat_late_for_is_held_to_the_rules_not_to_what_ran() {
        // b1 ran 50 s, but the fleet sent a beat more than a lease after the one before:
        // the meter saw a silence and the rules bill 44. Counted late, not unexplained...
        let reference = bills(&[("a1", 160), ("a2", 45), ("b1", 44)]);
        let overslept = late(
            "b1",
            Late {
                overslept: 1,
                ..Late::default()
            },
        );
        for (bill, unexplained) in [(44, 0), (43, -1), (50, 6)] {
            let got = billed(&[("a1", "a", 160), ("a2", "a", 45), ("b1", "b", bill)]);
            let (lines, _) = reconcile(&truths(), &reference, &got, &plans(), &overslept, &RULES);
            assert_eq!((lines[1].late, lines[1].unexplained), (-6, unexplained));
        }
        // ...while a session beaten on time must be billed exactly what ran.
        let got = billed(&[("a1", "a", 160), ("a2", "a", 45), ("b1", "b", 44)]);
        let none = BTreeMap::new();
        let (lines, _) = reconcile(&truths(), &reference, &got, &plans(), &none, &RULES);
        assert_eq!((lines[1].unexplained, lines[1].mismatched), (-6, 1));
    }
}
