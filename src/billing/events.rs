//! Webhook events after they are stored: each is taken by one instance, processed, and
//! marked processed, ignored (a type this service does not act on) or, after its retries,
//! quarantined for an admin to look at. Subscription, invoice and checkout events are
//! not trusted for their content: the subscription is read again from Stripe and applied
//! only if that read is newer than what is stored, so the order of arrival never matters.

use rush_meter_core::retry::{backoff, MAX_ATTEMPTS};
use rush_meter_core::time::Secs;
use serde::Deserialize;

use super::subscription::Subscription;
use super::{Billing, BillingError, BillingResult, Outcome};
use crate::store::{StoreResult, StripeEventRow};

rush_meter_core::named! {
    /// Where a stored Stripe event stands.
    pub enum EventState {
        /// Waiting for its (next) try.
        Pending = "pending",
        Processed = "processed",
        /// A type or object this service does not act on.
        Ignored = "ignored",
        /// Failed every try: waits for an admin (`POST …/retry`).
        Quarantined = "quarantined",
    }
}

/// How long an instance holds the events it took before another may take them: well
/// past `TAKE` events at two Stripe calls of at most 30 s each.
const HOLD: Secs = 600;

/// Events taken at a time.
const TAKE: i64 = 5;

/// The envelope of a Stripe event.
#[derive(Debug, Deserialize)]
pub struct Envelope {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub created: Secs,
    pub data: Data,
    /// The API request that caused it: its idempotency key names an auto top-up's pack.
    #[serde(default)]
    pub request: Option<EventRequest>,
}

#[derive(Debug, Default, Deserialize)]
pub struct EventRequest {
    pub idempotency_key: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct Data {
    pub object: serde_json::Value,
}

/// An event as the webhook stores it. One it cannot store as sent (not JSON, not an
/// event, an id Stripe does not make, a type or version that is not one line) is stored
/// under an id derived from its bytes, quarantined with `refused` saying why: a refusal
/// would be retried by Stripe for days, and its bytes are kept for an admin to look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    pub id: String,
    pub kind: String,
    pub created: Secs,
    pub api_version: Option<String>,
    pub payload: String,
    pub refused: Option<String>,
}

#[derive(Deserialize)]
struct Head {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    created: Secs,
    api_version: Option<String>,
}

/// The longest event id kept: Stripe's ids are far shorter.
pub const EVENT_ID_MAX: usize = 255;

/// Why `id` is not an event id as Stripe makes them (`evt_…`: letters, digits, `_`).
fn odd_id(id: &str) -> Option<String> {
    if id.is_empty() || id.len() > EVENT_ID_MAX {
        return Some(format!(
            "its id is {} bytes long (1 to {EVENT_ID_MAX} are kept)",
            id.len()
        ));
    }
    id.chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-')))
        .map(|c| format!("its id holds {c:?}, which no Stripe id does"))
}

/// Read a signed webhook body: what to store, and whether to quarantine it.
pub fn arrival(body: &[u8], now: Secs) -> Arrival {
    use rush_meter_core::text::Text;
    use sha2::{Digest, Sha256};
    // NUL cannot be stored as text; everything else of the bytes is kept as sent.
    let payload = String::from_utf8_lossy(body).replace('\0', "\u{FFFD}");
    let head = std::str::from_utf8(body)
        .map_err(|_| "it is not UTF-8".to_owned())
        .and_then(|t| {
            serde_json::from_str::<Head>(t)
                .map_err(|e| format!("it is not a Stripe event (id, type, created): {e}"))
        });
    let refused = match &head {
        Err(why) => Some(why.clone()),
        Ok(h) => odd_id(&h.id)
            .or_else(|| {
                Text::Line
                    .check(&h.kind, 255)
                    .err()
                    .map(|m| format!("its type {m}"))
            })
            .or_else(|| {
                let version = h.api_version.as_deref().unwrap_or("");
                Text::Line
                    .check(version, 64)
                    .err()
                    .map(|m| format!("its api_version {m}"))
            }),
    };
    match (head, refused) {
        (Ok(h), None) => Arrival {
            id: h.id,
            kind: h.kind,
            created: h.created,
            api_version: h.api_version,
            payload,
            refused: None,
        },
        // An unreadable head always has a reason (the first arm of `refused`).
        (head, why) => {
            let why = why.unwrap_or_default();
            let digest = hex::encode(Sha256::digest(body));
            let kind = head
                .as_ref()
                .ok()
                .map(|h| h.kind.clone())
                .filter(|k| Text::Line.check(k, 255).is_ok())
                .unwrap_or_else(|| "unreadable".to_owned());
            Arrival {
                id: format!("evt_unreadable_{}", &digest[..32]),
                kind,
                created: head.as_ref().map_or(now, |h| h.created),
                api_version: None,
                payload,
                refused: Some(format!("stored as sent but not processed: {why}")),
            }
        }
    }
}

/// The subscription an event is about, wherever its type puts it.
pub fn subscription_id(kind: &str, object: &serde_json::Value) -> Option<String> {
    let id_of = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("id").and_then(|i| i.as_str()).map(str::to_owned),
        _ => None,
    };
    if kind.starts_with("customer.subscription.") {
        return id_of(object.get("id")?);
    }
    // Invoices name it at the top level before API version 2025-03-31, under `parent` after.
    object.get("subscription").and_then(id_of).or_else(|| {
        object
            .pointer("/parent/subscription_details/subscription")
            .and_then(id_of)
    })
}

/// The org an event's object names (`metadata.org_id`, or Checkout's `client_reference_id`).
pub fn org_hint(object: &serde_json::Value) -> Option<String> {
    object
        .pointer("/metadata/org_id")
        .or_else(|| object.get("client_reference_id"))
        .and_then(|v| v.as_str())
        .map(str::to_owned)
}

/// Process every due event, a few at a time; returns how many were taken.
pub async fn process_due(b: &Billing) -> StoreResult<usize> {
    let mut taken = 0;
    loop {
        let now = b.clock.now();
        let events = b.db.claim_stripe_events(now, HOLD, TAKE).await?;
        if events.is_empty() {
            return Ok(taken);
        }
        taken += events.len();
        for ev in events {
            let result = process(b, &ev).await;
            let now = b.clock.now();
            let (state, next) = next_state(&result, ev.attempts, now);
            let org = match &result {
                Ok(Outcome::Applied(org)) => org.as_deref(),
                _ => None,
            };
            let failure = result.as_ref().err().map(ToString::to_string);
            let error = match &result {
                Ok(Outcome::Ignored(why)) => Some(why.as_str()),
                Err(_) => failure.as_deref(),
                _ => None,
            };
            let result_label = if state == "pending" { "retry" } else { state };
            crate::metrics::count(&b.metrics.stripe_events, result_label);
            match state {
                "quarantined" => {
                    tracing::error!(event = %ev.event_id, kind = %ev.kind, error = ?error, "Stripe event quarantined after {} tries", ev.attempts)
                }
                "pending" => {
                    tracing::warn!(event = %ev.event_id, kind = %ev.kind, error = ?error, attempt = ev.attempts, "Stripe event failed; will retry")
                }
                _ => {
                    tracing::info!(event = %ev.event_id, kind = %ev.kind, state, org = ?org, "Stripe event done")
                }
            }
            b.db.finish_stripe_event(&ev.event_id, state, org, error, next, now)
                .await?;
        }
    }
}

/// Where an event goes after a try: done, or due again after the backoff, or, after
/// `MAX_ATTEMPTS` tries, quarantined.
pub fn next_state(
    result: &BillingResult<Outcome>,
    attempts: i64,
    now: Secs,
) -> (&'static str, Secs) {
    match result {
        Ok(Outcome::Applied(_)) => ("processed", now),
        Ok(Outcome::Ignored(_)) => ("ignored", now),
        Err(_) if attempts >= MAX_ATTEMPTS => ("quarantined", now),
        Err(_) => ("pending", now + backoff(attempts)),
    }
}

async fn process(b: &Billing, ev: &StripeEventRow) -> BillingResult<Outcome> {
    let env: Envelope = serde_json::from_str(&ev.payload)
        .map_err(|e| BillingError::Unmatched(format!("stored event does not parse: {e}")))?;
    let object = &env.data.object;
    let kind = env.kind.as_str();
    let payment_mode = object.get("mode").and_then(|m| m.as_str()) == Some("payment");
    if payment_mode
        && matches!(
            kind,
            "checkout.session.completed" | "checkout.session.async_payment_succeeded"
        )
    {
        return super::funding::topup_paid(b, object).await;
    }
    if kind.starts_with("payment_intent.") {
        let key = env
            .request
            .as_ref()
            .and_then(|r| r.idempotency_key.as_deref());
        return super::auto_topup::event(b, kind, object, key).await;
    }
    if kind == "invoice.created" {
        attach_overage(b, object).await?;
    }
    let about_subscription = kind.starts_with("customer.subscription.")
        || kind.starts_with("invoice.")
        || kind == "checkout.session.completed";
    if about_subscription {
        let Some(sub_id) = subscription_id(kind, object) else {
            return Ok(Outcome::Ignored("the event names no subscription".into()));
        };
        let hint = org_hint(object);
        let (sub, read) = match &b.api {
            Some(api) => {
                // A deleted subscription may be gone from Stripe (or the fake): the event
                // carries its final state.
                let read_one = || async {
                    match api.subscription(&sub_id).await {
                        Ok(s) => Ok(s),
                        Err(e) if e.is_not_found() && kind == "customer.subscription.deleted" => {
                            parse_subscription(object)
                        }
                        Err(e) => Err(BillingError::from(e)),
                    }
                };
                // The org first, so that its ticket is taken before the read; an org
                // the event does not name is found from a first read, then read again.
                let org = match known_org(b, object, hint.as_deref()).await? {
                    Some(org) => org,
                    None => b.org_for(&read_one().await?, hint.as_deref()).await?.org_id,
                };
                let read = b.ticket(&org).await?;
                (read_one().await?, read)
            }
            // Without a secret key nothing can be read back: trust the event, by its time.
            None if kind.starts_with("customer.subscription.") => (
                parse_subscription(object)?,
                super::sync::Read {
                    at: env.created,
                    ticket: None,
                },
            ),
            None => {
                return Ok(Outcome::Ignored(
                    "Stripe API off: cannot read the subscription".into(),
                ))
            }
        };
        return b
            .apply(&sub, hint.as_deref(), read, "webhook")
            .await
            .map(|a| Outcome::Applied(a.org_id));
    }
    if kind == "customer.created" || kind == "customer.updated" {
        let (Some(org), Some(customer)) =
            (org_hint(object), object.get("id").and_then(|v| v.as_str()))
        else {
            return Ok(Outcome::Ignored("customer without metadata.org_id".into()));
        };
        return linked(b.link_customer(&org, customer).await, org);
    }
    Ok(Outcome::Ignored(format!("type {kind} is not acted on")))
}

/// The org an event's object belongs to, if this service knows it without asking Stripe:
/// the one linked to its customer, else one its metadata (or Checkout's reference) names.
async fn known_org(
    b: &Billing,
    object: &serde_json::Value,
    hint: Option<&str>,
) -> BillingResult<Option<String>> {
    let customer = object
        .get("customer")
        .and_then(|c| c.as_str().or_else(|| c.get("id").and_then(|i| i.as_str())));
    if let Some(c) = customer {
        if let Some(org) = b.db.org_by_stripe_customer(c).await? {
            return Ok(Some(org.org_id));
        }
    }
    match hint {
        Some(h) if b.db.get_org(h).await?.is_some() => Ok(Some(h.to_owned())),
        _ => Ok(None),
    }
}

/// A draft invoice of an org's subscription takes the pay-as-you-go of every window that
/// has ended (Stripe keeps a renewal invoice a draft for about an hour); windows it misses
/// are charged on the next invoice by the billing job.
async fn attach_overage(b: &Billing, invoice: &serde_json::Value) -> BillingResult<()> {
    let draft = invoice.get("status").and_then(|s| s.as_str()) == Some("draft");
    let (Some(id), Some(customer)) = (
        invoice.get("id").and_then(|v| v.as_str()),
        invoice.get("customer").and_then(|v| v.as_str()),
    ) else {
        return Ok(());
    };
    if !draft {
        return Ok(());
    }
    if let Some(org) = b.db.org_by_stripe_customer(customer).await? {
        super::funding::charge_due(b, b.clock.now(), Some((&org.org_id, id))).await?;
    }
    Ok(())
}

/// What linking a customer came to: a customer naming an org that does not exist, or one
/// linked to another customer, changes nothing (logged, not retried); any other failure
/// (the store's) is retried with the event's backoff.
fn linked(result: BillingResult<()>, org: String) -> BillingResult<Outcome> {
    match result {
        Ok(()) => Ok(Outcome::Applied(Some(org))),
        Err(BillingError::Unmatched(why)) => {
            tracing::warn!(%why, "customer event not applied");
            Ok(Outcome::Ignored(why))
        }
        Err(e) => Err(e),
    }
}

fn parse_subscription(object: &serde_json::Value) -> BillingResult<Subscription> {
    Subscription::deserialize(object)
        .map_err(|e| BillingError::Unmatched(format!("event's subscription does not parse: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_that_cannot_be_stored_as_sent_are_kept_under_a_derived_id() {
        let ok = arrival(
            br#"{"id": "evt_1", "type": "invoice.paid", "created": 5}"#,
            9,
        );
        assert_eq!((ok.id.as_str(), ok.refused.as_deref()), ("evt_1", None));
        for (body, why) in [
            (
                r#"{"id": "evt_\u0000", "type": "invoice.paid", "created": 5}"#.to_owned(),
                "holds",
            ),
            (
                format!(
                    r#"{{"id": "evt_{}", "type": "x", "created": 5}}"#,
                    "a".repeat(5000)
                ),
                "bytes long",
            ),
            (
                r#"{"id": "evt_2", "type": "a\u001bb", "created": 5}"#.to_owned(),
                "its type",
            ),
            (
                r#"{"id": "evt_3", "type": "x", "created": 5, "api_version": "\u0000"}"#.to_owned(),
                "api_version",
            ),
            ("not json at all".to_owned(), "not a Stripe event"),
        ] {
            let a = arrival(body.as_bytes(), 9);
            assert!(
                a.id.starts_with("evt_unreadable_") && a.id.len() <= EVENT_ID_MAX,
                "{a:?}"
            );
            assert!(a.refused.as_deref().unwrap().contains(why), "{a:?}");
            assert!(!a.payload.contains('\0') && !a.kind.contains('\0'));
            // The same bytes again are the same event: a redelivery stores nothing new.
            assert_eq!(arrival(body.as_bytes(), 10).id, a.id);
        }
        assert!(arrival(b"{\"id\":\"\0\"}", 9).payload.contains('\u{FFFD}'));
    }

    #[test]
    fn failures_retry_with_backoff_then_quarantine() {
        let fail: BillingResult<Outcome> = Err(BillingError::Stripe(
            super::super::api::StripeFailure::Unreachable("down".into()),
        ));
        assert_eq!(next_state(&fail, 1, 100), ("pending", 110));
        assert_eq!(next_state(&fail, MAX_ATTEMPTS - 1, 100).0, "pending");
        assert_eq!(next_state(&fail, MAX_ATTEMPTS, 100), ("quarantined", 100));
        assert_eq!(
            next_state(&Ok(Outcome::Applied(None)), 3, 100),
            ("processed", 100)
        );
        assert_eq!(
            next_state(&Ok(Outcome::Ignored("x".into())), 1, 100),
            ("ignored", 100)
        );
    }

    #[test]
    fn a_customer_link_that_fails_in_the_store_is_retried_not_ignored() {
        let down = BillingError::Store(crate::store::StoreError::Unavailable(
            sqlx::Error::PoolTimedOut,
        ));
        let r = linked(Err(down), "org_1".into());
        assert!(r.is_err(), "retried with the event's backoff");
        assert_eq!(next_state(&r, 1, 100), ("pending", 110));
        let r = linked(
            Err(BillingError::Unmatched("no such org".into())),
            "org_1".into(),
        );
        assert_eq!(next_state(&r, 1, 100), ("ignored", 100));
        let r = linked(Ok(()), "org_1".into());
        assert_eq!(r.unwrap(), Outcome::Applied(Some("org_1".into())));
    }

    #[test]
    fn the_subscription_is_found_in_every_event_shape() {
        assert_eq!(
            subscription_id("customer.subscription.updated", &json!({"id": "sub_1"})).as_deref(),
            Some("sub_1")
        );
        assert_eq!(
            subscription_id(
                "invoice.paid",
                &json!({"id": "in_1", "subscription": "sub_2"})
            )
            .as_deref(),
            Some("sub_2")
        );
        assert_eq!(
            subscription_id(
                "invoice.paid",
                &json!({"id": "in_1", "subscription": {"id": "sub_3"}})
            )
            .as_deref(),
            Some("sub_3")
        );
        assert_eq!(
            subscription_id(
                "invoice.paid",
                &json!({"parent": {"subscription_details": {"subscription": "sub_4"}}})
            )
            .as_deref(),
            Some("sub_4")
        );
        assert_eq!(
            subscription_id(
                "checkout.session.completed",
                &json!({"subscription": "sub_5", "client_reference_id": "org_9"})
            )
            .as_deref(),
            Some("sub_5")
        );
        assert_eq!(
            org_hint(&json!({"client_reference_id": "org_9"})).as_deref(),
            Some("org_9")
        );
        assert_eq!(
            org_hint(&json!({"metadata": {"org_id": "org_8"}})).as_deref(),
            Some("org_8")
        );
        assert_eq!(
            subscription_id("invoice.paid", &json!({"id": "in_1", "subscription": null})),
            None
        );
    }
}
