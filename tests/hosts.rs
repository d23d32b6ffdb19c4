//! A database URL of several hosts: the service writes to the one that accepts writes, and
//! when that one turns read-only and another takes over (a failover), it follows the new
//! one by itself, answering 503 meanwhile and never 500. Two PostgreSQL servers of the
//! machine's own binaries, started for the test (as the postgres user).

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Backend, Options, TestServer};
use serde_json::json;

const BIN: &str = "/usr/lib/postgresql/15/bin";

/// A PostgreSQL server of its own, stopped (and its directory removed) when dropped.
struct Server {
    dir: PathBuf,
    port: u16,
}

fn as_postgres(args: &[&str]) -> std::process::Output {
    Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .args(args)
        .output()
        .expect("runuser runs")
}

impl Server {
    /// `None` (with a note) where the binaries are not there, but on CI.
    fn start() -> Option<Server> {
        if !PathBuf::from(BIN).join("initdb").exists() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "PostgreSQL 15's binaries are required on CI ({BIN})"
            );
            eprintln!("note: no {BIN}/initdb; not run");
            return None;
        }
        let dir = std::env::temp_dir().join(format!("rm-hosts-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(Command::new("chown")
            .args(["postgres:postgres", dir.to_str().unwrap()])
            .status()
            .unwrap()
            .success());
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let data = dir.join("data");
        let data = data.to_str().unwrap();
        let init = as_postgres(&[
            &format!("{BIN}/initdb"),
            "-D",
            data,
            "-U",
            "postgres",
            "--auth=trust",
        ]);
        assert!(init.status.success(), "{init:?}");
        let opts = format!("-p {port} -c listen_addresses=127.0.0.1 -c fsync=off -k /tmp");
        let log = dir.join("log");
        let started = as_postgres(&[
            &format!("{BIN}/pg_ctl"),
            "-D",
            data,
            "-o",
            &opts,
            "-l",
            log.to_str().unwrap(),
            "-w",
            "start",
        ]);
        assert!(started.status.success(), "{started:?}");
        Some(Server { dir, port })
    }

    fn sql(&self, db: &str, sql: &str) -> String {
        let out = Command::new("psql")
            .args(["-X", "-q", "-At", "-h", "127.0.0.1", "-U", "postgres"])
            .args(["-p", &self.port.to_string(), "-d", db, "-c", sql])
            .output()
            .unwrap();
        assert!(out.status.success(), "{sql}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/fo", self.port)
    }

    /// Accept writes or not: new sessions read `default_transaction_read_only`, and the
    /// sessions open now are ended, as a failover ends them.
    fn writable(&self, yes: bool) {
        let set = if yes { "off" } else { "on" };
        self.sql(
            "postgres",
            &format!("ALTER DATABASE fo SET default_transaction_read_only = {set}"),
        );
        self.sql(
            "postgres",
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = 'fo' AND pid <> pg_backend_pid()",
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        as_postgres(&[
            &format!("{BIN}/pg_ctl"),
            "-D",
            data.to_str().unwrap(),
            "-m",
            "immediate",
            "stop",
        ]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An org made through the service: its status, retried while the answer is 503.
async fn put_org(srv: &TestServer, org: &str, within: Duration) -> Vec<u16> {
    let started = Instant::now();
    let mut seen = Vec::new();
    loop {
        let (status, _) = srv
            .call(
                "PUT",
                &format!("/v1/orgs/{org}"),
                Some(common::ADMIN),
                Some(&json!({"plan": "free"})),
            )
            .await;
        seen.push(status);
        if status != 503 || started.elapsed() > within {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_follows_the_host_that_accepts_writes() {
    let (Some(a), Some(b)) = (Server::start(), Server::start()) else {
        return;
    };
    for s in [&a, &b] {
        s.sql("postgres", "CREATE DATABASE fo");
        let db = rush_meter::store::Db::connect(&s.url(), Default::default())
            .await
            .unwrap();
        rush_meter::store::Admin::migrate(&*db).await.unwrap();
        rush_meter::store::Admin::close(&*db).await;
    }
    // B first in the URL, but a standby: the service writes to A.
    b.writable(false);
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/fo?target_session_attrs=read-write",
        b.port, a.port
    );
    let srv = TestServer::start_on(Backend::Postgres, url, None, Options::default()).await;
    assert_eq!(put_org(&srv, "before", Duration::ZERO).await, vec![200]);
    assert_eq!(
        a.sql("fo", "SELECT count(*) FROM orgs WHERE org_id = 'before'"),
        "1"
    );

    // A failover: A turns read-only, B takes writes. The service follows without a
    // restart, answering 503 (never 500) until it has.
    a.writable(false);
    b.writable(true);
    let seen = put_org(&srv, "after", Duration::from_secs(20)).await;
    eprintln!("answers while it moved: {seen:?}");
    assert_eq!(seen.last(), Some(&200), "{seen:?}");
    assert!(seen.iter().all(|s| *s == 200 || *s == 503), "{seen:?}");
    assert_eq!(
        b.sql("fo", "SELECT count(*) FROM orgs WHERE org_id = 'after'"),
        "1"
    );
    let (status, _, _) = srv.get_text("/readyz", "content-type").await;
    assert_eq!(status, 200);
    srv.finish().await;
}
