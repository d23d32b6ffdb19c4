//! Several `rush-meter` processes on one PostgreSQL: the gate stays exact across them.

mod common;

use std::time::{Duration, Instant};

use common::{fresh_database, repo_plans, Backend};
use serde_json::{json, Value};

const TOKEN: &str = "instances-test-token-0123456789";

struct Instance {
    child: tokio::process::Child,
    base: String,
}

async fn start(url: &str) -> Instance {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_rush-meter"))
        .args([
            "--database-url",
            url,
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .env("RUSH_METER_BOOTSTRAP_ADMIN_TOKEN", TOKEN)
        .env("RUSH_METER_PLANS_DIR", repo_plans())
        .env("RUST_LOG", "error")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    Instance {
        child,
        base: format!("http://127.0.0.1:{port}"),
    }
}

async fn wait_ready(client: &reqwest::Client, base: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = client.get(format!("{base}/readyz")).send().await {
            if r.status() == 200 {
                return;
            }
        }
        assert!(Instant::now() < deadline, "{base} never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_admit_exactly_the_limit_between_them() {
    let Some((url, _)) = fresh_database(Backend::Postgres).await else {
        return;
    };
    let mut instances = vec![start(&url).await, start(&url).await];
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    for i in &instances {
        wait_ready(&client, &i.base).await;
    }
    let base0 = &instances[0].base;
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
        let url = format!("{}/v1/admissions", instances[n % 2].base);
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
    for i in &mut instances {
        i.child.kill().await.unwrap();
    }
}
