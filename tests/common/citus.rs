//! Test databases on a real Citus cluster: `RUSH_METER_TEST_CITUS` names the coordinator of a
//! cluster made by `../shared/citus/cluster.sh up` (its workers on the next two ports of the
//! same host), and every PostgreSQL test then runs on a database distributed as an operator
//! distributes one: made on every node with the extension, the workers registered, migrated,
//! and `migrations/citus/distribute.sql` run on the coordinator (docs/operations.md).
//! `.ci/run` runs the suite's PostgreSQL tests once so.

/// The coordinator's URL, without a database, when the tests run on Citus.
pub fn coordinator() -> Option<String> {
    std::env::var("RUSH_METER_TEST_CITUS")
        .ok()
        .filter(|u| !u.is_empty())
}

/// Shards each distributed table gets in a test database. Fewer than a production cluster's
/// 32 (each test makes its own database, and distributing one costs a statement a shard):
/// more than one on each worker, so that what is one org's and what is not still shows.
pub const TEST_SHARDS: u32 = 4;

/// The host and port of a `postgres://user@host:port` URL.
fn host_port(url: &str) -> (String, u16) {
    let rest = url.rsplit('@').next().unwrap_or(url);
    let rest = rest.split('/').next().unwrap_or(rest);
    let (host, port) = rest
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("RUSH_METER_TEST_CITUS: no port in `{url}`"));
    (
        host.to_owned(),
        port.parse()
            .unwrap_or_else(|_| panic!("RUSH_METER_TEST_CITUS: port of `{url}`")),
    )
}

/// Run `sql` on database `db` of the node at `host:port`.
async fn on_node(host: &str, port: u16, db: &str, sql: &str) {
    let url = format!("postgres://postgres@{host}:{port}/{db}");
    let pool = sqlx::PgPool::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("Citus node {url}: {e}"));
    sqlx::raw_sql(sql)
        .execute(&pool)
        .await
        .unwrap_or_else(|e| panic!("{sql} on {url}: {e}"));
    pool.close().await;
}

/// The nodes of the cluster whose coordinator is at `host:port`: it, then its two workers.
fn nodes(port: u16) -> [u16; 3] {
    [port, port + 1, port + 2]
}

/// The shards of a production cluster (`citus.shard_count`'s default), which the
/// benchmarks distribute with.
pub const PRODUCTION_SHARDS: u32 = 32;

/// The SQL a test database is made from: the migrations, then the operator's script, and
/// its shards. A template made from other SQL is another template.
fn schema_digest(shards: u32) -> String {
    use sha2::{Digest, Sha256};
    let mut files: Vec<std::path::PathBuf> =
        std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/postgres"))
            .expect("migrations/postgres")
            .map(|e| e.unwrap().path())
            .collect();
    files.sort();
    files.push(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/migrations/citus/distribute.sql"
        )
        .into(),
    );
    let mut h = Sha256::new();
    for f in files {
        h.update(std::fs::read(&f).unwrap());
    }
    h.update(shards.to_le_bytes());
    format!("{:x}", h.finalize())[..16].to_owned()
}

/// Make database `name` on every node with the extension, register the workers, migrate it
/// and distribute it with `migrations/citus/distribute.sql`, as docs/operations.md says an
/// operator does (`cluster.sh createdb`, `rush-meter migrate`, the script), with `shards`
/// shards a table; its URL.
pub async fn distributed_database(
    coordinator: &str,
    name: &str,
    durable: bool,
    shards: u32,
) -> String {
    let (host, port) = host_port(coordinator);
    for p in nodes(port) {
        on_node(&host, p, "postgres", &format!("CREATE DATABASE {name}")).await;
        on_node(&host, p, name, "CREATE EXTENSION citus").await;
    }
    set_durability(&host, port, name, durable).await;
    on_node(
        &host,
        port,
        name,
        &format!(
            "SELECT citus_set_coordinator_host('{host}', {port}); \
             SELECT citus_add_node('{host}', {}); SELECT citus_add_node('{host}', {});",
            port + 1,
            port + 2
        ),
    )
    .await;
    let url = format!("postgres://postgres@{host}:{port}/{name}");
    let db = rush_meter::store::Db::connect(&url, Default::default())
        .await
        .expect("connect to the coordinator");
    rush_meter::store::Admin::migrate(&*db)
        .await
        .expect("migrate on the coordinator");
    rush_meter::store::Admin::close(&*db).await;
    let script = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/migrations/citus/distribute.sql"
    ))
    .expect("migrations/citus/distribute.sql");
    on_node(
        &host,
        port,
        name,
        &format!("SET citus.shard_count = {shards};\n{script}"),
    )
    .await;
    url
}

async fn set_durability(host: &str, port: u16, name: &str, durable: bool) {
    if durable {
        return;
    }
    for p in nodes(port) {
        on_node(
            host,
            p,
            "postgres",
            &format!("ALTER DATABASE {name} SET synchronous_commit = off"),
        )
        .await;
    }
}

/// A fresh distributed database for one test: a copy, on each node, of a template made once
/// a cluster by `distributed_database` (a database of the cluster is its nodes' databases
/// of one name; copied alike on every node, the copies are a cluster's database of the new
/// name). Making one from scratch costs seconds a test; a copy a fraction of one.
pub async fn test_database(coordinator: &str, name: &str, durable: bool) -> String {
    database_of_shards(coordinator, name, durable, TEST_SHARDS).await
}

/// `test_database` with `shards` shards a table.
pub async fn database_of_shards(
    coordinator: &str,
    name: &str,
    durable: bool,
    shards: u32,
) -> String {
    let (host, port) = host_port(coordinator);
    let template = format!("rm_template_{}", schema_digest(shards));
    ensure_template(&host, port, &template, shards).await;
    for p in nodes(port) {
        on_node(
            &host,
            p,
            "postgres",
            &format!("CREATE DATABASE {name} TEMPLATE {template}"),
        )
        .await;
    }
    set_durability(&host, port, name, durable).await;
    format!("postgres://postgres@{host}:{port}/{name}")
}

/// Make `template` unless the cluster has it: made whole, then closed to connections (a
/// database copied must have none, and Citus's own daemon keeps some open), under an
/// advisory lock so that concurrent tests, and test programs, make it once.
async fn ensure_template(host: &str, port: u16, template: &str, shards: u32) {
    let url = format!("postgres://postgres@{host}:{port}/postgres");
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("Citus coordinator {url}: {e}"));
    sqlx::query("SELECT pg_advisory_lock(hashtext($1))")
        .bind(template)
        .execute(&mut conn)
        .await
        .unwrap();
    let ready: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1 AND NOT datallowconn)",
    )
    .bind(template)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    if !ready {
        drop_database(&format!("postgres://postgres@{host}:{port}"), template).await;
        distributed_database(
            &format!("postgres://postgres@{host}:{port}"),
            template,
            true,
            shards,
        )
        .await;
        for p in nodes(port).into_iter().rev() {
            on_node(
                host,
                p,
                "postgres",
                &format!(
                    "ALTER DATABASE {template} WITH ALLOW_CONNECTIONS false; \
                     SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                       WHERE datname = '{template}' AND pid <> pg_backend_pid();"
                ),
            )
            .await;
        }
    }
    sqlx::query("SELECT pg_advisory_unlock(hashtext($1))")
        .bind(template)
        .execute(&mut conn)
        .await
        .unwrap();
}

/// Drop database `name` from every node of the cluster of `coordinator`.
pub async fn drop_database(coordinator: &str, name: &str) {
    let (host, port) = host_port(coordinator);
    for p in [port, port + 1, port + 2] {
        on_node(
            &host,
            p,
            "postgres",
            &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        )
        .await;
    }
}

/// The URLs of the cluster's nodes (its `postgres` database), the coordinator first.
pub fn node_urls(coordinator: &str) -> Vec<String> {
    let (host, port) = host_port(coordinator);
    nodes(port)
        .iter()
        .map(|p| format!("postgres://postgres@{host}:{p}/postgres"))
        .collect()
}

/// Transactions committed and rolled back on the workers in database `name`, summed: what
/// the coordinator sent them (`pg_stat_database`, which a worker's backend updates within
/// about 10 s of going idle: `PGSTAT_IDLE_INTERVAL`).
pub async fn worker_transactions(coordinator: &str, name: &str) -> i64 {
    let mut sum = 0;
    for url in &node_urls(coordinator)[1..] {
        let pool = sqlx::PgPool::connect(url)
            .await
            .unwrap_or_else(|e| panic!("Citus worker {url}: {e}"));
        let n: i64 = sqlx::query_scalar(
            "SELECT CAST(xact_commit + xact_rollback AS BIGINT) FROM pg_stat_database \
             WHERE datname = $1",
        )
        .bind(name)
        .fetch_one(&pool)
        .await
        .unwrap_or_else(|e| panic!("transactions of {name} on {url}: {e}"));
        sum += n;
        pool.close().await;
    }
    sum
}
