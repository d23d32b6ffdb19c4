//! Health, readiness, metrics, and the answers for routes that do not exist.

use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

use super::{ApiError, AppState};

/// 200 while the process runs.
pub async fn healthz() -> impl IntoResponse {
    Json(json!({"status": "ok"}))
}

/// 200 while the database answers within a second, else 503.
pub async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    match tokio::time::timeout(Duration::from_secs(1), state.db.ping()).await {
        Ok(Ok(())) => (
            StatusCode::OK,
            Json(json!({"status": "ready", "database": state.db.backend()})),
        )
            .into_response(),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "not ready");
            ApiError::unavailable().into_response()
        }
        Err(_) => {
            tracing::warn!("not ready: the database did not answer within 1 s");
            ApiError::unavailable().into_response()
        }
    }
}

pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}

pub async fn not_found() -> ApiError {
    ApiError::not_found("no such route; see docs/api.md for the routes this service has")
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method; see docs/api.md",
    )
}
