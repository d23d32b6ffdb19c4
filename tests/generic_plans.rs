//! The group commits' reads as a generic plan makes them (`begin_hot` in src/store/pg/), on
//! tables that hold what piles up with history: a key's parked sessions (a session parks
//! between turns for days) and an org's closed spans. Each must read an index range; a scan
//! of the table makes every admission cost more as history grows. PostgreSQL only: SQLite
//! keeps no generic plans.

mod common;

use common::{fresh_database, Backend};
use rush_meter::store::{pg_hot_reads as hot, Db, PoolSettings, Pools};

/// A migrated database of its own on the test PostgreSQL (`common::fresh_database`); none
/// outside CI when there is no PostgreSQL, a failure on CI. None either on tables
/// partitioned by org (`RUSH_METER_TEST_PG_PARTITIONS`): there the store plans each read
/// anew, for the values, and keeps no generic plan.
async fn database() -> Option<Db> {
    if common::shards::partitions().is_some() {
        eprintln!("NOTE: generic plans are one PostgreSQL's; this test did not run on partitions");
        return None;
    }
    let (url, _) = fresh_database(Backend::Postgres).await?;
    let db = Db::connect(&url, PoolSettings::default())
        .await
        .expect("connect");
    db.migrate().await.expect("migrate");
    Some(db)
}

/// The PostgreSQL pool under `db`.
fn pool(db: &Db) -> &sqlx::PgPool {
    match db.pools() {
        Pools::Postgres(pool) => pool,
        Pools::Sqlite { .. } => unreachable!("a PostgreSQL database"),
    }
}

/// `EXPLAIN ANALYZE` of `sql`'s generic plan, its parameters of `types`, run with `args`.
async fn generic_plan(db: &Db, types: &str, sql: &str, args: &str) -> String {
    let mut conn = pool(db).acquire().await.expect("connection");
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

/// The slot count's parameter types and its arguments for key `key` of org `org`, the
/// lease starting at `since`.
const SLOT_COUNT_TYPES: &str = "bigint, text[], text[], text[], text, text, text, text";
fn slot_count_args(since: i64, org: &str, key: &str) -> String {
    let phases = hot::open_phases().map(|p| format!("'{p}'")).join(", ");
    format!("{since}, '{{{org}}}', '{{{key}}}', '{{{org}}}', {phases}")
}

#[tokio::test]
async fn the_slot_count_and_window_sums_read_index_ranges_of_a_long_history() {
    let Some(db) = database().await else { return };
    // One key's 5,000 parked sessions, each with a closed running span; a few running.
    seed(
        &db,
        &[
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
        ],
    )
    .await;
    let slots = generic_plan(
        &db,
        SLOT_COUNT_TYPES,
        &hot::slot_counts(),
        &slot_count_args(49000, "o", "k"),
    )
    .await;
    assert!(
        !slots.contains("Seq Scan"),
        "the slot count scans:\n{slots}"
    );
    let types = format!("{}, text", vec!["bigint"; 21].join(", "));
    let args = format!("{}, 'o'", vec!["0"; 21].join(", "));
    let edge = [[(3_600, 3_700), hot::NO_EDGE], [hot::NO_EDGE, hot::NO_EDGE]];
    let sums = generic_plan(&db, &types, &hot::window_sums(1, &edge), &args).await;
    for table in ["sessions", "spans"] {
        let scan = format!("Seq Scan on {table}");
        assert!(
            !sums.contains(&scan),
            "the window sums scan {table}:\n{sums}"
        );
    }
    assert!(sums.contains("spans_org_running_end"), "{sums}");
    // Windows on the hour (every calendar month and ISO week) read no span at all.
    let on_the_hour = [[hot::NO_EDGE; 2]; 2];
    let sums = generic_plan(&db, &types, &hot::window_sums(1, &on_the_hour), &args).await;
    assert!(!sums.contains("spans"), "{sums}");
    db.close().await;
}

/// The measured org `o` and 20,000 others.
const ORG_AMONG_20000: &str = "INSERT INTO orgs (org_id, name, plan_id, created_at, updated_at) \
     SELECT o, o, 'team', 0, 0 FROM (SELECT 'o' AS o UNION ALL \
       SELECT 'g' || i FROM generate_series(1, 20000) AS i) AS x";

/// Run each of `statements` on `db`'s pool.
async fn seed(db: &Db, statements: &[&str]) {
    for sql in statements {
        sqlx::query(sql).execute(pool(db)).await.expect(sql);
    }
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
    let Some(db) = database().await else { return };
    seed(
        &db,
        &[
            ORG_AMONG_20000,
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
        ],
    )
    .await;
    let sums_types = format!("{}, text", vec!["bigint"; 21].join(", "));
    let sums_args = format!("{}, 'o'", vec!["0"; 21].join(", "));
    let on_the_hour = [[hot::NO_EDGE; 2]; 2];
    let reads = [
        (
            "the slot count",
            SLOT_COUNT_TYPES.to_owned(),
            hot::slot_counts(),
            slot_count_args(49000, "o", "k0"),
            "Seq Scan",
        ),
        (
            "the org's funding and parked sessions",
            "text[], bigint".into(),
            hot::funding_counting_parked(),
            "'{o}', 0".into(),
            // Its other tables (grants, funding windows, periods) are empty here.
            "Seq Scan on sessions",
        ),
        (
            "the running sessions",
            "text".into(),
            hot::RUNNING_SESSIONS.into(),
            "'o'".into(),
            "Seq Scan",
        ),
        (
            "the window sums",
            sums_types,
            hot::window_sums(1, &on_the_hour),
            sums_args,
            "Seq Scan",
        ),
    ];
    for (what, types, sql, args, scan) in reads {
        let plan = generic_plan(&db, &types, &sql, &args).await;
        assert!(!plan.contains(scan), "{what} scans:\n{plan}");
        assert!(
            most_filtered(&plan) <= 100,
            "{what} reads the large org's sessions to throw them away:\n{plan}"
        );
    }
    db.close().await;
}

/// A key used for months: hundreds of ended sessions and a few open ones, in an org of ten
/// keys among many small orgs. The slot count's reads (one an open phase) must each read
/// about what they count: not the key's history (reports/growth.md: a generic plan once
/// counted running sessions through the slot index and slots through the phase index, each
/// reading every session the key ever ran; migration 0012), nor the org's other keys', nor
/// the fleet's open sessions.
#[tokio::test]
async fn the_slot_count_reads_a_keys_open_sessions_not_its_history() {
    // The other orgs' sessions: half of them running, or (the growth benchmark's fleet,
    // where the crosswise plan was seen) all ended but 1%, so that the statistics know
    // `running` as a rare phase and `admitted` not at all.
    let fleets = [
        "CASE WHEN i % 2 = 0 THEN 'running' ELSE 'parked' END",
        "CASE WHEN i % 100 = 0 THEN 'running' ELSE 'ended' END",
    ];
    // The org's last 100 sessions are open, 10 on each of its 10 keys; 4,900 ended before.
    let keys = [
        "CASE WHEN i <= 4900 THEN 'ended' WHEN i % 3 = 0 THEN 'running' ELSE 'parked' END",
        "CASE WHEN i <= 4900 THEN 'ended' WHEN i % 3 = 0 THEN 'admitted' ELSE 'parked' END",
    ];
    for (fleet, key) in fleets.into_iter().zip(keys) {
        let Some(db) = database().await else { return };
        let sessions = format!(
            "INSERT INTO sessions (org_id, session_id, key_id, phase, last_at, span_start, \
               created_at, slot_at) \
             SELECT 'o', 's' || i, 'k' || (i % 10), {key}, i * 10 + 5, i * 10, i * 10, i * 10 \
               FROM generate_series(1, 5000) AS i \
             UNION ALL SELECT 'g' || i, 'b' || i, 'k1', {fleet}, i * 10 + 5, i * 10, i * 10, \
               i * 10 FROM generate_series(1, 20000) AS i"
        );
        seed(
            &db,
            &[ORG_AMONG_20000, &sessions, "VACUUM ANALYZE sessions"],
        )
        .await;
        let plan = generic_plan(
            &db,
            SLOT_COUNT_TYPES,
            &hot::slot_counts(),
            &slot_count_args(49900, "o", "k0"),
        )
        .await;
        assert!(
            most_filtered(&plan) <= 20,
            "the slot count reads sessions it does not count to throw them away \
             ({fleet}; {key}):\n{plan}"
        );
        db.close().await;
    }
}

/// A heartbeat group's lock of its sessions (about 300 over 50 orgs in the ingest
/// benchmark): found by id through the primary key, led by `session_id` (migration
/// 0011), each row checked against a hash of the group's orgs. `org_id = ANY($1)` in a generic plan compares every row with each org
/// of the array in turn (reports/distributable.md: 0.27 ms more a lock of that size).
#[tokio::test]
async fn the_session_lock_finds_sessions_by_their_key_and_hashes_the_orgs() {
    let Some(db) = database().await else { return };
    seed(
        &db,
        &[
            "INSERT INTO orgs (org_id, name, plan_id, created_at, updated_at) \
             SELECT 'o' || i, 'o', 'team', 0, 0 FROM generate_series(0, 49) AS i",
            "INSERT INTO sessions (org_id, session_id, key_id, phase, last_at, span_start, \
               created_at) \
             SELECT 'o' || (i % 50), 's' || i, 'k', 'running', 5, 0, 0 \
             FROM generate_series(1, 10000) AS i",
            "ANALYZE sessions",
        ],
    )
    .await;
    let orgs = (0..50)
        .map(|i| format!("o{i}"))
        .collect::<Vec<_>>()
        .join(",");
    let ids = (1..=300)
        .map(|i| format!("s{i}"))
        .collect::<Vec<_>>()
        .join(",");
    let plan = generic_plan(
        &db,
        "text[], text[]",
        hot::SESSION_LOCK,
        &format!("'{{{orgs}}}', '{{{ids}}}'"),
    )
    .await;
    assert!(plan.contains("using sessions_pkey"), "{plan}");
    assert!(plan.contains("Index Cond: (session_id = ANY"), "{plan}");
    assert!(plan.contains("Hash Semi Join"), "{plan}");
    assert!(plan.contains("rows=300 loops=1"), "{plan}");
    assert_eq!(most_filtered(&plan), 0, "{plan}");
    db.close().await;
}

/// The gate's key lock on one PostgreSQL (`lock_keys_by_key_sql`) reads the keys asked
/// through the primary key, however many keys their orgs hold: a join of the keys' arrays
/// with `api_keys` was planned as a scan of every key of the orgs (1,000 here).
#[tokio::test]
async fn the_key_lock_finds_keys_by_their_key_whatever_the_orgs_hold() {
    let Some(db) = database().await else { return };
    seed(
        &db,
        &[
            "INSERT INTO orgs (org_id, name, plan_id, created_at, updated_at) \
             SELECT 'o' || i, 'o', 'team', 0, 0 FROM generate_series(0, 49) AS i",
            "INSERT INTO api_keys (org_id, key_id, created_at, updated_at) \
             SELECT 'o' || (i % 50), 'k' || i, 0, 0 FROM generate_series(1, 1000) AS i",
            "ANALYZE api_keys",
        ],
    )
    .await;
    let plan = generic_plan(
        &db,
        "text[], text[], text[]",
        &hot::key_lock(),
        // Asked out of byte order: the statement sorts them before it locks.
        "'{o1,o2}', '{o2,o1}', '{k2,k1}'",
    )
    .await;
    assert!(plan.contains("using api_keys_pkey"), "{plan}");
    // A nested loop over the sorted keys: each is locked in byte order.
    assert!(plan.starts_with("Nested Loop"), "{plan}");
    let sort = plan.find("Sort Key").expect("the keys sorted");
    let lock = plan.find("LockRows").expect("the keys locked");
    assert!(sort < lock, "{plan}");
    let mut tx = pool(&db).begin().await.unwrap();
    let locked: Vec<(String, String)> = sqlx::query_as(&format!(
        "SELECT org_id, key_id FROM ({}) AS l",
        hot::key_lock()
    ))
    .bind(vec!["o1", "o2"])
    .bind(vec!["o2", "o1"])
    .bind(vec!["k2", "k1"])
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    let byte_order = [("o1", "k1"), ("o2", "k2")].map(|(o, k)| (o.to_owned(), k.to_owned()));
    assert_eq!(locked, byte_order);
    tx.rollback().await.unwrap();
    assert!(!plan.contains("Seq Scan"), "{plan}");
    assert_eq!(most_filtered(&plan), 0, "{plan}");
    assert!(plan.contains("LockRows"), "{plan}");
    db.close().await;
}
