//! A small Stripe of our own, for what localstripe cannot do: answer 429, `lock_timeout`,
//! `Stripe-Should-Retry`, a 5xx stored for its idempotency key (and replayed for it, as
//! Stripe does), lists with an element that does not parse, and invoices whose lines come
//! in pages. It keeps the objects it made and every request it was sent (with its
//! `Stripe-Version` and `Idempotency-Key`), so a test can count the writes.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, Method, StatusCode, Uri};
use serde_json::{json, Value};

/// A request as the fake saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: String,
    pub form: Vec<(String, String)>,
    pub idempotency_key: Option<String>,
    pub stripe_version: Option<String>,
}

/// What the next matching request gets instead of a plain answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// 429, nothing stored for the key.
    RateLimited,
    /// 409 `lock_timeout`, nothing stored.
    LockTimeout,
    /// 500 with `Stripe-Should-Retry: true`, nothing stored.
    ShouldRetry,
    /// The write is made, then answered 500, and the 500 stored for its key.
    FailAfterWriting,
    /// 500 stored for the key, nothing made.
    FailBeforeWriting,
    /// 400 `invalid_request_error`: Stripe will not do it (a session paid a moment ago
    /// cannot be expired, say).
    Refused,
}

#[derive(Default)]
pub struct State {
    pub seen: Vec<Seen>,
    pub customers: Vec<Value>,
    pub sessions: Vec<Value>,
    pub invoice_items: Vec<Value>,
    /// Listed and read as they are: a test may put in one that does not parse.
    pub subscriptions: Vec<Value>,
    pub invoices: Vec<Value>,
    /// Every line of an invoice; `GET /v1/invoices/{id}/lines` pages through them.
    pub lines: HashMap<String, Vec<Value>>,
    /// (method, path, fault), taken in order by the first request that matches.
    pub faults: VecDeque<(String, String, Fault)>,
    stored: HashMap<String, Value>,
}

pub struct FakeStripe {
    pub url: String,
    pub state: Arc<Mutex<State>>,
}

impl FakeStripe {
    pub async fn start() -> FakeStripe {
        let state: Arc<Mutex<State>> = Arc::default();
        let shared = state.clone();
        let app = axum::Router::new().fallback(
            move |method: Method, uri: Uri, headers: HeaderMap, body: String| {
                let state = shared.clone();
                async move { answer(&state, method, uri, headers, body) }
            },
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        FakeStripe { url, state }
    }

    /// The next `method path` request gets `fault`.
    pub fn fail(&self, method: &str, path: &str, fault: Fault) {
        self.state
            .lock()
            .unwrap()
            .faults
            .push_back((method.into(), path.into(), fault));
    }

    /// The requests sent to `method path`.
    pub fn sent(&self, method: &str, path: &str) -> Vec<Seen> {
        let s = self.state.lock().unwrap();
        s.seen
            .iter()
            .filter(|r| r.method == method && r.path == path)
            .cloned()
            .collect()
    }

    pub fn all_sent(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    pub fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }
}

type Answer = (StatusCode, HeaderMap, axum::Json<Value>);

fn reply(status: u16, body: Value) -> Answer {
    (
        StatusCode::from_u16(status).unwrap(),
        HeaderMap::new(),
        axum::Json(body),
    )
}

fn error(kind: &str, code: Option<&str>, message: &str) -> Value {
    json!({"error": {"type": kind, "code": code, "message": message}})
}

/// Stripe's 404 for an object of kind `what` that it does not have.
fn missing(what: &str) -> (u16, Value) {
    let message = format!("No such {what}");
    (
        404,
        error("invalid_request_error", Some("resource_missing"), &message),
    )
}

fn answer(
    state: &Mutex<State>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: String,
) -> Answer {
    let mut s = state.lock().unwrap();
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let seen = Seen {
        method: method.to_string(),
        path: uri.path().to_owned(),
        query: uri.query().unwrap_or_default().to_owned(),
        form: url::form_urlencoded::parse(body.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect(),
        idempotency_key: header("idempotency-key"),
        stripe_version: header("stripe-version"),
    };
    s.seen.push(seen.clone());
    if let Some(stored) = seen.idempotency_key.as_ref().and_then(|k| s.stored.get(k)) {
        return reply(500, stored.clone());
    }
    let fault = s
        .faults
        .iter()
        .position(|(m, p, _)| *m == seen.method && *p == seen.path)
        .and_then(|i| s.faults.remove(i))
        .map(|(_, _, f)| f);
    let server_error = error("api_error", None, "Something went wrong on Stripe's end.");
    match fault {
        Some(Fault::RateLimited) => {
            return reply(
                429,
                error(
                    "invalid_request_error",
                    Some("rate_limit"),
                    "Too many requests",
                ),
            )
        }
        Some(Fault::Refused) => {
            return reply(
                400,
                error("invalid_request_error", None, "Stripe will not do that now"),
            )
        }
        Some(Fault::LockTimeout) => {
            return reply(
                409,
                error("invalid_request_error", Some("lock_timeout"), "locked"),
            )
        }
        Some(Fault::ShouldRetry) => {
            let mut h = HeaderMap::new();
            h.insert("stripe-should-retry", "true".parse().unwrap());
            return (StatusCode::SERVICE_UNAVAILABLE, h, axum::Json(server_error));
        }
        Some(Fault::FailBeforeWriting) => {
            if let Some(k) = &seen.idempotency_key {
                s.stored.insert(k.clone(), server_error.clone());
            }
            return reply(500, server_error);
        }
        Some(Fault::FailAfterWriting) => {
            let _ = route(&mut s, &seen);
            if let Some(k) = &seen.idempotency_key {
                s.stored.insert(k.clone(), server_error.clone());
            }
            return reply(500, server_error);
        }
        None => {}
    }
    let (status, body) = route(&mut s, &seen);
    reply(status, body)
}

/// `metadata[k]=v` of a form as an object.
fn metadata(form: &[(String, String)]) -> Value {
    let mut m = serde_json::Map::new();
    for (k, v) in form {
        if let Some(key) = k
            .strip_prefix("metadata[")
            .and_then(|k| k.strip_suffix(']'))
        {
            m.insert(key.to_owned(), Value::String(v.clone()));
        }
    }
    Value::Object(m)
}

fn field<'a>(form: &'a [(String, String)], name: &str) -> Option<&'a str> {
    form.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn query(q: &str, name: &str) -> Option<String> {
    url::form_urlencoded::parse(q.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// A page of `all` (Stripe's list shape) after `starting_after`, `limit` at most.
fn page(all: &[Value], q: &str) -> Value {
    let limit: usize = query(q, "limit").and_then(|l| l.parse().ok()).unwrap_or(10);
    let start = match query(q, "starting_after") {
        Some(after) => all
            .iter()
            .position(|v| v["id"] == after.as_str())
            .map_or(all.len(), |i| i + 1),
        None => 0,
    };
    let data: Vec<Value> = all.iter().skip(start).take(limit).cloned().collect();
    json!({"object": "list", "data": data, "has_more": start + limit < all.len()})
}

fn route(s: &mut State, r: &Seen) -> (u16, Value) {
    let customer_is =
        |v: &Value| query(&r.query, "customer").is_none_or(|c| v["customer"] == c.as_str());
    match (r.method.as_str(), r.path.as_str()) {
        ("POST", "/v1/customers") => {
            let c = json!({"id": format!("cus_fake{}", s.customers.len() + 1), "object": "customer",
                "name": field(&r.form, "name"), "metadata": metadata(&r.form)});
            s.customers.push(c.clone());
            (200, c)
        }
        ("GET", "/v1/customers") => (200, page(&s.customers, &r.query)),
        ("POST", "/v1/checkout/sessions") => {
            let n = s.sessions.len() + 1;
            let c = json!({"id": format!("cs_fake{n}"), "object": "checkout.session",
                "url": format!("https://checkout.stripe.test/{n}"), "status": "open",
                "mode": field(&r.form, "mode"), "customer": field(&r.form, "customer"),
                "metadata": metadata(&r.form)});
            s.sessions.push(c.clone());
            (200, c)
        }
        ("GET", "/v1/checkout/sessions") => {
            let status = query(&r.query, "status");
            let mine: Vec<Value> = s
                .sessions
                .iter()
                .filter(|v| customer_is(v))
                .filter(|v| status.as_ref().is_none_or(|st| v["status"] == st.as_str()))
                .cloned()
                .collect();
            (200, page(&mine, &r.query))
        }
        ("POST", path)
            if path.starts_with("/v1/checkout/sessions/") && path.ends_with("/expire") =>
        {
            let id = &path["/v1/checkout/sessions/".len()..path.len() - "/expire".len()];
            match s.sessions.iter_mut().find(|v| v["id"] == id) {
                Some(c) if c["status"] == "open" => {
                    c["status"] = json!("expired");
                    (200, c.clone())
                }
                Some(_) => (
                    400,
                    error(
                        "invalid_request_error",
                        None,
                        "Only Checkout Sessions with a status of `open` can be expired.",
                    ),
                ),
                None => missing("checkout.session"),
            }
        }
        ("POST", path) if path.starts_with("/v1/subscriptions/") => {
            // An item moved to another price (as `items[0][price]` names it).
            let id = &path["/v1/subscriptions/".len()..];
            let price = field(&r.form, "items[0][price]").map(str::to_owned);
            match s.subscriptions.iter_mut().find(|v| v["id"] == id) {
                Some(sub) => {
                    if let Some(p) = price {
                        sub["items"]["data"][0]["price"] = json!({"id": p, "lookup_key": p});
                    }
                    (200, sub.clone())
                }
                None => missing("subscription"),
            }
        }
        ("DELETE", path) if path.starts_with("/v1/subscriptions/") => {
            let id = &path["/v1/subscriptions/".len()..];
            match s.subscriptions.iter_mut().find(|v| v["id"] == id) {
                Some(sub) => {
                    sub["status"] = json!("canceled");
                    (200, sub.clone())
                }
                None => missing("subscription"),
            }
        }
        ("POST", "/v1/invoiceitems") => {
            let c = json!({"id": format!("ii_fake{}", s.invoice_items.len() + 1),
                "object": "invoiceitem", "customer": field(&r.form, "customer"),
                "amount": field(&r.form, "amount").and_then(|a| a.parse::<i64>().ok()),
                "invoice": null, "metadata": metadata(&r.form)});
            s.invoice_items.push(c.clone());
            (200, c)
        }
        ("GET", "/v1/invoiceitems") => {
            let mine: Vec<Value> = s
                .invoice_items
                .iter()
                .filter(|v| customer_is(v))
                .cloned()
                .collect();
            (200, page(&mine, &r.query))
        }
        ("GET", "/v1/subscriptions") => (200, page(&s.subscriptions, &r.query)),
        ("GET", "/v1/invoices") => {
            let mine: Vec<Value> = s
                .invoices
                .iter()
                .filter(|v| customer_is(v))
                .cloned()
                .collect();
            (200, page(&mine, &r.query))
        }
        ("GET", path) => {
            if let Some(id) = path.strip_prefix("/v1/subscriptions/") {
                if let Some(sub) = s.subscriptions.iter().find(|v| v["id"] == id) {
                    return (200, sub.clone());
                }
            }
            if let Some(id) = path
                .strip_prefix("/v1/invoices/")
                .and_then(|p| p.strip_suffix("/lines"))
            {
                if let Some(lines) = s.lines.get(id) {
                    return (200, page(lines, &r.query));
                }
            }
            missing("object")
        }
        _ => (
            404,
            error("invalid_request_error", None, "the fake has no such route"),
        ),
    }
}
