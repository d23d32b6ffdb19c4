// What every file of the shared SQL uses. The SQL under `store/sql/` is written once and
// compiled per dialect: `include!`d by `store::pg` and `store::sqlite`, which define `DB`,
// `Backend` (with `read()` and `write()` pools), `BEGIN_WRITE`, `FOR_UPDATE`,
// `SKIP_LOCKED`, `LEAST`, `GREATEST`, `BYTE_ORDER` and the set-based statements first.
// Only this file has `use` items: the others are included into the same module.

use std::collections::{BTreeMap, HashMap, HashSet};

use async_trait::async_trait;
use rust_decimal::Decimal;
use rush_meter_core::audit::{self, Action, Actor, ActorKind, Entry};
use rush_meter_core::booking::Booking;
use rush_meter_core::breakdown::{GroupBy, Piece};
use rush_meter_core::charges::Terms;
use rush_meter_core::export::{PeriodFunding, SessionLine};
use rush_meter_core::funding::{
    self, Funds, Grant, GrantKind, Overage, Source, WindowFunds, WindowKind,
};
use rush_meter_core::gate::{
    AdmissionRequest, AdmitReject, Decision, GroupFacts, LimitFigures, RunMembers,
};
use rush_meter_core::heartbeats::{self, Heartbeat, RequestOutcome};
use rush_meter_core::ledger::{self, EndStatus, Phase, Rules, SessionLedger, VmState};
use rush_meter_core::members::{Dimension, Limit, LimitKind, MemberUsage};
use rush_meter_core::org::{Key, Org};
use rush_meter_core::plans::Plans;
use rush_meter_core::session::Session;
use rush_meter_core::standing::WindowTotals;
use rush_meter_core::time::{full_hours, partial_hours, Interval, Secs, Windows};
use sqlx::{Pool, Transaction};
use tokio::sync::mpsc;

use super::api::{
    AuditStore, DecideState, FundingStore, GateStore, LedgerStore, MemberStore, NotificationStore,
    OrgStore, OverageStore, PeriodStore, StripeStore, TermsOf, Written,
};
use super::{
    FrozenOrgRow, OverageChargeRow, LineQuery, NotificationRow, OrgUpsert, PeriodRow, Rec,
    StoreError, StoreResult, StripeEventRow, StripeRequestRow, TokenRow,
};

type Tx = Transaction<'static, DB>;

/// The slots a key holds: `(org_id, key_id, count)`.
type SlotCount = (String, String, i64);

/// Rows a multi-row statement carries at most (SQLite allows 32,766 bound values).
const CHUNK: usize = 500;

async fn begin_write(pool: &Pool<DB>) -> StoreResult<Tx> {
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
async fn begin_in_writer(pool: &Pool<DB>, statement: &'static str) -> StoreResult<Tx> {
    Ok(pool.begin_with(statement).await?)
}

/// The distinct items, in byte order: the order every writer takes its locks in.
fn sorted_unique<T: Ord>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut v: Vec<T> = items.collect();
    v.sort_unstable();
    v.dedup();
    v
}

impl Backend {
    /// `orgs` grouped by the shard their rows live on: shards in order, orgs in byte
    /// order within each, the order every writer takes its locks in. Each statement that
    /// locks, upserts or claims org rows is sent once a shard, so that a distributed
    /// PostgreSQL routes it to one node; on one PostgreSQL (or SQLite) there is one shard,
    /// and one statement for all.
    async fn by_shard<'a>(
        &self,
        tx: &mut Tx,
        orgs: impl Iterator<Item = &'a str>,
    ) -> StoreResult<BTreeMap<i64, Vec<&'a str>>> {
        let orgs = sorted_unique(orgs);
        let ids = self.shard_ids(tx, &orgs).await?;
        let mut out: BTreeMap<i64, Vec<&'a str>> = BTreeMap::new();
        for (org, shard) in orgs.into_iter().zip(ids) {
            out.entry(shard).or_default().push(org);
        }
        Ok(out)
    }

    /// Lock and read the sessions that `(org, session)` pairs name, each looked for in the
    /// org that names it, shard after shard.
    async fn lock_sessions(
        &self,
        tx: &mut Tx,
        named: &[(&str, &str)],
    ) -> StoreResult<HashMap<String, Session>> {
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
                    found.insert(s.session_id.clone(), s);
                }
            }
        }
        Ok(found)
    }

    /// The shard of each of `orgs`.
    async fn shard_of<'a>(
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

    /// Claim the ids of sessions first seen now, then insert their rows a shard at a
    /// time; false if another writer claimed one of the ids first (the transaction must
    /// then start over).
    async fn insert_new_sessions(&self, tx: &mut Tx, mut rows: Vec<Session>) -> StoreResult<bool> {
        for chunk in rows.chunks(CHUNK) {
            if !claim_all(tx, chunk).await? {
                return Ok(false);
            }
        }
        let shard_of = self.shard_of(tx, rows.iter().map(|s| s.org_id.as_str())).await?;
        rows.sort_by_key(|s| shard_of[&s.org_id]);
        let mut inserted = 0;
        for part in rows.chunk_by(|a, b| shard_of[&a.org_id] == shard_of[&b.org_id]) {
            for chunk in part.chunks(CHUNK) {
                inserted += insert_new_session_rows(tx, chunk).await?;
            }
        }
        Ok(inserted == rows.len() as u64)
    }

    /// The owner of each of `ids` that exists.
    async fn owners(&self, tx: &mut Tx, ids: &[&str]) -> StoreResult<HashMap<String, String>> {
        let mut owners = HashMap::with_capacity(ids.len());
        for chunk in ids.chunks(CHUNK) {
            owners.extend(select_owners(tx, chunk).await?);
        }
        Ok(owners)
    }
}

/// Claim the ids of `sessions` (at most `CHUNK`) for their orgs; false if another writer
/// holds one of them.
async fn claim_all(tx: &mut Tx, sessions: &[Session]) -> StoreResult<bool> {
    let pairs: Vec<(&str, &str)> = sessions
        .iter()
        .map(|s| (s.org_id.as_str(), s.session_id.as_str()))
        .collect();
    Ok(claim_owners(tx, &pairs).await?.len() == pairs.len())
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

/// A work queue (Stripe events, notifications): its table, key, due column and order.
struct Queue {
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
async fn claim_due<R>(
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
        format!("{} AND ", org_in(4))
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
        Some(orgs) => query.bind(org_list(orgs)),
        None => query,
    };
    Ok(query.fetch_all(&mut **tx).await?)
}

/// Row counts and sums of every table: equal digests mean no write happened between them.
async fn digest(pool: &Pool<DB>) -> StoreResult<Vec<(String, i64, i64)>> {
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
         UNION ALL SELECT 'session_owners', COUNT(*), CAST(0 AS BIGINT) FROM session_owners \
         UNION ALL SELECT 'stripe_customers', COUNT(*), CAST(0 AS BIGINT) FROM stripe_customers \
         UNION ALL SELECT 'grants', COUNT(*), CAST(COALESCE(SUM(seconds + used_seconds + priority + COALESCE(voided_at, 0)), 0) AS BIGINT) FROM grants \
         UNION ALL SELECT 'funding_windows', COUNT(*), CAST(COALESCE(SUM(plan_seconds + grant_seconds + overage_seconds + grace_seconds + charge_units), 0) AS BIGINT) FROM funding_windows \
         UNION ALL SELECT 'funding_hourly', COUNT(*), CAST(COALESCE(SUM(seconds + charge_units), 0) AS BIGINT) FROM funding_hourly \
         UNION ALL SELECT 'member_hourly', COUNT(*), CAST(COALESCE(SUM(seconds), 0) AS BIGINT) FROM member_hourly \
         UNION ALL SELECT 'member_limits', COUNT(*), CAST(COALESCE(SUM(updated_at), 0) AS BIGINT) FROM member_limits \
         UNION ALL SELECT 'audit_log', COUNT(*), CAST(COALESCE(SUM(at), 0) AS BIGINT) FROM audit_log",
    )
    .fetch_all(pool)
    .await?)
}
