//! The one error type of the API, and the one place it becomes a response:
//! `{"error": {"code", "message", "field"?}}` with the status API.md assigns. Every
//! other layer's error (the store's, billing's, the export's, the core's refusals) is
//! mapped to it here and nowhere else.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use rush_meter_core::funding::Invalid;
use rush_meter_core::gate::{AdmissionRequest, AdmitReject};
use rush_meter_core::heartbeats::{BatchError, IngestReject};
use rush_meter_core::signature::SignatureError;
use rush_meter_core::wire::DecodeError;
use serde::Serialize;

use crate::app::periods::ExportError;
use crate::app::Refusal;
use crate::billing::api::StripeFailure;
use crate::billing::BillingError;
use crate::store::StoreError;

rush_meter_core::named! {
    /// Every code an error answers with: the stable name a caller branches on (API.md),
    /// and the one behaviour switches on here.
    pub enum ErrorCode {
        MalformedBody = "malformed_body",
        InvalidValue = "invalid_value",
        Unauthorized = "unauthorized",
        Forbidden = "forbidden",
        OrgNotFound = "org_not_found",
        SessionNotFound = "session_not_found",
        TokenRevoked = "token_revoked",
        TokenExpired = "token_expired",
        IdempotencyKeyReused = "idempotency_key_reused",
        StripeOff = "stripe_off",
        NotFound = "not_found",
        UnsupportedMediaType = "unsupported_media_type",
        MethodNotAllowed = "method_not_allowed",
        BodyTooLarge = "body_too_large",
        Unavailable = "unavailable",
        RateLimited = "rate_limited",
        HeadersTooLarge = "headers_too_large",
        UriTooLong = "uri_too_long",
        MalformedRequest = "malformed_request",
        Internal = "internal",
        Refused = "refused",
        Conflict = "conflict",
        InvalidSignature = "invalid_signature",
        SessionConflict = "session_conflict",
        KeyNotFound = "key_not_found",
        SessionEnded = "session_ended",
        AlreadyOnPlan = "already_on_plan",
        StripeConflict = "stripe_conflict",
        StripeUnavailable = "stripe_unavailable",
        StripeRefused = "stripe_refused",
        NoPaymentMethod = "no_payment_method",
    }
}

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: ErrorCode,
    pub message: String,
    pub field: Option<String>,
    /// Seconds for `Retry-After`.
    pub retry_after: Option<u64>,
}

/// Every error's body: `{"error": {"code", "message", "field"?}}`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// A stable snake_case code to branch on.
    #[schema(example = "invalid_value")]
    code: ErrorCode,
    /// What went wrong and how to fix it, for people.
    message: String,
    /// The request field at fault (`heartbeats[3].seq`), when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            field: None,
            retry_after: None,
        }
    }

    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    /// Tell the caller to retry after `secs` (`Retry-After`).
    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }

    pub fn malformed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, ErrorCode::MalformedBody, message)
    }

    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::InvalidValue,
            message,
        )
        .with_field(field)
    }

    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            ErrorCode::Unauthorized,
            "send `Authorization: Bearer <token>` with a valid token",
        )
    }

    pub fn forbidden(scope: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            ErrorCode::Forbidden,
            format!("this token lacks the `{scope}` scope this route needs"),
        )
    }

    pub fn org_not_found(org_id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            ErrorCode::OrgNotFound,
            format!("no org `{org_id}`; create it with PUT /v1/orgs/{org_id}"),
        )
    }

    pub fn session_not_found(session_id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            ErrorCode::SessionNotFound,
            format!("no session `{session_id}`"),
        )
    }

    /// A token bound to one org called a route that acts on every org.
    pub fn bound_token(what: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            ErrorCode::Forbidden,
            format!("this token is bound to one org, and {what} covers every org; use a token bound to no org"),
        )
    }

    pub fn token_revoked() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            ErrorCode::TokenRevoked,
            "this token was revoked; ask an admin for a new one (rush-meter token create)",
        )
    }

    pub fn token_expired() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            ErrorCode::TokenExpired,
            "this token has expired; ask an admin for a new one (rush-meter token create)",
        )
    }

    /// A grant's idempotency key sent again with other values than grant `grant_id`'s.
    pub fn no_payment_method(org_id: &str) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            ErrorCode::NoPaymentMethod,
            format!(
                "org `{org_id}` has no payment method saved in Stripe to charge packs to: add \
                 one in the billing portal (POST /v1/orgs/{org_id}/billing-portal), then turn \
                 auto top-up on"
            ),
        )
        .with_field("enabled")
    }

    pub fn grant_key_reused(grant_id: &str) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            ErrorCode::IdempotencyKeyReused,
            format!(
                "idempotency_key was used for grant `{grant_id}` with other values; use a new key for a new grant"
            ),
        )
        .with_field("idempotency_key")
    }

    /// The webhook was called on an instance with no webhook secret.
    pub fn webhooks_off() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::StripeOff,
            "Stripe webhooks are off on this instance: set RUSH_METER_STRIPE_WEBHOOK_SECRET",
        )
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, message)
    }

    /// A body sent as something other than JSON.
    pub fn unsupported_media_type(sent: Option<&str>) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::UnsupportedMediaType,
            format!(
                "the body must be JSON sent with `Content-Type: application/json` (it came as {})",
                sent.map_or("no content type".to_owned(), |t| {
                    format!("`{}`", t.chars().take(100).collect::<String>())
                })
            ),
        )
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::MethodNotAllowed,
            "this route does not take that method; GET /openapi.json lists the methods of each route",
        )
    }

    pub fn too_large() -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::BodyTooLarge,
            "the body is larger than the service accepts (RUSH_METER_MAX_BODY_BYTES); send smaller batches",
        )
    }

    pub fn unavailable() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Unavailable,
            "the database is unreachable; retry shortly (a request cut off at its commit may have \
             been applied; its retry is answered as a repeat, never applied twice)",
        )
        .retry_after(1)
    }

    pub fn rate_limited(wait: u64) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::RateLimited,
            format!("this token is over its request rate (RUSH_METER_RATE_LIMIT_PER_SEC); retry in {wait} s"),
        )
        .retry_after(wait)
    }

    /// A request hyper could not parse (`connections`): it answers before any route does.
    pub fn unparsed(status: u16) -> Self {
        match status {
            431 => Self::new(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                ErrorCode::HeadersTooLarge,
                "the request's headers are more than the service reads (at most 100 headers, \
                 about 400 KiB in all); send fewer or smaller ones",
            ),
            414 => Self::new(
                StatusCode::URI_TOO_LONG,
                ErrorCode::UriTooLong,
                "the request's URI is longer than the service reads; send a shorter path and query",
            ),
            _ => Self::new(
                StatusCode::BAD_REQUEST,
                ErrorCode::MalformedRequest,
                "the request line or a header is not valid HTTP/1.1",
            ),
        }
    }

    /// This error as a whole HTTP/1.1 answer that closes the connection, for one hyper has
    /// given up on (`connections`).
    pub fn into_raw_response(self) -> Vec<u8> {
        let body = serde_json::to_vec(&ErrorBody {
            error: ErrorDetail {
                code: self.code,
                message: self.message,
                field: self.field,
            },
        })
        .expect("an error body serializes");
        let mut out = format!(
            "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
             cache-control: no-store\r\nconnection: close\r\n\r\n",
            self.status.as_u16(),
            self.status.canonical_reason().unwrap_or(""),
            body.len()
        )
        .into_bytes();
        out.extend(body);
        out
    }

    pub fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal,
            "an internal error occurred; it has been logged",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code,
                message: self.message,
                field: self.field,
            },
        };
        let unreachable = self.code == ErrorCode::Unavailable;
        let mut resp = (self.status, axum::Json(body)).into_response();
        if unreachable {
            resp.extensions_mut().insert(super::DatabaseUnreachable);
        }
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        resp
    }
}

/// Axum's own refusals (a path that is not UTF-8, a body over the limit) come as plain
/// text; every error this service answers is in its format, so they are rewritten.
pub async fn errors_as_json(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let text = axum::body::to_bytes(resp.into_body(), 4096)
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    match status {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::too_large(),
        StatusCode::BAD_REQUEST => {
            ApiError::malformed(format!("the request could not be read: {text}"))
        }
        s if s.is_server_error() => {
            tracing::error!(status = %s, body = %text, "the framework failed a request");
            ApiError::internal()
        }
        StatusCode::METHOD_NOT_ALLOWED => ApiError::method_not_allowed(),
        s => ApiError::new(s, ErrorCode::Refused, text),
    }
    .into_response()
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        (&e).into()
    }
}

impl From<&StoreError> for ApiError {
    fn from(e: &StoreError) -> Self {
        match e {
            StoreError::Unavailable(cause) => {
                tracing::warn!(error = %cause, "database unavailable");
                ApiError::unavailable()
            }
            StoreError::Conflict(msg) => {
                tracing::info!(error = %msg, "write refused by a uniqueness rule");
                ApiError::new(
                    StatusCode::CONFLICT,
                    ErrorCode::Conflict,
                    "the write conflicts with existing data; re-read and retry",
                )
            }
            StoreError::Invalid(msg) => {
                tracing::info!(error = %msg, "write refused by a check rule");
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    ErrorCode::InvalidValue,
                    "a value is out of the range the service keeps; check the request",
                )
            }
            StoreError::Other(cause) => {
                tracing::error!(error = %cause, "database error");
                ApiError::internal()
            }
        }
    }
}

impl From<DecodeError> for ApiError {
    fn from(e: DecodeError) -> Self {
        if e.invalid {
            let err = ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                ErrorCode::InvalidValue,
                e.message,
            );
            return match e.field {
                Some(f) => err.with_field(f),
                None => err,
            };
        }
        let err = ApiError::malformed(e.message);
        match e.field {
            Some(f) => err.with_field(f),
            None => err,
        }
    }
}

impl From<Invalid> for ApiError {
    fn from(e: Invalid) -> Self {
        ApiError::invalid(e.field, e.message)
    }
}

/// A webhook whose `Stripe-Signature` does not verify: 400, nothing stored.
impl From<SignatureError> for ApiError {
    fn from(e: SignatureError) -> Self {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidSignature,
            e.to_string(),
        )
    }
}

impl From<BatchError> for ApiError {
    fn from(e: BatchError) -> Self {
        match e {
            BatchError::Malformed(d) => d.into(),
            BatchError::Invalid { field, message } => ApiError::invalid(field, message),
            BatchError::OtherOrg { field, org_id } => {
                ApiError::org_not_found(&org_id).with_field(field)
            }
        }
    }
}

impl From<IngestReject> for ApiError {
    fn from(r: IngestReject) -> Self {
        let IngestReject::UnknownOrg { index, org_id } = r;
        ApiError::org_not_found(&org_id).with_field(format!("heartbeats[{index}].org_id"))
    }
}

impl ApiError {
    /// Why the gate could not decide `req` at all.
    pub fn admit_reject(r: AdmitReject, req: &AdmissionRequest) -> ApiError {
        match r {
            AdmitReject::UnknownOrg => ApiError::org_not_found(&req.org_id).with_field("org_id"),
            AdmitReject::UnknownKey => ApiError::new(
                StatusCode::NOT_FOUND,
                ErrorCode::KeyNotFound,
                format!(
                    "no key `{}` in org `{}`; register it with PUT /v1/orgs/{}/keys/{}",
                    req.key_id, req.org_id, req.org_id, req.key_id
                ),
            )
            .with_field("key_id"),
            AdmitReject::SessionEnded => ApiError::new(
                StatusCode::CONFLICT,
                ErrorCode::SessionEnded,
                format!(
                    "session `{}` has ended; start a new session id",
                    req.session_id
                ),
            )
            .with_field("session_id"),
        }
    }
}

impl From<BillingError> for ApiError {
    fn from(e: BillingError) -> Self {
        match e {
            BillingError::Off => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::StripeOff,
                e.to_string(),
            ),
            BillingError::SamePlan(_) => ApiError::new(
                StatusCode::CONFLICT,
                ErrorCode::AlreadyOnPlan,
                e.to_string(),
            )
            .with_field("plan"),
            BillingError::NoPrice(_) => ApiError::invalid("plan", e.to_string()),
            BillingError::NoItem
            | BillingError::Conflict(_)
            | BillingError::Unmatched(_)
            | BillingError::Unrecognized(_) => ApiError::new(
                StatusCode::CONFLICT,
                ErrorCode::StripeConflict,
                e.to_string(),
            ),
            BillingError::Stripe(StripeFailure::Unreachable(m)) => {
                // Its words name the API's address and the request: for operators only.
                tracing::warn!(error = %m, "Stripe did not answer");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    ErrorCode::StripeUnavailable,
                    "Stripe did not answer; nothing changed, retry shortly",
                )
                .retry_after(5)
            }
            BillingError::Stripe(StripeFailure::ServerError { status, .. }) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::StripeUnavailable,
                format!(
                    "Stripe failed the request ({status}); retry shortly: the retry first reads \
                     back what Stripe did, so nothing is made twice"
                ),
            )
            .retry_after(5),
            BillingError::Stripe(f) => {
                // Stripe's own words name its objects: logged for operators, not shown.
                tracing::warn!(error = %f, "Stripe refused a change");
                ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    ErrorCode::StripeRefused,
                    "Stripe refused the change; nothing changed here (the reason is logged)",
                )
            }
            BillingError::Store(s) => ApiError::from(s),
        }
    }
}

impl From<Refusal> for ApiError {
    fn from(e: Refusal) -> Self {
        match e {
            Refusal::OrgNotFound(org) => ApiError::org_not_found(&org),
            Refusal::SessionNotFound(id) => ApiError::session_not_found(&id),
            Refusal::SessionIdShared(id) => ApiError::new(
                StatusCode::CONFLICT,
                ErrorCode::SessionConflict,
                format!(
                    "sessions of several orgs have the id `{id}`; name the org: \
                     /v1/orgs/{{org_id}}/sessions/{id}"
                ),
            ),
            Refusal::NotFound(message) => ApiError::not_found(message),
            Refusal::Invalid { field, message } => ApiError::invalid(field, message),
            Refusal::GrantKeyReused(id) => ApiError::grant_key_reused(&id),
            Refusal::Funding(e) => e.into(),
            Refusal::Store(e) => e.into(),
        }
    }
}

impl From<crate::app::tokens::TokenError> for ApiError {
    fn from(e: crate::app::tokens::TokenError) -> Self {
        use crate::app::tokens::TokenError;
        match e {
            TokenError::Invalid { field, message } => ApiError::invalid(field, message),
            TokenError::OrgNotFound(org) => ApiError::org_not_found(&org).with_field("org_id"),
            TokenError::NotFound(id) => ApiError::not_found(format!("no token `{id}`")),
            TokenError::Store(s) => s.into(),
        }
    }
}

impl From<ExportError> for ApiError {
    fn from(e: ExportError) -> Self {
        match e {
            ExportError::Invalid(m) | ExportError::NothingToClose(m) => {
                ApiError::invalid("period", m)
            }
            ExportError::Store(s) => s.into(),
        }
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// An id from a path, query or body, or the 422 that names it.
pub fn parse_id(name: &str, value: &str) -> ApiResult<rush_meter_core::ids::Id> {
    rush_meter_core::ids::Id::parse(value)
        .map_err(|m| ApiError::invalid(name, format!("{name} {m}")))
}

/// One of an enum's names from a query or body, or the 422 that names the field and
/// lists the names it takes.
pub fn parse_named<T>(
    name: &str,
    value: &str,
    parse: fn(&str) -> Result<T, rush_meter_core::names::Unknown>,
) -> ApiResult<T> {
    parse(value).map_err(|e| ApiError::invalid(name, format!("{name} {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What Stripe's client says of a failure names the API's address and the request:
    /// logged for operators, never shown to a caller.
    #[test]
    fn stripe_unavailable_names_no_internal_address() {
        let e = ApiError::from(BillingError::Stripe(StripeFailure::Unreachable(
            "error sending request for url (http://10.0.0.7:12111/v1/customers/search): \
             POST create_customer"
                .into(),
        )));
        assert_eq!(e.code, "stripe_unavailable");
        for internal in ["http", "10.0.0.7", "12111", "customers", "create_customer"] {
            assert!(!e.message.contains(internal), "{internal}: {}", e.message);
        }
    }
}
