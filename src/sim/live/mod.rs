//! `rush-meter simulate`: a synthetic fleet driven against a running server, in real time.
//!
//! Orgs on a mix of plans each get a key; session slots pick an org, ask the gate, run
//! turns (a running heartbeat every interval), park between them (a parked heartbeat every
//! few intervals), resume through the gate, crash silently, and end. Heartbeats go through
//! host supervisors that batch what they hold and flush it every `flush`, retrying a batch
//! on 429 and 503 as a real supervisor would. At the end every session that did not crash
//! parks and ends, and the command prints, per org, the time the fleet truly ran against
//! what the meter billed, with the difference taken apart:
//!
//! - a crash tail: after a silent crash the meter bills up to one interval past the last
//!   heartbeat, since a VM that went quiet may still be running;
//! - late heartbeats: a beat acknowledged more than a lease after it was sent is counted
//!   at the meter's clock less a lease, read at some moment between its batch's first try
//!   and its answer that the fleet cannot see; a beat the fleet sent more than a lease
//!   after the running beat before it (the simulator fell behind its schedule on a busy
//!   machine) leaves a silence the rules do not bill, though the VM ran;
//! - unexplained: what the meter billed against the ledger's rules applied to exactly the
//!   heartbeats it acknowledged (`crate::sim::Reference`), and against the simulator's own
//!   truth where the rules bill exactly what ran. A session with beats acknowledged late
//!   is held to a bound instead: no more than what ran, plus what its late beats' clamps
//!   can add, plus a crash's interval. Its clamps depend on when the meter read each
//!   batch, so that less than ran is the silences the rules leave, and an exact check is
//!   the seeded simulation's (`tests/simulation.rs`), where delivery times are known.
//!
//! A session is mismatched when its unexplained part is not 0, when a crashed one is billed
//! more than one interval past what ran (rule 3, checked against the truth, not the
//! reference), or when the meter bills a session the fleet never ran. The command fails
//! on any.
//!
//! The token needs the admin (to create orgs and keys), admission, ingest and console
//! scopes; the bootstrap admin token has them all.

mod client;
mod hosts;
mod progress;
mod report;
mod slots;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rush_meter_core::ledger::Rules;
use rush_meter_core::time::{Interval, Secs};
use serde_json::json;
use tokio::sync::{mpsc, watch};

use super::Reference;
use hosts::{host, Outgoing};
use progress::progress_bar;
use report::report;
pub use report::{OrgLine, Outcome};
use slots::slot;

#[derive(Clone, Debug)]
pub struct Options {
    pub url: String,
    pub token: String,
    pub orgs: usize,
    /// Session slots: at most this many sessions are live at once.
    pub sessions: usize,
    pub hosts: usize,
    pub duration: Duration,
    /// The server's heartbeat interval and lease: the fleet beats at this interval, and the
    /// ledger check applies both.
    pub rules: Rules,
    pub flush: Duration,
    /// Chance that a turn ends in a silent crash.
    pub crash: f64,
    /// Chance that a session ends after a turn (else it parks and resumes).
    pub end: f64,
    /// The plans the orgs are put on, round robin.
    pub plans: Vec<String>,
    pub seed: u64,
    /// Prefix of every org and session id this run makes.
    pub run: String,
    pub progress: bool,
}

/// What one session truly did, on the simulator's clock.
#[derive(Clone, Debug, Default)]
struct Truth {
    org: String,
    running: Vec<Interval>,
    crashed: bool,
}

#[derive(Default)]
struct Counters {
    live_running: AtomicU64,
    live_parked: AtomicU64,
    sessions: AtomicU64,
    beats_sent: AtomicU64,
    beats_acked: AtomicU64,
    batches: AtomicU64,
    retries: AtomicU64,
    rejected: AtomicU64,
    allowed: AtomicU64,
    crashes: AtomicU64,
    ends: AtomicU64,
}

/// A session whose beats the ledger's rules do not take as sent: acknowledged more than a
/// lease after they were sent (the meter clamped them to its clock, somewhere between
/// their batch's first try and its answer), or sent more than a lease after the running
/// beat before them (the simulator fell behind its own schedule, so the meter saw a
/// silence that truly ran).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Late {
    /// Its beats acknowledged more than a lease after they were sent.
    seen: Vec<LateBeat>,
    /// Its beats sent more than a lease after the running one before.
    overslept: u64,
}

impl Late {
    fn arrived_late(&self) -> bool {
        !self.seen.is_empty()
    }

    /// The most the meter's clamps can have moved the late beats later: for each, its
    /// answer less the lease less when it was sent. What they can add to a bill (a parked
    /// beat counted later extends the running before it).
    fn shift(&self, rules: &Rules) -> i64 {
        self.seen
            .iter()
            .map(|b| b.acked - rules.lease - b.sent)
            .sum()
    }
}

/// A heartbeat acknowledged more than a lease after it was sent: its times, in seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LateBeat {
    seq: i64,
    sent: Secs,
    first_try: Secs,
    acked: Secs,
}

struct Fleet {
    opts: Options,
    http: reqwest::Client,
    hosts: Vec<mpsc::UnboundedSender<Outgoing>>,
    counters: Counters,
    truth: Mutex<BTreeMap<String, Truth>>,
    reference: Mutex<Reference>,
    denials: Mutex<BTreeMap<String, u64>>,
    /// Sessions whose beats came late (`Late`).
    late: Mutex<BTreeMap<String, Late>>,
    beat_latency: Mutex<Vec<u32>>,
    gate_latency: Mutex<Vec<u32>>,
    org_plans: BTreeMap<String, String>,
}

/// The simulator's clock: the system's, as the server's is.
fn now_secs() -> Secs {
    crate::clock::Clock::System.now()
}

async fn setup(fleet: &Fleet) -> Result<(), String> {
    for (org, plan) in &fleet.org_plans {
        fleet
            .must(
                "PUT",
                &format!("/v1/orgs/{org}"),
                Some(&json!({"name": org, "plan": plan})),
            )
            .await?;
        fleet
            .must("PUT", &format!("/v1/orgs/{org}/keys/k1"), Some(&json!({})))
            .await?;
    }
    Ok(())
}

/// Drive the fleet for `opts.duration`, settle, and reconcile.
pub async fn run(opts: Options) -> Result<Outcome, String> {
    if opts.orgs == 0 || opts.sessions == 0 || opts.hosts == 0 || opts.plans.is_empty() {
        return Err("--orgs, --sessions, --hosts and --plans must each be at least 1".into());
    }
    let org_plans: BTreeMap<String, String> = (0..opts.orgs)
        .map(|i| {
            (
                format!("{}-org{i:03}", opts.run),
                opts.plans[i % opts.plans.len()].clone(),
            )
        })
        .collect();
    let (host_txs, host_rxs): (Vec<_>, Vec<_>) =
        (0..opts.hosts).map(|_| mpsc::unbounded_channel()).unzip();
    let fleet = Arc::new(Fleet {
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| e.to_string())?,
        hosts: host_txs,
        counters: Counters::default(),
        truth: Mutex::default(),
        reference: Mutex::default(),
        denials: Mutex::default(),
        late: Mutex::default(),
        beat_latency: Mutex::default(),
        gate_latency: Mutex::default(),
        org_plans,
        opts,
    });
    // A wrong --url fails now, not after the two minutes a call is retried.
    fleet
        .call("GET", "/healthz", None)
        .await
        .map_err(|e| format!("cannot reach the meter: {e}"))?;
    setup(&fleet).await?;
    let hosts: Vec<_> = host_rxs
        .into_iter()
        .map(|rx| tokio::spawn(host(fleet.clone(), rx)))
        .collect();
    let (stop_tx, stop_rx) = watch::channel(false);
    let started = Instant::now();
    let (bar, ticker) = progress_bar(&fleet);
    let slots: Vec<_> = (0..fleet.opts.sessions)
        .map(|i| tokio::spawn(slot(fleet.clone(), i, stop_rx.clone())))
        .collect();
    tokio::time::sleep(fleet.opts.duration).await;
    let _ = stop_tx.send(true);
    for s in slots {
        s.await.map_err(|e| e.to_string())??;
    }
    let driven = started.elapsed();
    ticker.abort();
    bar.finish_and_clear();
    settle(&fleet, hosts).await?;
    report(&fleet, driven).await
}

/// Wait until the hosts have flushed every beat handed to them, then one interval more:
/// a crashed session's bill grows until one interval past its last heartbeat.
async fn settle(
    fleet: &Fleet,
    hosts: Vec<tokio::task::JoinHandle<Result<(), String>>>,
) -> Result<(), String> {
    let c = &fleet.counters;
    // A host only finishes early when the meter refused a batch outright.
    while c.beats_acked.load(Ordering::Relaxed) + c.rejected.load(Ordering::Relaxed)
        < c.beats_sent.load(Ordering::Relaxed)
        && !hosts.iter().any(|h| h.is_finished())
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for h in hosts {
        if h.is_finished() {
            h.await.map_err(|e| e.to_string())??;
        } else {
            h.abort();
        }
    }
    tokio::time::sleep(Duration::from_secs(fleet.opts.rules.interval as u64 + 1)).await;
    Ok(())
}
