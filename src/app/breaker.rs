//! Failing fast while the database is down. A request that finds the database unreachable
//! waits out the pool's acquire timeout (3 s) before its 503; once one has, the breaker
//! checks with a fresh connection and, if the database is down, opens: every request
//! that needs it is answered 503 at once (`http::fail_fast`) until a probe (every 250 ms)
//! connects again. A saturated pool is not an outage: the fresh connection then succeeds
//! and nothing trips.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};

use crate::store::Db;

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

    /// A request was answered 503 for an unreachable database: check whether it is down.
    pub fn suspect(&self) {
        self.suspect.notify_one();
    }
}

/// Confirms a suspected outage and closes the breaker once the database answers again.
pub async fn watch(db: Db, breaker: Arc<Breaker>, mut stop: watch::Receiver<bool>) {
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
