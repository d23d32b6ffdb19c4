//! The store's one error type, sorted by what the caller should do about it; and when a
//! connection was last found read-only.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// When a database was last found to accept no writes, as nanoseconds since `EPOCH` (0:
/// never): a primary that came back as a standby, or a promoted one not yet writable.
static READ_ONLY_AT: AtomicU64 = AtomicU64::new(0);
static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Record that a connection found the database read-only: every connection opened before
/// now is closed instead of reused (`connection_outlived_read_only`), so the pools
/// reconnect, to the host that accepts writes once there is one.
pub fn note_read_only() {
    let epoch = *EPOCH.get_or_init(Instant::now);
    let at = u64::try_from(epoch.elapsed().as_nanos())
        .unwrap_or(u64::MAX)
        .max(1);
    READ_ONLY_AT.fetch_max(at, Ordering::AcqRel);
}

/// Whether a connection of this `age` was opened before a database was last found
/// read-only (its server may be a standby now).
pub fn connection_outlived_read_only(age: Duration) -> bool {
    let at = READ_ONLY_AT.load(Ordering::Acquire);
    let Some(epoch) = EPOCH.get() else {
        return false;
    };
    at != 0 && epoch.elapsed().saturating_sub(age) < Duration::from_nanos(at)
}

/// SQLite's primary result code of `code` (sqlx reports the extended one, such as 517 for
/// SQLITE_BUSY_SNAPSHOT, whose low byte is the primary); `None` for PostgreSQL's SQLSTATEs,
/// which are five characters.
fn sqlite_primary(code: &str) -> Option<i64> {
    (code.len() < 5)
        .then(|| code.parse::<i64>().ok())
        .flatten()
        .map(|c| c & 0xff)
}

/// SQLSTATE 25006 (PostgreSQL) and SQLITE_READONLY (8, and its extended codes): the
/// database took no write.
fn is_read_only(code: &str) -> bool {
    code == "25006" || sqlite_primary(code) == Some(8)
}

/// A failure of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached or did not answer in time: retry later (503).
    #[error("database unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    /// A uniqueness or reference rule refused the write, or the rows kept changing under
    /// it: re-read and retry (409).
    #[error("conflict: {0}")]
    Conflict(String),
    /// A check or not-null rule refused a value: the value is out of range (422).
    #[error("invalid value: {0}")]
    Invalid(String),
    #[error("database error: {0}")]
    Other(#[source] sqlx::Error),
}

impl StoreError {
    /// The database could not be reached or did not answer in time (a 503).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }

    /// Worth running the same transaction again: serialization failures and deadlocks.
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Other(sqlx::Error::Database(d)) => {
                matches!(d.code().as_deref(), Some("40001" | "40P01"))
            }
            _ => false,
        }
    }

    /// A failure that one request of a group may have caused alone: worth trying that
    /// group's requests one by one, so one request's fault does not fail its neighbours.
    pub fn may_be_one_requests(&self) -> bool {
        matches!(
            self,
            StoreError::Other(_) | StoreError::Conflict(_) | StoreError::Invalid(_)
        )
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        use sqlx::error::ErrorKind;
        match &e {
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => StoreError::Unavailable(e),
            sqlx::Error::Database(d) => match d.kind() {
                ErrorKind::UniqueViolation | ErrorKind::ForeignKeyViolation => {
                    StoreError::Conflict(d.message().to_owned())
                }
                ErrorKind::CheckViolation | ErrorKind::NotNullViolation => {
                    StoreError::Invalid(d.message().to_owned())
                }
                // A database that accepts no writes is as good as unreachable for a
                // writer: a 503 the caller retries, and its connections are replaced.
                _ if d.code().is_some_and(|c| is_read_only(&c)) => {
                    note_read_only();
                    StoreError::Unavailable(e)
                }
                // Connection-level failures, admin shutdown, and SQLite's busy/locked (with
                // their extended codes).
                _ if d.code().is_some_and(|c| {
                    c.starts_with("08")
                        || c.starts_with("57P")
                        || matches!(sqlite_primary(&c), Some(5 | 6))
                }) =>
                {
                    StoreError::Unavailable(e)
                }
                _ => StoreError::Other(e),
            },
            _ => StoreError::Other(e),
        }
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use std::time::Duration;

    use super::StoreError;
    use sqlx::error::ErrorKind;

    /// A database's refusal with a SQLSTATE, as a server would send it.
    #[derive(Debug)]
    struct Refusal(&'static str, ErrorKind);

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
        fn kind(&self) -> ErrorKind {
            match self.1 {
                ErrorKind::UniqueViolation => ErrorKind::UniqueViolation,
                ErrorKind::ForeignKeyViolation => ErrorKind::ForeignKeyViolation,
                ErrorKind::NotNullViolation => ErrorKind::NotNullViolation,
                ErrorKind::CheckViolation => ErrorKind::CheckViolation,
                _ => ErrorKind::Other,
            }
        }
    }

    fn from_code(code: &'static str) -> StoreError {
        sqlx::Error::Database(Box::new(Refusal(code, ErrorKind::Other))).into()
    }

    /// What counts as an outage (503, and the breaker's reason to open): the connection
    /// lost, the server shutting down or starting up, SQLite busy. A server that refuses
    /// for its own reasons (too many clients, a bad password) is up.
    #[test]
    fn only_a_lost_or_stopping_database_is_unavailable() {
        for code in ["08006", "08001", "57P01", "57P03", "5", "6", "517", "262"] {
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

    /// A write refused because the database is read-only (a primary come back as a
    /// standby) is an outage, never a 500, and the connections opened before it are
    /// replaced rather than reused.
    #[test]
    fn a_read_only_database_is_unavailable_and_its_connections_are_replaced() {
        let long_ago = Duration::from_secs(3600);
        for code in ["25006", "8", "776", "1032"] {
            assert!(
                matches!(from_code(code), StoreError::Unavailable(_)),
                "{code}"
            );
            assert!(super::connection_outlived_read_only(long_ago));
        }
        // A connection opened after it is kept.
        assert!(!super::connection_outlived_read_only(Duration::ZERO));
    }

    /// Constraint violations are the caller's to fix (409, 422), never a 500.
    #[test]
    fn constraint_violations_are_conflicts_or_invalid_values() {
        let of =
            |code, kind| StoreError::from(sqlx::Error::Database(Box::new(Refusal(code, kind))));
        assert!(matches!(
            of("23505", ErrorKind::UniqueViolation),
            StoreError::Conflict(_)
        ));
        assert!(matches!(
            of("23503", ErrorKind::ForeignKeyViolation),
            StoreError::Conflict(_)
        ));
        assert!(matches!(
            of("23514", ErrorKind::CheckViolation),
            StoreError::Invalid(_)
        ));
        assert!(matches!(
            of("23502", ErrorKind::NotNullViolation),
            StoreError::Invalid(_)
        ));
    }
}
