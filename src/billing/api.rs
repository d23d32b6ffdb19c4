//! The Stripe gateway. async-stripe builds each request (path, method, form-encoded
//! parameters); reqwest sends it with the secret key and, for writes, an idempotency key;
//! the answer is read into this service's lenient structs (`subscription.rs`), which
//! require only the fields used, so objects of any API version (and of the local Stripe
//! fake of the tests) are read alike.
//!
//! Every request names the API version the builders are generated for (`STRIPE_VERSION`),
//! so a change of the account's default version in the dashboard changes nothing here.
//! What is retried, and how (docs/billing.md, "Retries"):
//! - inside the call, with the same idempotency key: 429, 409 `lock_timeout`, and any
//!   answer that carries `Stripe-Should-Retry: true`, up to `TRIES` tries with jittered
//!   backoff; Stripe stores no result for these, so the retry is the first real try;
//! - by the caller, with the same key: no answer at all (a timeout, a reset): Stripe
//!   replays the result if the first try got through;
//! - by the caller, after reading the state back, with a new key: a 5xx answer
//!   (`ServerError`), whose result Stripe may have stored for the key and would replay
//!   for a day (`billing::checkout::failed`).

use std::collections::HashMap;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use stripe_client_core::{RequestBuilder, StripeMethod, StripeRequest};

use super::subscription::{Customer, List, Subscription};

/// Why a Stripe call failed, sorted by what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum StripeFailure {
    /// Stripe could not be reached or did not answer in time, or kept answering 429 or
    /// `lock_timeout`: retry later, with the same idempotency key.
    #[error("Stripe unreachable: {0}")]
    Unreachable(String),
    /// Stripe answered 5xx: the request may or may not have been carried out, and Stripe
    /// may replay this answer for its idempotency key. Read the state back, then retry
    /// with a new key.
    #[error("Stripe failed the request ({status}): {message}")]
    ServerError { status: u16, message: String },
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

/// The API version async-stripe's request builders (rc.10) are generated for: sent as
/// `Stripe-Version` on every request.
pub fn stripe_version() -> &'static str {
    stripe_shared::version::VERSION.as_str()
}

/// Tries of one call inside `send` for the answers Stripe asks to retry.
const TRIES: u32 = 4;

/// Whether an answer is one to try again at once with the same key: Stripe says so
/// (`Stripe-Should-Retry`, which overrides the status), or it is a rate limit or a lock
/// timeout, for which Stripe stores no idempotent result. 5xx answers are not: their
/// result may be stored for the key (`ServerError`).
fn retry_at_once(status: u16, should_retry: Option<bool>, error_code: Option<&str>) -> bool {
    match should_retry {
        Some(said) => said,
        None => status == 429 || (status == 409 && error_code == Some("lock_timeout")),
    }
}

/// The wait before try `n + 1` (n ≥ 1): 250 ms doubling, at most 2 s, each drawn between
/// half of it and all of it, so that instances that were refused together do not come
/// back together.
fn backoff(n: u32, unit: f64) -> Duration {
    let full = (250.0 * f64::from(1u32 << n.clamp(1, 4).saturating_sub(1))).min(2000.0);
    Duration::from_secs_f64(full * (0.5 + 0.5 * unit.clamp(0.0, 1.0)) / 1000.0)
}
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct CheckoutSession {
    pub id: String,
    pub url: Option<String>,
    /// `open`, `complete` or `expired` (absent from the local fake's answers).
    pub status: Option<String>,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct InvoiceItem {
    pub id: String,
    pub invoice: Option<String>,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
}

/// An object this service creates in Stripe, named by the request that made it
/// (`metadata.rush_meter_request`), so that a try whose answer was lost finds it.
pub trait Made {
    fn id(&self) -> &str;
    fn metadata(&self) -> &HashMap<String, String>;
    fn made_by(&self, request: &str) -> bool {
        self.metadata().get(REQUEST).map(String::as_str) == Some(request)
    }
}

/// The metadata key that names the request an object was made by.
const REQUEST: &str = "rush_meter_request";

macro_rules! made {
    ($($t:ty),*) => {$(
        impl Made for $t {
            fn id(&self) -> &str {
                &self.id
            }
            fn metadata(&self) -> &HashMap<String, String> {
                &self.metadata
            }
        }
    )*};
}
made!(CheckoutSession, InvoiceItem, Customer);

/// An element of a list, read on its own: one that does not parse is kept as its id and
/// the reason, so that one odd object does not stop a run over all of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readable<T> {
    Read(T),
    Unreadable { id: String, error: String },
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Readable<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        let id = v
            .get("id")
            .and_then(|i| i.as_str())
            .unwrap_or("(no id)")
            .to_owned();
        Ok(match serde_json::from_value(v) {
            Ok(t) => Readable::Read(t),
            Err(e) => Readable::Unreadable {
                id,
                error: e.to_string(),
            },
        })
    }
}

impl<T> Readable<T> {
    /// The id to page on, whether or not the element was read.
    pub fn id<'a>(&'a self, id_of: impl Fn(&'a T) -> &'a str) -> &'a str {
        match self {
            Readable::Read(t) => id_of(t),
            Readable::Unreadable { id, .. } => id,
        }
    }
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
    /// `il_…`: where the next page of lines starts.
    pub id: Option<String>,
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
    code: Option<String>,
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

    /// Send a request built by async-stripe; `idempotency_key` for writes. Answers Stripe
    /// asks to retry are retried here (`retry_at_once`); every other failure is returned.
    async fn send<T: DeserializeOwned>(
        &self,
        req: RequestBuilder,
        idempotency_key: Option<&str>,
    ) -> StripeResult<T> {
        let text = self.send_raw(req, idempotency_key).await?;
        serde_json::from_str(&text)
            .map_err(|e| StripeFailure::Unreadable(format!("{e} in {}", truncate(&text))))
    }

    /// `send`, answering the body of a success as it came.
    async fn send_raw(
        &self,
        req: RequestBuilder,
        idempotency_key: Option<&str>,
    ) -> StripeResult<String> {
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
        let mut tries = 0;
        loop {
            tries += 1;
            let mut r = self
                .http
                .request(method.clone(), &url)
                .bearer_auth(&self.key)
                .header("Stripe-Version", stripe_version());
            if let Some(k) = idempotency_key {
                r = r.header("Idempotency-Key", k);
            }
            if let Some(body) = &req.body {
                r = r
                    .header("Content-Type", "application/x-www-form-urlencoded")
                    .body(body.clone());
            }
            let resp = r
                .send()
                .await
                .map_err(|e| StripeFailure::Unreachable(e.to_string()))?;
            let status = resp.status().as_u16();
            let should_retry = resp
                .headers()
                .get("Stripe-Should-Retry")
                .and_then(|v| v.to_str().ok())
                .map(|v| v.eq_ignore_ascii_case("true"));
            let text = resp
                .text()
                .await
                .map_err(|e| StripeFailure::Unreachable(e.to_string()))?;
            if (200..300).contains(&status) {
                return Ok(text);
            }
            let detail = serde_json::from_str::<ErrorBody>(&text)
                .ok()
                .map(|b| b.error);
            let code = detail.as_ref().and_then(|d| d.code.clone());
            let message = detail
                .and_then(|d| d.message)
                .unwrap_or_else(|| truncate(&text));
            let again = retry_at_once(status, should_retry, code.as_deref());
            if again && tries < TRIES {
                tracing::debug!(status, tries, %url, "Stripe asked for a retry");
                tokio::time::sleep(backoff(tries, rand::random::<f64>())).await;
                continue;
            }
            return Err(match status {
                404 => StripeFailure::NotFound(message),
                _ if again || status == 429 || code.as_deref() == Some("lock_timeout") => {
                    StripeFailure::Unreachable(format!("{status} after {tries} tries: {message}"))
                }
                500.. => StripeFailure::ServerError { status, message },
                s => StripeFailure::Refused { status: s, message },
            });
        }
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

    /// The invoice item an earlier try of this request made.
    pub async fn invoice_item_by_request(
        &self,
        customer: &str,
        request: &str,
    ) -> StripeResult<Option<InvoiceItem>> {
        use stripe_billing::invoice_item::ListInvoiceItem;
        self.find_made(
            request,
            |_| true,
            |after| {
                let mut req = ListInvoiceItem::new().customer(customer).limit(100);
                if let Some(a) = after {
                    req = req.starting_after(a);
                }
                req.build()
            },
        )
        .await
    }

    /// Page through a list (`page(after)` asks for the page after `after`) for the object
    /// `request` made that `wanted` accepts. A list Stripe (or a fake) does not have
    /// counts as empty. A cursor that restarts the list ends the scan.
    async fn find_made<T: Made + DeserializeOwned>(
        &self,
        request: &str,
        wanted: impl Fn(&T) -> bool,
        page: impl Fn(Option<&str>) -> RequestBuilder,
    ) -> StripeResult<Option<T>> {
        let mut seen = std::collections::HashSet::new();
        let mut after: Option<String> = None;
        loop {
            let list: List<Readable<T>> = match self.send(page(after.as_deref()), None).await {
                Ok(l) => l,
                Err(e) if e.is_not_found() => return Ok(None),
                Err(e) => return Err(e),
            };
            let mut last = None;
            for element in list.data {
                let id = element.id(Made::id).to_owned();
                if !seen.insert(id.clone()) {
                    return Ok(None);
                }
                if let Readable::Read(t) = element {
                    if t.made_by(request) && wanted(&t) {
                        return Ok(Some(t));
                    }
                }
                last = Some(id);
            }
            match last {
                Some(id) if list.has_more => after = Some(id),
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
                (REQUEST.to_owned(), request.to_owned()),
            ]))
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
        mut metadata: HashMap<String, String>,
        request: &str,
        idempotency_key: &str,
    ) -> StripeResult<InvoiceItem> {
        metadata.insert(REQUEST.to_owned(), request.to_owned());
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

    /// One page of a customer's invoices, newest first. An invoice's embedded lines are
    /// the first page of them (`all_lines` reads the rest).
    pub async fn invoices(
        &self,
        customer: &str,
        starting_after: Option<&str>,
    ) -> StripeResult<List<Readable<Invoice>>> {
        let mut req = stripe_billing::invoice::ListInvoice::new()
            .customer(customer)
            .limit(100);
        if let Some(after) = starting_after {
            req = req.starting_after(after);
        }
        self.send(req.build(), None).await
    }
}

impl StripeApi {
    /// `inv` with every line, paging past the ones it came with while Stripe has more.
    pub async fn all_lines(&self, mut inv: Invoice) -> StripeResult<Invoice> {
        use stripe_billing::invoice_line_item::ListInvoiceInvoiceLineItem;
        let mut seen: std::collections::HashSet<String> =
            inv.lines.data.iter().filter_map(|l| l.id.clone()).collect();
        while inv.lines.has_more {
            let Some(after) = inv.lines.data.last().and_then(|l| l.id.clone()) else {
                break;
            };
            let req = ListInvoiceInvoiceLineItem::new(inv.id.as_str())
                .limit(100)
                .starting_after(after);
            let page: List<InvoiceLine> = self.send(req.build(), None).await?;
            let fresh: Vec<InvoiceLine> = page
                .data
                .into_iter()
                .filter(|l| l.id.as_ref().is_none_or(|id| seen.insert(id.clone())))
                .collect();
            if fresh.is_empty() {
                break;
            }
            inv.lines.data.extend(fresh);
            inv.lines.has_more = page.has_more;
        }
        Ok(inv)
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
