//! The audit log: who changed what of an org, its state before and after, and when. The
//! store writes each entry in the transaction of its change (docs/audit.md); nothing
//! rewrites or deletes one. Here: who acts, what the actions are, and the state each
//! records (a fixed shape per subject, so before and after compare field by field).

use serde_json::{json, Value};

use crate::funding::{Grant, Overage};
use crate::members::Limit;
use crate::org::{Key, Org};
use crate::time::{format_rfc3339, Secs};

named! {
    /// Who made a change.
    pub enum ActorKind {
        /// An API token (its id and label).
        Token = "token",
        /// Stripe: a webhook event or a reconciliation read from it.
        Stripe = "stripe",
        /// The service itself or its operator's command line (`rush-meter …`).
        System = "system",
    }
}

/// Who made a change: a token (id and label), Stripe (what told us), or the system
/// (which job or command).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Actor {
    pub kind: ActorKind,
    pub id: Option<String>,
    pub label: String,
}

impl Actor {
    pub fn token(token_id: &str, label: &str) -> Actor {
        Actor {
            kind: ActorKind::Token,
            id: Some(token_id.to_owned()),
            label: label.to_owned(),
        }
    }

    /// `source`: what told us, such as `webhook evt_123` or `reconcile`.
    pub fn stripe(source: &str) -> Actor {
        Actor {
            kind: ActorKind::Stripe,
            id: None,
            label: source.to_owned(),
        }
    }

    /// `what`: the job or command, such as `rush-meter token create`.
    pub fn system(what: &str) -> Actor {
        Actor {
            kind: ActorKind::System,
            id: None,
            label: what.to_owned(),
        }
    }
}

named! {
    /// What was changed.
    pub enum Action {
        OrgCreated = "org.created",
        /// Its name, plan or suspension, as an admin set them.
        OrgUpdated = "org.updated",
        /// Its plan and subscription, as Stripe says they are.
        SubscriptionSynced = "subscription.synced",
        /// A downgrade asked for (or one called off), made in Stripe when it is due.
        DowngradeScheduled = "downgrade.scheduled",
        KeyCreated = "key.created",
        /// Its concurrency limit.
        KeyUpdated = "key.updated",
        LimitSet = "limit.set",
        LimitRemoved = "limit.removed",
        GrantCreated = "grant.created",
        GrantVoided = "grant.voided",
        OverageUpdated = "overage.updated",
        TokenCreated = "token.created",
        TokenRevoked = "token.revoked",
        /// A pay-as-you-go charge given up after its tries, or put back by an admin.
        OverageChargeFailed = "overage_charge.failed",
        OverageChargeRequeued = "overage_charge.requeued",
        PeriodClosed = "period.closed",
        /// A move of the org to another version of its plan, scheduled or called off.
        PlanVersionMoved = "plan_version.moved",
        /// Auto top-up turned on, off or changed: by a token, or off by the service after
        /// its charges were declined.
        AutoTopupUpdated = "auto_topup.updated",
    }
}

/// One change. `org_id` is empty for changes of the service rather than of an org
/// (a token for no org, a closed period).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub org_id: String,
    /// Sorts in the order entries were made (see the store's `audit_id`).
    pub entry_id: String,
    pub at: Secs,
    pub actor: Actor,
    pub action: Action,
    /// What it changed: an org, `key:<id>`, `limit:<kind>:<id>`, `grant:<id>`,
    /// `overage`, `token:<id>`, `period:<start>`.
    pub subject: String,
    pub before: Option<Value>,
    pub after: Option<Value>,
}

impl Entry {
    /// The entry of a change from `before` to `after`, or `None` when nothing changed (an
    /// update that sets what was there is not a change).
    #[allow(clippy::too_many_arguments)]
    pub fn of_change(
        org_id: &str,
        entry_id: String,
        at: Secs,
        actor: &Actor,
        action: Action,
        subject: String,
        before: Option<Value>,
        after: Option<Value>,
    ) -> Option<Entry> {
        (before != after).then(|| Entry {
            org_id: org_id.to_owned(),
            entry_id,
            at,
            actor: actor.clone(),
            action,
            subject,
            before,
            after,
        })
    }
}

/// What an admin sets of an org.
pub fn org_state(o: &Org) -> Value {
    json!({ "name": o.name, "plan_id": o.plan_id, "plan_version": o.plan_version,
        "suspended": o.suspended })
}

/// What Stripe decides of an org: its plan and subscription.
pub fn subscription_state(o: &Org) -> Value {
    json!({
        "plan_id": o.plan_id,
        "plan_version": o.plan_version,
        "subscription_status": o.subscription_status,
        "stripe_subscription_id": o.stripe_subscription_id,
        "stripe_customer_id": o.stripe_customer_id,
        "period_start": o.period_start,
        "period_end": o.period_end,
        "cancel_at_period_end": o.cancel_at_period_end,
        "past_due_since": o.past_due_since,
    })
}

pub fn downgrade_state(o: &Org) -> Value {
    json!({ "scheduled_plan_id": o.scheduled_plan_id, "scheduled_at": o.scheduled_at,
        "made_in_stripe": o.scheduled_in_stripe })
}

/// The version an org is on and the move it has scheduled.
pub fn version_state(o: &Org) -> Value {
    json!({ "plan_id": o.plan_id, "plan_version": o.plan_version,
        "moving_to_version": o.moving_to_version,
        "moving_at": o.moving_at.map(format_rfc3339) })
}

pub fn key_state(k: &Key) -> Value {
    json!({ "key_id": k.key_id, "concurrency_limit": k.concurrency_limit })
}

pub fn limit_state(l: &Limit) -> Value {
    json!({
        "kind": l.kind.as_str(),
        "member_id": l.member_id,
        "monthly_hours": l.monthly_hours.map(|h| h.to_string()),
        "weekly_hours": l.weekly_hours.map(|h| h.to_string()),
    })
}

/// A grant's terms and whether it is voided (its use is the ledger's, not a change).
pub fn grant_state(g: &Grant) -> Value {
    json!({
        "grant_id": g.grant_id,
        "kind": g.kind.as_str(),
        "seconds": g.seconds,
        "priority": g.priority,
        "starts_at": g.starts_at,
        "expires_at": g.expires_at,
        "note": g.note,
        "voided_at": g.voided_at,
    })
}

pub fn overage_state(o: &Overage) -> Value {
    json!({ "enabled": o.enabled, "monthly_cap": format!("{:.2}", o.monthly_cap) })
}

pub fn auto_topup_state(a: &crate::auto_topup::AutoTopup) -> Value {
    json!({
        "enabled": a.enabled,
        "below_hours": crate::time::hours(a.below_seconds),
        "pack_hours": a.pack_hours,
        "monthly_max_packs": a.monthly_max_packs,
    })
}

/// A token as made: never its secret or the secret's hash.
pub fn token_state(
    token_id: &str,
    scopes: &str,
    org_id: Option<&str>,
    label: &str,
    expires_at: Option<Secs>,
    revoked_at: Option<Secs>,
) -> Value {
    let mut state =
        json!({ "token_id": token_id, "scopes": scopes, "org_id": org_id, "label": label });
    // Only when set, so that a token made without them reads as before.
    if let Some(at) = expires_at {
        state["expires_at"] = json!(format_rfc3339(at));
    }
    if let Some(at) = revoked_at {
        state["revoked_at"] = json!(format_rfc3339(at));
    }
    state
}

/// A pay-as-you-go charge's standing, as the audit log records it.
pub fn charge_state(state: &str, attempts: i64, last_error: Option<&str>) -> Value {
    json!({ "state": state, "attempts": attempts, "last_error": last_error })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setting_what_was_there_is_no_change() {
        let o = Org::new("acme", "pro", 0);
        let actor = Actor::token("tok_1", "ops");
        let same = Entry::of_change(
            "acme",
            "a".into(),
            5,
            &actor,
            Action::OrgUpdated,
            "acme".into(),
            Some(org_state(&o)),
            Some(org_state(&o)),
        );
        assert_eq!(same, None);
        let mut suspended = o.clone();
        suspended.suspended = true;
        let e = Entry::of_change(
            "acme",
            "a".into(),
            5,
            &actor,
            Action::OrgUpdated,
            "acme".into(),
            Some(org_state(&o)),
            Some(org_state(&suspended)),
        )
        .expect("a change");
        assert_eq!(e.after.unwrap()["suspended"], json!(true));
        assert_eq!(e.before.unwrap()["suspended"], json!(false));
    }
}
