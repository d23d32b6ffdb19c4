//! A token's life over the API: made with a lifetime, listed without its secret, revoked
//! (at once on the instance that revoked it, within 5 s of the meter's clock on any
//! other), each step in the audit log, and when it was last used recorded off the request
//! path.

mod common;

use common::{Backend, Options, TestServer, ADMIN, T0};
use serde_json::{json, Value};

every_backend!(
    a_token_is_listed_without_its_secret_and_revoked_at_once,
    a_token_expires_by_the_meters_clock,
    a_revocation_reaches_every_instance_within_five_seconds,
    a_token_bound_to_an_org_makes_and_revokes_that_orgs_tokens_only,
    bad_token_requests_are_refused_naming_the_field,
    when_a_token_was_last_used_is_recorded
);

async fn make(srv: &TestServer, token: &str, body: Value) -> (u16, Value) {
    srv.call("POST", "/v1/tokens", Some(token), Some(&body))
        .await
}

async fn a_token_is_listed_without_its_secret_and_revoked_at_once(srv: TestServer) {
    srv.create_org("acme", "pro").await;
    let (status, made) = make(
        &srv,
        ADMIN,
        json!({"scopes": ["ingest", "admission"], "org_id": "acme", "label": "fleet 7"}),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    let secret = made["secret"].as_str().unwrap();
    let id = made["token_id"].as_str().unwrap();
    assert_eq!(made["scopes"], json!(["ingest", "admission"]));
    assert_eq!(made["state"], "active");
    let (status, me) = srv.call("GET", "/v1/me", Some(secret), None).await;
    assert_eq!(status, 200);
    assert_eq!(me["org_id"], "acme");

    let (_, list) = srv.call("GET", "/v1/tokens", Some(ADMIN), None).await;
    let text = list.to_string();
    assert!(!text.contains(secret) && !text.contains("secret"), "{text}");
    let listed: Vec<&Value> = list["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["token_id"] == id)
        .collect();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["label"], "fleet 7");
    assert_eq!(listed[0]["org_id"], "acme");

    let path = format!("/v1/tokens/{id}/revoke");
    let (status, revoked) = srv.call("POST", &path, Some(ADMIN), None).await;
    assert_eq!(status, 200, "{revoked}");
    assert_eq!(revoked["state"], "revoked");
    assert_eq!(revoked["revoked_at"], "2026-11-30T12:00:00Z");
    // Refused at once, though it was used (and cached) a moment ago.
    let (status, v) = srv.call("GET", "/v1/me", Some(secret), None).await;
    assert_eq!(status, 401);
    assert_eq!(v["error"]["code"], "token_revoked");
    // Again: nothing changes, and the log holds one revocation.
    let (status, again) = srv.call("POST", &path, Some(ADMIN), None).await;
    assert_eq!(status, 200);
    assert_eq!(again, revoked);
    let (_, log) = srv
        .call("GET", "/v1/orgs/acme/audit", Some(ADMIN), None)
        .await;
    let actions: Vec<&str> = log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["subject"] == format!("token:{id}"))
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["token.created", "token.revoked"], "{log}");
    let (status, v) = srv
        .call("POST", "/v1/tokens/tok_none/revoke", Some(ADMIN), None)
        .await;
    assert_eq!(status, 404, "{v}");
    srv.finish().await;
}

async fn a_token_expires_by_the_meters_clock(srv: TestServer) {
    let (status, made) = make(
        &srv,
        ADMIN,
        json!({"scopes": ["finance"], "expires_in_seconds": 60}),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(made["expires_at"], "2026-11-30T12:01:00Z");
    let secret = made["secret"].as_str().unwrap();
    // It makes no token that outlives it.
    let (status, v) = make(&srv, secret, json!({"scopes": ["finance"]})).await;
    assert_eq!(status, 403, "finance makes no token: {v}");
    let (_, admin) = make(
        &srv,
        ADMIN,
        json!({"scopes": ["admin"], "expires_in_seconds": 60}),
    )
    .await;
    let brief = admin["secret"].as_str().unwrap();
    for body in [
        json!({"scopes": ["ingest"]}),
        json!({"scopes": ["ingest"], "expires_in_seconds": 61}),
    ] {
        let (status, v) = make(&srv, brief, body).await;
        assert_eq!(
            (status, &v["error"]["field"]),
            (422, &json!("expires_in_seconds")),
            "{v}"
        );
    }
    let (status, v) = make(
        &srv,
        brief,
        json!({"scopes": ["ingest"], "expires_in_seconds": 60}),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    srv.clock.advance(59);
    let (status, me) = srv.call("GET", "/v1/me", Some(secret), None).await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(me["expires_at"], "2026-11-30T12:01:00Z");
    srv.clock.advance(1);
    let (status, v) = srv.call("GET", "/v1/periods", Some(secret), None).await;
    assert_eq!(status, 401);
    assert_eq!(v["error"]["code"], "token_expired");
    let (_, list) = srv.call("GET", "/v1/tokens", Some(ADMIN), None).await;
    assert!(list["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["token_id"] == made["token_id"] && t["state"] == "expired"));
    srv.finish().await;
}

async fn a_revocation_reaches_every_instance_within_five_seconds(backend: Backend) {
    let Some(a) = TestServer::start(backend).await else {
        return;
    };
    let b = TestServer::start_on(backend, a.database_url.clone(), None, Options::default()).await;
    let (_, made) = make(&a, ADMIN, json!({"scopes": ["ingest"]})).await;
    let secret = made["secret"].as_str().unwrap();
    // b reads the token now, and trusts what it read for a while.
    assert_eq!(b.call("GET", "/v1/me", Some(secret), None).await.0, 200);
    let path = format!("/v1/tokens/{}/revoke", made["token_id"].as_str().unwrap());
    assert_eq!(a.call("POST", &path, Some(ADMIN), None).await.0, 200);
    assert_eq!(a.call("GET", "/v1/me", Some(secret), None).await.0, 401);
    b.clock.advance(rush_meter::http::auth::TOKEN_FRESH_SECS);
    let (status, v) = b.call("GET", "/v1/me", Some(secret), None).await;
    assert_eq!(status, 401, "{v}");
    assert_eq!(v["error"]["code"], "token_revoked");
    let mut b = b;
    b.stop().await;
    a.finish().await;
}

async fn a_token_bound_to_an_org_makes_and_revokes_that_orgs_tokens_only(srv: TestServer) {
    srv.create_org("acme", "team").await;
    srv.create_org("other", "team").await;
    let acme_admin = srv
        .token(&[rush_meter::tokens::Scope::Admin], Some("acme"))
        .await;
    let (status, v) = make(&srv, &acme_admin, json!({"scopes": ["ingest"]})).await;
    assert_eq!(status, 422, "a token for every org: {v}");
    assert_eq!(v["error"]["field"], "org_id");
    let (status, _) = make(
        &srv,
        &acme_admin,
        json!({"scopes": ["ingest"], "org_id": "other"}),
    )
    .await;
    assert_eq!(status, 404);
    let (status, ours) = make(
        &srv,
        &acme_admin,
        json!({"scopes": ["console"], "org_id": "acme"}),
    )
    .await;
    assert_eq!(status, 201, "{ours}");
    let (_, theirs) = make(
        &srv,
        ADMIN,
        json!({"scopes": ["ingest"], "org_id": "other"}),
    )
    .await;
    let revoke = |t: &Value| format!("/v1/tokens/{}/revoke", t["token_id"].as_str().unwrap());
    let (status, _) = srv
        .call("POST", &revoke(&theirs), Some(&acme_admin), None)
        .await;
    assert_eq!(status, 404, "another org's token is not there for it");
    let (_, list) = srv.call("GET", "/v1/tokens", Some(&acme_admin), None).await;
    assert!(list["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t["org_id"] == "acme"));
    let (status, _) = srv
        .call("POST", &revoke(&ours), Some(&acme_admin), None)
        .await;
    assert_eq!(status, 200);
    srv.finish().await;
}

async fn bad_token_requests_are_refused_naming_the_field(srv: TestServer) {
    let before = srv.db.digest().await.unwrap();
    for (body, field) in [
        (json!({"scopes": []}), "scopes"),
        (json!({"scopes": ["root"]}), "scopes[0]"),
        (json!({"scopes": ["console"]}), "org_id"),
        (json!({"scopes": ["ingest"], "org_id": "bad id"}), "org_id"),
        (json!({"scopes": ["ingest"], "label": "a\u{0}b"}), "label"),
        (json!({"scopes": ["ingest"], "label": "\u{1b}[2J"}), "label"),
        (
            json!({"scopes": ["ingest"], "expires_in_seconds": 0}),
            "expires_in_seconds",
        ),
        (
            json!({"scopes": ["ingest"], "expires_in_seconds": 400_000_000}),
            "expires_in_seconds",
        ),
    ] {
        let (status, v) = make(&srv, ADMIN, body.clone()).await;
        assert_eq!(status, 422, "{body}: {v}");
        assert_eq!(v["error"]["field"], field, "{body}: {v}");
    }
    let (status, v) = make(
        &srv,
        ADMIN,
        json!({"scopes": ["ingest"], "org_id": "ghost"}),
    )
    .await;
    assert_eq!(status, 404, "{v}");
    assert_eq!(srv.db.digest().await.unwrap(), before);
    srv.finish().await;
}

async fn when_a_token_was_last_used_is_recorded(srv: TestServer) {
    let (_, made) = make(&srv, ADMIN, json!({"scopes": ["finance"]})).await;
    let secret = made["secret"].as_str().unwrap().to_owned();
    let id = made["token_id"].as_str().unwrap().to_owned();
    assert_eq!(made["last_used_at"], Value::Null);
    srv.clock.set(T0 + 100);
    assert_eq!(srv.call("GET", "/v1/me", Some(&secret), None).await.0, 200);
    // Written in batches; the last batch on the way out.
    let srv = srv.restart(Options::default()).await;
    let (_, list) = srv.call("GET", "/v1/tokens", Some(ADMIN), None).await;
    let row = list["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["token_id"] == id.as_str())
        .unwrap()
        .clone();
    assert_eq!(row["last_used_at"], "2026-11-30T12:01:40Z", "{row}");
    srv.finish().await;
}
