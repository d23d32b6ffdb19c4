// What every file of the shared SQL uses. The SQL under `store/sql/` is written once and
// compiled per dialect: `include!`d by `store::pg` and `store::sqlite`, which define `DB`,
// `Backend` (with `read()` and `write()` pools), `BEGIN_WRITE`, `FOR_UPDATE`,
// `SKIP_LOCKED`, `LEAST`, `GREATEST`, `BYTE_ORDER` and the set-based statements first.
// Only this file has `use` items: the others are included into the same module.

use std::collections::HashMap;

use async_trait::async_trait;
use rush_meter_core::booking::Booking;
use rush_meter_core::breakdown::{GroupBy, Piece};
use rush_meter_core::charges::Terms;
use rush_meter_core::export::SessionLine;
use rush_meter_core::gate::{AdmissionRequest, AdmitReject, Decision, GroupFacts};
use rush_meter_core::heartbeats::{self, Heartbeat, RequestOutcome};
use rush_meter_core::ledger::{self, EndStatus, Phase, Rules, SessionLedger, VmState};
use rush_meter_core::org::{Key, Org};
use rush_meter_core::plans::Plans;
use rush_meter_core::session::Session;
use rush_meter_core::standing::WindowTotals;
use rush_meter_core::time::{full_hours, partial_hours, Secs, Windows};
use sqlx::{Pool, Transaction};
use tokio::sync::mpsc;

use super::api::{
    DecideState, GateStore, LedgerStore, NotificationStore, OrgStore, PeriodStore, StripeStore,
    TermsOf,
};
use super::{
    FrozenOrgRow, LineQuery, NotificationRow, OrgUpsert, PeriodRow, Rec, SessionCounts,
    StoreError, StoreResult, StripeEventRow, StripeRequestRow, TokenRow,
};

type Tx = Transaction<'static, DB>;


/// Rows a multi-row statement carries at most (SQLite allows 32,766 bound values).
const CHUNK: usize = 500;

async fn begin_write(pool: &Pool<DB>) -> StoreResult<Tx> {
    Ok(pool.begin_with(BEGIN_WRITE).await?)
}

/// The distinct items, in byte order: the order every writer takes its locks in.
fn sorted_unique<T: Ord>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut v: Vec<T> = items.collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The values of `Rec`s read by `query_as`.
fn unwrap_all<T>(rows: Vec<Rec<T>>) -> Vec<T> {
    rows.into_iter().map(|r| r.0).collect()
}

/// Run a group's transaction until it completes: again when it saw a row appear that it
/// could not lock (`Ok(None)`), and on a serialization failure or deadlock; 6 tries.
async fn retry_group<T, F, Fut>(what: &str, mut once: F) -> StoreResult<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = StoreResult<Option<T>>>,
{
    let mut attempt = 0;
    loop {
        match once().await {
            Ok(Some(done)) => return Ok(done),
            Ok(None) if attempt < 5 => {}
            Err(e) if e.is_retryable() && attempt < 5 => {}
            Ok(None) => return Err(StoreError::Conflict(what.to_owned())),
            Err(e) => return Err(e),
        }
        attempt += 1;
    }
}

/// The claim of a work queue (Stripe events, notifications): take up to `limit` rows of
/// `table` that are pending and due by `due_col`, oldest first by `order`, count an
/// attempt and hold them `hold` seconds, so an instance that dies mid-work leaves them to
/// the others; rows another instance holds are skipped. Rows come back unordered.
#[allow(clippy::too_many_arguments)]
async fn claim_due<R>(
    pool: &Pool<DB>,
    table: &str,
    key: &str,
    due_col: &str,
    order: &str,
    now: Secs,
    hold: Secs,
    limit: i64,
) -> StoreResult<Vec<R>>
where
    R: for<'r> sqlx::FromRow<'r, Row> + Send + Unpin,
{
    let mut tx = begin_write(pool).await?;
    let rows = sqlx::query_as::<_, R>(&format!(
        "UPDATE {table} SET attempts = attempts + 1, {due_col} = $1 + $2 \
         WHERE {key} IN (SELECT {key} FROM {table} \
           WHERE state = 'pending' AND {due_col} <= $1 \
           ORDER BY {order} LIMIT $3{SKIP_LOCKED}) \
         RETURNING *"
    ))
    .bind(now)
    .bind(hold)
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(rows)
}

async fn ping(pool: &Pool<DB>) -> StoreResult<()> {
    sqlx::query("SELECT 1").execute(pool).await?;
    Ok(())
}

/// Row counts and sums of every table: equal digests mean no write happened between them.
async fn digest(pool: &Pool<DB>) -> StoreResult<Vec<(String, i64, i64)>> {
    Ok(sqlx::query_as(
        "SELECT 'orgs', COUNT(*), CAST(COALESCE(SUM(updated_at), 0) AS BIGINT) FROM orgs \
         UNION ALL SELECT 'api_keys', COUNT(*), CAST(COALESCE(SUM(updated_at + COALESCE(concurrency_limit, 0)), 0) AS BIGINT) FROM api_keys \
         UNION ALL SELECT 'tokens', COUNT(*), CAST(COALESCE(SUM(created_at), 0) AS BIGINT) FROM tokens \
         UNION ALL SELECT 'sessions', COUNT(*), CAST(COALESCE(SUM(billed_seconds + heartbeats + last_at + COALESCE(last_seq, 0) + COALESCE(slot_at, 0)), 0) AS BIGINT) FROM sessions \
         UNION ALL SELECT 'spans', COUNT(*), CAST(COALESCE(SUM(end_at - start_at), 0) AS BIGINT) FROM spans \
         UNION ALL SELECT 'org_hourly', COUNT(*), CAST(COALESCE(SUM(seconds), 0) AS BIGINT) FROM org_hourly \
         UNION ALL SELECT 'session_hourly', COUNT(*), CAST(COALESCE(SUM(seconds), 0) AS BIGINT) FROM session_hourly \
         UNION ALL SELECT 'decisions', COUNT(*), CAST(COALESCE(SUM(running), 0) AS BIGINT) FROM decisions \
         UNION ALL SELECT 'periods', COUNT(*), CAST(COALESCE(SUM(agent_seconds + adjustment_seconds), 0) AS BIGINT) FROM periods \
         UNION ALL SELECT 'period_orgs', COUNT(*), CAST(COALESCE(SUM(agent_seconds), 0) AS BIGINT) FROM period_orgs \
         UNION ALL SELECT 'period_sessions', COUNT(*), CAST(COALESCE(SUM(running_seconds + parked_seconds), 0) AS BIGINT) FROM period_sessions \
         UNION ALL SELECT 'notifications', COUNT(*), CAST(COALESCE(SUM(attempts), 0) AS BIGINT) FROM notifications",
    )
    .fetch_all(pool)
    .await?)
}
