//! Stripe as production answers it, where localstripe cannot (a fake of our own,
//! tests/common/fake_stripe.rs): the pinned `Stripe-Version` on every request; 429,
//! `lock_timeout` and `Stripe-Should-Retry` retried inside the call under one key; a 5xx
//! read back before a new key, so nothing is made twice; reconcile and the invoice report
//! carrying on past an element they cannot read, and paging invoice lines; and webhook
//! events in the 2024, 2026-07 and 2026-09 shapes (`tests/fixtures/stripe`, copied from the team's `../shared/fixtures/stripe`), signed by
//! Stripe's own Node library. On SQLite and PostgreSQL.

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use common::fake_stripe::{FakeStripe, Fault};
use common::localstripe::stripe_at;
use common::{eventually, Backend, Options, TestServer, ADMIN, T0};
use rush_meter::billing::api::stripe_version;
use rush_meter::billing::Billing;
use serde_json::{json, Value};

const SECRET: &str = common::localstripe::WEBHOOK_SECRET;

async fn start(backend: Backend, fake: &FakeStripe) -> Option<TestServer> {
    start_with_plans(backend, fake, common::repo_plans()).await
}

async fn start_with_plans(
    backend: Backend,
    fake: &FakeStripe,
    plans_dir: std::path::PathBuf,
) -> Option<TestServer> {
    TestServer::start_with(
        backend,
        Options {
            stripe: stripe_at(&fake.url),
            plans_dir,
            ..Options::default()
        },
    )
    .await
}

fn billing(srv: &TestServer, fake: &FakeStripe) -> Billing {
    billing_with_plans(srv, fake, &common::repo_plans())
}

fn billing_with_plans(srv: &TestServer, fake: &FakeStripe, dir: &std::path::Path) -> Billing {
    let plans = Arc::new(rush_meter::config::load_plans(dir).unwrap());
    Billing::new(
        srv.db.clone(),
        plans,
        srv.clock.clone(),
        stripe_at(&fake.url),
        Default::default(),
    )
}

async fn checkout(srv: &TestServer, org: &str, plan: &str) -> (u16, Value) {
    srv.call(
        "POST",
        &format!("/v1/orgs/{org}/checkout"),
        Some(ADMIN),
        Some(&json!({"plan": plan})),
    )
    .await
}

fn keys(sent: &[common::fake_stripe::Seen]) -> Vec<String> {
    sent.iter()
        .map(|r| {
            r.idempotency_key
                .clone()
                .expect("every write carries a key")
        })
        .collect()
}

async fn stripe_asks_for_a_retry_and_gets_it_inside_the_call(backend: Backend) {
    let fake = FakeStripe::start().await;
    let Some(srv) = start(backend, &fake).await else {
        return;
    };
    srv.create_org("acme", "free").await;
    fake.fail("POST", "/v1/customers", Fault::RateLimited);
    fake.fail("POST", "/v1/checkout/sessions", Fault::LockTimeout);
    fake.fail("POST", "/v1/checkout/sessions", Fault::ShouldRetry);
    let (status, v) = checkout(&srv, "acme", "pro").await;
    assert_eq!(
        (status, v["action"].as_str()),
        (200, Some("checkout")),
        "{v}"
    );
    let posts = fake.sent("POST", "/v1/checkout/sessions");
    assert_eq!(posts.len(), 3, "a lock timeout, a should-retry, then made");
    assert_eq!(
        keys(&posts).iter().collect::<HashSet<_>>().len(),
        1,
        "one key"
    );
    assert_eq!(keys(&fake.sent("POST", "/v1/customers")).len(), 2);
    assert_eq!(fake.with(|s| (s.customers.len(), s.sessions.len())), (1, 1));

    // Rate limited on every try of the call: 503, and the request stays open under its
    // key, which the next call uses.
    for _ in 0..4 {
        fake.fail("POST", "/v1/checkout/sessions", Fault::RateLimited);
    }
    let (status, v) = checkout(&srv, "acme", "team").await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (503, Some("stripe_unavailable")),
        "{v}"
    );
    assert_eq!(fake.with(|s| s.sessions.len()), 1);
    let (status, v) = checkout(&srv, "acme", "team").await;
    assert_eq!(status, 200, "{v}");
    let team: Vec<String> = keys(&fake.sent("POST", "/v1/checkout/sessions"))[3..].to_vec();
    assert_eq!(team.len(), 5);
    assert!(team.iter().all(|k| *k == team[0]), "{team:?}");
    assert_eq!(fake.with(|s| s.sessions.len()), 2);

    // Every request named the version the service speaks.
    let version = stripe_version();
    assert_eq!(version, "2026-09-30.endive");
    for r in fake.all_sent() {
        assert_eq!(r.stripe_version.as_deref(), Some(version), "{r:?}");
    }
    srv.finish().await;
}

async fn a_5xx_is_read_back_before_a_new_key_and_nothing_is_made_twice(backend: Backend) {
    let fake = FakeStripe::start().await;
    let Some(srv) = start(backend, &fake).await else {
        return;
    };
    srv.create_org("acme", "free").await;
    // Stripe makes the customer, then answers 500 (and would replay the 500 for its key).
    fake.fail("POST", "/v1/customers", Fault::FailAfterWriting);
    let (status, v) = checkout(&srv, "acme", "pro").await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (503, Some("stripe_unavailable")),
        "{v}"
    );
    // The session too.
    fake.fail("POST", "/v1/checkout/sessions", Fault::FailAfterWriting);
    let (status, v) = checkout(&srv, "acme", "pro").await;
    assert_eq!(status, 503, "{v}");
    assert_eq!(
        fake.sent("POST", "/v1/customers").len(),
        1,
        "the customer was read back, not made again"
    );
    let (status, v) = checkout(&srv, "acme", "pro").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["session_id"], "cs_fake1",
        "the session was read back: {v}"
    );
    assert_eq!(fake.sent("POST", "/v1/checkout/sessions").len(), 1);
    assert_eq!(fake.with(|s| (s.customers.len(), s.sessions.len())), (1, 1));
    let org = srv.admin("GET", "/v1/orgs/acme", None).await;
    assert_eq!(
        org["subscription"]["stripe_customer_id"], "cus_fake1",
        "{org}"
    );

    // A 5xx before anything was made: the next try finds nothing, and sends with a new key
    // (the old one would get the stored 500 back for a day).
    fake.fail("POST", "/v1/checkout/sessions", Fault::FailBeforeWriting);
    let (status, _) = checkout(&srv, "acme", "team").await;
    assert_eq!(status, 503);
    let (status, v) = checkout(&srv, "acme", "team").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["session_id"], "cs_fake2", "{v}");
    let team = keys(&fake.sent("POST", "/v1/checkout/sessions"))[1..].to_vec();
    assert_eq!(team, vec![team[0].clone(), format!("{}~2", team[0])]);
    // Both sessions name the request they were made for, whatever the key.
    let requests: Vec<Value> = fake.with(|s| {
        s.sessions
            .iter()
            .map(|c| c["metadata"]["rush_meter_request"].clone())
            .collect()
    });
    assert_eq!(requests[1], Value::String(team[0].clone()));
    srv.finish().await;
}

/// A subscription of `org` (customer `customer`) on `price` for the period around T0, in
/// the 2026 shape (the period on the item).
fn subscription(id: &str, org: &str, customer: &str, price: &str) -> Value {
    json!({"id": id, "object": "subscription", "status": "active", "customer": customer,
        "cancel_at_period_end": false, "metadata": {"org_id": org},
        "items": {"object": "list", "has_more": false, "data": [
            {"id": format!("si_{id}"), "price": {"id": format!("price_{price}"), "lookup_key": price},
             "current_period_start": T0 - 86_400, "current_period_end": T0 + 29 * 86_400}]}})
}

async fn runs_over_all_of_stripe_carry_on_past_what_they_cannot_read(backend: Backend) {
    let fake = FakeStripe::start().await;
    let Some(srv) = start(backend, &fake).await else {
        return;
    };
    for org in ["a", "b"] {
        srv.create_org(org, "free").await;
    }
    fake.with(|s| {
        s.subscriptions = vec![
            subscription("sub_a", "a", "cus_a", "pro_monthly"),
            json!({"id": "sub_bad", "object": "subscription", "status": 5, "customer": []}),
            subscription("sub_b", "b", "cus_b", "team_monthly"),
        ];
    });
    let b = billing(&srv, &fake);
    let report = rush_meter::billing::reconcile::reconcile(&b, |_| {})
        .await
        .unwrap();
    assert_eq!(report.subscriptions, 3);
    assert_eq!(report.unreadable.len(), 1, "{report:?}");
    assert_eq!(report.unreadable[0].0, "sub_bad");
    assert!(report.failed.is_empty(), "{report:?}");
    for (org, plan) in [("a", "pro"), ("b", "team")] {
        let v = srv.admin("GET", &format!("/v1/orgs/{org}"), None).await;
        assert_eq!(v["plan"], plan, "{v}");
    }

    // The invoice report reads every page of an invoice's lines, and names an invoice it
    // cannot read instead of stopping.
    let month = rush_meter_core::time::calendar_month(T0);
    let line = |n: i64| {
        json!({"id": format!("il_{n}"), "object": "line_item", "amount": 400,
            "period": {"start": month.start, "end": month.end}, "metadata": {}})
    };
    let all: Vec<Value> = (1..=5).map(line).collect();
    fake.with(|s| {
        s.invoices = vec![
            json!({"id": "in_1", "customer": "cus_a", "status": "paid",
                "lines": {"object": "list", "data": all[..2], "has_more": true}}),
            json!({"id": "in_bad", "customer": "cus_a", "status": "paid", "lines": "not a list"}),
        ];
        s.lines.insert("in_1".into(), all.clone());
    });
    let lines = rush_meter::billing::invoice_report::invoice_report(&b, month, |_| {})
        .await
        .unwrap();
    let a = lines.iter().find(|l| l.org_id == "a").unwrap();
    assert_eq!(a.stripe_invoiced.to_string(), "20.00", "five lines of 4.00");
    assert_eq!(a.invoices, 1);
    assert_eq!(a.unreadable.len(), 1, "{:?}", a.unreadable);
    assert!(
        a.unreadable[0].starts_with("in_bad: "),
        "{:?}",
        a.unreadable
    );
    assert_eq!(fake.sent("GET", "/v1/invoices/in_1/lines").len(), 1);
    srv.finish().await;
}

async fn a_5xx_on_a_pay_as_you_go_charge_never_charges_twice(backend: Backend) {
    let dir = common::mini_plans();
    let fake = FakeStripe::start().await;
    let Some(srv) = start_with_plans(backend, &fake, dir.path().to_path_buf()).await else {
        return;
    };
    srv.create_org("acme", "free").await;
    srv.admin("PUT", "/v1/orgs/acme/keys/k1", Some(json!({})))
        .await;
    fake.with(|s| {
        s.subscriptions = vec![subscription("sub_acme", "acme", "cus_acme", "pro_monthly")]
    });
    let b = billing_with_plans(&srv, &fake, dir.path());
    rush_meter::billing::reconcile::reconcile(&b, |_| {})
        .await
        .unwrap();
    let org = srv.db.get_org("acme").await.unwrap().unwrap();
    assert_eq!(org.plan_id, "mini");
    let window = org.billing_period().unwrap();
    // Past the week's 180 s and the cap's 100 s of pay-as-you-go, then parked.
    common::run_past_the_plan_to_the_cap(&srv, "acme", T0).await;
    // Stripe makes the window's item, then answers 500; the next run of the job reads it
    // back by its request instead of making a second one.
    fake.fail("POST", "/v1/invoiceitems", Fault::FailAfterWriting);
    srv.clock.set(window.end + 2 * 3600 + 1);
    eventually(60, "the 5xx is recorded as a try", || async {
        let charges = srv.db.overage_charges("acme").await.unwrap();
        charges.iter().any(|c| c.attempts == 1)
    })
    .await;
    // Tried again after its backoff.
    srv.clock.advance(rush_meter_core::retry::backoff(1));
    eventually(60, "the window's pay-as-you-go is charged", || async {
        let charges = srv.db.overage_charges("acme").await.unwrap();
        charges.iter().any(|c| c.state == "charged")
    })
    .await;
    let charges = srv.db.overage_charges("acme").await.unwrap();
    assert_eq!(
        (
            charges.len(),
            charges[0].amount.as_str(),
            charges[0].stripe_invoice_item_id.as_deref()
        ),
        (1, "0.10", Some("ii_fake1")),
        "{charges:?}"
    );
    assert_eq!(fake.sent("POST", "/v1/invoiceitems").len(), 1);
    let items = fake.with(|s| s.invoice_items.clone());
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(
        (items[0]["amount"].as_i64(), items[0]["id"].as_str()),
        (Some(10), Some("ii_fake1"))
    );
    srv.finish().await;
}

/// A fixture event of `tests/fixtures/stripe`, its ids made the `n`th org's own.
fn fixture(file: &str, n: usize) -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/stripe/");
    let text = std::fs::read_to_string(format!("{path}{file}")).unwrap();
    let text = text
        .replace("\"org_1\"", &format!("\"org_{n}\""))
        .replace("cus_QXg1o8vcGmoR32", &format!("cus_fix{n}"))
        .replace("sub_1Pgc6rB7WZ01zgkWNy0Cn5nw", &format!("sub_fix{n}"))
        .replace("\"id\": \"evt_", &format!("\"id\": \"evt_{n}_"));
    serde_json::from_str(&text).unwrap()
}

/// Deliver `event` signed by Stripe's own library at the server's time; `None` when the
/// library is missing outside CI.
async fn deliver_signed(srv: &TestServer, event: &Value) -> Option<u16> {
    let body = event.to_string();
    let header = common::node::stripe_signature(SECRET, srv.clock.now(), &body)?;
    let resp = srv
        .client
        .post(format!("{}/v1/stripe/webhook", srv.url))
        .header("Stripe-Signature", header)
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    Some(resp.status().as_u16())
}

async fn events_in_todays_shapes_signed_by_stripes_library_set_plan_and_period(backend: Backend) {
    let fake = FakeStripe::start().await;
    let Some(srv) = start(backend, &fake).await else {
        return;
    };
    // Each event, with the subscription as Stripe answers its read-back in that version;
    // the last one paused on its first failed payment (a 2026 account setting).
    let sub = |version: &str, n: usize| {
        fixture(&format!("customer.subscription.updated.{version}.json"), n)["data"]["object"]
            .clone()
    };
    let mut paused = sub("2026-09-30.endive", 6);
    paused["status"] = json!("paused");
    paused["status_details"] = json!({"paused": {"type": "subscription",
        "transitioned_at": T0 - 3600, "subscription": {"type": "first_payment_failure"}}});
    let mut paused_event = fixture("customer.subscription.updated.2026-09-30.endive.json", 6);
    paused_event["data"]["object"] = paused.clone();
    let cases = [
        (
            fixture("customer.subscription.updated.2024-12-18.acacia.json", 1),
            sub("2024-12-18.acacia", 1),
            "active",
        ),
        (
            fixture("customer.subscription.updated.2026-07-29.dahlia.json", 2),
            sub("2026-07-29.dahlia", 2),
            "active",
        ),
        (
            fixture("customer.subscription.updated.2026-09-30.endive.json", 3),
            sub("2026-09-30.endive", 3),
            "active",
        ),
        (
            fixture("invoice.paid.2026-07-29.dahlia.json", 4),
            sub("2026-07-29.dahlia", 4),
            "active",
        ),
        (
            fixture(
                "checkout.session.completed.subscription.2026-07-29.dahlia.json",
                5,
            ),
            sub("2026-07-29.dahlia", 5),
            "active",
        ),
        (paused_event, paused, "past_due"),
    ];
    for (n, (event, read_back, status)) in cases.iter().enumerate() {
        let org = format!("org_{}", n + 1);
        srv.create_org(&org, "free").await;
        fake.with(|s| s.subscriptions.push(read_back.clone()));
        let Some(code) = deliver_signed(&srv, event).await else {
            return;
        };
        assert_eq!(code, 200, "{}", event["type"]);
        eventually(10, "the event is processed", || async {
            let v = srv
                .admin("GET", "/v1/admin/stripe/events?state=pending", None)
                .await;
            v["events"].as_array().unwrap().is_empty()
        })
        .await;
        let v = srv.admin("GET", &format!("/v1/orgs/{org}"), None).await;
        let s = &v["subscription"];
        assert_eq!(
            (
                v["plan"].as_str(),
                s["status"].as_str(),
                s["current_period_start"].as_str(),
                s["current_period_end"].as_str()
            ),
            (
                Some("pro"),
                Some(*status),
                Some("2026-11-01T00:00:00Z"),
                Some("2026-12-01T00:00:00Z")
            ),
            "{} {}: {v}",
            event["type"],
            event["api_version"]
        );
        if *status == "past_due" {
            assert!(s["past_due_since"].is_string(), "the grace runs: {v}");
            srv.admin("PUT", &format!("/v1/orgs/{org}/keys/k1"), Some(json!({})))
                .await;
            let d = srv.admit(&org, "k1", "s_paused").await;
            assert_eq!(d["decision"], "allow", "on the plan, within its grace: {d}");
        }
    }
    // Events rendered in another version than the service speaks are counted by version.
    let events = srv.admin("GET", "/v1/admin/stripe/events", None).await;
    let versions: HashSet<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["api_version"].as_str())
        .collect();
    assert_eq!(
        versions,
        HashSet::from([
            "2024-12-18.acacia",
            "2026-07-29.dahlia",
            "2026-09-30.endive"
        ])
    );
    for (version, count) in [("2024-12-18.acacia", 1.0), ("2026-07-29.dahlia", 3.0)] {
        let metric =
            format!("rush_meter_stripe_event_versions_other_total{{api_version=\"{version}\"}}");
        assert_eq!(srv.metric(&metric).await, count, "{metric}");
    }
    let ours = format!(
        "rush_meter_stripe_event_versions_other_total{{api_version=\"{}\"}}",
        stripe_version()
    );
    assert_eq!(srv.metric(&ours).await, 0.0);
    srv.finish().await;
}

every_backend!(
    stripe_asks_for_a_retry_and_gets_it_inside_the_call,
    a_5xx_is_read_back_before_a_new_key_and_nothing_is_made_twice,
    runs_over_all_of_stripe_carry_on_past_what_they_cannot_read,
    a_5xx_on_a_pay_as_you_go_charge_never_charges_twice,
    events_in_todays_shapes_signed_by_stripes_library_set_plan_and_period,
    checkouts_from_two_tabs_open_one_session_an_org,
    an_unpaid_incomplete_subscription_does_not_block_a_new_checkout,
    a_read_older_by_its_ticket_is_never_applied_whatever_the_clocks,
    a_downgrade_stripe_may_have_made_stays_held_one_it_refused_does_not,
);

/// A downgrade is recorded before it is sent: if Stripe answers 5xx it may have made it,
/// so the org stays held (its webhook must not drop it mid-period); if Stripe refuses, it
/// made nothing, and the schedule is taken back.
async fn a_downgrade_stripe_may_have_made_stays_held_one_it_refused_does_not(backend: Backend) {
    let fake = FakeStripe::start().await;
    let Some(srv) = start(backend, &fake).await else {
        return;
    };
    for org in ["acme", "beta"] {
        srv.create_org(org, "free").await;
    }
    fake.with(|s| {
        s.subscriptions = vec![
            subscription("sub_acme", "acme", "cus_acme", "team_monthly"),
            subscription("sub_beta", "beta", "cus_beta", "team_monthly"),
        ]
    });
    rush_meter::billing::reconcile::reconcile(&billing(&srv, &fake), |_| {})
        .await
        .unwrap();
    fake.fail(
        "POST",
        "/v1/subscriptions/sub_acme",
        Fault::FailBeforeWriting,
    );
    let (status, v) = checkout(&srv, "acme", "pro").await;
    assert_eq!(status, 503, "{v}");
    let acme = srv.db.get_org("acme").await.unwrap().unwrap();
    assert_eq!(
        (
            acme.plan_id.as_str(),
            acme.scheduled_plan_id.as_deref(),
            acme.scheduled_in_stripe
        ),
        ("team", Some("pro"), true)
    );
    fake.fail("POST", "/v1/subscriptions/sub_beta", Fault::Refused);
    let (status, v) = checkout(&srv, "beta", "pro").await;
    assert_eq!(status, 502, "{v}");
    let beta = srv.db.get_org("beta").await.unwrap().unwrap();
    assert_eq!(
        (beta.scheduled_plan_id.as_deref(), beta.scheduled_in_stripe),
        (None, false)
    );
    // Made: the item on pro's price, the org held on team until the period ends.
    let (status, v) = checkout(&srv, "beta", "pro").await;
    assert_eq!(
        (status, v["action"].as_str()),
        (200, Some("scheduled")),
        "{v}"
    );
    let beta = srv.db.get_org("beta").await.unwrap().unwrap();
    assert_eq!(
        (beta.plan_id.as_str(), beta.scheduled_in_stripe),
        ("team", true)
    );
    srv.finish().await;
}

/// Two instances read an org's subscription around a change in Stripe: the one whose
/// clock runs ahead reads first (the old state), the other reads after the change. Applied
/// newest first, the old read is refused by its ticket, though its clock says it is newer
/// (and, with the clocks equal, though whole seconds tie).
async fn a_read_older_by_its_ticket_is_never_applied_whatever_the_clocks(backend: Backend) {
    let fake = FakeStripe::start().await;
    let Some(srv) = start(backend, &fake).await else {
        return;
    };
    srv.create_org("acme", "free").await;
    fake.with(|s| {
        s.subscriptions = vec![subscription("sub_acme", "acme", "cus_acme", "pro_monthly")]
    });
    let b = billing(&srv, &fake);
    rush_meter::billing::reconcile::reconcile(&b, |_| {})
        .await
        .unwrap();
    let on = |skew: i64| {
        let plans = Arc::new(rush_meter::config::load_plans(&common::repo_plans()).unwrap());
        Billing::new(
            srv.db.clone(),
            plans,
            rush_meter::clock::Clock::manual(T0 + skew),
            stripe_at(&fake.url),
            Default::default(),
        )
    };
    for (ahead, behind) in [(on(100), on(0)), (on(0), on(0))] {
        let old_plan = srv.db.get_org("acme").await.unwrap().unwrap().plan_id;
        let api = ahead.api().unwrap();
        let stale_read = ahead.ticket("acme").await.unwrap();
        let stale = api.subscription("sub_acme").await.unwrap();
        // The change in Stripe, and the newer read.
        let next = if old_plan == "pro" {
            "team_monthly"
        } else {
            "pro_monthly"
        };
        fake.with(|s| s.subscriptions = vec![subscription("sub_acme", "acme", "cus_acme", next)]);
        let fresh_read = behind.ticket("acme").await.unwrap();
        let fresh = api.subscription("sub_acme").await.unwrap();
        assert!(
            fresh_read.at <= stale_read.at,
            "the newer read's clock is not ahead"
        );
        behind
            .apply(&fresh, None, fresh_read, "test")
            .await
            .unwrap();
        let new_plan = srv.db.get_org("acme").await.unwrap().unwrap().plan_id;
        assert_ne!(new_plan, old_plan);
        let applied = ahead.apply(&stale, None, stale_read, "test").await.unwrap();
        assert!(applied.org.is_none(), "the older read was applied");
        assert_eq!(
            srv.db.get_org("acme").await.unwrap().unwrap().plan_id,
            new_plan
        );
    }
    srv.finish().await;
}

/// Two tabs (or two clicks) asking for a plan get one Checkout Session, so that no second
/// subscription can be paid for; another plan closes the open one first; one Stripe will
/// not close (just paid) stops a new checkout.
async fn checkouts_from_two_tabs_open_one_session_an_org(backend: Backend) {
    let fake = FakeStripe::start().await;
    let Some(srv) = start(backend, &fake).await else {
        return;
    };
    srv.create_org("acme", "free").await;
    let (_, first) = checkout(&srv, "acme", "pro").await;
    let (_, second) = checkout(&srv, "acme", "pro").await;
    assert_eq!(
        (&first["session_id"], &first["url"]),
        (&second["session_id"], &second["url"]),
        "{first} {second}"
    );
    assert_eq!(fake.sent("POST", "/v1/checkout/sessions").len(), 1);
    let sent = &fake.sent("POST", "/v1/checkout/sessions")[0];
    assert!(
        sent.form.iter().any(|(k, _)| k == "expires_at"),
        "an hour to pay, not Stripe's day"
    );
    // Another plan: the open session is closed before the new one opens.
    let (status, team) = checkout(&srv, "acme", "team").await;
    assert_eq!(status, 200, "{team}");
    assert_ne!(team["session_id"], first["session_id"]);
    let expired = fake.sent(
        "POST",
        &format!(
            "/v1/checkout/sessions/{}/expire",
            first["session_id"].as_str().unwrap()
        ),
    );
    assert_eq!(expired.len(), 1);
    let states: Vec<Value> =
        fake.with(|s| s.sessions.iter().map(|c| c["status"].clone()).collect());
    assert_eq!(states, [json!("expired"), json!("open")]);
    // Paid a moment ago, before it could be closed: no new session, a conflict.
    let expire_team = format!(
        "/v1/checkout/sessions/{}/expire",
        team["session_id"].as_str().unwrap()
    );
    fake.fail("POST", &expire_team, Fault::Refused);
    let (status, v) = checkout(&srv, "acme", "pro").await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (409, Some("stripe_conflict")),
        "{v}"
    );
    assert_eq!(fake.sent("POST", "/v1/checkout/sessions").len(), 2);
    srv.finish().await;
}

/// A subscription left `incomplete` (its first payment never made) is cancelled in Stripe
/// before a new checkout, rather than blocking one for the day Stripe takes to expire it.
async fn an_unpaid_incomplete_subscription_does_not_block_a_new_checkout(backend: Backend) {
    let fake = FakeStripe::start().await;
    let Some(srv) = start(backend, &fake).await else {
        return;
    };
    srv.create_org("acme", "free").await;
    let mut incomplete = subscription("sub_acme", "acme", "cus_acme", "pro_monthly");
    incomplete["status"] = json!("incomplete");
    fake.with(|s| s.subscriptions = vec![incomplete]);
    rush_meter::billing::reconcile::reconcile(&billing(&srv, &fake), |_| {})
        .await
        .unwrap();
    let org = srv.db.get_org("acme").await.unwrap().unwrap();
    assert_eq!(org.subscription_status.as_deref(), Some("incomplete"));
    let (status, v) = checkout(&srv, "acme", "pro").await;
    assert_eq!(
        (status, v["action"].as_str()),
        (200, Some("checkout")),
        "{v}"
    );
    assert_eq!(fake.sent("DELETE", "/v1/subscriptions/sub_acme").len(), 1);
    let org = srv.db.get_org("acme").await.unwrap().unwrap();
    assert_eq!(
        (org.plan_id.as_str(), org.subscription_status.as_deref()),
        ("free", Some("canceled"))
    );
    // Paid meanwhile (live when read again): applied, not cancelled.
    let mut live = subscription("sub_live", "acme", "cus_acme", "pro_monthly");
    live["status"] = json!("active");
    fake.with(|s| s.subscriptions.push(live.clone()));
    execute_sql(&srv, "UPDATE orgs SET stripe_subscription_id = 'sub_live', subscription_status = 'incomplete' WHERE org_id = $1", "acme").await;
    // Asked for the plan it now pays for: already on it.
    let (status, v) = checkout(&srv, "acme", "pro").await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (409, Some("already_on_plan")),
        "{v}"
    );
    assert!(fake.sent("DELETE", "/v1/subscriptions/sub_live").is_empty());
    srv.finish().await;
}

/// Run one statement with one text parameter on the server's database.
async fn execute_sql(srv: &TestServer, sql: &str, arg: &str) {
    match srv.db.pools() {
        rush_meter::store::Pools::Postgres(p) => {
            sqlx::query(sql).bind(arg).execute(p).await.unwrap();
        }
        rush_meter::store::Pools::Sqlite { write, .. } => {
            sqlx::query(sql).bind(arg).execute(write).await.unwrap();
        }
    }
}
