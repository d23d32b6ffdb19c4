//! Gate decisions over HTTP, on PostgreSQL and SQLite, at 1, 8 and 32 concurrent callers.
//!
//! `cargo bench --bench admission` writes `reports/admission.md`. Each request admits a new
//! session for one of 1,000 keys (100 orgs on the Team plan, limit 100 a key), so nearly
//! every decision allows and writes a session and its decision record. The load generator is
//! wrk (`apt-get install wrk`) on the same two cores.

mod common;

use std::time::Duration;

use common::{wrk, Backend, Setup, ADMIN};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ORGS: usize = 100;
const KEYS: usize = 1000;
const MEASURE: Duration = Duration::from_secs(8);
/// Rounds of each setup, the setups interleaved, so that the machine's drift falls on all
/// alike; a row's figures are its median round's.
const ROUNDS: usize = 3;

struct Row {
    backend: Backend,
    setup: Setup,
    callers: usize,
    rate: f64,
    p50: Duration,
    p99: Duration,
    errors: u64,
    allowed: f64,
    decided: f64,
}

async fn run(backend: Backend, setup: Setup) -> Vec<Row> {
    let plans = common::funded_plans();
    let server = common::start_funded(backend, &plans).await;
    common::create_orgs(&server, ORGS, setup.funding).await;
    for k in 0..KEYS {
        server
            .admin(
                "PUT",
                &format!("/v1/orgs/org_{}/keys/k{k}", k % ORGS),
                Some(serde_json::json!({"concurrency_limit": 100})),
            )
            .await;
    }
    if setup.limits {
        // Every key, the project and the user the load's admissions name (admissions.lua).
        for o in 0..ORGS {
            let mut members: Vec<(&str, String)> = (o..KEYS)
                .step_by(ORGS)
                .map(|k| ("key", format!("k{k}")))
                .collect();
            members.push(("project", "web".into()));
            members.push(("user", "u1".into()));
            common::limit_members(&server, &format!("org_{o}"), &members).await;
        }
    }
    let url = format!("{}/v1/admissions", server.url);
    let args = || vec![KEYS.to_string(), ORGS.to_string(), ADMIN.to_string()];
    let mut rows = Vec::new();
    for callers in [1, 8, 32] {
        let allow = "rush_meter_decisions_total{decision=\"allow\",reason=\"\"}";
        let before = server.metric(allow).await;
        let threads = callers.min(2);
        let w = wrk(
            url.clone(),
            "admissions.lua",
            threads,
            callers,
            MEASURE.as_secs(),
            args(),
        )
        .await;
        let after = server.metric(allow).await;
        rows.push(Row {
            backend,
            setup,
            callers,
            rate: w.requests as f64 / w.elapsed.as_secs_f64(),
            p50: w.p50,
            p99: w.p99,
            errors: w.errors,
            allowed: after - before,
            decided: w.requests as f64,
        });
        eprintln!(
            "{backend:?} {callers} callers ({}): {:.0} decisions/s, p50 {:?}, p99 {:?}, {} errors",
            setup.label(),
            rows.last().unwrap().rate,
            w.p50,
            w.p99,
            w.errors
        );
    }
    server.finish().await;
    rows
}

fn main() {
    let rt = common::runtime();
    let only = common::only_backend();
    let mut runs = Vec::new();
    for backend in [Backend::Postgres, Backend::Sqlite] {
        if common::wanted(only.as_deref(), backend) {
            for _ in 0..ROUNDS {
                for setup in Setup::ALL {
                    runs.extend(rt.block_on(run(backend, setup)));
                }
            }
        }
    }
    // Each backend, setup and load: its rounds' rates, and its median round.
    let mut rows: Vec<(&Row, Vec<f64>)> = Vec::new();
    for r in &runs {
        let same =
            |b: &&Row| b.backend == r.backend && b.setup == r.setup && b.callers == r.callers;
        if rows.iter().any(|(x, _)| same(x)) {
            continue;
        }
        let mut alike: Vec<&Row> = runs.iter().filter(same).collect();
        let rates: Vec<f64> = alike.iter().map(|x| x.rate).collect();
        alike.sort_by(|a, b| a.rate.total_cmp(&b.rate));
        rows.push((alike[alike.len() / 2], rates));
    }
    rows.sort_by_key(|(r, _)| {
        let setup = Setup::ALL.iter().position(|s| *s == r.setup);
        (r.backend != Backend::Postgres, setup, r.callers)
    });
    let mut md = String::from("# Gate decisions\n\n");
    md.push_str(
        "`POST /v1/admissions` over HTTP: each decision locks its key, counts the key's slots,\n",
    );
    md.push_str(
        "reads the org's month and week windows, writes the session (when allowed) and the\n",
    );
    md.push_str("decision record, and commits (fsynced) before answering.\n\n");
    md.push_str(&common::provenance(
        "admission",
        &format!(
            "wrk on the same two cores; {KEYS} keys of {ORGS} orgs (Team, past a spent plan, or Team with limits on every member: see below), new session ids, {} s a run, {ROUNDS} rounds of each with the setups interleaved (the median round's figures, each round's rate in brackets)",
            MEASURE.as_secs()
        ),
    ));
    md.push_str("| backend | concurrent callers | orgs | decisions/s | against the plan's | p50 | p99 | allowed | errors |\n");
    md.push_str("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (r, rates) in &rows {
        let base = rows
            .iter()
            .find(|(b, _)| {
                b.backend == r.backend && b.callers == r.callers && b.setup == Setup::BASE
            })
            .map_or(r.rate, |(b, _)| b.rate);
        let each: Vec<String> = rates.iter().map(|x| format!("{x:.0}")).collect();
        md.push_str(&format!(
            "| {:?} | {} | {} | {:.0} ({}) | {:.2} | {:.2} ms | {:.2} ms | {:.0}% | {} |\n",
            r.backend,
            r.callers,
            r.setup.label(),
            r.rate,
            each.join(", "),
            r.rate / base,
            r.p50.as_secs_f64() * 1e3,
            r.p99.as_secs_f64() * 1e3,
            100.0 * r.allowed / r.decided.max(1.0),
            r.errors
        ));
    }
    md.push_str(concat!(
        "\nOrgs: `plan` is 100 Team orgs well within their plan; `grants and pay-as-you-go` ",
        "is 100 orgs past a plan spent at once, half on a 100,000-hour grant and half paying as ",
        "they go under a high cap, so that every decision is funded past the plan (issue 14: at ",
        "least 0.9 of the plan's rate, measured in the same run); `limits on every member` is ",
        "the plan's orgs with a monthly and weekly limit (never reached) on each of their keys, ",
        "the project and the user the admissions name, so that every decision reads and checks ",
        "three limits and its members' use (issue 15: at least 0.9 of the rate without them).\n",
    ));
    md.push_str("\nTarget (issue 3): at least 0.75 of raw PostgreSQL's ~13k reads/s at 8 clients, with p99\n");
    md.push_str("at most 5 ms at 32 callers, while staying exact.\n\n");
    md.push_str(concat!(
        "## Where the time goes\n\n",
        "Decisions are committed in groups (`src/app/admission.rs`): each gate writer takes every\n",
        "admission queued for it, and one transaction locks their keys in byte order, reads\n",
        "the orgs, the sessions, the keys' slot counts and the windows (one statement each),\n",
        "decides them one after another in memory (`gate::decide_group`), writes sessions and\n",
        "decision records in one set-based statement, and commits once. At 32 callers a group\n",
        "holds about 16 decisions, and the rate is about 3x that of one transaction per\n",
        "decision (1.3k/s, p99 43 ms before).\n\n",
        "Still short of the target, and the limit is CPU: wrk, the service and PostgreSQL share\n",
        "two cores, which sit at 100%. PostgreSQL's own log (`log_min_duration_statement = 0`)\n",
        "puts a 16-decision group at 2.8 ms of server time: 0.9 ms to write sessions and\n",
        "decisions (index upkeep), 0.4 ms to count slots, and 1.2 ms planning the six\n",
        "statements. The planning is the price of `plan_cache_mode = force_custom_plan`:\n",
        "with generic plans (measured: `auto`) the slot count and session lock fall back to\n",
        "sequential scans on tables that were small when the plan was cached, and the rate\n",
        "halves. Two gate writers a PostgreSQL instance measured best (1: same rate, 4: 20%\n",
        "slower, smaller groups).\n",
        "\nPast the plan (issue 14) a group reads its orgs' funding with the org rows it reads anyway,\nand decides in memory: 0.96-1.04 of the plan's rate on PostgreSQL, 0.99-1.17 on SQLite.\nLimits inside an org (issue 15) cost one more statement a group, only for groups with an\norg that sets limits (`orgs.sets_limits`): the limits of the members the group names, with\ntheir use from the member rollup and running sessions. A group of about four decisions\n(8 callers) runs seven statements, so one more is about a seventh of its database work:\n0.86 of the rate without limits on PostgreSQL at 8 callers and 0.85 on SQLite at 32 in\nthis run, 0.90-1.15 elsewhere; the rounds of one cell spread by up to 15%. Short of the\n0.9 aimed for at those two points; folding the read into the window statement is the\nnext step.\n",
    ));
    if only.is_none() {
        std::fs::write(
            concat!(env!("CARGO_MANIFEST_DIR"), "/reports/admission.md"),
            md,
        )
        .unwrap();
        eprintln!("wrote reports/admission.md");
    }
}
