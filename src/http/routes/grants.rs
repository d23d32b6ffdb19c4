//! An org's hour grants: admin makes and voids them; finance and the org's console read
//! them. Used after the plan, before pay-as-you-go; the rules are the core's
//! (`core::funding`), docs/funding.md says how they play out.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use rush_meter_core::funding::{GrantAsk, GrantKind};
use rush_meter_core::time::{rfc3339, Secs};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::http::auth::Principal;
use crate::http::error::{parse_id, parse_named};
use crate::http::extract::{JsonBody, OrgGrantPath, OrgPath, OrgReader};
use crate::http::openapi::{BadBody, BadId, Conflicting, Guarded};
use crate::http::views::GrantView;
use crate::http::{ApiError, ApiResult, AppState};
use crate::tokens::Scope;

#[derive(Deserialize, ToSchema)]
pub struct GrantBody {
    /// Agent seconds granted: 1 to 360,000,000 (100,000 hours).
    #[schema(minimum = 1, maximum = 360_000_000)]
    seconds: i64,
    #[schema(value_type = GrantKind)]
    kind: String,
    /// 0 (used first) to 100 (used last); default 50.
    #[schema(minimum = 0, maximum = 100)]
    priority: Option<i64>,
    /// Default now: a grant never funds time before it.
    #[schema(format = DateTime)]
    starts_at: Option<String>,
    /// The remainder lapses then; default never.
    #[schema(format = DateTime)]
    expires_at: Option<String>,
    #[schema(max_length = 500)]
    note: Option<String>,
    /// The same key answers the grant made first and creates nothing.
    #[schema(min_length = 1, max_length = 200)]
    idempotency_key: Option<String>,
}

fn time_field(name: &'static str, value: Option<&str>) -> ApiResult<Option<Secs>> {
    value
        .map(|v| rfc3339::parse(v).map_err(|m| ApiError::invalid(name, format!("{name}: {m}"))))
        .transpose()
}

/// Grant an org hours (admin): used after its plan, before pay-as-you-go.
#[utoipa::path(post, path = "/v1/orgs/{org_id}/grants", tag = "funding", params(OrgPath),
    security(("bearer" = ["admin"])), request_body = GrantBody,
    responses(
        (status = 201, description = "The grant made", body = GrantView),
        (status = 200, description = "The grant made before with this idempotency key; nothing new", body = GrantView),
        Guarded, BadBody, BadId, Conflicting))]
pub async fn post_grant(
    State(state): State<AppState>,
    principal: Principal,
    Path(OrgPath { org_id }): Path<OrgPath>,
    JsonBody(body): JsonBody<GrantBody>,
) -> ApiResult<(StatusCode, Json<GrantView>)> {
    principal.require_any(&[Scope::Admin])?;
    let org_id = parse_id("org_id", &org_id)?;
    let ask = GrantAsk {
        seconds: body.seconds,
        kind: parse_named("kind", &body.kind, GrantKind::parse_named)?,
        priority: body.priority,
        starts_at: time_field("starts_at", body.starts_at.as_deref())?,
        expires_at: time_field("expires_at", body.expires_at.as_deref())?,
        note: body.note,
        idempotency_key: body.idempotency_key,
    };
    let made = state
        .create_grant(org_id.as_str(), ask, &principal.actor())
        .await?;
    let status = if made.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(GrantView::of(made.grant, state.clock.now()))))
}

#[derive(Serialize, ToSchema)]
pub struct GrantList {
    grants: Vec<GrantView>,
}

/// An org's grants, oldest first, used and remaining counted up to now (admin, finance,
/// the org's console).
#[utoipa::path(get, path = "/v1/orgs/{org_id}/grants", tag = "funding", params(OrgPath),
    security(("bearer" = ["console", "finance", "admin"])),
    responses((status = 200, description = "Every grant, voided and expired ones too", body = GrantList),
        Guarded, BadId))]
pub async fn list_grants(
    State(state): State<AppState>,
    OrgReader { org_id, .. }: OrgReader,
) -> ApiResult<Json<GrantList>> {
    let now = state.clock.now();
    let grants = state.grants_now(org_id.as_str()).await?;
    Ok(Json(GrantList {
        grants: grants.into_iter().map(|g| GrantView::of(g, now)).collect(),
    }))
}

/// Void a grant (admin): its remainder lapses now, what was used stays. Voiding it again
/// changes nothing.
#[utoipa::path(post, path = "/v1/orgs/{org_id}/grants/{grant_id}/void", tag = "funding",
    params(OrgGrantPath), security(("bearer" = ["admin"])),
    responses((status = 200, description = "The grant, voided", body = GrantView),
        Guarded, BadId))]
pub async fn void_grant(
    State(state): State<AppState>,
    principal: Principal,
    Path(OrgGrantPath { org_id, grant_id }): Path<OrgGrantPath>,
) -> ApiResult<Json<GrantView>> {
    principal.require_any(&[Scope::Admin])?;
    let org_id = parse_id("org_id", &org_id)?;
    let grant_id = parse_id("grant_id", &grant_id)?;
    let g = state
        .void_grant(org_id.as_str(), grant_id.as_str(), &principal.actor())
        .await?;
    Ok(Json(GrantView::of(g, state.clock.now())))
}
