//! PostgreSQL with the org tables hash-partitioned by org_id: the stand-in, here, for a
//! store distributed by Citus (which these machines cannot run). Native partitioning keeps
//! the rule Citus keeps (every primary key and unique index holds the partition column),
//! and the store treats each partition as a shard: every lock, upsert and claim names the
//! orgs of one partition. `RUSH_METER_TEST_PG_PARTITIONS=N` runs every PostgreSQL test on
//! such a database; `.ci/run` does it once for the suite's PostgreSQL tests.

/// The tables keyed by org: distributed by org_id on Citus, partitioned here.
pub const ORG_TABLES: [&str; 21] = [
    "orgs",
    "api_keys",
    "sessions",
    "spans",
    "org_hourly",
    "session_hourly",
    "decisions",
    "stripe_requests",
    "stripe_changes",
    "period_orgs",
    "period_sessions",
    "notifications",
    "grants",
    "funding_windows",
    "funding_hourly",
    "overage_charges",
    "member_hourly",
    "member_limits",
    "audit_log",
    "room_waits",
    "auto_topups",
];

/// Tables shared by every org (reference tables on Citus) or keyed by an id of their own.
pub const SHARED_TABLES: [&str; 5] = [
    "tokens",
    "stripe_events",
    "periods",
    "plan_versions",
    "stripe_customers",
];

/// Partitions each PostgreSQL test database gets, from `RUSH_METER_TEST_PG_PARTITIONS`.
pub fn partitions() -> Option<u32> {
    std::env::var("RUSH_METER_TEST_PG_PARTITIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
}

/// Migrate the empty database at `url` and rebuild every org table hash-partitioned by
/// org_id into `n` partitions, with its keys, indexes and foreign keys.
pub async fn partition(url: &str, n: u32) {
    let db = rush_meter::store::Db::connect(url, Default::default())
        .await
        .expect("connect to partition");
    rush_meter::store::Admin::migrate(&*db)
        .await
        .expect("migrate");
    rush_meter::store::Admin::close(&*db).await;
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    let tables: Vec<String> = ORG_TABLES.iter().map(|t| format!("'{t}'")).collect();
    let foreign: Vec<(String, String, String)> = sqlx::query_as(&format!(
        "SELECT conname, conrelid::regclass::text, pg_get_constraintdef(oid) FROM pg_constraint \
         WHERE contype = 'f' AND conrelid::regclass::text IN ({})",
        tables.join(", ")
    ))
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut tx = pool.begin().await.unwrap();
    for t in ORG_TABLES {
        for sql in [
            format!("ALTER TABLE {t} RENAME TO {t}_plain"),
            format!(
                "CREATE TABLE {t} (LIKE {t}_plain INCLUDING DEFAULTS INCLUDING CONSTRAINTS \
                 INCLUDING INDEXES) PARTITION BY HASH (org_id)"
            ),
        ] {
            sqlx::query(&sql)
                .execute(&mut *tx)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        for r in 0..n {
            sqlx::query(&format!(
                "CREATE TABLE {t}_p{r} PARTITION OF {t} FOR VALUES WITH (MODULUS {n}, REMAINDER {r})"
            ))
            .execute(&mut *tx)
            .await
            .unwrap();
        }
    }
    for t in ORG_TABLES {
        sqlx::query(&format!("DROP TABLE {t}_plain CASCADE"))
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    for (name, table, def) in foreign {
        sqlx::query(&format!("ALTER TABLE {table} ADD CONSTRAINT {name} {def}"))
            .execute(&mut *tx)
            .await
            .unwrap_or_else(|e| panic!("{table}.{name} ({def}): {e}"));
    }
    tx.commit().await.unwrap();
    pool.close().await;
}
