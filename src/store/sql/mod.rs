//! The SQL written once for both backends and compiled once for each: `store::pg` and
//! `store::sqlite` each declare this directory as their module `sql`, with `Engine` (here
//! `D`) their backend type. All that differs between the two (the words, the pools, how a
//! transaction begins, the set-based statements, the fast paths) is what `D` implements of
//! the traits of dialect.rs (`Dialect`, `SessionRows`, `GateRows`): nothing here names a
//! backend's item otherwise.

// What the shared SQL and its backends use, in one place (`use super::*` below, `use
// sql::*` in each backend).
pub(crate) use std::collections::{BTreeMap, HashMap, HashSet};

pub(crate) use async_trait::async_trait;
pub(crate) use futures_util::future::BoxFuture;
pub(crate) use rush_meter_core::audit::{Action, Actor, ActorKind, Entry};
pub(crate) use rush_meter_core::booking::Booking;
pub(crate) use rush_meter_core::breakdown::{GroupBy, Piece};
pub(crate) use rush_meter_core::charges::Terms;
pub(crate) use rush_meter_core::export::{PeriodFunding, SessionLine};
pub(crate) use rush_meter_core::funding::{
    Funds, Grant, GrantKind, Overage, Source, WindowFunds, WindowKind,
};
pub(crate) use rush_meter_core::gate::{
    AdmissionRequest, AdmitReject, Decision, GroupFacts, GroupOutcome, LimitFigures, Reason, Rule,
    RunMembers, Verdict,
};
pub(crate) use rush_meter_core::heartbeats::{self, Heartbeat, RequestOutcome};
pub(crate) use rush_meter_core::ledger::{EndStatus, Phase, Rules, SessionLedger, VmState};
pub(crate) use rush_meter_core::members::{Dimension, Limit, LimitKind, MemberUsage};
pub(crate) use rush_meter_core::org::{Key, Org};
pub(crate) use rush_meter_core::plans::Plans;
pub(crate) use rush_meter_core::session::{key as session_key, Session, SessionKey};
pub(crate) use rush_meter_core::standing::WindowTotals;
pub(crate) use rush_meter_core::time::{full_hours, partial_hours, Interval, Secs, Windows};
pub(crate) use rust_decimal::Decimal;
pub(crate) use sqlx::{Pool, Transaction};
pub(crate) use tokio::sync::mpsc;

use super::Engine as D;
pub(crate) use crate::store::api::{
    AuditStore, AutoTopupStore, DecideState, DeclineRecord, FundingStore, GateStore, LedgerStore,
    MemberStore, NewPack, NotificationStore, OrgStore, OverageStore, PeriodStore, PlanStore,
    RecordedVersion, RoomWait, StripeStore, TermsOf, VersionMove, Written,
};
pub(crate) use crate::store::{
    AutoTopupRow, FrozenOrgRow, LineQuery, NotificationRow, OrgUpsert, OverageChargeRow, PeriodRow,
    Rec, StoreError, StoreResult, StripeEventRow, StripeRequestRow, TokenRow,
};

mod audit;
mod auto_topups;
mod dialect;
mod funding;
mod gate;
mod ledger;
mod members;
mod notifications;
mod orgs;
mod overage;
mod periods;
mod plans;
mod rows;
mod stripe;
mod values;
mod window_sums;

pub(crate) use self::{
    audit::*, dialect::*, funding::*, gate::*, ledger::*, members::*, orgs::*, periods::*, rows::*,
    values::*, window_sums::*,
};

/// The backend's database (`sqlx::Postgres` or `sqlx::Sqlite`), its rows and transactions.
pub(crate) type DB = <D as Dialect>::DB;
pub(crate) type Row = <D as Dialect>::Row;
pub(crate) type Tx = Transaction<'static, DB>;

// The backend's words, named here so that the SQL can write them in its format strings.
const BEGIN_WRITE: &str = D::BEGIN_WRITE;
const FOR_UPDATE: &str = D::FOR_UPDATE;
const SKIP_LOCKED: &str = D::SKIP_LOCKED;
const LEAST: &str = D::LEAST;
const GREATEST: &str = D::GREATEST;
const BYTE_ORDER: &str = D::BYTE_ORDER;
const LOCK_ORGS: &str = D::LOCK_ORGS;
const JSON_AGG: &str = D::JSON_AGG;
const JSON_ARRAY: &str = D::JSON_ARRAY;

/// The slots a key holds: `(org_id, key_id, count)`.
pub(crate) type SlotCount = (String, String, i64);

/// Rows a multi-row statement carries at most (SQLite allows 32,766 bound values).
pub(crate) const CHUNK: usize = 500;

pub(crate) async fn begin_write(pool: &Pool<DB>) -> StoreResult<Tx> {
    begin_whole(pool, BEGIN_WRITE).await
}

/// Begin a transaction with `statement` on a task of its own, which finishes even when the
/// caller is dropped mid-way (a client gone, a timeout): sqlx 0.8.6 counts a transaction as
/// begun only once BEGIN's answer is read, so a caller dropped while it is on its way sends
/// the connection back to the pool inside a transaction nothing will end (PostgreSQL:
/// transact-rs/sqlx#4393, mended upstream by #4394; SQLite too, tests/pool.rs). The next
/// user's statements then run in it: a write outside a transaction stays uncommitted, and
/// is lost when the connection closes. Here a transaction nobody takes is dropped once
/// begun, which rolls it back.
async fn begin_whole(pool: &Pool<DB>, statement: &'static str) -> StoreResult<Tx> {
    let pool = pool.clone();
    match tokio::spawn(async move { pool.begin_with(statement).await }).await {
        Ok(tx) => Ok(tx?),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // The runtime is shutting down.
        Err(_) => Err(sqlx::Error::PoolClosed.into()),
    }
}

/// Begin a group commit's transaction (`begin_hot`) in place: the gate's and ingest's
/// writers run on tasks of their own that nothing drops mid-group, so the task
/// `begin_whole` spawns would only add a hand-off to every group.
pub(crate) async fn begin_in_writer(pool: &Pool<DB>, statement: &'static str) -> StoreResult<Tx> {
    Ok(pool.begin_with(statement).await?)
}

/// Shards a group or a read of many orgs works on at once where the store works a shard at
/// a time (`Dialect::commits_by_shard`): enough to overlap their round trips, few enough
/// to leave the pool to the other writers.
pub(crate) const SHARDS_AT_ONCE: usize = 4;

/// Run `parts` (a shard's work each), `SHARDS_AT_ONCE` at once; their results in order, or
/// the first error. (Boxed: the compiler cannot prove a stream of unboxed futures
/// borrowing the caller's data `Send` inside the store's `async_trait`s.)
pub(crate) async fn shards_at_once<T>(
    parts: Vec<futures_util::future::BoxFuture<'_, StoreResult<T>>>,
) -> StoreResult<Vec<T>> {
    use futures_util::{StreamExt as _, TryStreamExt as _};
    futures_util::stream::iter(parts)
        .buffered(SHARDS_AT_ONCE)
        .try_collect()
        .await
}

/// The distinct items, in byte order: the order every writer takes its locks in.
pub(crate) fn sorted_unique<T: Ord>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut v: Vec<T> = items.collect();
    v.sort_unstable();
    v.dedup();
    v
}

impl D {
    /// `orgs` grouped by the shard their rows live on: shards in order, orgs in byte
    /// order within each, the order every writer takes its locks in. Each statement that
    /// locks, upserts or claims org rows is sent once a shard, so that a distributed
    /// PostgreSQL routes it to one node; on one PostgreSQL (or SQLite) there is one shard,
    /// and one statement for all.
    pub(crate) async fn by_shard<'a>(
        &self,
        tx: &mut Tx,
        orgs: impl Iterator<Item = &'a str>,
    ) -> StoreResult<BTreeMap<i64, Vec<&'a str>>> {
        let orgs = sorted_unique(orgs);
        let ids = self.shard_ids(&mut **tx, &orgs).await?;
        let mut out: BTreeMap<i64, Vec<&'a str>> = BTreeMap::new();
        for (org, shard) in orgs.into_iter().zip(ids) {
            out.entry(shard).or_default().push(org);
        }
        Ok(out)
    }

    /// Lock and read the sessions that `(org, session)` pairs name, each looked for in the
    /// org that names it, shard after shard.
    pub(crate) async fn lock_sessions(
        &self,
        tx: &mut Tx,
        named: &[(&str, &str)],
    ) -> StoreResult<HashMap<SessionKey, Session>> {
        let shards = self.by_shard(tx, named.iter().map(|(o, _)| *o)).await?;
        let mut found = HashMap::with_capacity(named.len());
        for orgs in shards.values() {
            // In session id order (then org): the order the rows are locked in.
            let pairs = sorted_unique(
                named
                    .iter()
                    .filter(|(o, _)| orgs.binary_search(o).is_ok())
                    .map(|(o, s)| (*s, *o)),
            );
            for chunk in pairs.chunks(CHUNK) {
                for Rec(s) in self.lock_session_rows(tx, orgs, chunk).await? {
                    found.insert(s.key(), s);
                }
            }
        }
        Ok(found)
    }

    /// The shard of each of `orgs`, outside any transaction.
    pub(crate) async fn shards_now<'a>(
        &self,
        orgs: &[&'a str],
    ) -> StoreResult<HashMap<&'a str, i64>> {
        let ids = match self.known_shard_ids(orgs) {
            Some(ids) => ids,
            None => {
                let mut conn = self.write().acquire().await?;
                self.shard_ids(&mut conn, orgs).await?
            }
        };
        Ok(orgs.iter().copied().zip(ids).collect())
    }

    /// `orgs` cut by shard where the store works a shard at a time and they lie on
    /// several (Citus plans a statement of many shards' orgs through the coordinator);
    /// else all of them as one part.
    pub(crate) async fn parts_by_shard<'a>(
        &self,
        orgs: &[&'a str],
    ) -> StoreResult<Vec<Vec<&'a str>>> {
        if !self.commits_by_shard() || orgs.len() < 2 {
            return Ok(vec![orgs.to_vec()]);
        }
        let mut by_shard: BTreeMap<i64, Vec<&'a str>> = BTreeMap::new();
        for (org, shard) in self.shards_now(orgs).await? {
            by_shard.entry(shard).or_default().push(org);
        }
        Ok(by_shard.into_values().collect())
    }

    /// The shard of each of `orgs`.
    pub(crate) async fn shard_of<'a>(
        &self,
        tx: &mut Tx,
        orgs: impl Iterator<Item = &'a str>,
    ) -> StoreResult<HashMap<String, i64>> {
        let shards = self.by_shard(tx, orgs).await?;
        Ok(shards
            .iter()
            .flat_map(|(id, orgs)| orgs.iter().map(move |o| ((*o).to_owned(), *id)))
            .collect())
    }

    /// Insert the rows of sessions first seen now, a shard at a time; false if another
    /// writer made one of them first (the transaction must then start over).
    pub(crate) async fn insert_new_sessions(
        &self,
        tx: &mut Tx,
        mut rows: Vec<Session>,
    ) -> StoreResult<bool> {
        let shard_of = self
            .shard_of(tx, rows.iter().map(|s| s.org_id.as_str()))
            .await?;
        rows.sort_by_key(|s| shard_of[&s.org_id]);
        let mut inserted = 0;
        for part in rows.chunk_by(|a, b| shard_of[&a.org_id] == shard_of[&b.org_id]) {
            for chunk in part.chunks(CHUNK) {
                inserted += self.insert_new_session_rows(tx, chunk).await?;
            }
        }
        Ok(inserted == rows.len() as u64)
    }
}

/// The values of `Rec`s read by `query_as`.
pub(crate) fn unwrap_all<T>(rows: Vec<Rec<T>>) -> Vec<T> {
    rows.into_iter().map(|r| r.0).collect()
}

/// Run a group's transaction until it completes: again when it saw a row appear that it
/// could not lock (`Ok(None)`), and on a serialization failure or deadlock; 6 tries.
pub(crate) async fn retry_group<T, F, Fut>(what: &str, mut once: F) -> StoreResult<T>
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

/// A work queue (Stripe events, notifications): its table, key, due column and order.
pub(crate) struct Queue {
    table: &'static str,
    key: &'static str,
    due: &'static str,
    order: &'static str,
}

/// The claim of a work queue: take up to `limit` rows that are pending and due, oldest
/// first, of `orgs` only when given (a queue of org rows is claimed one shard's orgs at a
/// time), count an attempt and hold them `hold` seconds, so an instance that dies mid-work
/// leaves them to the others; rows another instance holds are skipped. Rows come back
/// unordered.
pub(crate) async fn claim_due<R>(
    tx: &mut Tx,
    q: &Queue,
    orgs: Option<&[&str]>,
    now: Secs,
    hold: Secs,
    limit: i64,
) -> StoreResult<Vec<R>>
where
    R: for<'r> sqlx::FromRow<'r, Row> + Send + Unpin,
{
    let Queue {
        table,
        key,
        due,
        order,
    } = q;
    let of_orgs = if orgs.is_some() {
        format!("{} AND ", D::org_in(4))
    } else {
        String::new()
    };
    let sql = format!(
        "UPDATE {table} SET attempts = attempts + 1, {due} = $1 + $2 \
         WHERE {of_orgs}{key} IN (SELECT {key} FROM {table} \
           WHERE {of_orgs}state = 'pending' AND {due} <= $1 \
           ORDER BY {order} LIMIT $3{SKIP_LOCKED}) \
         RETURNING *"
    );
    let query = sqlx::query_as::<_, R>(&sql)
        .bind(now)
        .bind(hold)
        .bind(limit);
    let query = match orgs {
        Some(orgs) => query.bind(D::id_list(orgs)),
        None => query,
    };
    Ok(query.fetch_all(&mut **tx).await?)
}

/// Row counts and sums of every table: equal digests mean no write happened between them.
pub(crate) async fn digest(pool: &Pool<DB>) -> StoreResult<Vec<(String, i64, i64)>> {
    Ok(sqlx::query_as(
        "SELECT 'orgs', COUNT(*), CAST(COALESCE(SUM(updated_at), 0) AS BIGINT) FROM orgs \
         UNION ALL SELECT 'api_keys', COUNT(*), CAST(COALESCE(SUM(updated_at + COALESCE(concurrency_limit, 0)), 0) AS BIGINT) FROM api_keys \
         UNION ALL SELECT 'tokens', COUNT(*), CAST(COALESCE(SUM(created_at + COALESCE(expires_at, 0) + COALESCE(revoked_at, 0)), 0) AS BIGINT) FROM tokens \
         UNION ALL SELECT 'sessions', COUNT(*), CAST(COALESCE(SUM(billed_seconds + heartbeats + last_at + COALESCE(last_seq, 0) + COALESCE(slot_at, 0)), 0) AS BIGINT) FROM sessions \
         UNION ALL SELECT 'spans', COUNT(*), CAST(COALESCE(SUM(end_at - start_at), 0) AS BIGINT) FROM spans \
         UNION ALL SELECT 'org_hourly', COUNT(*), CAST(COALESCE(SUM(seconds), 0) AS BIGINT) FROM org_hourly \
         UNION ALL SELECT 'session_hourly', COUNT(*), CAST(COALESCE(SUM(seconds), 0) AS BIGINT) FROM session_hourly \
         UNION ALL SELECT 'decisions', COUNT(*), CAST(COALESCE(SUM(running), 0) AS BIGINT) FROM decisions \
         UNION ALL SELECT 'periods', COUNT(*), CAST(COALESCE(SUM(agent_seconds + adjustment_seconds), 0) AS BIGINT) FROM periods \
         UNION ALL SELECT 'period_orgs', COUNT(*), CAST(COALESCE(SUM(agent_seconds), 0) AS BIGINT) FROM period_orgs \
         UNION ALL SELECT 'period_sessions', COUNT(*), CAST(COALESCE(SUM(running_seconds + parked_seconds), 0) AS BIGINT) FROM period_sessions \
         UNION ALL SELECT 'notifications', COUNT(*), CAST(COALESCE(SUM(attempts), 0) AS BIGINT) FROM notifications \
         UNION ALL SELECT 'stripe_customers', COUNT(*), CAST(0 AS BIGINT) FROM stripe_customers \
         UNION ALL SELECT 'grants', COUNT(*), CAST(COALESCE(SUM(seconds + used_seconds + priority + COALESCE(voided_at, 0)), 0) AS BIGINT) FROM grants \
         UNION ALL SELECT 'funding_windows', COUNT(*), CAST(COALESCE(SUM(plan_seconds + grant_seconds + overage_seconds + grace_seconds + charge_units), 0) AS BIGINT) FROM funding_windows \
         UNION ALL SELECT 'funding_hourly', COUNT(*), CAST(COALESCE(SUM(seconds + charge_units), 0) AS BIGINT) FROM funding_hourly \
         UNION ALL SELECT 'member_hourly', COUNT(*), CAST(COALESCE(SUM(seconds), 0) AS BIGINT) FROM member_hourly \
         UNION ALL SELECT 'member_limits', COUNT(*), CAST(COALESCE(SUM(updated_at), 0) AS BIGINT) FROM member_limits \
         UNION ALL SELECT 'audit_log', COUNT(*), CAST(COALESCE(SUM(at), 0) AS BIGINT) FROM audit_log \
         UNION ALL SELECT 'room_waits', COUNT(*), CAST(COALESCE(SUM(since), 0) AS BIGINT) FROM room_waits \
         UNION ALL SELECT 'auto_topups', COUNT(*), CAST(COALESCE(SUM(seq + attempts + updated_at), 0) AS BIGINT) FROM auto_topups",
    )
    .fetch_all(pool)
    .await?)
}
