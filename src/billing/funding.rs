//! Past the plan, through Stripe (docs/funding.md): top-ups bought in Checkout become
//! `purchased` grants when paid, exactly once; pay-as-you-go is charged once a billing
//! window, as an invoice item on the subscription's invoice.
//!
//! Why invoice items and not Stripe's meter events: the ledger already knows each window's
//! overage exactly (in charge units, never rounded until the one amount), the cap is kept
//! by the gate rather than by Stripe, and one item a window is one write, keyed for
//! idempotency and recorded before it is sent; meter events would need a metered price on
//! every subscription and a second copy of the usage in Stripe to reconcile against.

use rush_meter_core::audit::Actor;
use std::collections::HashMap;

use rush_meter_core::funding::{Grant, GrantKind, DEFAULT_PRIORITY};
use rush_meter_core::org::Org;
use rust_decimal::Decimal;
use serde::Deserialize;

use super::checkout::{begin, ensure_customer, failed, once};
use super::{Billing, BillingError, BillingResult, Outcome};
use crate::store::OverageChargeRow;

/// A top-up opened in Checkout: pay at `url`.
#[derive(Debug)]
pub struct Topup {
    pub url: String,
    pub session_id: String,
    pub hours: i64,
    pub amount: Decimal,
    pub currency: String,
}

/// Open a Checkout Session for `hours` of the org's plan's top-up packs. The packs and the
/// price are checked by the caller against the plan.
pub async fn open_topup(b: &Billing, org: &Org, hours: i64) -> BillingResult<Topup> {
    let api = b.api()?;
    let (plan, _) = org.subscribed_plan(&b.plans, b.clock.now());
    let unit_cents = cents(plan.topup_hour_price);
    let customer = ensure_customer(b, org).await?;
    let begun = begin(b, &org.org_id, "topup", &hours.to_string()).await?;
    let session = once(
        b,
        &org.org_id,
        &begun,
        api.open_checkout_by_request(&customer, &begun.request),
        api.create_topup_session(
            &customer,
            &org.org_id,
            hours,
            unit_cents,
            &plan.currency,
            &b.config.return_url,
            &begun.request,
            &begun.key,
        ),
        |s| s.id.as_str(),
    )
    .await?;
    Ok(Topup {
        url: session.url.unwrap_or_default(),
        session_id: session.id,
        hours,
        amount: plan.topup_hour_price * Decimal::from(hours),
        currency: plan.currency.clone(),
    })
}

/// Whole cents of an amount with at most 2 places.
pub(super) fn cents(amount: Decimal) -> i64 {
    i64::try_from((amount * Decimal::from(100)).round()).unwrap_or(i64::MAX)
}

/// A Checkout Session as its events carry it: only what a top-up needs.
#[derive(Debug, Deserialize)]
struct PaidSession {
    id: String,
    mode: Option<String>,
    payment_status: Option<String>,
    #[serde(default)]
    metadata: HashMap<String, String>,
}

/// A paid top-up's session (`checkout.session.completed`, or
/// `checkout.session.async_payment_succeeded` for payments that clear later): the
/// `purchased` grant, keyed by the session, so a session grants once however often its
/// events arrive. The event is signed by Stripe and a completed session never changes, so
/// it is taken as it is.
pub async fn topup_paid(b: &Billing, object: &serde_json::Value) -> BillingResult<Outcome> {
    let s = PaidSession::deserialize(object)
        .map_err(|e| BillingError::Unmatched(format!("checkout session does not parse: {e}")))?;
    if s.mode.as_deref() != Some("payment")
        || s.metadata.get("rush_meter_kind").map(String::as_str) != Some("topup")
    {
        return Ok(Outcome::Ignored("not a top-up of this service".into()));
    }
    if s.payment_status.as_deref() != Some("paid") {
        return Ok(Outcome::Ignored(format!(
            "top-up {} not paid yet ({}); its async_payment_succeeded grants it",
            s.id,
            s.payment_status.as_deref().unwrap_or("no status")
        )));
    }
    let (Some(org_id), Some(hours)) = (
        s.metadata.get("org_id"),
        s.metadata.get("hours").and_then(|h| h.parse::<i64>().ok()),
    ) else {
        return Err(BillingError::Unmatched(format!(
            "top-up {} names no org or hours in its metadata",
            s.id
        )));
    };
    let Some(org) = b.db.get_org(org_id).await? else {
        return Err(BillingError::Unmatched(format!(
            "top-up {} names no org here ({org_id})",
            s.id
        )));
    };
    let (plan, _) = org.subscribed_plan(&b.plans, b.clock.now());
    let now = b.clock.now();
    let grant = Grant {
        org_id: org.org_id.clone(),
        grant_id: crate::ids::mint(crate::ids::Kind::Grant),
        kind: GrantKind::Purchased,
        seconds: hours * 3600,
        used_seconds: 0,
        priority: DEFAULT_PRIORITY,
        starts_at: now,
        expires_at: Some(now + plan.topup_expiry_days * 86_400),
        note: Some(format!("Top-up of {hours} h, Stripe Checkout {}", s.id)),
        idempotency_key: Some(s.id.clone()),
        created_at: now,
        voided_at: None,
        used_up_at: None,
    };
    let actor = Actor::stripe(&format!("checkout {}", s.id));
    match b.db.create_grant(&grant, &actor).await? {
        Some((made, created)) => {
            if created {
                tracing::info!(org_id = %made.org_id, grant_id = %made.grant_id, hours, session = %s.id, "top-up granted");
            }
            Ok(Outcome::Applied(Some(made.org_id)))
        }
        None => Err(BillingError::Unmatched(format!(
            "top-up {} names no org here",
            s.id
        ))),
    }
}

/// Charge every window that ended by `before` and owes pay-as-you-go: close its funding
/// and record the charge, then send each charge recorded and not yet sent. With `invoice`
/// (a draft of `org_id`'s subscription), that org's charges go on it. Returns how many
/// were sent.
///
/// A charge Stripe refuses (a customer deleted, say), or cannot be reached for, holds up no
/// other: the rest are sent, and it is tried again after a backoff (`core::retry`); after
/// its tries it is `failed`, audited, until an admin puts it back. The error is returned
/// after them, except to an invoice's event, which fails only for its own org's charges
/// (which it tries whatever their backoff: the invoice is open for them now).
pub async fn charge_due(
    b: &Billing,
    before: i64,
    invoice: Option<(&str, &str)>,
) -> BillingResult<usize> {
    for (org_id, window) in b.db.due_overage_windows(before, 100).await? {
        if let Some(org) = b.db.get_org(&org_id).await? {
            let (plan, _) = org.subscribed_plan(&b.plans, b.clock.now());
            b.db.close_overage_window(&org_id, window.start, &plan.currency, b.clock.now())
                .await?;
        }
    }
    let mut sent = 0;
    let mut refused = None;
    let now = b.clock.now();
    let invoiced_org = invoice.map(|(org, _)| org);
    for row in b.db.pending_overage_charges(now, invoiced_org, 100).await? {
        let on = invoice
            .filter(|(org, _)| *org == row.org_id)
            .map(|(_, i)| i);
        match send_charge(b, &row, on).await {
            Ok(()) => sent += 1,
            Err(e) => {
                retry_later(b, &row, &e).await?;
                if on.is_some() {
                    return Err(e);
                }
                refused.get_or_insert(e);
            }
        }
    }
    match refused {
        Some(e) if invoice.is_none() => Err(e),
        _ => Ok(sent),
    }
}

/// Record a failed try of `row`: due again after the backoff, or, after its tries, failed
/// (audited, counted, logged at error level).
async fn retry_later(b: &Billing, row: &OverageChargeRow, e: &BillingError) -> BillingResult<()> {
    use rush_meter_core::retry::{backoff, MAX_ATTEMPTS};
    let tries = row.attempts + 1;
    let now = b.clock.now();
    let give_up = tries >= MAX_ATTEMPTS;
    let actor = Actor::system("pay-as-you-go charges");
    b.db.retry_overage_charge(
        &row.org_id,
        row.window_start,
        &e.to_string(),
        now + backoff(tries),
        give_up,
        now,
        &actor,
    )
    .await?;
    if give_up {
        b.metrics.overage_charges_failed.inc();
        tracing::error!(org_id = %row.org_id, window_start = row.window_start, error = %e, tries,
            "pay-as-you-go charge given up after its tries: POST /v1/orgs/{{org_id}}/overage/charges/retry once its cause is fixed");
    } else {
        tracing::warn!(org_id = %row.org_id, window_start = row.window_start, error = %e, tries,
            next_in_secs = backoff(tries), "pay-as-you-go charge not sent; tried again after a backoff");
    }
    Ok(())
}

/// Send one recorded charge: an invoice item keyed by the org and window (recorded before
/// it is sent, so a retry after a crash reuses the key), or nothing to send for an org
/// that does not pay through Stripe or owes nothing.
async fn send_charge(
    b: &Billing,
    row: &OverageChargeRow,
    invoice: Option<&str>,
) -> BillingResult<()> {
    let now = b.clock.now();
    let amount: Decimal = row.amount.parse().map_err(|_| {
        BillingError::Unmatched(format!("charge amount `{}` is not a decimal", row.amount))
    })?;
    let org = b.db.get_org(&row.org_id).await?;
    let customer = org.as_ref().and_then(|o| o.stripe_customer_id.clone());
    let (Some(org), Some(customer), Some(api)) = (org, customer, b.api.as_ref()) else {
        return Ok(b
            .db
            .finish_overage_charge(&row.org_id, row.window_start, "none", None, None, now)
            .await?);
    };
    if amount <= Decimal::ZERO {
        return Ok(b
            .db
            .finish_overage_charge(&row.org_id, row.window_start, "none", None, None, now)
            .await?);
    }
    let begun = begin(
        b,
        &org.org_id,
        "overage_item",
        &row.window_start.to_string(),
    )
    .await?;
    let description = format!(
        "Pay-as-you-go: {} agent-hours, {} to {}",
        rush_meter_core::time::hours(row.overage_seconds),
        rush_meter_core::time::format_rfc3339(row.window_start),
        rush_meter_core::time::format_rfc3339(row.window_end),
    );
    let metadata = HashMap::from([
        ("org_id".to_owned(), org.org_id.clone()),
        ("rush_meter_kind".to_owned(), "overage".to_owned()),
        ("window_start".to_owned(), row.window_start.to_string()),
        ("window_end".to_owned(), row.window_end.to_string()),
    ]);
    let made = async {
        if begun.earlier {
            // An earlier try may have made the item (a crash, or a 5xx that got through).
            if let Some(item) = api
                .invoice_item_by_request(&customer, &begun.request)
                .await?
            {
                return Ok(item);
            }
        }
        api.create_overage_item(
            &customer,
            org.stripe_subscription_id.as_deref(),
            invoice,
            cents(amount),
            &row.currency,
            &description,
            metadata,
            &begun.request,
            &begun.key,
        )
        .await
    };
    let item = match made.await {
        Ok(item) => item,
        Err(e) => return Err(failed(b, &org.org_id, &begun.key, e).await),
    };
    b.db.finish_overage_charge(
        &org.org_id,
        row.window_start,
        "charged",
        item.invoice.as_deref(),
        Some(&item.id),
        now,
    )
    .await?;
    b.db.complete_stripe_request(&org.org_id, &begun.key, &item.id, now)
        .await?;
    tracing::info!(org_id = %org.org_id, amount = %row.amount, item = %item.id, "pay-as-you-go charged");
    Ok(())
}
