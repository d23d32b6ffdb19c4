//! Start-up, the background jobs, and graceful shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::admission::{Admitter, Gatekeeper};
use crate::billing::Billing;
use crate::clock::Clock;
use crate::config::Config;
use crate::http::{self, AppState};
use crate::ingest::{Ingestor, Writer};
use crate::ledger::Secs;
use crate::metrics::Metrics;
use crate::plans::{PlanError, Plans};
use crate::store::{Db, PoolSettings, StoreError};
use crate::tokens::{token_row, Scope};

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

/// A started service: database open and migrated, plans loaded, writers running.
pub struct App {
    pub state: AppState,
    max_body_bytes: usize,
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
        let plans = Arc::new(Plans::load_dir(&config.plans_dir)?);
        let db = open_db(config).await?;
        if let Some(secret) = &config.bootstrap_admin_token {
            db.insert_token(&token_row(
                secret.expose(),
                &Scope::ALL,
                None,
                "bootstrap",
                clock.now(),
            ))
            .await?;
        }
        let metrics = Arc::new(Metrics::default());
        // PostgreSQL overlaps several commits; SQLite has one write connection.
        let writers = match db {
            Db::Postgres(_) => 4,
            Db::Sqlite { .. } => 1,
        };
        let (watch, crossings) = match &config.notify {
            Some(_) => {
                let (w, rx) = crate::notify::Watch::new();
                (w, Some(rx))
            }
            None => (crate::notify::Watch::default(), None),
        };
        let (ingestor, writer_handles) = Ingestor::start(
            Writer::new(
                db.clone(),
                Arc::clone(&plans),
                config.rules,
                clock.clone(),
                Arc::clone(&metrics),
            )
            .with_watch(watch.clone()),
            writers,
        );
        // Gate groups are bigger with fewer writers; two keep one key's lock wait (on
        // another instance) from holding up every admission (reports/admission.md).
        let gate_writers = writers.min(2);
        let (admitter, gate_handles) = Admitter::start(
            Gatekeeper {
                db: db.clone(),
                plans: Arc::clone(&plans),
                rules: config.rules,
                clock: clock.clone(),
            },
            gate_writers,
        );
        let writer_handles = writer_handles.into_iter().chain(gate_handles).collect();
        let billing = Billing::new(
            db.clone(),
            Arc::clone(&plans),
            clock.clone(),
            config.stripe.clone(),
            Arc::clone(&metrics),
        );
        let workers = http::Workers {
            ingestor,
            admitter,
            billing,
        };
        let state = AppState::new(
            db,
            plans,
            config.rules,
            clock,
            workers,
            metrics,
            http::Limits {
                rate_limit: config.rate_limit,
                export_stall: config.export_stall,
            },
        );
        let (stop_jobs, stop) = watch::channel(false);
        let mut jobs = vec![
            tokio::spawn(expiry_job(state.clone(), stop.clone())),
            tokio::spawn(crate::http::breaker::watch(
                state.db.clone(),
                Arc::clone(&state.breaker),
                stop.clone(),
            )),
            tokio::spawn(stripe_event_job(state.clone(), stop.clone())),
        ];
        if let (Some(notify), Some(rx)) = (&config.notify, crossings) {
            let notifier = crate::notify::Notifier::new(
                state.db.clone(),
                state.clock.clone(),
                notify.clone(),
                Arc::clone(&state.metrics),
                watch,
            );
            jobs.push(tokio::spawn(crate::notify::run(notifier, rx, stop.clone())));
        }
        if let Some(settle) = config.period_settle {
            jobs.push(tokio::spawn(period_close_job(
                state.clone(),
                settle,
                stop.clone(),
            )));
        }
        if let (Some(every), Some(_)) = (config.stripe.reconcile_every, &config.stripe.secret_key) {
            jobs.push(tokio::spawn(reconcile_job(state.clone(), every, stop)));
        }
        Ok(App {
            state,
            max_body_bytes: config.max_body_bytes,
            writers: writer_handles,
            jobs,
            stop_jobs,
        })
    }

    /// Serve until `shutdown` resolves; then finish the requests in flight, commit every
    /// queued heartbeat, and stop the background jobs.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let App {
            state,
            max_body_bytes,
            writers,
            jobs,
            stop_jobs,
        } = self;
        let db = state.db.clone();
        let router = http::router(state, max_body_bytes);
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

/// Bind the configured address.
pub async fn bind(config: &Config) -> Result<TcpListener, StartError> {
    TcpListener::bind(config.listen)
        .await
        .map_err(|source| StartError::Listen {
            addr: config.listen,
            source,
        })
}

/// Book what time alone decides (silent sessions, parked ones past expiry) every few
/// seconds. Safe on several instances: each takes rows the others have not locked.
async fn expiry_job(state: AppState, mut stop: watch::Receiver<bool>) {
    let period = Duration::from_secs((state.rules.interval as u64).clamp(1, 15));
    const BATCH: i64 = 1000;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = stop.changed() => return,
        }
        loop {
            match state
                .db
                .expire_sessions(state.clock.now(), &state.rules, BATCH)
                .await
            {
                Ok(n) => {
                    state.metrics.sessions_expired.inc_by(n as u64);
                    if (n as i64) < BATCH {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "expiry job failed; will retry");
                    break;
                }
            }
        }
    }
}

/// Processes stored Stripe events: at once when a webhook stores one, and every few seconds
/// for retries that fall due and events another instance left behind.
async fn stripe_event_job(state: AppState, mut stop: watch::Receiver<bool>) {
    loop {
        if let Err(e) = crate::billing::events::process_due(&state.billing).await {
            tracing::warn!(error = %e, "Stripe event job failed; will retry");
        }
        if state.billing.api.is_some() {
            if let Err(e) = crate::billing::checkout::apply_due_downgrades(&state.billing).await {
                tracing::warn!(error = %e, "scheduled downgrades failed; will retry");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            _ = state.stripe_wake.notified() => {}
            _ = stop.changed() => return,
        }
    }
}

/// Closes each month once `settle` seconds have passed since its end. Every instance runs
/// it; a month is closed by whichever gets there first (`store::close_period`).
async fn period_close_job(state: AppState, settle: Secs, mut stop: watch::Receiver<bool>) {
    loop {
        let now = state.clock.now();
        let due = crate::export::due_month(now, settle);
        let done = match state.db.list_periods().await {
            Ok(p) => p.first().is_some_and(|l| l.period_end >= due.end),
            Err(e) => {
                tracing::warn!(error = %e, "period close check failed; will retry");
                true
            }
        };
        if !done {
            match crate::export::close_through(&state.db, &state.plans, due, now).await {
                // The first org came after the due month (or none yet): nothing is due.
                Ok(_) | Err(crate::export::ExportError::NothingToClose(_)) => {}
                Err(e) => tracing::warn!(error = %e, "closing billing periods failed; will retry"),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Reconciles with Stripe every `every`, so that a webhook lost for good is repaired
/// within one period. Every instance runs it; runs are idempotent.
async fn reconcile_job(state: AppState, every: Duration, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
        match crate::billing::reconcile::reconcile(&state.billing, |_| {}).await {
            Ok(r) => tracing::info!(
                subscriptions = r.subscriptions,
                changed = r.changed.len(),
                failed = r.failed.len(),
                "reconciled with Stripe"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "reconcile with Stripe failed; will retry next period")
            }
        }
    }
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
