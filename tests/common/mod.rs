//! The harness of the tests and the benchmarks (benches/common includes this file): a real
//! server on port 0 over a fresh database, SQLite or PostgreSQL, and `every_backend!`, the
//! one way to run a test on both.
#![allow(dead_code)]

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use rush_meter::app::App;
use rush_meter::clock::Clock;
use rush_meter::config::Config;
use rush_meter::store::Db;
use rush_meter_core::ledger::Rules;
use rush_meter_core::time::Secs;
use secrecy::SecretString;
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const ADMIN: &str = "test-admin-token-0123456789";
/// Monday 2026-11-30 12:00:00 UTC.
pub const T0: Secs = 1_796_040_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub const ALL: [Backend; 2] = [Backend::Sqlite, Backend::Postgres];
}

/// The PostgreSQL server tests use; each test gets its own database on it.
pub fn pg_base_url() -> String {
    std::env::var("RUSH_METER_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

/// A fresh, empty database URL for `backend`, or `None` (with a note) when PostgreSQL is
/// not reachable outside CI. On CI (`CI=true`) an unreachable PostgreSQL fails the test.
/// Its commits skip the fsync wait (tests do not crash PostgreSQL).
pub async fn fresh_database(backend: Backend) -> Option<(String, Option<tempfile::TempDir>)> {
    fresh_database_with(backend, false).await
}

/// A fresh database whose commits are `durable` (fsynced, as in production: what the
/// benchmarks measure) or not.
pub async fn fresh_database_with(
    backend: Backend,
    durable: bool,
) -> Option<(String, Option<tempfile::TempDir>)> {
    match backend {
        Backend::Sqlite => {
            let dir = tempfile::tempdir().expect("temp dir");
            let url = format!("sqlite://{}", dir.path().join("meter.db").display());
            Some((url, Some(dir)))
        }
        Backend::Postgres => {
            let base = pg_base_url();
            let admin = match sqlx::PgPool::connect(&format!("{base}/postgres")).await {
                Ok(p) => p,
                Err(e) if std::env::var("CI").as_deref() == Ok("true") => {
                    panic!("PostgreSQL at {base} is required on CI: {e}")
                }
                Err(e) => {
                    eprintln!("NOTE: PostgreSQL at {base} unreachable ({e}); this test did not run on PostgreSQL");
                    return None;
                }
            };
            let name = format!("rm_test_{:016x}", rand::random::<u64>());
            sqlx::query(&format!("CREATE DATABASE {name}"))
                .execute(&admin)
                .await
                .expect("create test database");
            if !durable {
                sqlx::query(&format!(
                    "ALTER DATABASE {name} SET synchronous_commit = off"
                ))
                .execute(&admin)
                .await
                .expect("configure test database");
            }
            admin.close().await;
            let url = format!("{base}/{name}");
            if let Some(n) = shards::partitions() {
                shards::partition(&url, n).await;
            }
            Some((url, None))
        }
    }
}

pub fn repo_plans() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("plans")
}

/// The plans of `plans/`, as a server loads them.
pub fn plans() -> rush_meter_core::plans::Plans {
    rush_meter::config::load_plans(&repo_plans()).expect("plans/ loads")
}

/// A plan small enough to spend in a test, `mini`: 180 s a week, 360 s a month, 30 s of
/// grace; pay-as-you-go at 3.60 an hour (a tenth of a cent a second) capped at up to
/// 1.00; top-ups of 1 or 2 hours at 1.00 each; Stripe's `pro_monthly` (20.00) pays for it.
const MINI: &str = r#"
id = "mini"
name = "Mini"
price = "20.00"
currency = "usd"
monthly_agent_hours = 0.1
weekly_agent_hours = 0.05
concurrency_default = 10
concurrency_max = 20
ceiling_grace_seconds = 30
overage_unit_price = "3.60"
overage_cap_max = "1.00"
topup_hours = [1, 2]
topup_hour_price = "1.00"
stripe_prices = ["pro_monthly"]
"#;

const FREE: &str = r#"
id = "free"
name = "Free"
price = "0.00"
currency = "usd"
monthly_agent_hours = 5
weekly_agent_hours = 2
concurrency_default = 4
concurrency_max = 4
upgrade_to = "mini"
"#;

/// A plans directory of `free` and `mini` (above), for the tests of funding.
pub fn mini_plans() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("free.toml"), FREE).unwrap();
    std::fs::write(dir.path().join("mini.toml"), MINI).unwrap();
    dir
}

pub struct TestServer {
    pub backend: Backend,
    pub url: String,
    pub database_url: String,
    pub clock: Clock,
    pub client: reqwest::Client,
    pub db: Db,
    pub rules: Rules,
    shutdown: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<std::io::Result<()>>>,
    _dir: Option<tempfile::TempDir>,
}

pub struct Options {
    pub plans_dir: PathBuf,
    pub max_body_bytes: usize,
    pub rules: Rules,
    pub stripe: rush_meter::config::StripeConfig,
    /// Where the manual clock starts.
    pub clock_start: Secs,
    /// Off unless a test sets it: tests send bursts on one token.
    pub rate_limit: Option<rush_meter::config::RateLimit>,
    /// Off unless a test sets it: tests close periods themselves.
    pub period_settle: Option<i64>,
    pub notify: Option<rush_meter::config::NotifyConfig>,
    pub export_stall: Duration,
    /// The system clock instead of a manual one at `clock_start` (the benchmarks).
    pub system_clock: bool,
    /// Fsynced commits on PostgreSQL (the benchmarks); off for tests.
    pub durable: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            plans_dir: repo_plans(),
            max_body_bytes: 1 << 20,
            rules: Rules {
                interval: 15,
                lease: 45,
            },
            stripe: Default::default(),
            clock_start: T0,
            rate_limit: None,
            period_settle: None,
            notify: None,
            export_stall: Duration::from_secs(120),
            system_clock: false,
            durable: false,
        }
    }
}

impl TestServer {
    pub async fn start(backend: Backend) -> Option<TestServer> {
        Self::start_with(backend, Options::default()).await
    }

    pub async fn start_with(backend: Backend, opts: Options) -> Option<TestServer> {
        init_tracing(!opts.durable);
        let (database_url, dir) = fresh_database_with(backend, opts.durable).await?;
        Some(Self::start_on(backend, database_url, dir, opts).await)
    }

    /// A server on a database that already exists (one a test filled through the store).
    pub async fn start_on(
        backend: Backend,
        database_url: String,
        dir: Option<tempfile::TempDir>,
        opts: Options,
    ) -> TestServer {
        let config = Config {
            database_url: database_url.clone(),
            listen: "127.0.0.1:0".parse().unwrap(),
            plans_dir: opts.plans_dir,
            rules: opts.rules,
            bootstrap_admin_token: Some(SecretString::from(ADMIN)),
            max_body_bytes: opts.max_body_bytes,
            stripe: opts.stripe.clone(),
            rate_limit: opts.rate_limit,
            period_settle: opts.period_settle,
            notify: opts.notify.clone(),
            export_stall: opts.export_stall,
        };
        let clock = if opts.system_clock {
            Clock::System
        } else {
            Clock::manual(opts.clock_start)
        };
        let app = App::start(&config, clock.clone())
            .await
            .expect("app starts");
        let db = app.services.db.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(async move {
            rush_meter::http::serve(app, &config, listener, async {
                let _ = rx.await;
            })
            .await
        });
        TestServer {
            backend,
            url,
            database_url,
            clock,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
            db,
            rules: opts.rules,
            shutdown: Some(tx),
            handle: Some(handle),
            _dir: dir,
        }
    }

    /// GET with the admin token: status, a header's value and the body as it came.
    pub async fn get_text(&self, path: &str, header: &str) -> (u16, Option<String>, String) {
        let resp = self
            .client
            .get(format!("{}{}", self.url, path))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("request sent");
        let status = resp.status().as_u16();
        let h = resp
            .headers()
            .get(header)
            .map(|v| v.to_str().unwrap().to_owned());
        (status, h, resp.text().await.unwrap())
    }

    /// Stop the server gracefully and wait until it has finished.
    pub async fn stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.handle.take() {
            h.await.unwrap().unwrap();
        }
        assert_statements_audited();
    }

    /// Stop the server and drop its PostgreSQL database (SQLite's goes with its directory).
    pub async fn finish(mut self) {
        self.stop().await;
        let base = pg_base_url();
        if let Some(name) = self.database_url.strip_prefix(&format!("{base}/")) {
            let admin = sqlx::PgPool::connect(&format!("{base}/postgres"))
                .await
                .unwrap();
            sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .execute(&admin)
                .await
                .unwrap();
        }
    }

    /// A value of `/metrics` (0 when absent).
    pub async fn metric(&self, name: &str) -> f64 {
        let (_, _, text) = self.get_text("/metrics", "content-type").await;
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    }

    /// Stop this server and start another on the same database (fresh memory, same
    /// ledger), its clock where this one's was.
    pub async fn restart(mut self, mut opts: Options) -> TestServer {
        self.stop().await;
        opts.clock_start = self.clock.now();
        let dir = self._dir.take();
        TestServer::start_on(self.backend, self.database_url.clone(), dir, opts).await
    }

    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let mut req = self
            .client
            .request(method.parse().unwrap(), format!("{}{}", self.url, path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.expect("request sent");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, value)
    }

    pub async fn admin(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let (status, v) = self.call(method, path, Some(ADMIN), body.as_ref()).await;
        assert!(status < 300, "{method} {path} -> {status}: {v}");
        v
    }

    pub async fn create_org(&self, org: &str, plan: &str) {
        self.admin(
            "PUT",
            &format!("/v1/orgs/{org}"),
            Some(json!({"name": org, "plan": plan})),
        )
        .await;
    }

    /// A token with `scopes`, optionally bound to `org`, created through the store.
    pub async fn token(&self, scopes: &[rush_meter::tokens::Scope], org: Option<&str>) -> String {
        let (row, secret) = rush_meter::tokens::new_token(scopes, org, "test", self.clock.now());
        self.db
            .insert_token(&row, &rush_meter_core::audit::Actor::system("test"))
            .await
            .unwrap();
        secret
    }

    pub async fn heartbeats(&self, beats: Vec<Value>) -> (u16, Value) {
        self.call(
            "POST",
            "/v1/heartbeats",
            Some(ADMIN),
            Some(&json!({"heartbeats": beats})),
        )
        .await
    }

    /// An admission of `session` on `org`'s `key` (agent `codex`), answered 200.
    pub async fn admit(&self, org: &str, key: &str, session: &str) -> Value {
        let body = json!({"org_id": org, "key_id": key, "session_id": session, "agent": "codex"});
        let (status, v) = self
            .call("POST", "/v1/admissions", Some(ADMIN), Some(&body))
            .await;
        assert_eq!(status, 200, "{v}");
        v
    }

    pub async fn usage(&self, org: &str) -> Value {
        self.admin("GET", &format!("/v1/orgs/{org}/usage"), None)
            .await
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if !std::thread::panicking() {
            assert_statements_audited();
        }
    }
}

/// The `rush-meter` binary serving `database_url` on a free port with `token` as its
/// bootstrap admin token; returns once `/readyz` answers 200 (at most 30 s).
pub async fn spawn_service(database_url: &str, token: &str) -> (tokio::process::Child, String) {
    spawn_service_with(database_url, token, &[]).await
}

/// `spawn_service` with extra environment variables.
pub async fn spawn_service_with(
    database_url: &str,
    token: &str,
    envs: &[(&str, &str)],
) -> (tokio::process::Child, String) {
    let (child, base, _) = spawn_service_logging(database_url, token, envs, "error").await;
    (child, base)
}

/// A spawned service's log lines (JSON, one object a line), as they come.
pub type Logs = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// `spawn_service_with`, logging at `level` (`RUST_LOG`) in JSON; the lines are kept in
/// the returned `Logs` and echoed to the test's stderr.
///
/// The service picks its own port (`--listen 127.0.0.1:0`) and the address is read from
/// its "serving" line: a port found free by the test and handed over could be taken by
/// another test's process meanwhile, and then `/readyz` would answer from that one.
pub async fn spawn_service_logging(
    database_url: &str,
    token: &str,
    envs: &[(&str, &str)],
    level: &str,
) -> (tokio::process::Child, String, Logs) {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_rush-meter"))
        .args(["--database-url", database_url, "--listen", "127.0.0.1:0"])
        .env("RUSH_METER_BOOTSTRAP_ADMIN_TOKEN", token)
        .env("RUSH_METER_PLANS_DIR", repo_plans())
        .env("RUSH_METER_LOG_FORMAT", "json")
        .env("RUST_LOG", format!("{level},rush_meter::cli::serve=info"))
        .envs(envs.iter().copied())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let logs = Logs::default();
    let (tx, rx) = oneshot::channel();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let kept = logs.clone();
    tokio::spawn(async move {
        let mut announce = Some(tx);
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("{line}");
            let serving = serde_json::from_str::<Value>(&line)
                .ok()
                .filter(|v| v["message"] == "rush-meter serving")
                .and_then(|v| v["listen"].as_str().map(str::to_owned));
            if let Some(addr) = serving {
                announce.take().map(|tx| tx.send(addr));
            }
            kept.lock().unwrap().push(line);
        }
    });
    // Dropped unsent when the process exits before it serves.
    let addr = match tokio::time::timeout(Duration::from_secs(30), rx).await {
        Ok(Ok(addr)) => addr,
        Ok(Err(_)) => panic!(
            "the service exited before serving: {:?}",
            child.wait().await
        ),
        Err(_) => panic!("the service did not serve within 30 s"),
    };
    let base = format!("http://{addr}");
    let client = reqwest::Client::new();
    eventually(30, "the service is ready", || async {
        client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
    (child, base, logs)
}

/// Beat `session` of `org` every 15 s from `from`, moving the server's clock along, until
/// an answer says `park`; then park it there, at the time returned. Panics if no answer
/// says `park` within an hour.
pub async fn beat_until_told_to_park(
    srv: &TestServer,
    org: &str,
    session: &str,
    from: Secs,
) -> Secs {
    let (mut t, mut seq) = (from, 0);
    loop {
        srv.clock.set(t);
        seq += 1;
        let (status, v) = srv
            .heartbeats(vec![hb(org, session, seq, "running", t)])
            .await;
        assert_eq!(status, 200, "{v}");
        if v["results"][0]["action"] == "park" {
            let (status, v) = srv
                .heartbeats(vec![hb(org, session, seq + 1, "parked", t)])
                .await;
            assert_eq!(status, 200, "{v}");
            return t;
        }
        t += 15;
        assert!(t < from + 3600, "never told to park");
    }
}

/// Turn on `org`'s pay-as-you-go under a 0.10 cap, admit session `s1` on key `k1`, and
/// run it until it is told to park (on `mini`: past the week's 180 s and the cap's 100 s
/// of pay-as-you-go), from `from`.
pub async fn run_past_the_plan_to_the_cap(srv: &TestServer, org: &str, from: Secs) -> Secs {
    srv.admin(
        "PUT",
        &format!("/v1/orgs/{org}/overage"),
        Some(json!({"enabled": true, "monthly_cap": "0.10"})),
    )
    .await;
    let d = srv.admit(org, "k1", "s1").await;
    assert_eq!(d["decision"], "allow", "{d}");
    beat_until_told_to_park(srv, org, "s1", from).await
}

pub mod audit;
pub mod fake_stripe;
pub mod localstripe;
pub mod node;
pub mod shards;
pub mod venv;

/// Poll `check` until it holds, for at most `secs` seconds (events are processed in the
/// background); panics with `what` if it never does.
pub async fn eventually<F, Fut>(secs: u64, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while !check().await {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A heartbeat as a supervisor sends it, `sent_at` as RFC 3339.
pub fn hb(org: &str, session: &str, seq: i64, state: &str, at: Secs) -> Value {
    json!({"org_id": org, "session_id": session, "vm_id": format!("vm_{session}"),
           "seq": seq, "state": state, "sent_at": rush_meter_core::time::format_rfc3339(at)})
}

/// A server with the plans of `plans_dir` (such as `mini_plans()`'s); `None` where its
/// backend is not there (outside CI).
pub async fn start_with_plans(backend: Backend, plans_dir: &std::path::Path) -> Option<TestServer> {
    TestServer::start_with(
        backend,
        Options {
            plans_dir: plans_dir.to_path_buf(),
            ..Options::default()
        },
    )
    .await
}

/// Two instances on one fresh PostgreSQL database, with the plans of `plans_dir`; `None`
/// where PostgreSQL is not there (outside CI).
pub async fn two_instances(plans_dir: &std::path::Path) -> Option<(TestServer, TestServer)> {
    let (url, _) = fresh_database(Backend::Postgres).await?;
    let opts = || Options {
        plans_dir: plans_dir.to_path_buf(),
        ..Options::default()
    };
    let a = TestServer::start_on(Backend::Postgres, url.clone(), None, opts()).await;
    let b = TestServer::start_on(Backend::Postgres, url, None, opts()).await;
    Some((a, b))
}

/// What `run_staggered_until_parked` saw: how many sessions were told to park, and the least
/// `remaining_seconds` an answer gave.
pub struct Parked {
    pub told: usize,
    pub least_remaining: i64,
}

/// `sessions` of `org` (admitted already), each beating every 15 s from `T0` at its own
/// offset and parking as soon as an answer says so, through `servers` in turn, all on one
/// meter time. A session never told to park within an hour fails the test.
pub async fn run_staggered_until_parked(
    servers: &[&TestServer],
    org: &str,
    sessions: &[String],
) -> Parked {
    let n = sessions.len();
    let mut seq = vec![0i64; n];
    let mut parked = vec![false; n];
    let mut out = Parked {
        told: 0,
        least_remaining: i64::MAX,
    };
    let mut t = T0;
    while parked.iter().any(|p| !p) {
        assert!(t < T0 + 3600, "sessions never told to park");
        for s in servers {
            s.clock.set(t);
        }
        let due: Vec<usize> = (0..n)
            .filter(|i| !parked[*i] && (t - T0) % 15 == (*i as i64 * 2) % 15)
            .collect();
        for i in due {
            let server = servers[(t as usize + i) % servers.len()];
            seq[i] += 1;
            let (status, v) = server
                .heartbeats(vec![hb(org, &sessions[i], seq[i], "running", t)])
                .await;
            assert_eq!(status, 200, "{v}");
            let answer = &v["results"][0];
            out.least_remaining = out
                .least_remaining
                .min(answer["remaining_seconds"].as_i64().unwrap());
            if answer["action"] == "park" {
                out.told += 1;
                seq[i] += 1;
                let (status, _) = server
                    .heartbeats(vec![hb(org, &sessions[i], seq[i], "parked", t)])
                    .await;
                assert_eq!(status, 200);
                parked[i] = true;
            }
        }
        t += 1;
    }
    out
}

/// The process's subscriber: the server's logs under the failing test (`RUST_LOG=debug`),
/// and, but in the benchmarks (whose figures it would cost), the statement audit
/// (`audit`) of every statement the store sends.
fn init_tracing(audit_statements: bool) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let logs = tracing_subscriber::fmt::layer()
        .with_test_writer()
        .with_filter(tracing_subscriber::EnvFilter::from_default_env());
    let statements = audit_statements.then(|| {
        audit::StatementAudit.with_filter(
            tracing_subscriber::filter::Targets::new()
                .with_target("sqlx::query", tracing::Level::TRACE),
        )
    });
    let _ = tracing_subscriber::registry()
        .with(logs)
        .with(statements)
        .try_init();
}

/// Fails the test if a statement sent so far breaks the audit's rule (`audit`).
pub fn assert_statements_audited() {
    let bad = audit::violations();
    assert!(
        bad.is_empty(),
        "statements that lock, upsert or claim org rows without naming their orgs: {bad:#?}"
    );
}

/// What a test run on one backend is given: a server started with the default options,
/// or the backend itself (the test starts what it needs).
pub trait OnBackend: Sized {
    fn on(backend: Backend) -> impl Future<Output = Option<Self>>;
}

impl OnBackend for TestServer {
    async fn on(backend: Backend) -> Option<TestServer> {
        TestServer::start(backend).await
    }
}

impl OnBackend for Backend {
    async fn on(backend: Backend) -> Option<Backend> {
        Some(backend)
    }
}

/// Run `test` on `backend`; without PostgreSQL outside CI it does not run (with a note,
/// from `fresh_database`); on CI that fails.
pub async fn run_on<T: OnBackend, Fut: Future<Output = ()>>(
    backend: Backend,
    test: impl FnOnce(T) -> Fut,
) {
    if let Some(arg) = T::on(backend).await {
        test(arg).await
    }
}

/// The one way to run a test on every backend: each `async fn name(srv: TestServer)` or
/// `async fn name(backend: Backend)` written inside it (or, for functions written outside,
/// each name listed: `every_backend!(a, b)`) becomes the tests `name::sqlite` and
/// `name::postgres`. A test that compares the backends with each other (the seeded
/// simulation, the drills' report) runs them in turn over `Backend::ALL`.
#[macro_export]
macro_rules! every_backend {
    ($($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    $crate::common::run_on($crate::common::Backend::Sqlite, super::$name).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    $crate::common::run_on($crate::common::Backend::Postgres, super::$name).await
                }
            }
        )+
    };
    ($(async fn $name:ident($arg:ident : $ty:ty) $body:block)*) => {
        $(
            #[allow(unused_mut)]
            async fn $name(mut $arg: $ty) $body
        )*
        $crate::every_backend!($($name),*);
    };
}
