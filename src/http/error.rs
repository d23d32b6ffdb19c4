//! The one error type of the API, and the one place it becomes a response:
//! `{"error": {"code", "message", "field"?}}` with the status API.md assigns.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::store::StoreError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
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
    code: &'static str,
    /// What went wrong and how to fix it, for people.
    message: String,
    /// The request field at fault (`heartbeats[3].seq`), when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
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
        Self::new(StatusCode::BAD_REQUEST, "malformed_body", message)
    }

    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_value", message).with_field(field)
    }

    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "send `Authorization: Bearer <token>` with a valid token",
        )
    }

    pub fn forbidden(scope: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("this token lacks the `{scope}` scope this route needs"),
        )
    }

    pub fn org_not_found(org_id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "org_not_found",
            format!("no org `{org_id}`; create it with PUT /v1/orgs/{org_id}"),
        )
    }

    pub fn session_not_found(session_id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "session_not_found",
            format!("no session `{session_id}`"),
        )
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn too_large() -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            "the body is larger than the service accepts (RUSH_METER_MAX_BODY_BYTES); send smaller batches",
        )
    }

    pub fn unavailable() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the database is unreachable; retry shortly (nothing was written)",
        )
        .retry_after(1)
    }

    pub fn rate_limited(wait: u64) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!("this token is over its request rate (RUSH_METER_RATE_LIMIT_PER_SEC); retry in {wait} s"),
        )
        .retry_after(wait)
    }

    pub fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
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
        let unreachable = self.code == "unavailable";
        let mut resp = (self.status, axum::Json(body)).into_response();
        if unreachable {
            resp.extensions_mut()
                .insert(super::breaker::DatabaseUnreachable);
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
        StatusCode::METHOD_NOT_ALLOWED => ApiError::new(
            status,
            "method_not_allowed",
            "the path does not take this method; /openapi.json lists what it takes",
        ),
        s => ApiError::new(s, "refused", text),
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
                    "conflict",
                    "the write conflicts with existing data; re-read and retry",
                )
            }
            StoreError::Other(cause) => {
                tracing::error!(error = %cause, "database error");
                ApiError::internal()
            }
        }
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// An id from a path, query or body, or the 422 that names it.
pub fn parse_id(name: &str, value: &str) -> ApiResult<crate::ids::Id> {
    crate::ids::Id::parse(value).map_err(|m| ApiError::invalid(name, format!("{name} {m}")))
}
