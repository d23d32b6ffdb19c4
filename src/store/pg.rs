//! PostgreSQL: the dialect's words, the pool, and the set-based statements: whole columns
//! bound as arrays and read back with UNNEST, so each statement has one fixed text
//! (prepared once per connection) whatever the row count.

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use super::PoolSettings;

pub type DB = sqlx::Postgres;
type Row = sqlx::postgres::PgRow;
/// A plain BEGIN: row locks (`FOR UPDATE`) order the writers of several instances.
const BEGIN_WRITE: &str = "BEGIN";
const FOR_UPDATE: &str = " FOR UPDATE";
const SKIP_LOCKED: &str = " FOR UPDATE SKIP LOCKED";
const LEAST: &str = "LEAST";
const GREATEST: &str = "GREATEST";
/// Byte order for ids, whatever the database's locale (exports sort by it).
const BYTE_ORDER: &str = " COLLATE \"C\"";
/// A booking's lock of its orgs' rows: it keeps out other bookings of the org (and plan
/// changes), not the inserts of rows that reference the org.
const LOCK_ORGS: &str = " FOR NO KEY UPDATE OF o";
const JSON_AGG: &str = "json_agg";
const JSON_ARRAY: &str = "json_build_array";

/// `org_id` among the orgs of parameter `$n` (bound with `org_list`).
fn org_in(n: usize) -> String {
    in_list("org_id", n)
}

/// `column` among the ids of parameter `$n` (bound with `org_list`).
fn in_list(column: &str, n: usize) -> String {
    format!("{column} = ANY(${n})")
}

fn org_list(orgs: &[&str]) -> Vec<String> {
    orgs.iter().map(|o| o.to_string()).collect()
}

include!("sql/common.rs");
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

/// One pool serves reads and writes: PostgreSQL orders concurrent writers by row locks.
pub struct Pg {
    pool: PgPool,
    /// Reads of one org's rows by key (`keyed`), on connections that keep each
    /// statement's generic plan: see `keyed`.
    keyed: PgPool,
    sharding: std::sync::RwLock<Sharding>,
    /// The shard of each org seen, when the tables are spread (an org never moves between
    /// shards: a rebalance moves whole shards, keeping their ids).
    shards: std::sync::Mutex<HashMap<String, i64>>,
}

/// How an org's rows are spread over the database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sharding {
    /// One PostgreSQL: every org's rows are in one place, and any statement is one shard's.
    One,
    /// Tables hash-partitioned by org_id into this many partitions: each is a shard.
    Partitions(i32),
    /// Tables distributed by Citus: its shards.
    Citus,
}

type Backend = Pg;

/// The tables the hot paths lock and look up by key, whose plans need statistics: the
/// group commits' statements keep a generic plan (`begin_hot`) until the statistics of a
/// table they read change.
const HOT_TABLES: [&str; 13] = [
    "sessions",
    "session_owners",
    "api_keys",
    "orgs",
    "spans",
    "session_hourly",
    "org_hourly",
    "member_hourly",
    "member_limits",
    "funding_hourly",
    "funding_windows",
    "grants",
    "decisions",
];

/// Rows from which a table without statistics gets them (autovacuum's own threshold for a
/// new table is about as low).
const STATISTICS_FROM_ROWS: i64 = 100;

/// Connections of the keyed-read pool (`Pg::keyed`) beside the main pool's: a page view
/// holds at most three at once, and the main pool keeps the writers and exports.
fn keyed_connections(max_connections: u32) -> u32 {
    (max_connections / 2).max(2)
}

impl Pg {
    pub async fn connect(url: &str, settings: PoolSettings) -> StoreResult<Pg> {
        // Plan each statement for the parameters and statistics of the moment by default
        // (reads whose best plan depends on the range asked); the group commits' own
        // statements opt into generic plans (`begin_hot`).
        let opts =
            PgConnectOptions::from_str(url)?.options([("plan_cache_mode", "force_custom_plan")]);
        let pool = PgPoolOptions::new()
            .max_connections(settings.max_connections)
            .acquire_timeout(settings.acquire_timeout)
            .connect_with(opts.clone())
            .await?;
        let keyed = PgPoolOptions::new()
            .max_connections(keyed_connections(settings.max_connections))
            .acquire_timeout(settings.acquire_timeout)
            .connect_lazy_with(opts.options([("plan_cache_mode", "force_generic_plan")]));
        let pg = Pg {
            pool,
            keyed,
            sharding: std::sync::RwLock::new(Sharding::One),
            shards: std::sync::Mutex::default(),
        };
        pg.detect_sharding().await?;
        Ok(pg)
    }

    /// Whether the org tables are distributed (Citus) or hash-partitioned by org_id, read
    /// from the catalog; `sessions` stands for them all (they are co-located).
    async fn detect_sharding(&self) -> StoreResult<()> {
        let citus: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')",
        )
        .fetch_one(&self.pool)
        .await?;
        let distributed = citus
            && sqlx::query_scalar::<_, bool>(
                "SELECT EXISTS (SELECT 1 FROM pg_dist_partition \
                 WHERE logicalrelid = to_regclass('sessions'))",
            )
            .fetch_one(&self.pool)
            .await?;
        let partitions: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_inherits i JOIN pg_partitioned_table p \
               ON p.partrelid = i.inhparent \
             WHERE i.inhparent = to_regclass('sessions') AND p.partstrat = 'h'",
        )
        .fetch_one(&self.pool)
        .await?;
        let sharding = if distributed {
            Sharding::Citus
        } else if partitions > 0 {
            Sharding::Partitions(i32::try_from(partitions).unwrap_or(i32::MAX))
        } else {
            Sharding::One
        };
        tracing::info!(layout = ?sharding, "store layout");
        *self.sharding.write().expect("sharding lock") = sharding;
        Ok(())
    }

    /// A group commit's transaction (heartbeats, admissions). Its statements have fixed
    /// texts, find their rows by key, and run thousands of times a second: planning them
    /// anew each time (the connections' `force_custom_plan`) cost more than running them
    /// (pg_stat_statements: 0.24 ms to plan the ingest write, 0.13 ms to run it), so on
    /// one PostgreSQL they use the plan each connection caches. A cached plan is replanned
    /// when its tables' statistics change (ANALYZE, `gather_statistics`), so one made
    /// while a table was empty does not outlive its first statistics. Partitioned and
    /// distributed layouts keep custom plans: there the plan prunes shards by the values.
    async fn begin_hot(&self) -> StoreResult<Tx> {
        let sharding = *self.sharding.read().expect("sharding lock");
        let begin = match sharding {
            Sharding::One => "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan",
            _ => BEGIN_WRITE,
        };
        Ok(self.write().begin_with(begin).await?)
    }

    /// The shard of each of `orgs` (in order): 0 for all on one PostgreSQL.
    async fn shard_ids(&self, tx: &mut Tx, orgs: &[&str]) -> StoreResult<Vec<i64>> {
        let sharding = *self.sharding.read().expect("sharding lock");
        let lookup = match sharding {
            Sharding::One => return Ok(vec![0; orgs.len()]),
            Sharding::Partitions(_) => {
                "SELECT o, CAST(r AS BIGINT) FROM UNNEST($1::text[]) AS o, \
                   generate_series(0, $2 - 1) AS r \
                 WHERE satisfies_hash_partition('sessions'::regclass, $2, r, o)"
            }
            Sharding::Citus => {
                "SELECT o, get_shard_id_for_distribution_column('sessions', o) \
                 FROM UNNEST($1::text[]) AS o"
            }
        };
        let missing: Vec<&str> = {
            let known = self.shards.lock().expect("shard cache lock");
            orgs.iter()
                .copied()
                .filter(|o| !known.contains_key(*o))
                .collect()
        };
        if !missing.is_empty() {
            let modulus = match sharding {
                Sharding::Partitions(n) => n,
                _ => 0,
            };
            let found: Vec<(String, i64)> = sqlx::query_as(lookup)
                .bind(&missing)
                .bind(modulus)
                .fetch_all(&mut **tx)
                .await?;
            self.shards.lock().expect("shard cache lock").extend(found);
        }
        let known = self.shards.lock().expect("shard cache lock");
        Ok(orgs
            .iter()
            .map(|o| known.get(*o).copied().unwrap_or(0))
            .collect())
    }

    fn read(&self) -> &PgPool {
        &self.pool
    }

    /// The pool for the console's reads of one org (its row and funding, window sums,
    /// session counts, breakdown pieces): fixed texts, each an index range of one org
    /// bounded by a window or a breakdown's longest range, asked on every page view.
    /// Planning them anew cost more than running them (pg_stat_statements over `cargo
    /// bench --bench usage -- postgres console`: the org's funding row 0.36 ms to plan,
    /// 0.08 ms to run; the window sums 0.36 ms to plan), so on one PostgreSQL they keep
    /// the generic plan each connection caches, as the group commits do (`begin_hot`).
    /// Partitioned and distributed layouts plan per call, to prune shards by the org.
    fn keyed(&self) -> &PgPool {
        match *self.sharding.read().expect("sharding lock") {
            Sharding::One => &self.keyed,
            _ => &self.pool,
        }
    }

    fn write(&self) -> &PgPool {
        &self.pool
    }

    /// Claim session ids (`claim_owners`) and, on one PostgreSQL, count the keys' slots
    /// (`slot_counts`) in the same statement: a group's round trips are much of an
    /// admission's time (issue 18), and the counts need only the keys' locks, taken
    /// before. Partitioned and distributed layouts count a shard at a time, after it
    /// (`None`): there the claim and the counts go to different shards.
    async fn claim_owners_counting_slots(
        &self,
        tx: &mut Tx,
        wanted: &[(&str, &str)],
        shards: &BTreeMap<i64, Vec<&str>>,
        keys: &[(&str, &str)],
        since: Secs,
    ) -> StoreResult<(Vec<String>, Option<Vec<SlotCount>>)> {
        let one = *self.sharding.read().expect("sharding lock") == Sharding::One;
        let orgs = match shards.values().next() {
            Some(orgs) if one && shards.len() == 1 && keys.len() <= CHUNK => orgs.as_slice(),
            _ => return Ok((claim_owners(tx, wanted).await?, None)),
        };
        let (key_orgs, key_ids) = key_columns(keys);
        let (owner_orgs, ids): (Vec<&str>, Vec<&str>) = wanted.iter().copied().unzip();
        // A claimed id comes back as a row without an org.
        let sql = format!(
            "WITH c AS (INSERT INTO session_owners (org_id, session_id) \
               SELECT * FROM UNNEST($5::text[], $6::text[]) ON CONFLICT DO NOTHING \
               RETURNING session_id) \
             SELECT CAST(NULL AS TEXT), session_id, CAST(0 AS BIGINT) FROM c \
             UNION ALL {}",
            slot_counts_sql()
        );
        let rows: Vec<(Option<String>, String, i64)> = sqlx::query_as(&sql)
            .bind(since)
            .bind(key_orgs)
            .bind(key_ids)
            .bind(orgs)
            .bind(owner_orgs)
            .bind(ids)
            .fetch_all(&mut **tx)
            .await?;
        let mut claimed = Vec::with_capacity(wanted.len());
        let mut counts = Vec::with_capacity(keys.len());
        for (org, id, n) in rows {
            match org {
                None => claimed.push(id),
                Some(org) => counts.push((org, id, n)),
            }
        }
        Ok((claimed, Some(counts)))
    }
}

#[async_trait]
impl super::Admin for Pg {
    fn backend(&self) -> super::Backend {
        super::Backend::Postgres
    }

    async fn gather_statistics(&self) -> StoreResult<bool> {
        if *self.sharding.read().expect("sharding lock") == Sharding::Citus {
            // The coordinator holds no rows; each worker's autovacuum analyzes its shards.
            return Ok(true);
        }
        // Never analyzed and holding rows, or changed by more rows than it held when last
        // analyzed: a table filling from empty (a new deployment, a restored dump) doubles
        // many times before autovacuum's first look (a minute or more away), and a generic
        // plan made on its old statistics (a scan of what was a page) would be kept.
        let stale: Vec<String> = sqlx::query_scalar(
            "SELECT s.relname::text FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid \
             WHERE s.relname = ANY($1) AND s.n_live_tup >= $2 \
               AND ((s.last_analyze IS NULL AND s.last_autoanalyze IS NULL) \
                 OR s.n_mod_since_analyze > GREATEST(c.reltuples, $2))",
        )
        .bind(&HOT_TABLES[..])
        .bind(STATISTICS_FROM_ROWS)
        .fetch_all(&self.pool)
        .await?;
        for table in &stale {
            // The names come from HOT_TABLES, never from input.
            sqlx::query(&format!("ANALYZE {table}"))
                .execute(&self.pool)
                .await?;
            tracing::info!(table, "gathered planner statistics");
        }
        // Tables keep growing: keep watching.
        Ok(false)
    }

    async fn migrate(&self) -> Result<(), sqlx::migrate::MigrateError> {
        sqlx::migrate!("migrations/postgres")
            .run(&self.pool)
            .await?;
        self.detect_sharding()
            .await
            .map_err(|e| sqlx::migrate::MigrateError::Execute(sqlx::Error::Protocol(e.to_string())))
    }

    async fn ping(&self) -> StoreResult<()> {
        ping(&self.pool).await
    }

    async fn connect_fresh(&self) -> StoreResult<()> {
        use sqlx::{ConnectOptions, Connection};
        self.pool.connect_options().connect().await?.close().await?;
        Ok(())
    }

    async fn close(&self) {
        tokio::join!(self.pool.close(), self.keyed.close());
    }

    fn pools(&self) -> super::Pools<'_> {
        super::Pools::Postgres(&self.pool)
    }

    async fn digest(&self) -> StoreResult<Vec<(String, i64, i64)>> {
        digest(&self.pool).await
    }
}

/// One column of `rows` as an array parameter.
fn column<T, F: Fn(&Session) -> T>(rows: &[Session], f: F) -> Vec<T> {
    rows.iter().map(f).collect()
}

const SESSION_ARRAYS: &str = "$1::text[], $2::text[], $3::text[], $4::text[], $5::text[], \
     $6::text[], $7::text[], $8::text[], $9::int8[], $10::int8[], $11::int8[], $12::int8[], \
     $13::int8[], $14::int8[], $15::bool[], $16::int8[], $17::int8[], $18::text[], $19::int8[]";

/// Bind every column of `rows` as one array each, in `SESSION_COLUMNS` order ($1..$19).
fn bind_sessions<'q>(
    q: sqlx::query::Query<'q, DB, sqlx::postgres::PgArguments>,
    rows: &[Session],
) -> sqlx::query::Query<'q, DB, sqlx::postgres::PgArguments> {
    q.bind(column(rows, |r| r.org_id.clone()))
        .bind(column(rows, |r| r.session_id.clone()))
        .bind(column(rows, |r| r.key_id.clone()))
        .bind(column(rows, |r| r.agent.clone()))
        .bind(column(rows, |r| r.project_id.clone()))
        .bind(column(rows, |r| r.started_by.clone()))
        .bind(column(rows, |r| r.vm_id.clone()))
        .bind(column(rows, |r| r.ledger.phase.as_str()))
        .bind(column(rows, |r| r.ledger.last_seq))
        .bind(column(rows, |r| r.ledger.last_at))
        .bind(column(rows, |r| r.ledger.span_start))
        .bind(column(rows, |r| r.ledger.billed_seconds))
        .bind(column(rows, |r| r.ledger.heartbeats))
        .bind(column(rows, |r| r.ledger.silences))
        .bind(column(rows, |r| r.unadmitted))
        .bind(column(rows, |r| r.created_at))
        .bind(column(rows, |r| r.ledger.ended_at))
        .bind(column(rows, |r| r.ledger.end_status.map(EndStatus::as_str)))
        .bind(column(rows, |r| r.heard_at))
}

/// Write what one transaction books (session rows, both rollups, closed spans, and who
/// pays for it) in one statement: one round trip while the rows stay locked, whatever the
/// group's size.
async fn write_booking(tx: &mut Tx, shard: i64, b: &Booking) -> StoreResult<()> {
    if b.is_empty() {
        return Ok(());
    }
    let sessions: Vec<Session> = b.sessions.values().cloned().collect();
    let (org_hours, session_hours, spans) = (&b.org_hours, &b.session_hours, &b.spans);
    let f = &b.funding;
    let m = &b.member_hours;
    let orgs: Vec<String> = sorted_unique(b.sessions.values().map(|s| s.org_id.clone()));
    let sql = format!(
        "WITH s AS (INSERT INTO sessions ({SESSION_COLUMNS}) SELECT * FROM UNNEST({SESSION_ARRAYS}){SESSION_UPSERT}), \
         o AS (INSERT INTO org_hourly (org_id, hour, shard, seconds) \
               SELECT o, h, $32::int8, s FROM UNNEST($20::text[], $21::int8[], $22::int8[]) AS u(o, h, s) \
               {ORG_HOURS_CONFLICT}), \
         h AS (INSERT INTO session_hourly (org_id, hour, session_id, seconds) \
               SELECT * FROM UNNEST($23::text[], $24::int8[], $25::text[], $26::int8[]){SESSION_HOURS_CONFLICT}), \
         fw AS (INSERT INTO funding_windows ({FUNDING_WINDOW_COLUMNS}) \
               SELECT * FROM UNNEST($33::text[], $34::text[], $35::int8[], $36::int8[], $37::int8[], \
                 $38::int8[], $39::int8[], $40::int8[], $41::int8[]){FUNDING_WINDOW_UPSERT}), \
         g AS (UPDATE grants SET used_seconds = u.used, used_up_at = u.used_up_at \
               FROM UNNEST($42::text[], $43::text[], $44::int8[], $52::int8[]) AS u(org_id, grant_id, used, used_up_at) \
               WHERE grants.org_id = ANY($45) AND grants.org_id = u.org_id AND grants.grant_id = u.grant_id), \
         fh AS (INSERT INTO funding_hourly (org_id, hour, source, grant_id, seconds, charge_units) \
               SELECT * FROM UNNEST($46::text[], $47::int8[], $48::text[], $49::text[], $50::int8[], \
                 $51::int8[]){FUNDING_HOURS_CONFLICT}), \
         mh AS (INSERT INTO member_hourly (org_id, dimension, bucket, member_id, seconds) \
               SELECT * FROM UNNEST($53::text[], $54::text[], $55::int8[], $56::text[], $57::int8[]) \
               {MEMBER_HOURS_CONFLICT}) \
         INSERT INTO spans (org_id, session_id, start_at, end_at, kind) \
         SELECT * FROM UNNEST($27::text[], $28::text[], $29::int8[], $30::int8[], $31::text[])"
    );
    fn col<T, U>(rows: impl IntoIterator<Item = T>, f: impl Fn(T) -> U) -> Vec<U> {
        rows.into_iter().map(f).collect()
    }
    bind_sessions(sqlx::query(&sql), &sessions)
        .bind(col(org_hours.keys(), |(o, _)| o.clone()))
        .bind(col(org_hours.keys(), |(_, h)| *h))
        .bind(col(org_hours.values(), |s| *s))
        .bind(col(session_hours.keys(), |(o, _, _)| o.clone()))
        .bind(col(session_hours.keys(), |(_, h, _)| *h))
        .bind(col(session_hours.keys(), |(_, _, s)| s.clone()))
        .bind(col(session_hours.values(), |s| *s))
        .bind(col(spans, |(o, _, _)| o.clone()))
        .bind(col(spans, |(_, s, _)| s.clone()))
        .bind(col(spans, |(_, _, sp)| sp.interval.start))
        .bind(col(spans, |(_, _, sp)| sp.interval.end))
        .bind(col(spans, |(_, _, sp)| span_kind(sp.kind)))
        .bind(shard)
        .bind(col(&f.windows, |(o, _)| o.clone()))
        .bind(col(&f.windows, |(_, w)| w.kind.as_str()))
        .bind(col(&f.windows, |(_, w)| w.window.start))
        .bind(col(&f.windows, |(_, w)| w.window.end))
        .bind(col(&f.windows, |(_, w)| w.funds.plan))
        .bind(col(&f.windows, |(_, w)| w.funds.grant))
        .bind(col(&f.windows, |(_, w)| w.funds.overage))
        .bind(col(&f.windows, |(_, w)| w.funds.grace))
        .bind(col(&f.windows, |(_, w)| w.funds.charge_units))
        .bind(col(&f.grants, |g| g.org_id.clone()))
        .bind(col(&f.grants, |g| g.grant_id.clone()))
        .bind(col(&f.grants, |g| g.used_seconds))
        .bind(&orgs)
        .bind(col(f.hourly.keys(), |(o, _, _, _)| o.clone()))
        .bind(col(f.hourly.keys(), |(_, h, _, _)| *h))
        .bind(col(f.hourly.keys(), |(_, _, s, _)| s.as_str()))
        .bind(col(f.hourly.keys(), |(_, _, _, g)| g.clone()))
        .bind(col(f.hourly.values(), |(s, _)| *s))
        .bind(col(f.hourly.values(), |(_, u)| *u))
        .bind(col(&f.grants, |g| g.used_up_at))
        .bind(col(m.keys(), |(o, _, _, _)| o.clone()))
        .bind(col(m.keys(), |(_, _, d, _)| d.as_str()))
        .bind(col(m.keys(), |(_, b, _, _)| *b))
        .bind(col(m.keys(), |(_, _, _, id)| id.clone()))
        .bind(col(m.values(), |s| *s))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Insert sessions first seen now, skipping any another writer inserted first; returns
/// how many were inserted.
async fn insert_new_session_rows(tx: &mut Tx, rows: &[Session]) -> StoreResult<u64> {
    // Counted from RETURNING: a distributed PostgreSQL reports the rows offered to an
    // INSERT … SELECT … ON CONFLICT DO NOTHING, not the rows inserted (citus#3377).
    let sql = format!(
        "INSERT INTO sessions ({SESSION_COLUMNS}) SELECT * FROM UNNEST({SESSION_ARRAYS}) \
         ON CONFLICT DO NOTHING RETURNING 1"
    );
    Ok(bind_sessions(sqlx::query(&sql), rows)
        .fetch_all(&mut **tx)
        .await?
        .len() as u64)
}

/// Up to `limit` sessions of `orgs` (one shard's) where `condition` (ending in a
/// comparison with `since`) holds, skipping rows another writer holds.
async fn lock_sessions_where(
    tx: &mut Tx,
    orgs: &[&str],
    condition: &str,
    since: Secs,
    limit: i64,
) -> StoreResult<Vec<Rec<Session>>> {
    Ok(sqlx::query_as::<_, Rec<Session>>(&format!(
        "SELECT * FROM sessions WHERE org_id = ANY($2) AND {condition}$1 \
         ORDER BY session_id LIMIT $3{SKIP_LOCKED}"
    ))
    .bind(since)
    .bind(orgs)
    .bind(limit)
    .fetch_all(&mut **tx)
    .await?)
}

/// Claim session ids for the orgs that name them (a session id belongs to one org); returns
/// the ids claimed: not those another writer holds.
async fn claim_owners(tx: &mut Tx, pairs: &[(&str, &str)]) -> StoreResult<Vec<String>> {
    let (orgs, ids): (Vec<&str>, Vec<&str>) = pairs.iter().copied().unzip();
    Ok(sqlx::query_scalar(
        "INSERT INTO session_owners (org_id, session_id) \
         SELECT * FROM UNNEST($1::text[], $2::text[]) ON CONFLICT DO NOTHING RETURNING session_id",
    )
    .bind(orgs)
    .bind(ids)
    .fetch_all(&mut **tx)
    .await?)
}

/// Give back claims of session ids that were not used.
async fn release_owners(tx: &mut Tx, ids: &[&str]) -> StoreResult<()> {
    sqlx::query("DELETE FROM session_owners WHERE session_id = ANY($1)")
        .bind(ids)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// The owner of each of these session ids that has one.
async fn select_owners(tx: &mut Tx, ids: &[&str]) -> StoreResult<Vec<(String, String)>> {
    Ok(
        sqlx::query_as("SELECT session_id, org_id FROM session_owners WHERE session_id = ANY($1)")
            .bind(ids)
            .fetch_all(&mut **tx)
            .await?,
    )
}

/// Lock and read the sessions with these ids of these orgs (one shard's). Locks are taken
/// in `session_id` byte order (the order the caller's chunks follow, whatever the
/// database's collation), shard after shard, so writers on several instances never
/// deadlock.
async fn select_sessions_for_update(
    tx: &mut Tx,
    orgs: &[&str],
    pairs: &[(&str, &str)],
) -> StoreResult<Vec<Rec<Session>>> {
    let ids: Vec<&str> = pairs.iter().map(|(id, _)| *id).collect();
    // Planned on statistics (`sessions_by_id` for the ids, the orgs a filter): a table
    // not yet analyzed gets them within seconds (`gather_statistics`).
    Ok(sqlx::query_as::<_, Rec<Session>>(
        "SELECT * FROM sessions WHERE org_id = ANY($1) AND session_id = ANY($2) \
         ORDER BY session_id COLLATE \"C\" FOR UPDATE",
    )
    .bind(orgs)
    .bind(ids)
    .fetch_all(&mut **tx)
    .await?)
}

async fn select_org_ids(tx: &mut Tx, ids: &[&str]) -> StoreResult<Vec<String>> {
    Ok(
        sqlx::query_scalar::<_, String>("SELECT org_id FROM orgs WHERE org_id = ANY($1)")
            .bind(ids)
            .fetch_all(&mut **tx)
            .await?,
    )
}

async fn select_orgs_in<'e, E: sqlx::Executor<'e, Database = DB>>(
    ex: E,
    ids: &[&str],
) -> StoreResult<Vec<Rec<Org>>> {
    Ok(
        sqlx::query_as::<_, Rec<Org>>("SELECT * FROM orgs WHERE org_id = ANY($1)")
            .bind(ids)
            .fetch_all(ex)
            .await?,
    )
}

/// `(org_id, key_id)` pairs as two array parameters.
fn key_columns(keys: &[(&str, &str)]) -> (Vec<String>, Vec<String>) {
    keys.iter()
        .map(|(o, k)| (o.to_string(), k.to_string()))
        .unzip()
}

/// Lock and read these keys (of one shard's orgs, `orgs`), in byte order (as the caller
/// sorted them, whatever the database's collation), so that gate writers on several
/// instances never deadlock.
async fn lock_keys(tx: &mut Tx, orgs: &[&str], keys: &[(&str, &str)]) -> StoreResult<Vec<Key>> {
    let (key_orgs, ids) = key_columns(keys);
    Ok(unwrap_all(
        sqlx::query_as::<_, Rec<Key>>(
            "SELECT k.* FROM api_keys k JOIN UNNEST($1::text[], $2::text[]) AS u(org_id, key_id) \
               ON k.org_id = u.org_id AND k.key_id = u.key_id \
             WHERE k.org_id = ANY($3) \
             ORDER BY k.org_id COLLATE \"C\", k.key_id COLLATE \"C\" FOR UPDATE OF k",
        )
        .bind(key_orgs)
        .bind(ids)
        .bind(orgs)
        .fetch_all(&mut **tx)
        .await?,
    ))
}

/// The slot counts' statement: `$1` the lease's start, `$2 $3` the keys' orgs and ids, `$4`
/// the shard's orgs.
fn slot_counts_sql() -> String {
    format!(
        "SELECT u.org_id, u.key_id, {} FROM UNNEST($2::text[], $3::text[]) AS u(org_id, key_id)",
        slots_held("org_id = ANY($4) AND org_id = u.org_id AND key_id = u.key_id")
    )
}

/// Slots held per key (0 for a key holding none).
async fn slot_counts(
    tx: &mut Tx,
    orgs: &[&str],
    keys: &[(&str, &str)],
    since: Secs,
) -> StoreResult<Vec<SlotCount>> {
    let (key_orgs, ids) = key_columns(keys);
    Ok(sqlx::query_as(&slot_counts_sql())
        .bind(since)
        .bind(key_orgs)
        .bind(ids)
        .bind(orgs)
        .fetch_all(&mut **tx)
        .await?)
}

/// Write what a group of admissions decided in one statement: new sessions (holding their
/// slot), slots of resumed ones, decision records. False (and the transaction must be
/// abandoned) if one of the new sessions existed already.
async fn write_admissions(
    tx: &mut Tx,
    orgs: &[&str],
    created: &[Session],
    resumed: &[Session],
    decisions: &[&Decision],
) -> StoreResult<bool> {
    let sql = format!(
        "WITH n AS (INSERT INTO sessions ({SESSION_COLUMNS}, slot_at) \
           SELECT * FROM UNNEST({SESSION_ARRAYS}, $20::int8[]) ON CONFLICT DO NOTHING RETURNING 1), \
         r AS (UPDATE sessions SET slot_at = u.slot_at, key_id = u.key_id, agent = u.agent, \
           project_id = u.project_id, started_by = u.started_by \
           FROM UNNEST($21::text[], $22::int8[], $23::text[], $24::text[], $25::text[], $26::text[], \
             $48::text[]) AS u(session_id, slot_at, key_id, agent, project_id, started_by, org_id) \
           WHERE sessions.org_id = ANY($49) AND sessions.org_id = u.org_id \
             AND sessions.session_id = u.session_id), \
         d AS (INSERT INTO decisions ({DECISION_COLUMNS}) SELECT * FROM UNNEST($27::text[], \
           $28::text[], $29::int8[], $30::text[], $31::text[], $32::text[], $33::text[], \
           $34::text[], $35::text[], $36::bool[], $37::int8[], $38::int8[], $39::int8[], \
           $40::int8[], $41::int8[], $42::int8[], $43::int8[], $44::int8[], $45::int8[], \
           $46::int8[], $47::text[], $50::text[], $51::int8[], $52::int8[], $53::int8[], \
           $54::text[], $55::text[], $56::int8[], $57::int8[], $58::int8[], $59::int8[])) \
         SELECT COUNT(*) FROM n"
    );
    fn col<T>(rows: &[&Decision], f: impl Fn(&Decision) -> T) -> Vec<T> {
        rows.iter().map(|r| f(r)).collect()
    }
    let rows = decisions;
    let row = bind_sessions(sqlx::query(&sql), created)
        .bind(column(created, |r| r.slot_at))
        .bind(column(resumed, |r| r.session_id.clone()))
        .bind(column(resumed, |r| r.slot_at))
        .bind(column(resumed, |r| r.key_id.clone()))
        .bind(column(resumed, |r| r.agent.clone()))
        .bind(column(resumed, |r| r.project_id.clone()))
        .bind(column(resumed, |r| r.started_by.clone()))
        .bind(col(rows, |d| d.org_id.clone()))
        .bind(col(rows, |d| d.decision_id.clone()))
        .bind(col(rows, |d| d.decided_at))
        .bind(col(rows, |d| d.session_id.clone()))
        .bind(col(rows, |d| d.key_id.clone()))
        .bind(col(rows, |d| d.decision.clone()))
        .bind(col(rows, |d| d.reason.clone()))
        .bind(col(rows, |d| d.rule.clone()))
        .bind(col(rows, |d| d.plan_id.clone()))
        .bind(col(rows, |d| d.suspended))
        .bind(col(rows, |d| d.month_start))
        .bind(col(rows, |d| d.month_end))
        .bind(col(rows, |d| d.month_used))
        .bind(col(rows, |d| d.month_limit))
        .bind(col(rows, |d| d.week_start))
        .bind(col(rows, |d| d.week_end))
        .bind(col(rows, |d| d.week_used))
        .bind(col(rows, |d| d.week_limit))
        .bind(col(rows, |d| d.running))
        .bind(col(rows, |d| d.concurrency_limit))
        .bind(col(rows, |d| d.upgrade_plan.clone()))
        .bind(column(resumed, |r| r.org_id.clone()))
        .bind(orgs)
        .bind(col(rows, |d| d.funded_by.clone()))
        .bind(col(rows, |d| d.plan_room))
        .bind(col(rows, |d| d.grant_room))
        .bind(col(rows, |d| d.overage_room))
        .bind(col(rows, |d| d.limit.as_ref().map(|l| l.kind.clone())))
        .bind(col(rows, |d| d.limit.as_ref().map(|l| l.member_id.clone())))
        .bind(col(rows, |d| d.limit.as_ref().map(|l| l.month_used)))
        .bind(col(rows, |d| d.limit.as_ref().and_then(|l| l.month_limit)))
        .bind(col(rows, |d| d.limit.as_ref().map(|l| l.week_used)))
        .bind(col(rows, |d| d.limit.as_ref().and_then(|l| l.week_limit)))
        .fetch_one(&mut **tx)
        .await?;
    let inserted: i64 = sqlx::Row::try_get(&row, 0)?;
    Ok(inserted == created.len() as i64)
}

#[cfg(test)]
mod generic_plans {
    //! The group commits' reads as a generic plan makes them (`begin_hot`), on tables that
    //! hold what piles up with history: a key's parked sessions (a session parks between
    //! turns for days) and an org's closed spans. Each must read an index range; a scan of
    //! the table makes every admission cost more as history grows.
    use super::*;

    /// A migrated database of its own on the test PostgreSQL (`RUSH_METER_TEST_PG`); none
    /// outside CI when there is no PostgreSQL, a failure on CI.
    async fn database() -> Option<Pg> {
        let base = std::env::var("RUSH_METER_TEST_PG")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
        let admin = match PgPool::connect(&format!("{base}/postgres")).await {
            Ok(p) => p,
            Err(e) if std::env::var("CI").as_deref() == Ok("true") => {
                panic!("PostgreSQL at {base} is required on CI: {e}")
            }
            Err(e) => {
                eprintln!("NOTE: PostgreSQL at {base} unreachable ({e}); this test did not run");
                return None;
            }
        };
        let name = format!("rm_test_{:016x}", rand::random::<u64>());
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&admin)
            .await
            .expect("create test database");
        admin.close().await;
        let pg = Pg::connect(&format!("{base}/{name}"), PoolSettings::default())
            .await
            .expect("connect");
        super::super::Admin::migrate(&pg).await.expect("migrate");
        Some(pg)
    }

    /// `EXPLAIN ANALYZE` of `sql`'s generic plan, its parameters of `types`, run with `args`.
    async fn generic_plan(pg: &Pg, types: &str, sql: &str, args: &str) -> String {
        let mut conn = pg.pool.acquire().await.expect("connection");
        sqlx::query("SET plan_cache_mode = force_generic_plan")
            .execute(&mut *conn)
            .await
            .expect("set");
        sqlx::query(&format!("PREPARE s({types}) AS {sql}"))
            .execute(&mut *conn)
            .await
            .expect("prepare");
        let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN ANALYZE EXECUTE s({args})"))
            .fetch_all(&mut *conn)
            .await
            .expect("explain");
        sqlx::query("DEALLOCATE s")
            .execute(&mut *conn)
            .await
            .expect("deallocate");
        plan.join("\n")
    }

    #[tokio::test]
    async fn the_slot_count_and_window_sums_read_index_ranges_of_a_long_history() {
        let Some(pg) = database().await else { return };
        // One key's 5,000 parked sessions, each with a closed running span; a few running.
        for sql in [
            "INSERT INTO orgs (org_id, name, plan_id, created_at, updated_at) \
             VALUES ('o', 'o', 'team', 0, 0)",
            "INSERT INTO sessions (org_id, session_id, key_id, phase, last_at, span_start, \
               created_at, slot_at) \
             SELECT 'o', 's' || i, 'k', CASE WHEN i % 1000 = 0 THEN 'running' ELSE 'parked' END, \
               i * 10 + 5, i * 10, i * 10, i * 10 FROM generate_series(1, 5000) AS i",
            "INSERT INTO spans (org_id, session_id, start_at, end_at, kind) \
             SELECT 'o', 's' || i, i * 10, i * 10 + 5, 'running' FROM generate_series(1, 5000) AS i",
            "ANALYZE sessions",
            "ANALYZE spans",
        ] {
            sqlx::query(sql).execute(&pg.pool).await.expect(sql);
        }
        let slots = generic_plan(
            &pg,
            "bigint, text[], text[], text[]",
            &slot_counts_sql(),
            "49000, '{o}', '{k}', '{o}'",
        )
        .await;
        assert!(
            !slots.contains("Seq Scan"),
            "the slot count scans:\n{slots}"
        );
        let types = format!("{}, text", vec!["bigint"; 21].join(", "));
        let args = format!("{}, 'o'", vec!["0"; 21].join(", "));
        let edge = [[(3_600, 3_700), NO_EDGE], [NO_EDGE, NO_EDGE]];
        let sums = generic_plan(&pg, &types, &window_sums_sql(1, &edge), &args).await;
        for table in ["sessions", "spans"] {
            let scan = format!("Seq Scan on {table}");
            assert!(
                !sums.contains(&scan),
                "the window sums scan {table}:\n{sums}"
            );
        }
        assert!(sums.contains("spans_org_running_end"), "{sums}");
        // Windows on the hour (every calendar month and ISO week) read no span at all.
        let on_the_hour = [[NO_EDGE; 2]; 2];
        let sums = generic_plan(&pg, &types, &window_sums_sql(1, &on_the_hour), &args).await;
        assert!(!sums.contains("spans"), "{sums}");
        pg.pool.close().await;
    }

    /// The most rows one node of `plan` read and threw away (`Rows Removed by Filter`).
    fn most_filtered(plan: &str) -> u64 {
        plan.lines()
            .filter_map(|l| l.trim().strip_prefix("Rows Removed by Filter: "))
            .filter_map(|n| n.parse().ok())
            .max()
            .unwrap_or(0)
    }

    /// A large org among many small ones (reports/growth.md): a generic plan judges an org
    /// by the average one, and once read a large org's 5,000 sessions through its primary
    /// key to find its 5 running ones. Its sessions also churned through running and then
    /// ended, as a fleet's do, which leaves a partial index over those phases many pages
    /// for its few rows. Each read by phase, key or slot must read about what it finds.
    #[tokio::test]
    async fn a_large_org_among_many_small_ones_reads_only_the_sessions_it_counts() {
        let Some(pg) = database().await else { return };
        for sql in [
            "INSERT INTO orgs (org_id, name, plan_id, created_at, updated_at) \
             SELECT o, o, 'team', 0, 0 FROM (SELECT 'o' AS o UNION ALL \
               SELECT 'g' || i FROM generate_series(1, 20000) AS i) AS x",
            "INSERT INTO sessions (org_id, session_id, key_id, phase, last_at, span_start, \
               created_at, slot_at) \
             SELECT 'o', 's' || i, 'k' || (i % 100), 'running', i * 10 + 5, i * 10, i * 10, \
               i * 10 FROM generate_series(1, 5000) AS i \
             UNION ALL SELECT 'g' || i, 'b' || i, 'k1', 'parked', i * 10 + 5, i * 10, i * 10, \
               i * 10 FROM generate_series(1, 20000) AS i",
            "UPDATE sessions SET phase = 'parked' WHERE org_id = 'o' AND session_id NOT LIKE '%000'",
            // Most of them then end, as the expiry job ends sessions parked for a week.
            "UPDATE sessions SET phase = 'ended' \
             WHERE phase = 'parked' AND session_id NOT LIKE 's%00'",
            "VACUUM ANALYZE sessions",
        ] {
            sqlx::query(sql).execute(&pg.pool).await.expect(sql);
        }
        let sums_types = format!("{}, text", vec!["bigint"; 21].join(", "));
        let sums_args = format!("{}, 'o'", vec!["0"; 21].join(", "));
        let on_the_hour = [[NO_EDGE; 2]; 2];
        let reads = [
            (
                "the slot count",
                "bigint, text[], text[], text[]".to_owned(),
                slot_counts_sql(),
                "49000, '{o}', '{k0}', '{o}'".to_owned(),
            ),
            (
                "the session counts",
                "text, bigint".into(),
                SESSION_COUNTS.into(),
                "'o', 0".into(),
            ),
            (
                "the running sessions",
                "text".into(),
                RUNNING_SESSIONS.into(),
                "'o'".into(),
            ),
            (
                "the window sums",
                sums_types,
                window_sums_sql(1, &on_the_hour),
                sums_args,
            ),
        ];
        for (what, types, sql, args) in reads {
            let plan = generic_plan(&pg, &types, &sql, &args).await;
            assert!(!plan.contains("Seq Scan"), "{what} scans:\n{plan}");
            assert!(
                most_filtered(&plan) <= 100,
                "{what} reads the large org's sessions to throw them away:\n{plan}"
            );
        }
        pg.pool.close().await;
    }
}
