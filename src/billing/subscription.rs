//! Stripe subscriptions as this service reads them: lenient structs that require only the
//! fields used (typed responses of the generated crates fail on objects of other API
//! versions and on the local Stripe fake), and the plan an item maps to. What a status
//! grants is the core's (`rush_meter_core::org::access`).

use std::collections::HashMap;

use serde::Deserialize;

use rush_meter_core::plans::{Plan, Plans};
use rush_meter_core::time::{Interval, Secs};

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

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::shipped_plans as plans;

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
