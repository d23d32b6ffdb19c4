//! The client: sends a request async-stripe built, with the key, the API version and an
//! idempotency key, retries at once what Stripe asks to retry, and pages a list for the
//! object an earlier try made. What each request is lives with its kind of object.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use stripe_client_core::{RequestBuilder, StripeMethod};

use super::types::{Made, Readable};
use super::{stripe_version, StripeFailure, StripeResult};
use crate::billing::subscription::List;

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

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Deserialize)]
struct ErrorDetail {
    message: Option<String>,
    code: Option<String>,
    decline_code: Option<String>,
    payment_intent: Option<IdOnly>,
}

#[derive(Deserialize)]
struct IdOnly {
    id: String,
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
    pub(super) async fn send<T: DeserializeOwned>(
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
            let decline_code = detail.as_ref().and_then(|d| d.decline_code.clone());
            let payment_intent = detail
                .as_ref()
                .and_then(|d| d.payment_intent.as_ref())
                .map(|p| p.id.clone());
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
                s => StripeFailure::Refused {
                    status: s,
                    message,
                    code,
                    decline_code,
                    payment_intent,
                },
            });
        }
    }
    /// Page through a list (`page(after)` asks for the page after `after`) for the object
    /// `request` made that `wanted` accepts. A list Stripe (or a fake) does not have
    /// counts as empty. A cursor that restarts the list ends the scan.
    pub(super) async fn find_made<T: Made + DeserializeOwned>(
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
}

/// An ISO currency code as async-stripe takes it (every string is one: unknown codes are
/// kept as they are).
pub(super) fn currency_code(code: &str) -> stripe_types::Currency {
    match code.parse() {
        Ok(c) => c,
        Err(never) => match never {},
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(300).collect()
}
