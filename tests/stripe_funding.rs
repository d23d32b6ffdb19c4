//! Past the plan, through Stripe: top-ups bought in Checkout (a recording stub: localstripe
//! has no Checkout) and granted once when paid; pay-as-you-go charged once a billing
//! window as an invoice item (localstripe), and the invoice report reconciling it to the
//! cent. On SQLite and PostgreSQL.

mod common;

use std::sync::{Arc, Mutex};

use common::localstripe::{stripe_at, LocalStripe};
use common::{eventually, mini_plans, Backend, Options, TestServer, ADMIN};
use rush_meter::config::StripeConfig;
use rush_meter_core::signature::sign;
use serde_json::{json, Value};

const SECRET: &str = common::localstripe::WEBHOOK_SECRET;

/// Requests a stub Stripe was sent: method, path, form body.
type Sent = Arc<Mutex<Vec<(String, String, String)>>>;

/// Stripe as far as a top-up goes: a customer and a Checkout Session; records every call.
async fn stripe_stub() -> (String, Sent) {
    use axum::http::{Method, Uri};
    let sent: Sent = Arc::default();
    let log = sent.clone();
    let app = axum::Router::new().fallback(move |method: Method, uri: Uri, body: String| {
        let log = log.clone();
        async move {
            let n = {
                let mut l = log.lock().unwrap();
                l.push((method.to_string(), uri.path().to_owned(), body));
                l.len()
            };
            let (status, body) = match (method.as_str(), uri.path()) {
                ("POST", "/v1/customers") => (200, json!({"id": format!("cus_stub{n}"), "object": "customer", "metadata": {}})),
                ("POST", "/v1/checkout/sessions") => (200, json!({"id": format!("cs_stub{n}"), "url": format!("https://checkout.stripe.test/{n}")})),
                _ => (404, json!({"error": {"type": "invalid_request_error", "message": "the stub has no such route"}})),
            };
            (axum::http::StatusCode::from_u16(status).unwrap(), axum::Json(body))
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, sent)
}

async fn start(
    backend: Backend,
    dir: &tempfile::TempDir,
    stripe: StripeConfig,
    at: i64,
) -> Option<TestServer> {
    TestServer::start_with(
        backend,
        Options {
            plans_dir: dir.path().to_path_buf(),
            stripe,
            clock_start: at,
            ..Options::default()
        },
    )
    .await
}

/// Deliver a Stripe event, signed as Stripe signs it, at the server's time.
async fn deliver(srv: &TestServer, id: &str, kind: &str, object: Value) -> u16 {
    let now = srv.clock.now();
    let body = json!({"id": id, "object": "event", "type": kind, "created": now,
                      "data": {"object": object}})
    .to_string();
    srv.client
        .post(format!("{}/v1/stripe/webhook", srv.url))
        .header("Stripe-Signature", sign(SECRET, now, body.as_bytes()))
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn events_done(srv: &TestServer) -> bool {
    let v = srv
        .admin("GET", "/v1/admin/stripe/events?state=pending", None)
        .await;
    v["events"].as_array().unwrap().is_empty()
}

async fn purchased(srv: &TestServer) -> Vec<Value> {
    srv.admin("GET", "/v1/orgs/acme/grants", None).await["grants"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["kind"] == "purchased")
        .cloned()
        .collect()
}

async fn a_top_up_is_bought_in_checkout_and_granted_once_when_paid(backend: Backend) {
    let dir = mini_plans();
    let (base, sent) = stripe_stub().await;
    let Some(srv) = start(backend, &dir, stripe_at(&base), common::T0).await else {
        return;
    };
    srv.create_org("acme", "mini").await;
    srv.create_org("poor", "free").await;
    let console = srv
        .token(&[rush_meter::tokens::Scope::Console], Some("acme"))
        .await;
    let before = srv.db.digest().await.unwrap();
    // Packs the plan does not sell, and a plan that sells none, are refused first.
    for (org, hours, message) in [
        ("acme", 3, "packs of 1, 2 hours"),
        ("poor", 1, "sells no top-ups"),
    ] {
        let (status, v) = srv
            .call(
                "POST",
                &format!("/v1/orgs/{org}/topups"),
                Some(ADMIN),
                Some(&json!({"hours": hours})),
            )
            .await;
        assert_eq!(
            (status, v["error"]["field"].as_str()),
            (422, Some("hours")),
            "{v}"
        );
        assert!(
            v["error"]["message"].as_str().unwrap().contains(message),
            "{v}"
        );
    }
    assert_eq!(srv.db.digest().await.unwrap(), before);
    assert!(
        sent.lock().unwrap().is_empty(),
        "nothing was sent to Stripe"
    );

    let (status, t) = srv
        .call(
            "POST",
            "/v1/orgs/acme/topups",
            Some(&console),
            Some(&json!({"hours": 2})),
        )
        .await;
    assert_eq!(status, 200, "{t}");
    assert_eq!(
        (
            t["amount"].as_str(),
            t["currency"].as_str(),
            t["expires_after_days"].as_i64()
        ),
        (Some("2.00"), Some("usd"), Some(365))
    );
    let session = t["session_id"].as_str().unwrap().to_owned();
    {
        let sent = sent.lock().unwrap();
        let (_, _, form) = sent
            .iter()
            .find(|(_, p, _)| p == "/v1/checkout/sessions")
            .unwrap();
        let form = urlencoding_pairs(form);
        for (k, v) in [
            ("mode", "payment"),
            ("line_items[0][quantity]", "2"),
            ("line_items[0][price_data][unit_amount]", "100"),
            ("line_items[0][price_data][currency]", "usd"),
            ("metadata[rush_meter_kind]", "topup"),
            ("metadata[hours]", "2"),
            ("metadata[org_id]", "acme"),
        ] {
            assert!(
                form.contains(&(k.to_owned(), v.to_owned())),
                "{k}={v} not in {form:?}"
            );
        }
    }
    let paid = |status: &str| {
        json!({"id": session, "object": "checkout.session", "mode": "payment",
        "payment_status": status, "status": "complete", "client_reference_id": "acme",
        "metadata": {"org_id": "acme", "rush_meter_kind": "topup", "hours": "2"}})
    };
    // A payment that clears later: nothing yet.
    assert_eq!(
        deliver(&srv, "evt_t1", "checkout.session.completed", paid("unpaid")).await,
        200
    );
    eventually(30, "the event is done", || events_done(&srv)).await;
    assert!(purchased(&srv).await.is_empty());
    // Cleared, and the event delivered twice, and a completed one after it: one grant.
    for id in ["evt_t2", "evt_t2", "evt_t3"] {
        let kind = if id == "evt_t3" {
            "checkout.session.completed"
        } else {
            "checkout.session.async_payment_succeeded"
        };
        assert_eq!(deliver(&srv, id, kind, paid("paid")).await, 200);
    }
    eventually(30, "the events are done", || events_done(&srv)).await;
    let grants = purchased(&srv).await;
    assert_eq!(grants.len(), 1, "{grants:?}");
    let g = &grants[0];
    assert_eq!(
        (g["seconds"].as_i64(), g["status"].as_str()),
        (Some(7200), Some("active")),
        "{g}"
    );
    assert_eq!(
        g["expires_at"],
        rush_meter_core::time::format_rfc3339(srv.clock.now() + 365 * 86_400)
    );
    // The bill preview lists it as paid, at what the session charged, never again.
    let p = srv
        .admin("GET", "/v1/orgs/acme/invoice-preview", None)
        .await;
    let topups: Vec<&Value> = p["lines"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["kind"] == "topup")
        .collect();
    assert_eq!(topups.len(), 1, "{p}");
    assert_eq!(
        (
            topups[0]["amount"].as_str(),
            topups[0]["seconds"].as_i64(),
            topups[0]["invoiced"].as_bool()
        ),
        (t["amount"].as_str(), Some(7200), Some(false)),
        "{p}"
    );
    assert_eq!(p["due"], "20.00", "a top-up is not charged again: {p}");
    // It funds past the plan like any grant.
    srv.admin("PUT", "/v1/orgs/acme/keys/k1", Some(json!({})))
        .await;
    let d = srv.admit("acme", "k1", "s1").await;
    assert_eq!(d["remaining"]["grant_seconds"], 7200, "{d}");
}

/// `a=1&b=2` as pairs, percent-decoded.
fn urlencoding_pairs(form: &str) -> Vec<(String, String)> {
    url::form_urlencoded::parse(form.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn real_now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// A server on the mini plans at the real time, its Stripe a localstripe (None where
/// localstripe or PostgreSQL is not here, outside CI).
async fn on_localstripe(
    backend: Backend,
) -> Option<(tempfile::TempDir, LocalStripe, TestServer, i64)> {
    let dir = mini_plans();
    let ls = LocalStripe::start().await?;
    let now = real_now();
    let srv = start(backend, &dir, stripe_at(&ls.url), now).await?;
    Some((dir, ls, srv, now))
}

async fn pay_as_you_go_is_charged_once_a_window_and_reconciled_to_the_cent(backend: Backend) {
    let Some((dir, ls, srv, now)) = on_localstripe(backend).await else {
        return;
    };
    ls.register_webhook(&format!("{}/v1/stripe/webhook", srv.url), SECRET)
        .await;
    srv.create_org("acme", "free").await;
    srv.admin("PUT", "/v1/orgs/acme/keys/k1", Some(json!({})))
        .await;
    let customer = ls.customer(Some("acme")).await;
    ls.subscribe(&customer, "pro_monthly").await;
    eventually(30, "the subscription makes acme mini", || async {
        srv.db.get_org("acme").await.unwrap().unwrap().plan_id == "mini"
    })
    .await;
    let org = srv.db.get_org("acme").await.unwrap().unwrap();
    let window = org
        .billing_period()
        .expect("the subscription's period is the month window");
    // Past the week's 180 s and 100 s of pay-as-you-go (the 0.10 cap), then parked.
    common::run_past_the_plan_to_the_cap(&srv, "acme", now).await;
    let overage = srv.admin("GET", "/v1/orgs/acme/overage", None).await;
    assert_eq!(
        (
            overage["overage_seconds"].as_i64(),
            overage["spent"].as_str()
        ),
        (Some(100), Some("0.10")),
        "{overage}"
    );

    // The bill preview at the window's last second: its pay-as-you-go line is the item
    // the job sends.
    srv.clock.set(window.end - 1);
    let p = srv
        .admin("GET", "/v1/orgs/acme/invoice-preview", None)
        .await;
    let paygo = p["lines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["kind"] == "pay_as_you_go")
        .unwrap_or_else(|| panic!("{p}"))
        .clone();
    assert_eq!(
        (paygo["seconds"].as_i64(), paygo["amount"].as_str()),
        (Some(100), Some("0.10")),
        "{p}"
    );
    // The window ends; two hours on, the billing job charges it: one item of 10 cents.
    srv.clock.set(window.end + 2 * 3600 + 1);
    let items = || ls.invoice_items(&customer);
    // The job records "charged" after Stripe answers, so wait on the record, not on
    // Stripe's item (which exists a moment before the record says so).
    eventually(60, "the window's pay-as-you-go is charged", || async {
        let charges = srv.db.overage_charges("acme").await.unwrap();
        charges.iter().any(|c| c.state == "charged")
    })
    .await;
    let charged = srv.db.overage_charges("acme").await.unwrap();
    assert_eq!(charged.len(), 1, "{charged:?}");
    assert_eq!(
        (
            charged[0].state.as_str(),
            charged[0].amount.as_str(),
            charged[0].window_start
        ),
        ("charged", "0.10", window.start)
    );
    let list = items().await;
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(
        (
            list[0]["amount"].as_i64(),
            list[0]["metadata"]["rush_meter_kind"].as_str()
        ),
        (Some(10), Some("overage"))
    );
    assert_eq!(
        list[0]["metadata"]["window_start"],
        window.start.to_string()
    );
    // The item is the preview's line, in Stripe's minor units.
    let cents: i64 = paygo["amount"]
        .as_str()
        .unwrap()
        .replace('.', "")
        .parse()
        .unwrap();
    assert_eq!(list[0]["amount"].as_i64(), Some(cents), "{paygo}");
    let plans = std::sync::Arc::new(rush_meter::config::load_plans(dir.path()).unwrap());
    let billing = rush_meter::billing::Billing::new(
        srv.db.clone(),
        plans,
        srv.clock.clone(),
        stripe_at(&ls.url),
        Default::default(),
    );
    // The job's step, run again: it sends nothing; still one charge, one item.
    let settled = srv.db.overage_charges("acme").await.unwrap();
    let sent = rush_meter::billing::funding::charge_due(&billing, window.end + 3600, None)
        .await
        .unwrap();
    assert_eq!(sent, 0);
    assert_eq!(srv.db.overage_charges("acme").await.unwrap(), settled);
    assert_eq!(items().await.len(), 1);

    // Stripe invoices the pending item (the next invoice of the customer); the report
    // reconciles it to the cent.
    ls.post("/v1/invoices", &[("customer", &customer)]).await;
    let month = rush_meter_core::time::calendar_month(window.start);
    let lines = rush_meter::billing::invoice_report::invoice_report(&billing, month, |_| {})
        .await
        .unwrap();
    let line = lines.iter().find(|l| l.org_id == "acme").unwrap();
    assert_eq!(
        (
            line.overage_owed.to_string(),
            line.overage_invoiced.to_string()
        ),
        ("0.10".into(), "0.10".into()),
        "{line:?}"
    );
    // localstripe has no clock: an invoice made now bills the subscription's current
    // period again (Stripe's renewal bills the next one, in the next month). All else
    // reconciles: the plan's 20.00 and the 0.10 of pay-as-you-go.
    assert_eq!(
        (line.ledger_owes.to_string(), line.difference.to_string()),
        ("20.10".into(), "20.00".into()),
        "{line:?}"
    );
}

/// Run `sql` with `binds` (text) on the server's database, as a writer.
async fn execute(srv: &TestServer, sql: &str, binds: &[&str]) {
    match srv.db.pools() {
        rush_meter::store::Pools::Postgres(pool) => {
            let q = binds.iter().fold(sqlx::query(sql), |q, b| q.bind(*b));
            q.execute(pool).await.unwrap();
        }
        rush_meter::store::Pools::Sqlite { write, .. } => {
            let q = binds.iter().fold(sqlx::query(sql), |q, b| q.bind(*b));
            q.execute(write).await.unwrap();
        }
    }
}

/// A charge Stripe refuses (its customer deleted) holds up no other org's: the billing
/// job sends the next one and tries the refused one again.
async fn a_refused_charge_holds_up_no_other(backend: Backend) {
    let Some((_dir, ls, srv, now)) = on_localstripe(backend).await else {
        return;
    };
    for org in ["gone", "acme"] {
        srv.create_org(org, "mini").await;
    }
    let customer = ls.customer(Some("acme")).await;
    execute(
        &srv,
        "UPDATE orgs SET stripe_customer_id = $1 WHERE org_id = $2",
        &["cus_deleted", "gone"],
    )
    .await;
    execute(
        &srv,
        "UPDATE orgs SET stripe_customer_id = $1 WHERE org_id = $2",
        &[&customer, "acme"],
    )
    .await;
    // Two charges recorded and not yet sent, the refused one first.
    for (org, created) in [("gone", now - 20), ("acme", now - 10)] {
        let (start, end, created) = (
            (now - 90_000).to_string(),
            (now - 3_600).to_string(),
            created.to_string(),
        );
        execute(
            &srv,
            "INSERT INTO overage_charges (org_id, window_start, window_end, overage_seconds, \
               charge_units, amount, currency, state, created_at) \
             VALUES ($1, CAST($2 AS BIGINT), CAST($3 AS BIGINT), 100, 1000000, '0.10', 'usd', \
               'pending', CAST($4 AS BIGINT))",
            &[org, &start, &end, &created],
        )
        .await;
    }
    let state = |org: &'static str| {
        let srv = &srv;
        async move { srv.db.overage_charges(org).await.unwrap()[0].state.clone() }
    };
    eventually(60, "acme's charge is sent past the refused one", || async {
        state("acme").await == "charged"
    })
    .await;
    let items = ls.invoice_items(&customer).await;
    assert_eq!(items.len(), 1, "{items:?}");
    // The refused one is tried again after a backoff, not at every run: the meter's clock
    // stands still, so it has been tried once.
    let gone = || async { srv.db.overage_charges("gone").await.unwrap()[0].clone() };
    let row = gone().await;
    assert_eq!(
        (row.state.as_str(), row.attempts, row.next_attempt_at),
        ("pending", 1, now + rush_meter_core::retry::backoff(1)),
        "{row:?}"
    );
    assert!(row.last_error.is_some(), "{row:?}");
    // Its last try: then it is failed, audited and counted, and tried no more.
    let last = (rush_meter_core::retry::MAX_ATTEMPTS - 1).to_string();
    execute(
        &srv,
        "UPDATE overage_charges SET attempts = CAST($1 AS BIGINT) WHERE org_id = $2",
        &[&last, "gone"],
    )
    .await;
    srv.clock.advance(rush_meter_core::retry::backoff(1));
    eventually(60, "the charge is given up after its tries", || async {
        gone().await.state == "failed"
    })
    .await;
    assert_eq!(
        srv.metric("rush_meter_overage_charges_failed_total").await,
        1.0
    );
    let (_, log) = srv
        .call("GET", "/v1/orgs/gone/audit", Some(ADMIN), None)
        .await;
    assert!(log.to_string().contains("overage_charge.failed"), "{log}");
    let (status, v) = srv
        .call("GET", "/v1/orgs/gone/overage/charges", Some(ADMIN), None)
        .await;
    assert_eq!(
        (status, &v["charges"][0]["state"]),
        (200, &json!("failed")),
        "{v}"
    );
    // An admin puts it back once the cause is fixed: tried at once.
    let (status, v) = srv
        .call(
            "POST",
            "/v1/orgs/gone/overage/charges/retry",
            Some(ADMIN),
            None,
        )
        .await;
    assert_eq!((status, &v["requeued"]), (200, &json!(1)), "{v}");
    eventually(60, "the charge put back is tried again", || async {
        let r = gone().await;
        r.state == "pending" && r.attempts == 1
    })
    .await;
}

every_backend!(
    a_top_up_is_bought_in_checkout_and_granted_once_when_paid,
    pay_as_you_go_is_charged_once_a_window_and_reconciled_to_the_cent,
    a_refused_charge_holds_up_no_other,
);
