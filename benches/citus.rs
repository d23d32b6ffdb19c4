//! The hot paths on a real Citus cluster beside one PostgreSQL, in one run: p50 and p99 of
//! sequential admissions of new sessions, single heartbeats, requests of 100 heartbeats of
//! many orgs and the usage page; admissions a second at 8 and 32 callers; and on the
//! cluster, the worker transactions each request costs. Rounds interleave the two stores
//! (one PostgreSQL, then the cluster, path by path), so the machine's drift falls on both.
//! Writes reports/citus.md; readings are in reports/citus-notes.md.
//!
//! Run, with a cluster from ../shared/citus/cluster.sh (docs/operations.md):
//! `RUSH_METER_TEST_CITUS=postgres://postgres@127.0.0.1:5441 cargo bench --bench citus`
//! (one PostgreSQL at RUSH_METER_TEST_PG, default 127.0.0.1:5432). `-- 1` runs one round.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::harness::citus;
use common::{wrk, Options, Server, ADMIN};
use serde_json::{json, Value};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Orgs on the Team plan, and keys over them (10 a org), as benches/admission.rs.
const ORGS: usize = 100;
const KEYS: usize = 1000;
/// Sequential requests a path a round.
const REQUESTS: usize = 200;
const ROUNDS: usize = 5;
/// Seconds each throughput load runs.
const MEASURE: u64 = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Store {
    OnePostgres,
    Citus,
}

impl Store {
    fn label(self) -> &'static str {
        match self {
            Store::OnePostgres => "one PostgreSQL",
            Store::Citus => "Citus",
        }
    }
}

/// What one path measured on one store in one round.
#[derive(Clone, Copy, Debug, Default)]
struct Reading {
    p50: Duration,
    p99: Duration,
    /// Worker transactions a request (the cluster only).
    worker_tx: Option<f64>,
    /// Requests a second (the throughput loads only).
    rate: Option<f64>,
}

/// A server over a fresh, fsynced database of `store` (the cluster's with production's
/// 32 shards), its orgs and keys made (as benches/admission.rs makes them); and the
/// database's name on the cluster.
async fn start(store: Store, coordinator: &str, plans: &tempfile::TempDir) -> (Server, String) {
    let name = format!("rm_test_{:016x}", rand::random::<u64>());
    let url = match store {
        Store::OnePostgres => common::harness::postgres_database(true)
            .await
            .expect("PostgreSQL for the benchmark"),
        Store::Citus => {
            citus::database_of_shards(coordinator, &name, true, citus::PRODUCTION_SHARDS).await
        }
    };
    let opts = Options {
        system_clock: true,
        plans_dir: plans.path().to_path_buf(),
        ..common::bench_options()
    };
    let server = Server::start_on(common::Backend::Postgres, url, None, opts).await;
    common::create_orgs(&server, ORGS, common::Funding::Plan).await;
    for k in 0..KEYS {
        server
            .admin(
                "PUT",
                &format!("/v1/orgs/org_{}/keys/k{k}", k % ORGS),
                Some(json!({"concurrency_limit": 100})),
            )
            .await;
    }
    (server, name)
}

fn sent_at() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn admission(i: usize, round: usize) -> Value {
    json!({
        "org_id": format!("org_{}", i % ORGS),
        "key_id": format!("k{}", i % KEYS),
        "session_id": format!("c{round}_{i}"),
        "agent": "claude",
        "project_id": "web",
        "started_by": "u1",
    })
}

fn heartbeat(i: usize, round: usize, seq: usize) -> Value {
    json!({
        "org_id": format!("org_{}", i % ORGS),
        "session_id": format!("c{round}_{i}"),
        "vm_id": format!("vm_{i}"),
        "seq": seq,
        "state": "running",
        "sent_at": sent_at(),
    })
}

/// The paths, in the order each round measures them: `(name, request i of the round)`.
const PATHS: [&str; 4] = [
    "admission of a new session",
    "one heartbeat",
    "100 heartbeats of 100 orgs",
    "usage page",
];

/// Send request `i` of `path`, answered 200.
async fn send(server: &Server, path: &str, i: usize, round: usize) {
    let (method, route, body) = match path {
        "admission of a new session" => {
            ("POST", "/v1/admissions".into(), Some(admission(i, round)))
        }
        "one heartbeat" => (
            "POST",
            "/v1/heartbeats".into(),
            Some(json!({"heartbeats": [heartbeat(i, round, 1)]})),
        ),
        "100 heartbeats of 100 orgs" => {
            let beats: Vec<Value> = (0..100)
                .map(|k| {
                    heartbeat(
                        (i * 100 + k) % REQUESTS,
                        round,
                        2 + (i * 100 + k) / REQUESTS,
                    )
                })
                .collect();
            (
                "POST",
                "/v1/heartbeats".into(),
                Some(json!({"heartbeats": beats})),
            )
        }
        _ => ("GET", format!("/v1/orgs/org_{}/usage", i % ORGS), None),
    };
    let (status, v) = server
        .call(method, &route, Some(ADMIN), body.as_ref())
        .await;
    assert_eq!(status, 200, "{method} {route}: {v}");
}

/// `REQUESTS` sequential requests of `path`: their latencies.
async fn sequential(server: &Server, path: &str, round: usize) -> Reading {
    let mut samples = Vec::with_capacity(REQUESTS);
    for i in 0..REQUESTS {
        let t = Instant::now();
        send(server, path, i, round).await;
        samples.push(t.elapsed());
    }
    let (p50, p99) = common::percentiles(samples);
    Reading {
        p50,
        p99,
        worker_tx: None,
        rate: None,
    }
}

/// The workers' transaction count once every backend that worked has reported it; `None`
/// on one PostgreSQL.
async fn worker_tx(store: Store, (coordinator, name): (&str, &str)) -> Option<i64> {
    if store != Store::Citus {
        return None;
    }
    // A backend reports its counts within 10 s of going idle (PGSTAT_IDLE_INTERVAL).
    tokio::time::sleep(Duration::from_secs(11)).await;
    Some(citus::worker_transactions(coordinator, name).await)
}

/// Admissions a second at `callers` (wrk, benches/wrk/admissions.lua).
async fn throughput(server: &Server, callers: usize) -> Reading {
    let threads = callers.min(2);
    let w = wrk(
        format!("{}/v1/admissions", server.url),
        "admissions.lua",
        threads,
        callers,
        MEASURE,
        vec![KEYS.to_string(), ORGS.to_string(), ADMIN.to_string()],
    )
    .await;
    assert_eq!(w.errors, 0, "admissions refused at {callers} callers");
    Reading {
        p50: w.p50,
        p99: w.p99,
        worker_tx: None,
        rate: Some(w.requests as f64 / w.elapsed.as_secs_f64()),
    }
}

type Readings = BTreeMap<(String, Store), Vec<Reading>>;

/// One round: each store in turn, every path on it.
async fn round(round: usize, coordinator: &str, plans: &tempfile::TempDir, out: &mut Readings) {
    for store in [Store::OnePostgres, Store::Citus] {
        let (server, name) = start(store, coordinator, plans).await;
        let db = (coordinator, name.as_str());
        let mut mark = worker_tx(store, db).await;
        for path in PATHS {
            let mut r = sequential(&server, path, round).await;
            let now = worker_tx(store, db).await;
            r.worker_tx = mark.zip(now).map(|(b, a)| (a - b) as f64 / REQUESTS as f64);
            mark = now;
            eprintln!(
                "round {round}: {} {path}: p50 {:?} p99 {:?} worker tx {:?}",
                store.label(),
                r.p50,
                r.p99,
                r.worker_tx
            );
            out.entry((path.to_owned(), store)).or_default().push(r);
        }
        for callers in [8, 32] {
            let r = throughput(&server, callers).await;
            eprintln!(
                "round {round}: {} {callers} callers: {:.0}/s",
                store.label(),
                r.rate.unwrap_or(0.0)
            );
            out.entry((format!("admissions at {callers} callers"), store))
                .or_default()
                .push(r);
        }
        server.finish().await;
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

/// The median of `xs`, and all of them in brackets.
fn median_and_spread(mut xs: Vec<f64>, show: impl Fn(f64) -> String) -> (f64, String) {
    let all = xs.iter().map(|x| show(*x)).collect::<Vec<_>>().join(", ");
    xs.sort_by(f64::total_cmp);
    let m = xs[xs.len() / 2];
    (m, format!("{} ({all})", show(m)))
}

fn report(readings: &Readings, rounds: usize) -> String {
    let mut out = format!(
        "# Citus beside one PostgreSQL\n\n\
         The service's hot paths on a Citus 13.2.2 cluster (a coordinator and two workers on this\n\
         machine, 32 shards a table, distributed by migrations/citus/distribute.sql) and on one\n\
         PostgreSQL, measured in one run, the two interleaved path by path for {rounds} rounds.\n\
         Sequential paths: {REQUESTS} requests each a round, one after another over one\n\
         connection; {ORGS} orgs on the Team plan, {KEYS} keys. Figures are medians of the\n\
         rounds (each round's in brackets). Worker transactions are the workers'\n\
         `pg_stat_database` counts over a path's requests, divided by them. Readings:\n\
         reports/citus-notes.md.\n\n\
         - Command: `RUSH_METER_TEST_CITUS=postgres://postgres@127.0.0.1:5441 cargo bench --bench citus`\n\
         - Machine: {}\n- Date: {}\n\n\
         | path | one PostgreSQL p50 ms | p99 ms | Citus p50 ms | p99 ms | Citus / one | worker transactions a request |\n\
         | --- | --- | --- | --- | --- | --- | --- |\n",
        common::machine(),
        chrono::Utc::now().format("%Y-%m-%d"),
    );
    for path in PATHS {
        let of = |s: Store| &readings[&(path.to_owned(), s)];
        let p = |s: Store, f: fn(&Reading) -> Duration| {
            median_and_spread(of(s).iter().map(|r| f(r).as_secs_f64()).collect(), |x| {
                ms(Duration::from_secs_f64(x))
            })
        };
        let (pg50, pg50s) = p(Store::OnePostgres, |r| r.p50);
        let (_, pg99s) = p(Store::OnePostgres, |r| r.p99);
        let (c50, c50s) = p(Store::Citus, |r| r.p50);
        let (_, c99s) = p(Store::Citus, |r| r.p99);
        let (_, tx) = median_and_spread(
            of(Store::Citus)
                .iter()
                .filter_map(|r| r.worker_tx)
                .collect(),
            |x| format!("{x:.1}"),
        );
        out += &format!(
            "| {path} | {pg50s} | {pg99s} | {c50s} | {c99s} | **{:.1}×** | {tx} |\n",
            c50 / pg50
        );
    }
    out += "\n| load | one PostgreSQL a second | Citus a second | Citus / one |\n| --- | --- | --- | --- |\n";
    for callers in [8, 32] {
        let load = format!("admissions at {callers} callers");
        let rate = |s: Store| {
            median_and_spread(
                readings[&(load.clone(), s)]
                    .iter()
                    .filter_map(|r| r.rate)
                    .collect(),
                |x| format!("{x:.0}"),
            )
        };
        let ((pg, pgs), (c, cs)) = (rate(Store::OnePostgres), rate(Store::Citus));
        out += &format!("| {load} | {pgs} | {cs} | **{:.2}** |\n", c / pg);
    }
    out
}

fn main() {
    let coordinator = citus::coordinator().expect(
        "RUSH_METER_TEST_CITUS names the coordinator of a cluster from ../shared/citus/cluster.sh",
    );
    let rounds = common::only_backend()
        .and_then(|r| r.parse().ok())
        .unwrap_or(ROUNDS);
    let plans = common::funded_plans();
    let mut readings = Readings::new();
    common::runtime().block_on(async {
        for r in 1..=rounds {
            round(r, &coordinator, &plans, &mut readings).await;
        }
    });
    let text = report(&readings, rounds);
    print!("{text}");
    if rounds >= ROUNDS {
        std::fs::write(
            concat!(env!("CARGO_MANIFEST_DIR"), "/reports/citus.md"),
            text,
        )
        .expect("write reports/citus.md");
    }
}
