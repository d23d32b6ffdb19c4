//! Payment intents: the off-session charge of an auto top-up, read back by id or by the
//! request that made it.
//!
//! Built by hand, not with async-stripe's builders: its `payment_intent` module is 51,000
//! generated lines (every payment method's options), minutes of every clean build for the
//! one request and two reads used here. The form is the documented one of
//! `POST /v1/payment_intents`.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use stripe_client_core::{RequestBuilder, StripeMethod};

use super::types::{Made, REQUEST};
use super::{StripeApi, StripeFailure, StripeResult};

/// A payment intent, as far as an auto top-up reads it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct PaymentIntent {
    pub id: String,
    /// `succeeded`, `processing`, `requires_action` (the customer must authenticate),
    /// `requires_payment_method` (declined), …
    pub status: String,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
    pub last_payment_error: Option<PaymentIntentError>,
}

/// Why an intent's last charge failed.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct PaymentIntentError {
    pub code: Option<String>,
    pub decline_code: Option<String>,
    pub message: Option<String>,
}

impl Made for PaymentIntent {
    fn id(&self) -> &str {
        &self.id
    }
    fn metadata(&self) -> &HashMap<String, String> {
        &self.metadata
    }
}

#[derive(Serialize)]
struct OffSession<'a> {
    amount: i64,
    currency: &'a str,
    customer: &'a str,
    payment_method: &'a str,
    /// Cards only: with Stripe's automatic payment methods a confirmed intent would need a
    /// return URL for methods that redirect, which an off-session charge cannot follow.
    payment_method_types: [&'a str; 1],
    confirm: bool,
    off_session: bool,
    metadata: &'a HashMap<String, String>,
}

#[derive(Serialize)]
struct Page<'a> {
    limit: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    customer: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    starting_after: Option<&'a str>,
}

impl StripeApi {
    /// Charge `cents` to `customer`'s `payment_method` now, off-session (the customer is
    /// not there to authenticate). A decline is `Refused` with status 402 and Stripe's
    /// codes; a bank that wants the customer answers 402 `authentication_required` (or, on
    /// the local fake, an intent in `requires_action`).
    #[allow(clippy::too_many_arguments)]
    pub async fn charge_off_session(
        &self,
        customer: &str,
        payment_method: &str,
        cents: i64,
        currency: &str,
        mut metadata: HashMap<String, String>,
        request: &str,
        idempotency_key: &str,
    ) -> StripeResult<PaymentIntent> {
        metadata.insert(REQUEST.to_owned(), request.to_owned());
        let form = OffSession {
            amount: cents,
            currency,
            customer,
            payment_method,
            payment_method_types: ["card"],
            confirm: true,
            off_session: true,
            metadata: &metadata,
        };
        let req = RequestBuilder::new(StripeMethod::Post, "/payment_intents").form(&form);
        self.send(req, Some(idempotency_key)).await
    }

    pub async fn payment_intent(&self, id: &str) -> StripeResult<PaymentIntent> {
        let req = RequestBuilder::new(StripeMethod::Get, format!("/payment_intents/{id}"));
        self.send(req, None).await
    }

    /// The intent an earlier try of this request made, if it got that far: among the
    /// customer's intents, or every intent where the list cannot be filtered (the local
    /// fake).
    pub async fn payment_intent_by_request(
        &self,
        customer: &str,
        request: &str,
    ) -> StripeResult<Option<PaymentIntent>> {
        match self.intents_made_by(request, Some(customer)).await {
            Err(StripeFailure::Refused { status: 400, .. }) => {
                self.intents_made_by(request, None).await
            }
            found => found,
        }
    }

    async fn intents_made_by(
        &self,
        request: &str,
        customer: Option<&str>,
    ) -> StripeResult<Option<PaymentIntent>> {
        self.find_made(
            request,
            |_| true,
            |after| {
                RequestBuilder::new(StripeMethod::Get, "/payment_intents").query(&Page {
                    limit: 100,
                    customer,
                    starting_after: after,
                })
            },
        )
        .await
    }
}
