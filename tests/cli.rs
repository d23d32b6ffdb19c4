//! The `rush-meter` binary: start-up checks, `migrate`, `token create`, and the two
//! schemas kept in step.

mod common;

use std::process::Command;

use common::{fresh_database, Backend};
use rush_meter::store::Db;

fn rush_meter() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rush-meter"));
    // The environment of the test run must not leak into the command's settings.
    for (k, _) in std::env::vars() {
        if k.starts_with("RUSH_METER_") {
            c.env_remove(k);
        }
    }
    c.env("RUST_LOG", "error");
    c
}

fn run(c: &mut Command) -> (i32, String, String) {
    let out = c.output().expect("binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_settings_stop_start_up_naming_what_to_fix() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("m.db").display());
    let (code, _, err) =
        run(rush_meter().args(["serve", "--lease-secs", "3", "--database-url", &db]));
    assert_eq!(code, 2);
    assert!(
        err.contains("--lease-secs / RUSH_METER_LEASE_SECS"),
        "{err}"
    );

    let (code, _, err) = run(rush_meter()
        .env("RUSH_METER_LISTEN", "not-an-address")
        .args(["--database-url", &db]));
    assert_eq!(code, 2);
    assert!(err.contains("RUSH_METER_LISTEN"), "{err}");

    let (code, _, err) = run(rush_meter().env("RUSH_METER_LOG_FORMAT", "xml").args([
        "--database-url",
        &db,
        "migrate",
    ]));
    assert_eq!(code, 2);
    assert!(
        err.contains("--log-format") && err.contains("text") && err.contains("json"),
        "{err}"
    );

    let plans = dir.path().join("plans");
    std::fs::create_dir(&plans).unwrap();
    for f in ["free.toml", "pro.toml", "team.toml"] {
        std::fs::copy(common::repo_plans().join(f), plans.join(f)).unwrap();
    }
    let pro = std::fs::read_to_string(plans.join("pro.toml")).unwrap();
    // A negative ceiling, then a dangling upgrade_to: each names its file and field.
    for (from, to, field) in [
        (
            "weekly_agent_hours = 15",
            "weekly_agent_hours = -15",
            "weekly_agent_hours",
        ),
        (
            "upgrade_to = \"team\"",
            "upgrade_to = \"gold\"",
            "upgrade_to",
        ),
    ] {
        std::fs::write(plans.join("pro.toml"), pro.replace(from, to)).unwrap();
        let (code, _, err) = run(rush_meter()
            .args([
                "--database-url",
                &db,
                "--listen",
                "127.0.0.1:0",
                "--plans-dir",
            ])
            .arg(&plans));
        assert_eq!(code, 2);
        assert!(err.contains("pro.toml") && err.contains(field), "{err}");
    }
}

async fn token_create_prints_a_secret_once_and_stores_only_its_hash(backend: Backend) {
    let Some((url, _dir)) = fresh_database(backend).await else {
        return;
    };
    let (code, _, err) = run(rush_meter().args([
        "--database-url",
        &url,
        "token",
        "create",
        "--scope",
        "console",
    ]));
    assert_eq!(code, 2, "a console token needs --org");
    assert!(err.contains("--org"), "{err}");
    let (code, _, err) =
        run(rush_meter().args(["--database-url", &url, "token", "create", "--scope", "root"]));
    assert_eq!(code, 2);
    assert!(err.contains("`root`"), "{err}");

    let (code, secret, err) = run(rush_meter().args([
        "--database-url",
        &url,
        "token",
        "create",
        "--scope",
        "admission,ingest",
    ]));
    assert_eq!(code, 0, "{err}");
    let secret = secret.trim();
    assert!(secret.starts_with("rm_") && secret.len() > 60, "{secret}");
    let db = Db::connect(&url, Default::default()).await.unwrap();
    let row = db
        .token_by_hash(&rush_meter::tokens::hash_secret(secret))
        .await
        .unwrap()
        .expect("the token is stored by its hash");
    assert_eq!(row.scopes, "ingest,admission");
    assert!(!row.secret_hash.contains(&secret[3..]));
    assert_eq!(row.expires_at, None);

    // A lifetime, a list that shows no secret, and a revocation.
    let (code, _, err) = run(rush_meter().args([
        "--database-url",
        &url,
        "token",
        "create",
        "--scope",
        "ingest",
        "--expires-in",
        "soon",
    ]));
    assert_eq!(code, 2);
    assert!(err.contains("--expires-in") && err.contains("90d"), "{err}");
    let (code, second, err) = run(rush_meter().args([
        "--database-url",
        &url,
        "token",
        "create",
        "--scope",
        "finance",
        "--expires-in",
        "90d",
        "--label",
        "quarter close",
    ]));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("expiring at"), "{err}");
    let second = db
        .token_by_hash(&rush_meter::tokens::hash_secret(second.trim()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.expires_at, Some(second.created_at + 90 * 86_400));
    let (code, list, err) = run(rush_meter().args(["--database-url", &url, "token", "list"]));
    assert_eq!(code, 0, "{err}");
    assert!(
        !list.contains(secret) && !list.contains(&row.secret_hash),
        "{list}"
    );
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 3, "{list}");
    assert!(lines[0].starts_with(
        "token_id,label,scopes,org_id,state,created_at,last_used_at,expires_at,revoked_at"
    ));
    assert!(
        list.contains(&format!(
            "{},quarter close,finance,,active,",
            second.token_id
        )),
        "{list}"
    );
    let (code, _, err) =
        run(rush_meter().args(["--database-url", &url, "token", "revoke", &second.token_id]));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("within 5 s"), "{err}");
    let (_, list, _) = run(rush_meter().args(["--database-url", &url, "token", "list"]));
    assert!(
        list.contains(&format!(
            "{},quarter close,finance,,revoked,",
            second.token_id
        )),
        "{list}"
    );
    let (code, _, err) =
        run(rush_meter().args(["--database-url", &url, "token", "revoke", "tok_nothing"]));
    assert_eq!(code, 2);
    assert!(err.contains("token list"), "{err}");
    db.close().await;
}

every_backend!(token_create_prints_a_secret_once_and_stores_only_its_hash);

/// The same tables with the same columns on both backends.
#[tokio::test]
async fn migrations_are_in_step() {
    let Some((sqlite_url, _dir)) = fresh_database(Backend::Sqlite).await else {
        return;
    };
    let Some((pg_url, _)) = fresh_database(Backend::Postgres).await else {
        return;
    };
    let sqlite = sqlx::SqlitePool::connect(&format!("{sqlite_url}?mode=rwc"))
        .await
        .unwrap();
    sqlx::migrate!("migrations/sqlite")
        .run(&sqlite)
        .await
        .unwrap();
    let pg = sqlx::PgPool::connect(&pg_url).await.unwrap();
    sqlx::migrate!("migrations/postgres")
        .run(&pg)
        .await
        .unwrap();

    let mut lite: Vec<(String, String)> = sqlx::query_as(
        "SELECT m.name, p.name FROM sqlite_master m JOIN pragma_table_info(m.name) p \
         WHERE m.type = 'table' AND m.name NOT LIKE '\\_%' ESCAPE '\\' AND m.name NOT LIKE 'sqlite%'",
    )
    .fetch_all(&sqlite)
    .await
    .unwrap();
    let mut post: Vec<(String, String)> = sqlx::query_as(
        "SELECT table_name::text, column_name::text FROM information_schema.columns \
         WHERE table_schema = 'public' AND table_name NOT LIKE '\\_%'",
    )
    .fetch_all(&pg)
    .await
    .unwrap();
    lite.sort();
    post.sort();
    assert!(!lite.is_empty());
    assert_eq!(lite, post);
}

/// The real binary on SIGTERM: it finishes what is in flight and exits 0, and what it
/// acknowledged is in the database.
#[cfg(unix)]
async fn sigterm_drains_and_exits_cleanly(backend: Backend) {
    let Some((url, _dir)) = fresh_database(backend).await else {
        return;
    };
    let token = "sigterm-test-token-0123456789";
    let (mut child, base) = common::spawn_service(&url, token).await;
    let client = reqwest::Client::new();
    let r = client
        .put(format!("{base}/v1/orgs/acme"))
        .bearer_auth(token)
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut acked = Vec::new();
    for i in 0..20 {
        let body = serde_json::json!({"heartbeats": [{"org_id": "acme", "session_id": format!("s{i}"), "vm_id": "v", "seq": 1, "state": "running"}]});
        let r = client
            .post(format!("{base}/v1/heartbeats"))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            acked.push(format!("s{i}"));
        }
    }
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().unwrap().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = tokio::time::timeout(std::time::Duration::from_secs(20), child.wait())
        .await
        .expect("exits after SIGTERM")
        .unwrap();
    assert!(exit.success(), "{exit:?}");
    let db = Db::connect(&url, Default::default()).await.unwrap();
    let stored: Vec<String> = db
        .sessions_of_org("acme")
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.session_id)
        .collect();
    assert_eq!(acked.len(), 20);
    for s in &acked {
        assert!(stored.contains(s), "{s} acknowledged but not stored");
    }
}

#[cfg(unix)]
every_backend!(sigterm_drains_and_exits_cleanly);

/// `rush-meter export` and `period close|list` on a database filled through the store:
/// the file appears whole under its name (no `.partial` left), a closed month's file is
/// the same bytes as the open one's when nothing changed, and bad input exits 2 saying
/// which flag to fix.
async fn export_and_period_commands(backend: Backend) {
    let Some((url, _db_dir)) = fresh_database(backend).await else {
        return;
    };
    // Where the exports are written.
    let dir = tempfile::tempdir().unwrap();
    let db = Db::connect(&url, Default::default()).await.unwrap();
    db.migrate().await.unwrap();
    let nov = rush_meter_core::export::parse_month("2026-11").unwrap();
    db.upsert_org(
        &rush_meter::store::OrgUpsert {
            org_id: "acme".into(),
            name: Some("Acme".into()),
            plan_id: Some("pro".into()),
            plan_version: None,
            ..Default::default()
        },
        nov.start + 60,
        &rush_meter_core::audit::Actor::system("test"),
    )
    .await
    .unwrap();
    db.close().await;
    let base = |c: &mut Command| {
        c.env("RUSH_METER_DATABASE_URL", &url)
            .env("RUSH_METER_PLANS_DIR", common::repo_plans());
    };
    let export = |name: &str| -> (i32, String, std::path::PathBuf) {
        let out = dir.path().join(name);
        let mut c = rush_meter();
        base(&mut c);
        let (code, _, err) = run(c.args(["export", "--period", "2026-11", "--out"]).arg(&out));
        (code, err, out)
    };
    let (code, err, open) = export("open.csv");
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("open"), "{err}");
    let open = std::fs::read_to_string(open).unwrap();
    assert!(
        open.contains("\r\n2026-11-01T00:00:00Z,2026-12-01T00:00:00Z,acme,pro,"),
        "{open}"
    );
    assert!(!dir.path().join("open.csv.partial").exists());

    let mut c = rush_meter();
    base(&mut c);
    let (code, out, err) = run(c.args(["period", "close", "--period", "2026-11"]));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("closed 2026-11: 1 orgs"), "{out}");
    let (code, err, closed) = export("closed.csv");
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read_to_string(closed).unwrap(), open);
    // The count said is the lines written (the header aside), with no terminal to draw on.
    let lines = open.lines().count() - 1;
    assert!(
        lines > 0 && err.contains(&format!("{lines} rows of 2026-11 (closed)")),
        "{err}"
    );
    let mut c = rush_meter();
    base(&mut c);
    let (code, out, _) = run(c.args(["period", "list"]));
    assert_eq!(code, 0);
    assert!(out.lines().nth(1).unwrap().starts_with("2026-11,"), "{out}");

    // The audit log: the org's creation (by the test), and the service's closed month.
    let mut c = rush_meter();
    base(&mut c);
    let (code, out, err) = run(c.args(["audit", "--org", "acme"]));
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(
        out.starts_with("2026-11-01T00:01:00Z org.created acme by system (test): null -> {"),
        "{out}"
    );
    let mut c = rush_meter();
    base(&mut c);
    let (code, out, err) = run(c.args(["audit", "--json"]));
    assert_eq!(code, 0, "{err}");
    let line: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(
        (
            &line["action"],
            &line["actor"]["label"],
            &line["after"]["orgs"]
        ),
        (
            &serde_json::json!("period.closed"),
            &serde_json::json!("rush-meter period close"),
            &serde_json::json!(1)
        ),
        "{out}"
    );

    for (args, says) in [
        (vec!["audit", "--org", "not an id"], "--org"),
        (vec!["audit", "--org", "ghost"], "--org"),
        (vec!["audit", "--from", "yesterday"], "--from"),
        (vec!["export", "--period", "2026-13"], "--period"),
        (
            vec!["export", "--period", "2026-11", "--by", "team"],
            "--by",
        ),
        (
            vec!["export", "--period", "2026-11", "--format", "xlsx"],
            "--format",
        ),
        (vec!["period", "close", "--period", "2999-01"], "--period"),
    ] {
        let mut c = rush_meter();
        base(&mut c);
        let (code, _, err) = run(c.args(&args));
        assert_eq!(code, 2, "{args:?}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

every_backend!(export_and_period_commands);

/// `simulate` against a served meter: the bill matches the ledger's rules, crash tails and
/// all; told the wrong interval, it finds the bill departs from them and fails.
async fn simulate_reconciles_a_fleet_and_fails_on_a_wrong_interval(backend: Backend) {
    let Some((db, _dir)) = fresh_database(backend).await else {
        return;
    };
    let token = "simulate-admin-token-0123456789";
    let (_server, url) = common::spawn_service_with(
        &db,
        token,
        &[
            ("RUSH_METER_HEARTBEAT_INTERVAL_SECS", "1"),
            ("RUSH_METER_LEASE_SECS", "3"),
        ],
    )
    .await;
    let simulate = |interval: &str, secs: &str, extra: &[&str]| {
        let mut c = rush_meter();
        c.args([
            "simulate",
            "--heartbeat-interval-secs",
            interval,
            "--lease-secs",
            "3",
        ])
        .args([
            "--url",
            &url,
            "--token",
            token,
            "--orgs",
            "3",
            "--sessions",
            "12",
        ])
        .args(["--hosts", "2", "--duration-secs", secs, "--flush-ms", "300"])
        .args(extra);
        tokio::task::block_in_place(|| run(&mut c))
    };

    // Long enough, and crashing often enough, that turns end (and some crash) before the
    // run does: the fleet is seeded, but which slots a key's limit of 4 lets run is timing.
    let (code, out, err) = simulate("1", "10", &["--crash", "0.5", "--run", "ok"]);
    assert_eq!(code, 0, "{out}{err}");
    let total: Vec<&str> = out
        .lines()
        .find(|l| l.starts_with("total"))
        .expect("a total line")
        .split_whitespace()
        .collect();
    // total, sessions, crashed, ran, billed, diff, crash tail, late, unexplained, mismatched
    let n = |i: usize| total[i].parse::<i64>().unwrap();
    assert!(n(1) > 0 && n(3) > 0, "{out}");
    assert_eq!(n(4) - n(3), n(5), "{out}");
    assert_eq!(
        n(5),
        n(6) + n(7) + n(8),
        "the difference is taken apart: {out}"
    );
    // A crashed VM dies within an interval of its last beat, and is billed to one interval
    // past that beat: each crash adds 1 s here (interval 1 s), more only if its last beat
    // came late and was clamped later.
    assert!(n(2) > 0, "with --crash 0.5 something crashed: {out}");
    assert!(n(6) >= n(2), "at least one interval's tail a crash: {out}");
    assert_eq!((n(8), n(9)), (0, 0), "{out}");
    assert!(out.contains("heartbeats sent"), "{out}");

    // Beating every 2 s while the meter's interval is 1 s: every crashed session is
    // billed 1 s less than 2 s-interval rules say. Every turn that ends before the run
    // does (2 to 12 beats) crashes.
    let (code, out, err) = simulate("2", "12", &["--crash", "1", "--end", "0", "--run", "wrong"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("departs from the ledger's rules"), "{err}");
}

every_backend!(simulate_reconciles_a_fleet_and_fails_on_a_wrong_interval);

/// `RUSH_METER_LOG_FORMAT=json`: every line on stderr is one JSON object, and each request
/// is one `rush_meter::access` line with its status and latency, under the request's span
/// (its id, route template and org).
async fn json_logs_name_the_request_route_org_status_and_latency(backend: Backend) {
    let Some((url, _dir)) = fresh_database(backend).await else {
        return;
    };
    let token = "log-admin-token-0123456789";
    let (mut child, base, logs) = common::spawn_service_logging(&url, token, &[], "info").await;
    let client = reqwest::Client::new();
    let put = client
        .put(format!("{base}/v1/orgs/acme"))
        .bearer_auth(token)
        .json(&serde_json::json!({"name": "Acme", "plan": "pro"}))
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success());
    for (id, org, status) in [("req-json-1", "acme", 200), ("req-json-2", "nope", 404)] {
        let r = client
            .get(format!("{base}/v1/orgs/{org}/usage"))
            .bearer_auth(token)
            .header("x-request-id", id)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status);
        assert_eq!(r.headers()["x-request-id"], id);
    }
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    // The reader lets go of the lines when it reaches the end of the dead process's stderr.
    common::eventually(30, "every log line is read", || async {
        std::sync::Arc::strong_count(&logs) == 1
    })
    .await;
    let text = logs.lock().unwrap().join("\n");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    for (id, org, status) in [("req-json-1", "acme", 200), ("req-json-2", "nope", 404)] {
        let access: Vec<&serde_json::Value> = lines
            .iter()
            .filter(|l| l["target"] == "rush_meter::access" && l["span"]["request_id"] == id)
            .collect();
        assert_eq!(access.len(), 1, "one line a request: {text}");
        let l = access[0];
        assert_eq!(l["status"], status, "{l}");
        assert!(l["latency_ms"].as_f64().is_some_and(|ms| ms >= 0.0), "{l}");
        assert_eq!(l["span"]["route"], "/v1/orgs/{org_id}/usage", "{l}");
        assert_eq!(l["span"]["org_id"], org, "{l}");
        assert_eq!(l["level"], "INFO", "{l}");
    }
}

every_backend!(json_logs_name_the_request_route_org_status_and_latency);

/// `rush-meter plans list` and `plans migrate`: a dry run says what would move and moves
/// nothing; a move is in the audit log; bad flags exit 2 naming the flag. And `token create
/// --scope member` needs `--user`.
async fn plans_and_member_token_commands(backend: Backend) {
    let Some((url, _db_dir)) = fresh_database(backend).await else {
        return;
    };
    let plans = common::repo_plans_copy();
    let db = Db::connect(&url, Default::default()).await.unwrap();
    db.migrate().await.unwrap();
    let upsert = rush_meter::store::OrgUpsert {
        org_id: "acme".into(),
        plan_id: Some("pro".into()),
        ..Default::default()
    };
    let actor = rush_meter_core::audit::Actor::system("test");
    db.upsert_org(&upsert, 1, &actor).await.unwrap();
    db.close().await;
    std::fs::write(plans.path().join("pro-2.toml"), common::pro_2()).unwrap();
    let cmd = |args: &[&str]| {
        let mut c = rush_meter();
        c.env("RUSH_METER_DATABASE_URL", &url)
            .env("RUSH_METER_PLANS_DIR", plans.path());
        run(c.args(args))
    };
    let on_version = |list: &str, v: &str| -> String {
        let line = list
            .lines()
            .find(|l| l.starts_with(&format!("pro,{v},")))
            .unwrap_or_else(|| panic!("{list}"));
        line.rsplit(',').next().unwrap().to_owned()
    };
    let (code, list, err) = cmd(&["plans", "list"]);
    assert_eq!(code, 0, "{err}");
    assert!(list.starts_with("plan,version,newest,file,orgs"), "{list}");
    assert_eq!(
        (on_version(&list, "1"), on_version(&list, "2")),
        ("1".into(), "0".into())
    );

    let migrate = [
        "plans", "migrate", "--plan", "pro", "--from", "1", "--to", "2",
    ];
    let (code, out, err) = cmd(&[&migrate[..], &["--at", "now", "--dry-run"]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("acme: `pro` version 1 -> 2 at ")
            && out.contains("month room 40.0000 h -> 30.0000 h"),
        "{out}"
    );
    assert!(err.contains("would move 1 org(s)"), "{err}");
    assert_eq!(
        on_version(&cmd(&["plans", "list"]).1, "1"),
        "1",
        "a dry run moved"
    );
    let (code, _, err) = cmd(&[&migrate[..], &["--at", "tomorrow"]].concat());
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--at: `tomorrow` is not `renewal`"), "{err}");
    let (code, _, err) = cmd(&[
        "plans", "migrate", "--plan", "pro", "--from", "1", "--to", "9", "--at", "now",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--to: `pro` has no version 9; its versions are 1, 2"),
        "{err}"
    );
    let (code, out, err) = cmd(&[&migrate[..], &["--at", "now", "--json"]].concat());
    assert_eq!(code, 0, "{err}");
    let moved: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (moved["org_id"].as_str(), moved["to_version"].as_i64()),
        (Some("acme"), Some(2))
    );
    assert_eq!(on_version(&cmd(&["plans", "list"]).1, "2"), "1");
    let (_, log, _) = cmd(&["audit", "--org", "acme"]);
    assert!(
        log.contains("plan_version.moved") && log.contains("rush-meter plans migrate"),
        "{log}"
    );

    let (code, _, err) = cmd(&["token", "create", "--scope", "member", "--org", "acme"]);
    assert_eq!(code, 2);
    assert!(err.contains("--user"), "{err}");
    let (code, secret, err) = cmd(&[
        "token", "create", "--scope", "member", "--org", "acme", "--user", "ann",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(secret.trim().starts_with("rm_"), "{secret}");
    let (_, list, _) = cmd(&["token", "list", "--org", "acme"]);
    assert!(
        list.lines()
            .any(|l| l.contains(",member,acme,") && l.ends_with(",ann")),
        "{list}"
    );
}

every_backend!(plans_and_member_token_commands);
