//! What the benchmarks share: the tests' harness (tests/common, included here, so a
//! benchmark's server is started exactly as a test's), wrk, and the machine.
#![allow(dead_code)]

use std::time::Duration;

#[path = "../../tests/common/mod.rs"]
pub mod harness;

pub use harness::{Backend, Options, TestServer as Server, ADMIN};

/// Run `sql` on the pool that writes (a benchmark's seeding by hand), failing with it.
pub async fn execute(db: &rush_meter::store::Db, sql: &str) {
    use rush_meter::store::Pools;
    match db.pools() {
        Pools::Postgres(p) => sqlx::query(sql).execute(p).await.map(drop),
        Pools::Sqlite { write, .. } => sqlx::query(sql).execute(write).await.map(drop),
    }
    .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// The runtime every benchmark drives its server and load from.
/// The backend named on the command line (`cargo bench --bench x -- sqlite`), if one is:
/// a run for one backend prints its figures and leaves the report as it is.
pub fn only_backend() -> Option<String> {
    std::env::args().skip(1).find(|a| !a.starts_with('-'))
}

/// The second word on the command line, if any: which of a benchmark's loads to run
/// (`cargo bench --bench ingest -- postgres 1x8`), to profile one of them.
pub fn only_load() -> Option<String> {
    std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .nth(1)
}

/// Whether `backend` is to be measured in this run.
pub fn wanted(only: Option<&str>, backend: Backend) -> bool {
    only.is_none_or(|o| format!("{backend:?}").eq_ignore_ascii_case(o))
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The lines every report opens its figures with: the command, the machine, the date, the load.
pub fn provenance(bench: &str, load: &str) -> String {
    format!(
        "- Command: `cargo bench --bench {bench}`\n- Machine: {}\n- Date: {}\n- Load: {load}\n\n",
        machine(),
        chrono::Utc::now().format("%Y-%m-%d"),
    )
}

/// The service on the system clock over a fresh database whose commits are fsynced, as
/// in production.
pub async fn start(backend: Backend) -> Server {
    start_with(
        backend,
        Options {
            system_clock: true,
            ..bench_options()
        },
    )
    .await
}

/// What every benchmark's server runs with: durable commits, no rate limit (the load
/// generator is one caller: measure the service, not its limit).
pub fn bench_options() -> Options {
    Options {
        durable: true,
        ..Options::default()
    }
}

/// How a benchmark's orgs are funded: all on the Team plan, well within it; or past a plan
/// already spent, half of them on a large grant and half paying as they go under a high
/// cap, so that every second booked is paid by a grant or by pay-as-you-go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Funding {
    Plan,
    PastThePlan,
}

impl Funding {
    pub const BOTH: [Funding; 2] = [Funding::Plan, Funding::PastThePlan];

    pub fn label(self) -> &'static str {
        match self {
            Funding::Plan => "plan",
            Funding::PastThePlan => "grants and pay-as-you-go",
        }
    }
}

/// What a benchmark's orgs are set up with: how they are funded, and whether every member
/// their sessions name (key, project, user) carries a limit (docs/limits.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setup {
    pub funding: Funding,
    pub limits: bool,
}

impl Setup {
    /// Within the plan (the baseline of every ratio), past it, and within it with limits.
    pub const ALL: [Setup; 3] = [
        Setup {
            funding: Funding::Plan,
            limits: false,
        },
        Setup {
            funding: Funding::PastThePlan,
            limits: false,
        },
        Setup {
            funding: Funding::Plan,
            limits: true,
        },
    ];
    pub const BASE: Setup = Setup::ALL[0];

    /// Its name on the command line (`cargo bench --bench admission -- postgres limits`).
    pub fn word(self) -> &'static str {
        match (self.funding, self.limits) {
            (_, true) => "limits",
            (Funding::Plan, false) => "plan",
            (_, false) => "past",
        }
    }

    /// Whether this setup runs when `only` names one: the named one, and the plan's, which
    /// every ratio is taken against.
    pub fn wanted(self, only: Option<&str>) -> bool {
        only.is_none_or(|w| self == Setup::BASE || self.word() == w)
    }

    pub fn label(self) -> String {
        if self.limits {
            format!("{}, limits on every member", self.funding.label())
        } else {
            self.funding.label().to_owned()
        }
    }
}

use rush_meter_core::gate::{AdmissionRequest, Agent};

/// Keys, projects and users of each org: every session is admitted with one of each
/// before the load, as the orchestrator would, so that its bookings roll up by member.
const KEYS_PER_ORG: usize = 4;
const PROJECTS_PER_ORG: usize = 5;
const USERS_PER_ORG: usize = 10;
/// The members of the `n`th session of a wrk thread (of org `n % orgs`, heartbeats.lua).
fn members(n: usize, orgs: usize) -> (String, String, String, Agent) {
    let i = n / orgs;
    let agent = [Agent::Claude, Agent::Codex, Agent::Opencode][i % 3];
    (
        format!("k{}", i % KEYS_PER_ORG),
        format!("p{}", i % PROJECTS_PER_ORG),
        format!("u{}", i % USERS_PER_ORG),
        agent,
    )
}

/// Register every org's keys (`org_0`…), optionally limit each key, project and user, and admit every
/// session the load will beat for (`w{thread}_{n}`, heartbeats.lua), through the store's gate in groups.
pub async fn admit_sessions(
    server: &Server,
    plans: &tempfile::TempDir,
    (orgs, sessions_per_thread): (usize, usize),
    threads: usize,
    limits: bool,
) {
    for o in 0..orgs {
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
            limit_members(server, &org, &limited).await;
        }
    }
    let loaded = rush_meter::config::load_plans(plans.path()).unwrap();
    let requests: Vec<AdmissionRequest> = (0..threads)
        .flat_map(|tid| (0..sessions_per_thread).map(move |n| (tid, n)))
        .map(|(tid, n)| {
            let (key_id, project, user, agent) = members(n, orgs);
            AdmissionRequest {
                org_id: format!("org_{}", n % orgs),
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

/// A limit no benchmark reaches (the most a limit may be, 100,000 h), so that every
/// decision and booking reads and checks it but it never binds.
const UNREACHED_HOURS: &str = "100000";

/// Put a monthly and weekly limit far above any use on each of `members` (kind, id) of
/// `org`.
pub async fn limit_members(server: &Server, org: &str, members: &[(&str, String)]) {
    for (kind, id) in members {
        server
            .admin(
                "PUT",
                &format!("/v1/orgs/{org}/limits/{kind}/{id}"),
                Some(serde_json::json!({
                    "monthly_hours": UNREACHED_HOURS,
                    "weekly_hours": UNREACHED_HOURS,
                })),
            )
            .await;
    }
}

/// A plan spent at once (0.0001 h), that sells pay-as-you-go up to a very high cap, and
/// packs of 10 hours (auto top-up's, benches/auto_topup.rs).
const SPENT: &str = r#"
id = "spent"
name = "Spent"
price = "200.00"
currency = "usd"
monthly_agent_hours = 0.0001
weekly_agent_hours = 0.0001
concurrency_default = 100
concurrency_max = 100
overage_unit_price = "0.50"
overage_cap_max = "1000000.00"
topup_hours = [10]
topup_hour_price = "0.50"
"#;

/// The repository's plans and `spent`, in a directory of their own.
pub fn funded_plans() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(harness::repo_plans()).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    std::fs::write(dir.path().join("spent.toml"), SPENT).unwrap();
    dir
}

/// The service on the system clock over a fresh, fsynced database, with `plans` (from
/// `funded_plans()`).
pub async fn start_funded(backend: Backend, plans: &tempfile::TempDir) -> Server {
    start_with(
        backend,
        Options {
            system_clock: true,
            plans_dir: plans.path().to_path_buf(),
            ..bench_options()
        },
    )
    .await
}

/// Create `orgs` orgs (`org_0`…) funded as `funding` says.
pub async fn create_orgs(server: &Server, orgs: usize, funding: Funding) {
    for o in 0..orgs {
        let plan = match funding {
            Funding::Plan => "team",
            Funding::PastThePlan => "spent",
        };
        server
            .admin(
                "PUT",
                &format!("/v1/orgs/org_{o}"),
                Some(serde_json::json!({ "plan": plan })),
            )
            .await;
        if funding == Funding::PastThePlan {
            if o % 2 == 0 {
                server
                    .admin(
                        "POST",
                        &format!("/v1/orgs/org_{o}/grants"),
                        Some(serde_json::json!({"seconds": 360_000_000, "kind": "promo"})),
                    )
                    .await;
            } else {
                server
                    .admin(
                        "PUT",
                        &format!("/v1/orgs/org_{o}/overage"),
                        Some(serde_json::json!({"enabled": true, "monthly_cap": "1000000.00"})),
                    )
                    .await;
            }
        }
    }
}

pub async fn start_with(backend: Backend, opts: Options) -> Server {
    Server::start_with(backend, opts)
        .await
        .expect("PostgreSQL for the benchmark")
}

/// Run wrk against `url` with a Lua `script` from benches/wrk and its arguments.
pub async fn wrk(
    url: String,
    script: &'static str,
    threads: usize,
    conns: usize,
    secs: u64,
    args: Vec<String>,
) -> WrkResult {
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new("wrk")
            .args([
                format!("-t{threads}"),
                format!("-c{conns}"),
                format!("-d{secs}s"),
                "--latency".into(),
                "-s".into(),
                format!("{}/benches/wrk/{script}", env!("CARGO_MANIFEST_DIR")),
                url,
                "--".into(),
            ])
            .args(args)
            .output()
            .expect("wrk runs (apt-get install wrk)");
        parse_wrk(&String::from_utf8_lossy(&out.stdout))
    })
    .await
    .unwrap()
}

pub struct WrkResult {
    pub requests: u64,
    pub errors: u64,
    pub elapsed: Duration,
    pub p50: Duration,
    pub p99: Duration,
}

fn parse_duration(s: &str) -> Duration {
    let (num, unit): (String, String) = s.chars().partition(|c| c.is_ascii_digit() || *c == '.');
    let v: f64 = num.parse().unwrap_or(0.0);
    Duration::from_secs_f64(match unit.as_str() {
        "us" => v / 1e6,
        "ms" => v / 1e3,
        "s" => v,
        "m" => v * 60.0,
        _ => 0.0,
    })
}

/// Read wrk's summary: `N requests in Xs`, the latency distribution, non-2xx responses.
pub fn parse_wrk(text: &str) -> WrkResult {
    let mut r = WrkResult {
        requests: 0,
        errors: 0,
        elapsed: Duration::ZERO,
        p50: Duration::ZERO,
        p99: Duration::ZERO,
    };
    for line in text.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            [n, "requests", "in", t, ..] => {
                r.requests = n.parse().unwrap_or(0);
                r.elapsed = parse_duration(t.trim_end_matches(','));
            }
            ["50%", d] => r.p50 = parse_duration(d),
            ["99%", d] => r.p99 = parse_duration(d),
            ["Non-2xx", "or", "3xx", "responses:", n] => r.errors += n.parse::<u64>().unwrap_or(0),
            ["Socket", "errors:", rest @ ..] => {
                r.errors += rest
                    .iter()
                    .filter_map(|w| w.trim_end_matches(',').parse::<u64>().ok())
                    .sum::<u64>()
            }
            _ => {}
        }
    }
    assert!(r.requests > 0, "wrk reported no requests:\n{text}");
    r
}

pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines().next().map(|l| {
                l.split_whitespace()
                    .nth(1)
                    .unwrap_or("0")
                    .parse::<u64>()
                    .unwrap_or(0)
                    / 1024
                    / 1024
            })
        })
        .unwrap_or(0);
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    format!("{cores} cores ({cpu}), {mem} GiB memory")
}

/// What a raw run by hand did: transactions a second and their latency.
pub struct RawResult {
    pub rate: f64,
    pub p50: Duration,
    pub p99: Duration,
    /// Transactions run.
    pub transactions: usize,
}

/// The p50 and p99 of `samples` (any order).
pub fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let at = |q: f64| {
        samples
            .get(((samples.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or_default()
    };
    (at(0.5), at(0.99))
}

/// Run `benches/raw/<script>` with pgbench on `database_url` at `clients` for `secs`,
/// with `defines` (`-D name=value`); its per-transaction log gives the percentiles.
pub async fn pgbench(
    database_url: &str,
    script: &str,
    clients: usize,
    secs: u64,
    defines: &[(&str, String)],
) -> RawResult {
    pgbench_as(database_url, script, clients, secs, defines, "simple").await
}

/// `pgbench` with the query protocol `mode` (`simple`, `extended` or `prepared`).
pub async fn pgbench_as(
    database_url: &str,
    script: &str,
    clients: usize,
    secs: u64,
    defines: &[(&str, String)],
    mode: &str,
) -> RawResult {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("tx");
    let mut cmd = std::process::Command::new("pgbench");
    cmd.args(["-n", "-M", mode, "-f"])
        .arg(format!(
            "{}/benches/raw/{script}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .args([
            "-c",
            &clients.to_string(),
            "-j",
            &clients.min(2).to_string(),
        ])
        .args(["-T", &secs.to_string(), "-l", "--log-prefix"])
        .arg(&prefix);
    for (name, value) in defines {
        cmd.args(["-D", &format!("{name}={value}")]);
    }
    cmd.arg(database_url).current_dir(dir.path());
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("pgbench runs"))
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "pgbench failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rate = text
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("pgbench prints tps");
    // Each log line: client, transaction, latency in µs, script, epoch s, µs.
    let mut samples = Vec::new();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let log = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        samples.extend(log.lines().filter_map(|l| {
            let us: u64 = l.split_whitespace().nth(2)?.parse().ok()?;
            Some(Duration::from_micros(us))
        }));
    }
    let transactions = samples.len();
    let (p50, p99) = percentiles(samples);
    RawResult {
        rate,
        p50,
        p99,
        transactions,
    }
}

/// The windows benches/raw/admission.sql sums, as the service's for an org without a
/// Stripe period: now, the start of the calendar month and of the ISO week.
pub fn raw_windows() -> (i64, i64, i64) {
    use rush_meter_core::time::{calendar_month, iso_week};
    let now = chrono::Utc::now().timestamp();
    (now, calendar_month(now).start, iso_week(now).start)
}

/// benches/raw/admission.sql, the admission written by hand, with pgbench at `callers`
/// for `secs` on the PostgreSQL (or Citus coordinator) at `url`, over `orgs` orgs and
/// `keys` keys named as `create_orgs` and the benches name them, in protocol `mode`.
pub async fn raw_admissions(
    url: &str,
    callers: usize,
    secs: u64,
    (orgs, keys): (usize, usize),
    mode: &str,
) -> RawResult {
    let (now, month, week) = raw_windows();
    let defines = [
        ("orgs", orgs.to_string()),
        ("keys", keys.to_string()),
        ("now", now.to_string()),
        ("month_start", month.to_string()),
        ("week_start", week.to_string()),
    ];
    pgbench_as(url, "admission.sql", callers, secs, &defines, mode).await
}

/// One writer connection to the SQLite database at `url`, set up as the service's (WAL,
/// `synchronous = FULL`): what the raw writes by hand share, as the service's writes do.
pub async fn sqlite_writer(url: &str) -> sqlx::SqlitePool {
    use sqlx::sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
    };
    use std::str::FromStr;
    let opts = SqliteConnectOptions::from_str(url)
        .unwrap()
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(30));
    // No ping before each transaction (sqlx's default): a hand-written loop would not
    // make one, and the service pings only connections idle for a second.
    SqlitePoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(60))
        .connect_with(opts)
        .await
        .unwrap()
}

/// One setup's rate against another's: the median of their ratios round by round. The
/// setups of a round run back to back, so a round's drift (this machine's rate has moved
/// by a third between rounds) falls on both sides of its ratio; a ratio of medians paired
/// one setup's fast round with the other's slow one.
pub fn paired(rates: &[f64], of: &[f64]) -> f64 {
    let mut r: Vec<f64> = rates.iter().zip(of).map(|(a, b)| a / b).collect();
    r.sort_by(f64::total_cmp);
    r[r.len() / 2]
}
