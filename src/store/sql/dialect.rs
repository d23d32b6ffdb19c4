//! What a backend provides the shared SQL: the contract `Pg` (PostgreSQL) and `Lite`
//! (SQLite) each implement, and the only way the files beside this one reach a backend.
//!
//! This file is compiled with the shared SQL, once for each backend (see `mod.rs`), so its
//! signatures can name the shared types (`Tx`, `Rec`, `GateReads`) of that backend; the
//! text is one, and each backend is checked against it.

use super::*;

/// A transaction of backend `E`.
pub(crate) type TxOf<E> = Transaction<'static, <E as Dialect>::DB>;

/// A grouping's key (`key_seconds`) as either backend reads it: a column value on
/// PostgreSQL, an element of a JSON array on SQLite.
pub trait GroupKey:
    serde::de::DeserializeOwned + for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB> + Send + Unpin
{
}

impl<K> GroupKey for K where
    K: serde::de::DeserializeOwned + for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB> + Send + Unpin
{
}

/// The backend contract. Associated functions without `self` are statements run in a
/// transaction the caller holds; methods with `self` reach the backend's pools.
///
/// Its `async fn`s promise no `Send` in their signatures: every caller names a concrete
/// backend (`D`), so the compiler sees each future's type and checks it is `Send` where the
/// store's `async_trait`s need it. (`pub` only so that rows read through it may be named
/// in the public `FromRow` impls; the module is private to the store.)
#[allow(async_fn_in_trait)]
pub trait Dialect: Sized + Send + Sync + 'static {
    /// `sqlx::Postgres` or `sqlx::Sqlite`.
    type DB: sqlx::Database<Row = Self::Row>;
    /// Its row (named here, not as `DB::Row`, so the shared `FromRow` impls stay apart).
    type Row: sqlx::Row<Database = Self::DB>;
    /// A list of ids bound as one parameter (an array, or a JSON array).
    type Ids: Send;

    // The words in which the two SQL dialects differ.
    /// How a write transaction begins.
    const BEGIN_WRITE: &'static str;
    /// Appended to a SELECT that locks the rows it reads.
    const FOR_UPDATE: &'static str;
    /// Appended to a work queue's SELECT: lock, skipping rows another writer holds.
    const SKIP_LOCKED: &'static str;
    /// The scalar least and greatest of several values.
    const LEAST: &'static str;
    const GREATEST: &'static str;
    /// Appended to an `ORDER BY` column: byte order, whatever the database's locale.
    const BYTE_ORDER: &'static str;
    /// A booking's lock of its orgs' rows (appended to `SELECT … FROM orgs o`).
    const LOCK_ORGS: &'static str;
    /// Aggregate rows into a JSON array, and build one from values.
    const JSON_AGG: &'static str;
    const JSON_ARRAY: &'static str;
    /// Whether a multi-row VALUES statement (`values`) is prepared once a connection: worth
    /// it where planning a statement costs a round trip's share (PostgreSQL, Citus), not
    /// where its text changes with each group's size and preparing is cheap (SQLite).
    const KEEP_VALUES: bool;

    /// `column` among the ids bound (with `id_list`) as parameter `$n`.
    fn in_list(column: &str, n: usize) -> String;

    /// `org_id` among the ids bound as parameter `$n`.
    fn org_in(n: usize) -> String {
        Self::in_list("org_id", n)
    }

    /// `ids` as one parameter, for `in_list`.
    fn id_list(ids: &[&str]) -> Self::Ids;

    // Pools and transactions.
    /// Reads that may run long (exports, breakdowns), planned per call.
    fn read(&self) -> &Pool<Self::DB>;
    /// One org's reads by key, asked on every page view.
    fn keyed(&self) -> &Pool<Self::DB>;
    /// Writes.
    fn write(&self) -> &Pool<Self::DB>;
    /// Whether orgs' rows lie on several shards (Citus, partitions): a statement then names
    /// its orgs in every subquery on an org table, which Citus needs to route it to their
    /// shard and one PostgreSQL pays for on every row of a big group.
    fn spread(&self) -> bool {
        false
    }
    /// Whether a group whose orgs lie on several shards commits a transaction a shard
    /// (Citus: each then one worker's, without two-phase commit) rather than one for all.
    fn commits_by_shard(&self) -> bool {
        false
    }
    /// A group commit's transaction (heartbeats, admissions).
    async fn begin_hot(&self) -> StoreResult<TxOf<Self>>;

    /// The shard of each of `orgs`, in order (0 for all where there is one), looked up on
    /// `conn` when not known yet.
    async fn shard_ids(
        &self,
        conn: &mut <Self::DB as sqlx::Database>::Connection,
        orgs: &[&str],
    ) -> StoreResult<Vec<i64>>;

    /// The shard of each of `orgs` if every one is known without asking the database.
    fn known_shard_ids(&self, orgs: &[&str]) -> Option<Vec<i64>>;

    /// `orgs` split into those this store has seen exist and the others: orgs are never
    /// deleted, so a group split by shard need not read the first again (`remember_orgs`
    /// fills it; none seen by default).
    fn split_seen<'a>(&self, orgs: &[&'a str]) -> (Vec<&'a str>, Vec<&'a str>) {
        (Vec::new(), orgs.to_vec())
    }

    /// Remember that `orgs` exist (see `split_seen`).
    fn remember_orgs(&self, _orgs: &[String]) {}

    // Reads the backends make differently.
    /// A grouping's `(k, seconds)` rows: `sql` binds the org, `from` and `to`;
    /// `plan_per_call` asks for a plan made for the range (large groupings).
    async fn key_seconds<K: GroupKey>(
        &self,
        sql: &str,
        org_id: &str,
        from: Secs,
        to: Secs,
        plan_per_call: bool,
    ) -> StoreResult<Vec<(K, i64)>>;

    /// The frozen lines of the closed period starting at `period_start`, sent down `tx`
    /// in export order.
    async fn send_frozen_lines(
        &self,
        period_start: Secs,
        tx: &mpsc::Sender<Vec<SessionLine>>,
    ) -> StoreResult<()>;

    /// Lock and read the sessions of `orgs` (one shard's) these `(session, org)` pairs
    /// name.
    async fn lock_session_rows(
        &self,
        tx: &mut TxOf<Self>,
        orgs: &[&str],
        pairs: &[(&str, &str)],
    ) -> StoreResult<Vec<Rec<Session>>>;
}

/// The set-based statements on session rows, as the ledger books them (each backend's
/// `sessions.rs`): many rows in one statement (arrays on one PostgreSQL, multi-row VALUES
/// a table on SQLite and Citus: `values.rs`), at most `CHUNK` rows of one shard's orgs, in
/// a transaction the caller holds.
#[allow(async_fn_in_trait)]
pub trait SessionRows: Dialect {
    /// Up to `limit` sessions of `orgs` matching `condition` (on `$since`), locked,
    /// skipping rows another writer holds.
    async fn lock_sessions_where(
        tx: &mut TxOf<Self>,
        orgs: &[&str],
        condition: &str,
        since: Secs,
        limit: i64,
    ) -> StoreResult<Vec<Rec<Session>>>;

    /// Insert sessions first seen now; the number inserted.
    async fn insert_new_session_rows(
        &self,
        tx: &mut TxOf<Self>,
        rows: &[Session],
    ) -> StoreResult<u64>;

    /// Write what one transaction books: session rows, rollups, spans, funding.
    async fn write_booking(&self, tx: &mut TxOf<Self>, shard: i64, b: &Booking) -> StoreResult<()>;

    /// The ids among `ids` of orgs that exist.
    async fn select_org_ids(tx: &mut TxOf<Self>, ids: &[&str]) -> StoreResult<Vec<String>>;

    /// The orgs of `ids` that exist.
    async fn select_orgs_in<'e, E: sqlx::Executor<'e, Database = Self::DB>>(
        ex: E,
        ids: &[&str],
    ) -> StoreResult<Vec<Rec<Org>>>;
}

/// The gate's set-based statements (each backend's `gate.rs`), and the claim phase of an
/// admission, which a backend may specialise.
#[allow(async_fn_in_trait)]
pub trait GateRows: SessionRows {
    /// Lock the rows of `keys` (of `orgs`), in the order given.
    async fn lock_keys(
        tx: &mut TxOf<Self>,
        orgs: &[&str],
        keys: &[(&str, &str)],
    ) -> StoreResult<Vec<Key>>;

    /// The slots each of `keys` holds: sessions in an open phase heard since `since`.
    async fn slot_counts(
        tx: &mut TxOf<Self>,
        orgs: &[&str],
        keys: &[(&str, &str)],
        since: Secs,
    ) -> StoreResult<Vec<SlotCount>>;

    /// Write a group's admissions: new and resumed sessions, and every decision; false
    /// when a session to insert exists already.
    async fn write_admissions(
        &self,
        tx: &mut TxOf<Self>,
        orgs: &[&str],
        created: &[Session],
        resumed: &[Session],
        decisions: &[&Decision],
    ) -> StoreResult<bool>;

    /// What a backend reads in one statement right after the key locks, if it can
    /// (`EarlyReads`); `None`: the find phase locks every named session to learn which
    /// exist, and the read phase reads the rest.
    async fn early_reads(
        &self,
        _tx: &mut TxOf<Self>,
        _ask: &EarlyAsk<'_>,
    ) -> StoreResult<Option<EarlyReads>> {
        Ok(None)
    }
}
