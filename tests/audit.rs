//! The audit log (docs/audit.md), over HTTP on SQLite and PostgreSQL: every change the
//! requests make is listed once, in order, with who made it and the state before and
//! after; pages follow each other; readers are the org's console, finance and admin; bad
//! queries are refused in the error format.

mod common;

use common::*;
use rush_meter::tokens::Scope;
use serde_json::{json, Value};

async fn entries(srv: &TestServer, path: &str, token: &str) -> Vec<Value> {
    let (status, v) = srv.call("GET", path, Some(token), None).await;
    assert_eq!(status, 200, "{v}");
    v["entries"].as_array().unwrap().clone()
}

/// What each entry says happened: its action and subject.
fn changes(entries: &[Value]) -> Vec<(String, String)> {
    entries
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap().to_owned(),
                e["subject"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The changes a console's and an admin's requests make, in order, and none for the
/// requests that change nothing.
async fn every_change_is_listed_once_with_who_made_it(srv: TestServer) {
    srv.clock.set(T0);
    srv.admin("PUT", "/v1/orgs/acme", Some(json!({"plan": "free"})))
        .await;
    srv.admin("PUT", "/v1/orgs/acme", Some(json!({"plan": "free"})))
        .await; // no change
    srv.admin("PUT", "/v1/orgs/acme", Some(json!({"plan": "pro"})))
        .await;
    srv.admin("PUT", "/v1/orgs/acme/keys/k1", Some(json!({})))
        .await;
    srv.admin(
        "PUT",
        "/v1/orgs/acme/keys/k1",
        Some(json!({"concurrency_limit": 8})),
    )
    .await;
    let console = srv.token(&[Scope::Console], Some("acme")).await;
    let call = |method: &'static str, path: &'static str, body: Value| {
        let (srv, console) = (&srv, console.clone());
        async move {
            let (status, v) = srv.call(method, path, Some(&console), Some(&body)).await;
            assert!(status < 300, "{method} {path}: {status} {v}");
            v
        }
    };
    call(
        "PUT",
        "/v1/orgs/acme/limits/project/web",
        json!({"weekly_hours": "2"}),
    )
    .await;
    call(
        "PUT",
        "/v1/orgs/acme/limits/project/web",
        json!({"weekly_hours": "3"}),
    )
    .await;
    call(
        "PUT",
        "/v1/orgs/acme/overage",
        json!({"enabled": true, "monthly_cap": "25"}),
    )
    .await;
    let (status, _) = srv
        .call(
            "DELETE",
            "/v1/orgs/acme/limits/project/web",
            Some(&console),
            None,
        )
        .await;
    assert_eq!(status, 204);
    let g = srv
        .admin(
            "POST",
            "/v1/orgs/acme/grants",
            Some(json!({"seconds": 3600, "kind": "promo"})),
        )
        .await;
    let grant = g["grant_id"].as_str().unwrap();
    let void = format!("/v1/orgs/acme/grants/{grant}/void");
    srv.admin("POST", &void, None).await;
    srv.admin("POST", &void, None).await; // voided already: no change
    srv.admin("PUT", "/v1/orgs/acme", Some(json!({"suspended": true})))
        .await;
    // A refused request changes nothing, so it is not a change either.
    let (status, _) = srv
        .call(
            "PUT",
            "/v1/orgs/acme/limits/project/web",
            Some(&console),
            Some(&json!({"weekly_hours": "-1"})),
        )
        .await;
    assert_eq!(status, 422);

    let log = entries(&srv, "/v1/orgs/acme/audit", ADMIN).await;
    let want: Vec<(String, String)> = [
        ("org.created", "acme"),
        ("org.updated", "acme"),
        ("key.created", "key:k1"),
        ("key.updated", "key:k1"),
        ("token.created", "token:"),
        ("limit.set", "limit:project:web"),
        ("limit.set", "limit:project:web"),
        ("overage.updated", "overage"),
        ("limit.removed", "limit:project:web"),
        ("grant.created", &format!("grant:{grant}")),
        ("grant.voided", &format!("grant:{grant}")),
        ("org.updated", "acme"),
    ]
    .into_iter()
    .map(|(a, s)| (a.to_owned(), s.to_owned()))
    .collect();
    let mut got = changes(&log);
    // The console token's id is random.
    assert!(got[4].1.starts_with("token:tok_"), "{:?}", got[4]);
    got[4].1 = "token:".into();
    assert_eq!(got, want, "{log:#?}");

    // Who: the admin's token by its label, the console's by its id.
    let by = |i: usize| {
        (
            log[i]["actor"]["kind"].clone(),
            log[i]["actor"]["label"].clone(),
        )
    };
    let find = |action: &str| log.iter().position(|e| e["action"] == action).unwrap();
    assert_eq!(
        by(find("org.created")),
        (json!("token"), json!("bootstrap"))
    );
    assert_eq!(by(find("limit.set")), (json!("token"), json!("test")));
    assert_eq!(by(find("token.created")), (json!("system"), json!("test")));
    // Before and after.
    let plan = &log[find("org.updated")];
    assert_eq!(
        (&plan["before"]["plan_id"], &plan["after"]["plan_id"]),
        (&json!("free"), &json!("pro"))
    );
    let changed = &log[find("limit.set") + 1];
    assert_eq!(
        (
            &changed["before"]["weekly_hours"],
            &changed["after"]["weekly_hours"]
        ),
        (&json!("2"), &json!("3"))
    );
    let removed = &log[find("limit.removed")];
    assert_eq!(removed["after"], Value::Null);
    let overage = &log[find("overage.updated")];
    assert_eq!(
        overage["after"],
        json!({"enabled": true, "monthly_cap": "25.00"})
    );
    assert_eq!(log.last().unwrap()["after"]["suspended"], true);
    assert!(log
        .iter()
        .all(|e| e["org_id"] == "acme" && e["at"] == "2026-11-30T12:00:00Z"));

    // Pages of 5 follow each other to the same list; the org's console and finance read
    // it, another org's console sees no such org.
    let mut paged = Vec::new();
    let mut path = "/v1/orgs/acme/audit?limit=5".to_owned();
    loop {
        let (status, v) = srv.call("GET", &path, Some(&console), None).await;
        assert_eq!(status, 200, "{v}");
        paged.extend(v["entries"].as_array().unwrap().iter().cloned());
        match v["next_cursor"].as_str() {
            Some(c) => path = format!("/v1/orgs/acme/audit?limit=5&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(paged, log);
    let finance = srv.token(&[Scope::Finance], None).await;
    assert_eq!(entries(&srv, "/v1/orgs/acme/audit", &finance).await, log);
    srv.create_org("other", "free").await;
    let stranger = srv.token(&[Scope::Console], Some("other")).await;
    let (status, v) = srv
        .call("GET", "/v1/orgs/acme/audit", Some(&stranger), None)
        .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (404, Some("org_not_found")),
        "{v}"
    );
    // A window of time: nothing before the first change.
    let early = entries(&srv, "/v1/orgs/acme/audit?to=2026-11-30T12:00:00Z", ADMIN).await;
    assert!(early.is_empty());
}

/// Tokens for no org and closed periods are the service's own changes.
async fn the_services_own_changes_have_a_log_of_their_own(srv: TestServer) {
    srv.clock.set(T0);
    srv.create_org("acme", "pro").await;
    let before = entries(&srv, "/v1/audit", ADMIN).await.len();
    let finance = srv.token(&[Scope::Finance], None).await;
    srv.clock.set(T0 + 86_400);
    let closed = srv.admin("POST", "/v1/periods/2026-11/close", None).await;
    assert_eq!(closed["closed"], json!(["2026-11"]));
    let log = entries(&srv, "/v1/audit", &finance).await;
    let got = changes(&log[before..]);
    assert_eq!(got.len(), 2, "{log:#?}");
    assert!(
        got[0].0 == "token.created" && got[0].1.starts_with("token:tok_"),
        "{got:?}"
    );
    assert_eq!(
        got[1],
        (
            "period.closed".into(),
            format!("period:{}", T0 - 29 * 86_400 - 12 * 3600)
        )
    );
    let period = &log[before + 1];
    assert_eq!(
        (&period["after"]["orgs"], &period["actor"]["label"]),
        (&json!(1), &json!("bootstrap"))
    );
    assert!(log.iter().all(|e| e["org_id"] == ""));
    // An org's console reads its own org's log only.
    let console = srv.token(&[Scope::Console], Some("acme")).await;
    let (status, v) = srv.call("GET", "/v1/audit", Some(&console), None).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (403, Some("forbidden")),
        "{v}"
    );
}

/// Bad queries get the error format, naming the parameter.
async fn bad_queries_are_refused(srv: TestServer) {
    srv.create_org("acme", "pro").await;
    for (query, field) in [
        ("cursor=nonsense", "cursor"),
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("from=2026-12-01T00:00:00Z&to=2026-11-01T00:00:00Z", "from"),
        ("from=yesterday", "from"),
    ] {
        for path in ["/v1/orgs/acme/audit", "/v1/audit"] {
            let (status, v) = srv
                .call("GET", &format!("{path}?{query}"), Some(ADMIN), None)
                .await;
            assert_eq!(
                (status, v["error"]["field"].as_str()),
                (422, Some(field)),
                "{path}?{query}: {v}"
            );
        }
    }
    let (status, v) = srv
        .call("GET", "/v1/orgs/ghost/audit", Some(ADMIN), None)
        .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (404, Some("org_not_found")),
        "{v}"
    );
}

every_backend!(
    every_change_is_listed_once_with_who_made_it,
    the_services_own_changes_have_a_log_of_their_own,
    bad_queries_are_refused
);
