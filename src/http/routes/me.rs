//! The caller's own token: what a client (the console) needs to know what it may show.

use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use crate::http::auth::Principal;
use crate::http::openapi::Guarded;
use crate::http::ApiResult;

#[derive(Serialize, ToSchema)]
pub struct Me {
    token_id: String,
    label: String,
    /// `ingest`, `admission`, `console`, `finance`, `admin`.
    scopes: Vec<&'static str>,
    /// The one org the token acts on, whatever its scopes; `null`: not bound to one.
    org_id: Option<String>,
    /// When it stops working; `null`: until revoked.
    #[serde(with = "rush_meter_core::time::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    expires_at: Option<i64>,
}

/// `GET /v1/me`: the token's id, label, scopes and org (any token; it shows the caller
/// nothing but itself).
#[utoipa::path(get, path = "/v1/me", tag = "tokens",
    security(("bearer" = ["ingest", "admission", "console", "finance", "admin"])),
    responses((status = 200, description = "The caller's token", body = Me), Guarded))]
pub async fn me(principal: Principal) -> ApiResult<Json<Me>> {
    Ok(Json(Me {
        org_id: principal.bound_org().map(str::to_owned),
        scopes: principal.scopes.iter().map(|s| s.as_str()).collect(),
        token_id: principal.token_id,
        label: principal.label,
        expires_at: principal.expires_at,
    }))
}
