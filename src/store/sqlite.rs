//! SQLite: the dialect's words, the pools (one writer, several readers), and the
//! set-based statements: multi-row VALUES. SQLite prepares in-process, so a text that
//! varies with the row count costs little.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{QueryBuilder, SqlitePool};

use super::PoolSettings;

pub type DB = sqlx::Sqlite;
type Row = sqlx::sqlite::SqliteRow;
/// Take the write lock up front, so a read-then-write never fails on a stale snapshot.
const BEGIN_WRITE: &str = "BEGIN IMMEDIATE";
/// The single writer connection and BEGIN IMMEDIATE already serialise writers.
const FOR_UPDATE: &str = "";
const SKIP_LOCKED: &str = "";
/// SQLite's multi-argument scalar MIN and MAX.
const LEAST: &str = "MIN";
const GREATEST: &str = "MAX";
/// SQLite compares text byte by byte (BINARY) already.
const BYTE_ORDER: &str = "";
/// `BEGIN IMMEDIATE` holds the write lock already.
const LOCK_ORGS: &str = "";
const JSON_AGG: &str = "json_group_array";
const JSON_ARRAY: &str = "json_array";

/// `org_id` among the orgs of parameter `$n` (a JSON array, bound with `org_list`).
fn org_in(n: usize) -> String {
    in_list("org_id", n)
}

/// `column` among the ids of parameter `$n` (bound with `org_list`).
fn in_list(column: &str, n: usize) -> String {
    format!("{column} IN (SELECT value FROM json_each(${n}))")
}

fn org_list(orgs: &[&str]) -> String {
    serde_json::to_string(orgs).expect("ids serialise")
}

include!("sql/common.rs");

use rush_meter_core::booking::Funding;
include!("sql/rows.rs");
include!("sql/orgs.rs");
include!("sql/funding.rs");
include!("sql/overage.rs");
include!("sql/members.rs");
include!("sql/ledger.rs");
include!("sql/window_sums.rs");
include!("sql/gate.rs");
include!("sql/stripe.rs");
include!("sql/periods.rs");
include!("sql/notifications.rs");
include!("sql/audit.rs");

/// Writes go through one connection; reads through a pool of read-only ones.
pub struct Lite {
    read: SqlitePool,
    write: SqlitePool,
}

type Backend = Lite;

impl Lite {
    pub async fn connect(url: &str, settings: PoolSettings) -> StoreResult<Lite> {
        let opts = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(5));
        let write = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(settings.acquire_timeout.max(Duration::from_secs(30)))
            .connect_with(opts.clone())
            .await?;
        let read = SqlitePoolOptions::new()
            .max_connections(settings.max_connections.min(8))
            .acquire_timeout(settings.acquire_timeout)
            .connect_with(opts.read_only(true))
            .await?;
        Ok(Lite { read, write })
    }

    fn read(&self) -> &SqlitePool {
        &self.read
    }

    /// One org's reads by key: the read pool (SQLite prepares once per connection).
    fn keyed(&self) -> &SqlitePool {
        &self.read
    }

    /// A group commit's transaction: as any write (SQLite prepares once per connection).
    async fn begin_hot(&self) -> StoreResult<Tx> {
        begin_write(self.write()).await
    }

    /// One instance, one file: every org on shard 0.
    async fn shard_ids(&self, _tx: &mut Tx, orgs: &[&str]) -> StoreResult<Vec<i64>> {
        Ok(vec![0; orgs.len()])
    }

    fn write(&self) -> &SqlitePool {
        &self.write
    }

    /// Claim session ids (`claim_owners`); the slots are counted after it (statements cost
    /// no round trip here, so there is nothing to save by merging them).
    async fn claim_owners_counting_slots(
        &self,
        tx: &mut Tx,
        wanted: &[(&str, &str)],
        _shards: &BTreeMap<i64, Vec<&str>>,
        _keys: &[(&str, &str)],
        _since: Secs,
    ) -> StoreResult<(Vec<String>, Option<Vec<SlotCount>>)> {
        Ok((claim_owners(tx, wanted).await?, None))
    }
}

#[async_trait]
impl super::Admin for Lite {
    fn backend(&self) -> super::Backend {
        super::Backend::Sqlite
    }

    async fn gather_statistics(&self) -> StoreResult<bool> {
        // The hot statements here do not depend on statistics (see
        // `select_sessions_for_update`).
        Ok(true)
    }

    async fn migrate(&self) -> Result<(), sqlx::migrate::MigrateError> {
        sqlx::migrate!("migrations/sqlite").run(&self.write).await
    }

    async fn ping(&self) -> StoreResult<()> {
        ping(&self.read).await
    }

    /// A file: reachable while the process runs.
    async fn connect_fresh(&self) -> StoreResult<()> {
        Ok(())
    }

    async fn close(&self) {
        self.read.close().await;
        self.write.close().await;
    }

    fn pools(&self) -> super::Pools<'_> {
        super::Pools::Sqlite {
            read: &self.read,
            write: &self.write,
        }
    }

    async fn digest(&self) -> StoreResult<Vec<(String, i64, i64)>> {
        digest(&self.read).await
    }
}

/// Query text built at run time varies with its row count: prepare it once, uncached.
fn once<'q, 'a>(
    q: &'q mut QueryBuilder<'a, DB>,
) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'a>> {
    q.build().persistent(false)
}

/// `SELECT * FROM <table> WHERE <column> IN (ids…)`, plus `tail`.
fn select_in<'a>(head: &str, ids: &'a [&str], tail: &str) -> QueryBuilder<'a, DB> {
    let mut q = QueryBuilder::<DB>::new(head);
    push_in(&mut q, ids);
    q.push(tail);
    q
}

/// ` IN (ids…)`.
fn push_in<'a>(q: &mut QueryBuilder<'a, DB>, ids: &'a [&str]) {
    q.push(" IN (");
    let mut sep = q.separated(", ");
    for id in ids {
        sep.push_bind(*id);
    }
    q.push(")");
}

/// Write what one transaction books: session rows, both rollups, closed spans.
async fn write_booking(tx: &mut Tx, shard: i64, b: &Booking) -> StoreResult<()> {
    let sessions: Vec<Session> = b.sessions.values().cloned().collect();
    let org_hours: Vec<(&(String, Secs), &i64)> = b.org_hours.iter().collect();
    let session_hours: Vec<(&(String, Secs, String), &i64)> = b.session_hours.iter().collect();
    let spans = &b.spans;
    for chunk in sessions.chunks(CHUNK) {
        write_session_rows(tx, chunk, true).await?;
    }
    for chunk in org_hours.chunks(CHUNK) {
        add_org_hours(tx, shard, chunk).await?;
    }
    for chunk in session_hours.chunks(CHUNK) {
        add_session_hours(tx, chunk).await?;
    }
    for chunk in spans.chunks(CHUNK) {
        insert_spans(tx, chunk).await?;
    }
    write_funding(tx, &b.funding).await?;
    let members: Vec<_> = b.member_hours.iter().collect();
    for chunk in members.chunks(CHUNK) {
        let mut q = QueryBuilder::<DB>::new(
            "INSERT INTO member_hourly (org_id, dimension, bucket, member_id, seconds) ",
        );
        q.push_values(chunk, |mut b, ((org, bucket, dim, member), secs)| {
            b.push_bind(org)
                .push_bind(dim.as_str())
                .push_bind(*bucket)
                .push_bind(member)
                .push_bind(**secs);
        });
        q.push(MEMBER_HOURS_CONFLICT);
        once(&mut q).execute(&mut **tx).await?;
    }
    Ok(())
}

/// Who pays for what a booking billed: each window's funds and each grant's use as they
/// now stand, and the hours not paid by the plan.
async fn write_funding(tx: &mut Tx, f: &Funding) -> StoreResult<()> {
    for chunk in f.windows.chunks(CHUNK) {
        let mut q = QueryBuilder::<DB>::new(format!(
            "INSERT INTO funding_windows ({FUNDING_WINDOW_COLUMNS}) "
        ));
        q.push_values(chunk, |mut b, (org, w)| {
            b.push_bind(org)
                .push_bind(w.kind.as_str())
                .push_bind(w.window.start)
                .push_bind(w.window.end)
                .push_bind(w.funds.plan)
                .push_bind(w.funds.grant)
                .push_bind(w.funds.overage)
                .push_bind(w.funds.grace)
                .push_bind(w.funds.charge_units);
        });
        q.push(FUNDING_WINDOW_UPSERT);
        once(&mut q).execute(&mut **tx).await?;
    }
    for chunk in f.grants.chunks(CHUNK) {
        // One statement for every grant the booking used (SQLite names a VALUES row's
        // columns column1, column2, …).
        let mut q = QueryBuilder::<DB>::new(
            "UPDATE grants SET used_seconds = v.column3, used_up_at = v.column4 FROM (",
        );
        q.push_values(chunk, |mut b, g| {
            b.push_bind(&g.org_id)
                .push_bind(&g.grant_id)
                .push_bind(g.used_seconds)
                .push_bind(g.used_up_at);
        });
        let orgs: Vec<&str> = chunk.iter().map(|g| g.org_id.as_str()).collect();
        q.push(") AS v WHERE grants.org_id IN (SELECT value FROM json_each(")
            .push_bind(org_list(&orgs))
            .push(")) AND grants.org_id = v.column1 AND grants.grant_id = v.column2");
        once(&mut q).execute(&mut **tx).await?;
    }
    let hourly: Vec<_> = f.hourly.iter().collect();
    for chunk in hourly.chunks(CHUNK) {
        let mut q = QueryBuilder::<DB>::new(
            "INSERT INTO funding_hourly (org_id, hour, source, grant_id, seconds, charge_units) ",
        );
        q.push_values(
            chunk,
            |mut b, ((org, hour, source, grant), (secs, units))| {
                b.push_bind(org)
                    .push_bind(*hour)
                    .push_bind(source.as_str())
                    .push_bind(grant)
                    .push_bind(*secs)
                    .push_bind(*units);
            },
        );
        q.push(FUNDING_HOURS_CONFLICT);
        once(&mut q).execute(&mut **tx).await?;
    }
    Ok(())
}

/// Insert sessions first seen now, skipping any that exist; returns how many were inserted.
async fn insert_new_session_rows(tx: &mut Tx, rows: &[Session]) -> StoreResult<u64> {
    write_session_rows(tx, rows, false).await
}

/// Write whole session rows: overwrite existing ones (`upsert`), or insert only new ones.
/// Returns the rows written.
async fn write_session_rows(tx: &mut Tx, rows: &[Session], upsert: bool) -> StoreResult<u64> {
    let mut q = QueryBuilder::<DB>::new(format!("INSERT INTO sessions ({SESSION_COLUMNS}) "));
    q.push_values(rows, |mut b, r| {
        b.push_bind(&r.org_id)
            .push_bind(&r.session_id)
            .push_bind(&r.key_id)
            .push_bind(&r.agent)
            .push_bind(&r.project_id)
            .push_bind(&r.started_by)
            .push_bind(&r.vm_id)
            .push_bind(r.ledger.phase.as_str())
            .push_bind(r.ledger.last_seq)
            .push_bind(r.ledger.last_at)
            .push_bind(r.ledger.span_start)
            .push_bind(r.ledger.billed_seconds)
            .push_bind(r.ledger.heartbeats)
            .push_bind(r.ledger.silences)
            .push_bind(r.unadmitted)
            .push_bind(r.created_at)
            .push_bind(r.ledger.ended_at)
            .push_bind(r.ledger.end_status.map(EndStatus::as_str))
            .push_bind(r.heard_at);
    });
    q.push(if upsert {
        SESSION_UPSERT
    } else {
        " ON CONFLICT DO NOTHING"
    });
    Ok(once(&mut q).execute(&mut **tx).await?.rows_affected())
}

async fn add_org_hours(
    tx: &mut Tx,
    shard: i64,
    rows: &[(&(String, Secs), &i64)],
) -> StoreResult<()> {
    let mut q = QueryBuilder::<DB>::new("INSERT INTO org_hourly (org_id, hour, shard, seconds) ");
    q.push_values(rows, |mut b, ((org, hour), secs)| {
        b.push_bind(org)
            .push_bind(*hour)
            .push_bind(shard)
            .push_bind(*secs);
    });
    q.push(ORG_HOURS_CONFLICT);
    once(&mut q).execute(&mut **tx).await?;
    Ok(())
}

async fn add_session_hours(
    tx: &mut Tx,
    rows: &[(&(String, Secs, String), &i64)],
) -> StoreResult<()> {
    let mut q =
        QueryBuilder::<DB>::new("INSERT INTO session_hourly (org_id, hour, session_id, seconds) ");
    q.push_values(rows, |mut b, ((org, hour, session), secs)| {
        b.push_bind(org)
            .push_bind(*hour)
            .push_bind(session)
            .push_bind(*secs);
    });
    q.push(SESSION_HOURS_CONFLICT);
    once(&mut q).execute(&mut **tx).await?;
    Ok(())
}

async fn insert_spans(tx: &mut Tx, rows: &[(String, String, ledger::Span)]) -> StoreResult<()> {
    let mut q =
        QueryBuilder::<DB>::new("INSERT INTO spans (org_id, session_id, start_at, end_at, kind) ");
    q.push_values(rows, |mut b, (org, session, span)| {
        b.push_bind(org)
            .push_bind(session)
            .push_bind(span.interval.start)
            .push_bind(span.interval.end)
            .push_bind(span_kind(span.kind));
    });
    once(&mut q).execute(&mut **tx).await?;
    Ok(())
}

/// The sessions with these ids of these orgs (the single writer holds the lock already).
async fn select_sessions_for_update(
    tx: &mut Tx,
    orgs: &[&str],
    pairs: &[(&str, &str)],
) -> StoreResult<Vec<Rec<Session>>> {
    // By id alone (`sessions_by_id`), the orgs kept here: SQLite would probe every pair of
    // `org_id IN (…) AND session_id IN (…)` in the primary key.
    let ids: Vec<&str> = pairs.iter().map(|(id, _)| *id).collect();
    let mut q = select_in(
        "SELECT * FROM sessions WHERE session_id",
        &ids,
        " ORDER BY session_id",
    );
    let rows: Vec<Rec<Session>> = q
        .build_query_as()
        .persistent(false)
        .fetch_all(&mut **tx)
        .await?;
    Ok(rows
        .into_iter()
        .filter(|Rec(s)| orgs.binary_search(&s.org_id.as_str()).is_ok())
        .collect())
}

/// Up to `limit` sessions of `orgs` where `condition` (ending in a comparison with
/// `since`) holds.
async fn lock_sessions_where(
    tx: &mut Tx,
    orgs: &[&str],
    condition: &str,
    since: Secs,
    limit: i64,
) -> StoreResult<Vec<Rec<Session>>> {
    let mut q = select_in("SELECT * FROM sessions WHERE org_id", orgs, " AND ");
    q.push(condition);
    q.push_bind(since);
    q.push(" ORDER BY session_id LIMIT ");
    q.push_bind(limit);
    Ok(q.build_query_as::<Rec<Session>>()
        .persistent(false)
        .fetch_all(&mut **tx)
        .await?)
}

/// Claim session ids for the orgs that name them; returns the ids claimed.
async fn claim_owners(tx: &mut Tx, pairs: &[(&str, &str)]) -> StoreResult<Vec<String>> {
    let mut q = QueryBuilder::<DB>::new("INSERT INTO session_owners (org_id, session_id) ");
    q.push_values(pairs, |mut b, (org, id)| {
        b.push_bind(*org).push_bind(*id);
    });
    q.push(" ON CONFLICT DO NOTHING RETURNING session_id");
    Ok(q.build_query_scalar::<String>()
        .persistent(false)
        .fetch_all(&mut **tx)
        .await?)
}

/// Give back claims of session ids that were not used.
async fn release_owners(tx: &mut Tx, ids: &[&str]) -> StoreResult<()> {
    let mut q = QueryBuilder::<DB>::new("DELETE FROM session_owners WHERE session_id");
    push_in(&mut q, ids);
    once(&mut q).execute(&mut **tx).await?;
    Ok(())
}

/// The owner of each of these session ids that has one.
async fn select_owners(tx: &mut Tx, ids: &[&str]) -> StoreResult<Vec<(String, String)>> {
    let mut q = select_in(
        "SELECT session_id, org_id FROM session_owners WHERE session_id",
        ids,
        "",
    );
    Ok(q.build_query_as::<(String, String)>()
        .persistent(false)
        .fetch_all(&mut **tx)
        .await?)
}

async fn select_org_ids(tx: &mut Tx, ids: &[&str]) -> StoreResult<Vec<String>> {
    let mut q = select_in("SELECT org_id FROM orgs WHERE org_id", ids, "");
    Ok(q.build_query_scalar::<String>()
        .persistent(false)
        .fetch_all(&mut **tx)
        .await?)
}

async fn select_orgs_in<'e, E: sqlx::Executor<'e, Database = DB>>(
    ex: E,
    ids: &[&str],
) -> StoreResult<Vec<Rec<Org>>> {
    let mut q = select_in("SELECT * FROM orgs WHERE org_id", ids, "");
    Ok(q.build_query_as::<Rec<Org>>()
        .persistent(false)
        .fetch_all(ex)
        .await?)
}

// The gate's statements go row by row: SQLite runs them in-process, under the write lock
// that BEGIN IMMEDIATE already holds, so a round trip costs microseconds.

async fn lock_keys(tx: &mut Tx, _orgs: &[&str], keys: &[(&str, &str)]) -> StoreResult<Vec<Key>> {
    let mut rows = Vec::with_capacity(keys.len());
    for (org, key) in keys {
        rows.extend(
            sqlx::query_as::<_, Rec<Key>>(
                "SELECT * FROM api_keys WHERE org_id = $1 AND key_id = $2",
            )
            .bind(*org)
            .bind(*key)
            .fetch_optional(&mut **tx)
            .await?
            .map(|r| r.0),
        );
    }
    Ok(rows)
}

async fn slot_counts(
    tx: &mut Tx,
    _orgs: &[&str],
    keys: &[(&str, &str)],
    since: Secs,
) -> StoreResult<Vec<SlotCount>> {
    let sql = format!("SELECT {}", slots_held("org_id = $2 AND key_id = $3"));
    let mut counts = Vec::with_capacity(keys.len());
    for (org, key) in keys {
        let n: i64 = sqlx::query_scalar(&sql)
            .bind(since)
            .bind(*org)
            .bind(*key)
            .fetch_one(&mut **tx)
            .await?;
        counts.push((org.to_string(), key.to_string(), n));
    }
    Ok(counts)
}

/// Write what a group of admissions decided: new sessions, slots, decision records. False
/// (and the transaction must be abandoned) if one of the new sessions existed already.
async fn write_admissions(
    tx: &mut Tx,
    _orgs: &[&str],
    created: &[Session],
    resumed: &[Session],
    decisions: &[&Decision],
) -> StoreResult<bool> {
    if !created.is_empty() && write_session_rows(tx, created, false).await? < created.len() as u64 {
        return Ok(false);
    }
    set_slots(tx, created.iter().chain(resumed)).await?;
    if !decisions.is_empty() {
        insert_decisions(tx, decisions).await?;
    }
    Ok(true)
}

async fn set_slots(tx: &mut Tx, rows: impl Iterator<Item = &Session>) -> StoreResult<()> {
    for r in rows {
        sqlx::query(
            "UPDATE sessions SET slot_at = $1, key_id = $2, agent = $3, project_id = $4, \
               started_by = $5 WHERE org_id = $6 AND session_id = $7",
        )
        .bind(r.slot_at)
        .bind(&r.key_id)
        .bind(&r.agent)
        .bind(&r.project_id)
        .bind(&r.started_by)
        .bind(&r.org_id)
        .bind(&r.session_id)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

async fn insert_decisions(tx: &mut Tx, rows: &[&Decision]) -> StoreResult<()> {
    let mut q = QueryBuilder::<DB>::new(format!("INSERT INTO decisions ({DECISION_COLUMNS}) "));
    q.push_values(rows, |mut b, d| {
        b.push_bind(&d.org_id)
            .push_bind(&d.decision_id)
            .push_bind(d.decided_at)
            .push_bind(&d.session_id)
            .push_bind(&d.key_id)
            .push_bind(&d.decision)
            .push_bind(&d.reason)
            .push_bind(&d.rule)
            .push_bind(&d.plan_id)
            .push_bind(d.suspended)
            .push_bind(d.month_start)
            .push_bind(d.month_end)
            .push_bind(d.month_used)
            .push_bind(d.month_limit)
            .push_bind(d.week_start)
            .push_bind(d.week_end)
            .push_bind(d.week_used)
            .push_bind(d.week_limit)
            .push_bind(d.running)
            .push_bind(d.concurrency_limit)
            .push_bind(&d.upgrade_plan)
            .push_bind(&d.funded_by)
            .push_bind(d.plan_room)
            .push_bind(d.grant_room)
            .push_bind(d.overage_room)
            .push_bind(d.limit.as_ref().map(|l| l.kind.clone()))
            .push_bind(d.limit.as_ref().map(|l| l.member_id.clone()))
            .push_bind(d.limit.as_ref().map(|l| l.month_used))
            .push_bind(d.limit.as_ref().and_then(|l| l.month_limit))
            .push_bind(d.limit.as_ref().map(|l| l.week_used))
            .push_bind(d.limit.as_ref().and_then(|l| l.week_limit));
    });
    once(&mut q).execute(&mut **tx).await?;
    Ok(())
}
