//! SQLite: the dialect's words, the pools (one writer, several readers), and the query
//! builders of its set-based statements (`sessions`, `gate`): multi-row VALUES. SQLite
//! prepares in-process, so a text that varies with the row count costs little.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{QueryBuilder, SqlitePool};

use super::PoolSettings;

mod gate;
mod sessions;

// The shared SQL, compiled for this backend (the other compiles it too: on purpose).
#[allow(clippy::duplicate_mod)]
#[path = "../sql/mod.rs"]
mod sql;

use sql::*;

/// The backend the shared SQL (`sql/`) is compiled for here.
type Engine = Lite;

/// Writes go through one connection; reads through a pool of read-only ones.
pub struct Lite {
    read: SqlitePool,
    write: SqlitePool,
}

impl Lite {
    pub async fn connect(url: &str, settings: PoolSettings) -> StoreResult<Lite> {
        let opts = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(5));
        let write = settings
            .pool()
            .max_connections(1)
            .acquire_timeout(settings.acquire_timeout.max(Duration::from_secs(30)))
            .connect_with(opts.clone())
            .await?;
        let read = settings
            .pool()
            .max_connections(settings.max_connections.min(8))
            .connect_with(opts.read_only(true))
            .await?;
        Ok(Lite { read, write })
    }
}

impl Dialect for Lite {
    type DB = sqlx::Sqlite;
    type Row = sqlx::sqlite::SqliteRow;
    type Ids = String;

    /// Take the write lock up front, so a read-then-write never fails on a stale snapshot.
    const BEGIN_WRITE: &'static str = "BEGIN IMMEDIATE";
    /// The single writer connection and BEGIN IMMEDIATE already serialise writers.
    const FOR_UPDATE: &'static str = "";
    const SKIP_LOCKED: &'static str = "";
    /// SQLite's multi-argument scalar MIN and MAX.
    const LEAST: &'static str = "MIN";
    const GREATEST: &'static str = "MAX";
    /// SQLite compares text byte by byte (BINARY) already.
    const BYTE_ORDER: &'static str = "";
    /// `BEGIN IMMEDIATE` holds the write lock already.
    const LOCK_ORGS: &'static str = "";
    const JSON_AGG: &'static str = "json_group_array";
    const JSON_ARRAY: &'static str = "json_array";
    const KEEP_VALUES: bool = false;

    /// A JSON array parameter, read with `json_each`.
    fn in_list(column: &str, n: usize) -> String {
        format!("{column} IN (SELECT value FROM json_each(${n}))")
    }

    fn id_list(ids: &[&str]) -> String {
        serde_json::to_string(ids).expect("ids serialise")
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
        begin_in_writer(self.write(), Self::BEGIN_WRITE).await
    }

    /// One instance, one file: every org on shard 0.
    async fn shard_ids(
        &self,
        _conn: &mut sqlx::SqliteConnection,
        orgs: &[&str],
    ) -> StoreResult<Vec<i64>> {
        Ok(vec![0; orgs.len()])
    }

    fn known_shard_ids(&self, orgs: &[&str]) -> Option<Vec<i64>> {
        Some(vec![0; orgs.len()])
    }

    /// A grouping's `(k, s)` rows (`sql` binds the org, `from` and `to`), read as one row
    /// of JSON: sqlx hands each row of SQLite's over from its worker thread as a message of
    /// its own, and a month by session or by hour is thousands of rows. SQLite plans each
    /// statement once a connection, so `_plan_per_call` (PostgreSQL's choice) is moot here.
    async fn key_seconds<K: GroupKey>(
        &self,
        sql: &str,
        org_id: &str,
        from: Secs,
        to: Secs,
        _plan_per_call: bool,
    ) -> StoreResult<Vec<(K, i64)>> {
        let text: String = sqlx::query_scalar(&format!(
            "SELECT json_group_array(json_array(k, s)) FROM ({sql})"
        ))
        .bind(org_id)
        .bind(from)
        .bind(to)
        .fetch_one(self.keyed())
        .await?;
        serde_json::from_str(&text).map_err(|e| StoreError::Other(sqlx::Error::Decode(Box::new(e))))
    }

    /// The frozen lines of the closed period starting at `period_start`, sent down `tx`
    /// in export order.
    async fn send_frozen_lines(
        &self,
        period_start: Secs,
        tx: &mpsc::Sender<Vec<SessionLine>>,
    ) -> StoreResult<()> {
        let sql = frozen_lines_sql("$1");
        let rows = sqlx::query_as::<_, Rec<SessionLine>>(&sql)
            .bind(period_start)
            .fetch(self.read());
        send_lines(rows, tx).await
    }

    fn write(&self) -> &SqlitePool {
        &self.write
    }

    async fn lock_session_rows(
        &self,
        tx: &mut Tx,
        orgs: &[&str],
        pairs: &[(&str, &str)],
    ) -> StoreResult<Vec<Rec<Session>>> {
        // The single writer holds the lock already.
        sessions::select_sessions_for_update(tx, orgs, pairs).await
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
        sqlx::query("SELECT 1").execute(&self.read).await?;
        Ok(())
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
