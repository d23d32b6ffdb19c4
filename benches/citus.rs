//! The hot paths on a real Citus cluster beside one PostgreSQL, in one run: p50 and p99 of
//! sequential admissions of new sessions, single heartbeats, requests of 100 heartbeats of
//! many orgs and the usage page; admissions a second at 8 and 32 callers, and heartbeats a
//! second in requests of 100 at 8 and 32, with the CPU each costs the database servers and the
//! service; on the cluster, the worker transactions each request costs; and the floor, an
//! admission's statements sent as raw SQL on the same databases (what the machine allows
//! the same round trips, service aside). Rounds interleave the two stores (one PostgreSQL,
//! then the cluster, path by path), so the machine's drift falls on both. Writes
//! reports/citus.md; readings are in reports/citus-notes.md.
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
    /// CPU milliseconds a request (the throughput loads only).
    cpu: Option<Cpu>,
}

/// CPU milliseconds a request, by process: the database the service connects to (one
/// PostgreSQL, or the coordinator), the workers (the cluster only) and the service.
#[derive(Clone, Copy, Debug, Default)]
struct Cpu {
    front: f64,
    workers: f64,
    service: f64,
}

/// Fields of `/proc/<pid>/stat` after the command name (whose parentheses may hold
/// spaces): state, ppid, …; `None` once the process is gone.
fn stat_fields(pid: &str) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// CPU seconds of a process from its stat fields (utime and stime, with `reaped` its
/// waited-for children's too). /proc counts USER_HZ ticks, which Linux fixes at 100.
fn cpu_of(fields: &[String], reaped: bool) -> f64 {
    let n = if reaped { 4 } else { 2 };
    let ticks: u64 = fields[11..11 + n]
        .iter()
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    ticks as f64 / 100.0
}

/// CPU seconds so far of the PostgreSQL server whose postmaster is `pid`: its own, its
/// exited backends' (which it reaped) and its live backends'.
fn server_cpu(pid: u32) -> f64 {
    let pid = pid.to_string();
    let mut sum = stat_fields(&pid).map_or(0.0, |f| cpu_of(&f, true));
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Some(f) = stat_fields(&name).filter(|f| f[1] == pid) {
            sum += cpu_of(&f, false);
        }
    }
    sum
}

/// The postmaster of the server at `url`: the parent of a backend of it.
async fn postmaster_of(url: &str) -> u32 {
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(url)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let fields = stat_fields(&backend.to_string()).expect("the backend's /proc entry");
    fields[1].parse().expect("a parent pid")
}

/// The postmasters of a store's database servers: the one the service connects to, then
/// the workers.
async fn postmasters(store: Store, coordinator: &str) -> Vec<u32> {
    let urls = match store {
        Store::OnePostgres => vec![common::harness::pg_base_url()],
        Store::Citus => citus::node_urls(coordinator),
    };
    let mut pids = Vec::with_capacity(urls.len());
    for url in urls {
        pids.push(postmaster_of(&url).await);
    }
    pids
}

/// CPU seconds so far: each server of `postmasters`, then this process (the service).
fn cpu_now(postmasters: &[u32]) -> Vec<f64> {
    let mut v: Vec<f64> = postmasters.iter().map(|p| server_cpu(*p)).collect();
    v.push(stat_fields("self").map_or(0.0, |f| cpu_of(&f, false)));
    v
}

/// A server over a fresh, fsynced database of `store` (the cluster's with production's
/// 32 shards), its orgs and keys made (as benches/admission.rs makes them); the
/// database's name on the cluster, and its URL.
async fn start(
    store: Store,
    coordinator: &str,
    plans: &tempfile::TempDir,
) -> (Server, String, String) {
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
    let server = Server::start_on(common::Backend::Postgres, url.clone(), None, opts).await;
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
    (server, name, url)
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

/// The floor's path: an admission's round trips as raw SQL.
const FLOOR: &str = "an admission's statements as raw SQL (the floor)";

/// Seconds the floor runs sequentially, for about as many transactions as `REQUESTS`.
const FLOOR_SECS: u64 = 2;

/// The floor one transaction after another: benches/raw/admission.sql (the admission
/// benchmark's raw transaction: BEGIN, the key's lock, the org's row, the key's slots,
/// the windows' sums, the session, the decision, COMMIT) by pgbench on one connection;
/// its latencies and how many ran.
async fn floor(url: &str) -> (Reading, usize) {
    let raw = common::raw_admissions(url, 1, FLOOR_SECS, (ORGS, KEYS), "prepared").await;
    let reading = Reading {
        p50: raw.p50,
        p99: raw.p99,
        ..Reading::default()
    };
    (reading, raw.transactions)
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
        ..Reading::default()
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

/// A load of many callers at once.
#[derive(Clone, Copy)]
enum Load {
    /// Admissions of new sessions of random keys (benches/wrk/admissions.lua).
    Admissions(usize),
    /// Requests of 100 heartbeats of 100 orgs each, as a host's supervisor sends them
    /// (benches/wrk/heartbeats.lua; each thread's sessions made by their first beats).
    Heartbeats(usize),
    /// The floor's transactions (`floor`), each caller on a connection of its own: what
    /// the database servers spend on an admission's statements, service aside.
    Floor(usize),
}

/// Heartbeats a request, and sessions a wrk thread, of `Load::Heartbeats`.
const BATCH: usize = 100;
const SESSIONS_PER_THREAD: usize = 4000;

impl Load {
    const ALL: [Load; 5] = [
        Load::Admissions(8),
        Load::Admissions(32),
        Load::Floor(8),
        Load::Heartbeats(8),
        Load::Heartbeats(32),
    ];

    fn label(self) -> String {
        match self {
            Load::Admissions(c) => format!("admissions at {c} callers"),
            Load::Heartbeats(c) => format!("heartbeats in requests of {BATCH} at {c} callers"),
            Load::Floor(c) => format!("the floor's transactions at {c} callers"),
        }
    }

    /// What a request of it carries.
    fn items(self) -> usize {
        match self {
            Load::Admissions(_) | Load::Floor(_) => 1,
            Load::Heartbeats(_) => BATCH,
        }
    }
}

/// What a load did: requests, their latencies' p50 and p99, and how long it ran.
struct Done {
    requests: u64,
    p50: Duration,
    p99: Duration,
    elapsed: Duration,
}

/// `load` through the service, by wrk.
async fn by_wrk(server: &Server, load: Load) -> Done {
    let (route, script, callers, args) = match load {
        Load::Admissions(c) => (
            "admissions",
            "admissions.lua",
            c,
            vec![KEYS.to_string(), ORGS.to_string(), ADMIN.to_string()],
        ),
        Load::Heartbeats(c) => (
            "heartbeats",
            "heartbeats.lua",
            c,
            vec![
                BATCH.to_string(),
                SESSIONS_PER_THREAD.to_string(),
                ORGS.to_string(),
                ADMIN.to_string(),
            ],
        ),
        Load::Floor(_) => unreachable!("the floor runs without the service"),
    };
    let w = wrk(
        format!("{}/v1/{route}", server.url),
        script,
        callers.min(2),
        callers,
        MEASURE,
        args,
    )
    .await;
    assert_eq!(w.errors, 0, "{} refused", load.label());
    Done {
        requests: w.requests,
        p50: w.p50,
        p99: w.p99,
        elapsed: w.elapsed,
    }
}

/// Items (admissions, heartbeats or the floor's transactions) a second under `load`, and
/// the CPU each cost the database servers of `postmasters` and the service.
async fn throughput(server: &Server, url: &str, load: Load, postmasters: &[u32]) -> Reading {
    let before = cpu_now(postmasters);
    let done = match load {
        Load::Floor(c) => {
            let raw = common::raw_admissions(url, c, MEASURE, (ORGS, KEYS), "prepared").await;
            Done {
                requests: raw.transactions as u64,
                p50: raw.p50,
                p99: raw.p99,
                elapsed: Duration::from_secs(MEASURE),
            }
        }
        _ => by_wrk(server, load).await,
    };
    let items = done.requests as f64 * load.items() as f64;
    let spent: Vec<f64> = cpu_now(postmasters)
        .iter()
        .zip(&before)
        .map(|(a, b)| (a - b) * 1000.0 / items)
        .collect();
    let last = spent.len() - 1;
    Reading {
        p50: done.p50,
        p99: done.p99,
        worker_tx: None,
        rate: Some(items / done.elapsed.as_secs_f64()),
        cpu: Some(Cpu {
            front: spent[0],
            workers: spent[1..last].iter().sum::<f64>().max(0.0),
            service: spent[last],
        }),
    }
}

type Readings = BTreeMap<(String, Store), Vec<Reading>>;

/// One round: each store in turn, every path on it.
async fn round(round: usize, coordinator: &str, plans: &tempfile::TempDir, out: &mut Readings) {
    for store in [Store::OnePostgres, Store::Citus] {
        let (server, name, url) = start(store, coordinator, plans).await;
        let db = (coordinator, name.as_str());
        let pids = postmasters(store, coordinator).await;
        let mut mark = worker_tx(store, db).await;
        for path in PATHS.into_iter().chain([FLOOR]) {
            let (mut r, requests) = if path == FLOOR {
                floor(&url).await
            } else {
                (sequential(&server, path, round).await, REQUESTS)
            };
            let now = worker_tx(store, db).await;
            r.worker_tx = mark.zip(now).map(|(b, a)| (a - b) as f64 / requests as f64);
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
        for load in Load::ALL {
            let r = throughput(&server, &url, load, &pids).await;
            eprintln!(
                "round {round}: {} {}: {:.0}/s, CPU {:?}",
                store.label(),
                load.label(),
                r.rate.unwrap_or(0.0),
                r.cpu
            );
            out.entry((load.label(), store)).or_default().push(r);
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
         `pg_stat_database` counts over a path's requests, divided by them. The last row is\n\
         the floor: benches/raw/admission.sql (the admission benchmark's raw transaction: the\n\
         key's lock, three reads, two inserts, in one transaction) by pgbench, its statements\n\
         prepared as the service's are, for {FLOOR_SECS} s on one connection, without the\n\
         service; its ratio is what this machine allows a transaction of that many statements\n\
         through the coordinator. Readings: reports/citus-notes.md.\n\n\
         - Command: `RUSH_METER_TEST_CITUS=postgres://postgres@127.0.0.1:5441 cargo bench --bench citus`\n\
         - Machine: {}\n- Date: {}\n\n\
         | path | one PostgreSQL p50 ms | p99 ms | Citus p50 ms | p99 ms | Citus / one | worker transactions a request |\n\
         | --- | --- | --- | --- | --- | --- | --- |\n",
        common::machine(),
        chrono::Utc::now().format("%Y-%m-%d"),
    );
    for path in PATHS.into_iter().chain([FLOOR]) {
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
    for load in Load::ALL {
        let rate = |s: Store| {
            median_and_spread(
                readings[&(load.label(), s)]
                    .iter()
                    .filter_map(|r| r.rate)
                    .collect(),
                |x| format!("{x:.0}"),
            )
        };
        let ((pg, pgs), (c, cs)) = (rate(Store::OnePostgres), rate(Store::Citus));
        out += &format!("| {} | {pgs} | {cs} | **{:.2}** |\n", load.label(), c / pg);
    }
    out += "\nCPU an item (an admission, a heartbeat, a floor transaction) under each load, in \
            ms (medians of the rounds): the database the service connects to (one PostgreSQL, or \
            the coordinator), the workers, and the service (the bench's own process, which serves \
            it; for the floor, which pgbench sends, nothing):\n\n\
            | load | store | database connected to | workers | service | all |\n\
            | --- | --- | --- | --- | --- | --- |\n";
    for load in Load::ALL {
        for store in [Store::OnePostgres, Store::Citus] {
            let cpus: Vec<Cpu> = readings[&(load.label(), store)]
                .iter()
                .filter_map(|r| r.cpu)
                .collect();
            let m = |f: fn(&Cpu) -> f64| {
                median_and_spread(cpus.iter().map(f).collect(), |x| format!("{x:.3}")).1
            };
            out += &format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                load.label(),
                store.label(),
                m(|c| c.front),
                match store {
                    Store::OnePostgres => "—".to_owned(),
                    Store::Citus => m(|c| c.workers),
                },
                m(|c| c.service),
                m(|c| c.front + c.workers + c.service),
            );
        }
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
