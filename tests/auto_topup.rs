//! Auto top-up: a pack charged off-session once per crossing of the threshold (localstripe
//! confirms the intent), granted once whether the answer or the webhook tells it first;
//! declines retried after a backoff, then auto top-up off; a bank that wants the customer
//! present answered with a Checkout link (a stub speaking Stripe's 402 shape, which
//! localstripe does not); Stripe's own `payment_intent.*` event shapes; bad settings
//! refused with nothing changed. On SQLite and PostgreSQL (and, in CI, Citus).

mod common;

use std::sync::{Arc, Mutex};

use common::localstripe::{stripe_at, LocalStripe};
use common::{beat_until_told_to_park, hb};
use common::{eventually, mini_plans, Backend, Options, TestServer, ADMIN, T0};
use rush_meter::store::AutoTopupRow;
use rush_meter::tokens::Scope;
use rush_meter_core::signature::sign;
use serde_json::{json, Value};

const SECRET: &str = common::localstripe::WEBHOOK_SECRET;

async fn start(backend: Backend, dir: &tempfile::TempDir, base: &str) -> Option<TestServer> {
    TestServer::start_with(
        backend,
        Options {
            plans_dir: dir.path().to_path_buf(),
            stripe: stripe_at(base),
            clock_start: T0,
            ..Options::default()
        },
    )
    .await
}

/// An org on `mini` with the key `k1`.
async fn create(srv: &TestServer, org: &str) {
    srv.create_org(org, "mini").await;
    srv.admin("PUT", &format!("/v1/orgs/{org}/keys/k1"), Some(json!({})))
        .await;
}

async fn link(srv: &TestServer, org: &str, customer: &str) {
    assert!(srv
        .db
        .link_stripe_customer(org, customer, srv.clock.now())
        .await
        .unwrap());
}

/// `mini`'s threshold of 0.05 h (180 s: its whole week) with packs of 1 hour.
fn on(max: i64) -> Value {
    json!({"enabled": true, "below_hours": "0.05", "pack_hours": 1, "monthly_max_packs": max})
}

async fn packs(srv: &TestServer, org: &str) -> Vec<AutoTopupRow> {
    srv.db.auto_topups_of(org, 100).await.unwrap()
}

async fn purchased(srv: &TestServer, org: &str) -> Vec<Value> {
    srv.admin("GET", &format!("/v1/orgs/{org}/grants"), None)
        .await["grants"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["kind"] == "purchased")
        .cloned()
        .collect()
}

/// Beat `session` every 15 s from `from` for `rounds` rounds; the time after the last.
async fn beat(srv: &TestServer, org: &str, session: &str, from: i64, rounds: i64) -> i64 {
    let mut t = from;
    for seq in 1..=rounds {
        srv.clock.set(t);
        let (status, v) = srv
            .heartbeats(vec![hb(org, session, seq, "running", t)])
            .await;
        assert_eq!(status, 200, "{v}");
        t += 15;
    }
    t
}

/// Deliver a Stripe event as Stripe signs it, at the server's time; its status.
async fn deliver(srv: &TestServer, body: &str) -> u16 {
    let signed = sign(SECRET, srv.clock.now(), body.as_bytes());
    common::webhooks::deliver(srv, body, &signed).await.0
}

/// A fixture of `tests/fixtures/stripe` (Stripe's shapes), its intent made `pi`'s.
fn fixture(name: &str, pi: &str, org: &str) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/stripe/");
    std::fs::read_to_string(format!("{path}{name}"))
        .unwrap()
        .replace("pi_1PgafyB7WZ01zgkWSjxsAJo3", pi)
        .replace("org_1", org)
}

async fn notifications(srv: &TestServer, org: &str) -> Vec<Value> {
    let mut out: Vec<Value> = srv
        .db
        .list_notifications(Some(org), None, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|n| serde_json::from_str(&n.body).unwrap())
        .filter(|b: &Value| b["type"] == "auto_topup.failed")
        .collect();
    out.sort_by_key(|b| b["attempts"].as_i64());
    out
}

async fn audited_turns(srv: &TestServer, org: &str) -> Vec<(String, Value)> {
    let v = srv
        .admin("GET", &format!("/v1/orgs/{org}/audit"), None)
        .await;
    let mut turns: Vec<(String, Value)> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "auto_topup.updated")
        .map(|e| {
            (
                e["actor"]["kind"].as_str().unwrap().to_owned(),
                e["after"]["enabled"].clone(),
            )
        })
        .collect();
    turns.sort_by_key(|t| t.0.clone() + &t.1.to_string());
    turns
}

every_backend! {
    async fn one_pack_is_bought_at_the_crossing_and_granted_once(backend: Backend) {
        let Some(ls) = LocalStripe::start().await else { return };
        let dir = mini_plans();
        let Some(srv) = start(backend, &dir, &ls.url).await else { return };
        create(&srv, "acme").await;
        let console = srv.token(&[Scope::Console], Some("acme")).await;
        let path = "/v1/orgs/acme/auto-topup";
        let before = srv.db.digest().await.unwrap();
        // Bad settings, and no payment method yet: refused, nothing changed.
        for (body, status, field) in [
            (json!({"enabled": true, "below_hours": "0.05", "pack_hours": 3, "monthly_max_packs": 2}), 422, "pack_hours"),
            (json!({"enabled": true, "below_hours": "1", "pack_hours": 1, "monthly_max_packs": 2}), 422, "pack_hours"),
            (json!({"enabled": true, "below_hours": "0.00001", "pack_hours": 1, "monthly_max_packs": 2}), 422, "below_hours"),
            (json!({"enabled": true, "below_hours": "x", "pack_hours": 1, "monthly_max_packs": 2}), 422, "below_hours"),
            (json!({"enabled": true, "below_hours": "0.05", "pack_hours": 1, "monthly_max_packs": 0}), 422, "monthly_max_packs"),
            (on(2), 409, "enabled"),
        ] {
            let (s, v) = srv.call("PUT", path, Some(&console), Some(&body)).await;
            assert_eq!((s, v["error"]["field"].as_str()), (status, Some(field)), "{body}: {v}");
        }
        let (_, v) = srv.call("PUT", path, Some(&console), Some(&on(2))).await;
        assert_eq!(v["error"]["code"], "no_payment_method", "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("billing-portal"), "{v}");
        assert_eq!(srv.db.digest().await.unwrap(), before);

        link(&srv, "acme", &ls.customer(Some("acme")).await).await;
        let (s, v) = srv.call("PUT", path, Some(&console), Some(&on(2))).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!((v["enabled"].as_bool(), v["below_hours"].as_str(), v["pack_amount"].as_str()),
            (Some(true), Some("0.0500"), Some("1.00")), "{v}");
        // The whole week left is not below it: nothing bought yet.
        assert!(packs(&srv, "acme").await.is_empty());

        let d = srv.admit("acme", "k1", "s1").await;
        assert_eq!(d["decision"], "allow", "{d}");
        // Two rounds in: the week's 180 s are below 180 s the first second they are used.
        let t = beat(&srv, "acme", "s1", T0, 3).await;
        eventually(30, "the pack is paid", || async {
            packs(&srv, "acme").await.first().is_some_and(|p| p.status == "paid")
        }).await;
        // Well past the crossing, with the pack's hour to use: no second pack.
        let t = beat(&srv, "acme", "s2", t, 20).await;
        let p = packs(&srv, "acme").await;
        assert_eq!(p.len(), 1, "{p:?}");
        let grants = purchased(&srv, "acme").await;
        assert_eq!(grants.len(), 1, "{grants:?}");
        assert_eq!((grants[0]["seconds"].as_i64(), grants[0]["grant_id"].as_str()),
            (Some(3600), p[0].grant_id.as_deref()));
        // Stripe charged one pack, of 1 h at 1.00, under the key recorded with it.
        let intents = ls.payment_intents().await;
        assert_eq!(intents.len(), 1, "{intents:?}");
        assert_eq!((intents[0]["amount"].as_i64(), intents[0]["status"].as_str(),
                    intents[0]["metadata"]["kind"].as_str()),
            (Some(100), Some("succeeded"), Some("auto_topup")));
        assert_eq!(p[0].payment_intent_id.as_deref(), intents[0]["id"].as_str());
        assert_eq!(p[0].idempotency_key, "auto-topup-acme-0001");

        // Stripe's event of the same payment, twice: the same grant, nothing more.
        let pi = intents[0]["id"].as_str().unwrap();
        let body = fixture("payment_intent.succeeded.2026-07-29.dahlia.json", pi, "acme");
        assert_eq!(deliver(&srv, &body).await, 200);
        let again = body.replace("evt_1PiSucceededDahlia0001", "evt_1PiSucceededDahlia0002");
        assert_eq!(deliver(&srv, &again).await, 200);
        eventually(30, "the events are processed", || common::webhooks::all_done(&srv)).await;
        assert_eq!(purchased(&srv, "acme").await.len(), 1);

        let (_, v) = srv.call("GET", path, Some(&console), None).await;
        assert_eq!((v["packs_this_month"].as_i64(), v["pending"].as_bool(),
                    v["packs"][0]["status"].as_str()), (Some(1), Some(false), Some("paid")), "{v}");
        // The pack is paid, shown on the bill to come, and not charged again.
        let (_, preview) = srv.call("GET", "/v1/orgs/acme/invoice-preview", Some(ADMIN), None).await;
        let topups: Vec<&Value> = preview["lines"].as_array().unwrap().iter()
            .filter(|l| l["kind"] == "topup").collect();
        assert_eq!(topups.len(), 1, "{preview}");
        assert_eq!(topups[0]["amount"], "1.00", "{preview}");
        // Turned on and off by the console's token, in the audit log.
        let (s, _) = srv.call("PUT", path, Some(&console), Some(&json!({"enabled": false}))).await;
        assert_eq!(s, 200);
        assert_eq!(audited_turns(&srv, "acme").await,
            vec![("token".into(), json!(false)), ("token".into(), json!(true))]);
        let _ = t;
    }

    async fn a_declined_pack_is_retried_then_auto_topup_turns_off(backend: Backend) {
        let Some(ls) = LocalStripe::start().await else { return };
        let dir = mini_plans();
        let Some(srv) = start(backend, &dir, &ls.url).await else { return };
        create(&srv, "acme").await;
        link(&srv, "acme", &ls.customer_with_card("acme", "4000000000000341").await).await;
        // Spend the week first: turned on below the threshold, the first pack is at once.
        let d = srv.admit("acme", "k1", "s1").await;
        assert_eq!(d["decision"], "allow", "{d}");
        beat_until_told_to_park(&srv, "acme", "s1", T0).await;
        let (s, v) = srv.call("PUT", "/v1/orgs/acme/auto-topup", Some(ADMIN), Some(&on(3))).await;
        assert_eq!(s, 200, "{v}");
        let declined = |n: i64| {
            let srv = &srv;
            async move { packs(srv, "acme").await.first().is_some_and(|p| p.attempts == n) }
        };
        eventually(30, "the first charge is declined", || declined(1)).await;
        let p = packs(&srv, "acme").await;
        assert_eq!((p.len(), p[0].status.as_str()), (1, "charging"), "{p:?}");
        assert_eq!(p[0].next_attempt_at, srv.clock.now() + 3600);
        // Not due yet: nothing sent again.
        assert_eq!(ls.payment_intents().await.len(), 1);
        srv.clock.advance(3600);
        eventually(30, "the retry is declined", || declined(2)).await;
        srv.clock.advance(6 * 3600);
        eventually(30, "the last try is declined", || declined(3)).await;
        let p = packs(&srv, "acme").await;
        assert_eq!((p.len(), p[0].status.as_str()), (1, "failed"), "{p:?}");
        assert_eq!(ls.payment_intents().await.len(), 3);
        assert!(purchased(&srv, "acme").await.is_empty());
        let org = srv.db.get_org("acme").await.unwrap().unwrap();
        assert!(!org.auto_topup.enabled && !org.auto_topup.pending);
        // Each decline told once; the last says auto top-up is off.
        let n = notifications(&srv, "acme").await;
        assert_eq!(n.len(), 3, "{n:?}");
        assert_eq!((n[0]["retry_at"].is_string(), n[0]["auto_topup_disabled"].as_bool()),
            (true, Some(false)), "{n:?}");
        assert_eq!((n[2]["retry_at"].is_null(), n[2]["auto_topup_disabled"].as_bool()),
            (true, Some(true)), "{n:?}");
        assert_eq!(n[0]["error"].as_str().map(|e| !e.is_empty()), Some(true));
        // Turned on by the admin, off by the service.
        assert_eq!(audited_turns(&srv, "acme").await,
            vec![("system".into(), json!(false)), ("token".into(), json!(true))]);
    }

    async fn a_declined_pack_is_not_charged_again_once_turned_off(backend: Backend) {
        let Some(ls) = LocalStripe::start().await else { return };
        let dir = mini_plans();
        let Some(srv) = start(backend, &dir, &ls.url).await else { return };
        create(&srv, "acme").await;
        link(&srv, "acme", &ls.customer_with_card("acme", "4000000000000341").await).await;
        let d = srv.admit("acme", "k1", "s1").await;
        assert_eq!(d["decision"], "allow", "{d}");
        beat_until_told_to_park(&srv, "acme", "s1", T0).await;
        let path = "/v1/orgs/acme/auto-topup";
        let (s, v) = srv.call("PUT", path, Some(ADMIN), Some(&on(3))).await;
        assert_eq!(s, 200, "{v}");
        eventually(30, "the first charge is declined", || async {
            packs(&srv, "acme").await.first().is_some_and(|p| p.attempts == 1)
        })
        .await;
        let (s, _) = srv.call("PUT", path, Some(ADMIN), Some(&json!({"enabled": false}))).await;
        assert_eq!(s, 200);
        srv.clock.advance(3600);
        eventually(30, "the retry is called off", || async {
            packs(&srv, "acme").await.first().is_some_and(|p| p.status == "canceled")
        })
        .await;
        assert_eq!(ls.payment_intents().await.len(), 1);
        assert!(!srv.db.get_org("acme").await.unwrap().unwrap().auto_topup.pending);
    }

    async fn the_months_maximum_holds_until_it_is_raised(backend: Backend) {
        let Some(ls) = LocalStripe::start().await else { return };
        let dir = mini_plans();
        let Some(srv) = start(backend, &dir, &ls.url).await else { return };
        create(&srv, "acme").await;
        link(&srv, "acme", &ls.customer(Some("acme")).await).await;
        let path = "/v1/orgs/acme/auto-topup";
        let (s, v) = srv.call("PUT", path, Some(ADMIN), Some(&on(1))).await;
        assert_eq!(s, 200, "{v}");
        let sessions: Vec<String> = (0..10).map(|i| format!("s{i}")).collect();
        for id in &sessions {
            let d = srv.admit("acme", "k1", id).await;
            assert_eq!(d["decision"], "allow", "{d}");
        }
        // Ten sessions spend the week and the pack's hour (150 s a round) until told to park.
        let mut t = T0;
        let mut seq = 0;
        loop {
            assert!(t < T0 + 3600, "never told to park");
            srv.clock.set(t);
            seq += 1;
            let beats = sessions.iter().map(|id| hb("acme", id, seq, "running", t)).collect();
            let (status, v) = srv.heartbeats(beats).await;
            assert_eq!(status, 200, "{v}");
            if v["results"][0]["action"] == "park" {
                break;
            }
            // The first pack is paid before the next round is booked against it.
            if seq == 2 {
                eventually(30, "the first pack is paid", || async {
                    packs(&srv, "acme").await.first().is_some_and(|p| p.status == "paid")
                })
                .await;
            }
            t += 15;
        }
        // Below the threshold again, at the month's one pack: none bought.
        let p = packs(&srv, "acme").await;
        assert_eq!((p.len(), ls.payment_intents().await.len()), (1, 1), "{p:?}");
        let (_, v) = srv.call("GET", path, Some(ADMIN), None).await;
        assert_eq!((v["packs_this_month"].as_i64(), v["pending"].as_bool()), (Some(1), Some(false)), "{v}");
        // Raised: the next pack at once.
        let (s, v) = srv.call("PUT", path, Some(ADMIN), Some(&on(2))).await;
        assert_eq!(s, 200, "{v}");
        eventually(30, "the second pack is paid", || async {
            let p = packs(&srv, "acme").await;
            p.len() == 2 && p[0].status == "paid"
        })
        .await;
        assert_eq!(ls.payment_intents().await.len(), 2);
        assert_eq!(purchased(&srv, "acme").await.len(), 2);
    }
}

/// Stripe as far as a pack that needs its customer goes, in Stripe's shapes: a customer
/// with a saved card, an off-session charge declined 402 `authentication_required` (with
/// the intent, as Stripe answers it; localstripe answers `requires_action` instead), and
/// Checkout. Records every call.
type Sent = Arc<Mutex<Vec<(String, String, String)>>>;

async fn sca_stub(charge_status: u16) -> (String, Sent) {
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
                ("GET", p) if p.starts_with("/v1/customers/") => (200, json!({
                    "id": "cus_sca", "object": "customer", "metadata": {},
                    "invoice_settings": {"default_payment_method": "pm_sca"}})),
                ("POST", "/v1/payment_intents") if charge_status == 402 => (402, json!({"error": {
                    "type": "card_error", "code": "authentication_required",
                    "decline_code": "authentication_required",
                    "message": "This payment requires authentication.",
                    "payment_intent": {"id": "pi_sca", "object": "payment_intent",
                        "status": "requires_payment_method"}}})),
                ("POST", "/v1/payment_intents") => (charge_status, json!({"error": {
                    "type": "api_error", "message": "stub outage"}})),
                ("POST", "/v1/checkout/sessions") => (200, json!({
                    "id": format!("cs_sca{n}"), "url": format!("https://checkout.stripe.test/{n}")})),
                ("GET", "/v1/checkout/sessions") => (200, json!({"object": "list", "data": [], "has_more": false})),
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

/// Spend `org`'s week and turn auto top-up on below the threshold: its first pack opens at
/// once.
async fn below_and_on(srv: &TestServer, org: &str) {
    create(srv, org).await;
    link(srv, org, &format!("cus_{org}")).await;
    let d = srv.admit(org, "k1", "s1").await;
    assert_eq!(d["decision"], "allow", "{d}");
    beat_until_told_to_park(srv, org, "s1", T0).await;
    let (s, v) = srv
        .call(
            "PUT",
            &format!("/v1/orgs/{org}/auto-topup"),
            Some(ADMIN),
            Some(&on(3)),
        )
        .await;
    assert_eq!(s, 200, "{v}");
}

every_backend! {
    async fn a_pack_that_needs_the_customer_is_sent_to_checkout(backend: Backend) {
        let (base, sent) = sca_stub(402).await;
        let dir = mini_plans();
        let Some(srv) = start(backend, &dir, &base).await else { return };
        below_and_on(&srv, "acme").await;
        eventually(30, "the pack is sent to the customer", || async {
            packs(&srv, "acme").await.first().is_some_and(|p| p.status == "needs_customer")
        }).await;
        let n = notifications(&srv, "acme").await;
        assert_eq!(n.len(), 1, "{n:?}");
        assert_eq!((n[0]["decline_code"].as_str(), n[0]["auto_topup_disabled"].as_bool()),
            (Some("authentication_required"), Some(true)), "{n:?}");
        assert!(n[0]["checkout_url"].as_str().unwrap().starts_with("https://checkout.stripe.test/"), "{n:?}");
        // One charge, never retried; one Checkout of the same pack (1 h).
        let sent = sent.lock().unwrap().clone();
        let charges = sent.iter().filter(|c| c.1 == "/v1/payment_intents" && c.0 == "POST").count();
        let checkouts: Vec<_> = sent.iter().filter(|c| c.1 == "/v1/checkout/sessions" && c.0 == "POST").collect();
        assert_eq!(charges, 1, "{sent:?}");
        assert_eq!(checkouts.len(), 1, "{sent:?}");
        assert!(checkouts[0].2.contains("metadata[hours]=1&"), "{:?}", checkouts[0]);
        // Never retried, however long it waits.
        srv.clock.advance(7 * 3600);
        srv.heartbeats(vec![hb("acme", "s9", 1, "running", srv.clock.now())]).await;
        let org = srv.db.get_org("acme").await.unwrap().unwrap();
        assert!(!org.auto_topup.enabled && !org.auto_topup.pending);
        assert_eq!(audited_turns(&srv, "acme").await,
            vec![("system".into(), json!(false)), ("token".into(), json!(true))]);
    }

    async fn stripes_payment_intent_events_settle_a_pack_once(backend: Backend) {
        // Stripe fails the charge (5xx): its outcome is unknown until Stripe's events tell.
        let (base, _) = sca_stub(500).await;
        let dir = mini_plans();
        let Some(srv) = start(backend, &dir, &base).await else { return };
        below_and_on(&srv, "org_1").await;
        below_and_on(&srv, "org_2").await;
        eventually(30, "both charges failed", || async {
            let (a, b) = (packs(&srv, "org_1").await, packs(&srv, "org_2").await);
            [a, b].iter().all(|p| p.first().is_some_and(|p| p.idempotency_key.ends_with("~2")))
        }).await;
        // Hours not paid are not counted: the gate has nothing to run on.
        let d = srv.admit("org_1", "k1", "s2").await;
        assert_eq!((d["decision"].as_str(), d["remaining"]["grant_seconds"].as_i64()),
            (Some("deny"), Some(0)), "{d}");
        // Paid, as Stripe tells it (the pack named by the request's idempotency key), twice.
        let paid = fixture("payment_intent.succeeded.2026-07-29.dahlia.json", "pi_paid", "org_1");
        assert!(paid.contains("\"idempotency_key\": \"auto-topup-org_1-0001\""));
        assert_eq!(deliver(&srv, &paid).await, 200);
        assert_eq!(deliver(&srv, &paid.replace("evt_1PiSucceededDahlia0001", "evt_again")).await, 200);
        // Declined, as Stripe tells it.
        let failed = fixture("payment_intent.payment_failed.2026-07-29.dahlia.json", "pi_failed", "org_2")
            .replace("auto-topup-org_1-0001", "auto-topup-org_2-0001");
        assert_eq!(deliver(&srv, &failed).await, 200);
        eventually(30, "the events are processed", || common::webhooks::all_done(&srv)).await;
        let p1 = packs(&srv, "org_1").await;
        assert_eq!((p1[0].status.as_str(), p1[0].payment_intent_id.as_deref()), ("paid", Some("pi_paid")));
        let grants = purchased(&srv, "org_1").await;
        assert_eq!(grants.len(), 1, "{grants:?}");
        assert_eq!(grants[0]["seconds"].as_i64(), Some(3600));
        assert!(!srv.db.get_org("org_1").await.unwrap().unwrap().auto_topup.pending);
        // Paid: its hour is the grant the gate runs on.
        let d = srv.admit("org_1", "k1", "s3").await;
        assert_eq!((d["decision"].as_str(), d["funded_by"].as_str()), (Some("allow"), Some("grant")), "{d}");
        let p2 = packs(&srv, "org_2").await;
        assert_eq!((p2[0].status.as_str(), p2[0].attempts), ("charging", 1), "{p2:?}");
        assert!(p2[0].last_error.as_deref().unwrap().contains("insufficient funds")
            || p2[0].last_error.is_some(), "{p2:?}");
        let n = notifications(&srv, "org_2").await;
        assert_eq!((n.len(), n[0]["decline_code"].as_str()), (1, Some("insufficient_funds")), "{n:?}");
        assert!(purchased(&srv, "org_2").await.is_empty());
    }
}

/// Sessions of one org racing across the threshold through two instances at once: one
/// pack opened, charged and granted, whichever instance's commit crossed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_charge_one_pack_at_a_crossing() {
    let Some(ls) = LocalStripe::start().await else {
        return;
    };
    let Some((url, _)) = common::fresh_database(Backend::Postgres).await else {
        return;
    };
    let dir = mini_plans();
    let opts = || Options {
        plans_dir: dir.path().to_path_buf(),
        stripe: stripe_at(&ls.url),
        clock_start: T0,
        ..Options::default()
    };
    let a = TestServer::start_on(Backend::Postgres, url.clone(), None, opts()).await;
    let b = TestServer::start_on(Backend::Postgres, url, None, opts()).await;
    create(&a, "acme").await;
    link(&a, "acme", &ls.customer(Some("acme")).await).await;
    let (s, v) = a
        .call("PUT", "/v1/orgs/acme/auto-topup", Some(ADMIN), Some(&on(3)))
        .await;
    assert_eq!(s, 200, "{v}");
    let sessions: Vec<String> = (0..10).map(|i| format!("s{i}")).collect();
    for (i, s) in sessions.iter().enumerate() {
        let srv = if i.is_multiple_of(2) { &a } else { &b };
        let d = srv.admit("acme", "k1", s).await;
        assert_eq!(d["decision"], "allow", "{d}");
    }
    // Ten sessions spend the week's 180 s in the second round; every heartbeat is its own
    // request, all of a round at once, half through each instance.
    for round in 0..6 {
        let t = T0 + 15 * round;
        a.clock.set(t);
        b.clock.set(t);
        let beats = sessions.iter().enumerate().map(|(i, s)| {
            let srv = if (i + round as usize).is_multiple_of(2) {
                &a
            } else {
                &b
            };
            async move {
                let (status, v) = srv
                    .heartbeats(vec![hb("acme", s, round + 1, "running", t)])
                    .await;
                assert_eq!(status, 200, "{v}");
            }
        });
        futures_util::future::join_all(beats).await;
    }
    eventually(30, "the pack is paid", || async {
        packs(&a, "acme")
            .await
            .first()
            .is_some_and(|p| p.status == "paid")
    })
    .await;
    assert_eq!(packs(&a, "acme").await.len(), 1);
    assert_eq!(ls.payment_intents().await.len(), 1);
    assert_eq!(purchased(&a, "acme").await.len(), 1);
    // Opened by one instance only (the other's tries found it opened).
    let opened = "rush_meter_auto_topups_total{result=\"opened\"}";
    assert_eq!(a.metric(opened).await + b.metric(opened).await, 1.0);
}
