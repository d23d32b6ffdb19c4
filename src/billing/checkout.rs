//! Upgrades and downgrades started by the console: a Checkout Session for an org without
//! a subscription, an item change for one with it (an upgrade at once, prorated; a
//! downgrade when the period ends). Every write is recorded with its idempotency key
//! before it is sent, so a retry after a crash reuses the key and Stripe makes no second
//! object.

use rush_meter_core::audit::Actor;
use rush_meter_core::org::Org;
use rush_meter_core::plans::Plan;

use super::api::{StripeApi, StripeFailure};
use super::{Billing, BillingError, BillingResult};
use crate::store::StripeRequestRow;

/// What a plan change came to.
#[derive(Debug)]
pub enum Change {
    /// Pay in Stripe Checkout, at `url`.
    Checkout { url: String, session_id: String },
    /// Changed now (an upgrade); the org as it stands.
    Changed(Box<Org>),
    /// Made in Stripe when the period ends, at `at`.
    Scheduled { plan: String, at: i64 },
}

/// Record an outbound write before it is sent, and its idempotency key: the key of an
/// unfinished request for the same operation and target (a retry after a crash, which
/// Stripe then replays), else a new one.
pub(super) async fn begin(
    b: &Billing,
    org_id: &str,
    operation: &str,
    target: &str,
) -> BillingResult<String> {
    if let Some(open) = b.db.open_stripe_request(org_id, operation, target).await? {
        return Ok(open.idempotency_key);
    }
    let row = StripeRequestRow {
        org_id: org_id.to_owned(),
        operation: operation.to_owned(),
        idempotency_key: format!("rm-{operation}-{org_id}-{:016x}", rand::random::<u64>()),
        target: target.to_owned(),
        created_at: b.clock.now(),
        completed_at: None,
        object_id: None,
    };
    Ok(b.db.begin_stripe_request(&row).await?.idempotency_key)
}

/// Close a recorded request with Stripe's answer.
pub(super) async fn settle<T>(
    b: &Billing,
    org_id: &str,
    key: &str,
    result: Result<T, StripeFailure>,
    id: impl Fn(&T) -> &str,
) -> BillingResult<T> {
    match result {
        Ok(v) => {
            b.db.complete_stripe_request(org_id, key, id(&v), b.clock.now())
                .await?;
            Ok(v)
        }
        Err(e) => Err(failed(b, org_id, key, e).await),
    }
}

/// A refusal closes the request, so the next attempt is a new request with a new key; one
/// left unanswered stays open, for a retry with the same key.
pub(super) async fn failed(b: &Billing, org_id: &str, key: &str, e: StripeFailure) -> BillingError {
    if matches!(
        e,
        StripeFailure::Refused { .. } | StripeFailure::NotFound(_)
    ) {
        if let Err(s) =
            b.db.complete_stripe_request(org_id, key, "refused", b.clock.now())
                .await
        {
            return s.into();
        }
    }
    e.into()
}

/// The org's Stripe customer, created (once) if it has none.
pub async fn ensure_customer(b: &Billing, org: &Org) -> BillingResult<String> {
    if let Some(c) = &org.stripe_customer_id {
        return Ok(c.clone());
    }
    let api = b.api()?;
    let earlier =
        b.db.open_stripe_request(&org.org_id, "create_customer", &org.org_id)
            .await?;
    let key = begin(b, &org.org_id, "create_customer", &org.org_id).await?;
    // An earlier attempt may have made the customer and died before recording it.
    let found = match earlier {
        Some(_) => api.customer_by_request(&key).await?,
        None => None,
    };
    let customer = match found {
        Some(c) => c,
        // Recorded as done only once linked: a crash before that finds it again.
        None => match api.create_customer(&org.org_id, &org.name, &key).await {
            Ok(c) => c,
            Err(e) => return Err(failed(b, &org.org_id, &key, e).await),
        },
    };
    crate::failpoint::hit("after_stripe_create_customer");
    if !b
        .db
        .link_stripe_customer(&org.org_id, &customer.id, b.clock.now())
        .await?
    {
        return Err(BillingError::Conflict(format!(
            "org {} was linked to another Stripe customer meanwhile",
            org.org_id
        )));
    }
    b.db.complete_stripe_request(&org.org_id, &key, &customer.id, b.clock.now())
        .await?;
    Ok(customer.id)
}

/// Move an org to `target`.
pub async fn change_plan(
    b: &Billing,
    org: &Org,
    target: &Plan,
    actor: &Actor,
) -> BillingResult<Change> {
    let api = b.api()?;
    let subscribed = org.stripe_subscription_id.as_deref().filter(|_| {
        !matches!(
            org.subscription_status.as_deref(),
            None | Some("canceled" | "incomplete_expired")
        )
    });
    let Some(sub_id) = subscribed else {
        let price = target
            .stripe_prices
            .first()
            .ok_or_else(|| BillingError::NoPrice(target.id.clone()))?;
        let customer = ensure_customer(b, org).await?;
        let key = begin(b, &org.org_id, "checkout", &target.id).await?;
        let sent = api
            .create_checkout_session(&customer, price, &org.org_id, &b.config.return_url, &key)
            .await;
        let session = settle(b, &org.org_id, &key, sent, |s| s.id.as_str()).await?;
        return Ok(Change::Checkout {
            url: session.url.unwrap_or_default(),
            session_id: session.id,
        });
    };
    if org.plan_id == target.id {
        // Staying on the plan: a pending downgrade or cancellation is called off.
        if org.cancel_at_period_end {
            let key = begin(b, &org.org_id, "resume", sub_id).await?;
            let read_at = b.clock.now();
            let sent = api.resume(sub_id, &key).await;
            let sub = settle(b, &org.org_id, &key, sent, |s| s.id.as_str()).await?;
            b.apply(&sub, Some(&org.org_id), read_at, "checkout")
                .await?;
        } else if org.scheduled_plan_id.is_none() {
            return Err(BillingError::SamePlan(target.id.clone()));
        }
        b.db.schedule_plan(&org.org_id, None, b.clock.now(), actor)
            .await?;
        let now =
            b.db.get_org(&org.org_id)
                .await?
                .unwrap_or_else(|| org.clone());
        return Ok(Change::Changed(Box::new(now)));
    }
    let current_price = b
        .plans
        .get(&org.plan_id)
        .map(|p| p.price)
        .unwrap_or_default();
    if target.stripe_prices.is_empty() {
        // Down to a plan Stripe does not sell (Free): the subscription ends with its period.
        let key = begin(b, &org.org_id, "cancel", sub_id).await?;
        let read_at = b.clock.now();
        let sent = api.cancel_at_period_end(sub_id, &key).await;
        let sub = settle(b, &org.org_id, &key, sent, |s| s.id.as_str()).await?;
        b.apply(&sub, Some(&org.org_id), read_at, "checkout")
            .await?;
        let at = sub.period().map_or_else(|| b.clock.now(), |p| p.end);
        return Ok(Change::Scheduled {
            plan: target.id.clone(),
            at,
        });
    }
    if target.price < current_price {
        let at = org.period_end.unwrap_or_else(|| b.clock.now());
        b.db.schedule_plan(&org.org_id, Some((&target.id, at)), b.clock.now(), actor)
            .await?;
        return Ok(Change::Scheduled {
            plan: target.id.clone(),
            at,
        });
    }
    let org = move_item(b, api, org, sub_id, target, true, actor).await?;
    Ok(Change::Changed(Box::new(org)))
}

/// Change the subscription's item to `target`'s price and apply Stripe's answer.
async fn move_item(
    b: &Billing,
    api: &StripeApi,
    org: &Org,
    sub_id: &str,
    target: &Plan,
    prorate: bool,
    actor: &Actor,
) -> BillingResult<Org> {
    let price = target
        .stripe_prices
        .first()
        .ok_or_else(|| BillingError::NoPrice(target.id.clone()))?;
    let sub = api.subscription(sub_id).await?;
    let item = sub.items.data.first().ok_or(BillingError::NoItem)?;
    // Subscriptions on legacy plans (older accounts, and the local fake) change plans.
    let legacy = item.price.is_none();
    // Keyed by what is sent: an upgrade and a downgrade to one plan are different requests.
    let target_key = format!(
        "{sub_id}:{}:{}",
        target.id,
        if prorate { "prorate" } else { "at_period_end" }
    );
    let key = begin(b, &org.org_id, "change_plan", &target_key).await?;
    let read_at = b.clock.now();
    let sent = api
        .change_item(sub_id, &item.id, price, legacy, prorate, &key)
        .await;
    let changed = settle(b, &org.org_id, &key, sent, |s| s.id.as_str()).await?;
    let applied = b
        .apply(&changed, Some(&org.org_id), read_at, "checkout")
        .await?;
    if org.scheduled_plan_id.is_some() {
        b.db.schedule_plan(&org.org_id, None, b.clock.now(), actor)
            .await?;
    }
    match applied.org {
        Some(o) => Ok(o),
        None => Ok(b
            .db
            .get_org(&org.org_id)
            .await?
            .unwrap_or_else(|| org.clone())),
    }
}

/// Make the downgrades whose period has ended; returns how many were made.
pub async fn apply_due_downgrades(b: &Billing) -> BillingResult<usize> {
    let api = b.api()?;
    let actor = Actor::system("scheduled downgrade");
    let mut done = 0;
    for org in b.db.due_downgrades(b.clock.now(), 100).await? {
        let (Some(target), Some(sub_id)) = (
            org.scheduled_plan_id
                .as_deref()
                .and_then(|p| b.plans.get(p)),
            org.stripe_subscription_id.as_deref(),
        ) else {
            b.db.schedule_plan(&org.org_id, None, b.clock.now(), &actor)
                .await?;
            continue;
        };
        match move_item(b, api, &org, sub_id, target, false, &actor).await {
            Ok(_) => done += 1,
            Err(e) => {
                tracing::warn!(org_id = %org.org_id, error = %e, "scheduled downgrade failed; will retry")
            }
        }
    }
    Ok(done)
}

/// A link to Stripe's customer portal for the org's billing details.
pub async fn portal(b: &Billing, org: &Org) -> BillingResult<String> {
    let customer = ensure_customer(b, org).await?;
    Ok(b.api()?
        .create_portal_session(&customer, &b.config.return_url)
        .await?
        .url)
}
