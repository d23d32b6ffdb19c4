//! The console in a real browser: a server with a seeded month (51 orgs, two busy; sessions on
//! six days with three agents, running and parked; a grant, a limit, a denial, a closed
//! October, a quarantined Stripe event), and Debian's Chromium driven by playwright-core
//! (`tests/node/console.mjs`) through sign-in and every page, comparing each figure shown
//! with the API's answer. PostgreSQL's run writes the screenshots to `reports/console/`.

mod common;

use common::{hb, Backend, Options, TestServer, ADMIN};
use rush_meter::tokens::Scope;
use rush_meter_core::time::Secs;
use serde_json::{json, Value};

/// 2026-10-29T10:00:00Z, a Thursday: the seeded history starts here.
const START: Secs = 1_793_268_000;
const DAY: Secs = 86_400;

every_backend!(
    the_console_shows_the_apis_figures_in_a_browser,
    the_org_list_searches_pages_and_counts_as_the_usage_page,
    a_token_reads_itself
);

/// `GET /v1/orgs`: a search by id or name in any case, with `%` and `_` taken literally;
/// pages by id that neither skip nor repeat; each org's windows equal its usage page;
/// bad input refused naming the parameter.
async fn the_org_list_searches_pages_and_counts_as_the_usage_page(backend: Backend) {
    let Some(srv) = TestServer::start(backend).await else {
        return;
    };
    for (org, name) in [
        ("acme", "Acme Corp"),
        ("acme_2", "Acme Labs"),
        ("beta", "100% Beta"),
        ("gamma", "École Gamma"),
    ] {
        srv.admin(
            "PUT",
            &format!("/v1/orgs/{org}"),
            Some(json!({"name": name, "plan": "pro"})),
        )
        .await;
    }
    srv.admin("PUT", "/v1/orgs/acme/keys/k1", Some(json!({})))
        .await;
    srv.admit("acme", "k1", "s1").await;
    for seq in 1..=5 {
        let at = common::T0 + (seq - 1) * 15;
        srv.clock.set(at);
        srv.heartbeats(vec![hb("acme", "s1", seq, "running", at)])
            .await;
    }
    srv.clock.set(common::T0 + 70);
    let ids = |v: &Value| -> Vec<String> {
        v["orgs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["org_id"].as_str().unwrap().to_owned())
            .collect()
    };
    for (q, want) in [
        ("", vec!["acme", "acme_2", "beta", "gamma"]),
        ("ACME", vec!["acme", "acme_2"]),
        ("labs", vec!["acme_2"]),
        ("_", vec!["acme_2"]),
        ("%", vec!["beta"]),
        ("zzz", vec![]),
        // Folded by the database on both sides: found as typed on either backend.
        ("École", vec!["gamma"]),
        ("gamma", vec!["gamma"]),
    ] {
        let v = srv
            .admin(
                "GET",
                &format!(
                    "/v1/orgs?q={}",
                    url::form_urlencoded::byte_serialize(q.as_bytes()).collect::<String>()
                ),
                None,
            )
            .await;
        assert_eq!(ids(&v), want, "q={q}: {v}");
    }
    // Running time counted up to now, as on the usage page.
    let all = srv.admin("GET", "/v1/orgs", None).await;
    let usage = srv.usage("acme").await;
    assert_eq!(all["orgs"][0]["month"], usage["month"]);
    assert_eq!(all["orgs"][0]["week"], usage["week"]);
    assert_eq!(all["orgs"][0]["month"]["used_seconds"], 70);
    assert_eq!(all["next_cursor"], Value::Null);
    // Two at a time: every org once, in order.
    let (mut seen, mut cursor) = (Vec::new(), None::<String>);
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/orgs?limit=2&cursor={c}"),
            None => "/v1/orgs?limit=2".to_owned(),
        };
        let v = srv.admin("GET", &path, None).await;
        seen.extend(ids(&v));
        match v["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen, ["acme", "acme_2", "beta", "gamma"]);
    let before = srv.db.digest().await.unwrap();
    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("cursor=no%20such", "cursor"),
        (&format!("q={}", "x".repeat(201)) as &str, "q"),
    ] {
        let (status, v) = srv
            .call("GET", &format!("/v1/orgs?{query}"), Some(ADMIN), None)
            .await;
        assert_eq!(status, 422, "{query}: {v}");
        assert_eq!(v["error"]["field"], field, "{query}: {v}");
    }
    assert_eq!(srv.db.digest().await.unwrap(), before);
}

/// A member token of `user` in `org`, made over the API as a Team admin makes one.
async fn member_token(srv: &TestServer, org: &str, user: &str) -> String {
    let body = json!({"scopes": ["member"], "org_id": org, "user_id": user});
    let t = srv.admin("POST", "/v1/tokens", Some(body)).await;
    t["secret"].as_str().unwrap().to_owned()
}

/// `GET /v1/me` answers the caller's own token, whatever its scopes.
async fn a_token_reads_itself(backend: Backend) {
    let Some(srv) = TestServer::start(backend).await else {
        return;
    };
    srv.create_org("org_a", "pro").await;
    let secret = srv.token(&[Scope::Console], Some("org_a")).await;
    let (status, v) = srv.call("GET", "/v1/me", Some(&secret), None).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["scopes"], json!(["console"]));
    assert_eq!(v["org_id"], "org_a");
    assert_eq!(v["label"], "test");
    assert!(
        v["token_id"].as_str().is_some_and(|id| !id.is_empty()),
        "{v}"
    );
    let (status, v) = srv.call("GET", "/v1/me", None, None).await;
    assert_eq!((status, &v["error"]["code"]), (401, &json!("unauthorized")));
    // Refusals hold no data either, yet are not kept; the console's assets revalidate.
    for (path, cache) in [
        ("/v1/me", "no-store"),
        ("/v1/no/such/route", "no-store"),
        ("/console", "no-cache"),
    ] {
        let resp = srv
            .client
            .get(format!("{}{path}", srv.url))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.headers()["cache-control"], cache, "{path}");
    }
}

async fn the_console_shows_the_apis_figures_in_a_browser(backend: Backend) {
    let Some(chromium) = chromium() else {
        return;
    };
    let Some(script) = common::node::script("console.mjs") else {
        return;
    };
    let opts = Options {
        clock_start: START,
        ..Options::default()
    };
    let Some(srv) = TestServer::start_with(backend, opts).await else {
        return;
    };
    seed(&srv).await;
    let shots = if backend == Backend::Postgres {
        std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/reports/console"))
    } else {
        std::env::temp_dir().join(format!("rush-meter-console-{}", std::process::id()))
    };
    let tokens = [
        ("FINANCE", srv.token(&[Scope::Finance], None).await),
        (
            "CONSOLE_A",
            srv.token(&[Scope::Console], Some("org_a")).await,
        ),
        ("INGEST", srv.token(&[Scope::Ingest], None).await),
        ("MEMBER_A", member_token(&srv, "org_a", "u1").await),
    ];
    let out = tokio::process::Command::new("node")
        .arg(script)
        .env("BASE", &srv.url)
        .env("ADMIN", ADMIN)
        .envs(tokens.iter().map(|(k, v)| (*k, v.as_str())))
        .env("SHOTS", &shots)
        .env("CHROMIUM", chromium)
        .output()
        .await
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the browser test failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let checked: Value = serde_json::from_str(stdout.trim().lines().last().unwrap()).unwrap();
    println!("{backend:?}: the browser checked {checked}");
    // Every gauge, row, bar segment and stretch of the seeded month was compared.
    assert!(checked["figures"].as_i64().unwrap() >= 200, "{checked}");
    assert!(checked["pages"].as_i64().unwrap() >= 9, "{checked}");
    assert_eq!(checked["screenshots"], 8, "{checked}");
}

/// Debian's Chromium; `None` (with a note) where it is not installed, except on CI.
fn chromium() -> Option<&'static str> {
    const PATH: &str = "/usr/bin/chromium";
    if std::path::Path::new(PATH).exists() {
        return Some(PATH);
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("Chromium is required on CI; .ci/run installs it (apt-get install chromium)");
    }
    eprintln!("NOTE: {PATH} missing (apt-get install chromium); the browser test did not run");
    None
}

/// What a session does on its day: runs, parks, runs again, then parks (and ends), each
/// for this many seconds; the last day's last session is still running at the end.
const SHAPE: [(&str, Secs); 3] = [("running", 1200), ("parked", 600), ("running", 600)];

async fn seed(srv: &TestServer) {
    for (org, plan) in [("org_a", "pro"), ("org_b", "team")] {
        srv.create_org(org, plan).await;
        srv.admin("PUT", &format!("/v1/orgs/{org}/keys/k1"), Some(json!({})))
            .await;
    }
    srv.admin(
        "PUT",
        "/v1/orgs/org_a/keys/solo",
        Some(json!({"concurrency_limit": 1})),
    )
    .await;
    // More orgs than the console's page of 50: its "More" is tried.
    for n in 0..49 {
        srv.create_org(&format!("zz_{n:02}"), "free").await;
    }
    let agents = ["claude", "codex", "opencode"];
    let days = [0, 5, 12, 19, 26, 32];
    for (n, day) in days.iter().enumerate() {
        let at = START + day * DAY;
        srv.clock.set(at);
        let last = n == days.len() - 1;
        let mut sessions = Vec::new();
        for (i, org) in ["org_a", "org_a", "org_b"].iter().enumerate() {
            let id = format!("ses_{org}_{n}_{i}");
            let key = if last && i == 1 { "solo" } else { "k1" };
            let (agent, project) = (agents[(n + i) % 3], ["web", "api"][i % 2]);
            let body = json!({"org_id": org, "key_id": key, "session_id": id,
                "agent": agent, "project_id": project, "started_by": format!("u{}", i + 1)});
            let v = srv.admin("POST", "/v1/admissions", Some(body)).await;
            assert_eq!(v["decision"], "allow", "{v}");
            sessions.push((org.to_string(), id));
        }
        if last {
            // `solo` runs one at a time: a second run on it is refused while the first runs.
            let body = json!({"org_id": "org_a", "key_id": "solo", "session_id": "ses_refused", "agent": "codex"});
            run(srv, &sessions, at, 0..=30).await;
            let v = srv.admin("POST", "/v1/admissions", Some(body)).await;
            assert_eq!(v["decision"], "deny", "{v}");
        }
        // The last day stops while its sessions run again: they run on at the end.
        let span = if last { 60..=2000 } else { 0..=2400 };
        let end = run(srv, &sessions, at, span).await;
        if !last {
            for (_, id) in &sessions {
                srv.admin(
                    "POST",
                    &format!("/v1/sessions/{id}/end"),
                    Some(json!({"status": "completed"})),
                )
                .await;
            }
        }
        if n == 1 {
            // October is over: finance closes it, and the org gets hours past its plan.
            srv.admin("POST", "/v1/periods/2026-10/close", None).await;
            srv.admin(
                "POST",
                "/v1/orgs/org_a/grants",
                Some(json!({"seconds": 36000, "kind": "promo", "note": "launch week"})),
            )
            .await;
            srv.admin(
                "PUT",
                "/v1/orgs/org_a/limits/project/web",
                Some(json!({"monthly_hours": "40", "weekly_hours": "12"})),
            )
            .await;
        }
        srv.clock.set(end + 5);
    }
    // A Stripe event whose processing failed every try, waiting for an operator.
    let now = srv.clock.now();
    assert!(srv
        .db
        .insert_stripe_event(
            "evt_stuck",
            "customer.subscription.updated",
            now - 600,
            None,
            "{}",
            now - 600
        )
        .await
        .unwrap());
    srv.db
        .finish_stripe_event(
            "evt_stuck",
            "quarantined",
            Some("org_b"),
            Some("price price_unknown is in no plan file"),
            now,
            now - 60,
        )
        .await
        .unwrap();
}

/// Beat `sessions` every 30 s of `span` (seconds after `from`) through `SHAPE` (past its
/// end, `parked`); returns when the last beat was sent.
async fn run(
    srv: &TestServer,
    sessions: &[(String, String)],
    from: Secs,
    span: std::ops::RangeInclusive<Secs>,
) -> Secs {
    let mut last = from;
    for t in span.step_by(30) {
        let at = from + t;
        srv.clock.set(at);
        let beats: Vec<Value> = sessions
            .iter()
            .map(|(org, id)| hb(org, id, t / 30 + 1, phase(t), at))
            .collect();
        let (status, v) = srv.heartbeats(beats).await;
        assert_eq!(status, 200, "{v}");
        last = at;
    }
    last
}

fn phase(t: Secs) -> &'static str {
    let mut start = 0;
    for (state, len) in SHAPE {
        if t < start + len {
            return state;
        }
        start += len;
    }
    "parked"
}
