//! Limits inside an org (docs/limits.md), over HTTP on SQLite and PostgreSQL: set, listed
//! with their members' use, kept by the gate and by heartbeat answers within the stated
//! bound (on one instance and on two), and every bad input refused in the error format,
//! changing nothing.

mod common;

use common::*;
use rush_meter::tokens::Scope;
use serde_json::{json, Value};

/// `acme` on `mini` (180 s a week, 30 s of grace) with key `k1`, and a grant of ten hours
/// so that the org itself never runs out: what stops its sessions is a limit.
async fn setup(srv: &TestServer) {
    srv.create_org("acme", "mini").await;
    srv.admin("PUT", "/v1/orgs/acme/keys/k1", Some(json!({})))
        .await;
    let (status, v) = srv
        .call(
            "POST",
            "/v1/orgs/acme/grants",
            Some(ADMIN),
            Some(&json!({"seconds": 36_000, "kind": "promo"})),
        )
        .await;
    assert_eq!(status, 201, "{v}");
}

/// A server on the mini plans with `setup` done and its clock at T0; the plans' directory
/// is kept beside it. None where PostgreSQL is not here (outside CI).
async fn acme_at_t0(backend: Backend) -> Option<(tempfile::TempDir, TestServer)> {
    let plans = mini_plans();
    let srv = start_with_plans(backend, plans.path()).await?;
    setup(&srv).await;
    srv.clock.set(T0);
    Some((plans, srv))
}

/// An admission of `session` for `project` and `user`.
async fn admit_as(srv: &TestServer, session: &str, project: &str, user: &str) -> Value {
    let body = json!({"org_id": "acme", "key_id": "k1", "session_id": session,
        "agent": "codex", "project_id": project, "started_by": user});
    let (status, v) = srv
        .call("POST", "/v1/admissions", Some(ADMIN), Some(&body))
        .await;
    assert_eq!(status, 200, "{v}");
    v
}

async fn put_limit(srv: &TestServer, path: &str, body: Value) -> Value {
    let (status, v) = srv
        .call(
            "PUT",
            &format!("/v1/orgs/acme/limits/{path}"),
            Some(ADMIN),
            Some(&body),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    v
}

async fn limits(srv: &TestServer) -> Vec<Value> {
    srv.admin("GET", "/v1/orgs/acme/limits", None).await["limits"]
        .as_array()
        .unwrap()
        .clone()
}

/// A listed limit's member as `kind/member_id`.
fn member_name(l: &Value) -> String {
    format!(
        "{}/{}",
        l["kind"].as_str().unwrap(),
        l["member_id"].as_str().unwrap()
    )
}

/// `n` sessions of project `web`, each beating every 15 s at its own offset and parking as
/// soon as an answer says so, through `servers` in turn. Returns the least
/// `remaining_seconds` an answer gave while all ran.
async fn run_into_the_limit(servers: &[&TestServer], n: usize) -> i64 {
    let srv = servers[0];
    let sessions: Vec<String> = (0..n).map(|i| format!("s{i}")).collect();
    for (i, s) in sessions.iter().enumerate() {
        let d = admit_as(srv, s, "web", &format!("u{i}")).await;
        assert_eq!(d["decision"], "allow", "{d}");
    }
    let run = common::run_staggered_until_parked(servers, "acme", &sessions).await;
    assert_eq!(run.told, n);
    run.least_remaining
}

/// The bound (docs/limits.md): a member passes its limit by at most the plan's grace plus
/// two intervals a session running then, as the org passes its ceilings.
fn assert_the_limit_holds(web: &Value, n: i64) {
    let used = web["week"]["used_seconds"].as_i64().unwrap();
    let limit = 36;
    let bound = 30 + n * 2 * 15;
    assert!(used >= limit + 30, "parked before the grace ran: {web}");
    assert!(
        used - limit <= bound,
        "{} s past the limit, beyond the bound of {bound} s: {web}",
        used - limit
    );
    assert_eq!(web["spent"], true, "{web}");
    assert_eq!(web["week"]["remaining_seconds"], 0, "{web}");
    eprintln!(
        "{n} sessions: {} s past a limit of {limit} s (bound {bound} s)",
        used - limit
    );
}

/// A spent limit refuses its member's runs, with the figures, and parks its sessions;
/// other members of the org run on.
async fn a_member_past_its_limit_is_refused_and_parked_within_the_bound(backend: Backend) {
    let Some((_plans, srv)) = acme_at_t0(backend).await else {
        return;
    };
    let web = put_limit(&srv, "project/web", json!({"weekly_hours": "0.01"})).await;
    assert_eq!(
        (
            &web["week"]["limit_seconds"],
            &web["month"]["limit_seconds"],
            &web["spent"]
        ),
        (&json!(36), &Value::Null, &json!(false)),
        "{web}"
    );
    let least = run_into_the_limit(&[&srv], 8).await;
    assert_eq!(
        least, 0,
        "answers counted down the member's room, not the org's"
    );
    let web = limits(&srv).await.remove(0);
    assert_the_limit_holds(&web, 8);
    let d = admit_as(&srv, "late", "web", "u1").await;
    assert_eq!(
        (
            d["decision"].as_str(),
            d["reason"].as_str(),
            d["rule"].as_str()
        ),
        (
            Some("deny"),
            Some("project_ceiling_reached"),
            Some("project_ceiling_reached")
        ),
        "{d}"
    );
    assert_eq!(
        (
            &d["limit"]["kind"],
            &d["limit"]["member_id"],
            &d["limit"]["week_limit_seconds"]
        ),
        (&json!("project"), &json!("web"), &json!(36)),
        "{d}"
    );
    assert_eq!(
        d["limit"]["week_used_seconds"], web["week"]["used_seconds"],
        "{d}"
    );
    // A resume of a session of web that leaves out its project and user runs as web, and
    // is refused by web's limit.
    let resume = json!({"org_id": "acme", "key_id": "k1", "session_id": "s0", "agent": "codex"});
    let (status, r) = srv
        .call("POST", "/v1/admissions", Some(ADMIN), Some(&resume))
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(
        (r["decision"].as_str(), r["reason"].as_str()),
        (Some("deny"), Some("project_ceiling_reached")),
        "{r}"
    );
    // A denial consumes nothing (DESIGN.md): no session, no slot of the key.
    assert!(srv.db.get_session("acme", "late").await.unwrap().is_none());
    assert_eq!(d["concurrency"]["running"], 0, "{d}");
    // The record says the same.
    let page = srv
        .admin("GET", "/v1/orgs/acme/decisions?decision=deny", None)
        .await;
    assert_eq!(page["decisions"][0]["limit"], d["limit"]);
    // Another project of the org runs; so does web once its limit is lifted.
    assert_eq!(
        admit_as(&srv, "api1", "api", "u1").await["decision"],
        "allow"
    );
    let (status, _) = srv
        .call(
            "DELETE",
            "/v1/orgs/acme/limits/project/web",
            Some(ADMIN),
            None,
        )
        .await;
    assert_eq!(status, 204);
    assert_eq!(
        admit_as(&srv, "late", "web", "u1").await["decision"],
        "allow"
    );
}

/// A user's limit and a key's apply to every project: the first spent one decides.
async fn user_and_key_limits_apply_across_projects(backend: Backend) {
    let Some((_plans, srv)) = acme_at_t0(backend).await else {
        return;
    };
    put_limit(&srv, "user/ann", json!({"monthly_hours": "0.005"})).await;
    put_limit(
        &srv,
        "key/k1",
        json!({"monthly_hours": "0.01", "weekly_hours": "1"}),
    )
    .await;
    assert_eq!(
        admit_as(&srv, "a1", "web", "ann").await["decision"],
        "allow"
    );
    for (i, t) in [T0, T0 + 15, T0 + 30].into_iter().enumerate() {
        srv.clock.set(t);
        let (status, _) = srv
            .heartbeats(vec![hb("acme", "a1", i as i64 + 1, "running", t)])
            .await;
        assert_eq!(status, 200);
    }
    // Ann has run 30 s of her 18: refused on any project; Bob is not.
    let d = admit_as(&srv, "a2", "api", "ann").await;
    assert_eq!(d["reason"], "user_ceiling_reached", "{d}");
    assert_eq!(d["limit"]["month_used_seconds"], 30, "{d}");
    assert_eq!(
        admit_as(&srv, "b1", "api", "bob").await["decision"],
        "allow"
    );
    for (i, t) in [T0 + 45].into_iter().enumerate() {
        srv.clock.set(t);
        let (status, _) = srv
            .heartbeats(vec![
                hb("acme", "a1", 4 + i as i64, "parked", t),
                hb("acme", "b1", 1 + i as i64, "running", t),
            ])
            .await;
        assert_eq!(status, 200);
    }
    // The key has run 45 s of its 36 a month.
    let d = admit_as(&srv, "b2", "api", "bob").await;
    assert_eq!(d["reason"], "key_ceiling_reached", "{d}");
    let listed = limits(&srv).await;
    let used: Vec<(&str, &str, i64)> = listed
        .iter()
        .map(|l| {
            (
                l["kind"].as_str().unwrap(),
                l["member_id"].as_str().unwrap(),
                l["month"]["used_seconds"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(used, [("key", "k1", 45), ("user", "ann", 45)]);
}

/// Running sessions count up to now for each of their members (key, project and user),
/// in the listing and at the gate: two sessions of one key, of two projects and two users,
/// heard at T0 and read 10 s later.
async fn running_sessions_count_for_each_of_their_members(backend: Backend) {
    let Some((_plans, srv)) = acme_at_t0(backend).await else {
        return;
    };
    put_limit(&srv, "key/k1", json!({"monthly_hours": "1"})).await;
    put_limit(&srv, "project/web", json!({"monthly_hours": "1"})).await;
    put_limit(&srv, "user/bob", json!({"monthly_hours": "1"})).await;
    // 9 s: spent by 10 s of running.
    put_limit(&srv, "user/ann", json!({"monthly_hours": "0.0025"})).await;
    admit_as(&srv, "a1", "web", "ann").await;
    admit_as(&srv, "b1", "api", "bob").await;
    let (status, _) = srv
        .heartbeats(vec![
            hb("acme", "a1", 1, "running", T0),
            hb("acme", "b1", 1, "running", T0),
        ])
        .await;
    assert_eq!(status, 200);
    srv.clock.set(T0 + 10);
    let used: Vec<(String, i64)> = limits(&srv)
        .await
        .iter()
        .map(|l| (member_name(l), l["month"]["used_seconds"].as_i64().unwrap()))
        .collect();
    let want = [
        ("key/k1", 20),
        ("project/web", 10),
        ("user/ann", 10),
        ("user/bob", 10),
    ];
    let want: Vec<(String, i64)> = want.iter().map(|(m, s)| (m.to_string(), *s)).collect();
    assert_eq!(used, want);
    let d = admit_as(&srv, "a2", "api", "ann").await;
    assert_eq!(d["reason"], "user_ceiling_reached", "{d}");
    assert_eq!(d["limit"]["month_used_seconds"], 10, "{d}");
    assert_eq!(
        admit_as(&srv, "b2", "web", "bob").await["decision"],
        "allow"
    );
}

/// Set, listed, changed and removed; the windows are the org's.
async fn limits_round_trip(srv: TestServer) {
    srv.create_org("acme", "team").await;
    let v = put_limit(
        &srv,
        "user/ann",
        json!({"monthly_hours": "40", "weekly_hours": "12.5"}),
    )
    .await;
    assert_eq!(
        (
            &v["kind"],
            &v["member_id"],
            &v["monthly_hours"],
            &v["weekly_hours"]
        ),
        (&json!("user"), &json!("ann"), &json!("40"), &json!("12.5")),
        "{v}"
    );
    assert_eq!(
        (&v["month"]["limit_seconds"], &v["week"]["limit_seconds"]),
        (&json!(144_000), &json!(45_000))
    );
    assert_eq!(
        (
            &v["month"]["used_seconds"],
            &v["month"]["remaining_seconds"]
        ),
        (&json!(0), &json!(144_000))
    );
    let usage = srv.usage("acme").await;
    assert_eq!(
        (&v["month"]["start"], &v["week"]["start"]),
        (&usage["month"]["start"], &usage["week"]["start"])
    );
    let v = put_limit(&srv, "user/ann", json!({"weekly_hours": "10"})).await;
    assert_eq!(
        (&v["monthly_hours"], &v["weekly_hours"]),
        (&Value::Null, &json!("10")),
        "{v}"
    );
    put_limit(&srv, "project/web", json!({"monthly_hours": "100"})).await;
    let names: Vec<String> = limits(&srv).await.iter().map(member_name).collect();
    assert_eq!(names, ["project/web", "user/ann"]);
    // The org's console sets its own; finance reads.
    let console = srv.token(&[Scope::Console], Some("acme")).await;
    let (status, v) = srv
        .call(
            "PUT",
            "/v1/orgs/acme/limits/key/k9",
            Some(&console),
            Some(&json!({"weekly_hours": "2"})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let finance = srv.token(&[Scope::Finance], None).await;
    let (status, v) = srv
        .call("GET", "/v1/orgs/acme/limits", Some(&finance), None)
        .await;
    assert_eq!(
        (status, v["limits"].as_array().unwrap().len()),
        (200, 3),
        "{v}"
    );
    let (status, _) = srv
        .call(
            "DELETE",
            "/v1/orgs/acme/limits/user/ann",
            Some(&console),
            None,
        )
        .await;
    assert_eq!(status, 204);
    let (status, v) = srv
        .call(
            "DELETE",
            "/v1/orgs/acme/limits/user/ann",
            Some(&console),
            None,
        )
        .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (404, Some("not_found")),
        "{v}"
    );
    // The org's row says whether it limits anyone (the gate reads limits only then), until
    // its last limit goes.
    let sets = || async { srv.db.get_org("acme").await.unwrap().unwrap().sets_limits };
    assert!(sets().await);
    for member in ["project/web", "key/k9"] {
        let (status, _) = srv
            .call(
                "DELETE",
                &format!("/v1/orgs/acme/limits/{member}"),
                Some(ADMIN),
                None,
            )
            .await;
        assert_eq!(status, 204);
    }
    assert!(!sets().await);
    put_limit(&srv, "user/bob", json!({"weekly_hours": "1"})).await;
    assert!(sets().await);
}

/// Every bad input gets the error format, naming what to fix, and changes nothing.
async fn bad_limits_are_refused_and_change_nothing(srv: TestServer) {
    srv.create_org("acme", "team").await;
    put_limit(&srv, "user/ann", json!({"monthly_hours": "40"})).await;
    let before = srv.db.digest().await.unwrap();
    let cases: Vec<(&str, &str, Option<Value>, u16, &str)> = vec![
        (
            "PUT",
            "/v1/orgs/acme/limits/team/ann",
            Some(json!({"monthly_hours": "1"})),
            422,
            "kind",
        ),
        ("DELETE", "/v1/orgs/acme/limits/team/ann", None, 422, "kind"),
        (
            "PUT",
            "/v1/orgs/acme/limits/user/ann",
            Some(json!({"monthly_hours": "-1"})),
            422,
            "monthly_hours",
        ),
        (
            "PUT",
            "/v1/orgs/acme/limits/user/ann",
            Some(json!({"weekly_hours": "lots"})),
            422,
            "weekly_hours",
        ),
        (
            "PUT",
            "/v1/orgs/acme/limits/user/ann",
            Some(json!({"weekly_hours": "100001"})),
            422,
            "weekly_hours",
        ),
        (
            "PUT",
            "/v1/orgs/acme/limits/user/ann",
            Some(json!({"weekly_hours": "0.00001"})),
            422,
            "weekly_hours",
        ),
        (
            "PUT",
            "/v1/orgs/acme/limits/user/ann",
            Some(json!({"monthly_hours": null, "weekly_hours": null})),
            422,
            "monthly_hours",
        ),
        (
            "PUT",
            "/v1/orgs/acme/limits/user/ann",
            Some(json!({"monthly_hours": 40})),
            400,
            "monthly_hours",
        ),
        (
            "PUT",
            "/v1/orgs/acme/limits/user/not%20an%20id",
            Some(json!({"monthly_hours": "1"})),
            422,
            "member_id",
        ),
        (
            "PUT",
            "/v1/orgs/ghost/limits/user/ann",
            Some(json!({"monthly_hours": "1"})),
            404,
            "",
        ),
        ("DELETE", "/v1/orgs/acme/limits/user/bob", None, 404, ""),
    ];
    for (method, path, body, want, field) in cases {
        let (status, v) = srv.call(method, path, Some(ADMIN), body.as_ref()).await;
        assert_eq!(status, want, "{method} {path} {body:?}: {v}");
        let code = v["error"]["code"]
            .as_str()
            .unwrap_or_else(|| panic!("not the error format: {v}"));
        let want_code = match want {
            422 => "invalid_value",
            // Hours travel as decimal strings: a number is the wrong type.
            400 => "malformed_body",
            _ => code,
        };
        if want != 404 {
            assert_eq!(
                (code, v["error"]["field"].as_str()),
                (want_code, Some(field)),
                "{method} {path}: {v}"
            );
        }
        assert!(!v["error"]["message"].as_str().unwrap().is_empty());
    }
    assert_eq!(
        srv.db.digest().await.unwrap(),
        before,
        "a refused request wrote something"
    );
    assert_eq!(limits(&srv).await[0]["monthly_hours"], "40");
}

/// Rename the limits' table away: every read of a limited org's room fails from now on,
/// while bookings (which read no limit) go on.
async fn break_the_limits_table(srv: &TestServer) {
    let sql = "ALTER TABLE member_limits RENAME TO member_limits_gone";
    match srv.db.pools() {
        rush_meter::store::Pools::Postgres(pool) => {
            sqlx::query(sql).execute(pool).await.unwrap();
        }
        rush_meter::store::Pools::Sqlite { write, .. } => {
            sqlx::query(sql).execute(write).await.unwrap();
        }
    }
}

/// Heartbeats committed before their answers' read of the org's room fails are answered,
/// once: 200, not duplicates, their time booked, the answer from the room last read. (A
/// failed group's jobs are committed again one by one: they would be told `duplicate` for
/// what their own group booked, or be refused what was kept.)
async fn heartbeats_committed_are_answered_when_the_room_cannot_be_read(backend: Backend) {
    let Some((_plans, srv)) = acme_at_t0(backend).await else {
        return;
    };
    put_limit(&srv, "project/web", json!({"weekly_hours": "1"})).await;
    for s in ["s1", "s2"] {
        assert_eq!(admit_as(&srv, s, "web", "u1").await["decision"], "allow");
    }
    let beats = |seq: i64, at: rush_meter_core::time::Secs| {
        vec![
            hb("acme", "s1", seq, "running", at),
            hb("acme", "s2", seq, "running", at),
        ]
    };
    let (status, first) = srv.heartbeats(beats(1, T0)).await;
    assert_eq!(status, 200, "{first}");
    break_the_limits_table(&srv).await;
    // Past the answers' reuse (2 s of meter time): the group reads the room again, and fails.
    srv.clock.set(T0 + 15);
    let (status, v) = srv.heartbeats(beats(2, T0 + 15)).await;
    assert_eq!(status, 200, "{v}");
    for (i, s) in ["s1", "s2"].iter().enumerate() {
        let r = &v["results"][i];
        assert_eq!(
            (&r["accepted"], &r["duplicate"]),
            (&json!(true), &json!(false)),
            "{v}"
        );
        assert_eq!(r["action"], first["results"][i]["action"], "{v}");
        let session = srv.db.get_session("acme", s).await.unwrap().unwrap();
        assert_eq!(session.ledger.billed_seconds, 15, "{s}");
    }
}

every_backend!(
    heartbeats_committed_are_answered_when_the_room_cannot_be_read,
    a_member_past_its_limit_is_refused_and_parked_within_the_bound,
    user_and_key_limits_apply_across_projects,
    running_sessions_count_for_each_of_their_members,
    limits_round_trip,
    bad_limits_are_refused_and_change_nothing
);

/// Two instances on one PostgreSQL hold a member's limit between them, as one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_hold_a_limit_between_them() {
    let dir = mini_plans();
    let Some((a, b)) = two_instances(dir.path()).await else {
        return;
    };
    setup(&a).await;
    a.clock.set(T0);
    b.clock.set(T0);
    put_limit(&b, "project/web", json!({"weekly_hours": "0.01"})).await;
    run_into_the_limit(&[&a, &b], 8).await;
    let web = limits(&a).await.remove(0);
    assert_the_limit_holds(&web, 8);
    let d = admit_as(&b, "late", "web", "u1").await;
    assert_eq!(d["reason"], "project_ceiling_reached", "{d}");
    b.finish().await;
    a.finish().await;
}
