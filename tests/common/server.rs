//! The service in process: `TestServer`, a real server on port 0 over a fresh database,
//! with the options it starts with, its HTTP helpers, and the statement audit it runs.

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

use super::{audit, fresh_database, fresh_database_with, pg_base_url, repo_plans, Backend};
use super::{ADMIN, T0};

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
    /// The idle jobs' longest wait: their base period in tests, whose manual clock moves
    /// in jumps that no job could see coming (`app::pace` is tested on its own).
    pub jobs_idle_wait: Duration,
    pub max_connections: usize,
    pub idle_connection: Duration,
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
            jobs_idle_wait: Duration::from_secs(1),
            max_connections: 4096,
            idle_connection: Duration::from_secs(120),
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
        let config = config_of(&database_url, &opts);
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
        if let Some(coordinator) = super::citus::coordinator() {
            if let Some(name) = self.database_url.strip_prefix(&format!("{coordinator}/")) {
                super::citus::drop_database(&coordinator, name).await;
                return;
            }
        }
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
        metric_in(&text, name)
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

    /// A token with `scopes`, optionally bound to `org`, created through the store; a
    /// member token is bound to the user `member_of_<org>` too.
    pub async fn token(&self, scopes: &[rush_meter::tokens::Scope], org: Option<&str>) -> String {
        let (mut row, secret) =
            rush_meter::tokens::new_token(scopes, org, "test", self.clock.now());
        if scopes.contains(&rush_meter::tokens::Scope::Member) {
            row.user_id = org.map(|o| format!("member_of_{o}"));
        }
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

    /// Set an org's billing period as a Stripe subscription event does, behind the
    /// service's back.
    pub async fn set_billing_period(&self, org: &str, start: Secs, end: Secs) {
        let sql = "UPDATE orgs SET period_start = $1, period_end = $2 WHERE org_id = $3";
        match self.db.pools() {
            rush_meter::store::Pools::Postgres(p) => sqlx::query(sql)
                .bind(start)
                .bind(end)
                .bind(org)
                .execute(p)
                .await
                .map(drop),
            rush_meter::store::Pools::Sqlite { write, .. } => sqlx::query(sql)
                .bind(start)
                .bind(end)
                .bind(org)
                .execute(write)
                .await
                .map(drop),
        }
        .expect("set the billing period");
    }
}

/// The config a test server starts with on `database_url`.
pub fn config_of(database_url: &str, opts: &Options) -> Config {
    Config {
        database_url: database_url.to_owned(),
        listen: "127.0.0.1:0".parse().unwrap(),
        plans_dir: opts.plans_dir.clone(),
        rules: opts.rules,
        bootstrap_admin_token: Some(SecretString::from(ADMIN)),
        max_body_bytes: opts.max_body_bytes,
        stripe: opts.stripe.clone(),
        rate_limit: opts.rate_limit,
        period_settle: opts.period_settle,
        notify: opts.notify.clone(),
        export_stall: opts.export_stall,
        jobs_idle_wait: opts.jobs_idle_wait,
        max_connections: opts.max_connections,
        idle_connection: opts.idle_connection,
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

/// The value of the first line of a `/metrics` text that starts with `name` (0 when absent).
pub fn metric_in(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
}
