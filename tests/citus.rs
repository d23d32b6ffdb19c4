//! Checks that the store runs on Citus, sharded by org_id: the catalog keeps Citus's
//! rules, the SQL an operator runs to distribute names every table, and every statement
//! that locks, upserts or claims org rows names the orgs of one shard (a partition of a
//! database hash-partitioned by org_id). On a real cluster (the ignored tests, which
//! `.ci/run` runs with `RUSH_METER_TEST_CITUS`): the tables are placed as the runbook
//! says, and the hot transactions of one org run on its shard alone. The PostgreSQL
//! suite also runs once on a partitioned database and once on the cluster (`.ci/run`).

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use common::audit::violation;
use common::shards::{ORG_TABLES, SHARED_TABLES};
use common::{fresh_database, hb, Backend, Options, TestServer, ADMIN, T0};
use serde_json::json;

const PARTITIONS: i32 = 4;

fn on_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// A fresh PostgreSQL database with the org tables hash-partitioned by org_id.
async fn partitioned_database() -> Option<String> {
    let (url, _) = fresh_database(Backend::Postgres).await?;
    if common::shards::partitions().is_none() {
        common::shards::partition(&url, PARTITIONS as u32).await;
    }
    Some(url)
}

/// Citus's table functions as far as the script needs them, keeping Citus's refusals.
const CITUS_STAND_INS: &str = r#"
CREATE TABLE pg_dist_partition (
  logicalrelid regclass PRIMARY KEY, partmethod text NOT NULL, column_name text, colocation text);
CREATE FUNCTION create_distributed_table(t regclass, col text, colocate_with text DEFAULT 'default')
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = t AND attname = col) THEN
    RAISE EXCEPTION '% has no column %', t, col;
  END IF;
  IF colocate_with NOT IN ('default', 'none') AND NOT EXISTS
      (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = colocate_with::regclass) THEN
    RAISE EXCEPTION '% co-located with %, which is not distributed yet', t, colocate_with;
  END IF;
  PERFORM refuse_undistributed_references(t);
  INSERT INTO pg_dist_partition VALUES (t, 'h', col, colocate_with);
END $$;
CREATE FUNCTION create_reference_table(t regclass) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  PERFORM refuse_undistributed_references(t);
  INSERT INTO pg_dist_partition VALUES (t, 'n', NULL, NULL);
END $$;
CREATE FUNCTION refuse_undistributed_references(t regclass) RETURNS void LANGUAGE plpgsql AS $$
DECLARE parent regclass;
BEGIN
  SELECT confrelid INTO parent FROM pg_constraint
   WHERE conrelid = t AND contype = 'f' AND conparentid = 0 AND confrelid <> t
     AND confrelid NOT IN (SELECT logicalrelid FROM pg_dist_partition) LIMIT 1;
  IF parent IS NOT NULL THEN
    RAISE EXCEPTION '% refers to %, which is not distributed yet', t, parent;
  END IF;
END $$;
"#;

#[tokio::test]
async fn the_catalog_keeps_the_rules_citus_distributes_by() {
    let Some((url, _)) = fresh_database(Backend::Postgres).await else {
        return;
    };
    let db = rush_meter::store::Db::connect(&url, Default::default())
        .await
        .unwrap();
    rush_meter::store::Admin::migrate(&*db).await.unwrap();
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let with_org_id: BTreeSet<String> = sqlx::query_scalar(
        "SELECT DISTINCT c.relname::text FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid \
         JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE a.attname = 'org_id' AND c.relkind IN ('r', 'p') AND n.nspname = 'public' \
           AND NOT a.attisdropped AND NOT c.relispartition",
    )
    .fetch_all(&pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    let org_tables: BTreeSet<String> = ORG_TABLES.iter().map(|t| t.to_string()).collect();
    let shared_with_org: BTreeSet<String> = with_org_id.difference(&org_tables).cloned().collect();
    assert!(
        shared_with_org
            .iter()
            .all(|t| SHARED_TABLES.contains(&t.as_str())),
        "tables with org_id that are neither distributed by it nor shared: {shared_with_org:?}; \
         name them in tests/common/shards.rs and migrations/citus/"
    );
    // Every primary key and unique index of an org table holds org_id.
    let unique: Vec<(String, String, Vec<String>)> = sqlx::query_as(
        "SELECT t.relname::text, i.relname::text, \
           ARRAY(SELECT a.attname::text FROM unnest(x.indkey) k \
                 JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k) \
         FROM pg_index x JOIN pg_class t ON t.oid = x.indrelid JOIN pg_class i ON i.oid = x.indexrelid \
         WHERE x.indisunique",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    for (table, index, columns) in &unique {
        if org_tables.contains(table) {
            assert!(
                columns.iter().any(|c| c == "org_id"),
                "{table}: unique index {index} on {columns:?} lacks org_id"
            );
        }
    }
    assert!(unique.iter().any(|(t, ..)| t == "sessions"));
    // One collation for org_id everywhere.
    let collations: BTreeSet<String> = sqlx::query_scalar(
        "SELECT DISTINCT COALESCE(co.collname::text, 'default') FROM pg_attribute a \
         JOIN pg_class c ON c.oid = a.attrelid LEFT JOIN pg_collation co ON co.oid = a.attcollation \
         JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE a.attname = 'org_id' AND c.relkind IN ('r', 'p') AND n.nspname = 'public'",
    )
    .fetch_all(&pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    assert_eq!(
        collations.len(),
        1,
        "org_id collations differ: {collations:?}"
    );
    // Foreign keys only between org tables, on org_id: what Citus allows between co-located
    // distributed tables. None from a shared table into org data.
    let foreign: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT conrelid::regclass::text, confrelid::regclass::text, pg_get_constraintdef(oid) \
         FROM pg_constraint WHERE contype = 'f' AND conparentid = 0",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    for (from, to, def) in &foreign {
        assert!(
            org_tables.contains(from) && org_tables.contains(to) && def.contains("(org_id"),
            "foreign key {from} -> {to} ({def}) is one Citus refuses"
        );
    }
    // Every table is either an org's or a shared one: a new table is born with its place.
    let tables: BTreeSet<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.relkind IN ('r', 'p') AND n.nspname = 'public' AND NOT c.relispartition \
           AND c.relname <> '_sqlx_migrations'",
    )
    .fetch_all(&pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    let shared: BTreeSet<String> = SHARED_TABLES.iter().map(|t| t.to_string()).collect();
    assert_eq!(
        tables,
        org_tables.union(&shared).cloned().collect(),
        "every table named in tests/common/shards.rs and migrations/citus/distribute.sql"
    );
    // The SQL an operator runs on a Citus coordinator, run twice against stand-ins of
    // Citus's functions that refuse what Citus refuses: a column the table lacks, a
    // co-location with a table not yet distributed, a foreign key to one either.
    sqlx::raw_sql(CITUS_STAND_INS).execute(&pool).await.unwrap();
    let script = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/migrations/citus/distribute.sql"
    ))
    .unwrap();
    let script = script.replace("CREATE EXTENSION IF NOT EXISTS citus;", "");
    for run in ["first", "second"] {
        sqlx::raw_sql(&script)
            .execute(&pool)
            .await
            .unwrap_or_else(|e| panic!("distribute.sql, {run} run: {e}"));
    }
    let layout: Vec<(String, String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT logicalrelid::text, partmethod, column_name, colocation FROM pg_dist_partition",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        layout.len(),
        tables.len(),
        "each table distributed once: {layout:?}"
    );
    for (table, method, column, colocation) in &layout {
        let expected = match table.as_str() {
            "orgs" => ("h", Some("org_id"), Some("default")),
            t if org_tables.contains(t) => ("h", Some("org_id"), Some("orgs")),
            "stripe_customers" => ("h", Some("customer_id"), Some("none")),
            _ => ("n", None, None),
        };
        assert_eq!(
            (method.as_str(), column.as_deref(), colocation.as_deref()),
            expected,
            "{table}"
        );
    }
    pool.close().await;
}

#[test]
fn the_audit_rule_tells_a_statement_that_names_its_orgs() {
    let bad = [
        "SELECT * FROM sessions WHERE session_id = ANY($1) FOR UPDATE",
        "SELECT k.* FROM api_keys k JOIN UNNEST($1, $2) u ON k.org_id = u.org_id FOR UPDATE OF k",
        "INSERT INTO sessions (a) SELECT * FROM UNNEST($1) ON CONFLICT (session_id) DO UPDATE SET a = 1",
        "UPDATE notifications SET state = $1 WHERE notification_id = $2",
        "UPDATE sessions SET slot_at = u.slot_at FROM UNNEST($1) u WHERE sessions.session_id = u.s",
    ];
    for sql in bad {
        assert!(violation(sql).is_some(), "{sql}");
    }
    let good = [
        "SELECT * FROM sessions WHERE org_id = ANY($1) AND session_id = ANY($2) FOR UPDATE",
        "INSERT INTO sessions (a) VALUES ($1) ON CONFLICT (org_id, session_id) DO UPDATE SET a = 1",
        "UPDATE stripe_events SET state = $1 WHERE event_id = $2",
        "SELECT * FROM period_sessions WHERE period_start = $1 ORDER BY org_id",
        "UPDATE notifications SET state = $2 WHERE org_id = $7 AND notification_id = $1",
        "UPDATE periods SET orgs = $2, sessions = $3 WHERE period_start = $1 RETURNING *",
    ];
    for sql in good {
        assert!(violation(sql).is_none(), "{sql}");
    }
}

/// Statements with their parameters, as the server logged them for one database. Lines
/// of several connections interleave (`log_line_prefix` is `%m [%p] %q%u@%d `), so each
/// parameter line goes to the last statement of its own process.
fn logged_statements(log: &str, database: &str) -> Vec<(String, Vec<String>)> {
    let mine = format!("@{database} ");
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let mut last_of: HashMap<&str, usize> = HashMap::new();
    // The statement a continuation line extends, if the entry above it was one of ours.
    let mut continues: Option<usize> = None;
    for line in log.lines() {
        let starts_entry = line.len() > 4 && line[..4].chars().all(|c| c.is_ascii_digit());
        if !starts_entry {
            if let Some(sql) = continues.and_then(|i| out.get_mut(i)).map(|(sql, _)| sql) {
                sql.push(' ');
                sql.push_str(line.trim());
            }
            continue;
        }
        continues = None;
        if !line.contains(&mine) {
            continue;
        }
        let Some(pid) = line
            .split_once(" [")
            .and_then(|(_, rest)| rest.split_once(']'))
            .map(|(pid, _)| pid)
        else {
            continue;
        };
        if let Some(i) = line.find("LOG:  execute ") {
            let rest = &line[i + "LOG:  execute ".len()..];
            let sql = rest.split_once(": ").map_or(rest, |(_, s)| s);
            out.push((sql.to_owned(), Vec::new()));
        } else if let Some(i) = line.find("LOG:  statement: ") {
            out.push((line[i + "LOG:  statement: ".len()..].to_owned(), Vec::new()));
        } else if let Some(i) = line.find("DETAIL:  parameters: ") {
            if let Some((_, params)) = last_of.get(pid).and_then(|&j| out.get_mut(j)) {
                params.extend(parameter_values(&line[i + "DETAIL:  parameters: ".len()..]));
            }
            continue;
        } else {
            continue;
        }
        last_of.insert(pid, out.len() - 1);
        continues = Some(out.len() - 1);
    }
    out
}

/// The values of `$1 = '…', $2 = '…'`, arrays (`{a,b}`) split into their elements.
fn parameter_values(detail: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = detail;
    while let Some(i) = rest.find(" = '") {
        let after = &rest[i + 4..];
        let mut value = String::new();
        let mut chars = after.char_indices().peekable();
        let mut end = after.len();
        while let Some((j, c)) = chars.next() {
            if c == '\'' {
                if chars.peek().is_some_and(|(_, n)| *n == '\'') {
                    value.push('\'');
                    chars.next();
                } else {
                    end = j + 1;
                    break;
                }
            } else {
                value.push(c);
            }
        }
        match value.strip_prefix('{').and_then(|v| v.strip_suffix('}')) {
            Some(array) => out.extend(array.split(',').map(|v| v.trim_matches('"').to_owned())),
            None => out.push(value),
        }
        rest = &after[end..];
    }
    out
}

/// A statement that locks, writes or claims rows of an org table.
fn touches_org_rows(sql: &str) -> bool {
    let s = sql.to_lowercase();
    let writes = ORG_TABLES.iter().any(|t| {
        s.contains(&format!("insert into {t} "))
            || s.contains(&format!("update {t} "))
            || s.contains(&format!("delete from {t} "))
    });
    writes
        || s.contains(" for update")
        || s.contains(" for no key update")
        || s.contains("skip locked")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lock_upsert_and_claim_names_the_orgs_of_one_shard() {
    let Some(url) = partitioned_database().await else {
        return;
    };
    let database = url.rsplit('/').next().unwrap().to_owned();
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&pool)
        .await
        .unwrap();
    let major = version.split('.').next().unwrap().to_owned();
    let log_path = format!("/var/log/postgresql/postgresql-{major}-main.log");
    let Ok(before) = std::fs::metadata(&log_path).map(|m| m.len()) else {
        assert!(
            !on_ci(),
            "CI must audit statements from the server log at {log_path}"
        );
        eprintln!("NOTE: no server log at {log_path}; the statement audit did not run");
        return;
    };
    sqlx::query(&format!(
        "ALTER DATABASE {database} SET log_statement = 'all'"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let partitions: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pg_inherits WHERE inhparent = 'sessions'::regclass",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let orgs: Vec<String> = (0..8).map(|i| format!("shard_org_{i}")).collect();
    let shard_of: HashMap<String, i32> = sqlx::query_as(
        "SELECT o, r FROM UNNEST($1::text[]) AS o, generate_series(0, $2 - 1) AS r \
         WHERE satisfies_hash_partition('sessions'::regclass, $2, r, o)",
    )
    .bind(&orgs)
    .bind(partitions as i32)
    .fetch_all(&pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    let spread: BTreeSet<i32> = shard_of.values().copied().collect();
    assert!(
        spread.len() > 1,
        "the orgs fall in one partition: {shard_of:?}"
    );

    let srv = TestServer::start_on(
        Backend::Postgres,
        url.clone(),
        None,
        Options {
            rules: rush_meter_core::ledger::Rules {
                interval: 15,
                lease: 45,
            },
            ..Options::default()
        },
    )
    .await;
    for o in &orgs {
        srv.create_org(o, "team").await;
        srv.admin("PUT", &format!("/v1/orgs/{o}/keys/k1"), Some(json!({})))
            .await;
    }
    // Admissions of every org at once: groups that mix shards.
    let bodies: Vec<_> = orgs
        .iter()
        .flat_map(|o| {
            (0..3).map(move |i| {
                json!({"org_id": o, "key_id": "k1", "session_id": format!("{o}_s{i}"), "agent": "codex"})
            })
        })
        .collect();
    let admits = bodies
        .iter()
        .map(|body| srv.call("POST", "/v1/admissions", Some(ADMIN), Some(body)));
    for (status, v) in futures_util::future::join_all(admits).await {
        assert_eq!(status, 200, "{v}");
    }
    // One batch of every org's sessions, new ones among them, and one named as another org's.
    let mut beats: Vec<_> = orgs
        .iter()
        .flat_map(|o| (0..4).map(move |i| hb(o, &format!("{o}_s{i}"), 1, "running", T0)))
        .collect();
    srv.clock.set(T0 + 10);
    let (status, v) = srv.heartbeats(beats.clone()).await;
    assert_eq!(status, 200, "{v}");
    beats.push(hb(
        &orgs[1],
        &format!("{}_s0", orgs[0]),
        2,
        "running",
        T0 + 10,
    ));
    // A session id is its org's own: the last beat makes a session of orgs[1] of that id.
    let (status, v) = srv.heartbeats(beats).await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = srv
        .call(
            "POST",
            &format!("/v1/orgs/{}/sessions/{}_s1/end", orgs[2], orgs[2]),
            Some(ADMIN),
            Some(&json!({"status": "completed"})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    // Time alone: silent sessions are booked by the expiry job.
    srv.clock.set(T0 + 600);
    let expired = srv
        .db
        .expire_sessions(T0 + 600, &srv.rules, &common::plans(), 1000)
        .await
        .unwrap();
    assert!(expired > 0);
    // The queues and Stripe's state.
    for o in [&orgs[0], &orgs[5]] {
        srv.db
            .insert_notification(o, "month", T0, 80, &format!("ntf_{o}"), "{}", T0)
            .await
            .unwrap();
    }
    let claimed = srv.db.claim_notifications(T0 + 700, 60, 10).await.unwrap();
    assert_eq!(claimed.len(), 2);
    for n in &claimed {
        srv.db
            .finish_notification(
                &n.org_id,
                &n.notification_id,
                n.attempts,
                "sent",
                None,
                T0,
                T0 + 700,
            )
            .await
            .unwrap();
    }
    assert!(srv
        .db
        .link_stripe_customer(&orgs[3], "cus_shard_3", T0)
        .await
        .unwrap());
    srv.clock.set(1_796_083_200 + 7200); // 2026-12-01T02:00:00Z
    let (status, v) = srv
        .call("POST", "/v1/periods/2026-11/close", Some(ADMIN), None)
        .await;
    assert_eq!(status, 200, "{v}");
    let mut srv = srv;
    srv.stop().await;
    pool.close().await;

    let log = std::fs::read(&log_path).unwrap();
    let log = String::from_utf8_lossy(&log[before as usize..]);
    let statements = logged_statements(&log, &database);
    let known: BTreeSet<&str> = orgs.iter().map(String::as_str).collect();
    let mut audited: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut split = false;
    for (sql, params) in &statements {
        if let Some(why) = violation(sql) {
            panic!("{why}: {sql}");
        }
        if !touches_org_rows(sql) {
            continue;
        }
        let named: BTreeSet<&str> = params
            .iter()
            .map(String::as_str)
            .filter(|p| known.contains(p))
            .collect();
        let shards: BTreeSet<i32> = named.iter().map(|o| shard_of[*o]).collect();
        assert!(
            shards.len() <= 1,
            "one statement names orgs of {} shards ({named:?}): {sql}",
            shards.len()
        );
        split |= named.len() > 1;
        let s = sql.to_lowercase();
        for (kind, mark) in [
            (
                "session locks",
                "from sessions where org_id = any($1) and session_id",
            ),
            ("key locks", "for update of k"),
            (
                "booking upserts",
                "on conflict (org_id, session_id) do update",
            ),
            ("expiry claims", "skip locked"),
            ("notification claims", "update notifications set attempts"),
        ] {
            if s.contains(mark) {
                *audited.entry(kind).or_default() += 1;
            }
        }
    }
    for kind in [
        "session locks",
        "key locks",
        "booking upserts",
        "expiry claims",
        "notification claims",
    ] {
        assert!(
            audited.get(kind).copied().unwrap_or(0) > 0,
            "the workload sent no {kind}: {audited:?} of {} statements",
            statements.len()
        );
    }
    assert!(
        split || spread.len() == orgs.len(),
        "no statement named two orgs of one shard"
    );
    eprintln!(
        "{} statements audited over {} partitions: {audited:?}",
        statements.len(),
        partitions
    );
}

/// On a real Citus cluster (`RUSH_METER_TEST_CITUS`, `.ci/run`), a database distributed by
/// the runbook (tests/common/citus.rs) holds what docs/operations.md says: every table
/// placed once, the org tables distributed by org_id in the co-location group of `orgs`,
/// the Stripe customers' lookup by its id in a group of its own, the shared tables
/// reference tables; and the script run again changes nothing.
#[tokio::test]
#[ignore = "needs a Citus cluster: RUSH_METER_TEST_CITUS (.ci/run starts one)"]
async fn on_a_real_cluster_every_table_is_placed_as_the_runbook_says() {
    let coordinator = common::citus::coordinator()
        .expect("RUSH_METER_TEST_CITUS names the coordinator of a cluster made by cluster.sh");
    let name = format!("rm_test_{:016x}", rand::random::<u64>());
    let url =
        common::citus::distributed_database(&coordinator, &name, false, common::citus::TEST_SHARDS)
            .await;
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let layout = || async {
        let rows: Vec<(String, String, Option<String>, i32)> = sqlx::query_as(
            "SELECT logicalrelid::text, partmethod::text, \
               column_to_column_name(logicalrelid, partkey), colocationid \
             FROM pg_dist_partition ORDER BY 1",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        rows
    };
    let first = layout().await;
    let placed: BTreeSet<&str> = first.iter().map(|(t, ..)| t.as_str()).collect();
    let expected: BTreeSet<&str> = ORG_TABLES.iter().chain(&SHARED_TABLES).copied().collect();
    assert_eq!(placed, expected, "every table placed once: {first:?}");
    let group = |table: &str| first.iter().find(|(t, ..)| t == table).unwrap().3;
    for (table, method, column, colocation) in &first {
        let want = match table.as_str() {
            t if ORG_TABLES.contains(&t) => ("h", Some("org_id"), Some(group("orgs"))),
            "stripe_customers" => ("h", Some("customer_id"), None),
            _ => ("n", None, None),
        };
        let got = (
            method.as_str(),
            column.as_deref(),
            want.2.map(|_| *colocation),
        );
        assert_eq!(got, want, "{table}");
    }
    assert_ne!(
        group("stripe_customers"),
        group("orgs"),
        "the customers' lookup is not co-located with the org tables"
    );
    let distributed = first.iter().filter(|(_, m, ..)| m == "h").count();
    let reference = first.iter().filter(|(_, m, ..)| m == "n").count();
    assert_eq!(
        (first.len(), distributed, reference),
        (
            ORG_TABLES.len() + SHARED_TABLES.len(),
            ORG_TABLES.len() + 1,
            SHARED_TABLES.len() - 1
        ),
        "the runbook's counts (docs/operations.md)"
    );
    let script = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/migrations/citus/distribute.sql"
    ))
    .unwrap();
    sqlx::raw_sql(&script)
        .execute(&pool)
        .await
        .expect("distribute.sql run again");
    assert_eq!(layout().await, first, "a second run changes nothing");
    pool.close().await;
    common::citus::drop_database(&coordinator, &name).await;
}

/// Single-shard and multi-shard executions the coordinator has run in this database
/// (`citus_stat_counters`), by connections where `citus.enable_stat_counters` is on.
async fn shard_executions(pool: &sqlx::PgPool) -> (i64, i64) {
    sqlx::query_as(
        "SELECT query_execution_single_shard, query_execution_multi_shard \
         FROM citus_stat_counters WHERE name = current_database()",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// That what ran since `before` (the counters then) ran on one shard at a time, and that
/// something was counted; the counters now.
async fn on_one_shard(pool: &sqlx::PgPool, path: &str, before: (i64, i64)) -> (i64, i64) {
    let after = shard_executions(pool).await;
    assert!(
        after.0 > before.0,
        "{path}: the counters count ({before:?} {after:?})"
    );
    assert_eq!(
        after.1 - before.1,
        0,
        "{path}: statements on every shard ({before:?} then {after:?})"
    );
    after
}

/// A store on a fresh database of the cluster, with 8 orgs of a key each, warmed (the
/// shard cache, each statement's plan) as a running instance is. Its own connections count
/// shard executions (Citus's daemons run statements of their own in the database) and
/// allow no intermediate result: a statement whose rows pass through the coordinator (a
/// subplan, such as a data-modifying CTE of INSERT … SELECT) fails instead of running a
/// hop slower. `options` are more settings for its connections.
struct OnCluster {
    db: rush_meter::store::Db,
    counters: sqlx::PgPool,
    coordinator: String,
    name: String,
    plans: rush_meter_core::plans::Plans,
    rules: rush_meter_core::ledger::Rules,
    orgs: Vec<String>,
}

impl OnCluster {
    async fn new(options: &str) -> OnCluster {
        use rush_meter::store::{Db, OrgUpsert};
        let coordinator = common::citus::coordinator()
            .expect("RUSH_METER_TEST_CITUS names the coordinator of a cluster made by cluster.sh");
        let name = format!("rm_test_{:016x}", rand::random::<u64>());
        let url = common::citus::test_database(&coordinator, &name, false).await;
        let db = Db::connect(
            &format!(
                "{url}?options=-c%20citus.enable_stat_counters%3Don\
                 %20-c%20citus.max_intermediate_result_size%3D0{options}"
            ),
            Default::default(),
        )
        .await
        .unwrap();
        let counters = sqlx::PgPool::connect(&url).await.unwrap();
        let rush_meter::store::Pools::Postgres(store_pool) = db.pools() else {
            unreachable!("a PostgreSQL store")
        };
        let limit: String = sqlx::query_scalar("SHOW citus.max_intermediate_result_size")
            .fetch_one(store_pool)
            .await
            .unwrap();
        assert_eq!(
            limit, "0",
            "the store's connections allow no intermediate result"
        );
        let on = OnCluster {
            db,
            counters,
            coordinator,
            name,
            plans: common::plans(),
            rules: rush_meter_core::ledger::Rules {
                interval: 15,
                lease: 45,
            },
            orgs: (0..8).map(|o| format!("org_{o}")).collect(),
        };
        let actor = rush_meter_core::audit::Actor::system("test");
        for org in &on.orgs {
            let upsert = OrgUpsert {
                org_id: org.clone(),
                plan_id: Some("team".into()),
                plan_version: None,
                ..Default::default()
            };
            on.db.upsert_org(&upsert, T0, &actor).await.unwrap();
            on.db.upsert_key(org, "k1", None, T0, &actor).await.unwrap();
        }
        for (i, org) in on.orgs.iter().enumerate() {
            let s = format!("warm_{i}");
            on.db
                .admit(&on.plans, &[admission(org, &s)], T0, &on.rules)
                .await
                .unwrap();
            let beat = beat(org, &s, 1, T0, rush_meter_core::ledger::VmState::Running);
            on.db
                .ingest(&[vec![beat]], &on.rules, &on.plans, T0, 1)
                .await
                .unwrap();
        }
        on
    }

    /// The shards the orgs lie on.
    async fn shards(&self) -> BTreeSet<i64> {
        let found: Vec<i64> = sqlx::query_scalar(
            "SELECT get_shard_id_for_distribution_column('sessions', o) FROM UNNEST($1::text[]) o",
        )
        .bind(&self.orgs)
        .fetch_all(&self.counters)
        .await
        .unwrap();
        found.into_iter().collect()
    }

    /// Transactions the coordinator has committed in two phases and not yet recovered
    /// (`pg_dist_transaction`; its daemon clears them every minute, so a count taken right
    /// after a request sees that request's).
    async fn two_phase_commits(&self) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM pg_dist_transaction")
            .fetch_one(&self.counters)
            .await
            .unwrap()
    }

    async fn close(self) {
        rush_meter::store::Admin::close(&*self.db).await;
        self.counters.close().await;
        common::citus::drop_database(&self.coordinator, &self.name).await;
    }
}

fn admission(org: &str, session: &str) -> rush_meter_core::gate::AdmissionRequest {
    rush_meter_core::gate::AdmissionRequest {
        org_id: org.into(),
        key_id: "k1".into(),
        session_id: session.into(),
        agent: rush_meter_core::gate::Agent::Claude,
        project_id: Some("web".into()),
        started_by: Some("u1".into()),
    }
}

fn beat(
    org: &str,
    session: &str,
    seq: i64,
    at: i64,
    state: rush_meter_core::ledger::VmState,
) -> rush_meter_core::heartbeats::Heartbeat {
    use rush_meter_core::ids::Id;
    rush_meter_core::heartbeats::Heartbeat {
        org_id: Id::parse(org).unwrap(),
        session_id: Id::parse(session).unwrap(),
        vm_id: Id::parse(&format!("vm_{session}")).unwrap(),
        obs: rush_meter_core::ledger::Observation { seq, at, state },
        received_at: at,
    }
}

/// On a real Citus cluster, the hot transactions of one org run on the org's shard alone:
/// an admission of a new session and its resume, a heartbeat request of one org, a
/// session's end and the usage page's read of the org's funding add no multi-shard
/// execution (`citus_stat_counters`), and pass no rows through the coordinator. Driven
/// through the store, so that no background job runs meanwhile; the orgs lie on several
/// shards.
#[tokio::test]
#[ignore = "needs a Citus cluster: RUSH_METER_TEST_CITUS (.ci/run starts one)"]
async fn on_a_real_cluster_the_hot_paths_of_one_org_run_on_its_shard() {
    use rush_meter_core::ledger::{EndStatus, VmState};

    let on = OnCluster::new("").await;
    let (db, plans, rules) = (&on.db, &on.plans, &on.rules);
    let org = on.orgs[3].as_str();
    let ingest = |seq: i64, at: i64, state: VmState| {
        let group = [vec![beat(org, "s1", seq, at, state)]];
        async move { db.ingest(&group, rules, plans, at, 1).await.unwrap() }
    };
    let mut mark = shard_executions(&on.counters).await;
    let allowed = db
        .admit(plans, &[admission(org, "s1")], T0 + 1, rules)
        .await
        .unwrap();
    assert_eq!(allowed[0].as_ref().unwrap().decision.as_str(), "allow");
    mark = on_one_shard(&on.counters, "an admission of a new session", mark).await;
    ingest(1, T0 + 2, VmState::Running).await;
    mark = on_one_shard(&on.counters, "a heartbeat", mark).await;
    ingest(2, T0 + 17, VmState::Parked).await;
    mark = on_one_shard(&on.counters, "a heartbeat that parks", mark).await;
    db.admit(plans, &[admission(org, "s1")], T0 + 30, rules)
        .await
        .unwrap();
    mark = on_one_shard(&on.counters, "a resume", mark).await;
    db.end_session(org, "s1", EndStatus::Completed, T0 + 40, rules, plans)
        .await
        .unwrap();
    mark = on_one_shard(&on.counters, "an end", mark).await;
    db.funding_record_counting_parked(org, T0 + 50)
        .await
        .unwrap()
        .unwrap();
    on_one_shard(&on.counters, "the usage page's funding read", mark).await;
    on.close().await;
}

/// On a real Citus cluster, a group whose orgs lie on several shards (a host's heartbeats
/// of many orgs, admissions of many orgs' callers, the reads of their answers) runs a
/// transaction a shard: no multi-shard execution, no two-phase commit. A request naming
/// an unknown org is refused whole, nothing of it written; each heartbeat is answered in
/// its request's order, and sent again it is a duplicate.
#[tokio::test]
#[ignore = "needs a Citus cluster: RUSH_METER_TEST_CITUS (.ci/run starts one)"]
async fn on_a_real_cluster_a_group_of_many_orgs_commits_a_shard_at_a_time() {
    use rush_meter_core::heartbeats::IngestReject;
    use rush_meter_core::ledger::VmState::Running;
    use rush_meter_core::time::Windows;

    let on = OnCluster::new("").await;
    assert!(
        on.shards().await.len() > 2,
        "the orgs lie on several shards"
    );
    let (db, plans, rules) = (&on.db, &on.plans, &on.rules);
    let host: Vec<_> = on
        .orgs
        .iter()
        .rev()
        .map(|o| beat(o, "h1", 1, T0 + 2, Running))
        .collect();
    let refused = vec![
        beat(&on.orgs[0], "h2", 1, T0 + 2, Running),
        beat("org_unknown", "h2", 1, T0 + 2, Running),
    ];
    let (mark, prepared) = (
        shard_executions(&on.counters).await,
        on.two_phase_commits().await,
    );
    let group = [host.clone(), refused];
    let answers = db.ingest(&group, rules, plans, T0 + 2, 1).await.unwrap();
    let mark = on_one_shard(&on.counters, "a group of many orgs' heartbeats", mark).await;
    assert_eq!(
        on.two_phase_commits().await,
        prepared,
        "no two-phase commit"
    );
    let answered: Vec<(String, bool)> = answers[0]
        .as_ref()
        .unwrap()
        .iter()
        .map(|o| (o.org_id.clone(), o.duplicate))
        .collect();
    let asked: Vec<(String, bool)> = host.iter().map(|h| (h.org_id.to_string(), false)).collect();
    assert_eq!(
        answered, asked,
        "each heartbeat answered in its request's order"
    );
    assert_eq!(
        answers[1],
        Err(IngestReject::UnknownOrg {
            index: 1,
            org_id: "org_unknown".into()
        })
    );
    let refused_session = db.get_session(&on.orgs[0], "h2").await.unwrap();
    assert!(
        refused_session.is_none(),
        "nothing of a refused request written"
    );
    let again = db.ingest(&[host], rules, plans, T0 + 3, 1).await.unwrap();
    assert!(
        again[0].as_ref().unwrap().iter().all(|o| o.duplicate),
        "sent again, each is a duplicate"
    );
    let mark = on_one_shard(&on.counters, "the group sent again", mark).await;
    // Orgs the store has seen are not read again; one it has not is, and refuses its request.
    let mixed: Vec<_> = on
        .orgs
        .iter()
        .map(|o| beat(o, "h3", 1, T0 + 3, Running))
        .chain([beat("org_unknown", "h3", 1, T0 + 3, Running)])
        .collect();
    let refused = db.ingest(&[mixed], rules, plans, T0 + 3, 1).await.unwrap();
    assert_eq!(
        refused[0],
        Err(IngestReject::UnknownOrg {
            index: on.orgs.len(),
            org_id: "org_unknown".into()
        }),
        "an unknown org beside seen ones refuses its request"
    );
    assert!(
        db.get_session(&on.orgs[0], "h3").await.unwrap().is_none(),
        "nothing of it written"
    );
    let mark = on_one_shard(
        &on.counters,
        "a group of seen orgs and an unknown one",
        mark,
    )
    .await;

    let prepared = on.two_phase_commits().await;
    let asks: Vec<_> = on.orgs.iter().map(|o| admission(o, "a1")).collect();
    let decided = db.admit(plans, &asks, T0 + 4, rules).await.unwrap();
    for (ask, d) in asks.iter().zip(&decided) {
        let d = d.as_ref().unwrap();
        assert_eq!(
            (d.org_id.as_str(), d.decision.as_str()),
            (ask.org_id.as_str(), "allow")
        );
    }
    let mark = on_one_shard(&on.counters, "a group of many orgs' admissions", mark).await;
    assert_eq!(
        on.two_phase_commits().await,
        prepared,
        "no two-phase commit"
    );

    let ids: Vec<&str> = on.orgs.iter().map(String::as_str).collect();
    let funding = db.funding_records(&ids, T0 + 5).await.unwrap();
    assert_eq!(funding.len(), ids.len());
    let windows = Windows::at(T0 + 5, None);
    let used = db
        .window_usage(&ids, &windows, T0 + 5, rules)
        .await
        .unwrap();
    assert_eq!(used.len(), ids.len(), "every org's sums: {used:?}");
    on_one_shard(&on.counters, "the reads of many orgs' standings", mark).await;
    on.close().await;
}

/// On a real Citus cluster, a group of many orgs' heartbeats whose part on one shard
/// fails (a lock held past the store's statement timeout) fails whole after the other shards'
/// parts committed; sent again, it applies what was not applied, once: the parts that
/// committed answer duplicate, the one that failed does not.
#[tokio::test]
#[ignore = "needs a Citus cluster: RUSH_METER_TEST_CITUS (.ci/run starts one)"]
async fn on_a_real_cluster_a_group_retried_after_a_shard_failed_applies_each_beat_once() {
    use rush_meter_core::ledger::VmState::Running;

    let on = OnCluster::new("%20-c%20statement_timeout%3D1000").await;
    let (db, plans, rules) = (&on.db, &on.plans, &on.rules);
    let first: Vec<_> = on
        .orgs
        .iter()
        .map(|o| beat(o, "h1", 1, T0 + 2, Running))
        .collect();
    db.ingest(&[first], rules, plans, T0 + 2, 1).await.unwrap();
    let blocked = on.orgs[5].as_str();
    let mut holder = on.counters.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM sessions WHERE org_id = $1 AND session_id = 'h1' FOR UPDATE")
        .bind(blocked)
        .execute(&mut *holder)
        .await
        .unwrap();
    let second: Vec<_> = on
        .orgs
        .iter()
        .map(|o| beat(o, "h1", 2, T0 + 17, Running))
        .collect();
    let failed = db
        .ingest(std::slice::from_ref(&second), rules, plans, T0 + 17, 1)
        .await;
    assert!(failed.is_err(), "a shard's part failed: {failed:?}");
    holder.rollback().await.unwrap();
    let mut applied = BTreeSet::new();
    for org in &on.orgs {
        let s = db.get_session(org, "h1").await.unwrap().unwrap();
        if s.ledger.last_seq == Some(2) {
            applied.insert(org.clone());
        }
    }
    assert!(
        !applied.contains(blocked),
        "the blocked shard's part is not applied"
    );
    assert!(
        !applied.is_empty(),
        "the other shards' parts committed: {applied:?}"
    );
    let again = db
        .ingest(&[second], rules, plans, T0 + 18, 1)
        .await
        .unwrap();
    for o in again[0].as_ref().unwrap() {
        assert_eq!(
            o.duplicate,
            applied.contains(&o.org_id),
            "{}: applied once, by whichever try came first",
            o.org_id
        );
    }
    for org in &on.orgs {
        let s = db.get_session(org, "h1").await.unwrap().unwrap();
        assert_eq!(s.ledger.last_seq, Some(2), "{org}");
    }
    on.close().await;
}
