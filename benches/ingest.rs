//! Durable heartbeat ingest over HTTP, on PostgreSQL and SQLite, in batches of 1 and 100.
//!
//! `cargo bench --bench ingest` writes `reports/ingest.md`. PostgreSQL is the machine's
//! (`RUSH_METER_TEST_PG`, default postgres://postgres@127.0.0.1:5432), with its default
//! `synchronous_commit = on`: every acknowledged heartbeat is fsynced. SQLite runs in WAL
//! with `synchronous = FULL`. The load generator is wrk (`apt-get install wrk`), on the same
//! two cores: the figures are what this machine does with client and server together.

mod common;

use std::time::Duration;

use common::{wrk, Backend, Funding, ADMIN};

// The allocator of the `rush-meter` binary, so the server measured here is the one shipped.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ORGS: usize = 50;
const WARMUP: Duration = Duration::from_secs(4);
/// Sessions each wrk thread cycles through: more than it ever has in flight at once.
const SESSIONS_PER_THREAD: usize = 5000;
const MEASURE: Duration = Duration::from_secs(12);
/// Rounds of each load, the two fundings interleaved, so that the machine's drift falls on
/// both alike; a row's figures are its median round's.
const ROUNDS: usize = 3;

struct Outcome {
    backend: Backend,
    funding: Funding,
    batch: usize,
    clients: usize,
    rows: u64,
    requests: u64,
    errors: u64,
    elapsed: Duration,
    p50: Duration,
    p99: Duration,
    mean_group: f64,
}

async fn run(backend: Backend, batch: usize, clients: usize, funding: Funding) -> Outcome {
    let plans = common::funded_plans();
    let server = common::start_funded(backend, &plans).await;
    common::create_orgs(&server, ORGS, funding).await;
    let url = format!("{}/v1/heartbeats", server.url);
    let args = || {
        vec![
            batch.to_string(),
            SESSIONS_PER_THREAD.to_string(),
            ORGS.to_string(),
            ADMIN.to_string(),
        ]
    };
    // Warm-up: every session exists and is running before the measured run.
    wrk(
        url.clone(),
        "heartbeats.lua",
        2,
        clients,
        WARMUP.as_secs(),
        args(),
    )
    .await;
    let sum = "rush_meter_ingest_group_requests_sum";
    let count = "rush_meter_ingest_group_requests_count";
    let before = (server.metric(sum).await, server.metric(count).await);
    let w = wrk(url, "heartbeats.lua", 2, clients, MEASURE.as_secs(), args()).await;
    let after = (server.metric(sum).await, server.metric(count).await);
    server.finish().await;
    Outcome {
        backend,
        funding,
        batch,
        clients,
        rows: w.requests * batch as u64,
        requests: w.requests,
        errors: w.errors,
        elapsed: w.elapsed,
        p50: w.p50,
        p99: w.p99,
        mean_group: (after.0 - before.0) / (after.1 - before.1).max(1.0),
    }
}

fn main() {
    let rt = common::runtime();
    let only = common::only_backend();
    let mut outcomes = Vec::new();
    for (backend, batch, clients) in [
        (Backend::Postgres, 100, 16),
        (Backend::Postgres, 1, 128),
        (Backend::Sqlite, 100, 16),
        (Backend::Sqlite, 1, 128),
    ] {
        if !common::wanted(only.as_deref(), backend) {
            continue;
        }
        for _ in 0..ROUNDS {
            for funding in Funding::BOTH {
                let o = rt.block_on(run(backend, batch, clients, funding));
                eprintln!(
                    "{:?} batch {} ({}): {:.0} rows/s, {:.0} requests/s, p50 {:?}, p99 {:?}, {} errors, {:.1} requests per commit",
                    o.backend, o.batch, funding.label(), o.rows as f64 / o.elapsed.as_secs_f64(), o.requests as f64 / o.elapsed.as_secs_f64(), o.p50, o.p99, o.errors, o.mean_group
                );
                outcomes.push(o);
            }
        }
    }
    let rate = |o: &Outcome| o.rows as f64 / o.elapsed.as_secs_f64();
    // Each load and funding: its rounds' rates, and its median round.
    let mut rows: Vec<(&Outcome, Vec<f64>)> = Vec::new();
    for o in &outcomes {
        let same =
            |b: &&Outcome| b.backend == o.backend && b.batch == o.batch && b.funding == o.funding;
        if rows.iter().any(|(r, _)| same(r)) {
            continue;
        }
        let mut runs: Vec<&Outcome> = outcomes.iter().filter(same).collect();
        let rates: Vec<f64> = runs.iter().map(|r| rate(r)).collect();
        runs.sort_by(|a, b| rate(a).total_cmp(&rate(b)));
        rows.push((runs[runs.len() / 2], rates));
    }
    let mut md = String::new();
    md.push_str("# Heartbeat ingest\n\n");
    md.push_str(
        "Durable heartbeat ingest over HTTP: each `POST /v1/heartbeats` is answered after its\n",
    );
    md.push_str(
        "heartbeats are committed (PostgreSQL `synchronous_commit = on`; SQLite WAL with\n",
    );
    md.push_str(
        "`synchronous = FULL`). Every heartbeat is new (no duplicates) and advances a running\n",
    );
    md.push_str(
        "session, so each one books time into the hourly rollups. Concurrent requests share\n",
    );
    md.push_str("commits (group commit, `src/app/ingest.rs`).\n\n");
    md.push_str(&common::provenance(
        "ingest",
        &format!(
            "wrk (2 threads, `benches/wrk/heartbeats.lua`) on the same two cores as the server, {} orgs (on the Team plan, or past a spent plan: see below), {} s warm-up, {} s measured, {} rounds of each with the two fundings interleaved (the median round's figures, each round's rate in brackets)",
            ORGS,
            WARMUP.as_secs(),
            MEASURE.as_secs(),
            ROUNDS
        ),
    ));
    md.push_str("| backend | heartbeats a request | concurrent clients | funded by | heartbeats/s | against the plan's | requests/s | p50 | p99 | errors | requests per commit |\n");
    md.push_str("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (o, rates) in &rows {
        let base = rows
            .iter()
            .find(|(b, _)| {
                b.backend == o.backend && b.batch == o.batch && b.funding == Funding::Plan
            })
            .map_or(rate(o), |(b, _)| rate(b));
        let each: Vec<String> = rates.iter().map(|r| format!("{r:.0}")).collect();
        md.push_str(&format!(
            "| {:?} | {} | {} | {} | {:.0} ({}) | {:.2} | {:.0} | {:.1} ms | {:.1} ms | {} | {:.1} |\n",
            o.backend,
            o.batch,
            o.clients,
            o.funding.label(),
            rate(o),
            each.join(", "),
            rate(o) / base,
            o.requests as f64 / o.elapsed.as_secs_f64(),
            o.p50.as_secs_f64() * 1e3,
            o.p99.as_secs_f64() * 1e3,
            o.errors,
            o.mean_group
        ));
    }
    md.push_str(concat!(
        "\nFunded by: `plan` is 50 Team orgs well within their plan; `grants and pay-as-you-go` ",
        "is 50 orgs past a plan spent at once, half on a 100,000-hour grant and half paying as ",
        "they go under a high cap, so that every second booked is attributed past the plan ",
        "(issue 14: at least 0.9 of the plan's rate, measured in the same run).\n",
    ));
    md.push_str("\nTargets (issue 2): batches of 100 on PostgreSQL at least 55,000 heartbeats/s (half of raw\n");
    md.push_str(
        "PostgreSQL's ~110k rows/s in 100-row INSERTs here); single-heartbeat requests at least\n",
    );
    md.push_str("28,000/s (twice raw PostgreSQL's ~14k one-row commits/s).\n\n");
    md.push_str(concat!(
        "## Where the time goes\n\n",
        "- Batches of 100 on PostgreSQL meet the target. Each group is one transaction of four\n",
        "  round trips: BEGIN, lock the sessions (`= ANY($1) … FOR UPDATE`), one statement that\n",
        "  writes session rows, both rollups and closed spans through UNNEST arrays, COMMIT.\n",
        "- Single-heartbeat requests on PostgreSQL are about 1.2 times raw PostgreSQL's one-row\n",
        "  commits, short of the 2 times aimed for. Profiles (`perf record -a`) show the two cores\n",
        "  busy with PostgreSQL backends (planning and executing the group's statements), the HTTP\n",
        "  stack on both ends of loopback, and wrk, with 10-20% idle: the four writers' commits\n",
        "  wait on each other and on scheduling more than on the disk (fsync is ~0.1 ms here).\n",
        "  Tried and measured: 2 and 8 writers (both slower than 4), per-writer shards of the\n",
        "  hourly org rollup (no lock waits between writers of one instance; kept), one statement\n",
        "  for all writes (kept). Next candidates: pipelining the lock and write statements, and\n",
        "  answering heartbeats of one connection in batches.\n",
        "- SQLite has one writer; single-heartbeat requests share commits (about 60 requests per\n",
        "  commit), which is what lets it pass PostgreSQL here.\n",
        "- Funding (docs/funding.md): every booking locks the rows of the orgs it bills, so the\n",
        "  bookings of one org follow each other; past the plan, a booking also writes the grants\n",
        "  it used and the hourly rollup of what the plan did not pay. A request whose heartbeats\n",
        "  are all of one org goes to that org's writer (one queue a writer, by org), so requests\n",
        "  of one org are grouped together instead of waiting on each other's org locks across\n",
        "  writers; requests of several orgs go to writers sharing one queue (routing those by\n",
        "  org too cost batches of 100 about a third of their rate). With one heartbeat a\n",
        "  request, past the plan costs about a tenth more than within it: the extra rows of\n",
        "  each group's one write statement, on a machine whose two cores are busy.\n",
    ));
    if only.is_none() {
        std::fs::write(
            concat!(env!("CARGO_MANIFEST_DIR"), "/reports/ingest.md"),
            md,
        )
        .unwrap();
        eprintln!("wrote reports/ingest.md");
    } else {
        print!("{md}");
    }
}
