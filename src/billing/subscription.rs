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
    /// Why a `paused` subscription is paused (API versions of 2026).
    #[serde(default)]
    pub status_details: Option<serde_json::Value>,
    /// The card Checkout saved for the subscription (an id, or the object), where the
    /// customer has no default of its own.
    #[serde(default)]
    pub default_payment_method: Option<serde_json::Value>,
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
    /// Where its invoices are paid from: `default_payment_method` (an id, or the object).
    pub invoice_settings: Option<serde_json::Value>,
    /// The older way to save a card (an id, or the object).
    pub default_source: Option<serde_json::Value>,
}

impl Customer {
    /// The payment method an off-session charge uses: the invoices' default, else the
    /// default source; `None` when the customer has saved none.
    pub fn payment_method(&self) -> Option<String> {
        self.invoice_settings
            .as_ref()
            .and_then(|s| s.get("default_payment_method"))
            .and_then(object_id)
            .or_else(|| self.default_source.as_ref().and_then(object_id))
    }
}

/// The id of an expandable field: the string, or the object's `id`.
pub fn object_id(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("id")?.as_str().map(str::to_owned),
        _ => None,
    }
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
    pub fn names(&self) -> impl Iterator<Item = &str> {
        let price = self
            .price
            .iter()
            .flat_map(|p| std::iter::once(p.id.as_str()).chain(p.lookup_key.as_deref()));
        price.chain(self.plan.iter().map(|p| p.id.as_str()))
    }
}

/// The statuses Stripe gives a subscription; what each grants is the core's.
pub const KNOWN_STATUSES: [&str; 8] = [
    "active",
    "trialing",
    "past_due",
    "incomplete",
    "incomplete_expired",
    "unpaid",
    "canceled",
    "paused",
];

impl Subscription {
    /// Whether the service knows what this subscription grants: one that has not ended
    /// needs a status it knows and an item whose price maps to a plan. Otherwise the
    /// error says what is unknown, so that an event carrying it is retried and then
    /// quarantined while its org keeps its plan, rather than guessed at.
    pub fn recognized(&self, plans: &Plans) -> Result<(), String> {
        if self.is_over() {
            return Ok(());
        }
        if !KNOWN_STATUSES.contains(&self.acting_status()) {
            return Err(format!(
                "subscription {} has the status `{}`, which this service does not know",
                self.id, self.status
            ));
        }
        if self.plan(plans).is_none() {
            let names: Vec<&str> = self.items.data.iter().flat_map(Item::names).collect();
            return Err(format!(
                "no item of subscription {} maps to a plan (its prices: {}); add the price to \
                 a plan's stripe_prices in plans/*.toml",
                self.id,
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    names.join(", ")
                }
            ));
        }
        Ok(())
    }

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

    /// The item whose price sets the plan (the first item when none maps to a plan).
    fn mapped_item(&self, plans: &Plans) -> Option<&Item> {
        let plan = self.plan(plans);
        self.items
            .data
            .iter()
            .find(|i| {
                i.names()
                    .filter_map(|n| plans.by_stripe_price(n))
                    .any(|p| Some(p) == plan)
            })
            .or(self.items.data.first())
    }

    /// The current billing period, wherever this API version puts it: on the subscription
    /// before 2025-03-31, on each item after it, where flexible billing lets items have
    /// different periods: the period is the one of the item that sets the plan.
    pub fn period(&self, plans: &Plans) -> Option<Interval> {
        let item = self.mapped_item(plans);
        let start = self
            .current_period_start
            .or(item.and_then(|i| i.current_period_start))?;
        let end = self
            .current_period_end
            .or(item.and_then(|i| i.current_period_end))?;
        Interval::new(start, end)
    }

    /// The status the service acts on: Stripe's, except that a subscription paused on its
    /// first failed payment (an account setting of the 2026 versions) is past due, with
    /// the plan's grace, as it would be under the default setting; paused for any other
    /// reason (a trial that ended without a payment method, a final failure) it grants
    /// Free.
    pub fn acting_status(&self) -> &str {
        let first_failure = self
            .status_details
            .as_ref()
            .and_then(|d| d.pointer("/paused/subscription/type"))
            .and_then(|t| t.as_str())
            == Some("first_payment_failure");
        if self.status == "paused" && first_failure {
            "past_due"
        } else {
            &self.status
        }
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
    fn a_live_subscription_must_map_to_a_plan_with_a_known_status() {
        let p = plans();
        let of = |status: &str, price: &str| {
            sub(
                serde_json::json!({"id": "sub_1", "status": status, "customer": "cus_1",
                "items": {"data": [{"id": "si_1", "price": {"id": price}}]}}),
            )
        };
        assert_eq!(of("active", "pro_monthly").recognized(&p), Ok(()));
        let e = of("active", "price_mystery").recognized(&p).unwrap_err();
        assert!(
            e.contains("price_mystery") && e.contains("stripe_prices"),
            "{e}"
        );
        let e = of("frozen", "pro_monthly").recognized(&p).unwrap_err();
        assert!(e.contains("`frozen`"), "{e}");
        // Ended, whatever it was: it grants Free, nothing to know.
        assert_eq!(of("canceled", "price_mystery").recognized(&p), Ok(()));
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
        assert_eq!(legacy.period(&p), Interval::new(10, 20));
        assert!(legacy.cancel_at_period_end);
        assert_eq!(legacy.org_id(), Some("org_1"));
        // A newer API version: prices with lookup keys, the period on the item, the customer expanded.
        let newer = sub(
            serde_json::json!({"id": "sub_2", "status": "trialing", "customer": {"id": "cus_2", "object": "customer"},
            "items": {"data": [
                {"id": "si_a", "price": {"id": "price_x", "lookup_key": "pro_monthly"}, "current_period_start": 30, "current_period_end": 60},
                {"id": "si_b", "price": {"id": "team_monthly", "lookup_key": null}, "current_period_start": 90, "current_period_end": 120}]}}),
        );
        assert_eq!(newer.customer.id(), "cus_2");
        assert_eq!(newer.plan(&p).map(|p| p.id.as_str()), Some("team"));
        // Flexible billing: the period is the one of the item that sets the plan (team).
        assert_eq!(newer.period(&p), Interval::new(90, 120));
        let unknown = sub(
            serde_json::json!({"id": "sub_3", "status": "active", "customer": "cus_3",
            "items": {"data": [{"id": "si_c", "price": {"id": "price_unknown"}}]}}),
        );
        assert_eq!(unknown.plan(&p), None);
        assert_eq!(unknown.period(&p), None);
    }

    #[test]
    fn a_pause_on_the_first_failed_payment_is_past_due_and_any_other_is_not() {
        let paused = |why: &str| {
            sub(
                serde_json::json!({"id": "sub_1", "status": "paused", "customer": "cus_1",
                "status_details": {"paused": {"type": "subscription", "transitioned_at": 5,
                    "subscription": {"type": why}}}}),
            )
        };
        assert_eq!(paused("first_payment_failure").acting_status(), "past_due");
        assert_eq!(paused("final_payment_failure").acting_status(), "paused");
        assert_eq!(
            paused("trial_end_without_payment_method").acting_status(),
            "paused"
        );
        let older =
            sub(serde_json::json!({"id": "sub_2", "status": "paused", "customer": "cus_1"}));
        assert_eq!(older.acting_status(), "paused");
        let active = sub(
            serde_json::json!({"id": "sub_3", "status": "active", "customer": "cus_1",
            "status_details": null}),
        );
        assert_eq!(active.acting_status(), "active");
    }
}
