//! Reconciliation: read every subscription from Stripe, apply each to its org as a webhook
//! would, and report what that changed. A webhook lost for good is repaired by the next
//! run (`rush-meter stripe reconcile`, and every `RUSH_METER_STRIPE_RECONCILE_SECS` in
//! `serve`).

use std::collections::HashSet;

use rush_meter_core::org::Org;

use super::api::Readable;
use super::subscription::{Expandable, List, Subscription};
use super::{Billing, BillingResult};

/// What a run saw and did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    pub subscriptions: usize,
    /// `(org_id, what changed)` for each org that was out of step.
    pub changed: Vec<(String, String)>,
    /// Subscriptions that could not be applied, and why.
    pub failed: Vec<(String, String)>,
    /// Subscriptions Stripe listed that could not be read, and why: skipped, the run goes on.
    pub unreadable: Vec<(String, String)>,
    /// Orgs whose downgrade, recorded by an older release to make at the period's end,
    /// was made in Stripe now.
    pub downgrades_made: Vec<String>,
}

/// Reconcile every subscription; `progress` is told after each one.
pub async fn reconcile(b: &Billing, mut progress: impl FnMut(&str)) -> BillingResult<Report> {
    let mut report = Report::default();
    let seen = apply_listed(b, &mut report, &mut progress).await?;
    let orgs = b.db.list_orgs().await?;
    make_legacy_downgrades(b, &orgs, &mut report).await;
    apply_unlisted(b, orgs, &seen, &mut report, &mut progress).await?;
    Ok(report)
}

/// Walk Stripe's list of subscriptions and apply each that drifted; the ids seen.
async fn apply_listed(
    b: &Billing,
    report: &mut Report,
    progress: &mut impl FnMut(&str),
) -> BillingResult<HashSet<String>> {
    let api = b.api()?;
    let mut seen = HashSet::new();
    let mut after: Option<String> = None;
    loop {
        let page = api.subscriptions(after.as_deref()).await?;
        // A cursor Stripe no longer knows may restart the list (the local fake does):
        // stop at the first subscription seen twice.
        let fresh: Vec<_> = page
            .data
            .into_iter()
            .filter(|s| seen.insert(s.id(|s| &s.id).to_owned()))
            .collect();
        let Some(last) = fresh.last() else {
            break;
        };
        after = Some(last.id(|s| &s.id).to_owned());
        for element in fresh {
            report.subscriptions += 1;
            let sub = match element {
                Readable::Read(sub) => sub,
                Readable::Unreadable { id, error } => {
                    tracing::warn!(subscription = %id, %error, "reconcile skipped a subscription it cannot read");
                    progress(&id);
                    report.unreadable.push((id, error));
                    continue;
                }
            };
            match repair(b, &sub).await {
                Ok(Some((org, change))) => {
                    tracing::info!(org_id = %org, subscription = %sub.id, %change, "reconcile repaired drift");
                    report.changed.push((org, change));
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(subscription = %sub.id, error = %e, "reconcile could not apply a subscription");
                    report.failed.push((sub.id.clone(), e.to_string()));
                }
            }
            progress(&sub.id);
        }
        if !page.has_more {
            break;
        }
    }
    Ok(seen)
}

/// Make in Stripe the downgrades an older release recorded to make at a period's end.
async fn make_legacy_downgrades(b: &Billing, orgs: &[Org], report: &mut Report) {
    for org in orgs
        .iter()
        .filter(|o| o.scheduled_plan_id.is_some() && !o.scheduled_in_stripe)
    {
        match super::checkout::make_legacy_downgrade(b, org).await {
            Ok(true) => report.downgrades_made.push(org.org_id.clone()),
            Ok(false) => {}
            Err(e) => report
                .failed
                .push((org.org_id.clone(), format!("downgrade: {e}"))),
        }
    }
}

/// Orgs whose subscription the list did not show: read it alone; gone for good means it
/// ended (the fake deletes cancelled subscriptions; a deletion webhook may be lost).
async fn apply_unlisted(
    b: &Billing,
    orgs: Vec<Org>,
    seen: &HashSet<String>,
    report: &mut Report,
    progress: &mut impl FnMut(&str),
) -> BillingResult<()> {
    let api = b.api()?;
    for org in orgs {
        let Some(id) = org
            .stripe_subscription_id
            .clone()
            .filter(|id| !seen.contains(id))
        else {
            continue;
        };
        if matches!(
            org.subscription_status.as_deref(),
            Some("canceled" | "incomplete_expired")
        ) {
            continue;
        }
        let read = match b.ticket(&org.org_id).await {
            Ok(r) => r,
            Err(e) => {
                report.failed.push((id, e.to_string()));
                continue;
            }
        };
        let sub = match api.subscription(&id).await {
            Ok(s) => s,
            Err(e) if e.is_not_found() => {
                ended(&id, org.stripe_customer_id.as_deref().unwrap_or_default())
            }
            Err(e) => {
                report.failed.push((id, e.to_string()));
                continue;
            }
        };
        report.subscriptions += 1;
        match b.apply(&sub, Some(&org.org_id), read, "reconcile").await {
            Ok(applied) => {
                if let Some(change) = applied.change {
                    report.changed.push((org.org_id.clone(), change));
                }
            }
            Err(e) => report.failed.push((id, e.to_string())),
        }
        progress(&sub.id);
    }
    Ok(())
}

/// Apply `listed` (a subscription of the list) to its org if it would change it: read
/// again under a ticket first, since the list was read before it and a webhook applied
/// meanwhile may be newer. `(org, what changed)` when it did.
async fn repair(b: &Billing, listed: &Subscription) -> BillingResult<Option<(String, String)>> {
    listed
        .recognized(&b.plans)
        .map_err(super::BillingError::Unrecognized)?;
    let org = b.org_for(listed, None).await?;
    let now = super::sync::Read {
        at: b.clock.now(),
        ticket: None,
    };
    let drifted = super::sync::state_for(&org, listed, &b.plans, now)
        .is_some_and(|s| super::sync::changes(&org, &s));
    if !drifted {
        return Ok(None);
    }
    let read = b.ticket(&org.org_id).await?;
    let sub = b.api()?.subscription(&listed.id).await?;
    let applied = b.apply(&sub, Some(&org.org_id), read, "reconcile").await?;
    Ok(applied.change.map(|c| (org.org_id, c)))
}

/// A subscription Stripe no longer has, as ended.
fn ended(id: &str, customer: &str) -> Subscription {
    Subscription {
        id: id.to_owned(),
        status: "canceled".to_owned(),
        customer: Expandable::Id(customer.to_owned()),
        items: List::default(),
        current_period_start: None,
        current_period_end: None,
        cancel_at_period_end: false,
        metadata: Default::default(),
        status_details: None,
        default_payment_method: None,
    }
}
