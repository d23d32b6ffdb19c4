//! Stripe's webhooks delivered by hand, signed by the test (no Stripe runs): signatures
//! checked before anything is stored, events delivered five times at once taking effect
//! once, and events in any order leaving Stripe's state. On SQLite and PostgreSQL.

mod common;

use common::webhooks::{all_done, deliver, event, event_states, start, webhooks_only};
use common::webhooks::{OLD_SECRET, SECRET};
use common::{eventually, Backend};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rush_meter_core::ledger::Secs;
use rush_meter_core::signature::sign;
use serde_json::{json, Value};

fn subscription(id: &str, org: &str, status: &str, plan: &str) -> Value {
    json!({"id": id, "object": "subscription", "status": status, "customer": format!("cus_{org}"),
           "metadata": {"org_id": org}, "cancel_at_period_end": false,
           "current_period_start": 1_796_000_000, "current_period_end": 1_798_600_000,
           "items": {"object": "list", "data": [{"id": format!("si_{id}"), "plan": {"id": plan}}]}})
}

every_backend!(
    signatures_are_checked_before_anything_is_stored,
    events_delivered_five_times_at_once_take_effect_once,
    events_in_any_order_leave_stripes_state,
    a_subscription_of_an_unknown_shape_is_retried_and_the_org_keeps_its_plan,
);

/// A subscription whose price maps to no plan (or whose status is unknown) is not guessed
/// at: its event fails (retried with backoff, quarantined after its tries), its last error
/// names what is unknown, and the org keeps its plan.
async fn a_subscription_of_an_unknown_shape_is_retried_and_the_org_keeps_its_plan(
    backend: Backend,
) {
    let Some(srv) = start(backend, webhooks_only(), common::T0).await else {
        return;
    };
    srv.create_org("org_1", "free").await;
    let now = common::T0;
    let send = |id: &str, created: Secs, obj: Value| {
        let body = event(id, "customer.subscription.updated", created, obj);
        let header = sign(SECRET, now, body.as_bytes());
        let srv = &srv;
        async move {
            let (status, v) = deliver(srv, &body, &header).await;
            assert_eq!(status, 200, "{v}");
        }
    };
    send(
        "evt_1",
        now - 10,
        subscription("sub_1", "org_1", "active", "pro_monthly"),
    )
    .await;
    eventually(30, "the first event is processed", || all_done(&srv)).await;
    let mut odd_status = subscription("sub_1", "org_1", "frozen", "pro_monthly");
    odd_status["id"] = json!("sub_1");
    for (id, obj, unknown) in [
        (
            "evt_2",
            subscription("sub_1", "org_1", "active", "mystery_monthly"),
            "mystery_monthly",
        ),
        ("evt_3", odd_status, "`frozen`"),
    ] {
        send(id, now - 5, obj).await;
        eventually(30, "the event fails with its reason", || async {
            let v = srv
                .admin("GET", "/v1/admin/stripe/events?limit=10", None)
                .await;
            v["events"].as_array().unwrap().iter().any(|e| {
                e["event_id"] == id
                    && e["state"] == "pending"
                    && e["attempts"].as_i64() >= Some(1)
                    && e["last_error"]
                        .as_str()
                        .is_some_and(|m| m.contains(unknown))
            })
        })
        .await;
        let org = srv.db.get_org("org_1").await.unwrap().unwrap();
        assert_eq!(
            (org.plan_id.as_str(), org.subscription_status.as_deref()),
            ("pro", Some("active")),
            "{id}: the org keeps its plan"
        );
    }
}

async fn signatures_are_checked_before_anything_is_stored(backend: Backend) {
    let Some(srv) = start(backend, webhooks_only(), common::T0).await else {
        return;
    };
    srv.create_org("org_1", "free").await;
    let now = common::T0;
    let body = event(
        "evt_1",
        "customer.subscription.created",
        now,
        subscription("sub_1", "org_1", "active", "pro_monthly"),
    );
    let before = srv.db.digest().await.unwrap();
    let mut flipped = body.clone().into_bytes();
    flipped[20] ^= 1;
    let flipped = String::from_utf8(flipped).unwrap();
    let good_sig = sign(SECRET, now, body.as_bytes());
    let good_v1 = good_sig.split_once(",v1=").unwrap().1.to_owned();
    let other_v1 = "0".repeat(64);
    for (what, b, header) in [
        (
            "a flipped body byte",
            flipped.as_str(),
            sign(SECRET, now, body.as_bytes()),
        ),
        (
            "a timestamp 301 s old",
            body.as_str(),
            sign(SECRET, now - 301, body.as_bytes()),
        ),
        (
            "a wrong secret",
            body.as_str(),
            sign("whsec_wrong", now, body.as_bytes()),
        ),
        ("no v1", body.as_str(), format!("t={now}")),
    ] {
        let (status, v) = deliver(&srv, b, &header).await;
        assert_eq!(status, 400, "{what}: {v}");
        assert_eq!(v["error"]["code"], "invalid_signature", "{what}");
    }
    assert_eq!(
        srv.db.digest().await.unwrap(),
        before,
        "a refused delivery stored nothing"
    );
    let (status, _) = deliver(&srv, &body, "").await;
    assert_eq!(status, 400);

    // 299 s old, signed with the secret being rolled out of use.
    let (status, v) = deliver(&srv, &body, &sign(OLD_SECRET, now - 299, body.as_bytes())).await;
    assert_eq!((status, &v["duplicate"]), (200, &json!(false)), "{v}");
    // Two v1 values, the good one first or second: both accepted (as redeliveries).
    for header in [
        format!("t={now},v1={good_v1},v1={other_v1}"),
        format!("t={now},v1={other_v1},v1={good_v1}"),
    ] {
        let (status, v) = deliver(&srv, &body, &header).await;
        assert_eq!(
            (status, &v["duplicate"]),
            (200, &json!(true)),
            "{header}: {v}"
        );
    }
    // Unknown types are stored and acknowledged, then ignored.
    let odd = event(
        "evt_2",
        "radar.early_fraud_warning.created",
        now,
        json!({"id": "issfr_1"}),
    );
    let (status, _) = deliver(&srv, &odd, &sign(SECRET, now, odd.as_bytes())).await;
    assert_eq!(status, 200);
    eventually(10, "both events are done", || all_done(&srv)).await;
    let mut states = event_states(&srv).await;
    states.sort();
    assert_eq!(
        states,
        [("ignored".to_owned(), 1), ("processed".to_owned(), 1)]
    );
    let org = srv.db.get_org("org_1").await.unwrap().unwrap();
    assert_eq!(
        (org.plan_id.as_str(), org.subscription_status.as_deref()),
        ("pro", Some("active"))
    );
}

async fn events_delivered_five_times_at_once_take_effect_once(backend: Backend) {
    let Some(srv) = start(backend, webhooks_only(), common::T0).await else {
        return;
    };
    const ORGS: usize = 100;
    const PER_ORG: usize = 10;
    for o in 0..ORGS {
        srv.create_org(&format!("org_{o}"), "free").await;
    }
    // 1,000 events: ten for each org's subscription, alternating plans over time.
    let mut bodies = Vec::new();
    for o in 0..ORGS {
        for k in 0..PER_ORG {
            let plan = if k % 2 == 0 {
                "pro_monthly"
            } else {
                "team_monthly"
            };
            let obj = subscription(&format!("sub_{o}"), &format!("org_{o}"), "active", plan);
            let created = common::T0 - 1000 + k as Secs;
            bodies.push(event(
                &format!("evt_{o}_{k}"),
                "customer.subscription.updated",
                created,
                obj,
            ));
        }
    }
    let deliveries: Vec<String> = bodies
        .iter()
        .flat_map(|b| std::iter::repeat_n(b.clone(), 5))
        .collect();
    let srv = std::sync::Arc::new(srv);
    let mut tasks = tokio::task::JoinSet::new();
    for chunk in deliveries.chunks(deliveries.len() / 50) {
        let (srv, chunk) = (std::sync::Arc::clone(&srv), chunk.to_vec());
        tasks.spawn(async move {
            for body in chunk {
                let header = sign(SECRET, common::T0, body.as_bytes());
                let (status, v) = deliver(&srv, &body, &header).await;
                assert_eq!(status, 200, "{v}");
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    eventually(60, "every event is processed", || all_done(&srv)).await;
    let states = event_states(&srv).await;
    assert_eq!(states.len(), ORGS * PER_ORG);
    assert!(
        states.iter().all(|(s, a)| s == "processed" && *a == 1),
        "each event taken once"
    );
    for o in 0..ORGS {
        let org = srv.db.get_org(&format!("org_{o}")).await.unwrap().unwrap();
        assert_eq!(org.plan_id, "team", "the latest event's plan wins");
    }
}

async fn events_in_any_order_leave_stripes_state(backend: Backend) {
    let Some(srv) = start(backend, webhooks_only(), common::T0).await else {
        return;
    };
    const SUBS: usize = 100;
    for seed in 0..3u64 {
        // One subscription an org: each seed has its own orgs.
        for o in 0..SUBS {
            srv.create_org(&format!("org_{seed}_{o}"), "free").await;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut events = Vec::new();
        let mut expected = Vec::new();
        for o in 0..SUBS {
            let (org, sub) = (format!("org_{seed}_{o}"), format!("sub_{seed}_{o}"));
            let t = common::T0 + seed as Secs * 100;
            let plans = ["pro_monthly", "team_monthly"];
            let updated_plan = *plans.choose(&mut rng).unwrap();
            let updated_status = *["active", "past_due", "unpaid"].choose(&mut rng).unwrap();
            let mut seq = vec![
                (
                    "customer.subscription.created",
                    t,
                    subscription(&sub, &org, "active", "pro_monthly"),
                ),
                (
                    "customer.subscription.updated",
                    t + 1,
                    subscription(&sub, &org, updated_status, updated_plan),
                ),
            ];
            let deleted = rand::Rng::gen_bool(&mut rng, 0.5);
            if deleted {
                seq.push((
                    "customer.subscription.deleted",
                    t + 2,
                    subscription(&sub, &org, "canceled", updated_plan),
                ));
            }
            let last = seq.last().unwrap();
            let plan = if deleted {
                "free"
            } else if updated_plan == "pro_monthly" {
                "pro"
            } else {
                "team"
            };
            expected.push((
                org.clone(),
                plan.to_owned(),
                last.2["status"].as_str().unwrap().to_owned(),
            ));
            for (k, (kind, created, obj)) in seq.into_iter().enumerate() {
                events.push(event(&format!("evt_{seed}_{o}_{k}"), kind, created, obj));
            }
        }
        events.shuffle(&mut rng);
        for body in &events {
            let (status, v) = deliver(&srv, body, &sign(SECRET, common::T0, body.as_bytes())).await;
            assert_eq!(status, 200, "{v}");
        }
        eventually(60, "every event is processed", || all_done(&srv)).await;
        for (org, plan, status) in expected {
            let row = srv.db.get_org(&org).await.unwrap().unwrap();
            assert_eq!(
                (row.plan_id.as_str(), row.subscription_status.as_deref()),
                (plan.as_str(), Some(status.as_str())),
                "{org}, seed {seed}"
            );
        }
    }
}
