//! Fault drills against the real binary, with their figures written to
//! reports/reliability.md (`cargo test --test drills`; CI runs it).
//!
//! - `kill -9` under heartbeat load: every heartbeat answered 200 is in the ledger after
//!   a restart, on SQLite and on PostgreSQL.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
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

/// Load the service, SIGKILL it, restart it on the same database and count.
async fn kill_nine(backend: Backend) -> Option<KillFigures> {
    let (url, _dir) = fresh_database(backend).await?;
    let (mut child, base) = spawn_service_with(&url, TOKEN, ENV).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
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
    let stop = Arc::new(AtomicBool::new(false));
    let mut senders = Vec::new();
    for w in 0..SENDERS {
        let (client, base, stop) = (client.clone(), base.clone(), Arc::clone(&stop));
        senders.push(tokio::spawn(async move {
            // The highest seq answered 200, and whether a request was cut off unanswered.
            let mut acked = 0;
            let mut seq = 0;
            while !stop.load(Ordering::Relaxed) {
                seq += 1;
                let now = chrono::Utc::now().timestamp();
                let sent = client
                    .post(format!("{base}/v1/heartbeats"))
                    .bearer_auth(TOKEN)
                    .json(&json!({"heartbeats": [hb("acme", &format!("drill_{w}"), seq, "running", now)]}))
                    .send()
                    .await;
                match sent {
                    Ok(r) if r.status() == 200 => acked = seq,
                    Ok(r) => panic!("heartbeat answered {} before the kill", r.status()),
                    Err(_) => return (acked, true),
                }
            }
            (acked, false)
        }));
    }
    tokio::time::sleep(LOAD).await;
    // SIGKILL: no graceful shutdown, no flush; whatever was committed is all there is.
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    stop.store(true, Ordering::Relaxed);
    let mut acked = Vec::new();
    let mut unanswered = 0;
    for s in senders {
        let (a, cut) = s.await.unwrap();
        acked.push(a);
        unanswered += usize::from(cut);
    }
    let (_child, base) = spawn_service_with(&url, TOKEN, ENV).await;
    let (mut acknowledged, mut in_ledger, mut lost) = (0, 0, 0);
    for (w, a) in acked.iter().enumerate() {
        let r = client
            .get(format!("{base}/v1/sessions/drill_{w}"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        let stored = if r.status() == 404 {
            0
        } else {
            let v: serde_json::Value = r.json().await.unwrap();
            v["heartbeats"].as_i64().unwrap()
        };
        // Seqs go 1, 2, 3…: each applied beat counts once, so `stored` covers 1..=stored.
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
    for backend in [Backend::Sqlite, Backend::Postgres] {
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
