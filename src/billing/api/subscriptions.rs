//! Subscriptions: read them, and change, resume or cancel one.

use stripe_client_core::StripeRequest;

use super::{Readable, StripeApi, StripeResult};
use crate::billing::subscription::{List, Subscription};

impl StripeApi {
    pub async fn subscription(&self, id: &str) -> StripeResult<Subscription> {
        self.send(
            stripe_billing::subscription::RetrieveSubscription::new(id).build(),
            None,
        )
        .await
    }

    /// One page of every subscription, whatever its status (Stripe lists newest first).
    pub async fn subscriptions(
        &self,
        starting_after: Option<&str>,
    ) -> StripeResult<List<Readable<Subscription>>> {
        use stripe_billing::subscription::{ListSubscription, ListSubscriptionStatus};
        let mut req = ListSubscription::new()
            .limit(100)
            .status(ListSubscriptionStatus::All);
        if let Some(after) = starting_after {
            req = req.starting_after(after);
        }
        self.send(req.build(), None).await
    }

    /// Move a subscription's item to another price (or legacy plan). An upgrade is
    /// prorated and invoiced at once; `prorate = false` changes it without proration (a
    /// downgrade applied at the period's end).
    pub async fn change_item(
        &self,
        subscription: &str,
        item_id: &str,
        price: &str,
        legacy_plan: bool,
        prorate: bool,
        idempotency_key: &str,
    ) -> StripeResult<Subscription> {
        use stripe_billing::subscription::{
            UpdateSubscription, UpdateSubscriptionItems, UpdateSubscriptionProrationBehavior,
        };
        let mut item = UpdateSubscriptionItems::new();
        item.id = Some(item_id.to_owned());
        if legacy_plan {
            item.plan = Some(price.to_owned());
        } else {
            item.price = Some(price.to_owned());
        }
        // A plan chosen again calls off a pending cancellation.
        let mut req = UpdateSubscription::new(subscription)
            .items(vec![item])
            .cancel_at_period_end(false);
        // The local fake knows no proration_behavior; Stripe's default prorates.
        if !legacy_plan {
            req = req.proration_behavior(if prorate {
                UpdateSubscriptionProrationBehavior::AlwaysInvoice
            } else {
                UpdateSubscriptionProrationBehavior::None
            });
        }
        self.send(req.build(), Some(idempotency_key)).await
    }

    /// Call off a cancellation at period end.
    pub async fn resume(
        &self,
        subscription: &str,
        idempotency_key: &str,
    ) -> StripeResult<Subscription> {
        let req = stripe_billing::subscription::UpdateSubscription::new(subscription)
            .cancel_at_period_end(false);
        self.send(req.build(), Some(idempotency_key)).await
    }

    /// Cancel a subscription now (one left `incomplete`, never paid), with no final invoice
    /// and no proration.
    pub async fn cancel_now(
        &self,
        subscription: &str,
        idempotency_key: &str,
    ) -> StripeResult<Subscription> {
        let req = stripe_billing::subscription::CancelSubscription::new(subscription)
            .invoice_now(false)
            .prorate(false);
        self.send(req.build(), Some(idempotency_key)).await
    }

    /// Cancel a subscription when its period ends (a downgrade to Free).
    pub async fn cancel_at_period_end(
        &self,
        subscription: &str,
        idempotency_key: &str,
    ) -> StripeResult<Subscription> {
        let req = stripe_billing::subscription::UpdateSubscription::new(subscription)
            .cancel_at_period_end(true);
        self.send(req.build(), Some(idempotency_key)).await
    }
}
