//! A token flooding the service is answered 429 with Retry-After, in the error format,
//! while other tokens keep being served.

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
