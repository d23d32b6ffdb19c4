//! Stripe subscriptions as this service reads them: lenient structs that require only the
//! fields used (typed responses of the generated crates fail on objects of other API
//! versions and on the local Stripe fake), the plan an item maps to, and the access a
//! status grants (DESIGN.md, rules the gate keeps).

use std::collections::HashMap;

use serde::Deserialize;

use crate::ledger::{Interval, Secs};
use crate::plans::{Plan, Plans};

/// An id, or the object it names when Stripe expanded it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Expandable {
    Id(String),
    Object { id: String },
}

impl Expandable {
    pub fn id(&self) -> &str {
        match self {
            Expandable::Id(id) | Expandable::Object { id } => id,
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct List<T> {
    #[serde(default = "Vec::new")]
    pub data: Vec<T>,
    #[serde(default)]
    pub has_more: bool,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Subscription {
    pub id: String,
    pub status: String,
    pub customer: Expandable,
    #[serde(default = "List::default")]
    pub items: List<Item>,
    /// Top level before API version 2025-03-31; on each item after it.
    pub current_period_start: Option<Secs>,
    pub current_period_end: Option<Secs>,
    #[serde(default)]
    pub cancel_at_period_end: bool,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Item {
    pub id: String,
    pub price: Option<Price>,
    /// The legacy plan (older API versions, and the local fake).
    pub plan: Option<LegacyPlan>,
    pub current_period_start: Option<Secs>,
    pub current_period_end: Option<Secs>,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Price {
    pub id: String,
    pub lookup_key: Option<String>,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct LegacyPlan {
    pub id: String,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Customer {
    pub id: String,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
}

impl<T> Default for List<T> {
    fn default() -> Self {
        List {
            data: Vec::new(),
            has_more: false,
        }
    }
}

impl Item {
    /// Every name Stripe gives the item's price: price id, lookup key, legacy plan id.
    fn names(&self) -> impl Iterator<Item = &str> {
        let price = self
            .price
            .iter()
            .flat_map(|p| std::iter::once(p.id.as_str()).chain(p.lookup_key.as_deref()));
        price.chain(self.plan.iter().map(|p| p.id.as_str()))
    }
}

impl Subscription {
    /// The plan the subscription pays for: the dearest plan any item maps to through the
    /// plans' `stripe_prices`. `None` when no item maps to a plan.
    pub fn plan<'p>(&self, plans: &'p Plans) -> Option<&'p Plan> {
        self.items
            .data
            .iter()
            .flat_map(Item::names)
            .filter_map(|name| plans.by_stripe_price(name))
            .max_by(|a, b| a.price.cmp(&b.price).then_with(|| b.id.cmp(&a.id)))
    }

    /// The current billing period, wherever this API version puts it.
    pub fn period(&self) -> Option<Interval> {
        let item = self.items.data.first();
        let start = self
            .current_period_start
            .or(item.and_then(|i| i.current_period_start))?;
        let end = self
            .current_period_end
            .or(item.and_then(|i| i.current_period_end))?;
        Interval::new(start, end)
    }

    /// The org the subscription names in its metadata.
    pub fn org_id(&self) -> Option<&str> {
        self.metadata.get("org_id").map(String::as_str)
    }

    /// Whether the subscription is over for good: its org is back on Free.
    pub fn is_over(&self) -> bool {
        matches!(self.status.as_str(), "canceled" | "incomplete_expired")
    }
}

/// What a subscription status grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The plan paid for.
    Granted,
    /// The plan paid for, while a failed payment is retried, until `until`.
    Grace { until: Secs },
    /// Free, until the subscription is paid (or its status is understood).
    Withheld,
}

impl Access {
    pub fn grants_plan(self) -> bool {
        !matches!(self, Access::Withheld)
    }
}

/// Access for a subscription `status` (`None`: no subscription, the plan was set by an
/// admin): trialing and active grant the plan (also while set to cancel at period end);
/// past_due keeps it for the plan's grace from `past_due_since`; everything else, known
/// or not, falls back to Free.
pub fn access(
    status: Option<&str>,
    past_due_since: Option<Secs>,
    plan: &Plan,
    now: Secs,
) -> Access {
    match status {
        None | Some("active" | "trialing") => Access::Granted,
        Some("past_due") => {
            let until = past_due_since.unwrap_or(now) + plan.past_due_grace_days * 86_400;
            if now < until {
                Access::Grace { until }
            } else {
                Access::Withheld
            }
        }
        // Known or not: an unknown one is logged when it is applied (`sync::state_for`).
        Some(_) => Access::Withheld,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::plans::shipped as plans;

    #[test]
    fn every_status_maps_to_access() {
        let p = plans();
        let pro = p.get("pro").unwrap();
        let now = 1_000_000_000;
        let day = 86_400;
        let table: &[(Option<&str>, Option<Secs>, Access)] = &[
            (None, None, Access::Granted),
            (Some("active"), None, Access::Granted),
            (Some("trialing"), None, Access::Granted),
            (
                Some("past_due"),
                Some(now - day),
                Access::Grace {
                    until: now + 6 * day,
                },
            ),
            (
                Some("past_due"),
                Some(now - 7 * day + 1),
                Access::Grace { until: now + 1 },
            ),
            (Some("past_due"), Some(now - 7 * day), Access::Withheld),
            (
                Some("past_due"),
                None,
                Access::Grace {
                    until: now + 7 * day,
                },
            ),
            (Some("incomplete"), None, Access::Withheld),
            (Some("incomplete_expired"), None, Access::Withheld),
            (Some("unpaid"), None, Access::Withheld),
            (Some("canceled"), None, Access::Withheld),
            (Some("paused"), None, Access::Withheld),
            (Some("something_new"), None, Access::Withheld),
        ];
        for (status, since, want) in table {
            assert_eq!(
                access(*status, *since, pro, now),
                *want,
                "{status:?} {since:?}"
            );
        }
    }

    fn sub(json: serde_json::Value) -> Subscription {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn items_map_to_plans_by_price_lookup_key_or_legacy_plan() {
        let p = plans();
        let legacy = sub(
            serde_json::json!({"id": "sub_1", "status": "active", "customer": "cus_1",
            "cancel_at_period_end": true, "current_period_start": 10, "current_period_end": 20,
            "items": {"object": "list", "data": [{"id": "si_1", "plan": {"id": "pro_monthly"}}]},
            "metadata": {"org_id": "org_1"}, "unknown_field": {"nested": [1, 2]}}),
        );
        assert_eq!(legacy.plan(&p).map(|p| p.id.as_str()), Some("pro"));
        assert_eq!(legacy.period(), Interval::new(10, 20));
        assert!(legacy.cancel_at_period_end);
        assert_eq!(legacy.org_id(), Some("org_1"));
        // A newer API version: prices with lookup keys, the period on the item, the customer expanded.
        let newer = sub(
            serde_json::json!({"id": "sub_2", "status": "trialing", "customer": {"id": "cus_2", "object": "customer"},
            "items": {"data": [
                {"id": "si_a", "price": {"id": "price_x", "lookup_key": "pro_monthly"}, "current_period_start": 30, "current_period_end": 60},
                {"id": "si_b", "price": {"id": "team_monthly", "lookup_key": null}}]}}),
        );
        assert_eq!(newer.customer.id(), "cus_2");
        assert_eq!(newer.plan(&p).map(|p| p.id.as_str()), Some("team"));
        assert_eq!(newer.period(), Interval::new(30, 60));
        let unknown = sub(
            serde_json::json!({"id": "sub_3", "status": "active", "customer": "cus_3",
            "items": {"data": [{"id": "si_c", "price": {"id": "price_unknown"}}]}}),
        );
        assert_eq!(unknown.plan(&p), None);
        assert_eq!(unknown.period(), None);
    }
}
