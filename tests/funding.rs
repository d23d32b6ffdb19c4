//! Past the plan, over HTTP on SQLite and PostgreSQL (docs/funding.md): grants, then
//! pay-as-you-go up to a cap that holds in money, then grace until sessions park; what
//! funds each decision; every bad input refused in the error format, changing nothing.

mod common;

use common::*;
use rush_meter::tokens::Scope;
use serde_json::{json, Value};

fn plans_dir() -> tempfile::TempDir {
    mini_plans()
}

async fn admit(srv: &TestServer, session: &str) -> Value {
    srv.admit("acme", "k1", session).await
}

async fn setup(srv: &TestServer) {
    srv.create_org("acme", "mini").await;
    srv.admin("PUT", "/v1/orgs/acme/keys/k1", Some(json!({})))
        .await;
}

async fn grant(srv: &TestServer, body: Value) -> Value {
    let (status, v) = srv
        .call("POST", "/v1/orgs/acme/grants", Some(ADMIN), Some(&body))
        .await;
    assert_eq!(status, 201, "{v}");
    v
}

async fn sources_in_order(backend: Backend) {
    let dir = plans_dir();
    let Some(srv) = start_with_plans(backend, dir.path()).await else {
        return;
    };
    setup(&srv).await;
    srv.clock.set(T0);
    // Two grants: the one with the lower priority number is used first.
    let late = grant(
        &srv,
        json!({"seconds": 60, "kind": "promo", "priority": 60}),
    )
    .await;
    let first = grant(
        &srv,
        json!({"seconds": 45, "kind": "make_good", "priority": 10, "note": "outage"}),
    )
    .await;
    let (status, v) = srv
        .call(
            "PUT",
            "/v1/orgs/acme/overage",
            Some(ADMIN),
            Some(&json!({"enabled": true, "monthly_cap": "0.10"})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (v["enabled"].as_bool(), v["monthly_cap"].as_str()),
        (Some(true), Some("0.10"))
    );

    let d = admit(&srv, "s1").await;
    assert_eq!(
        (d["decision"].as_str(), d["funded_by"].as_str()),
        (Some("allow"), Some("plan")),
        "{d}"
    );
    assert_eq!(
        d["remaining"],
        json!({"plan_seconds": 180, "grant_seconds": 105, "overage_seconds": 100})
    );

    // 180 s of plan (the week), 105 s of grants, 100 s of overage (0.10 at 0.001 a second),
    // then grace: told to park once the 30 s of grace have run.
    let end = run_together_until_parked(&srv, "acme", &["s1"], T0).await;
    let u = srv.usage("acme").await;
    let week = &u["week"];
    assert_eq!(
        (
            week["plan_seconds"].as_i64(),
            week["grant_seconds"].as_i64(),
            week["overage_seconds"].as_i64()
        ),
        (Some(180), Some(105), Some(100)),
        "{u}"
    );
    let grace = week["grace_seconds"].as_i64().unwrap();
    assert!(
        (30..=30 + 15).contains(&grace),
        "grace {grace} s: the plan's 30 s plus one interval at most"
    );
    assert_eq!(week["used_seconds"].as_i64(), Some(180 + 105 + 100 + grace));
    assert_eq!(week["overage_amount"], "0.10");
    assert_eq!(u["month"]["used_seconds"], week["used_seconds"]);
    assert_eq!(u["funding"]["remaining_seconds"], 0);
    assert_eq!(u["funding"]["funded_by"], Value::Null);
    assert_eq!(u["funding"]["overage"]["spent"], "0.10");
    assert_eq!(u["funding"]["overage"]["remaining"], "0.00");
    assert_eq!(u["funding"]["overage"]["cap_reached"], true);

    // The breakdown by who paid says the same.
    let b = srv
        .admin(
            "GET",
            "/v1/orgs/acme/usage/breakdown?group_by=funding",
            None,
        )
        .await;
    let rows = breakdown_rows(&b);
    assert_eq!(
        rows,
        [
            ("plan".into(), 180),
            ("grant".into(), 105),
            ("overage".into(), 100),
            ("grace".into(), grace)
        ],
        "{b}"
    );
    assert_eq!(b["total"]["seconds"], u["month"]["used_seconds"]);

    let grants = srv.admin("GET", "/v1/orgs/acme/grants", None).await;
    let by_id = |id: &Value| {
        grants["grants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["grant_id"] == *id)
            .unwrap()
            .clone()
    };
    let (a, b) = (by_id(&first["grant_id"]), by_id(&late["grant_id"]));
    assert_eq!(
        (a["used_seconds"].as_i64(), a["status"].as_str()),
        (Some(45), Some("used_up")),
        "{a}"
    );
    assert_eq!(
        (b["used_seconds"].as_i64(), b["remaining_seconds"].as_i64()),
        (Some(60), Some(0)),
        "{b}"
    );

    // A cap lowered below what the month spent is taken, and the view says what it means:
    // the spend stays what it was, nothing is left, and the cap is reached.
    let (status, v) = srv
        .call(
            "PUT",
            "/v1/orgs/acme/overage",
            Some(ADMIN),
            Some(&json!({"enabled": true, "monthly_cap": "0.05"})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (
            &v["monthly_cap"],
            &v["spent"],
            &v["remaining"],
            &v["cap_reached"]
        ),
        (&json!("0.05"), &json!("0.10"), &json!("0.00"), &json!(true)),
        "{v}"
    );
    // Everything is spent: a new run is refused with the cap's reason, and nothing taken.
    srv.clock.set(end);
    let d = admit(&srv, "s2").await;
    assert_eq!(
        (d["decision"].as_str(), d["reason"].as_str()),
        (Some("deny"), Some("spend_cap_reached")),
        "{d}"
    );
    // A higher cap lets it run again, paid as it goes.
    srv.admin(
        "PUT",
        "/v1/orgs/acme/overage",
        Some(json!({"enabled": true, "monthly_cap": "0.20"})),
    )
    .await;
    let d = admit(&srv, "s2").await;
    assert_eq!(
        (d["decision"].as_str(), d["funded_by"].as_str()),
        (Some("allow"), Some("overage")),
        "{d}"
    );
    // Without pay-as-you-go, the grants' reason.
    srv.admin(
        "PUT",
        "/v1/orgs/acme/overage",
        Some(json!({"enabled": false})),
    )
    .await;
    let d = admit(&srv, "s3").await;
    assert_eq!(d["reason"], "grants_exhausted", "{d}");
    // A new grant lets it run on the grant.
    grant(&srv, json!({"seconds": 30, "kind": "trial"})).await;
    let d = admit(&srv, "s3").await;
    assert_eq!(d["funded_by"], "grant", "{d}");

    // The prompt prices the ways on for the week's shortfall at this pace: top-up packs
    // (2 h for 2.00) beat pay-as-you-go, which the cap's maximum cannot cover.
    let prompt = srv.admin("GET", "/v1/orgs/acme/upgrade-prompt", None).await;
    let ways = &prompt["ways_on"];
    assert!(ways["shortfall_seconds"].as_i64().unwrap() > 3600, "{ways}");
    assert_eq!(ways["cheapest"], "topup", "{ways}");
    let overage = ways["ways"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["kind"] == "overage")
        .unwrap();
    assert_eq!(overage["covers"], false, "{ways}");

    // Finance's export of the month says the same, to the second and the cent, and
    // closing the month changes none of its bytes.
    let line = org_line(&srv, "acme").await;
    assert_eq!(line["agent_seconds"], u["month"]["used_seconds"], "{line}");
    assert_eq!(line["plan_seconds"], 180);
    assert_eq!(
        (
            line["grant_seconds"].as_i64(),
            line["grant_make_good_seconds"].as_i64(),
            line["grant_promo_seconds"].as_i64()
        ),
        (Some(105), Some(45), Some(60)),
        "{line}"
    );
    assert_eq!(
        (
            line["overage_seconds"].as_i64(),
            line["overage_amount"].as_str()
        ),
        (Some(100), Some("0.10"))
    );
    assert_eq!(line["grace_seconds"].as_i64(), Some(grace));
    assert_eq!(
        (line["amount"].as_str(), line["overage_hours"].as_str()),
        (Some("20.10"), Some("0.0278")),
        "{line}"
    );
    let (_, _, before) = srv
        .get_text(
            "/v1/exports/usage?period=2026-11&format=jsonl",
            "rush-period-state",
        )
        .await;
    srv.clock.set(1_796_083_200 + 3600);
    srv.admin("POST", "/v1/periods/2026-11/close", None).await;
    let (_, state, after) = srv
        .get_text(
            "/v1/exports/usage?period=2026-11&format=jsonl",
            "rush-period-state",
        )
        .await;
    assert_eq!(state.as_deref(), Some("closed"));
    assert_eq!(before, after, "closing changed the export");
}

/// The breakdown by funding reads the funding rollup beside the rest for the billing
/// period it last saw the org with, and again for the org's own when Stripe moved it
/// meanwhile: what grants paid before the new period is not in it.
async fn the_breakdown_by_funding_follows_a_new_period(backend: Backend) {
    let dir = plans_dir();
    let Some(srv) = start_with_plans(backend, dir.path()).await else {
        return;
    };
    setup(&srv).await;
    srv.clock.set(T0);
    grant(&srv, json!({"seconds": 60, "kind": "promo"})).await;
    admit(&srv, "s1").await;
    let end = run_together_until_parked(&srv, "acme", &["s1"], T0).await;
    let by_source = |b: &Value| -> Vec<(String, i64)> {
        let rows = breakdown_rows(b).into_iter();
        rows.filter(|(_, s)| *s != 0).collect()
    };
    let path = "/v1/orgs/acme/usage/breakdown?group_by=funding";
    // The calendar month: seen (and remembered) as such.
    let b = srv.admin("GET", path, None).await;
    assert!(by_source(&b).contains(&("grant".to_owned(), 60)), "{b}");
    // A period from a whole hour after the run: nothing in it yet.
    let start = (end / 3600 + 2) * 3600;
    srv.set_billing_period("acme", start, start + 30 * 86_400)
        .await;
    srv.clock.set(start + 600);
    let b = srv.admin("GET", path, None).await;
    let from = rush_meter_core::time::format_rfc3339(start);
    assert_eq!(b["from"].as_str(), Some(from.as_str()), "{b}");
    assert_eq!(
        (b["total"]["seconds"].as_i64(), by_source(&b)),
        (Some(0), vec![]),
        "{b}"
    );
}

/// An org's line of November's export, as JSON.
async fn org_line(srv: &TestServer, org: &str) -> Value {
    let (status, _, body) = srv
        .get_text(
            "/v1/exports/usage?period=2026-11&format=jsonl",
            "rush-period-state",
        )
        .await;
    assert_eq!(status, 200, "{body}");
    body.lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|v| v["org_id"] == org)
        .unwrap_or_else(|| panic!("no line of {org}: {body}"))
}

async fn a_ceiling_without_grants_or_overage_says_which(backend: Backend) {
    let dir = plans_dir();
    let Some(srv) = start_with_plans(backend, dir.path()).await else {
        return;
    };
    setup(&srv).await;
    srv.clock.set(T0);
    admit(&srv, "s1").await;
    run_together_until_parked(&srv, "acme", &["s1"], T0).await;
    let u = srv.usage("acme").await;
    assert_eq!(u["week"]["plan_seconds"], 180, "{u}");
    assert_eq!(u["week"]["grant_seconds"], 0);
    assert_eq!(u["week"]["overage_seconds"], 0);
    assert_eq!(u["week"]["overage_amount"], "0.00");
    let d = admit(&srv, "s2").await;
    assert_eq!(d["reason"], "weekly_ceiling_reached", "{d}");
    assert_eq!(
        d["remaining"],
        json!({"plan_seconds": 0, "grant_seconds": 0, "overage_seconds": 0})
    );
}

async fn a_grant_funds_only_from_its_start_to_its_expiry_and_voiding_lapses_it(backend: Backend) {
    let dir = plans_dir();
    let Some(srv) = start_with_plans(backend, dir.path()).await else {
        return;
    };
    setup(&srv).await;
    srv.clock.set(T0);
    let fmt = rush_meter_core::time::format_rfc3339;
    // Starts 10 minutes on, lasts 30 minutes: nothing funds past the plan before it.
    let g = grant(
        &srv,
        json!({"seconds": 3600, "kind": "promo",
        "starts_at": fmt(T0 + 600), "expires_at": fmt(T0 + 1800)}),
    )
    .await;
    assert_eq!(g["status"], "scheduled");
    admit(&srv, "s1").await;
    let end = run_together_until_parked(&srv, "acme", &["s1"], T0).await;
    assert!(end < T0 + 600, "parked before the grant started");
    let u = srv.usage("acme").await;
    assert_eq!(u["week"]["grant_seconds"], 0, "{u}");
    // Once it has started, it funds a new run.
    srv.clock.set(T0 + 600);
    let d = admit(&srv, "s2").await;
    assert_eq!(d["funded_by"], "grant", "{d}");
    let end = run_together_until_parked(&srv, "acme", &["s2"], T0 + 600).await;
    assert!(end >= T0 + 1800, "ran on the grant until it expired");
    let g = srv.admin("GET", "/v1/orgs/acme/grants", None).await["grants"][0].clone();
    let used = g["used_seconds"].as_i64().unwrap();
    assert!(
        (1185..=1200).contains(&used),
        "used {used} s of a grant in force for 1200 s"
    );
    assert_eq!(
        (g["status"].as_str(), g["remaining_seconds"].as_i64()),
        (Some("expired"), Some(0))
    );

    // Voiding lapses the remainder and keeps what was used; again changes nothing.
    let v = grant(&srv, json!({"seconds": 600, "kind": "trial"})).await;
    srv.clock.set(T0 + 2000);
    admit(&srv, "s3").await;
    for (seq, t) in [(1, T0 + 2000), (2, T0 + 2015), (3, T0 + 2030)] {
        srv.clock.set(t);
        srv.heartbeats(vec![hb("acme", "s3", seq, "running", t)])
            .await;
    }
    let path = format!(
        "/v1/orgs/acme/grants/{}/void",
        v["grant_id"].as_str().unwrap()
    );
    let voided = srv.admin("POST", &path, None).await;
    assert_eq!(
        (voided["status"].as_str(), voided["used_seconds"].as_i64()),
        (Some("voided"), Some(30)),
        "{voided}"
    );
    let again = srv.admin("POST", &path, None).await;
    assert_eq!(again["voided_at"], voided["voided_at"]);
    srv.clock.set(T0 + 2045);
    let (_, r) = srv
        .heartbeats(vec![hb("acme", "s3", 4, "running", T0 + 2045)])
        .await;
    assert_eq!(r["results"][0]["remaining_seconds"], 0, "{r}");
    let after = srv.admin("GET", "/v1/orgs/acme/grants", None).await;
    let v2 = after["grants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["grant_id"] == v["grant_id"])
        .unwrap()
        .clone();
    assert_eq!(
        v2["used_seconds"], 30,
        "what was used stays, nothing more: {v2}"
    );
}

async fn bad_input_is_refused_in_the_error_format_and_changes_nothing(backend: Backend) {
    let dir = plans_dir();
    let Some(srv) = start_with_plans(backend, dir.path()).await else {
        return;
    };
    setup(&srv).await;
    srv.create_org("poor", "free").await;
    srv.clock.set(T0);
    grant(
        &srv,
        json!({"seconds": 60, "kind": "promo", "idempotency_key": "k-1"}),
    )
    .await;
    let console_other = srv.token(&[Scope::Console], Some("poor")).await;
    let before = srv.db.digest().await.unwrap();
    let fmt = rush_meter_core::time::format_rfc3339;
    let cases: Vec<(&str, &str, Value, u16, &str)> = vec![
        (
            "POST",
            "/v1/orgs/acme/grants",
            json!({"seconds": 0, "kind": "promo"}),
            422,
            "seconds",
        ),
        (
            "POST",
            "/v1/orgs/acme/grants",
            json!({"seconds": -5, "kind": "promo"}),
            422,
            "seconds",
        ),
        (
            "POST",
            "/v1/orgs/acme/grants",
            json!({"seconds": 60, "kind": "gift"}),
            422,
            "kind",
        ),
        (
            "POST",
            "/v1/orgs/acme/grants",
            json!({"seconds": 60, "kind": "promo", "priority": 101}),
            422,
            "priority",
        ),
        (
            "POST",
            "/v1/orgs/acme/grants",
            json!({"seconds": 60, "kind": "promo",
            "starts_at": fmt(T0 + 100), "expires_at": fmt(T0 + 50)}),
            422,
            "expires_at",
        ),
        (
            "POST",
            "/v1/orgs/acme/grants",
            json!({"seconds": 60, "kind": "promo", "expires_at": "tomorrow"}),
            422,
            "expires_at",
        ),
        (
            "POST",
            "/v1/orgs/acme/grants",
            json!({"seconds": 61, "kind": "promo", "idempotency_key": "k-1"}),
            409,
            "idempotency_key",
        ),
        (
            "POST",
            "/v1/orgs/ghost/grants",
            json!({"seconds": 60, "kind": "promo"}),
            404,
            "",
        ),
        (
            "POST",
            "/v1/orgs/acme/grants/grt_nope/void",
            Value::Null,
            404,
            "",
        ),
        (
            "PUT",
            "/v1/orgs/acme/overage",
            json!({"enabled": true}),
            422,
            "monthly_cap",
        ),
        (
            "PUT",
            "/v1/orgs/acme/overage",
            json!({"enabled": true, "monthly_cap": "1.01"}),
            422,
            "monthly_cap",
        ),
        (
            "PUT",
            "/v1/orgs/acme/overage",
            json!({"enabled": true, "monthly_cap": "-1"}),
            422,
            "monthly_cap",
        ),
        (
            "PUT",
            "/v1/orgs/acme/overage",
            json!({"enabled": true, "monthly_cap": "0.001"}),
            422,
            "monthly_cap",
        ),
        (
            "PUT",
            "/v1/orgs/acme/overage",
            json!({"enabled": true, "monthly_cap": "lots"}),
            422,
            "monthly_cap",
        ),
        (
            "PUT",
            "/v1/orgs/poor/overage",
            json!({"enabled": true, "monthly_cap": "1.00"}),
            422,
            "enabled",
        ),
    ];
    for (method, path, body, status, field) in cases {
        let body = (!body.is_null()).then_some(body);
        let (s, v) = srv.call(method, path, Some(ADMIN), body.as_ref()).await;
        assert_eq!(s, status, "{method} {path} {body:?}: {v}");
        assert!(v["error"]["code"].is_string(), "{v}");
        if !field.is_empty() {
            assert_eq!(v["error"]["field"], field, "{v}");
        }
    }
    // A console token sets its own org's pay-as-you-go only, and grants none.
    let (s, _) = srv
        .call(
            "PUT",
            "/v1/orgs/acme/overage",
            Some(&console_other),
            Some(&json!({"enabled": false})),
        )
        .await;
    assert_eq!(s, 404);
    let (s, _) = srv
        .call(
            "POST",
            "/v1/orgs/poor/grants",
            Some(&console_other),
            Some(&json!({"seconds": 60, "kind": "promo"})),
        )
        .await;
    assert_eq!(s, 403);
    assert_eq!(
        srv.db.digest().await.unwrap(),
        before,
        "a refused request wrote something"
    );
    // The same key with the same values answers the first grant and makes none.
    let (s, v) = srv
        .call(
            "POST",
            "/v1/orgs/acme/grants",
            Some(ADMIN),
            Some(&json!({"seconds": 60, "kind": "promo", "idempotency_key": "k-1"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(srv.db.digest().await.unwrap(), before);
}

/// `n` sessions, each beating every 15 s at its own offset and parking as soon as an
/// answer says so, run into the cap through `servers` in turn. Returns the week's figures.
async fn run_into_the_cap(servers: &[&TestServer], n: usize) -> Value {
    let srv = servers[0];
    srv.admin(
        "PUT",
        "/v1/orgs/acme/overage",
        Some(json!({"enabled": true, "monthly_cap": "0.05"})),
    )
    .await;
    let sessions: Vec<String> = (0..n).map(|i| format!("s{i}")).collect();
    for s in &sessions {
        let d = admit(srv, s).await;
        assert_eq!(d["decision"], "allow", "{d}");
    }
    let run = common::run_staggered_until_parked(servers, "acme", &sessions).await;
    assert_eq!(run.told, n);
    srv.usage("acme").await["week"].clone()
}

/// The bound (docs/funding.md): past the cap, time runs as grace, never charged, for at
/// most the plan's grace plus two intervals a session running then (one for the answer
/// that says park to arrive, one to park).
fn assert_the_cap_holds(week: &Value, n: i64) {
    assert_eq!(week["overage_seconds"], 50, "{week}");
    assert_eq!(
        week["overage_amount"], "0.05",
        "charged exactly the cap: {week}"
    );
    let grace = week["grace_seconds"].as_i64().unwrap();
    let bound = 30 + n * 2 * 15;
    assert!(grace >= 30, "{week}");
    assert!(
        grace <= bound,
        "grace {grace} s is past the bound of {bound} s: {week}"
    );
    eprintln!(
        "{n} sessions: {grace} s of grace past the cap (bound {bound} s), 0.00 charged past it"
    );
}

async fn many_sessions_pass_the_cap_in_time_by_the_bound_at_most_and_never_in_money(
    backend: Backend,
) {
    let dir = plans_dir();
    let Some(srv) = start_with_plans(backend, dir.path()).await else {
        return;
    };
    setup(&srv).await;
    srv.clock.set(T0);
    let week = run_into_the_cap(&[&srv], 8).await;
    assert_the_cap_holds(&week, 8);
    let d = admit(&srv, "late").await;
    assert_eq!(d["reason"], "spend_cap_reached", "{d}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_hold_the_cap_between_them() {
    let dir = plans_dir();
    let Some((a, b)) = two_instances(dir.path()).await else {
        return;
    };
    setup(&a).await;
    a.clock.set(T0);
    b.clock.set(T0);
    let week = run_into_the_cap(&[&a, &b], 8).await;
    assert_the_cap_holds(&week, 8);
    b.finish().await;
    a.finish().await;
}

async fn the_cap_and_grants_are_notified_once_each(backend: Backend) {
    let dir = plans_dir();
    // Nothing listens: recording is what is checked (delivery is tests/notify.rs's).
    let Some(srv) = TestServer::start_with(
        backend,
        Options {
            plans_dir: dir.path().to_path_buf(),
            notify: Some(rush_meter::config::NotifyConfig {
                url: "http://127.0.0.1:9/hook".into(),
                secret: secrecy::SecretString::from("notify-secret-0123456789"),
            }),
            ..Options::default()
        },
    )
    .await
    else {
        return;
    };
    setup(&srv).await;
    srv.clock.set(T0);
    let fmt = rush_meter_core::time::format_rfc3339;
    let used = grant(&srv, json!({"seconds": 45, "kind": "promo"})).await;
    // Not in force yet, and expiring within 7 days: notified as expiring, never used.
    let later = grant(
        &srv,
        json!({"seconds": 600, "kind": "trial",
        "starts_at": fmt(T0 + 86_400), "expires_at": fmt(T0 + 3 * 86_400)}),
    )
    .await;
    srv.admin(
        "PUT",
        "/v1/orgs/acme/overage",
        Some(json!({"enabled": true, "monthly_cap": "0.10"})),
    )
    .await;
    admit(&srv, "s1").await;
    run_together_until_parked(&srv, "acme", &["s1"], T0).await;
    let want: Vec<(String, i64)> = vec![
        ("cap".into(), 50),
        ("cap".into(), 80),
        ("cap".into(), 100),
        (
            format!("grant_expiring:{}", later["grant_id"].as_str().unwrap()),
            100,
        ),
        (
            format!("grant_used_up:{}", used["grant_id"].as_str().unwrap()),
            100,
        ),
    ];
    let recorded = || async {
        let mut got: Vec<(String, i64)> = srv
            .admin("GET", "/v1/admin/notifications?org_id=acme", None)
            .await["notifications"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["window"] != "week" && n["window"] != "month")
            .map(|n| {
                (
                    n["window"].as_str().unwrap().to_owned(),
                    n["threshold_percent"].as_i64().unwrap(),
                )
            })
            .collect();
        got.sort();
        got
    };
    eventually(30, "the cap and both grants are notified", || async {
        recorded().await == want
    })
    .await;
    // Seen again on later heartbeats and scans: still once each.
    let t = T0 + 3600;
    srv.clock.set(t);
    admit(&srv, "s2").await;
    srv.heartbeats(vec![hb("acme", "s2", 1, "running", t)])
        .await;
    srv.heartbeats(vec![hb("acme", "s2", 2, "running", t + 15)])
        .await;
    assert_eq!(recorded().await, want);
}

every_backend!(
    the_cap_and_grants_are_notified_once_each,
    many_sessions_pass_the_cap_in_time_by_the_bound_at_most_and_never_in_money,
    sources_in_order,
    the_breakdown_by_funding_follows_a_new_period,
    a_ceiling_without_grants_or_overage_says_which,
    a_grant_funds_only_from_its_start_to_its_expiry_and_voiding_lapses_it,
    bad_input_is_refused_in_the_error_format_and_changes_nothing
);

/// A booking that waits for another's lock of its org reads the org's funding after the
/// wait: what the other committed (here, funds of the month and week windows) is added to,
/// never written over (a read in the statement that waited would see the funding from
/// before it). PostgreSQL only: on SQLite a writer holds the database's write lock
/// throughout its transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_booking_waiting_for_its_orgs_lock_reads_the_funding_committed_meanwhile() {
    let dir = plans_dir();
    let Some(srv) = start_with_plans(Backend::Postgres, dir.path()).await else {
        return;
    };
    setup(&srv).await;
    srv.clock.set(T0);
    assert_eq!(admit(&srv, "s1").await["decision"], "allow");
    for (seq, at) in [(1, T0), (2, T0 + 15)] {
        srv.clock.set(at);
        let (status, v) = srv
            .heartbeats(vec![hb("acme", "s1", seq, "running", at)])
            .await;
        assert_eq!(status, 200, "{v}");
    }
    let rush_meter::store::Pools::Postgres(pool) = srv.db.pools() else {
        unreachable!("a PostgreSQL server")
    };
    let month_plan_seconds = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT plan_seconds FROM funding_windows WHERE org_id = 'acme' AND kind = 'month'",
        )
        .fetch_one(pool)
        .await
        .unwrap()
    };
    assert_eq!(month_plan_seconds().await, 15);
    // Another booking of acme, in the middle of its transaction: the org locked, and 100
    // more seconds funded by the plan (of its 180 a week).
    let mut other = pool.begin().await.unwrap();
    sqlx::query("SELECT org_id FROM orgs WHERE org_id = $1 FOR NO KEY UPDATE")
        .bind("acme")
        .execute(&mut *other)
        .await
        .unwrap();
    sqlx::query("UPDATE funding_windows SET plan_seconds = plan_seconds + 100 WHERE org_id = $1")
        .bind("acme")
        .execute(&mut *other)
        .await
        .unwrap();
    let commit_once_waited_for = async {
        eventually(
            30,
            "the heartbeats' booking waits for the org's lock",
            || async {
                let waiting: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
                )
                .fetch_one(pool)
                .await
                .unwrap();
                waiting > 0
            },
        )
        .await;
        other.commit().await.unwrap();
    };
    srv.clock.set(T0 + 30);
    let ((status, v), ()) = tokio::join!(
        srv.heartbeats(vec![hb("acme", "s1", 3, "running", T0 + 30)]),
        commit_once_waited_for
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        month_plan_seconds().await,
        15 + 100 + 15,
        "the waiting booking added its 15 s to what the other committed"
    );
}
