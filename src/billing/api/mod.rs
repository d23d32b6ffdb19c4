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
//!
//! The pieces: `client` sends and retries, `types` reads the answers, and one file per
//! kind of Stripe object holds its requests (`customers`, `subscriptions`, `sessions` for
//! Checkout and the billing portal, `invoices` for invoice items and invoices,
//! `payment_intents` for the off-session charges of auto top-ups).

mod client;
mod customers;
mod invoices;
mod payment_intents;
mod sessions;
mod subscriptions;
mod types;

pub use client::StripeApi;
pub use payment_intents::{PaymentIntent, PaymentIntentError};
pub use sessions::PLAN;
pub use types::{
    CheckoutSession, Invoice, InvoiceItem, InvoiceLine, LinePeriod, Made, PortalSession, Readable,
};

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
    /// A 402 is a card declined: `code` and `decline_code` say why, `payment_intent` which
    /// intent it left unpaid.
    #[error("Stripe refused the request ({status}): {message}")]
    Refused {
        status: u16,
        message: String,
        code: Option<String>,
        decline_code: Option<String>,
        payment_intent: Option<String>,
    },
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
