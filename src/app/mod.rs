//! The services on the core: start-up, the group-commit writers (heartbeats, the gate),
//! the background jobs, and graceful shutdown. The shells (HTTP, the CLI) act through
//! `Services`.

pub mod admission;
pub mod auto_topup;
pub mod bill_preview;
pub mod breaker;
pub mod funding;
pub mod group_commit;
pub mod history;
pub mod ingest;
pub mod jobs;
pub mod limits;
pub mod member_page;
pub mod notifier;
pub mod orgs;
pub mod pace;
pub mod periods;
pub mod plan_versions;
pub mod sessions;
pub mod standing;
pub mod stripe_events;
pub mod tokens;
pub mod usage;

use std::future::Future;
use std::sync::Arc;

use rush_meter_core::ledger::Rules;
use rush_meter_core::plans::{PlanError, Plans};
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::billing::Billing;
use crate::clock::Clock;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::store::{Db, PoolSettings, StoreError};
use crate::tokens::{token_row, Scope};
use admission::{Admitter, Gate};
use breaker::Breaker;
use ingest::{Ingest, Ingestor};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("plans: {0}")]
    Plans(#[from] PlanError),
    #[error("cannot open the database ({0}); check --database-url / RUSH_METER_DATABASE_URL")]
    Database(#[from] StoreError),
    #[error("migrations failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("cannot listen on {addr}: {source}; check --listen / RUSH_METER_LISTEN")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// What a service refuses, in words a shell maps once (HTTP: `http::error`); every other
/// failure is the store's.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("no org `{0}`")]
    OrgNotFound(String),
    #[error("no session `{0}`")]
    SessionNotFound(String),
    /// A session id named without its org that several orgs' sessions have.
    #[error("sessions of several orgs have the id `{0}`")]
    SessionIdShared(String),
    /// Something else the request names that is not there; the message says what.
    #[error("{0}")]
    NotFound(String),
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    /// An idempotency key given again with a different grant.
    #[error("idempotency key of grant `{0}` reused")]
    GrantKeyReused(String),
    #[error("{}: {}", .0.field, .0.message)]
    Funding(rush_meter_core::funding::Invalid),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<rush_meter_core::funding::Invalid> for Refusal {
    fn from(e: rush_meter_core::funding::Invalid) -> Refusal {
        Refusal::Funding(e)
    }
}

impl Refusal {
    pub fn invalid(field: &'static str, message: impl Into<String>) -> Refusal {
        Refusal::Invalid {
            field,
            message: message.into(),
        }
    }
}

/// A service's answer.
pub type Outcome<T> = Result<T, Refusal>;

/// What the shells act through. Cloning shares it.
#[derive(Clone)]
pub struct Services {
    pub db: Db,
    pub plans: Arc<Plans>,
    pub rules: Rules,
    pub clock: Clock,
    pub ingestor: Ingestor,
    pub admitter: Admitter,
    pub billing: Billing,
    pub metrics: Arc<Metrics>,
    /// Open while the database is known to be down: requests get 503 at once.
    pub breaker: Arc<Breaker>,
    /// Wakes the Stripe event job when a webhook stored a new event.
    pub stripe_wake: Arc<Notify>,
    /// When each token was last used, written by a job in batches.
    pub last_used: Arc<crate::tokens::LastUsed>,
    /// Each org's billing period as last read, so its windows' sums are read beside it.
    pub periods: standing::PeriodGuesses,
    /// Touched by each heartbeat and admission group, so that idle jobs look sooner.
    pub activity: Arc<pace::Activity>,
    pub auto_topups: auto_topup::AutoTopups,
}

impl Services {
    /// Whether this instance can serve: the database answers a ping within a second and
    /// is not known to be down. The database's kind, or why not.
    pub async fn ready(&self) -> Result<&'static str, String> {
        if self.breaker.is_open() {
            return Err("the database was found down and is not yet back".into());
        }
        match tokio::time::timeout(std::time::Duration::from_secs(1), self.db.ping()).await {
            Ok(Ok(())) => Ok(self.db.backend().as_str()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("the database did not answer within 1 s".into()),
        }
    }
}

/// A started service: database open and migrated, plans loaded, writers and jobs running.
pub struct App {
    pub services: Services,
    writers: Vec<JoinHandle<()>>,
    jobs: Vec<JoinHandle<()>>,
    stop_jobs: watch::Sender<bool>,
}

/// Open the database named by the config and bring its schema up to date.
pub async fn open_db(config: &Config) -> Result<Db, StartError> {
    let db = Db::connect(&config.database_url, PoolSettings::default()).await?;
    db.migrate().await?;
    Ok(db)
}

impl App {
    pub async fn start(config: &Config, clock: Clock) -> Result<App, StartError> {
        let plans = Arc::new(crate::config::load_plans(&config.plans_dir)?);
        let db = open_db(config).await?;
        plan_versions::seal(&db, &plans, clock.now()).await?;
        if let Some(secret) = &config.bootstrap_admin_token {
            use secrecy::ExposeSecret;
            let row = token_row(
                secret.expose_secret(),
                &Scope::ALL,
                None,
                "bootstrap",
                clock.now(),
            );
            let actor = rush_meter_core::audit::Actor::system(
                "bootstrap admin token (RUSH_METER_BOOTSTRAP_ADMIN_TOKEN)",
            );
            db.insert_token(&row, &actor).await?;
            if db
                .token_by_hash(&row.secret_hash)
                .await?
                .is_some_and(|t| t.revoked_at.is_some())
            {
                tracing::warn!(
                    "the bootstrap admin token was revoked and stays revoked: set a new \
                     RUSH_METER_BOOTSTRAP_ADMIN_TOKEN to have one"
                );
            }
        }
        let metrics = Arc::new(Metrics::default());
        let (watch, crossings) = match &config.notify {
            Some(_) => {
                let (w, rx) = notifier::Watch::new();
                (w, Some(rx))
            }
            None => (notifier::Watch::default(), None),
        };
        let activity = Arc::new(pace::Activity::default());
        let (auto_topups, opened_packs) = auto_topup::AutoTopups::new(
            db.clone(),
            (Arc::clone(&plans), config.rules),
            clock.clone(),
            Arc::clone(&metrics),
        );
        let (ingestor, mut writers) = Ingest::new(
            db.clone(),
            Arc::clone(&plans),
            config.rules,
            clock.clone(),
            Arc::clone(&metrics),
            (watch.clone(), auto_topups.clone()),
            Arc::clone(&activity),
        )
        .start();
        let (admitter, gate_writers) = Gate {
            db: db.clone(),
            plans: Arc::clone(&plans),
            rules: config.rules,
            clock: clock.clone(),
            activity: Arc::clone(&activity),
            auto_topups: auto_topups.clone(),
        }
        .start();
        writers.extend(gate_writers);
        let billing = Billing::new(
            db.clone(),
            Arc::clone(&plans),
            clock.clone(),
            config.stripe.clone(),
            Arc::clone(&metrics),
        );
        let services = Services {
            db,
            plans,
            rules: config.rules,
            clock,
            ingestor,
            admitter,
            billing,
            metrics,
            breaker: Arc::default(),
            stripe_wake: Arc::default(),
            last_used: Arc::default(),
            periods: standing::PeriodGuesses::default(),
            activity,
            auto_topups,
        };
        let (stop_jobs, stop) = watch::channel(false);
        let jobs = jobs::start(&services, config, (watch, crossings), opened_packs, &stop);
        Ok(App {
            services,
            writers,
            jobs,
            stop_jobs,
        })
    }

    /// Serve `router` on `listener` until `shutdown` resolves; then finish the requests
    /// in flight, commit every queued heartbeat, and stop the background jobs.
    pub async fn serve<L>(
        self,
        listener: L,
        router: axum::Router,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()>
    where
        L: axum::serve::Listener,
        L::Addr: std::fmt::Debug,
    {
        let App {
            services,
            writers,
            jobs,
            stop_jobs,
        } = self;
        let db = services.db.clone();
        // The router holds the last clones of the writers' queues besides this one.
        drop(services);
        let served = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await;
        // The router (and with it the last queue sender) is gone: writers drain and exit.
        let _ = stop_jobs.send(true);
        for handle in writers.into_iter().chain(jobs) {
            let _ = handle.await;
        }
        db.close().await;
        served
    }
}

/// Connections the kernel holds accepted for the instance before it takes them (the
/// listen backlog; `net.core.somaxconn` caps it). Past `RUSH_METER_MAX_CONNECTIONS` the
/// instance stops taking them, and a connection past the backlog has its handshake dropped
/// and retried by the client after 1, 3, 7, 15 s…: a long backlog keeps clients in line
/// rather than in a backoff some of them lose (tokio's own is 1024).
const LISTEN_BACKLOG: u32 = 4096;

/// Bind the configured address.
pub async fn bind(config: &Config) -> Result<TcpListener, StartError> {
    let addr = config.listen;
    let listen = || {
        let socket = match addr {
            std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        // As std's and tokio's own bind: a restart may bind while old connections linger.
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(LISTEN_BACKLOG)
    };
    listen().map_err(|source| StartError::Listen { addr, source })
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down: finishing requests in flight");
}
