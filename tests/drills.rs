//! Fault drills against the real binary, with their figures written to
//! reports/reliability.md (`cargo test --test drills`; CI runs it).
//!
//! - `kill -9` under heartbeat load: every heartbeat answered 200 is in the ledger after
//!   a restart, on SQLite and on PostgreSQL.
//! - The machine's PostgreSQL stopped and started under heartbeat load (pg_ctlcluster):
//!   `/readyz` answers 503 while it is down, every refusal is a 503, the service
//!   recovers by itself, and nothing answered 200 is lost. How fast each of those happens
//!   is measured and reported, never asserted: a shared machine's timings vary.
//! - Three instances on one PostgreSQL, one killed mid-burst of admissions: the key's
//!   concurrency limit holds exactly, and once the lease has passed no slot is leaked.

mod common;
mod failover;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{fresh_database, hb, spawn_service_with, Backend};
use serde_json::json;

const TOKEN: &str = "drills-test-token-0123456789";
/// Concurrent supervisors, each beating for its own session as fast as it is answered.
const SENDERS: usize = 16;
/// How long the load runs before the kill.
const LOAD: Duration = Duration::from_millis(1500);
/// Every sender shares one token: the drill is about durability, not the rate limit.
const ENV: &[(&str, &str)] = &[("RUSH_METER_RATE_LIMIT_PER_SEC", "0")];

struct KillFigures {
    backend: Backend,
    acknowledged: i64,
    in_ledger: i64,
    lost: i64,
    unanswered: usize,
}

/// The service on `url` with the org `acme` (Team), and a client for it.
async fn start_with_org(url: &str) -> (tokio::process::Child, String, reqwest::Client) {
    let (child, base) = spawn_service_with(url, TOKEN, ENV).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let r = client
        .put(format!("{base}/v1/orgs/acme"))
        .bearer_auth(TOKEN)
        .json(&json!({"plan": "team"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    (child, base, client)
}

/// Heartbeats the ledger applied for a session (0 if none ever landed).
async fn stored_heartbeats(client: &reqwest::Client, base: &str, session: &str) -> i64 {
    let r = client
        .get(format!("{base}/v1/sessions/{session}"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    if r.status() == 404 {
        return 0;
    }
    let v: serde_json::Value = r.json().await.unwrap();
    v["heartbeats"].as_i64().unwrap()
}

/// Load the service, SIGKILL it, restart it on the same database and count.
async fn kill_nine(backend: Backend) -> Option<KillFigures> {
    let (url, _dir) = fresh_database(backend).await?;
    let (mut child, base, client) = start_with_org(&url).await;
    let stop = Arc::new(AtomicBool::new(false));
    let senders = start_senders(&client, &base, "drill", &stop, &Arc::default());
    tokio::time::sleep(LOAD).await;
    // SIGKILL: no graceful shutdown, no flush; whatever was committed is all there is.
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    stop.store(true, Ordering::Relaxed);
    let mut acked = Vec::new();
    let mut unanswered = 0;
    for s in senders {
        let (a, failed, cut) = s.await.unwrap();
        assert!(failed.is_empty(), "refusals before the kill: {failed:?}");
        acked.push(a);
        unanswered += usize::from(cut);
    }
    let (_child, base) = spawn_service_with(&url, TOKEN, ENV).await;
    let (mut acknowledged, mut in_ledger, mut lost) = (0, 0, 0);
    for (w, a) in acked.iter().enumerate() {
        let stored = stored_heartbeats(&client, &base, &format!("drill_{w}")).await;
        // Every beat before the kill was answered 200 or not at all: `stored` counts the
        // applied ones, each once.
        acknowledged += a;
        in_ledger += stored;
        lost += (a - stored).max(0);
    }
    Some(KillFigures {
        backend,
        acknowledged,
        in_ledger,
        lost,
        unanswered,
    })
}

/// What a sender got: beats answered 200, other answers (status, time taken), and
/// whether it stopped on a request that got no answer.
type Sent = (i64, Vec<(u16, Duration)>, bool);

/// Senders beating until `stop`, each for its own session: per sender, the beats
/// answered 200, every other answer as (status, how long it took), and whether it stopped
/// on a request that got no answer at all (the server gone, or a hang past 30 s).
/// `acked_total` counts every 200 as it comes.
fn start_senders(
    client: &reqwest::Client,
    base: &str,
    prefix: &'static str,
    stop: &Arc<AtomicBool>,
    acked_total: &Arc<AtomicUsize>,
) -> Vec<tokio::task::JoinHandle<Sent>> {
    (0..SENDERS)
        .map(|w| {
            let (client, base, stop) = (client.clone(), base.to_owned(), Arc::clone(stop));
            let acked_total = Arc::clone(acked_total);
            tokio::spawn(async move {
                let (mut acked, mut failed) = (0, Vec::new());
                let mut seq = 0;
                while !stop.load(Ordering::Relaxed) {
                    seq += 1;
                    let now = chrono::Utc::now().timestamp();
                    let started = Instant::now();
                    let sent = client
                        .post(format!("{base}/v1/heartbeats"))
                        .bearer_auth(TOKEN)
                        .json(&json!({"heartbeats": [hb("acme", &format!("{prefix}_{w}"), seq, "running", now)]}))
                        .send()
                        .await;
                    match sent {
                        Ok(r) if r.status() == 200 => {
                            acked += 1;
                            acked_total.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(r) => {
                            failed.push((r.status().as_u16(), started.elapsed()));
                            // A supervisor backs off a little before it retries.
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        Err(_) => return (acked, failed, true),
                    }
                }
                (acked, failed, false)
            })
        })
        .collect()
}

/// `pg_ctlcluster` on the machine's one cluster.
fn pg_ctl(action: &str) {
    let version = std::fs::read_dir("/etc/postgresql")
        .expect("a Debian PostgreSQL cluster")
        .next()
        .unwrap()
        .unwrap()
        .file_name();
    let mut cmd = std::process::Command::new("pg_ctlcluster");
    cmd.arg("--skip-systemctl-redirect")
        .arg(&version)
        .args(["main", action]);
    if action == "stop" {
        cmd.args(["-m", "fast"]);
    }
    let status = cmd.status().expect("pg_ctlcluster runs");
    assert!(status.success(), "pg_ctlcluster {action}: {status}");
}

/// Starts PostgreSQL again however the drill ends, so later tests find it up.
struct RestartOnDrop;

impl Drop for RestartOnDrop {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| pg_ctl("start"));
    }
}

struct OutageFigures {
    acknowledged: i64,
    in_ledger: i64,
    lost: i64,
    refused: usize,
    other_errors: usize,
    slowest_refusal: Duration,
    median_refusal: Duration,
    readyz_down_after: Duration,
    down_for: Duration,
    ready_again_after: Duration,
    beating_again_after: Duration,
}

async fn readyz(client: &reqwest::Client, base: &str) -> u16 {
    client
        .get(format!("{base}/readyz"))
        .send()
        .await
        .map_or(0, |r| r.status().as_u16())
}

async fn wait_for_readyz(client: &reqwest::Client, base: &str, want: u16) -> Duration {
    let started = Instant::now();
    while readyz(client, base).await != want {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "/readyz never answered {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

/// Stop the machine's PostgreSQL for a few seconds under load, and start it again.
async fn postgres_outage() -> Option<OutageFigures> {
    let (url, _) = fresh_database(Backend::Postgres).await?;
    if !url.starts_with("postgres://postgres@127.0.0.1:5432/") {
        eprintln!("PostgreSQL is not the machine's own cluster: the outage drill does not run");
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI must run the outage drill"
        );
        return None;
    }
    let (_child, base, client) = start_with_org(&url).await;
    let stop = Arc::new(AtomicBool::new(false));
    let acked_total = Arc::new(AtomicUsize::new(0));
    let senders = start_senders(&client, &base, "outage", &stop, &acked_total);
    tokio::time::sleep(Duration::from_secs(1)).await;

    let guard = RestartOnDrop;
    let down = Instant::now();
    tokio::task::spawn_blocking(|| pg_ctl("stop"))
        .await
        .unwrap();
    let readyz_down_after = wait_for_readyz(&client, &base, 503).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    tokio::task::spawn_blocking(|| pg_ctl("start"))
        .await
        .unwrap();
    std::mem::forget(guard);
    let down_for = down.elapsed();
    let acked_at_start = acked_total.load(Ordering::Relaxed);
    let started = Instant::now();
    let ready_again_after = wait_for_readyz(&client, &base, 200).await;
    // The request path itself must recover, not only `/readyz`: wait for the senders'
    // heartbeats to be acknowledged again.
    while acked_total.load(Ordering::Relaxed) < acked_at_start + SENDERS * 10 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no heartbeat was acknowledged in the minute after PostgreSQL started again"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let beating_again_after = started.elapsed();
    stop.store(true, Ordering::Relaxed);

    let (mut acknowledged, mut in_ledger, mut lost) = (0, 0, 0);
    let (mut refusals, mut other_errors) = (Vec::new(), 0);
    for (w, s) in senders.into_iter().enumerate() {
        let (acked, failed, cut) = s.await.unwrap();
        assert!(
            !cut,
            "a request went unanswered in the outage: it hung or was dropped"
        );
        for (status, took) in failed {
            if status == 503 {
                refusals.push(took);
            } else {
                other_errors += 1;
            }
        }
        let stored = stored_heartbeats(&client, &base, &format!("outage_{w}")).await;
        acknowledged += acked;
        in_ledger += stored;
        lost += (acked - stored).max(0);
    }
    refusals.sort();
    Some(OutageFigures {
        acknowledged,
        in_ledger,
        lost,
        refused: refusals.len(),
        other_errors,
        slowest_refusal: refusals.last().copied().unwrap_or_default(),
        median_refusal: refusals
            .get(refusals.len() / 2)
            .copied()
            .unwrap_or_default(),
        readyz_down_after,
        down_for,
        ready_again_after,
        beating_again_after,
    })
}

const LIMIT: i64 = 20;
const BURST: usize = 600;
/// A short lease, so the drill can wait it out.
const SHORT_LEASE: &[(&str, &str)] = &[
    ("RUSH_METER_RATE_LIMIT_PER_SEC", "0"),
    ("RUSH_METER_HEARTBEAT_INTERVAL_SECS", "1"),
    ("RUSH_METER_LEASE_SECS", "3"),
];

struct InstancesFigures {
    answered_allow: i64,
    answered: usize,
    cut: usize,
    sessions_stored: i64,
    allowed_after_lease: i64,
}

/// Admissions for new sessions `prefix{n}`, spread over `bases` in turn; each answer
/// (decision or `None` if cut off) comes back; the answers of `bases[b]` are counted in
/// `answered(b)` as they come.
fn admission_burst(
    client: &reqwest::Client,
    bases: &[String],
    prefix: &str,
    n: usize,
    answered: &Arc<Vec<AtomicUsize>>,
) -> Vec<tokio::task::JoinHandle<Option<String>>> {
    (0..n)
        .map(|i| {
            let b = i % bases.len();
            let url = format!("{}/v1/admissions", bases[b]);
            let body = json!({"org_id": "acme", "key_id": "k1", "session_id": format!("{prefix}{i}"), "agent": "codex"});
            let (client, answered) = (client.clone(), Arc::clone(answered));
            tokio::spawn(async move {
                let r = client.post(url).bearer_auth(TOKEN).json(&body).send().await.ok()?;
                let v: serde_json::Value = r.json().await.ok()?;
                answered[b].fetch_add(1, Ordering::Relaxed);
                Some(v["decision"].as_str()?.to_owned())
            })
        })
        .collect()
}

async fn three_instances_one_killed() -> Option<InstancesFigures> {
    let (url, _) = fresh_database(Backend::Postgres).await?;
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(spawn_service_with(&url, TOKEN, SHORT_LEASE).await);
    }
    let bases: Vec<String> = instances.iter().map(|(_, b)| b.clone()).collect();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    for (path, body) in [
        ("/v1/orgs/acme", json!({"plan": "team"})),
        ("/v1/orgs/acme/keys/k1", json!({"concurrency_limit": LIMIT})),
    ] {
        let r = client
            .put(format!("{}{path}", bases[0]))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }
    let answered = Arc::new((0..3).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
    let burst = admission_burst(&client, &bases, "b", BURST, &answered);
    // Kill the third instance once it has answered its first admission: mid-burst. (A
    // count of every instance's answers could be reached after the third had answered all
    // of its share: its gate writer decides all that is queued at once.)
    while answered[2].load(Ordering::Relaxed) == 0 {
        tokio::task::yield_now().await;
    }
    instances[2].0.start_kill().unwrap();
    let (mut answered_allow, mut cut) = (0, 0);
    for t in burst {
        match t.await.unwrap().as_deref() {
            Some("allow") => answered_allow += 1,
            Some(_) => {}
            None => cut += 1,
        }
    }
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let sessions_stored: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM sessions WHERE org_id = 'acme'")
            .fetch_one(&pool)
            .await
            .unwrap();
    // No session was ever heard from: each slot is held for the lease (3 s) and no more.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let survivors = &bases[..2];
    let second = admission_burst(&client, survivors, "c", 100, &answered);
    let mut allowed_after_lease = 0;
    for t in second {
        if t.await.unwrap().as_deref() == Some("allow") {
            allowed_after_lease += 1;
        }
    }
    pool.close().await;
    Some(InstancesFigures {
        answered_allow,
        answered: BURST - cut,
        cut,
        sessions_stored,
        allowed_after_lease,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drills() {
    let started = Instant::now();
    let mut md = String::from("# Reliability drills\n\n");
    md.push_str(
        "- Command: `cargo test --test drills` (run by `.ci/run`; it rewrites this file)\n",
    );
    md.push_str(&format!(
        "- Date: {}\n\n",
        chrono::Utc::now().format("%Y-%m-%d")
    ));
    md.push_str("## `kill -9` under heartbeat load\n\n");
    md.push_str(&format!(
        "{SENDERS} supervisors beat as fast as they are answered, one single-heartbeat request at a\n\
         time each, for {} ms; then the server gets SIGKILL, is started again on the same\n\
         database, and each session's stored heartbeats are counted. A heartbeat answered 200\n\
         must be stored; one cut off unanswered may or may not be.\n\n",
        LOAD.as_millis()
    ));
    md.push_str("| backend | answered 200 | stored | answered but lost | requests cut off by the kill |\n| --- | --- | --- | --- | --- |\n");
    for backend in Backend::ALL {
        let Some(f) = kill_nine(backend).await else {
            continue;
        };
        assert_eq!(f.lost, 0, "{backend:?}: acknowledged heartbeats lost");
        assert!(f.in_ledger >= f.acknowledged);
        assert!(
            f.acknowledged > 100,
            "{backend:?}: too little load to mean anything"
        );
        md.push_str(&format!(
            "| {:?} | {} | {} | {} | {} |\n",
            f.backend, f.acknowledged, f.in_ledger, f.lost, f.unanswered
        ));
    }
    md.push_str("\n## PostgreSQL stopped and started under load\n\n");
    md.push_str(&format!(
        "{SENDERS} supervisors beat against one instance on the machine's PostgreSQL; after 1 s the\n\
         cluster is stopped (`pg_ctlcluster … stop -m fast`), left down 3 s, and started again.\n\
         A supervisor that gets an error waits 50 ms and sends its next beat.\n\n"
    ));
    if let Some(f) = postgres_outage().await {
        assert_eq!(f.lost, 0, "acknowledged heartbeats lost in the outage");
        assert_eq!(f.other_errors, 0, "every refusal in the outage is a 503");
        assert!(
            f.refused > 0,
            "the outage refused nothing: it was not under load"
        );
        md.push_str("| figure | value |\n| --- | --- |\n");
        for (k, v) in [
            ("heartbeats answered 200", f.acknowledged.to_string()),
            ("stored", f.in_ledger.to_string()),
            ("answered 200 but lost", f.lost.to_string()),
            ("answered 503 (fail fast)", f.refused.to_string()),
            ("answered anything else", f.other_errors.to_string()),
            (
                "median 503 (the breaker open)",
                format!("{} ms", f.median_refusal.as_millis()),
            ),
            (
                "slowest 503 (the pool's acquire timeout, before the breaker opens)",
                format!("{} ms", f.slowest_refusal.as_millis()),
            ),
            (
                "`/readyz` 503 after the stop returned",
                format!("{} ms", f.readyz_down_after.as_millis()),
            ),
            (
                "PostgreSQL down for",
                format!("{} ms", f.down_for.as_millis()),
            ),
            (
                "`/readyz` 200 again after the start returned",
                format!("{} ms", f.ready_again_after.as_millis()),
            ),
            (
                &format!(
                    "{} heartbeats answered 200 again after the start returned",
                    SENDERS * 10
                ),
                format!("{} ms", f.beating_again_after.as_millis()),
            ),
        ] {
            md.push_str(&format!("| {k} | {v} |\n"));
        }
    } else {
        md.push_str("Not run here (no local PostgreSQL cluster).\n");
    }
    md.push_str("\n## Three instances, one killed mid-burst\n\n");
    md.push_str(&format!(
        "Three instances on one PostgreSQL (lease 3 s); {BURST} admissions for new sessions on one key\n\
         (limit {LIMIT}) spread over them at once; the third instance gets SIGKILL once it has\n\
         answered its first. Then, past the lease, 100 more on the two left.\n\n"
    ));
    if let Some(f) = three_instances_one_killed().await {
        assert!(
            f.answered_allow <= LIMIT,
            "over-admitted: {}",
            f.answered_allow
        );
        assert_eq!(
            f.sessions_stored, LIMIT,
            "the slots stored are the limit, exactly"
        );
        assert_eq!(f.allowed_after_lease, LIMIT, "a slot leaked past the lease");
        assert!(f.cut > 0, "the kill cut nothing off: it was not mid-burst");
        md.push_str("| figure | value |\n| --- | --- |\n");
        for (k, v) in [
            ("admissions answered", f.answered.to_string()),
            ("cut off by the kill", f.cut.to_string()),
            ("answered allow", f.answered_allow.to_string()),
            (
                "sessions holding a slot (stored)",
                format!("{} (limit {LIMIT})", f.sessions_stored),
            ),
            (
                "allowed after the lease, of 100",
                format!("{} (limit {LIMIT})", f.allowed_after_lease),
            ),
        ] {
            md.push_str(&format!("| {k} | {v} |\n"));
        }
    } else {
        md.push_str("Not run here (no PostgreSQL).\n");
    }
    md.push_str(&failover_section().await);
    md.push_str(&format!(
        "\nDrills took {:.1} s.\n",
        started.elapsed().as_secs_f64()
    ));
    std::fs::write(
        concat!(env!("CARGO_MANIFEST_DIR"), "/reports/reliability.md"),
        md,
    )
    .unwrap();
}

/// The failover drill (tests/failover), its figures asserted and written as a section.
async fn failover_section() -> String {
    let mut md = String::from("\n## A failover under load\n\n");
    md.push_str(
        "A pg_auto_failover formation (`tests/failover/formation.sh`): a monitor and two\n\
         PostgreSQL 15 nodes with synchronous replication, the monitor's timeouts shortened so\n\
         that the drill fits in CI (a node unhealthy after 3 s without an answer instead of 20 s,\n\
         a lost primary given 4 s to demote itself instead of 30 s). Two instances of the\n\
         service, both given the formation's URL of two hosts\n\
         (`postgres://…@127.0.0.1:p1,127.0.0.1:p2/fo?target_session_attrs=read-write`). The\n\
         load: six supervisors, each on one kept-alive connection, running sessions one after\n\
         another (admitted, 25 heartbeats, parked, resumed, 25 more, parked), four of them on a\n\
         key whose limit is 2; a host's supervisor sending 200 sessions' heartbeats a request\n\
         (about 30 KB) every 100 ms; another one running 40 sessions of an org past its plan\n\
         under a pay-as-you-go cap of 0.20 (200 s); and Stripe delivering a signed subscription event every\n\
         250 ms. Each retries a refused request after 50 ms until it is answered. The steps,\n\
         under that load: the standby's WAL receiver stopped for 0.5 s, so that commits wait\n\
         for it, and then every process of the primary's machine killed with `kill -9` (its\n\
         keeper, the keeper's children and PostgreSQL: the keeper's children alone would start\n\
         PostgreSQL again in place), the receiver let go, and the standby promoted;\n\
         the old primary's keeper started again, which rejoins it as a standby; a planned\n\
         switchover (`pg_autoctl perform switchover`) back to it. Every figure is from the\n\
         drill's own records and the database after the last step.\n\n",
    );
    let Some(f) = failover::drill().await else {
        return md + "Not run here (no pg_auto_failover).\n";
    };
    assert_eq!(f.heartbeats_lost, 0, "acknowledged heartbeats lost");
    assert_eq!(f.decisions_lost, 0, "acknowledged decisions lost");
    assert_eq!(f.seconds_billed_twice, 0, "seconds billed twice");
    for (key, gate, held, limit) in &f.slots {
        assert_eq!(
            gate, held,
            "{key}: slots the gate counts and sessions holding one"
        );
        assert!(gate <= limit, "{key}: over its limit");
    }
    assert_eq!(f.events_lost, 0, "acknowledged Stripe events lost");
    let c = &f.capped;
    assert!(
        c.cap_reached,
        "the capped org did not reach its cap: {}",
        c.spent
    );
    assert_eq!(
        (c.spent.as_str(), c.billed.as_str()),
        (c.cap, c.cap),
        "the cap holds to the cent"
    );
    assert_eq!(f.server_errors, 0, "answered 5xx other than 503");
    assert!(
        f.unexpected.is_empty(),
        "answers other than 2xx and 503: {:?}",
        f.unexpected
    );
    assert_eq!(f.closed, 0, "kept-alive connections closed by the service");
    assert_eq!(f.hung, 0, "requests unanswered for 30 s");
    assert!(
        f.refused_503 > 0,
        "nothing was refused: the failover was not under load"
    );
    assert!(
        f.in_flight > 0,
        "no write was in flight when the primary was lost"
    );
    assert_eq!(
        f.in_flight_503, f.in_flight,
        "a write in flight when the primary was lost is a 503"
    );
    md.push_str("| step | new primary takes writes after | first write answered 2xx after that | writes refused for (last 2xx before to first after) |\n| --- | --- | --- | --- |\n");
    for s in &f.steps {
        md.push_str(&format!(
            "| {} | {} ms | {} ms | {} ms |\n",
            s.name,
            s.to_writable.as_millis(),
            s.to_first_ok.as_millis(),
            s.writes_refused_for.as_millis()
        ));
    }
    md.push_str("\n| figure | value |\n| --- | --- |\n");
    let slots = f
        .slots
        .iter()
        .map(|(k, gate, held, limit)| format!("{k}: {gate} counted, {held} held (limit {limit})"))
        .collect::<Vec<_>>()
        .join("; ");
    for (k, v) in [
        ("heartbeats answered 200", f.heartbeats_acked.to_string()),
        ("of them lost", f.heartbeats_lost.to_string()),
        ("decisions answered", f.decisions_acked.to_string()),
        ("of them lost", f.decisions_lost.to_string()),
        ("seconds billed", f.seconds_billed.to_string()),
        ("seconds billed twice (a session billed past its life, or the hourly totals off the sessions')", f.seconds_billed_twice.to_string()),
        ("slots after the last step: the gate's count, the supervisors' sessions", slots),
        (
            "an org run past its plan (`mini`, 180 s a week) by 40 sessions under a pay-as-you-go cap",
            format!(
                "cap {}; spent {}; billed {}; {} s used",
                c.cap, c.spent, c.billed, c.used_seconds
            ),
        ),
        ("Stripe events answered 2xx", f.events_acked.to_string()),
        ("of them lost", f.events_lost.to_string()),
        ("answers", f.answers.to_string()),
        ("answered 503 `unavailable` (retried)", f.refused_503.to_string()),
        ("answered 500 (or any 5xx but 503)", f.server_errors.to_string()),
        ("answered anything else but 2xx", f.unexpected.len().to_string()),
        ("requests cut off without an answer (retried)", f.cut.to_string()),
        ("kept-alive connections closed by the service", f.closed.to_string()),
        ("`synchronous_standby_names` on the primary", format!("`{}`", f.synchronous)),
        ("writes in flight when the primary was lost (sent before, answered after)", f.in_flight.to_string()),
        ("of them answered 503 `unavailable`", f.in_flight_503.to_string()),
        ("requests answered 503 or cut whose retry found them applied (the commit's outcome unknown to the service)", f.applied_before.to_string()),
        ("drill took, with the formation's setup", format!("{:.1} s", f.took.as_secs_f64())),
    ] {
        md.push_str(&format!("| {k} | {v} |\n"));
    }
    md
}
