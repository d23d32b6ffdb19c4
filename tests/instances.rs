//! Several `rush-meter` processes on one PostgreSQL: the gate stays exact across them.

mod common;

use std::time::Duration;

use common::{fresh_database, spawn_service, Backend};
use serde_json::{json, Value};

const TOKEN: &str = "instances-test-token-0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_admit_exactly_the_limit_between_them() {
    let Some((url, _)) = fresh_database(Backend::Postgres).await else {
        return;
    };
    let mut instances = vec![
        spawn_service(&url, TOKEN).await,
        spawn_service(&url, TOKEN).await,
    ];
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let base0 = &instances[0].1;
    let r = client
        .put(format!("{base0}/v1/orgs/acme"))
        .bearer_auth(TOKEN)
        .json(&json!({"plan": "team"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = client
        .put(format!("{base0}/v1/orgs/acme/keys/k1"))
        .bearer_auth(TOKEN)
        .json(&json!({"concurrency_limit": 100}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let mut tasks = Vec::new();
    for n in 0..2000 {
        let url = format!("{}/v1/admissions", instances[n % 2].1);
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let body = json!({"org_id": "acme", "key_id": "k1", "session_id": format!("s{n}"), "agent": "opencode"});
            let r = client.post(url).bearer_auth(TOKEN).json(&body).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }));
    }
    let mut allowed = 0;
    for t in tasks {
        let (status, v) = t.await.unwrap();
        assert_eq!(status, 200, "{v}");
        if v["decision"] == "allow" {
            allowed += 1;
        } else {
            assert_eq!(v["reason"], "concurrency_limit_reached", "{v}");
        }
    }
    assert_eq!(allowed, 100);
    for (child, _) in &mut instances {
        child.kill().await.unwrap();
    }
}
