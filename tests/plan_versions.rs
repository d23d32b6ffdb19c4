//! Plan versions: an org keeps the version it is on (its hours, ceilings and prices) until
//! an operator moves it; new orgs get the newest; a recorded version never changes under
//! its orgs (the service refuses to start); moves are scheduled, audited, and previewed.

mod common;

use std::path::Path;

use common::{
    config_of, hb, pro_2, repo_plans_copy as repo_copy, Backend, Options, TestServer, ADMIN, T0,
};
use rush_meter::app::App;
use rush_meter::clock::Clock;
use serde_json::{json, Value};

fn on(plans: &Path) -> Options {
    Options {
        plans_dir: plans.to_path_buf(),
        ..Options::default()
    }
}

/// `org`'s plan, version and month ceiling as its usage page says them.
async fn terms(srv: &TestServer, org: &str) -> (String, i64, i64) {
    let u = srv.usage(org).await;
    (
        u["plan"].as_str().unwrap().to_owned(),
        u["plan_version"].as_i64().unwrap(),
        u["month"]["limit_seconds"].as_i64().unwrap(),
    )
}

/// The error a start on `plans` stops with.
async fn refused_start(srv: &TestServer, plans: &Path) -> String {
    let config = config_of(&srv.database_url, &on(plans));
    match App::start(&config, Clock::manual(srv.clock.now())).await {
        Ok(_) => panic!("started on edited plans"),
        Err(e) => e.to_string(),
    }
}

const H: i64 = 3600;

/// Forget every recorded version, as a database of a release before versions has none
/// (on a connection of its own: the server is stopped).
async fn forget_recorded(srv: &TestServer) {
    let sql = "DELETE FROM plan_versions";
    let db = rush_meter::store::Db::connect(&srv.database_url, Default::default())
        .await
        .unwrap();
    match db.pools() {
        rush_meter::store::Pools::Postgres(p) => sqlx::query(sql).execute(p).await.map(drop),
        rush_meter::store::Pools::Sqlite { write, .. } => {
            sqlx::query(sql).execute(write).await.map(drop)
        }
    }
    .unwrap();
    db.close().await;
}

every_backend! {
    async fn an_org_keeps_its_version_and_new_orgs_get_the_newest(backend: Backend) {
        let plans = repo_copy();
        let Some(srv) = TestServer::start_with(backend, on(plans.path())).await else { return };
        srv.create_org("old", "pro").await;
        assert_eq!(terms(&srv, "old").await, ("pro".into(), 1, 40 * H));

        std::fs::write(plans.path().join("pro-2.toml"), pro_2()).unwrap();
        let srv = srv.restart(on(plans.path())).await;
        srv.create_org("new", "pro").await;
        assert_eq!(terms(&srv, "old").await, ("pro".into(), 1, 40 * H), "kept");
        assert_eq!(terms(&srv, "new").await, ("pro".into(), 2, 30 * H), "the newest");
        // A plan set again is the plan kept; another plan starts at its newest.
        srv.admin("PUT", "/v1/orgs/old", Some(json!({"plan": "pro"}))).await;
        assert_eq!(terms(&srv, "old").await.1, 1);
        for org in ["old", "new"] {
            srv.admin("PUT", &format!("/v1/orgs/{org}/keys/k1"), Some(json!({}))).await;
        }
        let d = srv.admit("old", "k1", "s1").await;
        assert_eq!((d["plan"].as_str(), d["plan_version"].as_i64()), (Some("pro"), Some(1)), "{d}");
        assert_eq!(d["usage"]["month"]["limit_seconds"].as_i64(), Some(40 * H), "{d}");
        let d = srv.admit("new", "k1", "s1").await;
        assert_eq!(d["plan_version"].as_i64(), Some(2), "{d}");
        let listed = srv.admin("GET", "/v1/orgs/old/decisions", None).await;
        assert_eq!(listed["decisions"][0]["plan_version"].as_i64(), Some(1), "{listed}");
        let o = srv.admin("GET", "/v1/orgs/new", None).await;
        assert_eq!((o["plan_version"].as_i64(), &o["moving"]), (Some(2), &Value::Null), "{o}");

        let versions = srv.admin("GET", "/v1/plans", None).await;
        let pro: Vec<(i64, bool, i64)> = versions
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v["id"] == "pro")
            .map(|v| (v["version"].as_i64().unwrap(), v["newest"].as_bool().unwrap(), v["orgs"].as_i64().unwrap()))
            .collect();
        assert_eq!(pro, [(1, false, 1), (2, true, 1)]);
        let mut srv = srv;
        srv.stop().await;

        // An edited version is refused, naming the file and what changed; so is a version
        // gone while an org is on it. Nothing was recorded by either try.
        let v1 = std::fs::read_to_string(plans.path().join("pro.toml")).unwrap();
        std::fs::write(plans.path().join("pro.toml"), v1.replace("monthly_agent_hours = 40", "monthly_agent_hours = 35")).unwrap();
        let e = refused_start(&srv, plans.path()).await;
        assert!(e.contains("pro.toml") && e.contains("monthly_agent_hours: `40` recorded, `35` now") && e.contains("version = 3"), "{e}");
        std::fs::write(plans.path().join("pro.toml"), &v1).unwrap();
        std::fs::remove_file(plans.path().join("pro-2.toml")).unwrap();
        let e = refused_start(&srv, plans.path()).await;
        assert!(e.contains("pro-2.toml") && e.contains("1 org(s)"), "{e}");
        // Comments and layout are not terms.
        std::fs::write(plans.path().join("pro-2.toml"), format!("# the second Pro\n{}", pro_2().replace("price = \"20.00\"", "price = 20"))).unwrap();
        let mut srv = srv.restart(on(plans.path())).await;
        assert_eq!(terms(&srv, "new").await, ("pro".into(), 2, 30 * H));
        srv.stop().await;

        // A database of an older release recorded no version: its orgs are on version 1
        // all the same, and a start whose files have no version 1 of their plan is refused.
        forget_recorded(&srv).await;
        std::fs::remove_file(plans.path().join("pro.toml")).unwrap();
        let e = refused_start(&srv, plans.path()).await;
        assert!(e.contains("`pro` version 1 is not in the plan files, and 1 org(s)"), "{e}");
    }

    async fn orgs_move_between_versions_when_told(backend: Backend) {
        let plans = repo_copy();
        let Some(srv) = TestServer::start_with(backend, on(plans.path())).await else { return };
        for org in ["a", "b", "c"] {
            srv.create_org(org, "pro").await;
        }
        srv.admin("PUT", "/v1/orgs/a/keys/k1", Some(json!({}))).await;
        srv.admit("a", "k1", "s1").await;
        for (i, t) in (0..=600).step_by(15).enumerate() {
            srv.clock.set(T0 + t);
            let (status, v) = srv.heartbeats(vec![hb("a", "s1", i as i64 + 1, "running", T0 + t)]).await;
            assert_eq!(status, 200, "{v}");
        }
        std::fs::write(plans.path().join("pro-2.toml"), pro_2()).unwrap();
        let srv = srv.restart(on(plans.path())).await;
        let migrate = |body: Value| {
            let srv = &srv;
            async move { srv.call("POST", "/v1/plans/pro/migrations", Some(ADMIN), Some(&body)).await }
        };

        // Bad requests name what to fix and change nothing.
        let console = srv.token(&[rush_meter::tokens::Scope::Console], Some("a")).await;
        let before = srv.db.digest().await.unwrap();
        for (body, field) in [
            (json!({"from": 1, "to": 9, "at": "now"}), "to"),
            (json!({"from": 1, "to": 2, "at": "tomorrow"}), "at"),
            (json!({"from": 2, "to": 1, "at": "now", "org_id": "a"}), "org_id"),
            (json!({"from": 1, "to": 2, "at": "now", "org_id": "a b"}), "org_id"),
        ] {
            let (status, v) = migrate(body.clone()).await;
            assert_eq!((status, v["error"]["field"].as_str()), (422, Some(field)), "{body}: {v}");
        }
        let (status, v) = srv.call("POST", "/v1/plans/gold/migrations", Some(ADMIN), Some(&json!({"from": 1, "to": 2, "at": "now"}))).await;
        assert_eq!((status, v["error"]["field"].as_str()), (422, Some("plan")), "{v}");
        let (status, _) = srv.call("POST", "/v1/plans/pro/migrations", Some(&console), Some(&json!({"from": 1, "to": 2, "at": "now"}))).await;
        assert_eq!(status, 403);
        // A dry run lists every org on version 1 and its room on both, and moves nothing.
        let (status, dry) = migrate(json!({"from": 1, "to": 2, "at": "now", "dry_run": true})).await;
        assert_eq!(status, 200, "{dry}");
        assert_eq!(srv.db.digest().await.unwrap(), before, "a dry run wrote");
        let moves = dry["moves"].as_array().unwrap();
        let ids: Vec<&str> = moves.iter().map(|m| m["org_id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["a", "b", "c"]);
        assert_eq!(
            (moves[0]["month_used_seconds"].as_i64(), moves[0]["month_remaining_seconds_before"].as_i64(), moves[0]["month_remaining_seconds_after"].as_i64()),
            (Some(600), Some(40 * H - 600), Some(30 * H - 600)),
            "{dry}"
        );
        assert_eq!(moves[0]["week_remaining_seconds_after"].as_i64(), Some(12 * H - 600));

        // `a` now: its next decision and page are on version 2, its use carried over.
        let (status, v) = migrate(json!({"from": 1, "to": 2, "at": "now", "org_id": "a"})).await;
        assert_eq!((status, v["moves"].as_array().map(Vec::len)), (200, Some(1)), "{v}");
        let u = srv.usage("a").await;
        assert_eq!((u["plan_version"].as_i64(), u["month"]["used_seconds"].as_i64(), u["month"]["remaining_seconds"].as_i64()), (Some(2), Some(600), Some(30 * H - 600)), "{u}");
        let d = srv.admit("a", "k1", "s2").await;
        assert_eq!(d["plan_version"].as_i64(), Some(2), "{d}");
        // The rest at renewal: version 1 until the month ends (T0 is 2026-11-30), then 2.
        let (status, v) = migrate(json!({"from": 1, "to": 2, "at": "renewal"})).await;
        assert_eq!(status, 200, "{v}");
        let ids: Vec<(&str, &str)> = v["moves"].as_array().unwrap().iter().map(|m| (m["org_id"].as_str().unwrap(), m["at"].as_str().unwrap())).collect();
        assert_eq!(ids, [("b", "2026-12-01T00:00:00Z"), ("c", "2026-12-01T00:00:00Z")]);
        let o = srv.admin("GET", "/v1/orgs/b", None).await;
        assert_eq!((o["plan_version"].as_i64(), &o["moving"]), (Some(1), &json!({"to_version": 2, "at": "2026-12-01T00:00:00Z"})), "{o}");
        assert_eq!(terms(&srv, "b").await.1, 1);
        // `c`'s move called off (a move to the version it is on).
        let (status, _) = migrate(json!({"from": 1, "to": 1, "at": "now", "org_id": "c"})).await;
        assert_eq!(status, 200);
        let t = rush_meter_core::time::rfc3339::parse("2026-12-01T00:00:00Z").unwrap();
        srv.clock.set(t);
        assert_eq!(terms(&srv, "b").await, ("pro".into(), 2, 30 * H), "moved at renewal");
        assert_eq!(terms(&srv, "c").await.1, 1, "called off");
        // November ran on version 1 for `b`: closed, it is billed so, though `b` is on 2 now.
        srv.clock.set(t + 3600);
        srv.admin("POST", "/v1/periods/2026-11/close", None).await;
        let (status, _, body) = srv
            .get_text("/v1/exports/usage?period=2026-11&format=jsonl", "rush-period-state")
            .await;
        assert_eq!(status, 200, "{body}");
        let b_line: Value = body
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .find(|v| v["org_id"] == "b")
            .unwrap_or_else(|| panic!("{body}"));
        assert_eq!(
            (b_line["plan_version"].as_i64(), b_line["included_hours"].as_str()),
            (Some(1), Some("40.0000")),
            "{b_line}"
        );

        // Each move is in the audit log, with who made it.
        let log = srv.admin("GET", "/v1/orgs/a/audit", None).await;
        let moved: Vec<&Value> = log["entries"].as_array().unwrap().iter().filter(|e| e["action"] == "plan_version.moved").collect();
        assert_eq!(moved.len(), 1, "{log}");
        assert_eq!((moved[0]["before"]["plan_version"].as_i64(), moved[0]["after"]["plan_version"].as_i64()), (Some(1), Some(2)));
        assert_eq!(moved[0]["actor"]["kind"], "token", "{}", moved[0]);
        let log = srv.admin("GET", "/v1/orgs/c/audit", None).await;
        let c: Vec<&Value> = log["entries"].as_array().unwrap().iter().filter(|e| e["action"] == "plan_version.moved").collect();
        assert_eq!(c.len(), 2, "scheduled, then called off: {log}");
        assert_eq!(c[1]["after"]["moving_to_version"], Value::Null);
    }
}
