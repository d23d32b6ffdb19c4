//! The failover drill (part of `cargo test --test drills`): a pg_auto_failover formation
//! (a monitor and two PostgreSQL nodes with synchronous replication, `formation.sh` beside
//! this file) under two instances of the service, both given the formation's URL of two
//! hosts, and a steady load: supervisors asking admissions (four of them on a key whose
//! limit is two) and beating, and Stripe webhooks. The primary is lost (its keeper and
//! postmaster killed with `kill -9`, a machine gone), the standby promoted; the old primary
//! rejoins as a standby, and a planned switchover moves the primary back, all under load.
//!
//! Every client keeps one connection open (hyper, no pool that would reconnect unseen) and
//! retries what is refused, as a supervisor does, until it is answered. Then the drill's
//! own records are checked against the database: every heartbeat, decision and Stripe event
//! acknowledged is stored, no second billed twice, the slots the gate counts are the ones
//! the supervisors hold, no 500, no kept-alive connection closed. How long writes were
//! refused is measured and reported, never asserted (a shared machine's timings vary).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use rush_meter_core::signature::sign;
use serde_json::{json, Value};
use sqlx::Connection;

use crate::common::{repo_plans_and_mini, spawn_service_with};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/failover/formation.sh");
const TOKEN: &str = "failover-drill-token-0123456789";
const WEBHOOK_SECRET: &str = "whsec_failover_drill";
const ENV: &[(&str, &str)] = &[
    ("RUSH_METER_RATE_LIMIT_PER_SEC", "0"),
    ("RUSH_METER_STRIPE_WEBHOOK_SECRET", WEBHOOK_SECRET),
];
/// Supervisors on the key held at its limit, and on the other.
const HOT: usize = 4;
const COOL: usize = 2;
const HOT_LIMIT: i64 = 2;
/// Sessions in each of the batching supervisor's requests.
const FLEET: usize = 200;
/// The org spent to its cap: `mini` (180 s a week, 30 s of grace, a tenth of a cent a
/// second past it), pay-as-you-go capped at `CAP`, run by `CAPPED` sessions at once.
const CAP: &str = "0.20";
const CAPPED: usize = 40;
/// Running heartbeats a turn; a session runs two turns (an admission, then a resume).
const BEATS: usize = 25;
/// Load before the kill, and after each step once writes are taken again.
const STEADY: Duration = Duration::from_secs(4);
/// A supervisor's wait before it retries a refused request.
const BACKOFF: Duration = Duration::from_millis(50);

/// The pg_auto_failover formation, stopped and removed when dropped.
pub struct Formation {
    dir: PathBuf,
    /// The monitor's port; the nodes listen on the next two.
    port: u16,
}

/// Run `formation.sh cmd DIR args…`; its output, or a panic with its log.
async fn script(cmd: &str, dir: &std::path::Path, args: &[String]) -> String {
    let out = tokio::process::Command::new(SCRIPT)
        .arg(cmd)
        .arg(dir)
        .args(args)
        .output()
        .await
        .expect("formation.sh runs");
    assert!(
        out.status.success(),
        "formation.sh {cmd}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// One value `sql` answers on the node at `port`.
async fn psql(port: u16, sql: &str) -> String {
    let mut c = sqlx::PgConnection::connect(&format!("postgres://postgres@127.0.0.1:{port}/fo"))
        .await
        .unwrap();
    let v: String = sqlx::query_scalar(sql).fetch_one(&mut c).await.unwrap();
    let _ = c.close().await;
    v
}

/// Three consecutive free ports on 127.0.0.1.
fn free_ports() -> u16 {
    loop {
        let base = 20_000 + rand::random::<u16>() % 20_000;
        if (base..base + 3).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            return base;
        }
    }
}

impl Formation {
    /// `None` (with a note) where pg_auto_failover is not installed, but on CI.
    pub async fn up() -> Option<Formation> {
        if std::process::Command::new("pg_autoctl")
            .arg("--version")
            .output()
            .is_err()
        {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI must run the failover drill: apt-get install postgresql-15-auto-failover \
                 pg-auto-failover-cli"
            );
            eprintln!("note: no pg_autoctl; the failover drill does not run");
            return None;
        }
        let f = Formation {
            dir: std::env::temp_dir().join(format!("rm-failover-{}", rand::random::<u32>())),
            port: free_ports(),
        };
        script("up", &f.dir, &[f.port.to_string()]).await;
        Some(f)
    }

    fn node_port(&self, node: u8) -> u16 {
        self.port + u16::from(node)
    }

    /// As `pg_autoctl show uri --formation default` gives it, with the user.
    fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/fo?target_session_attrs=read-write",
            self.node_port(1),
            self.node_port(2)
        )
    }

    async fn primary(&self) -> u16 {
        script("primary", &self.dir, &[]).await.parse().unwrap()
    }

    async fn kill(&self, node: u8) {
        script("kill", &self.dir, &[format!("node{node}")]).await;
    }

    async fn rejoin(&self, node: u8) {
        script("rejoin", &self.dir, &[format!("node{node}")]).await;
    }

    async fn settled(&self) {
        script("wait", &self.dir, &[]).await;
    }

    async fn freeze(&self, node: u8) {
        script("freeze", &self.dir, &[format!("node{node}")]).await;
    }

    async fn thaw(&self, node: u8) {
        script("thaw", &self.dir, &[format!("node{node}")]).await;
    }

    async fn switchover(&self) {
        script("switchover", &self.dir, &[]).await;
    }
}

impl Drop for Formation {
    fn drop(&mut self) {
        let _ = std::process::Command::new(SCRIPT)
            .arg("down")
            .arg(&self.dir)
            .status();
    }
}

/// What a request is, for the timings: writes are what a failover stops.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Route {
    Admission,
    Heartbeat,
    Webhook,
}

/// One request as it went: sent, answered (or cut off), to what, and its status (`None`:
/// no answer).
#[derive(Clone, Copy, Debug)]
struct Sent {
    sent: Instant,
    at: Instant,
    route: Route,
    status: Option<u16>,
}

impl Sent {
    fn write_ok(&self) -> bool {
        self.route != Route::Webhook && self.status.is_some_and(|s| (200..300).contains(&s))
    }
}

/// Every request the clients sent, in the order answered.
type Log = Arc<Mutex<Vec<Sent>>>;

/// How a request went without an answer.
#[derive(Debug)]
enum Cut {
    /// The connection closed under it (or before it could be sent on a kept-alive one).
    Closed,
    /// No answer within 30 s.
    Hung,
}

/// One client's one connection, kept alive from request to request; made again only when
/// the service closes it, which is counted.
struct Conn {
    addr: String,
    sender: Option<SendRequest<Full<Bytes>>>,
    /// Kept-alive connections the service closed, with or without `Connection: close`.
    closed: usize,
}

impl Conn {
    fn to(base: &str) -> Conn {
        Conn {
            addr: base.trim_start_matches("http://").to_owned(),
            sender: None,
            closed: 0,
        }
    }

    async fn connect(&mut self) -> Result<&mut SendRequest<Full<Bytes>>, Cut> {
        if self.sender.is_none() {
            let stream = tokio::net::TcpStream::connect(&self.addr)
                .await
                .map_err(|_| Cut::Closed)?;
            let (sender, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .map_err(|_| Cut::Closed)?;
            tokio::spawn(conn);
            self.sender = Some(sender);
        }
        Ok(self.sender.as_mut().unwrap())
    }

    async fn post(
        &mut self,
        path: &str,
        headers: &[(&str, String)],
        body: String,
    ) -> Result<(u16, Value), Cut> {
        let addr = self.addr.clone();
        let sender = self.connect().await?;
        let mut req = hyper::Request::post(path)
            .header("host", addr)
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {TOKEN}"));
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        let req = req.body(Full::new(Bytes::from(body))).unwrap();
        let sent = async {
            sender.ready().await?;
            let resp = sender.send_request(req).await?;
            let status = resp.status().as_u16();
            let close = resp
                .headers()
                .get("connection")
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
            let body = resp.into_body().collect().await?.to_bytes();
            Ok::<_, hyper::Error>((status, close, body))
        };
        match tokio::time::timeout(Duration::from_secs(30), sent).await {
            Ok(Ok((status, close, body))) => {
                if close {
                    self.closed += 1;
                    self.sender = None;
                }
                Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
            }
            Ok(Err(_)) => {
                self.closed += 1;
                self.sender = None;
                Err(Cut::Closed)
            }
            Err(_) => {
                self.sender = None;
                Err(Cut::Hung)
            }
        }
    }
}

/// What a client saw besides the answers it wanted.
#[derive(Debug, Default)]
struct Trouble {
    /// Answers other than 2xx and 503, with their bodies: none is expected.
    unexpected: Vec<(u16, Value)>,
    /// Requests that got no answer (and were sent again).
    cut: usize,
    hung: usize,
    /// Requests answered 503 (or cut) whose retry found them applied: commits whose outcome
    /// the service could not know, answered with an error the caller retried safely.
    applied_before: usize,
}

/// Send `body` to `path` until it is answered 2xx, as a supervisor does (a 503 or a cut
/// connection is sent again after `BACKOFF`); the answer, and whether an earlier attempt
/// went unanswered or was refused.
async fn until_answered(
    conn: &mut Conn,
    route: Route,
    path: &str,
    body: impl Fn() -> (String, Vec<(&'static str, String)>),
    log: &Log,
    trouble: &mut Trouble,
) -> (Value, bool) {
    let mut failed_before = false;
    loop {
        let (body, headers) = body();
        let sent = Instant::now();
        let answer = conn.post(path, &headers, body).await;
        let status = answer.as_ref().ok().map(|(s, _)| *s);
        log.lock().unwrap().push(Sent {
            sent,
            at: Instant::now(),
            route,
            status,
        });
        match answer {
            Ok((s, v)) if (200..300).contains(&s) => return (v, failed_before),
            Ok((503, _)) => {}
            Ok((s, v)) => trouble.unexpected.push((s, v)),
            Err(Cut::Closed) => trouble.cut += 1,
            Err(Cut::Hung) => trouble.hung += 1,
        }
        failed_before = true;
        tokio::time::sleep(BACKOFF).await;
    }
}

/// One supervisor's records.
#[derive(Debug, Default)]
struct Supervised {
    /// Heartbeats answered 200, by org and session.
    acked: HashMap<(&'static str, String), i64>,
    /// Decisions answered: id and whether it allowed.
    decisions: Vec<(String, bool)>,
    /// The session holding a slot of `key` when the load stopped.
    holding: Option<String>,
    key: &'static str,
    trouble: Trouble,
    closed: usize,
}

/// A supervisor: sessions one after another on `key`, each admitted, run `BEATS`
/// heartbeats, parked, resumed (admitted again), run and parked again; a denial is asked
/// again after 100 ms. Until `stop`, and always to the end of the request in hand.
async fn supervisor(
    w: usize,
    base: String,
    key: &'static str,
    stop: Arc<AtomicBool>,
    log: Log,
) -> Supervised {
    let mut conn = Conn::to(&base);
    let mut out = Supervised {
        key,
        ..Supervised::default()
    };
    let mut n = 0;
    'sessions: while !stop.load(Ordering::Relaxed) {
        n += 1;
        let session = format!("w{w}_s{n}");
        let mut seq = 0;
        for _turn in 0..2 {
            loop {
                let body = json!({"org_id": "acme", "key_id": key, "session_id": session, "agent": "codex"}).to_string();
                let (v, failed_before) = until_answered(
                    &mut conn,
                    Route::Admission,
                    "/v1/admissions",
                    || (body.clone(), vec![]),
                    &log,
                    &mut out.trouble,
                )
                .await;
                let allowed = v["decision"] == "allow";
                out.decisions.push((
                    v["decision_id"].as_str().unwrap_or_default().to_owned(),
                    allowed,
                ));
                if failed_before && v["rule"] == "already_admitted" {
                    out.trouble.applied_before += 1;
                }
                if allowed {
                    break;
                }
                if stop.load(Ordering::Relaxed) {
                    break 'sessions;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            out.holding = Some(session.clone());
            for beat in 0..=BEATS {
                // The last beat of a turn parks it; the load stops between beats.
                let state = if beat == BEATS { "parked" } else { "running" };
                if state == "running" && stop.load(Ordering::Relaxed) {
                    break 'sessions;
                }
                seq += 1;
                let body = json!({"heartbeats": [{"org_id": "acme", "session_id": session, "vm_id": format!("vm_{session}"), "seq": seq, "state": state}]}).to_string();
                let (v, failed_before) = until_answered(
                    &mut conn,
                    Route::Heartbeat,
                    "/v1/heartbeats",
                    || (body.clone(), vec![]),
                    &log,
                    &mut out.trouble,
                )
                .await;
                *out.acked.entry(("acme", session.clone())).or_default() += 1;
                if failed_before && v["results"][0]["duplicate"] == true {
                    out.trouble.applied_before += 1;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            out.holding = None;
        }
    }
    out.closed = conn.closed;
    out
}

/// A host's supervisor that batches: one request a round carrying a heartbeat of each of
/// `sessions` sessions of `org`, running without admissions (for `FLEET` sessions a body
/// of about 30 KB, more than one read of the socket), whatever the answers say.
async fn fleet(
    org: &'static str,
    sessions: usize,
    base: String,
    stop: Arc<AtomicBool>,
    log: Log,
) -> Supervised {
    let mut conn = Conn::to(&base);
    let mut out = Supervised {
        key: "none",
        ..Supervised::default()
    };
    let mut seq = 0;
    while !stop.load(Ordering::Relaxed) {
        seq += 1;
        let beats: Vec<Value> = (0..sessions)
            .map(|i| json!({"org_id": org, "session_id": format!("vm{i:03}"), "vm_id": format!("vm{i:03}"), "seq": seq, "state": "running"}))
            .collect();
        let body = json!({"heartbeats": beats}).to_string();
        let (v, failed_before) = until_answered(
            &mut conn,
            Route::Heartbeat,
            "/v1/heartbeats",
            || (body.clone(), vec![]),
            &log,
            &mut out.trouble,
        )
        .await;
        for i in 0..sessions {
            *out.acked.entry((org, format!("vm{i:03}"))).or_default() += 1;
        }
        if failed_before && v["results"][0]["duplicate"] == true {
            out.trouble.applied_before += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    out.closed = conn.closed;
    out
}

/// A subscription event of the org `billing`, as Stripe sends it.
fn subscription_event(id: &str, created: i64) -> String {
    json!({"id": id, "object": "event", "type": "customer.subscription.updated", "created": created,
           "data": {"object": {"id": "sub_drill", "object": "subscription", "status": "active",
             "customer": "cus_billing", "metadata": {"org_id": "billing"}, "cancel_at_period_end": false,
             "current_period_start": created - 86_400, "current_period_end": created + 29 * 86_400,
             "items": {"object": "list", "data": [{"id": "si_drill", "plan": {"id": "pro_monthly"}}]}}}})
    .to_string()
}

/// Stripe: an event every 250 ms, each delivered (and signed afresh) until answered 2xx.
/// The ids acknowledged.
async fn stripe(base: String, stop: Arc<AtomicBool>, log: Log) -> (Vec<String>, Trouble, usize) {
    let mut conn = Conn::to(&base);
    let (mut acked, mut trouble) = (Vec::new(), Trouble::default());
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let id = format!("evt_drill_{n:05}");
        let created = chrono::Utc::now().timestamp();
        let body = subscription_event(&id, created);
        until_answered(
            &mut conn,
            Route::Webhook,
            "/v1/stripe/webhook",
            || {
                let now = chrono::Utc::now().timestamp();
                let signature = sign(WEBHOOK_SECRET, now, body.as_bytes());
                (body.clone(), vec![("stripe-signature", signature)])
            },
            &log,
            &mut trouble,
        )
        .await;
        acked.push(id);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    (acked, trouble, conn.closed)
}

/// When each node was seen to take writes (a new connection each look, every 50 ms:
/// `transaction_read_only` off), as (when, port, writable) at each change.
type Writable = Arc<Mutex<Vec<(Instant, u16, bool)>>>;

async fn watch_writable(ports: [u16; 2], stop: Arc<AtomicBool>, seen: Writable) {
    let mut last: HashMap<u16, bool> = HashMap::new();
    while !stop.load(Ordering::Relaxed) {
        for port in ports {
            let url = format!("postgres://postgres@127.0.0.1:{port}/fo");
            let look = async {
                let mut c = sqlx::PgConnection::connect(&url).await.ok()?;
                let ro: String = sqlx::query_scalar("SHOW transaction_read_only")
                    .fetch_one(&mut c)
                    .await
                    .ok()?;
                let _ = c.close().await;
                Some(ro == "off")
            };
            let writable = tokio::time::timeout(Duration::from_millis(500), look)
                .await
                .ok()
                .flatten()
                .unwrap_or(false);
            if last.insert(port, writable) != Some(writable) {
                seen.lock().unwrap().push((Instant::now(), port, writable));
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The first time at or after `after` that `port` was seen taking writes.
fn writable_from(seen: &Writable, port: u16, after: Instant) -> Option<Instant> {
    seen.lock()
        .unwrap()
        .iter()
        .find(|(at, p, w)| *at >= after && *p == port && *w)
        .map(|(at, ..)| *at)
}

/// The first write answered 2xx at or after `after`.
fn first_write_ok(log: &Log, after: Instant) -> Option<Instant> {
    log.lock()
        .unwrap()
        .iter()
        .find(|s| s.at >= after && s.write_ok())
        .map(|s| s.at)
}

/// The last write answered 2xx before `before`.
fn last_write_ok(log: &Log, before: Instant) -> Option<Instant> {
    log.lock()
        .unwrap()
        .iter()
        .rev()
        .find(|s| s.at < before && s.write_ok())
        .map(|s| s.at)
}

/// Until a write is answered 2xx after `port` took writes (at `after` or later): when it
/// took them and when the first write was answered. Panics after two minutes.
async fn writes_again(log: &Log, seen: &Writable, port: u16, after: Instant) -> (Instant, Instant) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(w) = writable_from(seen, port, after) {
            if let Some(ok) = first_write_ok(log, w) {
                return (w, ok);
            }
        }
        if Instant::now() > deadline {
            let seen: Vec<_> = seen
                .lock()
                .unwrap()
                .iter()
                .map(|(at, p, w)| (at.duration_since(after), *p, *w))
                .collect();
            let log = log.lock().unwrap();
            let last: Vec<_> = log.iter().rev().take(10).collect();
            panic!("no write was answered 2xx on {port} within two minutes: writable {seen:?}; last answers {last:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One step of the drill, timed.
pub struct Step {
    pub name: &'static str,
    /// From the step's start until the new primary took writes.
    pub to_writable: Duration,
    /// From the new primary taking writes to the service's first write answered 2xx.
    pub to_first_ok: Duration,
    /// From the last write answered 2xx before the step to the first after it.
    pub writes_refused_for: Duration,
}

/// The org run past its plan under a pay-as-you-go cap, after the drill.
pub struct Capped {
    pub cap: &'static str,
    /// Pay-as-you-go spent this month, and the month's overage amount billed.
    pub spent: String,
    pub billed: String,
    pub cap_reached: bool,
    pub used_seconds: i64,
}

/// The drill's figures, each from its own records and the database.
pub struct Figures {
    pub steps: Vec<Step>,
    pub heartbeats_acked: i64,
    pub heartbeats_lost: i64,
    pub decisions_acked: usize,
    pub decisions_lost: usize,
    pub seconds_billed_twice: i64,
    pub seconds_billed: i64,
    /// Per key: (slots the gate counts, sessions the supervisors hold, the limit).
    pub slots: Vec<(&'static str, i64, i64, i64)>,
    pub capped: Capped,
    pub events_acked: usize,
    pub events_lost: usize,
    pub answers: usize,
    pub refused_503: usize,
    pub server_errors: usize,
    pub unexpected: Vec<(u16, Value)>,
    pub cut: usize,
    pub hung: usize,
    pub closed: usize,
    pub applied_before: usize,
    /// Writes sent before the primary was lost and answered after: their commits' outcome
    /// was unknown to the service.
    pub in_flight: usize,
    pub in_flight_503: usize,
    /// The primary's `synchronous_standby_names` before the kill.
    pub synchronous: String,
    pub took: Duration,
}

/// PUT `path` on the service until answered 2xx.
async fn admin_put(client: &reqwest::Client, base: &str, path: &str, body: Value) {
    let r = client
        .put(format!("{base}{path}"))
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{path}: {}", r.status());
}

/// Run the drill; `None` where pg_auto_failover is not installed (but on CI).
pub async fn drill() -> Option<Figures> {
    let started = Instant::now();
    let f = Formation::up().await?;
    let url = f.url();
    let plans = repo_plans_and_mini();
    let env: Vec<(&str, &str)> = ENV
        .iter()
        .copied()
        .chain([("RUSH_METER_PLANS_DIR", plans.path().to_str().unwrap())])
        .collect();
    let mut instances = Vec::new();
    for _ in 0..2 {
        instances.push(spawn_service_with(&url, TOKEN, &env).await);
    }
    let bases: Vec<String> = instances.iter().map(|(_, b)| b.clone()).collect();
    let client = reqwest::Client::new();
    for (path, body) in [
        ("/v1/orgs/acme", json!({"plan": "team"})),
        ("/v1/orgs/billing", json!({"plan": "free"})),
        ("/v1/orgs/fleet", json!({"plan": "team"})),
        (
            "/v1/orgs/acme/keys/hot",
            json!({"concurrency_limit": HOT_LIMIT}),
        ),
        ("/v1/orgs/acme/keys/cool", json!({})),
        ("/v1/orgs/capped", json!({"plan": "mini"})),
        (
            "/v1/orgs/capped/overage",
            json!({"enabled": true, "monthly_cap": CAP}),
        ),
    ] {
        admin_put(&client, &bases[0], path, body).await;
    }

    let stop = Arc::new(AtomicBool::new(false));
    let log = Log::default();
    let seen = Writable::default();
    let watcher = tokio::spawn(watch_writable(
        [f.node_port(1), f.node_port(2)],
        Arc::clone(&stop),
        Arc::clone(&seen),
    ));
    let supervisors: Vec<_> = (0..HOT + COOL)
        .map(|w| {
            let key = if w < HOT { "hot" } else { "cool" };
            tokio::spawn(supervisor(
                w,
                bases[w % 2].clone(),
                key,
                Arc::clone(&stop),
                Arc::clone(&log),
            ))
        })
        .collect();
    let batcher = tokio::spawn(fleet(
        "fleet",
        FLEET,
        bases[0].clone(),
        Arc::clone(&stop),
        Arc::clone(&log),
    ));
    let spender = tokio::spawn(fleet(
        "capped",
        CAPPED,
        bases[1].clone(),
        Arc::clone(&stop),
        Arc::clone(&log),
    ));
    let webhooks = tokio::spawn(stripe(
        bases[1].clone(),
        Arc::clone(&stop),
        Arc::clone(&log),
    ));
    tokio::time::sleep(STEADY).await;

    let mut steps = Vec::new();
    assert_eq!(
        f.primary().await,
        f.node_port(1),
        "node1 is the first primary"
    );
    let synchronous = psql(f.node_port(1), "SHOW synchronous_standby_names").await;
    let step = |name, at: Instant, (w, ok): (Instant, Instant)| Step {
        name,
        to_writable: w - at,
        to_first_ok: ok - w,
        writes_refused_for: ok - last_write_ok(&log, at).unwrap_or(at),
    };
    // Commits in flight when the machine is lost: the standby's WAL receiver stopped, the
    // primary's commits wait for it (synchronous replication); then the primary's every
    // process killed, and the receiver let go, with what its socket held.
    f.freeze(2).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let at = Instant::now();
    f.kill(1).await;
    f.thaw(2).await;
    let again = writes_again(&log, &seen, f.node_port(2), at).await;
    let in_flight: Vec<Sent> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.route != Route::Webhook && s.sent < at && s.at >= at)
        .copied()
        .collect();
    steps.push(step(
        "primary killed (`kill -9`), standby promoted",
        at,
        again,
    ));
    tokio::time::sleep(STEADY).await;
    // The old primary back: it rejoins as a standby (pg_rewind) while the load runs.
    f.rejoin(1).await;
    f.settled().await;
    tokio::time::sleep(STEADY).await;
    let at = Instant::now();
    f.switchover().await;
    let again = writes_again(&log, &seen, f.node_port(1), at).await;
    steps.push(step("planned switchover back", at, again));
    f.settled().await;
    tokio::time::sleep(STEADY).await;
    stop.store(true, Ordering::Relaxed);

    let mut supervised = Vec::new();
    for s in supervisors {
        supervised.push(s.await.unwrap());
    }
    supervised.push(batcher.await.unwrap());
    supervised.push(spender.await.unwrap());
    let (events, stripe_trouble, stripe_closed) = webhooks.await.unwrap();
    watcher.await.unwrap();

    // The gate's count of each key's slots, asked by admitting one more session: a denial
    // for the limit counts them all, an allowance counts itself too.
    let mut slots = Vec::new();
    for (key, limit) in [("hot", HOT_LIMIT), ("cool", 4)] {
        let r = client
            .post(format!("{}/v1/admissions", bases[0]))
            .bearer_auth(TOKEN)
            .json(&json!({"org_id": "acme", "key_id": key, "session_id": format!("probe_{key}"), "agent": "codex"}))
            .send()
            .await
            .unwrap();
        let v: Value = r.json().await.unwrap();
        let running = v["concurrency"]["running"].as_i64().unwrap();
        let gate = running - i64::from(v["decision"] == "allow");
        let held = supervised
            .iter()
            .filter(|s| s.key == key && s.holding.is_some())
            .count() as i64;
        slots.push((key, gate, held, limit));
    }

    // The capped org's pay-as-you-go, as its usage page says it: spent to the cap, no more.
    let usage: Value = client
        .get(format!("{}/v1/orgs/capped/usage", bases[1]))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let overage = &usage["funding"]["overage"];
    let capped = Capped {
        cap: CAP,
        spent: overage["spent"].as_str().unwrap_or_default().to_owned(),
        billed: usage["month"]["overage_amount"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        cap_reached: overage["cap_reached"] == true,
        used_seconds: usage["month"]["used_seconds"].as_i64().unwrap_or_default(),
    };

    let primary = f.primary().await;
    let db = sqlx::PgPool::connect(&format!("postgres://postgres@127.0.0.1:{primary}/fo"))
        .await
        .unwrap();
    let stored: HashMap<(String, String), (i64, i64, i64, i64)> =
        sqlx::query_as::<_, (String, String, i64, i64, i64, i64)>(
            "SELECT org_id, session_id, heartbeats, billed_seconds, created_at, \
             COALESCE(heard_at, last_at) FROM sessions WHERE org_id IN ('acme', 'fleet', 'capped')",
        )
        .fetch_all(&db)
        .await
        .unwrap()
        .into_iter()
        .map(|(org, id, hb, billed, created, heard)| ((org, id), (hb, billed, created, heard)))
        .collect();
    let (mut heartbeats_acked, mut heartbeats_lost, mut twice) = (0, 0, 0);
    for s in &supervised {
        for ((org, session), acked) in &s.acked {
            let key = (org.to_string(), session.clone());
            let (hb, billed, created, heard) = stored.get(&key).copied().unwrap_or_default();
            heartbeats_acked += acked;
            heartbeats_lost += (acked - hb).max(0);
            assert_eq!(hb, *acked, "{session}: heartbeats stored and acknowledged");
            // A session cannot be billed more seconds than it lived.
            twice += (billed - (heard - created)).max(0);
        }
    }
    let seconds_billed: i64 = stored.values().map(|s| s.1).sum();
    let hourly: i64 = sqlx::query_scalar("SELECT COALESCE(SUM(seconds), 0)::BIGINT FROM org_hourly WHERE org_id IN ('acme', 'fleet', 'capped')")
        .fetch_one(&db)
        .await
        .unwrap();
    twice += (hourly - seconds_billed).abs();
    let decided: std::collections::HashSet<String> =
        sqlx::query_scalar("SELECT decision_id FROM decisions WHERE org_id = 'acme'")
            .fetch_all(&db)
            .await
            .unwrap()
            .into_iter()
            .collect();
    let decisions: Vec<&(String, bool)> = supervised.iter().flat_map(|s| &s.decisions).collect();
    let decisions_acked = decisions.len();
    let decisions_lost = decisions
        .iter()
        .filter(|(id, _)| !decided.contains(id))
        .count();
    let stored_events: std::collections::HashSet<String> =
        sqlx::query_scalar("SELECT event_id FROM stripe_events")
            .fetch_all(&db)
            .await
            .unwrap()
            .into_iter()
            .collect();
    let events_lost = events
        .iter()
        .filter(|id| !stored_events.contains(*id))
        .count();
    db.close().await;

    let answers = log.lock().unwrap().clone();
    let mut unexpected = stripe_trouble.unexpected;
    let (mut cut, mut hung, mut applied_before, mut closed) = (
        stripe_trouble.cut,
        stripe_trouble.hung,
        stripe_trouble.applied_before,
        stripe_closed,
    );
    for s in supervised {
        unexpected.extend(s.trouble.unexpected);
        cut += s.trouble.cut;
        hung += s.trouble.hung;
        applied_before += s.trouble.applied_before;
        closed += s.closed;
    }
    Some(Figures {
        steps,
        heartbeats_acked,
        heartbeats_lost,
        decisions_acked,
        decisions_lost,
        seconds_billed_twice: twice,
        seconds_billed,
        slots,
        capped,
        events_acked: events.len(),
        events_lost,
        answers: answers.len(),
        refused_503: answers.iter().filter(|a| a.status == Some(503)).count(),
        server_errors: answers
            .iter()
            .filter(|a| a.status.is_some_and(|s| s >= 500 && s != 503))
            .count(),
        in_flight: in_flight.len(),
        in_flight_503: in_flight.iter().filter(|s| s.status == Some(503)).count(),
        synchronous,
        unexpected,
        cut,
        hung,
        closed,
        applied_before,
        took: started.elapsed(),
    })
}
