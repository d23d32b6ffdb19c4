//! Stripe's webhooks as the tests deliver them by hand: the secrets a server checks them
//! with, events built as Stripe sends them, their signed delivery, and the states of the
//! events the server stored (tests/stripe.rs, tests/stripe_webhooks.rs).

use rush_meter::config::StripeConfig;
use rush_meter_core::ledger::Secs;
use secrecy::SecretString;
use serde_json::{json, Value};

use super::{Backend, Options, TestServer};

/// The webhook secret in use: the server checks deliveries with it, and localstripe signs
/// its webhooks with it.
pub const SECRET: &str = super::localstripe::WEBHOOK_SECRET;
/// A secret being rolled out of use: the server still accepts deliveries signed with it.
pub const OLD_SECRET: &str = "whsec_rush_meter_old";

/// Stripe settings with the two webhook secrets and no API key: webhooks only.
pub fn webhooks_only() -> StripeConfig {
    StripeConfig {
        webhook_secrets: vec![SecretString::from(SECRET), SecretString::from(OLD_SECRET)],
        ..StripeConfig::default()
    }
}

/// A server with `stripe` as its Stripe settings, its clock at `clock_start`.
pub async fn start(
    backend: Backend,
    stripe: StripeConfig,
    clock_start: Secs,
) -> Option<TestServer> {
    TestServer::start_with(
        backend,
        Options {
            stripe,
            clock_start,
            ..Options::default()
        },
    )
    .await
}

/// Deliver `body` as Stripe would, signed with `header`; the status and answer.
pub async fn deliver(srv: &TestServer, body: &str, header: &str) -> (u16, Value) {
    let resp = srv
        .client
        .post(format!("{}/v1/stripe/webhook", srv.url))
        .header("Stripe-Signature", header)
        .header("Content-Type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

/// An event as Stripe sends it: `kind` about `object`, made at `created`.
pub fn event(id: &str, kind: &str, created: Secs, object: Value) -> String {
    json!({"id": id, "object": "event", "type": kind, "created": created, "data": {"object": object}}).to_string()
}

/// The state and attempts of each Stripe event the server stored.
pub async fn event_states(srv: &TestServer) -> Vec<(String, i64)> {
    let v = srv
        .admin("GET", "/v1/admin/stripe/events?limit=1000", None)
        .await;
    v["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["state"].as_str().unwrap().to_owned(),
                e["attempts"].as_i64().unwrap(),
            )
        })
        .collect()
}

/// Whether no stored event waits to be processed.
pub async fn all_done(srv: &TestServer) -> bool {
    let v = srv
        .admin("GET", "/v1/admin/stripe/events?state=pending", None)
        .await;
    v["events"].as_array().unwrap().is_empty()
}
