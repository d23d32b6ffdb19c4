//! The bill preview: the period's lines as they will be invoiced, exact to the cent; the
//! pay-as-you-go line taken at the period's end equals the charge the billing job records
//! for the window and the closed period's export; the projection is the pace so far, capped.

mod common;

use common::{eventually, hb, mini_plans, start_with_plans, Backend, TestServer, ADMIN, T0};
use serde_json::{json, Value};

/// 2026-12-01 00:00 UTC: the end of November, the month window T0 is in.
const DEC1: i64 = 1_796_083_200;

fn line<'a>(p: &'a Value, kind: &str) -> &'a Value {
    p["lines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} line: {p}"))
}

async fn preview(srv: &TestServer) -> Value {
    srv.admin("GET", "/v1/orgs/acme/invoice-preview", None)
        .await
}

every_backend!(the_preview_is_what_the_period_charges);

async fn the_preview_is_what_the_period_charges(backend: Backend) {
    let dir = mini_plans();
    let Some(srv) = start_with_plans(backend, dir.path()).await else {
        return;
    };
    srv.create_org("acme", "mini").await;
    srv.admin("PUT", "/v1/orgs/acme/keys/k1", Some(json!({})))
        .await;
    srv.admin(
        "PUT",
        "/v1/orgs/acme/overage",
        Some(json!({"enabled": true, "monthly_cap": "1.00"})),
    )
    .await;
    // Nothing used: the plan's price alone, pay-as-you-go at nothing so far.
    let p = preview(&srv).await;
    assert_eq!(
        (
            p["due"].as_str(),
            p["projected"].as_str(),
            p["currency"].as_str()
        ),
        (Some("20.00"), Some("20.00"), Some("usd")),
        "{p}"
    );
    assert_eq!(
        line(&p, "plan")["description"],
        "Mini v1, the period's price"
    );
    assert_eq!(
        p["not_included"],
        json!(["proration", "tax", "discounts", "customer balance"])
    );

    // 600 s from T0 (Monday 2026-11-30 12:00): the week's 180 s of plan, then 420 s of
    // pay-as-you-go at 3.60 an hour (a tenth of a cent a second).
    srv.admit("acme", "k1", "s1").await;
    for (i, t) in (0..=600).step_by(15).enumerate() {
        srv.clock.set(T0 + t);
        let state = if t == 600 { "parked" } else { "running" };
        let (status, v) = srv
            .heartbeats(vec![hb("acme", "s1", i as i64 + 1, state, T0 + t)])
            .await;
        assert_eq!(status, 200, "{v}");
    }
    let p = preview(&srv).await;
    let paygo = line(&p, "pay_as_you_go");
    assert_eq!(
        (
            paygo["seconds"].as_i64(),
            paygo["unit_price"].as_str(),
            paygo["amount"].as_str()
        ),
        (Some(420), Some("3.60"), Some("0.42")),
        "{p}"
    );
    assert_eq!(p["due"], "20.42");
    // The pace so far (600 s since November 1) over the 42,600 s left of the month, all of
    // it pay-as-you-go: the week's plan is spent and the cap is far.
    let now = T0 + 600;
    let to_come = 600 * (DEC1 - now) / (now - (DEC1 - 30 * 86_400));
    assert_eq!(
        p["projected_pay_as_you_go_seconds"].as_i64(),
        Some(420 + to_come),
        "{p}"
    );
    // A tenth of a cent a second, rounded once to the cent.
    let cents = (420 + to_come + 5) / 10;
    assert_eq!(
        p["projected_pay_as_you_go_amount"],
        format!("{}.{:02}", cents / 100, cents % 100)
    );
    // A usage page says the same of the month.
    let u = srv.usage("acme").await;
    assert_eq!(u["month"]["overage_seconds"], paygo["seconds"]);
    assert_eq!(u["month"]["overage_amount"], paygo["amount"]);

    // The period's last second: what it charges now is all it will.
    srv.clock.set(DEC1 - 1);
    let last = preview(&srv).await;
    assert_eq!(last["due"], last["projected"], "{last}");
    let at_end = line(&last, "pay_as_you_go").clone();
    // Two hours after the window, the billing job closes it: its charge is the line.
    srv.clock.set(DEC1 + 2 * 3600 + 1);
    eventually(60, "the window's pay-as-you-go is recorded", || async {
        !srv.db.overage_charges("acme").await.unwrap().is_empty()
    })
    .await;
    let charges = srv
        .admin("GET", "/v1/orgs/acme/overage/charges", None)
        .await;
    let c = &charges["charges"][0];
    assert_eq!(
        (c["overage_seconds"].as_i64(), c["amount"].as_str()),
        (at_end["seconds"].as_i64(), at_end["amount"].as_str()),
        "{charges} against {at_end}"
    );
    // And the closed month's export.
    srv.admin("POST", "/v1/periods/2026-11/close", None).await;
    let (status, _, body) = srv
        .get_text(
            "/v1/exports/usage?period=2026-11&format=jsonl",
            "rush-period-state",
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let row: Value = serde_json::from_str(body.lines().next().unwrap()).unwrap();
    assert_eq!(
        (
            row["overage_seconds"].as_i64(),
            row["overage_amount"].as_str()
        ),
        (at_end["seconds"].as_i64(), at_end["amount"].as_str()),
        "{row}"
    );

    // Readers of another org, or none, get nothing.
    let ingest = srv.token(&[rush_meter::tokens::Scope::Ingest], None).await;
    let (status, _) = srv
        .call("GET", "/v1/orgs/acme/invoice-preview", Some(&ingest), None)
        .await;
    assert_eq!(status, 403);
    let (status, v) = srv
        .call("GET", "/v1/orgs/nobody/invoice-preview", Some(ADMIN), None)
        .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (404, Some("org_not_found"))
    );
}
