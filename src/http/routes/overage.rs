//! An org's pay-as-you-go: the org's console or admin turns it on or off and sets its
//! monthly cap; finance reads it too, with this month's spend (docs/funding.md).

use axum::extract::{Path, State};
use axum::Json;
use rush_meter_core::time::{rfc3339, Secs};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::http::auth::Principal;
use crate::http::error::parse_id;
use crate::http::extract::{JsonBody, OrgPath, OrgReader};
use crate::http::openapi::{BadBody, BadId, Guarded};
use crate::http::views::OverageView;
use crate::http::{ApiError, ApiResult, AppState};
use crate::tokens::Scope;

/// An org's pay-as-you-go and this month's spend (admin, finance, the org's console).
#[utoipa::path(get, path = "/v1/orgs/{org_id}/overage", tag = "funding", params(OrgPath),
    security(("bearer" = ["console", "finance", "admin"])),
    responses((status = 200, description = "The setting and this month's spend", body = OverageView),
        Guarded, BadId))]
pub async fn get_overage(
    State(state): State<AppState>,
    OrgReader { org_id, .. }: OrgReader,
) -> ApiResult<Json<OverageView>> {
    let s = state.standing(org_id.as_str(), state.clock.now()).await?;
    Ok(Json(OverageView::of(&s)))
}

#[derive(Deserialize, ToSchema)]
pub struct OverageBody {
    enabled: bool,
    /// Required to turn it on: a decimal string in the plan's currency, at most the plan's
    /// `overage_cap_max`. Time past the plan and grants stops (sessions park) once this
    /// month's overage reaches it; it is never charged past it.
    #[schema(example = "50.00")]
    monthly_cap: Option<String>,
}

/// Turn pay-as-you-go on or off and set its monthly cap (the org's console, admin). It
/// applies to the very next decision and heartbeat.
#[utoipa::path(put, path = "/v1/orgs/{org_id}/overage", tag = "funding", params(OrgPath),
    security(("bearer" = ["console", "admin"])), request_body = OverageBody,
    responses((status = 200, description = "The setting as stored, and this month's spend", body = OverageView),
        Guarded, BadBody, BadId))]
pub async fn put_overage(
    State(state): State<AppState>,
    principal: Principal,
    Path(OrgPath { org_id }): Path<OrgPath>,
    JsonBody(body): JsonBody<OverageBody>,
) -> ApiResult<Json<OverageView>> {
    principal.require_any(&[Scope::Console])?;
    let org_id = parse_id("org_id", &org_id)?;
    principal.check_org(org_id.as_str())?;
    let cap = body
        .monthly_cap
        .as_deref()
        .map(|c| {
            rush_meter_core::charges::parse_decimal(c).ok_or_else(|| {
                ApiError::invalid(
                    "monthly_cap",
                    format!("monthly_cap `{c}` is not a decimal amount such as \"50.00\""),
                )
            })
        })
        .transpose()?;
    let s = state
        .set_overage(org_id.as_str(), body.enabled, cap, &principal.actor())
        .await?;
    Ok(Json(OverageView::of(&s)))
}

/// A pay-as-you-go charge: one billing window's overage, as sent to Stripe (or not).
#[derive(Serialize, ToSchema)]
pub struct ChargeView {
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    window_start: Secs,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    window_end: Secs,
    overage_seconds: i64,
    /// Decimal, in `currency`.
    #[schema(example = "12.34")]
    amount: String,
    currency: String,
    /// `pending` (to send, after `next_attempt_at`), `charged`, `none` (nothing to send:
    /// no Stripe customer, or nothing owed) or `failed` (given up after its tries: retry
    /// it with `POST …/overage/charges/retry` once the cause is fixed).
    state: String,
    stripe_invoice_id: Option<String>,
    stripe_invoice_item_id: Option<String>,
    /// Tries that failed.
    attempts: i64,
    #[serde(with = "rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    next_attempt_at: Option<Secs>,
    /// Why the last try failed.
    last_error: Option<String>,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    created_at: Secs,
    #[serde(with = "rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    charged_at: Option<Secs>,
}

#[derive(Serialize, ToSchema)]
pub struct ChargeList {
    charges: Vec<ChargeView>,
}

/// `GET /v1/orgs/{org_id}/overage/charges`: the org's pay-as-you-go charges, newest window
/// first, with how each was sent (finance, admin).
#[utoipa::path(get, path = "/v1/orgs/{org_id}/overage/charges", tag = "funding", params(OrgPath),
    security(("bearer" = ["finance", "admin"])),
    responses((status = 200, description = "The org's charges, newest window first", body = ChargeList),
        Guarded, BadId))]
pub async fn list_charges(
    State(state): State<AppState>,
    principal: Principal,
    Path(OrgPath { org_id }): Path<OrgPath>,
) -> ApiResult<Json<ChargeList>> {
    principal.require_any(&[Scope::Finance])?;
    let org_id = parse_id("org_id", &org_id)?;
    let charges = state
        .overage_charges(org_id.as_str())
        .await?
        .into_iter()
        .map(|c| ChargeView {
            next_attempt_at: (c.state == "pending" && c.next_attempt_at > 0)
                .then_some(c.next_attempt_at),
            window_start: c.window_start,
            window_end: c.window_end,
            overage_seconds: c.overage_seconds,
            amount: c.amount,
            currency: c.currency,
            state: c.state,
            stripe_invoice_id: c.stripe_invoice_id,
            stripe_invoice_item_id: c.stripe_invoice_item_id,
            attempts: c.attempts,
            last_error: c.last_error,
            created_at: c.created_at,
            charged_at: c.charged_at,
        })
        .collect();
    Ok(Json(ChargeList { charges }))
}

#[derive(Serialize, ToSchema)]
pub struct ChargesRequeued {
    /// Failed charges put back: each is sent at the billing job's next run.
    requeued: u64,
}

/// `POST /v1/orgs/{org_id}/overage/charges/retry`: put the org's failed charges back to be
/// sent at once (admin); audited. Charges not failed are left as they are.
#[utoipa::path(post, path = "/v1/orgs/{org_id}/overage/charges/retry", tag = "funding",
    params(OrgPath), security(("bearer" = ["admin"])),
    responses((status = 200, description = "How many failed charges were put back", body = ChargesRequeued),
        Guarded, BadId))]
pub async fn retry_charges(
    State(state): State<AppState>,
    principal: Principal,
    Path(OrgPath { org_id }): Path<OrgPath>,
) -> ApiResult<Json<ChargesRequeued>> {
    principal.require_any(&[Scope::Admin])?;
    let org_id = parse_id("org_id", &org_id)?;
    let requeued = state
        .requeue_charges(org_id.as_str(), &principal.actor())
        .await?;
    Ok(Json(ChargesRequeued { requeued }))
}
