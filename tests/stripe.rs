//! Stripe through localstripe: subscriptions followed through its real webhooks and
//! checkout, reconciliation repairing lost webhooks, a crash between Stripe's answer and
//! the commit, and the invoice report. Webhooks delivered by hand: tests/stripe_webhooks.rs.

mod common;

use common::localstripe::{LocalStripe, KEY};
use common::webhooks::{deliver, event, event_states, start, webhooks_only, SECRET};
use common::{eventually, Backend, TestServer, ADMIN};
use rush_meter::config::StripeConfig;
use rush_meter_core::ledger::Secs;
use rush_meter_core::signature::sign;
use secrecy::SecretString;
use serde_json::{json, Value};

every_backend!(
    subscriptions_follow_stripe_through_real_webhooks,
    stripe_down_never_blocks_the_gate_and_reconcile_repairs_lost_webhooks,
    a_crash_between_stripes_answer_and_the_commit_leaves_one_customer,
    the_invoice_report_sets_the_ledger_against_stripes_invoices,
);

fn with_stripe(ls: &LocalStripe) -> StripeConfig {
    StripeConfig {
        secret_key: Some(SecretString::from(KEY)),
        api_base: ls.url.clone(),
        ..webhooks_only()
    }
}

/// `rush-meter <args>` on the server's database, against localstripe.
fn stripe_cli(srv: &TestServer, ls: &LocalStripe, args: &[&str]) -> std::process::Output {
    // The command's name first: the Stripe and plan flags are its own.
    std::process::Command::new(env!("CARGO_BIN_EXE_rush-meter"))
        .args(args)
        .args([
            "--database-url",
            &srv.database_url,
            "--stripe-secret-key",
            KEY,
        ])
        .args(["--stripe-api-base", &ls.url])
        .args(["--plans-dir", concat!(env!("CARGO_MANIFEST_DIR"), "/plans")])
        .env("RUST_LOG", "error")
        .output()
        .unwrap()
}

/// `POST /v1/orgs/{org}/checkout` with `body`.
async fn checkout(srv: &TestServer, org: &str, token: Option<&str>, body: &Value) -> (u16, Value) {
    let path = format!("/v1/orgs/{org}/checkout");
    srv.call("POST", &path, token, Some(body)).await
}

fn real_now() -> Secs {
    chrono::Utc::now().timestamp()
}

async fn plan_of(srv: &TestServer, org: &str) -> (String, Option<String>) {
    let o = srv.db.get_org(org).await.unwrap().unwrap();
    (o.plan_id, o.subscription_status)
}

async fn wait_for_plan(srv: &TestServer, org: &str, plan: &str, what: &str) {
    eventually(20, what, || async { plan_of(srv, org).await.0 == plan }).await;
}

async fn subscriptions_follow_stripe_through_real_webhooks(backend: Backend) {
    let Some(ls) = LocalStripe::start().await else {
        return;
    };
    let Some(srv) = start(backend, with_stripe(&ls), real_now()).await else {
        return;
    };
    ls.register_webhook(&format!("{}/v1/stripe/webhook", srv.url), SECRET)
        .await;
    srv.create_org("org_1", "free").await;
    srv.admin("PUT", "/v1/orgs/org_1/keys/k1", Some(json!({})))
        .await;

    // A subscription made in Stripe reaches the org through customer.subscription.created.
    let customer = ls.customer(Some("org_1")).await;
    let sub = ls.subscribe(&customer, "pro_monthly").await;
    wait_for_plan(
        &srv,
        "org_1",
        "pro",
        "the created subscription makes org_1 pro",
    )
    .await;
    let org = srv.db.get_org("org_1").await.unwrap().unwrap();
    assert_eq!(org.stripe_customer_id.as_deref(), Some(customer.as_str()));
    assert_eq!(org.stripe_subscription_id.as_deref(), Some(sub.as_str()));
    assert!(
        org.billing_period().is_some(),
        "the subscription's period is the org's month window"
    );

    // An upgrade through the service changes the subscription in Stripe, and the very
    // next decision uses the new plan.
    let console = srv
        .token(&[rush_meter::tokens::Scope::Console], Some("org_1"))
        .await;
    let (status, v) = srv
        .call(
            "POST",
            "/v1/orgs/org_1/checkout",
            Some(&console),
            Some(&json!({"plan": "team"})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (v["action"].as_str(), v["plan"].as_str()),
        (Some("changed"), Some("team"))
    );
    let (_, stripe_sub) = ls
        .call(
            reqwest::Method::GET,
            &format!("/v1/subscriptions/{sub}"),
            &[],
        )
        .await;
    assert_eq!(stripe_sub["items"]["data"][0]["plan"]["id"], "team_monthly");
    let (status, d) = srv
        .call(
            "POST",
            "/v1/admissions",
            Some(ADMIN),
            Some(&json!({"org_id": "org_1", "key_id": "k1", "session_id": "s1", "agent": "codex"})),
        )
        .await;
    assert_eq!(status, 200, "{d}");
    assert_eq!(
        (d["plan"].as_str(), d["concurrency"]["limit"].as_i64()),
        (Some("team"), Some(4))
    );

    // Down to pro: made when the period ends, not now.
    let (status, v) = srv
        .call(
            "POST",
            "/v1/orgs/org_1/checkout",
            Some(&console),
            Some(&json!({"plan": "pro"})),
        )
        .await;
    assert_eq!(
        (status, v["action"].as_str()),
        (200, Some("scheduled")),
        "{v}"
    );
    assert_eq!(plan_of(&srv, "org_1").await.0, "team");
    let item_plan = || async {
        let (_, s) = ls
            .call(
                reqwest::Method::GET,
                &format!("/v1/subscriptions/{sub}"),
                &[],
            )
            .await;
        s["items"]["data"][0]["plan"]["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(item_plan().await, "pro_monthly", "made in Stripe at once");
    // Asking for team again calls the downgrade off (in Stripe too); asking a third time
    // is a conflict.
    let again = json!({"plan": "team"});
    let (status, v) = checkout(&srv, "org_1", Some(&console), &again).await;
    assert_eq!(
        (status, v["action"].as_str()),
        (200, Some("changed")),
        "{v}"
    );
    assert_eq!(item_plan().await, "team_monthly");
    let org = srv.db.get_org("org_1").await.unwrap().unwrap();
    assert_eq!((org.scheduled_plan_id, org.scheduled_at), (None, None));
    // The audit log has each plan change by Stripe, and the downgrade asked for and called
    // off by the org's console token.
    let log = srv.admin("GET", "/v1/orgs/org_1/audit", None).await;
    let entries = log["entries"].as_array().unwrap();
    let by_stripe: Vec<&str> = entries
        .iter()
        .filter(|e| e["action"] == "subscription.synced")
        .inspect(|e| assert_eq!(e["actor"]["kind"], "stripe", "{e}"))
        .map(|e| e["after"]["plan_id"].as_str().unwrap())
        .collect();
    assert_eq!(by_stripe.first(), Some(&"pro"), "{log}");
    assert_eq!(by_stripe.last(), Some(&"team"), "{log}");
    let scheduled: Vec<&Value> = entries
        .iter()
        .filter(|e| e["action"] == "downgrade.scheduled")
        .map(|e| &e["after"]["scheduled_plan_id"])
        .collect();
    assert_eq!(scheduled, [&json!("pro"), &Value::Null], "{log}");
    assert!(entries
        .iter()
        .filter(|e| e["action"] == "downgrade.scheduled")
        .all(|e| e["actor"]["kind"] == "token" && e["actor"]["label"] == "test"));
    let (status, v) = checkout(&srv, "org_1", Some(&console), &again).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (409, Some("already_on_plan")),
        "{v}"
    );
    // Down to Free: Stripe cancels at the period's end; team again calls that off too.
    let free = json!({"plan": "free"});
    let (status, v) = checkout(&srv, "org_1", Some(&console), &free).await;
    assert_eq!(
        (status, v["action"].as_str()),
        (200, Some("scheduled")),
        "{v}"
    );
    assert!(
        srv.db
            .get_org("org_1")
            .await
            .unwrap()
            .unwrap()
            .cancel_at_period_end
    );
    let (status, v) = checkout(&srv, "org_1", Some(&console), &again).await;
    assert_eq!(
        (status, v["action"].as_str()),
        (200, Some("changed")),
        "{v}"
    );
    assert!(
        !srv.db
            .get_org("org_1")
            .await
            .unwrap()
            .unwrap()
            .cancel_at_period_end
    );
    let (_, stripe_sub) = ls
        .call(
            reqwest::Method::GET,
            &format!("/v1/subscriptions/{sub}"),
            &[],
        )
        .await;
    assert_eq!(stripe_sub["cancel_at_period_end"], false);

    // Cancelled in Stripe: customer.subscription.deleted brings the org back to Free.
    ls.cancel(&sub).await;
    wait_for_plan(
        &srv,
        "org_1",
        "free",
        "the deleted subscription makes org_1 free",
    )
    .await;
    assert_eq!(plan_of(&srv, "org_1").await.1.as_deref(), Some("canceled"));

    // Checkout completes (localstripe has no Checkout: the test signs the event itself) for
    // a customer that names no org; the session's client_reference_id does.
    srv.create_org("org_2", "free").await;
    let customer2 = ls.customer(None).await;
    let sub2 = ls.subscribe(&customer2, "team_monthly").await;
    let now = real_now();
    let body = event(
        "evt_checkout_2",
        "checkout.session.completed",
        now,
        json!({"id": "cs_2", "object": "checkout.session", "customer": customer2, "subscription": sub2, "client_reference_id": "org_2"}),
    );
    let (status, _) = deliver(&srv, &body, &sign(SECRET, now, body.as_bytes())).await;
    assert_eq!(status, 200);
    wait_for_plan(
        &srv,
        "org_2",
        "team",
        "checkout.session.completed makes org_2 team",
    )
    .await;

    // A downgrade is made in Stripe at once, without proration, so that the renewal is at
    // its price; the org keeps the plan it paid for until the period ends (the clock jumps
    // there last: the meter's reads of Stripe are stamped by its clock).
    let admin = Some(ADMIN);
    let (status, v) = srv
        .call(
            "POST",
            "/v1/orgs/org_2/checkout",
            admin,
            Some(&json!({"plan": "pro"})),
        )
        .await;
    assert_eq!(
        (status, v["action"].as_str()),
        (200, Some("scheduled")),
        "{v}"
    );
    let org2 = srv.db.get_org("org_2").await.unwrap().unwrap();
    assert_eq!(
        (org2.scheduled_plan_id.as_deref(), org2.scheduled_in_stripe),
        (Some("pro"), true)
    );
    let (_, stripe_sub2) = ls
        .call(
            reqwest::Method::GET,
            &format!("/v1/subscriptions/{sub2}"),
            &[],
        )
        .await;
    assert_eq!(stripe_sub2["items"]["data"][0]["plan"]["id"], "pro_monthly");
    // Stripe's webhook of the change finds the org held on the plan it paid for.
    let decide = |session: &'static str| {
        let srv = &srv;
        async move {
            let body =
                json!({"org_id": "org_2", "key_id": "k2", "session_id": session, "agent": "codex"});
            srv.admin("POST", "/v1/admissions", Some(body)).await
        }
    };
    srv.admin("PUT", "/v1/orgs/org_2/keys/k2", Some(json!({})))
        .await;
    assert_eq!(decide("s21").await["plan"], "team");
    assert_eq!(plan_of(&srv, "org_2").await.0, "team");
    // At the period's end the new plan is in force, before Stripe's renewal says so.
    srv.clock.set(org2.period_end.unwrap() + 1);
    assert_eq!(decide("s22").await["plan"], "pro");
    let shown = srv.admin("GET", "/v1/orgs/org_2", None).await;
    assert_eq!(shown["plan"], "pro", "{shown}");
    // Stripe's next word on the subscription makes it the plan paid for and clears the
    // schedule (signed at the meter's time, which the signature's tolerance is judged by).
    let now = srv.clock.now();
    let body = event(
        "evt_renewed_2",
        "customer.subscription.updated",
        now,
        json!({"id": sub2, "object": "subscription", "customer": customer2}),
    );
    let (status, _) = deliver(&srv, &body, &sign(SECRET, now, body.as_bytes())).await;
    assert_eq!(status, 200);
    eventually(
        20,
        "the schedule is cleared once the renewal is read",
        || async {
            let org = srv.db.get_org("org_2").await.unwrap().unwrap();
            org.plan_id == "pro" && org.scheduled_plan_id.is_none() && !org.scheduled_in_stripe
        },
    )
    .await;
}

async fn stripe_down_never_blocks_the_gate_and_reconcile_repairs_lost_webhooks(backend: Backend) {
    let Some(ls) = LocalStripe::start().await else {
        return;
    };
    // Stripe unreachable: a port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let down = StripeConfig {
        api_base: format!("http://127.0.0.1:{closed}"),
        ..with_stripe(&ls)
    };
    let Some(srv) = start(backend, down, real_now()).await else {
        return;
    };
    srv.create_org("org_1", "free").await;
    srv.admin("PUT", "/v1/orgs/org_1/keys/k1", Some(json!({})))
        .await;
    let (status, d) = srv
        .call(
            "POST",
            "/v1/admissions",
            Some(ADMIN),
            Some(
                &json!({"org_id": "org_1", "key_id": "k1", "session_id": "s1", "agent": "claude"}),
            ),
        )
        .await;
    assert_eq!(
        (status, d["decision"].as_str()),
        (200, Some("allow")),
        "{d}"
    );
    let (status, v) = srv
        .call(
            "POST",
            "/v1/orgs/org_1/checkout",
            Some(ADMIN),
            Some(&json!({"plan": "pro"})),
        )
        .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (503, Some("stripe_unavailable")),
        "{v}"
    );
    // A subscription event arrives while Stripe cannot be read back: kept, retried later.
    let now = real_now();
    let body = event(
        "evt_1",
        "invoice.paid",
        now,
        json!({"id": "in_1", "subscription": "sub_x"}),
    );
    let (status, _) = deliver(&srv, &body, &sign(SECRET, now, body.as_bytes())).await;
    assert_eq!(status, 200);
    eventually(
        10,
        "the event failed once and waits for a retry",
        || async { event_states(&srv).await == [("pending".to_owned(), 1)] },
    )
    .await;

    // Stripe is back, but its webhooks for this subscription were lost: reconcile repairs.
    let customer = ls.customer(Some("org_1")).await;
    ls.subscribe(&customer, "pro_monthly").await;
    assert_eq!(plan_of(&srv, "org_1").await.0, "free");
    let out = stripe_cli(&srv, &ls, &["stripe", "reconcile"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("changed org_1: plan: free -> pro"),
        "{stdout}"
    );
    assert!(
        stdout.contains("1 subscriptions read, 1 orgs repaired, 0 failed"),
        "{stdout}"
    );
    assert_eq!(
        plan_of(&srv, "org_1").await,
        ("pro".to_owned(), Some("active".to_owned()))
    );
    // A second run finds nothing to repair.
    let again = stripe_cli(&srv, &ls, &["stripe", "reconcile"]);
    assert!(String::from_utf8_lossy(&again.stdout).contains("0 orgs repaired"));
}

/// Customers localstripe holds for `org`.
async fn customers_of(ls: &LocalStripe, org: &str) -> Vec<String> {
    let (_, v) = ls
        .call(reqwest::Method::GET, "/v1/customers?limit=100", &[])
        .await;
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["metadata"]["org_id"] == org)
        .map(|c| c["id"].as_str().unwrap().to_owned())
        .collect()
}

async fn a_crash_between_stripes_answer_and_the_commit_leaves_one_customer(backend: Backend) {
    let Some(ls) = LocalStripe::start().await else {
        return;
    };
    let Some((db, _dir)) = common::fresh_database(backend).await else {
        return;
    };
    let stripe = [
        ("RUSH_METER_STRIPE_SECRET_KEY", KEY),
        ("RUSH_METER_STRIPE_API_BASE", ls.url.as_str()),
    ];
    let mut crashing = stripe.to_vec();
    crashing.push(("RUSH_METER_FAILPOINT", "after_stripe_create_customer"));
    let client = reqwest::Client::new();
    let (mut child, base) = common::spawn_service_with(&db, ADMIN, &crashing).await;
    let put = client
        .put(format!("{base}/v1/orgs/org_1"))
        .bearer_auth(ADMIN)
        .json(&json!({"plan": "free"}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let checkout = || {
        let (client, base) = (client.clone(), base.clone());
        async move {
            client
                .post(format!("{base}/v1/orgs/org_1/checkout"))
                .bearer_auth(ADMIN)
                .json(&json!({"plan": "pro"}))
                .send()
                .await
        }
    };
    if let Ok(answered) = checkout().await {
        let status = answered.status();
        panic!(
            "the process dies before it answers, yet it answered {status}: {}",
            answered.text().await.unwrap_or_default()
        );
    }
    let status = child.wait().await.unwrap();
    assert!(!status.success(), "aborted at the failpoint");
    let made = customers_of(&ls, "org_1").await;
    assert_eq!(made.len(), 1, "Stripe made the customer before the crash");

    // Restarted: the recorded request is finished with the customer Stripe made, not a new one.
    let (_child, base) = common::spawn_service_with(&db, ADMIN, &stripe).await;
    let resp = client
        .post(format!("{base}/v1/orgs/org_1/checkout"))
        .bearer_auth(ADMIN)
        .json(&json!({"plan": "pro"}))
        .send()
        .await
        .unwrap();
    // localstripe has no Checkout: the session itself is refused, after the customer step.
    assert_eq!(resp.status(), 502, "{}", resp.text().await.unwrap());
    assert_eq!(
        customers_of(&ls, "org_1").await,
        made,
        "still exactly one customer"
    );
    let org: Value = client
        .get(format!("{base}/v1/orgs/org_1"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        org["subscription"]["stripe_customer_id"].as_str(),
        Some(made[0].as_str())
    );
}

async fn the_invoice_report_sets_the_ledger_against_stripes_invoices(backend: Backend) {
    let Some(ls) = LocalStripe::start().await else {
        return;
    };
    let now = real_now();
    let Some(srv) = start(backend, with_stripe(&ls), now).await else {
        return;
    };
    ls.register_webhook(&format!("{}/v1/stripe/webhook", srv.url), SECRET)
        .await;
    for org in ["org_paid", "org_free"] {
        srv.create_org(org, "free").await;
    }
    let customer = ls.customer(Some("org_paid")).await;
    ls.subscribe(&customer, "pro_monthly").await;
    wait_for_plan(&srv, "org_paid", "pro", "org_paid subscribes").await;
    // Ten minutes of agent time for the paid org, this month, a beat every 15 s.
    for i in 0..=40 {
        srv.clock.set(now + i * 15);
        let beat = common::hb("org_paid", "ses_1", i, "running", now + i * 15);
        let (status, v) = srv.heartbeats(vec![beat]).await;
        assert_eq!(status, 200, "{v}");
    }

    let plans = std::sync::Arc::new(rush_meter::config::load_plans(&common::repo_plans()).unwrap());
    let billing = rush_meter::billing::Billing::new(
        srv.db.clone(),
        plans,
        srv.clock.clone(),
        with_stripe(&ls),
        Default::default(),
    );
    // localstripe has no clock: its invoices fall in the current month, so the report is
    // asked for that month directly (the command accepts closed months only).
    let month = rush_meter_core::time::calendar_month(now);
    let lines = rush_meter::billing::invoice_report::invoice_report(&billing, month, |_| {})
        .await
        .unwrap();
    let paid = lines.iter().find(|l| l.org_id == "org_paid").unwrap();
    let booked: i64 = srv
        .db
        .hourly_totals("org_paid")
        .await
        .unwrap()
        .iter()
        .map(|(_, s)| s)
        .sum();
    assert_eq!(paid.agent_seconds, booked);
    assert_eq!(paid.agent_seconds, 600, "{paid:?}");
    assert_eq!(paid.plan, "pro");
    assert_eq!(
        (
            paid.ledger_owes.to_string(),
            paid.stripe_invoiced.to_string()
        ),
        ("20.00".into(), "20.00".into())
    );
    assert!(paid.difference.is_zero() && paid.invoices == 1, "{paid:?}");
    let free = lines.iter().find(|l| l.org_id == "org_free").unwrap();
    assert_eq!((free.agent_seconds, free.invoices), (0, 0));
    assert!(free.ledger_owes.is_zero() && free.difference.is_zero());
    // The command itself refuses a month that has not ended.
    let period = chrono::Utc::now().format("%Y-%m").to_string();
    let out = stripe_cli(
        &srv,
        &ls,
        &["stripe", "invoice-report", "--period", &period],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("has not ended"));
}
