//! Storage on PostgreSQL or SQLite, chosen by the URL's scheme.
//!
//! The SQL is written once, in `queries.rs`, and compiled twice: into `pg` with
//! `DB = Postgres` and into `sqlite` with `DB = Sqlite`. Each backend module supplies the
//! few words in which the dialects differ (how a write transaction begins, row locks,
//! LEAST/GREATEST) and its set-based statements (`bulk_pg.rs`: arrays and UNNEST;
//! `bulk_sqlite.rs`: multi-row VALUES), the one place where the two differ in shape.
//! Times are Unix seconds in BIGINT columns, so the same SQL reads the same on both.
//!
//! SQLite serves one instance: its writes go through a single connection, in
//! `BEGIN IMMEDIATE` transactions, so no write ever meets `SQLITE_BUSY` from this process.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{PgPool, SqlitePool};

use crate::ledger::Secs;

mod rows;
pub use rows::*;

#[allow(clippy::duplicate_mod)]
mod pg {
    pub type DB = sqlx::Postgres;
    /// A plain BEGIN: row locks (`FOR UPDATE`) order the writers of several instances.
    pub const BEGIN_WRITE: &str = "BEGIN";
    pub const FOR_UPDATE: &str = " FOR UPDATE";
    pub const SKIP_LOCKED: &str = " FOR UPDATE SKIP LOCKED";
    pub const LEAST: &str = "LEAST";
    pub const GREATEST: &str = "GREATEST";
    /// Byte order for ids, whatever the database's locale (exports sort by it).
    pub const BYTE_ORDER: &str = " COLLATE \"C\"";
    include!("queries.rs");
    include!("admissions.rs");
    include!("stripe.rs");
    include!("periods.rs");
    include!("notifications.rs");
    include!("bulk_pg.rs");
}

#[allow(clippy::duplicate_mod)]
mod sqlite {
    pub type DB = sqlx::Sqlite;
    /// Take the write lock up front, so a read-then-write never fails on a stale snapshot.
    pub const BEGIN_WRITE: &str = "BEGIN IMMEDIATE";
    /// The single writer connection and BEGIN IMMEDIATE already serialise writers.
    pub const FOR_UPDATE: &str = "";
    pub const SKIP_LOCKED: &str = "";
    /// SQLite's multi-argument scalar MIN and MAX.
    pub const LEAST: &str = "MIN";
    pub const GREATEST: &str = "MAX";
    /// SQLite compares text byte by byte (BINARY) already.
    pub const BYTE_ORDER: &str = "";
    include!("queries.rs");
    include!("admissions.rs");
    include!("stripe.rs");
    include!("periods.rs");
    include!("notifications.rs");
    include!("bulk_sqlite.rs");
}

/// Which database, and the pools onto it.
#[derive(Clone, Debug)]
pub enum Db {
    Postgres(PgPool),
    Sqlite { read: SqlitePool, write: SqlitePool },
}

/// Calls the same query function on whichever backend is configured.
/// `write` picks SQLite's single writer connection; `read` its reader pool.
macro_rules! on_backend {
    ($db:expr, write, $f:ident ( $($arg:expr),* $(,)? )) => {
        match $db {
            $crate::store::Db::Postgres(p) => $crate::store::pg::$f(p, $($arg),*).await,
            $crate::store::Db::Sqlite { write, .. } => $crate::store::sqlite::$f(write, $($arg),*).await,
        }
    };
    ($db:expr, read, $f:ident ( $($arg:expr),* $(,)? )) => {
        match $db {
            $crate::store::Db::Postgres(p) => $crate::store::pg::$f(p, $($arg),*).await,
            $crate::store::Db::Sqlite { read, .. } => $crate::store::sqlite::$f(read, $($arg),*).await,
        }
    };
}

/// A failure of the store, sorted by what the caller should do about it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached or did not answer in time: retry later (503).
    #[error("database unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    /// A uniqueness rule refused the write (409).
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("database error: {0}")]
    Other(#[source] sqlx::Error),
}

impl StoreError {
    /// The database could not be reached or did not answer in time (a 503).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => StoreError::Unavailable(e),
            sqlx::Error::Database(d) if d.is_unique_violation() => {
                StoreError::Conflict(d.message().to_owned())
            }
            // Connection-level failures, admin shutdown, and SQLite's busy/locked.
            sqlx::Error::Database(d)
                if d.code().is_some_and(|c| {
                    c.starts_with("08") || c.starts_with("57P") || c == "5" || c == "6"
                }) =>
            {
                StoreError::Unavailable(e)
            }
            _ => StoreError::Other(e),
        }
    }
}

impl StoreError {
    /// Worth running the same transaction again: serialization failures and deadlocks.
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Other(sqlx::Error::Database(d)) => {
                matches!(d.code().as_deref(), Some("40001" | "40P01"))
            }
            _ => false,
        }
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

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

impl Db {
    /// Open the database named by `url` (`postgres://…` or `sqlite://…`), creating a
    /// missing SQLite file.
    pub async fn connect(url: &str, settings: PoolSettings) -> StoreResult<Db> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            // Plan each statement for the parameters and statistics of the moment: a generic
            // plan cached while a table was still empty (a new deployment) would scan it
            // whole for the life of the connection.
            let opts = PgConnectOptions::from_str(url)?
                .options([("plan_cache_mode", "force_custom_plan")]);
            let pool = PgPoolOptions::new()
                .max_connections(settings.max_connections)
                .acquire_timeout(settings.acquire_timeout)
                .connect_with(opts)
                .await?;
            Ok(Db::Postgres(pool))
        } else if url.starts_with("sqlite:") {
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
            Ok(Db::Sqlite { read, write })
        } else {
            Err(StoreError::Other(sqlx::Error::Configuration(
                format!("unsupported database URL `{url}`: use postgres://… or sqlite://…").into(),
            )))
        }
    }

    pub fn backend(&self) -> &'static str {
        match self {
            Db::Postgres(_) => "postgres",
            Db::Sqlite { .. } => "sqlite",
        }
    }

    /// Bring the schema up to date. Safe to run from several instances at once on
    /// PostgreSQL (sqlx takes an advisory lock).
    pub async fn migrate(&self) -> Result<(), sqlx::migrate::MigrateError> {
        match self {
            Db::Postgres(p) => sqlx::migrate!("migrations/postgres").run(p).await,
            Db::Sqlite { write, .. } => sqlx::migrate!("migrations/sqlite").run(write).await,
        }
    }

    /// Open a connection outside the pools and close it: whether the database can be
    /// reached at all, even while every pooled connection is busy.
    pub async fn connect_fresh(&self) -> StoreResult<()> {
        use sqlx::{ConnectOptions, Connection};
        match self {
            Db::Postgres(p) => p.connect_options().connect().await?.close().await?,
            // A file: reachable while the process runs.
            Db::Sqlite { .. } => {}
        }
        Ok(())
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

    /// One round trip to the database, for `/readyz`.
    pub async fn ping(&self) -> StoreResult<()> {
        on_backend!(self, read, ping())
    }

    pub async fn close(&self) {
        match self {
            Db::Postgres(p) => p.close().await,
            Db::Sqlite { read, write } => {
                read.close().await;
                write.close().await;
            }
        }
    }

    // ----- orgs, keys, tokens -----

    pub async fn upsert_org(&self, org: &OrgUpsert, now: Secs) -> StoreResult<OrgRow> {
        on_backend!(self, write, upsert_org(org, now))
    }

    pub async fn get_org(&self, org_id: &str) -> StoreResult<Option<OrgRow>> {
        on_backend!(self, read, get_org(org_id))
    }

    pub async fn upsert_key(
        &self,
        org_id: &str,
        key_id: &str,
        limit: Option<i64>,
        now: Secs,
    ) -> StoreResult<KeyRow> {
        on_backend!(self, write, upsert_key(org_id, key_id, limit, now))
    }

    pub async fn get_key(&self, org_id: &str, key_id: &str) -> StoreResult<Option<KeyRow>> {
        on_backend!(self, read, get_key(org_id, key_id))
    }

    pub async fn insert_token(&self, token: &TokenRow) -> StoreResult<()> {
        on_backend!(self, write, insert_token(token))
    }

    pub async fn token_by_hash(&self, hash: &str) -> StoreResult<Option<TokenRow>> {
        on_backend!(self, read, token_by_hash(hash))
    }

    // ----- the ledger -----

    /// Apply heartbeat requests in one transaction (see `queries.rs` `ingest`).
    /// `shard` names the `org_hourly` rows this writer adds to; give each concurrent
    /// writer its own.
    pub async fn ingest(
        &self,
        requests: &[Vec<crate::ingest::Heartbeat>],
        rules: &crate::ledger::Rules,
        shard: i64,
    ) -> StoreResult<Vec<Result<Vec<HeartbeatOutcome>, IngestReject>>> {
        on_backend!(self, write, ingest(requests, rules, shard))
    }

    pub async fn end_session(
        &self,
        session_id: &str,
        scope_org: Option<&str>,
        status: crate::ledger::EndStatus,
        now: Secs,
        rules: &crate::ledger::Rules,
    ) -> StoreResult<Option<SessionRow>> {
        on_backend!(
            self,
            write,
            end_session(session_id, scope_org, status, now, rules)
        )
    }

    /// Book what time alone decides: silent sessions and parked ones past expiry.
    /// Returns how many sessions changed.
    pub async fn expire_sessions(
        &self,
        now: Secs,
        rules: &crate::ledger::Rules,
        limit: i64,
    ) -> StoreResult<usize> {
        on_backend!(self, write, expire_sessions(now, rules, limit))
    }

    pub async fn get_session(&self, session_id: &str) -> StoreResult<Option<SessionRow>> {
        on_backend!(self, read, get_session(session_id))
    }

    /// Seconds used in the month and week windows by each of `org_ids` (orgs that share
    /// those windows), booked time plus running sessions counted up to `now`. Orgs with
    /// nothing used are absent.
    pub async fn window_usage(
        &self,
        org_ids: &[&str],
        windows: &crate::quota::Windows,
        now: Secs,
        rules: &crate::ledger::Rules,
    ) -> StoreResult<std::collections::HashMap<String, WindowTotals>> {
        on_backend!(self, read, window_usage(org_ids, windows, now, rules))
    }

    pub async fn get_orgs(&self, org_ids: &[&str]) -> StoreResult<Vec<OrgRow>> {
        on_backend!(self, read, get_orgs(org_ids))
    }

    /// Running sessions heard from within the lease, and parked ones.
    pub async fn session_counts(
        &self,
        org_id: &str,
        now: Secs,
        rules: &crate::ledger::Rules,
    ) -> StoreResult<SessionCounts> {
        on_backend!(self, read, session_counts(org_id, now, rules))
    }

    /// Every closed running span and open running stretch of an org, for audits and tests.
    pub async fn running_spans(&self, org_id: &str) -> StoreResult<Vec<(String, Secs, Secs)>> {
        on_backend!(self, read, running_spans(org_id))
    }

    pub async fn hourly_totals(&self, org_id: &str) -> StoreResult<Vec<(Secs, i64)>> {
        on_backend!(self, read, hourly_totals(org_id))
    }

    pub async fn session_hourly_totals(&self, org_id: &str) -> StoreResult<Vec<(String, i64)>> {
        on_backend!(self, read, session_hourly_totals(org_id))
    }

    pub async fn sessions_of_org(&self, org_id: &str) -> StoreResult<Vec<SessionRow>> {
        on_backend!(self, read, sessions_of_org(org_id))
    }

    /// Row counts and sums of every table, for tests that prove nothing was written.
    pub async fn digest(&self) -> StoreResult<Vec<(String, i64, i64)>> {
        on_backend!(self, read, digest())
    }

    // ----- the gate -----

    /// Decide a group of admissions in one transaction, in order (see `admissions.rs`).
    pub async fn admit(
        &self,
        plans: &crate::plans::Plans,
        requests: &[AdmissionRequest],
        now: Secs,
        rules: &crate::ledger::Rules,
    ) -> StoreResult<Vec<Result<DecisionRow, AdmitReject>>> {
        on_backend!(self, write, admit(plans, requests, now, rules))
    }

    pub async fn list_decisions(
        &self,
        org_id: &str,
        from: Secs,
        to: Secs,
        only: Option<&str>,
        after: Option<(Secs, String)>,
        limit: i64,
    ) -> StoreResult<Vec<DecisionRow>> {
        on_backend!(
            self,
            read,
            list_decisions(org_id, from, to, only, after, limit)
        )
    }

    // ----- Stripe -----

    /// Store a webhook event; false if its id was stored before.
    pub async fn insert_stripe_event(
        &self,
        event_id: &str,
        kind: &str,
        created: Secs,
        payload: &str,
        now: Secs,
    ) -> StoreResult<bool> {
        on_backend!(
            self,
            write,
            insert_stripe_event(event_id, kind, created, payload, now)
        )
    }

    pub async fn claim_stripe_events(
        &self,
        now: Secs,
        hold: Secs,
        limit: i64,
    ) -> StoreResult<Vec<StripeEventRow>> {
        on_backend!(self, write, claim_stripe_events(now, hold, limit))
    }

    #[allow(clippy::too_many_arguments)]
    pub async fn finish_stripe_event(
        &self,
        event_id: &str,
        state: &str,
        org_id: Option<&str>,
        error: Option<&str>,
        next_attempt_at: Secs,
        now: Secs,
    ) -> StoreResult<()> {
        on_backend!(
            self,
            write,
            finish_stripe_event(event_id, state, org_id, error, next_attempt_at, now)
        )
    }

    pub async fn list_stripe_events(
        &self,
        state: Option<&str>,
        before: Option<(Secs, String)>,
        limit: i64,
    ) -> StoreResult<Vec<StripeEventRow>> {
        on_backend!(self, read, list_stripe_events(state, before, limit))
    }

    pub async fn requeue_stripe_event(&self, event_id: &str, now: Secs) -> StoreResult<bool> {
        on_backend!(self, write, requeue_stripe_event(event_id, now))
    }

    pub async fn org_by_stripe_customer(&self, customer_id: &str) -> StoreResult<Option<OrgRow>> {
        on_backend!(self, read, org_by_stripe_customer(customer_id))
    }

    /// Apply Stripe's state to an org, decided from its locked row (see `stripe.rs`).
    pub async fn apply_subscription_state<F>(
        &self,
        org_id: &str,
        decide: F,
        source: &str,
        now: Secs,
    ) -> StoreResult<Option<(OrgRow, OrgRow)>>
    where
        F: FnOnce(&OrgRow) -> Option<SubscriptionState> + Send,
    {
        on_backend!(
            self,
            write,
            apply_subscription_state(org_id, decide, source, now)
        )
    }

    pub async fn list_stripe_changes(
        &self,
        org_id: &str,
        limit: i64,
    ) -> StoreResult<Vec<(Secs, String, String)>> {
        on_backend!(self, read, list_stripe_changes(org_id, limit))
    }

    pub async fn link_stripe_customer(
        &self,
        org_id: &str,
        customer_id: &str,
        now: Secs,
    ) -> StoreResult<bool> {
        on_backend!(self, write, link_stripe_customer(org_id, customer_id, now))
    }

    pub async fn begin_stripe_request(
        &self,
        r: &StripeRequestRow,
    ) -> StoreResult<StripeRequestRow> {
        on_backend!(self, write, begin_stripe_request(r))
    }

    pub async fn open_stripe_request(
        &self,
        org_id: &str,
        operation: &str,
        target: &str,
    ) -> StoreResult<Option<StripeRequestRow>> {
        on_backend!(self, write, open_stripe_request(org_id, operation, target))
    }

    pub async fn complete_stripe_request(
        &self,
        org_id: &str,
        idempotency_key: &str,
        object_id: &str,
        now: Secs,
    ) -> StoreResult<()> {
        on_backend!(
            self,
            write,
            complete_stripe_request(org_id, idempotency_key, object_id, now)
        )
    }

    /// Record (`Some((plan, at))`) or clear a downgrade to make at `at`.
    pub async fn schedule_plan(
        &self,
        org_id: &str,
        plan: Option<(&str, Secs)>,
        now: Secs,
    ) -> StoreResult<()> {
        on_backend!(self, write, schedule_plan(org_id, plan, now))
    }

    pub async fn due_downgrades(&self, now: Secs, limit: i64) -> StoreResult<Vec<OrgRow>> {
        on_backend!(self, read, due_downgrades(now, limit))
    }

    pub async fn list_orgs(&self) -> StoreResult<Vec<OrgRow>> {
        on_backend!(self, read, list_orgs())
    }

    /// An org's booked time in the whole hours `[from, to)`, summed under `by`'s key.
    pub async fn session_hour_pieces(
        &self,
        org_id: &str,
        from: Secs,
        to: Secs,
        by: crate::breakdown::GroupBy,
    ) -> StoreResult<Vec<crate::breakdown::Piece>> {
        on_backend!(self, read, session_hour_pieces(org_id, from, to, by))
    }

    pub async fn running_sessions(&self, org_id: &str) -> StoreResult<Vec<SessionRow>> {
        on_backend!(self, read, running_sessions(org_id))
    }

    pub async fn session_spans(
        &self,
        org_id: &str,
        session_id: &str,
    ) -> StoreResult<Vec<(Secs, Secs, String)>> {
        on_backend!(self, read, session_spans(org_id, session_id))
    }

    #[allow(clippy::too_many_arguments)]
    pub async fn list_sessions(
        &self,
        org_id: &str,
        phase: Option<&str>,
        from: Secs,
        to: Secs,
        after: Option<(Secs, String)>,
        limit: i64,
    ) -> StoreResult<Vec<SessionRow>> {
        on_backend!(
            self,
            read,
            list_sessions(org_id, phase, from, to, after, limit)
        )
    }

    /// Decisions of an org with `reason` since `since`.
    pub async fn count_decisions(
        &self,
        org_id: &str,
        reason: &str,
        since: Secs,
    ) -> StoreResult<i64> {
        on_backend!(self, read, count_decisions(org_id, reason, since))
    }

    // ----- periods and the finance export -----

    /// Send a period's session lines down `tx` in `(org_id, session_id)` order.
    pub async fn send_session_lines(
        &self,
        q: &LineQuery,
        tx: &tokio::sync::mpsc::Sender<Vec<crate::export::lines::SessionLine>>,
    ) -> StoreResult<()> {
        on_backend!(self, read, send_session_lines(q, tx))
    }

    pub async fn count_session_lines(&self, q: &LineQuery) -> StoreResult<i64> {
        on_backend!(self, read, count_session_lines(q))
    }

    pub async fn live_org_sums(&self, q: &LineQuery) -> StoreResult<Vec<(String, i64, i64)>> {
        on_backend!(self, read, live_org_sums(q))
    }

    pub async fn orgs_before(&self, end: Secs) -> StoreResult<Vec<OrgRow>> {
        on_backend!(self, read, orgs_before(end))
    }

    pub async fn frozen_orgs(&self, period_start: Secs) -> StoreResult<Vec<FrozenOrgRow>> {
        on_backend!(self, read, frozen_orgs(period_start))
    }

    pub async fn get_period(&self, period_start: Secs) -> StoreResult<Option<PeriodRow>> {
        on_backend!(self, read, get_period(period_start))
    }

    pub async fn list_periods(&self) -> StoreResult<Vec<PeriodRow>> {
        on_backend!(self, read, list_periods())
    }

    pub async fn first_org_created(&self) -> StoreResult<Option<Secs>> {
        on_backend!(self, read, first_org_created())
    }

    pub async fn close_period(
        &self,
        q: &LineQuery,
        now: Secs,
        terms: &(dyn Fn(&OrgRow) -> crate::export::lines::Terms + Sync),
    ) -> StoreResult<Option<PeriodRow>> {
        on_backend!(self, write, close_period(q, now, terms))
    }

    // ----- usage-threshold notifications -----

    #[allow(clippy::too_many_arguments)]
    pub async fn insert_notification(
        &self,
        org_id: &str,
        window_kind: &str,
        window_start: Secs,
        threshold: i64,
        notification_id: &str,
        body: &str,
        now: Secs,
    ) -> StoreResult<bool> {
        on_backend!(
            self,
            write,
            insert_notification(
                org_id,
                window_kind,
                window_start,
                threshold,
                notification_id,
                body,
                now
            )
        )
    }

    pub async fn claim_notifications(
        &self,
        now: Secs,
        hold: Secs,
        limit: i64,
    ) -> StoreResult<Vec<NotificationRow>> {
        on_backend!(self, write, claim_notifications(now, hold, limit))
    }

    pub async fn finish_notification(
        &self,
        notification_id: &str,
        attempts: i64,
        state: &str,
        error: Option<&str>,
        next_at: Secs,
        now: Secs,
    ) -> StoreResult<()> {
        on_backend!(
            self,
            write,
            finish_notification(notification_id, attempts, state, error, next_at, now)
        )
    }

    pub async fn list_notifications(
        &self,
        org_id: Option<&str>,
        state: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<NotificationRow>> {
        on_backend!(self, read, list_notifications(org_id, state, limit))
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::StoreError;

    /// A database's refusal with a SQLSTATE, as a server would send it.
    #[derive(Debug)]
    struct Refusal(&'static str);

    impl std::fmt::Display for Refusal {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "SQLSTATE {}", self.0)
        }
    }

    impl std::error::Error for Refusal {}

    impl sqlx::error::DatabaseError for Refusal {
        fn message(&self) -> &str {
            "refused"
        }
        fn code(&self) -> Option<Cow<'_, str>> {
            Some(Cow::Borrowed(self.0))
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    fn from_code(code: &'static str) -> StoreError {
        sqlx::Error::Database(Box::new(Refusal(code))).into()
    }

    /// What counts as an outage (503, and the breaker's reason to open): the connection
    /// lost, the server shutting down or starting up, SQLite busy. A server that refuses
    /// for its own reasons (too many clients, a bad password) is up.
    #[test]
    fn only_a_lost_or_stopping_database_is_unavailable() {
        for code in ["08006", "08001", "57P01", "57P03", "5", "6"] {
            assert!(
                matches!(from_code(code), StoreError::Unavailable(_)),
                "{code}"
            );
        }
        for code in ["53300", "28P01", "42P01", "40001"] {
            assert!(matches!(from_code(code), StoreError::Other(_)), "{code}");
        }
        assert!(matches!(
            StoreError::from(sqlx::Error::PoolTimedOut),
            StoreError::Unavailable(_)
        ));
    }
}
