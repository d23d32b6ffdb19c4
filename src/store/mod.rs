//! Storage on PostgreSQL or SQLite, chosen by the URL's scheme.
//!
//! The SQL is written once, in `sql/`, a module of each backend (`pg`, `sqlite`) compiled
//! once for each. All that differs between them (the words, the pools, how a write
//! transaction begins, the set-based statements: arrays and UNNEST on PostgreSQL,
//! multi-row VALUES on SQLite) is the backend's implementation of the traits of
//! `sql/dialect.rs`: `Dialect`, `SessionRows` and `GateRows`. Each `sql/` file implements one of the store's traits
//! (`api/`), so a `Db` is one `dyn Store`, whichever database it is. Times are Unix
//! seconds in BIGINT columns, so the same SQL reads the same on both.
//!
//! The store knows SQL and rows, never rules: what a group of heartbeats or admissions
//! does is decided by the core (`rush_meter_core::heartbeats`, `::gate`) between the
//! reads and the writes of one transaction.
//!
//! SQLite serves one instance: its writes go through a single connection, in
//! `BEGIN IMMEDIATE` transactions, so no write ever meets `SQLITE_BUSY` from this process.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

mod api;
pub(crate) mod error;
mod pg;
mod rows;
mod sqlite;

pub use api::{
    Admin, AuditStore, AutoTopupStore, DecideState, DeclineRecord, FundingStore, GateStore,
    LedgerStore, MemberStore, NewPack, NotificationStore, OrgStore, OverageStore, PeriodStore,
    PlanStore, RecordedVersion, RoomWait, Store, StripeStore, TermsOf, VersionMove, Written,
};
pub use error::{StoreError, StoreResult};
/// The texts of PostgreSQL's reads on generic plans, for tests/generic_plans.rs.
#[doc(hidden)]
pub use pg::hot_reads as pg_hot_reads;
pub use rows::*;

/// Which database a `Db` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Postgres => "postgres",
            Backend::Sqlite => "sqlite",
        }
    }
}

/// The pools under a `Db`, for benchmarks and tests that measure against raw SQL.
pub enum Pools<'a> {
    Postgres(&'a sqlx::PgPool),
    Sqlite {
        read: &'a sqlx::SqlitePool,
        write: &'a sqlx::SqlitePool,
    },
}

/// The database, whichever it is: every method of the store's traits, through `Deref`.
#[derive(Clone)]
pub struct Db(Arc<dyn Store + 'static>);

impl Deref for Db {
    type Target = dyn Store + 'static;

    fn deref(&self) -> &(dyn Store + 'static) {
        &*self.0
    }
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Db({})", self.0.backend().as_str())
    }
}

/// Connection settings that are not part of the URL.
#[derive(Clone, Copy, Debug)]
pub struct PoolSettings {
    pub max_connections: u32,
    pub acquire_timeout: Duration,
}

impl Default for PoolSettings {
    fn default() -> Self {
        PoolSettings {
            max_connections: 16,
            acquire_timeout: Duration::from_secs(3),
        }
    }
}

impl PoolSettings {
    /// A pool of these settings. sqlx pings each connection it hands out by default: a
    /// round trip before every transaction and read, one of the seven or so a group commit
    /// makes on PostgreSQL (and a worker thread's on SQLite). Only a connection idle for a
    /// second or more is pinged here: that is when a closed one is likely (a server
    /// restarted, an idle timeout); a busy pool's connections were just used. A dead
    /// connection that gets through fails its statement as unavailable (503), and the
    /// pool drops it when it comes back (sqlx pings each one it takes back).
    fn pool<DB: sqlx::Database>(&self) -> sqlx::pool::PoolOptions<DB> {
        use sqlx::Connection as _;
        sqlx::pool::PoolOptions::new()
            .max_connections(self.max_connections)
            .acquire_timeout(self.acquire_timeout)
            .test_before_acquire(false)
            .before_acquire(|conn: &mut DB::Connection, meta| {
                Box::pin(async move {
                    // Opened before a database was found read-only: close it, so that a
                    // new one finds the host that accepts writes.
                    if error::connection_outlived_read_only(meta.age) {
                        return Ok(false);
                    }
                    if meta.idle_for >= Duration::from_secs(1) {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
    }
}

impl Db {
    /// Open the database named by `url` (`postgres://…` or `sqlite://…`), creating a
    /// missing SQLite file.
    pub async fn connect(url: &str, settings: PoolSettings) -> StoreResult<Db> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Db(Arc::new(pg::Pg::connect(url, settings).await?)))
        } else if url.starts_with("sqlite:") {
            Ok(Db(Arc::new(sqlite::Lite::connect(url, settings).await?)))
        } else {
            Err(StoreError::Other(sqlx::Error::Configuration(
                format!("unsupported database URL `{url}`: use postgres://… or sqlite://…").into(),
            )))
        }
    }

    /// Whether the database server answers at all, within a second. A refusal it sends
    /// itself (too many clients, a bad password) means it is up: an outage is a server
    /// that cannot be reached, not a busy one.
    pub async fn reachable(&self) -> bool {
        match tokio::time::timeout(Duration::from_secs(1), self.connect_fresh()).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => !e.is_unavailable(),
            Err(_) => false,
        }
    }

    /// How many writers may commit at once: PostgreSQL overlaps commits; SQLite has one
    /// write connection. Two, not more: each commit costs its statements' fixed work,
    /// so fewer writers taking bigger groups do more on busy cores (measured with 1, 2
    /// and 4: reports/ingest.md), while two keep one writer's lock wait (on another
    /// instance) from holding up every request.
    pub fn writers(&self) -> usize {
        match self.backend() {
            Backend::Postgres => 2,
            Backend::Sqlite => 1,
        }
    }

    /// Whether a writer may begin its next group while one commits
    /// (`GateStore::admit_telling`). Not on SQLite: with one write connection, a group
    /// begun beside a committing one would only wait for it in the pool, its acquire
    /// timeout running.
    pub fn overlaps_commits(&self) -> bool {
        self.backend() == Backend::Postgres
    }
}
