//! A token flooding the service is answered 429 with Retry-After, in the error format,
//! while other tokens keep being served; past its connection cap an instance accepts no
//! more connections until one closes, and it closes those that stay silent.

mod common;

use common::{Backend, Options, TestServer};
use rush_meter::config::RateLimit as Limit;
use rush_meter::tokens::Scope;
use serde_json::json;

every_backend!(a_flooding_token_is_limited_and_others_are_not);

async fn a_flooding_token_is_limited_and_others_are_not(backend: Backend) {
    let limit = Limit {
        per_sec: 50.0,
        burst: 50.0,
    };
    let opts = Options {
        rate_limit: Some(limit),
        ..Options::default()
    };
    let Some(srv) = TestServer::start_with(backend, opts).await else {
        return;
    };
    srv.create_org("org_1", "team").await;
    srv.admin(
        "PUT",
        "/v1/orgs/org_1/keys/k1",
        Some(json!({"concurrency_limit": 100})),
    )
    .await;
    let flood = srv.token(&[Scope::Admission], None).await;
    let other = srv.token(&[Scope::Admission], None).await;
    let srv = std::sync::Arc::new(srv);

    let started = std::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..300 {
        let (srv, flood) = (std::sync::Arc::clone(&srv), flood.clone());
        tasks.spawn(async move {
            let resp = srv
                .client
                .get(format!("{}/v1/orgs/org_1/keys/k1", srv.url))
                .bearer_auth(&flood)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let retry = resp
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_owned());
            let body: serde_json::Value = resp.json().await.unwrap();
            (i, status, retry, body)
        });
    }
    // Meanwhile the other token is served.
    let (status, d) = srv
        .call(
            "POST",
            "/v1/admissions",
            Some(&other),
            Some(&json!({"org_id": "org_1", "key_id": "k1", "session_id": "s1", "agent": "codex"})),
        )
        .await;
    assert_eq!(
        (status, d["decision"].as_str()),
        (200, Some("allow")),
        "{d}"
    );

    let (mut passed, mut limited) = (0, 0);
    while let Some(r) = tasks.join_next().await {
        let (_, status, retry, body) = r.unwrap();
        match status {
            200 => passed += 1,
            429 => {
                limited += 1;
                assert_eq!(body["error"]["code"], "rate_limited");
                let secs: u64 = retry.expect("Retry-After on a 429").parse().unwrap();
                assert!(secs >= 1, "{secs}");
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    assert!(
        passed as f64 <= limit.burst + limit.per_sec * elapsed + 1.0,
        "{passed} passed in {elapsed:.2} s"
    );
    assert!(
        passed >= limit.burst as usize,
        "the burst is served ({passed})"
    );
    assert_eq!(passed + limited, 300);
}

every_backend!(
    past_its_connection_cap_the_instance_accepts_none_until_one_closes,
    a_connection_that_says_nothing_is_closed_after_its_idle_time
);

/// A raw HTTP/1.1 request on its own connection.
async fn raw_get(conn: &mut tokio::net::TcpStream, path: &str) {
    use tokio::io::AsyncWriteExt;
    let req = format!("GET {path} HTTP/1.1\r\nhost: test\r\n\r\n");
    conn.write_all(req.as_bytes()).await.unwrap();
}

/// One whole response's head and body (`content-length` framed), as text.
async fn raw_response(conn: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(|v| v.trim().parse().unwrap())
                })
                .expect("a content-length");
            if body.len() >= len {
                return text;
            }
        }
        let n = conn.read(&mut buf).await.unwrap();
        assert!(n > 0, "the connection closed mid-response: {text}");
        got.extend_from_slice(&buf[..n]);
    }
}

/// `rush_meter_<name>` as `/metrics` on `conn` gives it (`TestServer::metric` would open a
/// connection of its own, which a full instance does not accept).
async fn metric(conn: &mut tokio::net::TcpStream, name: &str) -> f64 {
    raw_get(conn, "/metrics").await;
    let text = raw_response(conn).await;
    common::metric_in(&text, &format!("rush_meter_{name} "))
}

async fn past_its_connection_cap_the_instance_accepts_none_until_one_closes(backend: Backend) {
    let opts = Options {
        max_connections: 2,
        ..Options::default()
    };
    let Some(srv) = TestServer::start_with(backend, opts).await else {
        return;
    };
    let addr = srv.url.trim_start_matches("http://").to_owned();
    let connect = || tokio::net::TcpStream::connect(addr.clone());
    let (mut a, mut b) = (connect().await.unwrap(), connect().await.unwrap());
    for conn in [&mut a, &mut b] {
        raw_get(conn, "/healthz").await;
        assert!(raw_response(conn).await.starts_with("HTTP/1.1 200"));
    }
    // The third connects (the kernel's backlog takes it) and asks, but is not accepted...
    let mut c = connect().await.unwrap();
    raw_get(&mut c, "/healthz").await;
    // ...so the instance counts two open, a and b, whenever c's request was sent.
    assert_eq!(metric(&mut a, "http_connections_open").await, 2.0);
    // Once b closes, c is accepted and answered, and two are open again: a and c.
    drop(b);
    assert!(raw_response(&mut c).await.starts_with("HTTP/1.1 200"));
    assert_eq!(metric(&mut a, "http_connections_open").await, 2.0);
}

async fn a_connection_that_says_nothing_is_closed_after_its_idle_time(backend: Backend) {
    use tokio::io::AsyncReadExt;
    let opts = Options {
        idle_connection: std::time::Duration::from_secs(1),
        ..Options::default()
    };
    let Some(srv) = TestServer::start_with(backend, opts).await else {
        return;
    };
    let addr = srv.url.trim_start_matches("http://").to_owned();
    let mut silent = tokio::net::TcpStream::connect(&addr).await.unwrap();
    // The instance ends it: the read sees the end (or a reset), never a hang (the guard).
    let mut buf = [0u8; 64];
    let end = tokio::time::timeout(std::time::Duration::from_secs(60), silent.read(&mut buf))
        .await
        .expect("a silent connection is closed by the instance");
    assert!(matches!(end, Ok(0) | Err(_)), "it sent {end:?}");
    // One read of /metrics, on the client's one connection, shows the silent one closed and
    // counted. (Two reads may take two connections: a client may send the second before
    // the first's connection is back in its pool.)
    let (_, _, text) = srv.get_text("/metrics", "content-type").await;
    let idle_closed = common::metric_in(&text, "rush_meter_http_connections_idle_closed_total ");
    assert_eq!(idle_closed, 1.0);
    assert_eq!(
        common::metric_in(&text, "rush_meter_http_connections_open "),
        1.0
    );
}
