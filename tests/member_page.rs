//! A Team member's own page: a member token (bound to an org and a user) reads the user's
//! use, limits, time left and sessions, equal to the user's row of the org's breakdown, and
//! nothing else; making one is checked like any token.

mod common;

use common::{hb, TestServer, ADMIN, T0};
use serde_json::{json, Value};

/// `acme` on Team: ann's s1 runs 50 minutes from T0 and parks, ann's s3 runs from T0 + 30
/// min and is still running, bob's s2 runs 20 minutes; ann may use 2 hours a month.
async fn seed(srv: &TestServer) {
    srv.create_org("acme", "team").await;
    srv.admin("PUT", "/v1/orgs/acme/keys/k1", Some(json!({})))
        .await;
    for (session, user) in [("s1", "ann"), ("s2", "bob"), ("s3", "ann")] {
        srv.admin("POST", "/v1/admissions", Some(json!({"org_id": "acme", "key_id": "k1", "session_id": session, "agent": "codex", "started_by": user}))).await;
    }
    srv.admin(
        "PUT",
        "/v1/orgs/acme/limits/user/ann",
        Some(json!({"monthly_hours": "2"})),
    )
    .await;
    let mut seq = std::collections::HashMap::new();
    for t in (0..=5400).step_by(15) {
        srv.clock.set(T0 + t);
        let mut beats = Vec::new();
        for (session, from, to) in [("s1", 0, 3000), ("s2", 0, 1200), ("s3", 1800, 5400)] {
            if (from..=to).contains(&t) {
                let n = seq.entry(session).or_insert(0);
                *n += 1;
                let state = if session != "s3" && t == to {
                    "parked"
                } else {
                    "running"
                };
                beats.push(hb("acme", session, *n, state, T0 + t));
            }
        }
        let (status, v) = srv.heartbeats(beats).await;
        assert_eq!(status, 200, "{v}");
    }
    srv.clock.set(T0 + 5410);
}

/// A member token made over the API.
async fn member_token(srv: &TestServer, user: &str) -> (String, String) {
    let t = srv
        .admin(
            "POST",
            "/v1/tokens",
            Some(json!({"scopes": ["member"], "org_id": "acme", "user_id": user, "label": user})),
        )
        .await;
    assert_eq!(
        (t["user_id"].as_str(), t["org_id"].as_str()),
        (Some(user), Some("acme")),
        "{t}"
    );
    (
        t["secret"].as_str().unwrap().to_owned(),
        t["token_id"].as_str().unwrap().to_owned(),
    )
}

every_backend! {
    async fn a_member_sees_their_own_hours_and_nothing_else(srv: TestServer) {
        seed(&srv).await;
        let (ann, ann_id) = member_token(&srv, "ann").await;
        let (status, v) = srv.call("GET", "/v1/me/usage", Some(&ann), None).await;
        assert_eq!(status, 200, "{v}");
        // ann: s1's 3,000 s, s3's 3,600 s booked and its 10 s since the last beat.
        let used = 3000 + 3600 + 10;
        assert_eq!((v["user_id"].as_str(), v["plan"].as_str(), v["plan_version"].as_i64()), (Some("ann"), Some("team"), Some(1)), "{v}");
        assert_eq!((v["month"]["used_seconds"].as_i64(), v["week"]["used_seconds"].as_i64()), (Some(used), Some(used)), "{v}");
        assert_eq!((v["month"]["limit_seconds"].as_i64(), v["month"]["remaining_seconds"].as_i64()), (Some(7200), Some(7200 - used)), "{v}");
        assert_eq!(v["week"]["limit_seconds"], Value::Null);
        // Her limit's room is less than the org's: it is the time left to her.
        assert_eq!(v["time_left_seconds"].as_i64(), Some(7200 - used));
        assert_eq!(v["days"], json!([{"day": "2026-11-30T00:00:00Z", "seconds": used}]));
        // The days add up to her row of the org's breakdown by user over the same range.
        let b = srv.admin("GET", "/v1/orgs/acme/usage/breakdown?group_by=user", None).await;
        let row = b["rows"].as_array().unwrap().iter().find(|r| r["key"] == "ann").unwrap();
        assert_eq!(row["seconds"].as_i64(), Some(used), "{b}");
        assert_eq!((&v["from"], &v["to"]), (&b["from"], &b["to"]));
        let sessions: Vec<(&str, &str)> = v["sessions"].as_array().unwrap().iter().map(|s| (s["session_id"].as_str().unwrap(), s["state"].as_str().unwrap())).collect();
        assert_eq!(sessions, [("s1", "parked"), ("s3", "running")]);
        // Nothing of bob's, nor the org's totals (ann's 6,610 s plus bob's 1,200).
        let text = v.to_string();
        assert!(!text.contains("bob") && !text.contains(&(used + 1200).to_string()), "{text}");

        // Without a limit, the org's room is hers: bob's time left is the org's.
        let (bob, _) = member_token(&srv, "bob").await;
        let (_, b) = srv.call("GET", "/v1/me/usage", Some(&bob), None).await;
        let org_left = srv.usage("acme").await["funding"]["remaining_seconds"].as_i64().unwrap();
        assert_eq!((b["month"]["used_seconds"].as_i64(), b["time_left_seconds"].as_i64()), (Some(1200), Some(org_left)), "{b}");
        assert_eq!(b["month"]["limit_seconds"], Value::Null);

        // Every other route refuses a member token; its own token it may read.
        let beat = json!({"heartbeats": [hb("acme", "s1", 999, "running", T0 + 5410)]});
        for (method, path, body) in [("GET", "/v1/orgs/acme/usage", None), ("GET", "/v1/orgs/acme/sessions", None), ("GET", "/v1/orgs", None), ("POST", "/v1/heartbeats", Some(&beat)), ("GET", "/v1/orgs/acme/usage/breakdown?group_by=user", None)] {
            let (status, v) = srv.call(method, path, Some(&ann), body).await;
            assert!(matches!(status, 403 | 404), "{method} {path}: {status} {v}");
        }
        let (status, me) = srv.call("GET", "/v1/me", Some(&ann), None).await;
        assert_eq!((status, me["user_id"].as_str(), me["scopes"].clone()), (200, Some("ann"), json!(["member"])), "{me}");
        // An admin token names no user: the page is a member token's.
        let (status, _) = srv.call("GET", "/v1/me/usage", Some(ADMIN), None).await;
        assert_eq!(status, 403);
        // Revoked, it is refused.
        srv.admin("POST", &format!("/v1/tokens/{ann_id}/revoke"), None).await;
        let (status, v) = srv.call("GET", "/v1/me/usage", Some(&ann), None).await;
        assert_eq!(status, 401, "{v}");
    }

    async fn a_member_token_is_bound_to_an_org_and_a_user(srv: TestServer) {
        srv.create_org("acme", "team").await;
        let before = srv.db.digest().await.unwrap();
        for (body, field) in [
            (json!({"scopes": ["member"], "org_id": "acme"}), "user_id"),
            (json!({"scopes": ["member"], "user_id": "ann"}), "org_id"),
            (json!({"scopes": ["member", "console"], "org_id": "acme", "user_id": "ann"}), "scopes"),
            (json!({"scopes": ["console"], "org_id": "acme", "user_id": "ann"}), "user_id"),
            (json!({"scopes": ["member"], "org_id": "acme", "user_id": "a b"}), "user_id"),
        ] {
            let (status, v) = srv.call("POST", "/v1/tokens", Some(ADMIN), Some(&body)).await;
            assert_eq!((status, v["error"]["field"].as_str()), (422, Some(field)), "{body}: {v}");
        }
        assert_eq!(srv.db.digest().await.unwrap(), before, "a refused token was written");
        // A Team admin's token bound to the org makes its members' tokens.
        let team_admin = srv.token(&[rush_meter::tokens::Scope::Admin], Some("acme")).await;
        let (status, v) = srv.call("POST", "/v1/tokens", Some(&team_admin), Some(&json!({"scopes": ["member"], "org_id": "acme", "user_id": "ann"}))).await;
        assert_eq!(status, 201, "{v}");
        let (status, page) = srv.call("GET", "/v1/me/usage", Some(v["secret"].as_str().unwrap()), None).await;
        assert_eq!((status, page["month"]["used_seconds"].as_i64()), (200, Some(0)), "{page}");
        assert_eq!(page["days"], json!([]));
    }
}
