//! The store's one error type, sorted by what the caller should do about it.

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
                // Connection-level failures, admin shutdown, and SQLite's busy/locked.
                _ if d.code().is_some_and(|c| {
                    c.starts_with("08") || c.starts_with("57P") || c == "5" || c == "6"
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
