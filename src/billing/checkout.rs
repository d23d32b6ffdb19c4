//! Upgrades and downgrades started by the console: a Checkout Session for an org without
//! a subscription, an item change for one with it: an upgrade at once, prorated; a
//! downgrade made in Stripe at once without proration, so that the renewal invoice is at
//! the new price, while the org keeps the plan it paid for until the period ends
//! (`Org::scheduled_in_stripe`). Every write is recorded with its idempotency key before
//! it is sent, so a retry after a crash reuses the key and Stripe makes no second object.

use rush_meter_core::audit::Actor;
use rush_meter_core::org::Org;
use rush_meter_core::plans::{Plan, Plans};

use super::api::{StripeApi, StripeFailure};
use super::subscription::Subscription;
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

/// A write to Stripe about to be sent: its idempotency key, the name of the request
/// (`rush_meter_request` in the metadata of what it creates: the same on every try, where
/// the key changes after a 5xx), and whether an earlier try is unaccounted for (a crash
/// before its answer was recorded, or a 5xx), so that what Stripe did is read back first.
pub(super) struct Begun {
    pub key: String,
    pub request: String,
    pub earlier: bool,
}

/// The name of a request whose idempotency key is `key`: the key of its first try.
fn request_of(key: &str) -> &str {
    key.split_once('~').map_or(key, |(first, _)| first)
}

/// The key of the try after one answered 5xx: Stripe may replay a stored 5xx for the old
/// key for a day, so the next try needs a new one (`~2`, `~3`, …).
fn next_key(key: &str) -> String {
    let tries = key
        .split_once('~')
        .and_then(|(_, n)| n.parse::<u32>().ok())
        .unwrap_or(1);
    format!("{}~{}", request_of(key), tries + 1)
}

/// Record an outbound write before it is sent, and its idempotency key: the key of an
/// unfinished request for the same operation and target (a retry after a crash, which
/// Stripe then replays, or after a 5xx, which was given a new key), else a new one.
pub(super) async fn begin(
    b: &Billing,
    org_id: &str,
    operation: &str,
    target: &str,
) -> BillingResult<Begun> {
    if let Some(open) = b.db.open_stripe_request(org_id, operation, target).await? {
        return Ok(Begun {
            request: request_of(&open.idempotency_key).to_owned(),
            key: open.idempotency_key,
            earlier: true,
        });
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
    let key = b.db.begin_stripe_request(&row).await?.idempotency_key;
    Ok(Begun {
        request: request_of(&key).to_owned(),
        // Another caller's request for the same thing, begun meanwhile: its fate is unknown.
        earlier: key != row.idempotency_key,
        key,
    })
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
/// left unanswered stays open, for a retry with the same key; one answered 5xx stays open
/// under a new key, and its next try reads back what Stripe did before sending.
pub(super) async fn failed(b: &Billing, org_id: &str, key: &str, e: StripeFailure) -> BillingError {
    let recorded = match &e {
        StripeFailure::Refused { .. } | StripeFailure::NotFound(_) => {
            b.db.complete_stripe_request(org_id, key, "refused", b.clock.now())
                .await
        }
        StripeFailure::ServerError { .. } => {
            b.db.rekey_stripe_request(org_id, key, &next_key(key)).await
        }
        StripeFailure::Unreachable(_) | StripeFailure::Unreadable(_) => Ok(()),
    };
    match recorded {
        Ok(()) => e.into(),
        Err(s) => s.into(),
    }
}

/// Send a write unless an earlier try of it already made it: `read_back` looks for what
/// that try made (only when one is unaccounted for), `send` makes it. Either way the
/// request is closed with the object's id.
pub(super) async fn once<T, R, S>(
    b: &Billing,
    org_id: &str,
    begun: &Begun,
    read_back: R,
    send: S,
    id: impl Fn(&T) -> &str,
) -> BillingResult<T>
where
    R: std::future::Future<Output = Result<Option<T>, StripeFailure>>,
    S: std::future::Future<Output = Result<T, StripeFailure>>,
{
    if begun.earlier {
        if let Some(found) = read_back.await? {
            b.db.complete_stripe_request(org_id, &begun.key, id(&found), b.clock.now())
                .await?;
            return Ok(found);
        }
    }
    settle(b, org_id, &begun.key, send.await, id).await
}

/// The org's Stripe customer, created (once) if it has none.
pub async fn ensure_customer(b: &Billing, org: &Org) -> BillingResult<String> {
    if let Some(c) = &org.stripe_customer_id {
        return Ok(c.clone());
    }
    let api = b.api()?;
    let begun = begin(b, &org.org_id, "create_customer", &org.org_id).await?;
    // An earlier try may have made the customer and died before recording it.
    let found = match begun.earlier {
        true => api.customer_by_request(&begun.request).await?,
        false => None,
    };
    let customer = match found {
        Some(c) => c,
        // Recorded as done only once linked: a crash before that finds it again.
        None => {
            let made = api
                .create_customer(&org.org_id, &org.name, &begun.request, &begun.key)
                .await;
            match made {
                Ok(c) => c,
                Err(e) => return Err(failed(b, &org.org_id, &begun.key, e).await),
            }
        }
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
    b.db.complete_stripe_request(&org.org_id, &begun.key, &customer.id, b.clock.now())
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
    let org = &end_incomplete(b, api, org).await?;
    let org = &in_force(org, &b.plans, b.clock.now());
    let subscribed = org.stripe_subscription_id.as_deref().filter(|_| {
        !matches!(
            org.subscription_status.as_deref(),
            None | Some("canceled" | "incomplete_expired")
        )
    });
    let Some(sub_id) = subscribed else {
        return checkout(b, api, org, target).await;
    };
    if org.plan_id == target.id {
        // Staying on the plan: a pending downgrade or cancellation is called off. A
        // downgrade made in Stripe is undone there (without proration: the period is paid).
        if org.scheduled_in_stripe {
            move_item(b, api, org, sub_id, target, false, actor).await?;
        }
        if org.cancel_at_period_end {
            let begun = begin(b, &org.org_id, "resume", sub_id).await?;
            let sub = once(
                b,
                &org.org_id,
                &begun,
                already(api, sub_id, |s| !s.cancel_at_period_end),
                api.resume(sub_id, &begun.key),
                |s| s.id.as_str(),
            )
            .await?;
            apply_after(b, api, &org.org_id, sub).await?;
        } else if org.scheduled_plan_id.is_none() {
            return Err(BillingError::SamePlan(target.id.clone()));
        }
        b.db.schedule_plan(&org.org_id, None, false, b.clock.now(), actor)
            .await?;
        let now =
            b.db.get_org(&org.org_id)
                .await?
                .unwrap_or_else(|| org.clone());
        return Ok(Change::Changed(Box::new(now)));
    }
    let now = b.clock.now();
    let current_price = b
        .plans
        .version(&org.plan_id, org.plan_version_at(now))
        .map(|p| p.price)
        .unwrap_or_default();
    if target.stripe_prices.is_empty() {
        // Down to a plan Stripe does not sell (Free): the subscription ends with its period.
        let begun = begin(b, &org.org_id, "cancel", sub_id).await?;
        let sub = once(
            b,
            &org.org_id,
            &begun,
            already(api, sub_id, |s| s.cancel_at_period_end),
            api.cancel_at_period_end(sub_id, &begun.key),
            |s| s.id.as_str(),
        )
        .await?;
        let sub = apply_after(b, api, &org.org_id, sub).await?.0;
        let at = sub
            .period(&b.plans)
            .map_or_else(|| b.clock.now(), |p| p.end);
        return Ok(Change::Scheduled {
            plan: target.id.clone(),
            at,
        });
    }
    if target.price < current_price {
        return downgrade(b, api, org, sub_id, target, actor).await;
    }
    // Up from a downgrade made in Stripe: back to the plan paid for first, without
    // proration, so that the upgrade is prorated from what was paid.
    if org.scheduled_in_stripe {
        if let Some(paid) = b.plans.version(&org.plan_id, org.plan_version_at(now)) {
            move_item(b, api, org, sub_id, paid, false, actor).await?;
        }
    }
    let org = move_item(b, api, org, sub_id, target, true, actor).await?;
    Ok(Change::Changed(Box::new(org)))
}

/// Down to a cheaper plan Stripe sells: made in Stripe now, without proration, so that the
/// renewal invoice is at its price; the org keeps its plan until the period ends. The
/// schedule is recorded first, so that Stripe's webhook of the change, which may come
/// before the answer, finds the org held; if Stripe refuses, it is taken back.
async fn downgrade(
    b: &Billing,
    api: &StripeApi,
    org: &Org,
    sub_id: &str,
    target: &Plan,
    actor: &Actor,
) -> BillingResult<Change> {
    let at = org.period_end.unwrap_or_else(|| b.clock.now());
    b.db.schedule_plan(
        &org.org_id,
        Some((&target.id, at)),
        true,
        b.clock.now(),
        actor,
    )
    .await?;
    if let Err(e) = move_item(b, api, org, sub_id, target, false, actor).await {
        // Back to what was there only when Stripe surely made no change (it refused):
        // after a 5xx or no answer it may have, and its webhook must find the org held.
        let refused = matches!(
            e,
            BillingError::Stripe(StripeFailure::Refused { .. } | StripeFailure::NotFound(_))
                | BillingError::NoPrice(_)
                | BillingError::NoItem
        );
        if refused {
            let before = org.scheduled_plan_id.as_deref().zip(org.scheduled_at);
            b.db.schedule_plan(
                &org.org_id,
                before,
                org.scheduled_in_stripe,
                b.clock.now(),
                actor,
            )
            .await?;
        }
        return Err(e);
    }
    Ok(Change::Scheduled {
        plan: target.id.clone(),
        at,
    })
}

/// The org as its plan in force at `now` says: a downgrade made in Stripe whose time has
/// come is the plan (before Stripe's renewal, when it reaches the service, records it), so
/// that a change from it starts from what the period was invoiced at.
fn in_force(org: &Org, plans: &Plans, now: i64) -> Org {
    let mut o = org.clone();
    if o.scheduled_in_stripe && o.plan_id_at(now) != o.plan_id {
        o.plan_id = o.plan_id_at(now).to_owned();
        // On the newest version of it, as its price was chosen (`Org::plan_access`).
        o.plan_version = plans.get(&o.plan_id).map_or(1, |p| p.version);
        o.moving_to_version = None;
        o.moving_at = None;
        o.scheduled_plan_id = None;
        o.scheduled_at = None;
        o.scheduled_in_stripe = false;
    }
    o
}

/// Apply the subscription as Stripe has it after a write of ours (`answer`, Stripe's reply
/// to it): read again under a ticket taken now, since a ticket taken before the write
/// would rank below reads of others made before the write took effect. A subscription
/// Stripe no longer has (an ended one, on the local fake) is its answer.
async fn apply_after(
    b: &Billing,
    api: &StripeApi,
    org_id: &str,
    answer: Subscription,
) -> BillingResult<(Subscription, super::Applied)> {
    let read = b.ticket(org_id).await?;
    let sub = match api.subscription(&answer.id).await {
        Ok(s) => s,
        Err(e) if e.is_not_found() => answer,
        Err(e) => return Err(e.into()),
    };
    let applied = b.apply(&sub, Some(org_id), read, "checkout").await?;
    Ok((sub, applied))
}

/// How long a Checkout Session for a plan stays open (Stripe's least is 30 minutes).
const CHECKOUT_OPEN_SECS: i64 = 3600;

/// A Checkout Session for `target`: at most one open per org, so that two tabs (or two
/// clicks) cannot make two subscriptions. An open one for the same plan is given again;
/// one for another plan is closed first. A session Stripe will not close (paid a moment
/// ago) stops a new one: its subscription is on its way.
async fn checkout(b: &Billing, api: &StripeApi, org: &Org, target: &Plan) -> BillingResult<Change> {
    use super::api::PLAN;
    let price = target
        .stripe_prices
        .first()
        .ok_or_else(|| BillingError::NoPrice(target.id.clone()))?;
    let customer = ensure_customer(b, org).await?;
    for open in api.open_plan_checkouts(&customer).await? {
        if open.metadata.get(PLAN) == Some(&target.id) {
            return Ok(Change::Checkout {
                url: open.url.unwrap_or_default(),
                session_id: open.id,
            });
        }
        if let Err(e) = api.expire_checkout(&open.id).await {
            if !matches!(e, StripeFailure::Refused { .. }) {
                return Err(e.into());
            }
            tracing::warn!(org_id = %org.org_id, session = %open.id, error = %e, "an open checkout could not be closed");
            return Err(BillingError::Conflict(format!(
                "a checkout of the {} plan opened before could not be closed (it may have been \
                 paid a moment ago, and its subscription is on its way): look at the org again \
                 shortly",
                open.metadata.get(PLAN).map_or("other", String::as_str)
            )));
        }
    }
    let begun = begin(b, &org.org_id, "checkout", &target.id).await?;
    let session = once(
        b,
        &org.org_id,
        &begun,
        api.open_checkout_by_request(&customer, &begun.request),
        api.create_checkout_session(
            &customer,
            &target.id,
            price,
            &org.org_id,
            &b.config.return_url,
            b.clock.now() + CHECKOUT_OPEN_SECS,
            &begun.request,
            &begun.key,
        ),
        |s| s.id.as_str(),
    )
    .await?;
    Ok(Change::Checkout {
        url: session.url.unwrap_or_default(),
        session_id: session.id,
    })
}

/// A subscription left `incomplete` (its first payment never made) blocks nothing: it is
/// cancelled in Stripe before a new checkout, unless Stripe says it became live meanwhile
/// (then it is applied, and the change goes on from it). The org as it then stands.
async fn end_incomplete(b: &Billing, api: &StripeApi, org: &Org) -> BillingResult<Org> {
    let (Some(sub_id), Some("incomplete")) = (
        org.stripe_subscription_id.as_deref(),
        org.subscription_status.as_deref(),
    ) else {
        return Ok(org.clone());
    };
    let begun = begin(b, &org.org_id, "cancel_incomplete", sub_id).await?;
    let current = api.subscription(sub_id).await?;
    let sub = if current.status == "incomplete" {
        once(
            b,
            &org.org_id,
            &begun,
            std::future::ready(Ok(None)),
            api.cancel_now(sub_id, &begun.key),
            |s| s.id.as_str(),
        )
        .await?
    } else {
        b.db.complete_stripe_request(&org.org_id, &begun.key, sub_id, b.clock.now())
            .await?;
        current
    };
    let applied = apply_after(b, api, &org.org_id, sub).await?.1;
    Ok(match applied.org {
        Some(o) => o,
        None => {
            b.db.get_org(&org.org_id)
                .await?
                .unwrap_or_else(|| org.clone())
        }
    })
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
    let begun = begin(b, &org.org_id, "change_plan", &target_key).await?;
    // Read just now: an earlier try that got through left the item on the price.
    let moved = item.names().any(|n| n == price).then(|| sub.clone());
    let changed = once(
        b,
        &org.org_id,
        &begun,
        std::future::ready(Ok(moved)),
        api.change_item(sub_id, &item.id, price, legacy, prorate, &begun.key),
        |s| s.id.as_str(),
    )
    .await?;
    let applied = apply_after(b, api, &org.org_id, changed).await?.1;
    // An upgrade replaces a downgrade asked for before it.
    if prorate && org.scheduled_plan_id.is_some() {
        b.db.schedule_plan(&org.org_id, None, false, b.clock.now(), actor)
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

/// The subscription as Stripe has it now, if `done` says an earlier try already made the
/// change (a read-back after a 5xx or a crash).
async fn already(
    api: &StripeApi,
    id: &str,
    done: impl Fn(&Subscription) -> bool,
) -> Result<Option<Subscription>, StripeFailure> {
    Ok(Some(api.subscription(id).await?).filter(|s| done(s)))
}

/// Make in Stripe a downgrade an older release recorded to make only when its period
/// ended (`Org::scheduled_in_stripe` false): from now on it is held as any other. Run by
/// reconcile; returns whether it was made.
pub async fn make_legacy_downgrade(b: &Billing, org: &Org) -> BillingResult<bool> {
    let api = b.api()?;
    let (Some(sub_id), Some(target)) = (
        org.stripe_subscription_id.as_deref(),
        org.scheduled_plan_id
            .as_deref()
            .and_then(|p| b.plans.get(p)),
    ) else {
        return Ok(false);
    };
    if org.scheduled_in_stripe || target.stripe_prices.is_empty() {
        return Ok(false);
    }
    let actor = Actor::system("reconcile: a downgrade recorded by an older release");
    downgrade(b, api, org, sub_id, target, &actor).await?;
    Ok(true)
}

/// A link to Stripe's customer portal for the org's billing details.
pub async fn portal(b: &Billing, org: &Org) -> BillingResult<String> {
    let customer = ensure_customer(b, org).await?;
    Ok(b.api()?
        .create_portal_session(&customer, &b.config.return_url)
        .await?
        .url)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::shipped_plans as plans;

    /// From its time on, a downgrade made in Stripe is the plan a change starts from (an
    /// upgrade back is prorated from it); before, the plan paid for is.
    #[test]
    fn a_change_starts_from_the_plan_in_force() {
        let mut org = Org::new("o", "team", 0);
        org.scheduled_plan_id = Some("pro".into());
        org.scheduled_at = Some(100);
        org.scheduled_in_stripe = true;
        assert_eq!(in_force(&org, &plans(), 99), org);
        let after = in_force(&org, &plans(), 100);
        assert_eq!(after.plan_id, "pro");
        assert_eq!(
            (after.scheduled_plan_id, after.scheduled_in_stripe),
            (None, false)
        );
        // Only recorded (an older release's): nothing in force yet.
        org.scheduled_in_stripe = false;
        assert_eq!(in_force(&org, &plans(), 100).plan_id, "team");
    }
}
