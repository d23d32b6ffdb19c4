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
//! - late or lost heartbeats: a beat acknowledged more than a lease after it was sent is
//!   counted at the meter's clock less a lease;
//! - unexplained: what the meter billed against the ledger's rules applied to exactly the
//!   heartbeats it acknowledged (`crate::sim::Reference`), and against the simulator's own
//!   truth where the rules bill exactly what ran.
//!
//! A session is mismatched when its unexplained part is not 0, when a crashed one is billed
//! more than one interval past what ran (rule 3, checked against the truth, not the
//! reference), or when the meter bills a session the fleet never ran. The command fails
//! on any.
//!
//! The token needs the admin (to create orgs and keys), admission, ingest and console
//! scopes; the bootstrap admin token has them all.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot, watch};

use crate::ledger::{EndStatus, Interval, Rules, Secs, VmState};
use crate::sim::{Beat, Reference};

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

/// A session's beats whose time the meter may have clamped (acknowledged more than a lease
/// after they were sent).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Late {
    beats: u64,
    /// Seconds by which the meter's clamp may differ from the reference's: the meter
    /// clamped on arrival, somewhere between the batch's first try and its answer.
    slack: i64,
}

/// One heartbeat on its way to a host supervisor; `acked` hears when the meter took it.
struct Outgoing {
    beat: Beat,
    acked: Option<oneshot::Sender<()>>,
}

struct Fleet {
    opts: Options,
    http: reqwest::Client,
    hosts: Vec<mpsc::UnboundedSender<Outgoing>>,
    counters: Counters,
    truth: Mutex<BTreeMap<String, Truth>>,
    reference: Mutex<Reference>,
    denials: Mutex<BTreeMap<String, u64>>,
    /// Sessions with beats acknowledged more than a lease after they were sent.
    late: Mutex<BTreeMap<String, Late>>,
    beat_latency: Mutex<Vec<u32>>,
    gate_latency: Mutex<Vec<u32>>,
    org_plans: BTreeMap<String, String>,
}

/// The simulator's clock: the system's, as the server's is.
fn now_secs() -> Secs {
    crate::clock::Clock::System.now()
}

/// How long a request is retried (429, 503, cut off) before the run gives up.
const GIVE_UP: Duration = Duration::from_secs(120);

/// An answer the meter gave, or why there was none.
struct Answer {
    status: u16,
    body: Value,
    retry_after: Option<u64>,
}

impl Fleet {
    async fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Answer, String> {
        let method: reqwest::Method = method.parse().expect("a method");
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.opts.url))
            .bearer_auth(&self.opts.token);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.map_err(|e| format!("{path}: {e}"))?;
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()?.parse().ok());
        let text = resp.text().await.map_err(|e| format!("{path}: {e}"))?;
        Ok(Answer {
            status,
            body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
            retry_after,
        })
    }

    /// A call that must succeed, retried while the meter asks to (429, 503) or does not
    /// answer. Every call made through it is safe to repeat: a repeated admission of the
    /// same session takes no second slot, a repeated end changes nothing.
    async fn must(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
        let started = Instant::now();
        loop {
            let a = match self.call(method, path, body).await {
                Ok(a) => a,
                Err(e) if started.elapsed() > GIVE_UP => {
                    return Err(format!(
                        "{e}; no answer for {} s, giving up",
                        GIVE_UP.as_secs()
                    ))
                }
                Err(_) => {
                    self.counters.retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            match a.status {
                200..=299 => return Ok(a.body),
                s @ (429 | 503) if started.elapsed() > GIVE_UP => {
                    return Err(format!(
                        "{method} {path} answered {s} for {} s; giving up",
                        GIVE_UP.as_secs()
                    ))
                }
                429 | 503 => {
                    self.counters.retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_secs(a.retry_after.unwrap_or(1))).await;
                }
                s => return Err(format!("{method} {path} answered {s}: {}", a.body)),
            }
        }
    }

    async fn admit(&self, org: &str, session: &str, agent: &str) -> Result<Option<String>, String> {
        let started = Instant::now();
        let d = self
            .must(
                "POST",
                "/v1/admissions",
                Some(
                    &json!({"org_id": org, "key_id": "k1", "session_id": session, "agent": agent}),
                ),
            )
            .await?;
        record(&self.gate_latency, started);
        if d["decision"] == "allow" {
            self.counters.allowed.fetch_add(1, Ordering::Relaxed);
            Ok(None)
        } else {
            let reason = d["reason"].as_str().unwrap_or("unknown").to_owned();
            *self
                .denials
                .lock()
                .unwrap()
                .entry(reason.clone())
                .or_default() += 1;
            Ok(Some(reason))
        }
    }

    /// Hand a beat to the session's host; `wait`: until the meter acknowledged it.
    async fn beat(&self, host: usize, beat: Beat, wait: bool) {
        self.counters.beats_sent.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let out = Outgoing {
            beat,
            acked: wait.then_some(tx),
        };
        if self.hosts[host].send(out).is_ok() && wait {
            let _ = rx.await;
        }
    }
}

fn record(latencies: &Mutex<Vec<u32>>, started: Instant) {
    let micros = started.elapsed().as_micros().min(u32::MAX as u128) as u32;
    latencies.lock().unwrap().push(micros);
}

/// A host supervisor: batches what its sessions hand it and flushes every `flush`, one
/// request in flight, retrying a batch the meter could not take yet.
async fn host(fleet: Arc<Fleet>, mut rx: mpsc::UnboundedReceiver<Outgoing>) -> Result<(), String> {
    let mut held: Vec<Outgoing> = Vec::new();
    let mut open = true;
    while open || !held.is_empty() {
        let flush_at = tokio::time::Instant::now() + fleet.opts.flush;
        while open && held.len() < crate::batch::MAX_BATCH {
            tokio::select! {
                got = rx.recv() => match got {
                    Some(o) => held.push(o),
                    None => open = false,
                },
                _ = tokio::time::sleep_until(flush_at) => break,
            }
        }
        if held.is_empty() {
            continue;
        }
        let take = held.len().min(crate::batch::MAX_BATCH);
        let batch: Vec<Outgoing> = held.drain(..take).collect();
        send_batch(&fleet, batch).await?;
    }
    Ok(())
}

async fn send_batch(fleet: &Fleet, batch: Vec<Outgoing>) -> Result<(), String> {
    let body = json!({"heartbeats": batch.iter().map(|o| {
        let b = &o.beat;
        json!({"org_id": b.org, "session_id": b.session, "vm_id": b.vm, "seq": b.seq,
               "state": match b.state { VmState::Running => "running", VmState::Parked => "parked" },
               "sent_at": crate::quota::format_rfc3339(b.sent_at)})
    }).collect::<Vec<_>>()});
    let first_try = Instant::now();
    let first_try_secs = now_secs();
    loop {
        if first_try.elapsed() > GIVE_UP {
            return Err(format!(
                "a heartbeat batch was not taken for {} s; giving up",
                GIVE_UP.as_secs()
            ));
        }
        let started = Instant::now();
        let a = fleet.call("POST", "/v1/heartbeats", Some(&body)).await;
        let a = match a {
            Ok(a) => a,
            // Cut off: the meter may or may not have it; a resend is a no-op if it does.
            Err(_) => {
                fleet.counters.retries.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        match a.status {
            200 => {
                record(&fleet.beat_latency, started);
                let now = now_secs();
                let rules = fleet.opts.rules;
                fleet.counters.batches.fetch_add(1, Ordering::Relaxed);
                fleet
                    .counters
                    .beats_acked
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                let mut reference = fleet.reference.lock().unwrap();
                let mut late = fleet.late.lock().unwrap();
                for o in batch {
                    if now - o.beat.sent_at > rules.lease {
                        let l = late.entry(o.beat.session.clone()).or_default();
                        l.beats += 1;
                        l.slack += rules.clamp_sent_at(o.beat.sent_at, now)
                            - rules.clamp_sent_at(o.beat.sent_at, first_try_secs);
                    }
                    reference.heartbeat(&o.beat, now, &rules);
                    if let Some(tx) = o.acked {
                        let _ = tx.send(());
                    }
                }
                return Ok(());
            }
            429 | 503 => {
                fleet.counters.retries.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(a.retry_after.unwrap_or(1))).await;
            }
            s => {
                fleet
                    .counters
                    .rejected
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                return Err(format!("the meter refused a batch with {s}: {}", a.body));
            }
        }
    }
}

/// How one slot's session goes on after a turn.
enum AfterTurn {
    Crash,
    End,
    Park,
}

/// One session slot: sessions one after another until the run's end.
async fn slot(
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
        };
        s.run(&mut rng, &mut stop, agent).await?;
    }
    Ok(())
}

/// Sleep, cut short by the run's end; true if the run ended.
async fn pause(stop: &mut watch::Receiver<bool>, d: Duration) -> bool {
    let ended = tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = stop.wait_for(|s| *s) => true,
    };
    ended || *stop.borrow()
}

struct Live<'a> {
    fleet: &'a Fleet,
    org: String,
    session: String,
    host: usize,
    seq: i64,
    /// `sent_at` of the last heartbeat handed to the host.
    last_sent: Secs,
}

impl Live<'_> {
    async fn send(&mut self, state: VmState, at: Secs, wait: bool) {
        self.seq += 1;
        self.last_sent = at;
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
                &format!("/v1/sessions/{}/end", self.session),
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
/// (`reference`), and `unexplained` is the meter against those rules. `billed` maps each
/// session the meter knows of this run to its org and billed seconds.
fn reconcile(
    truth: &BTreeMap<String, Truth>,
    reference: &BTreeMap<String, i64>,
    billed: &BTreeMap<String, (String, i64)>,
    plans: &BTreeMap<String, String>,
    late: &BTreeMap<String, Late>,
    rules: &Rules,
) -> Vec<OrgLine> {
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
        // The meter clamped late beats on arrival, the reference on the answer: a
        // difference within that slack is the late beats', not the meter's.
        let lt = late.get(session);
        let against_rules = match lt {
            Some(lt) if (got - expected).abs() <= lt.slack => 0,
            _ => got - expected,
        };
        // What the rules add to what ran: a crash's tail, late beats' clamps.
        let rules_add = got - ran - against_rules;
        let (unexplained, broke_rule_3) = if t.crashed {
            l.crashed += 1;
            l.crash_tails += rules_add;
            // Rule 3 against the truth: at most one interval past the VM's last beat,
            // which is before it died (a late last beat is clamped later: not checked).
            (against_rules, lt.is_none() && got - ran > rules.interval)
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
            }
        }
    }
    lines.into_values().collect()
}

fn percentile(v: &mut [u32], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable();
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    f64::from(v[i]) / 1000.0
}

/// The meter's billed seconds for every session of `org` this run made, with the org.
async fn billed_sessions(
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

fn progress_bar(fleet: &Arc<Fleet>) -> (indicatif::ProgressBar, tokio::task::JoinHandle<()>) {
    let secs = fleet.opts.duration.as_secs();
    let bar = if fleet.opts.progress {
        indicatif::ProgressBar::new(secs)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} s  {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    let (b, f) = (bar.clone(), fleet.clone());
    let started = Instant::now();
    let ticker = tokio::spawn(async move {
        loop {
            let c = &f.counters;
            b.set_position(started.elapsed().as_secs().min(secs));
            b.set_message(format!(
                "running {} · parked {} · beats {} acked · {} denied · {} retries",
                c.live_running.load(Ordering::Relaxed),
                c.live_parked.load(Ordering::Relaxed),
                c.beats_acked.load(Ordering::Relaxed),
                f.denials.lock().unwrap().values().sum::<u64>(),
                c.retries.load(Ordering::Relaxed),
            ));
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    (bar, ticker)
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

async fn report(fleet: &Fleet, driven: Duration) -> Result<Outcome, String> {
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
    let lines = reconcile(&truth, &expected, &billed, &fleet.org_plans, &late, &rules);
    let c = &fleet.counters;
    let acked = c.beats_acked.load(Ordering::Relaxed);
    let denials = fleet.denials.lock().unwrap().clone();
    let mut beat_lat = fleet.beat_latency.lock().unwrap().clone();
    let mut gate_lat = fleet.gate_latency.lock().unwrap().clone();
    let summary = format!(
        "{} s driven · {} orgs · {} session slots · {} hosts · interval {} s, lease {} s\n\
         sessions {} · allowed {} · denied {} {:?} · crashed {} · ended {}\n\
         heartbeats sent {} · acknowledged {} in {} batches ({:.0}/s) · retried requests {}\n\
         latency p50/p99: heartbeat batch {:.1}/{:.1} ms · admission {:.1}/{:.1} ms",
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
    );
    Ok(Outcome { lines, summary })
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Reconciled with no late beats, on the orgs of `plans()`.
    fn on_time(
        truths: &BTreeMap<String, Truth>,
        reference: &BTreeMap<String, i64>,
        got: &BTreeMap<String, (String, i64)>,
    ) -> Vec<OrgLine> {
        reconcile(truths, reference, got, &plans(), &BTreeMap::new(), &RULES)
    }

    #[test]
    fn the_difference_is_taken_apart() {
        // a2 crashed 7 s after its last beat at 30: the rules bill to 45.
        let reference = BTreeMap::from([("a1".into(), 160), ("a2".into(), 45), ("b1".into(), 50)]);
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
        let reference = BTreeMap::from([("a1".into(), 100), ("a3".into(), 100)]);
        let got = billed(&[("a1", "a", 105), ("a3", "a", 95)]);
        let lines = on_time(&truths, &reference, &got);
        assert_eq!((lines[0].unexplained, lines[0].mismatched), (0, 2));
    }

    #[test]
    fn a_crash_tail_past_one_interval_is_mismatched_even_if_the_reference_agrees() {
        // Ran to 37, last beat at 30: the meter may bill to 45 at most; 60 is two intervals.
        let reference = BTreeMap::from([("a1".into(), 160), ("a2".into(), 60), ("b1".into(), 50)]);
        let got = billed(&[("a1", "a", 160), ("a2", "a", 60), ("b1", "b", 50)]);
        let lines = on_time(&truths(), &reference, &got);
        assert_eq!((lines[0].unexplained, lines[0].mismatched), (0, 1));
    }

    #[test]
    fn a_session_the_fleet_never_ran_is_mismatched() {
        let reference = BTreeMap::from([("a1".into(), 160), ("a2".into(), 45), ("b1".into(), 50)]);
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

    #[test]
    fn a_crash_whose_last_beat_came_late_is_held_to_the_rules_not_the_bound() {
        // a2's last beat was clamped to arrival less the lease, later than it was sent: the
        // meter bills past one interval after what ran, within 3 s of the reference.
        let late = BTreeMap::from([("a2".to_owned(), Late { beats: 1, slack: 3 })]);
        let reference = BTreeMap::from([("a1".into(), 160), ("a2".into(), 62), ("b1".into(), 50)]);
        let got = billed(&[("a1", "a", 160), ("a2", "a", 60), ("b1", "b", 50)]);
        let lines = reconcile(&truths(), &reference, &got, &plans(), &late, &RULES);
        assert_eq!(
            (
                lines[0].crash_tails,
                lines[0].unexplained,
                lines[0].mismatched
            ),
            (23, 0, 0)
        );
        // Past the slack it is the meter's, counted once for the session.
        let got = billed(&[("a1", "a", 160), ("a2", "a", 80), ("b1", "b", 50)]);
        let lines = reconcile(&truths(), &reference, &got, &plans(), &late, &RULES);
        assert_eq!(
            (
                lines[0].crash_tails,
                lines[0].unexplained,
                lines[0].mismatched
            ),
            (25, 18, 1)
        );
    }

    #[test]
    fn late_beats_are_forgiven_their_slack_and_no_more() {
        // b1's late beats were clamped by the meter 2 s earlier than the reference did.
        let late = BTreeMap::from([("b1".to_owned(), Late { beats: 3, slack: 2 })]);
        let reference = BTreeMap::from([("a1".into(), 160), ("a2".into(), 45), ("b1".into(), 44)]);
        let got = billed(&[("a1", "a", 160), ("a2", "a", 45), ("b1", "b", 42)]);
        let lines = reconcile(&truths(), &reference, &got, &plans(), &late, &RULES);
        assert_eq!(
            (lines[1].late, lines[1].unexplained, lines[1].mismatched),
            (-8, 0, 0)
        );
        let got = billed(&[("a1", "a", 160), ("a2", "a", 45), ("b1", "b", 41)]);
        let lines = reconcile(&truths(), &reference, &got, &plans(), &late, &RULES);
        assert_eq!(
            (lines[1].late, lines[1].unexplained, lines[1].mismatched),
            (-6, -3, 1)
        );
    }
}
