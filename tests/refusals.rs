//! Clean refusals: whatever the bytes, a 4xx in the error format that changes nothing, on
//! both backends. Requests hyper cannot parse (huge headers, a bad request line, a long
//! URI), text no database keeps (NUL) or a terminal would act on (escapes), bodies that
//! are not JSON, decimals written otherwise than the contract writes them, and signed
//! Stripe events that cannot be stored as sent (acknowledged, quarantined). And a
//! PostgreSQL that turns read-only under the service: 503s, never 500s, and back by itself.

mod common;

use std::time::Duration;

use common::webhooks::{self, deliver, SECRET};
use common::{hb, Backend, TestServer, ADMIN, T0};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

every_backend!(
    requests_hyper_cannot_parse_are_answered_in_the_error_format,
    text_no_database_keeps_is_refused_naming_the_field,
    bodies_are_json_and_decimals_are_plain,
    signed_stripe_events_that_cannot_be_stored_as_sent_are_quarantined
);

/// What the server answers to `raw`, written on a connection of its own, until it closes.
async fn raw(srv: &TestServer, raw: &[u8]) -> String {
    let addr = srv.url.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The server may answer and close before it has read every byte: a failed write is
    // part of what is tried.
    let _ = conn.write_all(raw).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), conn.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// The status and JSON body of a raw answer.
fn parsed(answer: &str) -> (u16, Value) {
    let status = answer
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{head}"
    );
    (status, serde_json::from_str(body).unwrap())
}

async fn requests_hyper_cannot_parse_are_answered_in_the_error_format(srv: TestServer) {
    let big = format!(
        "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let many: String = (0..200).map(|i| format!("X-{i}: a\r\n")).collect();
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (big.into_bytes(), 431, "headers_too_large"),
        (
            format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{many}\r\n").into_bytes(),
            431,
            "headers_too_large",
        ),
        (
            b"GE\x01T /healthz HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            400,
            "malformed_request",
        ),
        (
            format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000)).into_bytes(),
            414,
            "uri_too_long",
        ),
    ];
    for (request, status, code) in cases {
        let answer = raw(&srv, &request).await;
        let (got, v) = parsed(&answer);
        assert_eq!(
            (got, v["error"]["code"].as_str()),
            (status, Some(code)),
            "{answer}"
        );
        assert!(v["error"]["message"].as_str().unwrap().len() > 20);
    }
    // The service goes on answering.
    let (status, _) = srv.call("GET", "/healthz", None, None).await;
    assert_eq!(status, 200);
    srv.finish().await;
}

async fn text_no_database_keeps_is_refused_naming_the_field(srv: TestServer) {
    srv.create_org("acme", "team").await;
    let before = srv.db.digest().await.unwrap();
    let cases: Vec<(&str, String, Option<Value>, &str)> = vec![
        (
            "PUT",
            "/v1/orgs/acme".into(),
            Some(json!({"name": "a\u{0}b"})),
            "name",
        ),
        (
            "PUT",
            "/v1/orgs/acme".into(),
            Some(json!({"name": "\u{1b}[2J\u{1b}[31mpwned"})),
            "name",
        ),
        (
            "PUT",
            "/v1/orgs/acme".into(),
            Some(json!({"name": "two\nlines"})),
            "name",
        ),
        (
            "POST",
            "/v1/orgs/acme/grants".into(),
            Some(json!({"seconds": 60, "kind": "promo", "note": "a\u{0}b"})),
            "note",
        ),
        (
            "POST",
            "/v1/orgs/acme/grants".into(),
            Some(json!({"seconds": 60, "kind": "promo", "idempotency_key": "k\u{0}"})),
            "idempotency_key",
        ),
        (
            "POST",
            "/v1/heartbeats".into(),
            Some(
                json!({"heartbeats": [{"org_id": "acme", "session_id": "s1", "vm_id": "v\u{0}",
                "seq": 1, "state": "running"}]}),
            ),
            "heartbeats[0].vm_id",
        ),
        ("GET", "/v1/orgs?q=%00".into(), None, "q"),
        ("GET", "/v1/orgs?q=%1b%5b2J".into(), None, "q"),
        (
            "GET",
            "/v1/orgs/acme/decisions?cursor=5.a%00".into(),
            None,
            "cursor",
        ),
        (
            "GET",
            "/v1/admin/stripe/events?cursor=5.%00".into(),
            None,
            "cursor",
        ),
        (
            "POST",
            "/v1/admin/stripe/events/evt%00/retry".into(),
            None,
            "event_id",
        ),
    ];
    for (method, path, body, field) in cases {
        let (status, v) = srv.call(method, &path, Some(ADMIN), body.as_ref()).await;
        assert_eq!(status, 422, "{method} {path} {body:?}: {v}");
        assert_eq!(v["error"]["field"], field, "{method} {path}: {v}");
    }
    assert_eq!(srv.db.digest().await.unwrap(), before, "a refusal wrote");
    srv.finish().await;
}

async fn bodies_are_json_and_decimals_are_plain(srv: TestServer) {
    srv.create_org("acme", "team").await;
    let before = srv.db.digest().await.unwrap();
    let body = json!({"heartbeats": [hb("acme", "s1", 1, "running", T0)]}).to_string();
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        None,
    ] {
        let mut req = srv
            .client
            .post(format!("{}/v1/heartbeats", srv.url))
            .bearer_auth(ADMIN)
            .body(body.clone());
        if let Some(t) = content_type {
            req = req.header("content-type", t);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let v: Value = resp.json().await.unwrap();
        assert_eq!(status, 415, "{content_type:?}: {v}");
        assert_eq!(v["error"]["code"], "unsupported_media_type");
    }
    for (path, body, field) in [
        (
            "/v1/orgs/acme/limits/project/web",
            json!({"monthly_hours": "1e2"}),
            "monthly_hours",
        ),
        (
            "/v1/orgs/acme/limits/project/web",
            json!({"weekly_hours": " 5 "}),
            "weekly_hours",
        ),
        (
            "/v1/orgs/acme/overage",
            json!({"enabled": true, "monthly_cap": " 5 "}),
            "monthly_cap",
        ),
        (
            "/v1/orgs/acme/overage",
            json!({"enabled": true, "monthly_cap": "1e1"}),
            "monthly_cap",
        ),
    ] {
        let (status, v) = srv.call("PUT", path, Some(ADMIN), Some(&body)).await;
        assert_eq!(status, 422, "{body}: {v}");
        assert_eq!(v["error"]["field"], field, "{v}");
    }
    assert_eq!(srv.db.digest().await.unwrap(), before, "a refusal wrote");
    // The same, as the contract writes them, is taken; and JSON with a charset is JSON.
    let resp = srv
        .client
        .put(format!("{}/v1/orgs/acme/limits/project/web", srv.url))
        .bearer_auth(ADMIN)
        .header("content-type", "application/json; charset=utf-8")
        .body(json!({"monthly_hours": "100", "weekly_hours": "5"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    srv.finish().await;
}

async fn signed_stripe_events_that_cannot_be_stored_as_sent_are_quarantined(backend: Backend) {
    let Some(srv) = webhooks::start(backend, webhooks::webhooks_only(), T0).await else {
        return;
    };
    let bodies = [
        r#"{"id": "evt_a\u0000b", "object": "event", "type": "customer.updated", "created": 1796040000, "data": {"object": {}}}"#.to_owned(),
        format!(
            r#"{{"id": "evt_{}", "object": "event", "type": "customer.updated", "created": 1796040000, "data": {{"object": {{}}}}}}"#,
            "x".repeat(5000)
        ),
        r#"{"id": "evt_ok", "object": "event", "type": "customer.\u001b[2J", "created": 1796040000, "data": {"object": {}}}"#.to_owned(),
        "signed, but not JSON".to_owned(),
    ];
    for body in &bodies {
        let header = rush_meter_core::signature::sign(SECRET, T0, body.as_bytes());
        let (status, v) = deliver(&srv, body, &header).await;
        assert_eq!(status, 200, "{body:.80}: {v}");
        assert_eq!(v, json!({"received": true, "duplicate": false}));
        // Stripe's retry of the same bytes is a duplicate.
        let (status, v) = deliver(&srv, body, &header).await;
        assert_eq!((status, v["duplicate"].as_bool()), (200, Some(true)));
    }
    let v = srv
        .admin("GET", "/v1/admin/stripe/events?state=quarantined", None)
        .await;
    let events = v["events"].as_array().unwrap();
    assert_eq!(events.len(), bodies.len(), "{v}");
    for e in events {
        let id = e["event_id"].as_str().unwrap();
        assert!(id.starts_with("evt_unreadable_") && id.len() < 64, "{e}");
        assert!(
            e["last_error"]
                .as_str()
                .unwrap()
                .starts_with("stored as sent but not processed"),
            "{e}"
        );
    }
    // An unsigned body is still refused, and stores nothing.
    let (status, _) = deliver(&srv, &bodies[0], "t=1,v1=00").await;
    assert_eq!(status, 400);
    srv.finish().await;
}

/// A PostgreSQL that accepts no writes under a running service (a primary that came back
/// as a standby): every request that needs a write is a 503 (never a 500), `/readyz` says
/// 503, and once it accepts writes again the service answers 200 without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_turns_read_only_is_an_outage_not_a_fault() {
    let Some(srv) = TestServer::start(Backend::Postgres).await else {
        return;
    };
    srv.create_org("acme", "team").await;
    srv.admin("PUT", "/v1/orgs/acme/keys/k1", Some(json!({})))
        .await;
    srv.admit("acme", "k1", "s1").await;
    let beat = |seq| vec![hb("acme", "s1", seq, "running", T0)];
    assert_eq!(srv.heartbeats(beat(1)).await.0, 200);

    let db = srv.database_url.rsplit('/').next().unwrap().to_owned();
    let admin = sqlx::PgPool::connect(&format!("{}/postgres", common::pg_base_url()))
        .await
        .unwrap();
    let read_only = |on: bool| {
        let (admin, db) = (admin.clone(), db.clone());
        async move {
            sqlx::query(&format!(
                "ALTER DATABASE {db} SET default_transaction_read_only = {on}"
            ))
            .execute(&admin)
            .await
            .unwrap();
            // Every session of the database starts again, as after a failover.
            sqlx::query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
            )
            .bind(&db)
            .execute(&admin)
            .await
            .unwrap();
        }
    };
    read_only(true).await;
    let mut refused = 0;
    for seq in 2..12 {
        let (status, v) = srv.heartbeats(beat(seq)).await;
        assert_eq!(status, 503, "a write on a read-only database: {v}");
        assert_eq!(v["error"]["code"], "unavailable");
        refused += 1;
    }
    assert_eq!(refused, 10);
    let (status, _) = srv.call("GET", "/readyz", None, None).await;
    assert_eq!(status, 503, "ready while the database takes no writes");

    read_only(false).await;
    let seq = std::sync::atomic::AtomicI64::new(100);
    common::eventually(
        30,
        "the service answers 200 once the database takes writes",
        || async {
            let (status, v) = srv
                .heartbeats(beat(seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed)))
                .await;
            assert!(matches!(status, 200 | 503), "{status}: {v}");
            status == 200
        },
    )
    .await;
    assert_eq!(srv.call("GET", "/readyz", None, None).await.0, 200);
    admin.close().await;
    srv.finish().await;
}
