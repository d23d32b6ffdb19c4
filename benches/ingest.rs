//! Durable heartbeat ingest over HTTP, on PostgreSQL and SQLite, in batches of 1 and 100.
//!
//! `cargo bench --bench ingest` writes `reports/ingest.md`. PostgreSQL is the machine's
//! (`RUSH_METER_TEST_PG`, default postgres://postgres@127.0.0.1:5432), with its default
//! `synchronous_commit = on`: every acknowledged heartbeat is fsynced. SQLite runs in WAL
//! with `synchronous = FULL`. The load generator is wrk (`apt-get install wrk`), on the same
//! two cores: the figures are what this machine does with client and server together.

mod common;

use std::time::Duration;

use common::{wrk, Backend, Server, Setup, ADMIN};
use rush_meter_core::gate::{AdmissionRequest, Agent};

// The allocator of the `rush-meter` binary, so the server measured here is the one shipped.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ORGS: usize = 50;
const WARMUP: Duration = Duration::from_secs(4);
/// Sessions each wrk thread cycles through: more than it ever has in flight at once.
const SESSIONS_PER_THREAD: usize = 5000;
const MEASURE: Duration = Duration::from_secs(12);
/// wrk threads; each beats for its own sessions (`w{thread}_{n}`).
const THREADS: usize = 2;
/// Keys, projects and users of each org: every session is admitted with one of each
/// before the load, as the orchestrator would, so that its bookings roll up by member.
const KEYS_PER_ORG: usize = 4;
const PROJECTS_PER_ORG: usize = 5;
const USERS_PER_ORG: usize = 10;
/// Rounds of each load, the setups interleaved, so that the machine's drift falls on
/// both alike; a row's figures are its median round's.
const ROUNDS: usize = 3;

struct Outcome {
    backend: Backend,
    setup: Setup,
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

/// The members of the `n`th session of a wrk thread (of org `n % ORGS`, heartbeats.lua).
fn members(n: usize) -> (String, String, String, Agent) {
    let i = n / ORGS;
    let agent = [Agent::Claude, Agent::Codex, Agent::Opencode][i % 3];
    (
        format!("k{}", i % KEYS_PER_ORG),
        format!("p{}", i % PROJECTS_PER_ORG),
        format!("u{}", i % USERS_PER_ORG),
        agent,
    )
}

/// Register every org's keys, optionally limit each key, project and user, and admit every
/// session the load will beat for, through the store's gate in groups.
async fn admit_sessions(server: &Server, plans: &tempfile::TempDir, threads: usize, limits: bool) {
    for o in 0..ORGS {
        let org = format!("org_{o}");
        let mut limited = Vec::new();
        for k in 0..KEYS_PER_ORG {
            server
                .admin(
                    "PUT",
                    &format!("/v1/orgs/{org}/keys/k{k}"),
                    Some(serde_json::json!({"concurrency_limit": 100})),
                )
                .await;
            limited.push(("key", format!("k{k}")));
        }
        limited.extend((0..PROJECTS_PER_ORG).map(|p| ("project", format!("p{p}"))));
        limited.extend((0..USERS_PER_ORG).map(|u| ("user", format!("u{u}"))));
        if limits {
            common::limit_members(server, &org, &limited).await;
        }
    }
    let loaded = rush_meter::config::load_plans(plans.path()).unwrap();
    let requests: Vec<AdmissionRequest> = (0..threads)
        .flat_map(|tid| (0..SESSIONS_PER_THREAD).map(move |n| (tid, n)))
        .map(|(tid, n)| {
            let (key_id, project, user, agent) = members(n);
            AdmissionRequest {
                org_id: format!("org_{}", n % ORGS),
                key_id,
                session_id: format!("w{tid}_{n}"),
                agent,
                project_id: Some(project),
                started_by: Some(user),
            }
        })
        .collect();
    for group in requests.chunks(250) {
        let decided = server
            .db
            .admit(&loaded, group, server.clock.now(), &server.rules)
            .await
            .unwrap();
        for d in decided {
            let d = d.expect("every session's org and key exist");
            assert_eq!(d.decision, "allow", "{d:?}");
        }
    }
}

async fn run(backend: Backend, batch: usize, clients: usize, setup: Setup) -> Outcome {
    let plans = common::funded_plans();
    let server = common::start_funded(backend, &plans).await;
    common::create_orgs(&server, ORGS, setup.funding).await;
    admit_sessions(&server, &plans, THREADS, setup.limits).await;
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
        THREADS,
        clients,
        WARMUP.as_secs(),
        args(),
    )
    .await;
    let sum = "rush_meter_ingest_group_requests_sum";
    let count = "rush_meter_ingest_group_requests_count";
    let before = (server.metric(sum).await, server.metric(count).await);
    let w = wrk(
        url,
        "heartbeats.lua",
        THREADS,
        clients,
        MEASURE.as_secs(),
        args(),
    )
    .await;
    let after = (server.metric(sum).await, server.metric(count).await);
    server.finish().await;
    Outcome {
        backend,
        setup,
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
            for setup in Setup::ALL {
                let o = rt.block_on(run(backend, batch, clients, setup));
                eprintln!(
                    "{:?} batch {} ({}): {:.0} rows/s, {:.0} requests/s, p50 {:?}, p99 {:?}, {} errors, {:.1} requests per commit",
                    o.backend, o.batch, setup.label(), o.rows as f64 / o.elapsed.as_secs_f64(), o.requests as f64 / o.elapsed.as_secs_f64(), o.p50, o.p99, o.errors, o.mean_group
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
            |b: &&Outcome| b.backend == o.backend && b.batch == o.batch && b.setup == o.setup;
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
            "wrk (2 threads, `benches/wrk/heartbeats.lua`) on the same two cores as the server, {} orgs (on the Team plan, past a spent plan, or on the Team plan with limits on every member: see below) whose sessions are all admitted first, {} s warm-up, {} s measured, {} rounds of each with the setups interleaved (the median round's figures, each round's rate in brackets)",
            ORGS,
            WARMUP.as_secs(),
            MEASURE.as_secs(),
            ROUNDS
        ),
    ));
    md.push_str("| backend | heartbeats a request | concurrent clients | orgs | heartbeats/s | against the plan's | requests/s | p50 | p99 | errors | requests per commit |\n");
    md.push_str("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (o, rates) in &rows {
        let base = rows
            .iter()
            .find(|(b, _)| b.backend == o.backend && b.batch == o.batch && b.setup == Setup::BASE)
            .map_or(rate(o), |(b, _)| rate(b));
        let each: Vec<String> = rates.iter().map(|r| format!("{r:.0}")).collect();
        md.push_str(&format!(
            "| {:?} | {} | {} | {} | {:.0} ({}) | {:.2} | {:.0} | {:.1} ms | {:.1} ms | {} | {:.1} |\n",
            o.backend,
            o.batch,
            o.clients,
            o.setup.label(),
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
        "\nOrgs: `plan` is 50 Team orgs well within their plan; `grants and pay-as-you-go` ",
        "is 50 orgs past a plan spent at once, half on a 100,000-hour grant and half paying as ",
        "they go under a high cap, so that every second booked is attributed past the plan ",
        "(issue 14: at least 0.9 of the plan's rate, measured in the same run); `limits on every ",
        "member` is the plan's orgs with a monthly and weekly limit (never reached) on each of ",
        "their 4 keys, 5 projects and 10 users, so that each booking also reads the limits and ",
        "use of its sessions' members for the heartbeat answers (issue 15: at least 0.9 of the ",
        "rate without them). Every session is admitted with a key, project, user and agent ",
        "before the load, so every booking also writes the member rollup.\n",
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
        "- Members (issue 15): every session is now admitted with a key, project, user and\n",
        "  agent, so each booking also upserts the member rollup: about 22 rows an org-hour here\n",
        "  (4 keys, 5 projects, 10 users, 3 agents) beside one of the org's hourly rollup, three\n",
        "  times the rollup rows of a commit before. With the machine's own raw one-row commits\n",
        "  at 5.5k/s at 8 clients on the day of this run (pgbench; 11.7k/s on an earlier day),\n",
        "  figures are not comparable with reports of other days: only the ratios in a column\n",
        "  are. Limits themselves cost a booking only the read of the limited members' use for\n",
        "  the answers, one statement a commit for the orgs that set any (`orgs.sets_limits`).\n",
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
