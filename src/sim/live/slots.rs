//! Session slots: each picks an org, asks the gate, runs turns, parks between them,
//! resumes, crashes silently or ends, and records what truly ran.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rush_meter_core::ledger::{EndStatus, VmState};
use rush_meter_core::time::{Interval, Secs};
use serde_json::json;
use tokio::sync::watch;

use super::{now_secs, Fleet, Truth};
use crate::sim::Beat;

/// How one slot's session goes on after a turn.
pub(super) enum AfterTurn {
    Crash,
    End,
    Park,
}

/// One session slot: sessions one after another until the run's end.
pub(super) async fn slot(
    fleet: Arc<Fleet>,
    index: usize,
    mut stop: watch::Receiver<bool>,
) -> Result<(), String> {
    let o = &fleet.opts;
    let mut rng = StdRng::seed_from_u64(o.seed ^ (index as u64).wrapping_mul(0x9E37_79B9));
    let orgs: Vec<&String> = fleet.org_plans.keys().collect();
    let interval = Duration::from_secs(o.rules.interval as u64);
    let mut n = 0;
    while !*stop.borrow() {
        n += 1;
        let org = orgs[rng.gen_range(0..orgs.len())].clone();
        let session = format!("{}-s{index}-{n}", o.run);
        let agent = ["claude", "codex", "opencode"][rng.gen_range(0..3)];
        let host = rng.gen_range(0..o.hosts);
        if fleet.admit(&org, &session, agent).await?.is_some() {
            pause(&mut stop, interval * rng.gen_range(1..=3)).await;
            continue;
        }
        fleet.counters.sessions.fetch_add(1, Ordering::Relaxed);
        fleet.truth.lock().unwrap().insert(
            session.clone(),
            Truth {
                org: org.clone(),
                ..Truth::default()
            },
        );
        let mut s = Live {
            fleet: &fleet,
            org,
            session,
            host,
            seq: 0,
            last_sent: 0,
            last_state: None,
        };
        s.run(&mut rng, &mut stop, agent).await?;
    }
    Ok(())
}

/// Sleep, cut short by the run's end; true if the run ended.
pub(super) async fn pause(stop: &mut watch::Receiver<bool>, d: Duration) -> bool {
    let ended = tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = stop.wait_for(|s| *s) => true,
    };
    ended || *stop.borrow()
}

pub(super) struct Live<'a> {
    fleet: &'a Fleet,
    org: String,
    session: String,
    host: usize,
    seq: i64,
    /// `sent_at` and state of the last heartbeat handed to the host.
    last_sent: Secs,
    last_state: Option<VmState>,
}

impl Live<'_> {
    async fn send(&mut self, state: VmState, at: Secs, wait: bool) {
        // Behind schedule (the machine is busy): the meter saw a running session silent
        // past its lease, and its rules stop billing there, though the VM truly ran.
        if self.last_state == Some(VmState::Running)
            && at - self.last_sent > self.fleet.opts.rules.lease
        {
            let mut late = self.fleet.late.lock().unwrap();
            late.entry(self.session.clone()).or_default().overslept += 1;
        }
        self.seq += 1;
        self.last_sent = at;
        self.last_state = Some(state);
        let beat = Beat {
            org: self.org.clone(),
            session: self.session.clone(),
            vm: format!("vm-{}", self.session),
            seq: self.seq,
            state,
            sent_at: at,
        };
        self.fleet.beat(self.host, beat, wait).await;
    }

    fn ran(&self, start: Secs, end: Secs, crashed: bool) {
        let mut truth = self.fleet.truth.lock().unwrap();
        let t = truth.get_mut(&self.session).expect("registered");
        t.running.extend(Interval::new(start, end));
        t.crashed |= crashed;
    }

    /// Turns, parks and resumes until the session crashes, ends, or the run ends.
    async fn run(
        &mut self,
        rng: &mut StdRng,
        stop: &mut watch::Receiver<bool>,
        agent: &str,
    ) -> Result<(), String> {
        let fleet = self.fleet;
        let (c, o) = (&fleet.counters, &fleet.opts);
        let interval = Duration::from_secs(o.rules.interval as u64);
        loop {
            // A turn: running, a heartbeat every interval.
            c.live_running.fetch_add(1, Ordering::Relaxed);
            let start = now_secs();
            self.send(VmState::Running, start, false).await;
            let beats = rng.gen_range(2..=12);
            let mut ended_by_stop = false;
            for _ in 0..beats {
                if pause(stop, interval).await {
                    ended_by_stop = true;
                    break;
                }
                self.send(VmState::Running, now_secs(), false).await;
            }
            c.live_running.fetch_sub(1, Ordering::Relaxed);
            let roll: f64 = rng.gen();
            let next = if ended_by_stop {
                AfterTurn::End
            } else if roll < o.crash {
                AfterTurn::Crash
            } else if roll < o.crash + o.end {
                AfterTurn::End
            } else {
                AfterTurn::Park
            };
            if let AfterTurn::Crash = next {
                // The VM dies before its next heartbeat was due; nothing more is sent.
                let died = self.last_sent + rng.gen_range(0..o.rules.interval.max(1));
                self.ran(start, died, true);
                c.crashes.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            // Parked: acknowledged before anything else, so the meter's stop is this beat.
            let parked_at = now_secs();
            self.send(VmState::Parked, parked_at, true).await;
            self.ran(start, parked_at, false);
            if let AfterTurn::End = next {
                return self.end().await;
            }
            c.live_parked.fetch_add(1, Ordering::Relaxed);
            let mut left = rng.gen_range(1..=6);
            let mut stopped = false;
            while left > 0 && !stopped {
                let step = left.min(3);
                stopped = pause(stop, interval * step).await;
                left -= step;
                if !stopped && left > 0 {
                    self.send(VmState::Parked, now_secs(), false).await;
                }
            }
            c.live_parked.fetch_sub(1, Ordering::Relaxed);
            if stopped {
                return self.end().await;
            }
            // Resume through the gate; a refusal ends the session.
            if fleet
                .admit(&self.org, &self.session, agent)
                .await?
                .is_some()
            {
                return self.end().await;
            }
        }
    }

    async fn end(&self) -> Result<(), String> {
        self.fleet
            .must(
                "POST",
                &format!("/v1/orgs/{}/sessions/{}/end", self.org, self.session),
                Some(&json!({"status": "completed"})),
            )
            .await?;
        self.fleet.reference.lock().unwrap().end(
            &self.session,
            now_secs(),
            EndStatus::Completed,
            &self.fleet.opts.rules,
        );
        self.fleet.counters.ends.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
