//! Auto top-up through Stripe (docs/funding.md): a pack opened at a crossing
//! (`app::auto_topup`) is charged off-session to the customer's saved payment method as a
//! PaymentIntent confirmed at once, under the idempotency key recorded with the pack.
//!
//! Why a PaymentIntent and not an invoice: the hours are granted the moment the payment
//! succeeds, and the answer to the request says so; an invoice would be finalized and
//! paid asynchronously (an hour as a draft for a subscription's), leaving the org parked
//! meanwhile. A top-up is prepaid and not part of the subscription's invoice either way.
//!
//! Paid (the answer, or `payment_intent.succeeded`, whichever comes first): one
//! `purchased` grant keyed by the payment intent. Declined: the decline is recorded once
//! per charge with its `auto_topup.failed` notification, retried after a backoff
//! (`core::auto_topup::RETRY_AFTER`), then auto top-up turns off; a bank that wants the
//! customer present turns it off at once, and the notification carries a Checkout link
//! for the same pack.

use std::collections::HashMap;

use rush_meter_core::audit::Actor;
use rush_meter_core::auto_topup::{
    after_decline, charge_key, parse_charge_key, AfterDecline, Declined, AUTHENTICATION_REQUIRED,
};
use rush_meter_core::funding::{Grant, GrantKind, DEFAULT_PRIORITY};
use rush_meter_core::org::Org;
use rust_decimal::Decimal;

use super::api::{PaymentIntent, StripeFailure};
use super::{Billing, BillingError, BillingResult, Outcome};
use crate::store::{AutoTopupRow, DeclineRecord};

/// The metadata of an auto top-up's charge: what Stripe's dashboard and its events show.
const KIND: &str = "auto_topup";

/// What a charge came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Charged {
    /// Paid: the grant it became.
    Paid(String),
    /// Declined and recorded; what follows.
    Declined(AfterDecline),
    /// No outcome yet (Stripe unreachable, a 5xx, a payment still processing): the pack
    /// is charged again, under the same key, when its hold ends.
    Unknown,
}

/// The payment method an off-session charge of `org` would use, if it has one saved (none
/// without a Stripe customer, or with one Stripe no longer has).
pub async fn payment_method(b: &Billing, org: &Org) -> BillingResult<Option<String>> {
    let api = b.api()?;
    let Some(customer) = &org.stripe_customer_id else {
        return Ok(None);
    };
    match saved_method(api, org, customer).await {
        Err(e) if e.is_not_found() => Ok(None),
        found => Ok(found?),
    }
}

/// The customer's default payment method, else the one Checkout saved on the org's
/// subscription (a subscription bought in Checkout keeps its card there).
async fn saved_method(
    api: &super::api::StripeApi,
    org: &Org,
    customer: &str,
) -> Result<Option<String>, StripeFailure> {
    if let Some(pm) = api.customer(customer).await?.payment_method() {
        return Ok(Some(pm));
    }
    let Some(sub) = &org.stripe_subscription_id else {
        return Ok(None);
    };
    match api.subscription(sub).await {
        Ok(s) => Ok(s
            .default_payment_method
            .as_ref()
            .and_then(super::subscription::object_id)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// The request a charge's key names: its key without the `~N` of a try after a 5xx.
fn request_of(key: &str) -> &str {
    key.split_once('~').map_or(key, |(first, _)| first)
}

/// Send the next charge of a pack taken for it (`AutoTopupStore::take_auto_topup`), and
/// record what came of it.
pub async fn charge(b: &Billing, row: &AutoTopupRow) -> BillingResult<Charged> {
    let api = b.api()?;
    let org =
        b.db.get_org(&row.org_id)
            .await?
            .ok_or_else(|| BillingError::Unmatched(format!("org {} is gone", row.org_id)))?;
    let attempt = row.attempts + 1;
    let refused = |message: &str| StripeFailure::Refused {
        status: 402,
        message: message.to_owned(),
        code: None,
        decline_code: None,
        payment_intent: None,
    };
    let Some(customer) = org.stripe_customer_id.clone() else {
        let e = refused("the org has no Stripe customer to charge");
        return declined(b, &org, row, attempt, &e).await;
    };
    let request = request_of(&row.idempotency_key).to_owned();
    // A payment already made for the pack (a try whose answer was lost, or still
    // processing) is read back rather than made again.
    let earlier = match &row.payment_intent_id {
        Some(id) => Some(api.payment_intent(id).await?),
        None if row.idempotency_key.contains('~') => {
            api.payment_intent_by_request(&customer, &request).await?
        }
        None => None,
    };
    let sent = match earlier {
        Some(pi) => Ok(pi),
        None => {
            let pm = match saved_method(api, &org, &customer).await {
                Ok(Some(pm)) => pm,
                Ok(None) => {
                    let e = refused("no payment method is saved on the Stripe customer");
                    return declined(b, &org, row, attempt, &e).await;
                }
                Err(e) if e.is_not_found() => {
                    let e = refused("the org's Stripe customer no longer exists");
                    return declined(b, &org, row, attempt, &e).await;
                }
                Err(e) => return Err(e.into()),
            };
            let amount: Decimal = row.amount.parse().map_err(|_| {
                BillingError::Unmatched(format!("pack amount `{}` is not a decimal", row.amount))
            })?;
            let metadata = HashMap::from([
                ("org_id".to_owned(), org.org_id.clone()),
                ("kind".to_owned(), KIND.to_owned()),
                ("hours".to_owned(), row.hours.to_string()),
                ("auto_topup_seq".to_owned(), row.seq.to_string()),
                ("attempt".to_owned(), attempt.to_string()),
            ]);
            api.charge_off_session(
                &customer,
                &pm,
                super::funding::cents(amount),
                &row.currency,
                metadata,
                &request,
                &row.idempotency_key,
            )
            .await
        }
    };
    match sent {
        Ok(pi) => settle_intent(b, &org, row, attempt, &pi).await,
        // A card declined is a 402; only that is a decline.
        Err(e @ StripeFailure::Refused { status: 402, .. }) => {
            declined(b, &org, row, attempt, &e).await
        }
        // A 5xx, which Stripe may replay for this key for a day; or the key seen with other
        // parameters (a card changed between an unanswered try and this one), or another
        // instance's try of it in flight: the next try reads back what this one made, then
        // sends under a new key.
        Err(
            StripeFailure::ServerError { .. }
            | StripeFailure::Refused {
                status: 400 | 409, ..
            },
        ) => {
            let next = format!("{request}~{}", tries_of(&row.idempotency_key) + 1);
            b.db.rekey_auto_topup(&org.org_id, row.seq, &next, None)
                .await?;
            Ok(Charged::Unknown)
        }
        // Refused otherwise (a key Stripe does not take: the operator's to fix), or no
        // answer: sent again under the same key when the hold ends; nothing is recorded
        // against the customer's card.
        Err(e) => {
            tracing::error!(org_id = %org.org_id, seq = row.seq, error = %e, "auto top-up: charge not accepted by Stripe; tried again when its hold ends");
            Ok(Charged::Unknown)
        }
    }
}

/// Call off a pack waiting for its retry (`why`): first whatever a charge of it sent and
/// not answered made is read back from Stripe (a payment made is granted, never dropped);
/// only a pack Stripe has no payment for is ended. Whether it was.
pub async fn call_off(b: &Billing, row: &AutoTopupRow, why: &str) -> BillingResult<bool> {
    let api = b.api()?;
    let org =
        b.db.get_org(&row.org_id)
            .await?
            .ok_or_else(|| BillingError::Unmatched(format!("org {} is gone", row.org_id)))?;
    if let Some(customer) = &org.stripe_customer_id {
        let request = request_of(&row.idempotency_key);
        if let Some(pi) = api.payment_intent_by_request(customer, request).await? {
            let settled = settle_intent(b, &org, row, row.attempts + 1, &pi).await?;
            return Ok(!matches!(settled, Charged::Unknown));
        }
    }
    Ok(b.db
        .cancel_auto_topup(&row.org_id, row.seq, row.attempts, why, b.clock.now())
        .await?)
}

fn tries_of(key: &str) -> u32 {
    key.split_once('~')
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or(1)
}

/// Act on an intent as Stripe has it: paid, declined, or not yet known.
async fn settle_intent(
    b: &Billing,
    org: &Org,
    row: &AutoTopupRow,
    attempt: i64,
    pi: &PaymentIntent,
) -> BillingResult<Charged> {
    match pi.status.as_str() {
        "succeeded" => Ok(Charged::Paid(
            paid(b, org, row.seq, row.hours, &pi.id).await?,
        )),
        "requires_action" => {
            let e = StripeFailure::Refused {
                status: 402,
                message: "the bank asks the customer to authenticate this payment".into(),
                code: Some(AUTHENTICATION_REQUIRED.into()),
                decline_code: None,
                payment_intent: Some(pi.id.clone()),
            };
            declined(b, org, row, attempt, &e).await
        }
        "requires_payment_method" | "canceled" => {
            let err = pi.last_payment_error.clone().unwrap_or_default();
            let e = StripeFailure::Refused {
                status: 402,
                message: err
                    .message
                    .unwrap_or_else(|| format!("the payment is {}", pi.status)),
                code: err.code,
                decline_code: err.decline_code,
                payment_intent: Some(pi.id.clone()),
            };
            declined(b, org, row, attempt, &e).await
        }
        // processing, requires_capture, …: read again when the hold ends.
        _ => {
            b.db.rekey_auto_topup(&org.org_id, row.seq, &row.idempotency_key, Some(&pi.id))
                .await?;
            Ok(Charged::Unknown)
        }
    }
}

/// The pack paid by `payment_intent`: its `purchased` grant, made once (keyed by the
/// payment, so the answer and the webhook make one). The grant's id.
async fn paid(
    b: &Billing,
    org: &Org,
    seq: i64,
    hours: i64,
    payment_intent: &str,
) -> BillingResult<String> {
    let now = b.clock.now();
    let (plan, _) = org.subscribed_plan(&b.plans, now);
    let grant = Grant {
        org_id: org.org_id.clone(),
        grant_id: crate::ids::mint(crate::ids::Kind::Grant),
        kind: GrantKind::Purchased,
        seconds: hours * 3600,
        used_seconds: 0,
        priority: DEFAULT_PRIORITY,
        starts_at: now,
        expires_at: Some(now + plan.topup_expiry_days * 86_400),
        note: Some(format!(
            "Auto top-up {seq} of {hours} h, Stripe payment {payment_intent}"
        )),
        idempotency_key: Some(payment_intent.to_owned()),
        created_at: now,
        voided_at: None,
        used_up_at: None,
    };
    let actor = Actor::stripe(&format!("payment {payment_intent}"));
    let (made, created) =
        b.db.pay_auto_topup(&org.org_id, seq, payment_intent, &grant, &actor)
            .await?
            .ok_or_else(|| {
                BillingError::Unmatched(format!(
                    "payment {payment_intent} names pack {seq} of org {}, which it does not have",
                    org.org_id
                ))
            })?;
    if created {
        crate::metrics::count(&b.metrics.auto_topups, "paid");
        tracing::info!(org_id = %org.org_id, seq, hours, payment_intent, grant_id = %made.grant_id, "auto top-up paid");
    }
    Ok(made.grant_id)
}

/// Record that charge `attempt` of a pack was declined (`e`), once, with its
/// notification; a decline that needs the customer gets a Checkout link for the pack.
async fn declined(
    b: &Billing,
    org: &Org,
    row: &AutoTopupRow,
    attempt: i64,
    e: &StripeFailure,
) -> BillingResult<Charged> {
    let (message, code, decline_code, pi) = match e {
        StripeFailure::Refused {
            message,
            code,
            decline_code,
            payment_intent,
            ..
        } => (
            message.clone(),
            code.clone(),
            decline_code.clone(),
            payment_intent.clone(),
        ),
        other => (other.to_string(), None, None, None),
    };
    let now = b.clock.now();
    let next = after_decline(&[code.as_deref(), decline_code.as_deref()], attempt, now);
    // The link only for a decline not recorded yet (the webhook's repeat of the answer's
    // would open a second Checkout).
    let fresh =
        b.db.auto_topup(&org.org_id, row.seq)
            .await?
            .is_some_and(|r| r.status == "charging" && r.attempts == attempt - 1);
    if !fresh {
        return Ok(Charged::Declined(next));
    }
    let checkout = match next {
        AfterDecline::NeedsCustomer => match super::funding::open_topup(b, org, row.hours).await {
            Ok(t) => Some(t.url),
            Err(err) => {
                tracing::warn!(org_id = %org.org_id, error = %err, "no Checkout link for a pack that needs the customer");
                None
            }
        },
        _ => None,
    };
    let amount: Decimal = row.amount.parse().unwrap_or_default();
    let notice = Declined {
        org_id: &org.org_id,
        seq: row.seq,
        hours: row.hours,
        amount,
        currency: &row.currency,
        attempts: attempt,
        error: &message,
        decline_code: decline_code.as_deref().or(code.as_deref()),
        next,
        checkout_url: checkout.as_deref(),
    };
    let record = DeclineRecord {
        attempt,
        error: message.clone(),
        payment_intent_id: pi,
        next,
        next_key: charge_key(&org.org_id, row.seq, attempt + 1),
        notification: (notice.id(), notice.body(now)),
    };
    let actor = Actor::system(&format!(
        "auto top-up: pack {} declined {attempt} time(s)",
        row.seq
    ));
    if b.db
        .decline_auto_topup(&org.org_id, row.seq, &record, now, &actor)
        .await?
    {
        let result = match next {
            AfterDecline::RetryAt(_) => "declined",
            _ => "given_up",
        };
        crate::metrics::count(&b.metrics.auto_topups, result);
        tracing::warn!(org_id = %org.org_id, seq = row.seq, attempt, error = %message, ?next, "auto top-up declined");
    }
    Ok(Charged::Declined(next))
}

/// A `payment_intent.*` event: an auto top-up's payment succeeded or failed. The pack is
/// named by the intent's metadata, else by the idempotency key the event's request
/// carries; an intent of anything else is ignored.
pub async fn event(
    b: &Billing,
    kind: &str,
    object: &serde_json::Value,
    request_key: Option<&str>,
) -> BillingResult<Outcome> {
    let pi: PaymentIntent = serde_json::from_value(object.clone())
        .map_err(|e| BillingError::Unmatched(format!("payment intent does not parse: {e}")))?;
    if pi.metadata.get("kind").map(String::as_str) != Some(KIND) {
        return Ok(Outcome::Ignored(
            "not an auto top-up of this service".into(),
        ));
    }
    let Some(org_id) = pi.metadata.get("org_id") else {
        return Err(BillingError::Unmatched(format!(
            "auto top-up {} names no org in its metadata",
            pi.id
        )));
    };
    let from_key = request_key.and_then(|k| parse_charge_key(org_id, k));
    let meta = |k: &str| pi.metadata.get(k).and_then(|v| v.parse::<i64>().ok());
    let (Some(seq), Some(attempt)) = (
        meta("auto_topup_seq").or(from_key.map(|k| k.0)),
        meta("attempt").or(from_key.map(|k| k.1)),
    ) else {
        return Err(BillingError::Unmatched(format!(
            "auto top-up {} names no pack (metadata auto_topup_seq, or its idempotency key)",
            pi.id
        )));
    };
    let Some(org) = b.db.get_org(org_id).await? else {
        return Err(BillingError::Unmatched(format!(
            "auto top-up {} names org {org_id}, which does not exist",
            pi.id
        )));
    };
    let Some(row) = b.db.auto_topup(org_id, seq).await? else {
        return Err(BillingError::Unmatched(format!(
            "auto top-up {} names pack {seq} of org {org_id}, which it does not have",
            pi.id
        )));
    };
    match kind {
        "payment_intent.succeeded" => {
            paid(b, &org, seq, row.hours, &pi.id).await?;
        }
        "payment_intent.payment_failed" => {
            settle_intent(b, &org, &row, attempt, &pi).await?;
        }
        _ => return Ok(Outcome::Ignored(format!("{kind} changes no pack"))),
    }
    Ok(Outcome::Applied(Some(org.org_id)))
}
