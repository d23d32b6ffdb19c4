//! A seeded simulation of a fleet: what each microVM truly did, what its supervisor sent,
//! and what a lossy network delivered to the meter. Deterministic for a seed, so a failing
//! seed replays exactly.
//!
//! The fleet: sessions that run turns, park between them, sometimes crash silently, lose
//! their supervisor's network for a while (the VM runs, nothing is sent), and end.
//! Supervisors send a heartbeat at each transition and every interval while running
//! (every `parked_period` while parked), batched per host and flushed every `flush` seconds.
//! The network drops, delays past later beats (reorders) and duplicates heartbeats.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use rush_meter_core::ledger::{EndStatus, Rules, VmState};
use rush_meter_core::time::{Interval, Secs};

#[derive(Clone, Debug)]
pub struct Params {
    pub orgs: usize,
    pub sessions: usize,
    pub hosts: usize,
    pub start: Secs,
    /// Sessions start within the first 80% of this span; everything ends by its end.
    pub duration: Secs,
    pub rules: Rules,
    pub parked_period: Secs,
    pub flush: Secs,
    pub p_drop: f64,
    pub p_reorder: f64,
    pub p_duplicate: f64,
    /// Chance that a turn ends in a silent crash.
    pub p_crash: f64,
    /// Chance that a turn contains a supervisor blackout (VM runs, nothing is sent).
    pub p_blackout: f64,
}

impl Params {
    /// The fleet of the ledger's acceptance test: about 10⁵ heartbeats over three days
    /// that cross an ISO week boundary (Mon 30 Nov 2026) and a month boundary (1 Dec).
    pub fn acceptance() -> Params {
        Params {
            orgs: 12,
            sessions: 360,
            hosts: 24,
            start: 1_795_910_400, // Sun 2026-11-29 00:00:00 UTC
            duration: 3 * 86_400,
            rules: Rules {
                interval: 15,
                lease: 45,
            },
            parked_period: 300,
            flush: 5,
            p_drop: 0.05,
            p_reorder: 0.10,
            p_duplicate: 0.20,
            p_crash: 0.05,
            p_blackout: 0.03,
        }
    }
}

/// One heartbeat as sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Beat {
    pub org: String,
    pub session: String,
    pub vm: String,
    pub seq: i64,
    pub state: VmState,
    pub sent_at: Secs,
}

/// Something arriving at the meter at `at`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// One request from one host's supervisor.
    Batch { at: Secs, beats: Vec<Beat> },
    /// The orchestrator ends a session.
    End {
        at: Secs,
        org: String,
        session: String,
        status: EndStatus,
    },
}

impl Delivery {
    pub fn at(&self) -> Secs {
        match self {
            Delivery::Batch { at, .. } | Delivery::End { at, .. } => *at,
        }
    }
}

/// What one session truly did.
#[derive(Clone, Debug, Default)]
pub struct Truth {
    pub org: String,
    pub session: String,
    /// When its VM was truly running.
    pub running: Vec<Interval>,
    /// Times it truly started or resumed running.
    pub starts: Vec<Secs>,
    /// Times it truly stopped running: park or crash (ends come through the API on time).
    pub stops: Vec<Secs>,
}

impl Truth {
    pub fn running_seconds(&self) -> i64 {
        self.running.iter().map(Interval::len).sum()
    }
}

pub struct Fleet {
    pub params: Params,
    pub truths: Vec<Truth>,
    /// In delivery order.
    pub deliveries: Vec<Delivery>,
    pub beats_sent: usize,
    pub beats_delivered: usize,
}

pub fn org_name(i: usize) -> String {
    format!("org_{i:03}")
}

/// Generate a fleet for `seed`.
pub fn generate(seed: u64, p: &Params) -> Fleet {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut truths = Vec::with_capacity(p.sessions);
    let mut arrivals: Vec<(Secs, usize, Beat)> = Vec::new();
    let mut ends: Vec<Delivery> = Vec::new();
    let mut beats_sent = 0;
    for s in 0..p.sessions {
        let org = org_name(rng.gen_range(0..p.orgs));
        let session = format!("ses_{seed}_{s:05}");
        let vm = format!("vm_{s:05}");
        let host = rng.gen_range(0..p.hosts);
        let (truth, sent, ended) = live(&mut rng, p, &org, &session);
        for (seq, (sent_at, state)) in (1..).zip(sent) {
            beats_sent += 1;
            let beat = Beat {
                org: org.clone(),
                session: session.clone(),
                vm: vm.clone(),
                seq,
                state,
                sent_at,
            };
            arrivals.extend(
                send(&mut rng, p, beat)
                    .into_iter()
                    .map(|(at, b)| (at, host, b)),
            );
        }
        if let Some((at, status)) = ended {
            ends.push(Delivery::End {
                at,
                org: org.clone(),
                session: session.clone(),
                status,
            });
        }
        truths.push(truth);
    }
    let beats_delivered = arrivals.len();
    let mut deliveries = batches(arrivals, p.flush);
    deliveries.extend(ends);
    // Stable: batches before ends at the same second, as sorted above.
    deliveries.sort_by_key(|d| (d.at(), matches!(d, Delivery::End { .. })));
    Fleet {
        params: p.clone(),
        truths,
        deliveries,
        beats_sent,
        beats_delivered,
    }
}

/// One session's life: what truly ran, the heartbeats its supervisor sent (when, and in
/// which state), and how it ended, if it did before the simulation's end.
fn live(rng: &mut StdRng, p: &Params, org: &str, session: &str) -> Life {
    let end_of_sim = p.start + p.duration;
    let interval = p.rules.interval;
    let mut truth = Truth {
        org: org.to_owned(),
        session: session.to_owned(),
        ..Truth::default()
    };
    let mut sent: Vec<(Secs, VmState)> = Vec::new();
    let mut t = p.start + rng.gen_range(0..p.duration * 8 / 10);
    let ended = loop {
        // A turn: running from t to turn_end.
        let turn = rng.gen_range(20..2400);
        let turn_end = (t + turn).min(end_of_sim - 1);
        truth.starts.push(t);
        truth.running.push(Interval {
            start: t,
            end: turn_end.max(t + 1),
        });
        let turn_end = turn_end.max(t + 1);
        let blackout = rng.gen_bool(p.p_blackout).then(|| {
            let b0 = t + rng.gen_range(0..turn.max(1));
            (b0, b0 + rng.gen_range(60..600))
        });
        let mut b = t;
        while b < turn_end {
            if !blackout.is_some_and(|(s, e)| b >= s && b < e) {
                sent.push((b, VmState::Running));
            }
            b += interval;
        }
        let roll: f64 = rng.gen();
        if roll < p.p_crash {
            truth.stops.push(turn_end);
            break None;
        }
        if roll < p.p_crash + 0.2 || turn_end >= end_of_sim - 1 {
            break Some((turn_end, EndStatus::Completed));
        }
        // Parked until the next turn.
        truth.stops.push(turn_end);
        let park = rng.gen_range(30..6 * 3600);
        let resume = turn_end + park;
        let mut b = turn_end;
        while b < resume.min(end_of_sim) {
            sent.push((b, VmState::Parked));
            b += p.parked_period;
        }
        if resume >= end_of_sim - 60 {
            break Some((end_of_sim - 30, EndStatus::Cancelled));
        }
        t = resume;
    };
    (truth, sent, ended)
}

/// A session's truth, the heartbeats sent (when, in which state), and its end if any.
type Life = (Truth, Vec<(Secs, VmState)>, Option<(Secs, EndStatus)>);

/// How one heartbeat reaches the host's buffer: lost, late, out of order, or twice; the
/// times it arrives.
fn send(rng: &mut StdRng, p: &Params, beat: Beat) -> Vec<(Secs, Beat)> {
    if rng.gen_bool(p.p_drop) {
        return Vec::new();
    }
    let sent_at = beat.sent_at;
    let mut delay = rng.gen_range(0..=2);
    if rng.gen_bool(p.p_reorder) {
        delay += rng.gen_range(5..=40);
    }
    let mut out = Vec::with_capacity(2);
    if rng.gen_bool(p.p_duplicate) {
        let again = sent_at + delay + rng.gen_range(1..=120);
        out.push((again, beat.clone()));
    }
    out.push((sent_at + delay, beat));
    out
}

/// Each host flushes what has arrived in its buffer every `flush` seconds, in batches of
/// at most 1,000.
fn batches(mut arrivals: Vec<(Secs, usize, Beat)>, flush: Secs) -> Vec<Delivery> {
    let flush_at = |at: Secs| (at + flush - 1) / flush * flush;
    arrivals.sort_by_key(|(at, host, beat)| (flush_at(*at), *host, beat.session.clone(), beat.seq));
    let mut deliveries: Vec<Delivery> = Vec::new();
    let mut current: Option<(Secs, usize)> = None;
    for (at, host, beat) in arrivals {
        let flush_at = flush_at(at);
        match deliveries.last_mut() {
            Some(Delivery::Batch { beats, .. })
                if current == Some((flush_at, host)) && beats.len() < 1000 =>
            {
                beats.push(beat)
            }
            _ => {
                current = Some((flush_at, host));
                deliveries.push(Delivery::Batch {
                    at: flush_at,
                    beats: vec![beat],
                });
            }
        }
    }
    deliveries
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Params {
        Params {
            sessions: 60,
            ..Params::acceptance()
        }
    }

    #[test]
    fn same_seed_same_fleet() {
        let (a, b) = (generate(7, &small()), generate(7, &small()));
        assert_eq!(a.deliveries, b.deliveries);
        assert_ne!(generate(8, &small()).deliveries, a.deliveries);
    }

    #[test]
    fn the_acceptance_fleet_has_at_least_1e5_heartbeats() {
        let f = generate(1, &Params::acceptance());
        assert!(f.beats_sent >= 100_000, "{} sent", f.beats_sent);
    }
}
