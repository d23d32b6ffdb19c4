//! Health, readiness, metrics, and the answers for routes that do not exist.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use crate::http::openapi::Unready;
use crate::http::{ApiError, AppState};

#[derive(Serialize, ToSchema)]
pub struct Health {
    /// `ok`, or `ready` from `/readyz`.
    status: &'static str,
    /// `/readyz` only: `postgres` or `sqlite`.
    #[serde(skip_serializing_if = "Option::is_none")]
    database: Option<&'static str>,
}

/// Liveness: 200 while the process runs.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "The process runs", body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok",
        database: None,
    })
}

/// Readiness: 200 while the database answers within a second and requests are not being
/// refused for an outage (src/app/breaker.rs), else 503.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses((status = 200, description = "The database answers", body = Health), Unready))]
pub async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    match state.ready().await {
        Ok(database) => (
            StatusCode::OK,
            Json(Health {
                status: "ready",
                database: Some(database),
            }),
        )
            .into_response(),
        Err(why) => {
            tracing::warn!(%why, "not ready");
            ApiError::unavailable().into_response()
        }
    }
}

/// Prometheus metrics in the OpenMetrics text format (docs/operations.md says what each
/// means).
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "OpenMetrics text", body = String,
        content_type = "application/openmetrics-text")))]
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    state
        .metrics
        .breaker_open
        .set(i64::from(state.breaker.is_open()));
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations",
    responses((status = 200, description = "The OpenAPI 3.1 document", body = Object)))]
pub async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], served())
}

/// The document as served at `/openapi.json`, built once.
fn served() -> &'static str {
    static JSON: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        crate::http::api()
            .1
            .to_pretty_json()
            .expect("an OpenAPI document always serializes")
    });
    &JSON
}

pub async fn not_found() -> ApiError {
    ApiError::not_found("no such route; GET /openapi.json lists the routes this service has")
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed()
}
