//! The Stripe gateway. async-stripe builds each request (path, method, form-encoded
//! parameters); reqwest sends it with the secret key and, for writes, an idempotency key;
//! the answer is read into this service's lenient structs (`subscription.rs`), which
//! require only the fields used, so objects of any API version (and of the local Stripe
//! fake of the tests) are read alike.

use std::collections::HashMap;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use stripe_client_core::{RequestBuilder, StripeMethod, StripeRequest};

use super::subscription::{Customer, List, Subscription};

/// Why a Stripe call failed, sorted by what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum StripeFailure {
    /// Stripe could not be reached or did not answer in time, or answered 5xx or 429:
    /// retry later.
    #[error("Stripe unreachable: {0}")]
    Unreachable(String),
    #[error("Stripe has no such object: {0}")]
    NotFound(String),
    /// Stripe refused the request (4xx): retrying the same request will not help.
    #[error("Stripe refused the request ({status}): {message}")]
    Refused { status: u16, message: String },
    #[error("Stripe's answer does not parse: {0}")]
    Unreadable(String),
}

impl StripeFailure {
    pub fn is_not_found(&self) -> bool {
        matches!(self, StripeFailure::NotFound(_))
    }
}

pub type StripeResult<T> = Result<T, StripeFailure>;

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct CheckoutSession {
    pub id: String,
    pub url: Option<String>,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct InvoiceItem {
    pub id: String,
    pub invoice: Option<String>,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct PortalSession {
    pub url: String,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Invoice {
    pub id: String,
    pub status: Option<String>,
    #[serde(default = "List::default")]
    pub lines: List<InvoiceLine>,
}

/// A line of an invoice: what it charges (cents; credits negative) for which service
/// period. A renewal invoice's own `period_start` is the period before; its lines say
/// what they are for.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct InvoiceLine {
    #[serde(default)]
    pub amount: i64,
    pub period: Option<LinePeriod>,
    /// An invoice item's metadata, carried onto its line: pay-as-you-go's names its window.
    #[serde(default)]
    pub metadata: HashMap<String, String>,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
pub struct LinePeriod {
    pub start: i64,
    pub end: i64,
}

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Deserialize)]
struct ErrorDetail {
    message: Option<String>,
}

/// Talks to Stripe (or whatever `base` points at).
#[derive(Clone)]
pub struct StripeApi {
    http: reqwest::Client,
    base: String,
    key: String,
}

impl StripeApi {
    pub fn new(base: &str, key: &str) -> StripeApi {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .build()
            .expect("an HTTP client with only timeouts set builds");
        StripeApi {
            http,
            base: base.trim_end_matches('/').to_owned(),
            key: key.to_owned(),
        }
    }

    /// Send a request built by async-stripe; `idempotency_key` for writes.
    async fn send<T: DeserializeOwned>(
        &self,
        req: RequestBuilder,
        idempotency_key: Option<&str>,
    ) -> StripeResult<T> {
        let method = match req.method {
            StripeMethod::Get => reqwest::Method::GET,
            StripeMethod::Post => reqwest::Method::POST,
            StripeMethod::Delete => reqwest::Method::DELETE,
        };
        let mut url = format!("{}/v1{}", self.base, req.path);
        if let Some(q) = req.query.as_deref().filter(|q| !q.is_empty()) {
            url.push('?');
            url.push_str(q);
        }
        let mut r = self.http.request(method, &url).bearer_auth(&self.key);
        if let Some(k) = idempotency_key {
            r = r.header("Idempotency-Key", k);
        }
        if let Some(body) = req.body {
            r = r
                .header("Content-Type", "application/x-www-form-urlencoded")
                .body(body);
        }
        let resp = r
            .send()
            .await
            .map_err(|e| StripeFailure::Unreachable(e.to_string()))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| StripeFailure::Unreachable(e.to_string()))?;
        if status.is_success() {
            return serde_json::from_str(&text)
                .map_err(|e| StripeFailure::Unreadable(format!("{e} in {}", truncate(&text))));
        }
        let message = serde_json::from_str::<ErrorBody>(&text)
            .ok()
            .and_then(|b| b.error.message)
            .unwrap_or_else(|| truncate(&text));
        Err(match status.as_u16() {
            404 => StripeFailure::NotFound(message),
            429 | 500.. => StripeFailure::Unreachable(format!("{status}: {message}")),
            s => StripeFailure::Refused { status: s, message },
        })
    }

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
    ) -> StripeResult<List<Subscription>> {
        use stripe_billing::subscription::{ListSubscription, ListSubscriptionStatus};
        let mut req = ListSubscription::new()
            .limit(100)
            .status(ListSubscriptionStatus::All);
        if let Some(after) = starting_after {
            req = req.starting_after(after);
        }
        self.send(req.build(), None).await
    }

    pub async fn customer(&self, id: &str) -> StripeResult<Customer> {
        self.send(
            stripe_core::customer::RetrieveCustomer::new(id).build(),
            None,
        )
        .await
    }

    /// A customer for an org, named by `metadata.org_id`; `metadata.rush_meter_request`
    /// carries the idempotency key, so that a retry can find it (`customer_by_request`).
    pub async fn create_customer(
        &self,
        org_id: &str,
        name: &str,
        idempotency_key: &str,
    ) -> StripeResult<Customer> {
        let req = stripe_core::customer::CreateCustomer::new()
            .name(name)
            .metadata(HashMap::from([
                ("org_id".to_owned(), org_id.to_owned()),
                ("rush_meter_request".to_owned(), idempotency_key.to_owned()),
            ]));
        self.send(req.build(), Some(idempotency_key)).await
    }

    /// The customer an earlier `create_customer` with this key made, if it got that far.
    /// Stripe replays a keyed request for 24 hours; this also covers a crash older than
    /// that, and Stripe fakes that ignore keys. Search where Stripe has it, else a scan.
    pub async fn customer_by_request(
        &self,
        idempotency_key: &str,
    ) -> StripeResult<Option<Customer>> {
        let query = format!("metadata['rush_meter_request']:'{idempotency_key}'");
        let search = stripe_core::customer::SearchCustomer::new(query).build();
        match self.send::<List<Customer>>(search, None).await {
            Ok(found) => return Ok(found.data.into_iter().next()),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
        let mut seen = std::collections::HashSet::new();
        let mut after: Option<String> = None;
        loop {
            let mut req = stripe_core::customer::ListCustomer::new().limit(100);
            if let Some(a) = &after {
                req = req.starting_after(a.as_str());
            }
            let page: List<Customer> = self.send(req.build(), None).await?;
            let fresh: Vec<Customer> = page
                .data
                .into_iter()
                .filter(|c| seen.insert(c.id.clone()))
                .collect();
            let mine = |c: &&Customer| {
                c.metadata.get("rush_meter_request").map(String::as_str) == Some(idempotency_key)
            };
            if let Some(c) = fresh.iter().find(mine) {
                return Ok(Some(c.clone()));
            }
            match fresh.last() {
                Some(last) if page.has_more => after = Some(last.id.clone()),
                _ => return Ok(None),
            }
        }
    }

    /// A Checkout Session that subscribes `customer` to `price`.
    pub async fn create_checkout_session(
        &self,
        customer: &str,
        price: &str,
        org_id: &str,
        return_url: &str,
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
            .metadata(HashMap::from([("org_id".to_owned(), org_id.to_owned())]))
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
            ]))
            .success_url(format!("{return_url}{sep}topup=success"))
            .cancel_url(format!("{return_url}{sep}topup=cancel"));
        self.send(req.build(), Some(idempotency_key)).await
    }

    /// An invoice item for pay-as-you-go: on `invoice` (a draft) when given, else pending
    /// on the customer for its subscription's next invoice. The metadata names the org and
    /// the window it charges, so that the invoice report finds it.
    #[allow(clippy::too_many_arguments)]
    pub async fn create_overage_item(
        &self,
        customer: &str,
        subscription: Option<&str>,
        invoice: Option<&str>,
        cents: i64,
        currency: &str,
        description: &str,
        metadata: HashMap<String, String>,
        idempotency_key: &str,
    ) -> StripeResult<InvoiceItem> {
        let mut req = stripe_billing::invoice_item::CreateInvoiceItem::new()
            .customer(customer)
            .amount(cents)
            .currency(currency_code(currency))
            .description(description)
            .metadata(metadata);
        if let Some(s) = subscription {
            req = req.subscription(s);
        }
        if let Some(i) = invoice {
            req = req.invoice(i);
        }
        self.send(req.build(), Some(idempotency_key)).await
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

    /// One page of a customer's invoices, newest first.
    pub async fn invoices(
        &self,
        customer: &str,
        starting_after: Option<&str>,
    ) -> StripeResult<List<Invoice>> {
        let mut req = stripe_billing::invoice::ListInvoice::new()
            .customer(customer)
            .limit(100);
        if let Some(after) = starting_after {
            req = req.starting_after(after);
        }
        self.send(req.build(), None).await
    }
}

/// An ISO currency code as async-stripe takes it (every string is one: unknown codes are
/// kept as they are).
fn currency_code(code: &str) -> stripe_types::Currency {
    match code.parse() {
        Ok(c) => c,
        Err(never) => match never {},
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(300).collect()
}
