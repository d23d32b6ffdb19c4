//! The backends, SQLite and PostgreSQL, and a fresh, empty database on each.

use super::shards;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub const ALL: [Backend; 2] = [Backend::Sqlite, Backend::Postgres];
}

/// The PostgreSQL server tests use; each test gets its own database on it.
pub fn pg_base_url() -> String {
    std::env::var("RUSH_METER_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

/// A fresh, empty database URL for `backend`, or `None` (with a note) when PostgreSQL is
/// not reachable outside CI. On CI (`CI=true`) an unreachable PostgreSQL fails the test.
/// Its commits skip the fsync wait (tests do not crash PostgreSQL).
pub async fn fresh_database(backend: Backend) -> Option<(String, Option<tempfile::TempDir>)> {
    fresh_database_with(backend, false).await
}

/// A fresh database whose commits are `durable` (fsynced, as in production: what the
/// benchmarks measure) or not.
pub async fn fresh_database_with(
    backend: Backend,
    durable: bool,
) -> Option<(String, Option<tempfile::TempDir>)> {
    match backend {
        Backend::Sqlite => {
            let dir = tempfile::tempdir().expect("temp dir");
            let url = format!("sqlite://{}", dir.path().join("meter.db").display());
            Some((url, Some(dir)))
        }
        Backend::Postgres => match super::citus::coordinator() {
            Some(coordinator) => {
                let name = format!("rm_test_{:016x}", rand::random::<u64>());
                let url = super::citus::test_database(&coordinator, &name, durable).await;
                Some((url, None))
            }
            None => Some((postgres_database(durable).await?, None)),
        },
    }
}

/// A fresh database on the one PostgreSQL of `RUSH_METER_TEST_PG` (hash-partitioned when
/// `RUSH_METER_TEST_PG_PARTITIONS` says so), whatever `RUSH_METER_TEST_CITUS` says; `None`
/// when PostgreSQL is not here (a failure on CI).
pub async fn postgres_database(durable: bool) -> Option<String> {
    let name = format!("rm_test_{:016x}", rand::random::<u64>());
    let base = pg_base_url();
    let admin = match sqlx::PgPool::connect(&format!("{base}/postgres")).await {
        Ok(p) => p,
        Err(e) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("PostgreSQL at {base} is required on CI: {e}")
        }
        Err(e) => {
            eprintln!(
                "NOTE: PostgreSQL at {base} unreachable ({e}); this test did not run on PostgreSQL"
            );
            return None;
        }
    };
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&admin)
        .await
        .expect("create test database");
    if !durable {
        sqlx::query(&format!(
            "ALTER DATABASE {name} SET synchronous_commit = off"
        ))
        .execute(&admin)
        .await
        .expect("configure test database");
    }
    admin.close().await;
    let url = format!("{base}/{name}");
    if let Some(n) = shards::partitions() {
        shards::partition(&url, n).await;
    }
    Some(url)
}
