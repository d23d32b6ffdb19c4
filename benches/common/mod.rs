//! What the benchmarks share: a real server on a fresh database, wrk, and the machine.
#![allow(dead_code)]

use std::time::Duration;

use rush_meter::clock::Clock;
use rush_meter::config::Config;
use rush_meter::ledger::Rules;
use rush_meter::server::App;

pub const ADMIN: &str = "bench-admin-token-0123456789";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// The runtime every benchmark drives its server and load from.
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

/// PostgreSQL's base URL (without a database).
fn pg_base() -> String {
    std::env::var("RUSH_METER_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

/// A fresh database: a new one on the machine's PostgreSQL (default settings, so commits
/// are fsynced), or a SQLite file in a temporary directory.
pub async fn database(backend: Backend) -> (String, Option<tempfile::TempDir>) {
    match backend {
        Backend::Sqlite => {
            let dir = tempfile::tempdir().unwrap();
            let url = format!("sqlite://{}", dir.path().join("bench.db").display());
            (url, Some(dir))
        }
        Backend::Postgres => {
            let base = pg_base();
            let admin = sqlx::PgPool::connect(&format!("{base}/postgres"))
                .await
                .expect("PostgreSQL for the benchmark");
            let name = format!("rm_bench_{:08x}", rand::random::<u32>());
            sqlx::query(&format!("CREATE DATABASE {name}"))
                .execute(&admin)
                .await
                .unwrap();
            (format!("{base}/{name}"), None)
        }
    }
}

/// The service, in this process, on the system clock.
pub struct Server {
    pub base: String,
    pub client: reqwest::Client,
    stop: tokio::sync::oneshot::Sender<()>,
    handle: tokio::task::JoinHandle<std::io::Result<()>>,
    pub database_url: String,
    _dir: Option<tempfile::TempDir>,
}

impl Server {
    pub async fn start(backend: Backend) -> Server {
        Self::start_with_clock(backend, Clock::System).await
    }

    /// The service on `clock` (a manual one lets a benchmark place history in the past).
    pub async fn start_with_clock(backend: Backend, clock: Clock) -> Server {
        let (url, dir) = database(backend).await;
        let config = Config {
            database_url: url.clone(),
            listen: "127.0.0.1:0".parse().unwrap(),
            plans_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/plans").into(),
            rules: Rules {
                interval: 15,
                lease: 45,
            },
            bootstrap_admin_token: Some(
                <rush_meter::config::Cli as clap::Parser>::try_parse_from([
                    "rush-meter",
                    "--bootstrap-admin-token",
                    ADMIN,
                ])
                .unwrap()
                .settings
                .validate()
                .unwrap()
                .bootstrap_admin_token
                .unwrap(),
            ),
            max_body_bytes: 1 << 20,
            stripe: Default::default(),
            // The load generator is one caller: measure the service, not its limit.
            rate_limit: None,
            period_settle: None,
            notify: None,
            export_stall: std::time::Duration::from_secs(120),
        };
        let app = App::start(&config, clock).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(app.serve(listener, async {
            let _ = stop_rx.await;
        }));
        Server {
            base,
            client: reqwest::Client::new(),
            stop,
            handle,
            database_url: url,
            _dir: dir,
        }
    }

    pub async fn put(&self, path: &str, body: serde_json::Value) {
        let r = self
            .client
            .put(format!("{}{path}", self.base))
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "PUT {path}: {}", r.status());
    }

    /// A value of `/metrics` (0 when absent).
    pub async fn metric(&self, name: &str) -> f64 {
        let text = self
            .client
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    }

    /// Stop the server and drop its PostgreSQL database (SQLite's goes with its directory).
    pub async fn stop(self) {
        let _ = self.stop.send(());
        self.handle.await.unwrap().unwrap();
        if let Some(name) = self.database_url.strip_prefix(&format!("{}/", pg_base())) {
            let admin = sqlx::PgPool::connect(&format!("{}/postgres", pg_base()))
                .await
                .unwrap();
            sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .execute(&admin)
                .await
                .unwrap();
        }
    }
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
