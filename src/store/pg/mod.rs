//! PostgreSQL: the dialect's words, the pools, the tables' layout (one database,
//! partitions or Citus) and the transactions the group commits begin. Its set-based
//! statements (`sessions`, `gate`) bind whole columns as arrays and read them back with
//! UNNEST, so each statement has one fixed text (prepared once per connection) whatever
//! the row count.

use sqlx::postgres::PgConnectOptions;
use sqlx::PgPool;

use super::PoolSettings;

mod copy_lines;
mod gate;
mod hosts;
pub mod hot_reads;
mod params;
mod sessions;

// The shared SQL, compiled for this backend (the other compiles it too: on purpose).
#[allow(clippy::duplicate_mod)]
#[path = "../sql/mod.rs"]
mod sql;

use sql::*;

/// The backend the shared SQL (`sql/`) is compiled for here.
type Engine = Pg;

/// Stream the frozen lines of the period starting at `period_start` down `tx`; true when
/// the COPY was read to its end, false when the receiver hung up first.
async fn copy_frozen_lines(
    conn: &mut sqlx::PgConnection,
    period_start: Secs,
    tx: &mpsc::Sender<Vec<SessionLine>>,
) -> StoreResult<bool> {
    use futures_util::TryStreamExt;
    // COPY takes no parameters: the period's start is an integer written into the text.
    let sql = frozen_lines_sql(&period_start.to_string());
    let mut bytes = conn
        .copy_out_raw(&format!("COPY ({sql}) TO STDOUT (FORMAT binary)"))
        .await?;
    let mut decoder = copy_lines::LineDecoder::default();
    let mut out = LineBatches::new(tx);
    let bad = |e: copy_lines::DecodeError| {
        StoreError::Other(sqlx::Error::Protocol(format!(
            "the binary COPY of period_sessions: {e}"
        )))
    };
    while let Some(chunk) = bytes.try_next().await? {
        decoder.push(&chunk);
        while let Some(line) = decoder.next_line().map_err(bad)? {
            if !out.push(line).await {
                return Ok(false);
            }
        }
    }
    decoder.finish().map_err(bad)?;
    out.finish().await;
    Ok(true)
}

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
    /// Orgs seen to exist, where a group commits a shard at a time (`Dialect::split_seen`).
    seen: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The URL's hosts: with several, the pools follow the one that accepts writes.
    hosts: hosts::Hosts,
}

/// Each statement planned for the parameters and statistics of the moment (reads whose
/// best plan depends on the range asked); the group commits' own statements opt into
/// generic plans (`begin_hot`).
fn custom_plans(opts: PgConnectOptions) -> PgConnectOptions {
    opts.options([("plan_cache_mode", "force_custom_plan")])
}

/// The keyed pool's: each statement's generic plan kept (`Pg::keyed`).
fn generic_plans(opts: PgConnectOptions) -> PgConnectOptions {
    opts.options([("plan_cache_mode", "force_generic_plan")])
}

/// Orgs `Pg::seen` holds at most; past it, it starts again (a forgotten org costs one
/// read of its row the next time).
const SEEN_ORGS: usize = 1_000_000;

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

/// The tables the hot paths lock and look up by key, whose plans need statistics: the
/// group commits' statements keep a generic plan (`begin_hot`) until the statistics of a
/// table they read change.
const HOT_TABLES: [&str; 12] = [
    "sessions",
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

/// `transaction_read_only` as a server reports it: `on` is an outage for a writer.
fn writable(read_only: &str) -> StoreResult<()> {
    if read_only == "off" {
        return Ok(());
    }
    crate::store::error::note_read_only();
    Err(StoreError::Unavailable(sqlx::Error::Protocol(
        "the database accepts no writes (transaction_read_only is on): a standby, or a \
         primary not yet writable"
            .into(),
    )))
}

impl Pg {
    /// A new connection where the pools point, and whether it accepts writes.
    async fn fresh_on_current(&self) -> StoreResult<()> {
        use sqlx::{ConnectOptions, Connection};
        let mut conn = self.pool.connect_options().connect().await?;
        let read_only: String =
            sqlx::query_scalar("SELECT current_setting('transaction_read_only')")
                .fetch_one(&mut conn)
                .await?;
        conn.close().await?;
        writable(&read_only)
    }

    /// Point both pools at the host that accepts writes now, if it is another: new
    /// connections go there; those to the old host fail or, read-only, are replaced
    /// (`error::connection_outlived_read_only`).
    async fn follow(&self) -> StoreResult<()> {
        let next = self.hosts.pick().await?;
        let now = self.pool.connect_options();
        if (now.get_host(), now.get_port()) != (next.get_host(), next.get_port()) {
            tracing::warn!(from = %format!("{}:{}", now.get_host(), now.get_port()),
                to = %format!("{}:{}", next.get_host(), next.get_port()),
                "the database accepts writes on another host now: following it");
            self.pool.set_connect_options(custom_plans(next.clone()));
            self.keyed.set_connect_options(generic_plans(next));
        }
        Ok(())
    }
}

/// Connections of the keyed-read pool (`Pg::keyed`) beside the main pool's: a page view
/// holds at most three at once, and the main pool keeps the writers and exports.
fn keyed_connections(max_connections: u32) -> u32 {
    (max_connections / 2).max(2)
}

impl Pg {
    pub async fn connect(url: &str, settings: PoolSettings) -> StoreResult<Pg> {
        let hosts = hosts::parse(url)?;
        let base = match hosts.several() || hosts.writable {
            true => hosts.pick().await?,
            false => hosts.each[0].clone(),
        };
        let pool = settings
            .pool()
            .connect_with(custom_plans(base.clone()))
            .await?;
        let keyed = settings
            .pool()
            .max_connections(keyed_connections(settings.max_connections))
            .connect_lazy_with(generic_plans(base));
        let pg = Pg {
            pool,
            keyed,
            sharding: std::sync::RwLock::new(Sharding::One),
            shards: std::sync::Mutex::default(),
            seen: std::sync::Mutex::default(),
            hosts,
        };
        pg.detect_sharding().await?;
        Ok(pg)
    }

    /// Whether the org tables are on one PostgreSQL (neither partitioned nor distributed).
    fn on_one_database(&self) -> bool {
        *self.sharding.read().expect("sharding lock") == Sharding::One
    }

    /// Whether the org tables are distributed by Citus, which routes a set-based write to
    /// its shard only as multi-row VALUES (`values`).
    fn distributed(&self) -> bool {
        *self.sharding.read().expect("sharding lock") == Sharding::Citus
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
}

impl Dialect for Pg {
    type DB = sqlx::Postgres;
    type Row = sqlx::postgres::PgRow;
    type Ids = Vec<String>;

    /// A plain BEGIN: row locks (`FOR UPDATE`) order the writers of several instances.
    const BEGIN_WRITE: &'static str = "BEGIN";
    const FOR_UPDATE: &'static str = " FOR UPDATE";
    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";
    const LEAST: &'static str = "LEAST";
    const GREATEST: &'static str = "GREATEST";
    /// Byte order for ids, whatever the database's locale (exports sort by it).
    const BYTE_ORDER: &'static str = " COLLATE \"C\"";
    /// A booking's lock of its orgs' rows: it keeps out other bookings of the org (and plan
    /// changes), not the inserts of rows that reference the org.
    const LOCK_ORGS: &'static str = " FOR NO KEY UPDATE OF o";
    const JSON_AGG: &'static str = "json_agg";
    const JSON_ARRAY: &'static str = "json_build_array";
    const KEEP_VALUES: bool = true;

    fn in_list(column: &str, n: usize) -> String {
        format!("{column} = ANY(${n})")
    }

    fn id_list(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|o| o.to_string()).collect()
    }

    /// A group commit's transaction (heartbeats, admissions). Its statements have fixed
    /// texts, find their rows by key, and run thousands of times a second: planning them
    /// anew each time (the connections' `force_custom_plan`) costs more than running them,
    /// so on one PostgreSQL they use the plan each connection caches. A cached plan is replanned
    /// when its tables' statistics change (ANALYZE, `gather_statistics`), so one made
    /// while a table was empty does not outlive its first statistics. Partitioned and
    /// distributed layouts keep custom plans: there the plan prunes shards by the values.
    async fn begin_hot(&self) -> StoreResult<Tx> {
        let sharding = *self.sharding.read().expect("sharding lock");
        let begin = match sharding {
            Sharding::One => "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan",
            _ => Self::BEGIN_WRITE,
        };
        begin_in_writer(self.write(), begin).await
    }

    /// Lock and read the sessions these `(session, org)` pairs name, of `orgs` (one
    /// shard's), as `select_sessions_for_update` does on this layout.
    async fn lock_session_rows(
        &self,
        tx: &mut Tx,
        orgs: &[&str],
        pairs: &[(&str, &str)],
    ) -> StoreResult<Vec<Rec<Session>>> {
        sessions::select_sessions_for_update(tx, self.on_one_database(), orgs, pairs).await
    }

    /// A grouping's `(k, s)` rows: `sql` binds the org, `from` and `to`. With
    /// `plan_per_call`, planned for the range asked (the main pool's custom plans): a
    /// month by session groups thousands of session-hours, where a plan for the range
    /// beats the generic one (reports/usage.md); the small groupings keep the generic
    /// plans, whose planning is saved.
    async fn key_seconds<K: GroupKey>(
        &self,
        sql: &str,
        org_id: &str,
        from: Secs,
        to: Secs,
        plan_per_call: bool,
    ) -> StoreResult<Vec<(K, i64)>> {
        Ok(sqlx::query_as(sql)
            .bind(org_id)
            .bind(from)
            .bind(to)
            .fetch_all(if plan_per_call {
                self.read()
            } else {
                self.keyed()
            })
            .await?)
    }

    /// The frozen lines of the closed period starting at `period_start`, sent down `tx`
    /// in export order, read with a binary COPY (`copy_lines`).
    async fn send_frozen_lines(
        &self,
        period_start: Secs,
        tx: &mpsc::Sender<Vec<SessionLine>>,
    ) -> StoreResult<()> {
        let mut conn = self.read().acquire().await?;
        let done = copy_frozen_lines(&mut conn, period_start, tx).await;
        if !matches!(done, Ok(true)) {
            // Left mid-COPY, the connection still has rows coming: never reuse it.
            conn.close_on_drop();
        }
        done.map(|_| ())
    }

    /// The shard of each of `orgs` (in order): 0 for all on one PostgreSQL.
    async fn shard_ids(
        &self,
        conn: &mut sqlx::PgConnection,
        orgs: &[&str],
    ) -> StoreResult<Vec<i64>> {
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
                .fetch_all(&mut *conn)
                .await?;
            self.shards.lock().expect("shard cache lock").extend(found);
        }
        let known = self.shards.lock().expect("shard cache lock");
        Ok(orgs
            .iter()
            .map(|o| known.get(*o).copied().unwrap_or(0))
            .collect())
    }

    fn known_shard_ids(&self, orgs: &[&str]) -> Option<Vec<i64>> {
        if self.on_one_database() {
            return Some(vec![0; orgs.len()]);
        }
        let known = self.shards.lock().expect("shard cache lock");
        orgs.iter().map(|o| known.get(*o).copied()).collect()
    }

    fn split_seen<'a>(&self, orgs: &[&'a str]) -> (Vec<&'a str>, Vec<&'a str>) {
        let seen = self.seen.lock().expect("seen orgs lock");
        orgs.iter().partition(|o| seen.contains(**o))
    }

    fn remember_orgs(&self, orgs: &[String]) {
        let mut seen = self.seen.lock().expect("seen orgs lock");
        if seen.len() + orgs.len() > SEEN_ORGS {
            seen.clear();
        }
        seen.extend(orgs.iter().cloned());
    }

    fn spread(&self) -> bool {
        *self.sharding.read().expect("sharding lock") != Sharding::One
    }

    fn commits_by_shard(&self) -> bool {
        self.distributed()
    }

    fn read(&self) -> &PgPool {
        &self.pool
    }

    /// The pool for the console's reads of one org (its row and funding, window sums,
    /// session counts, breakdown pieces): fixed texts, each an index range of one org
    /// bounded by a window or a breakdown's longest range, asked on every page view.
    /// Planning them anew costs more than running them (reports/usage.md), so on one
    /// PostgreSQL they keep the generic plan each connection caches, as the group commits
    /// do (`begin_hot`).
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

    /// Ready only while the database accepts writes: `transaction_read_only` is what a
    /// write would meet (a standby, and a promoted primary still read-only, say `on`;
    /// `pg_is_in_recovery()` misses the latter).
    async fn ping(&self) -> StoreResult<()> {
        let read_only: String =
            sqlx::query_scalar("SELECT current_setting('transaction_read_only')")
                .fetch_one(&self.pool)
                .await?;
        writable(&read_only)
    }

    async fn connect_fresh(&self) -> StoreResult<()> {
        match self.fresh_on_current().await {
            // Down or read-only where the pools point: another host may have taken over.
            Err(e) if e.is_unavailable() && self.hosts.several() => {
                self.follow().await?;
                self.fresh_on_current().await
            }
            done => done,
        }
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
