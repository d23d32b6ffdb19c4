//! Failing fast while the database is down. A request that finds the database unreachable
//! waits out the pool's acquire timeout (3 s) before its 503; once one has, the breaker
//! checks with a fresh connection and, if the database is down, answers every request
//! that needs it with 503 at once until a probe (every 250 ms) connects again. A saturated
//! pool is not an outage: the fresh connection then succeeds and nothing trips.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::{watch, Notify};

use super::{ApiError, AppState};
use crate::store::Db;

/// Set on every 503 that says the database is unreachable.
#[derive(Clone, Copy, Debug)]
pub struct DatabaseUnreachable;

#[derive(Debug, Default)]
pub struct Breaker {
    open: AtomicBool,
    suspect: Notify,
}

/// How often an open breaker tries the database again (`Db::reachable`).
const PROBE_EVERY: Duration = Duration::from_millis(250);

impl Breaker {
    /// Requests are answered 503 at once.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }
}

/// Routes that answer without the database, or must say how it is.
fn exempt(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics" | "/openapi.json")
}

/// The middleware: refuse at once while open; report every unreachable-database 503.
pub async fn fail_fast(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if state.breaker.is_open() && !exempt(req.uri().path()) {
        return ApiError::unavailable().into_response();
    }
    let resp = next.run(req).await;
    if resp.extensions().get::<DatabaseUnreachable>().is_some() {
        state.breaker.suspect.notify_one();
    }
    resp
}

/// Confirms a suspected outage and closes the breaker once the database answers again.
pub async fn watch(db: Db, breaker: std::sync::Arc<Breaker>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = breaker.suspect.notified() => {}
            _ = stop.changed() => return,
        }
        if db.reachable().await {
            continue;
        }
        breaker.open.store(true, Ordering::Release);
        tracing::warn!("the database is unreachable: answering 503 at once until it answers");
        loop {
            tokio::select! {
                _ = tokio::time::sleep(PROBE_EVERY) => {}
                _ = stop.changed() => return,
            }
            if db.reachable().await {
                break;
            }
        }
        breaker.open.store(false, Ordering::Release);
        tracing::info!("the database answers again");
    }
}
