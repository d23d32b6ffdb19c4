//! Customers: read one, make one for an org, find the one an earlier try made.

use std::collections::HashMap;

use stripe_client_core::StripeRequest;

use super::types::REQUEST;
use super::{StripeApi, StripeResult};
use crate::billing::subscription::{Customer, List};

impl StripeApi {
    pub async fn customer(&self, id: &str) -> StripeResult<Customer> {
        self.send(
            stripe_core::customer::RetrieveCustomer::new(id).build(),
            None,
        )
        .await
    }

    /// A customer for an org, named by `metadata.org_id`; `metadata.rush_meter_request`
    /// names the request, so that a retry can find it (`customer_by_request`).
    pub async fn create_customer(
        &self,
        org_id: &str,
        name: &str,
        request: &str,
        idempotency_key: &str,
    ) -> StripeResult<Customer> {
        let req = stripe_core::customer::CreateCustomer::new()
            .name(name)
            .metadata(HashMap::from([
                ("org_id".to_owned(), org_id.to_owned()),
                (REQUEST.to_owned(), request.to_owned()),
            ]));
        self.send(req.build(), Some(idempotency_key)).await
    }

    /// The customer an earlier `create_customer` of this request made, if it got that far.
    /// Stripe replays a keyed request for 24 hours; this also covers a crash older than
    /// that, a 5xx, and Stripe fakes that ignore keys. Search where Stripe has it, else a
    /// scan.
    pub async fn customer_by_request(&self, request: &str) -> StripeResult<Option<Customer>> {
        let query = format!("metadata['{REQUEST}']:'{request}'");
        let search = stripe_core::customer::SearchCustomer::new(query).build();
        match self.send::<List<Customer>>(search, None).await {
            Ok(found) => return Ok(found.data.into_iter().next()),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
        self.find_made(
            request,
            |_| true,
            |after| {
                let mut req = stripe_core::customer::ListCustomer::new().limit(100);
                if let Some(a) = after {
                    req = req.starting_after(a);
                }
                req.build()
            },
        )
        .await
    }
}
