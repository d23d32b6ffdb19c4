//! Sessions on the pages Stripe hosts: Checkout (a subscription, a top-up), found again
//! by the request that opened it, and the billing portal.

use std::collections::HashMap;

use stripe_client_core::StripeRequest;

use super::client::currency_code;
use super::types::REQUEST;

/// The metadata key naming the plan a subscription's Checkout Session was opened for.
pub const PLAN: &str = "rush_meter_plan";
use super::{CheckoutSession, PortalSession, StripeApi, StripeResult};

impl StripeApi {
    /// The Checkout Session an earlier try of this request opened, if it is still open
    /// (one that expired or was paid is not offered again).
    pub async fn open_checkout_by_request(
        &self,
        customer: &str,
        request: &str,
    ) -> StripeResult<Option<CheckoutSession>> {
        use stripe_checkout::checkout_session::ListCheckoutSession;
        let open = |s: &CheckoutSession| s.status.as_deref().is_none_or(|st| st == "open");
        self.find_made(request, open, |after| {
            let mut req = ListCheckoutSession::new().customer(customer).limit(100);
            if let Some(a) = after {
                req = req.starting_after(a);
            }
            req.build()
        })
        .await
    }

    /// The open Checkout Sessions of `customer` that this service opened for a plan
    /// (their metadata names it, `PLAN`), newest first.
    pub async fn open_plan_checkouts(&self, customer: &str) -> StripeResult<Vec<CheckoutSession>> {
        use stripe_checkout::checkout_session::ListCheckoutSession;
        let req = ListCheckoutSession::new()
            .customer(customer)
            .status(stripe_shared::CheckoutSessionStatus::Open)
            .limit(100);
        let list: crate::billing::subscription::List<super::Readable<CheckoutSession>> =
            self.send(req.build(), None).await?;
        Ok(list
            .data
            .into_iter()
            .filter_map(|s| match s {
                super::Readable::Read(s) => Some(s),
                super::Readable::Unreadable { .. } => None,
            })
            .filter(|s| s.status.as_deref().is_none_or(|st| st == "open"))
            .filter(|s| s.metadata.contains_key(PLAN))
            .collect())
    }

    /// Close an open Checkout Session, so that it can no longer be paid.
    pub async fn expire_checkout(&self, id: &str) -> StripeResult<CheckoutSession> {
        let req = stripe_checkout::checkout_session::ExpireCheckoutSession::new(id);
        self.send(req.build(), None).await
    }

    /// A Checkout Session that subscribes `customer` to `plan` at `price`, open until
    /// `expires_at` (Stripe's default is a day: a link left open that long is one more
    /// way to a second subscription).
    #[allow(clippy::too_many_arguments)]
    pub async fn create_checkout_session(
        &self,
        customer: &str,
        plan: &str,
        price: &str,
        org_id: &str,
        return_url: &str,
        expires_at: i64,
        request: &str,
        idempotency_key: &str,
    ) -> StripeResult<CheckoutSession> {
        use stripe_checkout::checkout_session::{
            CreateCheckoutSession, CreateCheckoutSessionLineItems,
        };
        let mut item = CreateCheckoutSessionLineItems::new();
        item.price = Some(price.to_owned());
        item.quantity = Some(1);
        let sep = if return_url.contains('?') { '&' } else { '?' };
        let req = CreateCheckoutSession::new()
            .mode(stripe_checkout::CheckoutSessionMode::Subscription)
            .customer(customer)
            .client_reference_id(org_id)
            .line_items(vec![item])
            .metadata(HashMap::from([
                ("org_id".to_owned(), org_id.to_owned()),
                (PLAN.to_owned(), plan.to_owned()),
                (REQUEST.to_owned(), request.to_owned()),
            ]))
            .expires_at(expires_at)
            .success_url(format!("{return_url}{sep}checkout=success"))
            .cancel_url(format!("{return_url}{sep}checkout=cancel"));
        self.send(req.build(), Some(idempotency_key)).await
    }

    /// A Checkout Session in payment mode for `hours` agent-hours at `unit_cents` each: a
    /// top-up. Its metadata names the org and the hours, so that the paid session's event
    /// says what to grant.
    #[allow(clippy::too_many_arguments)]
    pub async fn create_topup_session(
        &self,
        customer: &str,
        org_id: &str,
        hours: i64,
        unit_cents: i64,
        currency: &str,
        return_url: &str,
        request: &str,
        idempotency_key: &str,
    ) -> StripeResult<CheckoutSession> {
        use stripe_checkout::checkout_session::{
            CreateCheckoutSession, CreateCheckoutSessionLineItems,
            CreateCheckoutSessionLineItemsPriceData, ProductData,
        };
        let mut price = CreateCheckoutSessionLineItemsPriceData::new(currency_code(currency));
        price.unit_amount = Some(unit_cents);
        price.product_data = Some(ProductData::new("Agent-hours (top-up)"));
        let mut item = CreateCheckoutSessionLineItems::new();
        item.price_data = Some(price);
        item.quantity = Some(hours as u64);
        let sep = if return_url.contains('?') { '&' } else { '?' };
        let req = CreateCheckoutSession::new()
            .mode(stripe_checkout::CheckoutSessionMode::Payment)
            .customer(customer)
            .client_reference_id(org_id)
            .line_items(vec![item])
            .metadata(HashMap::from([
                ("org_id".to_owned(), org_id.to_owned()),
                ("rush_meter_kind".to_owned(), "topup".to_owned()),
                ("hours".to_owned(), hours.to_string()),
                (REQUEST.to_owned(), request.to_owned()),
            ]))
            .success_url(format!("{return_url}{sep}topup=success"))
            .cancel_url(format!("{return_url}{sep}topup=cancel"));
        self.send(req.build(), Some(idempotency_key)).await
    }

    pub async fn create_portal_session(
        &self,
        customer: &str,
        return_url: &str,
    ) -> StripeResult<PortalSession> {
        let req = stripe_billing::billing_portal_session::CreateBillingPortalSession::new()
            .customer(customer)
            .return_url(return_url);
        self.send(req.build(), None).await
    }
}
