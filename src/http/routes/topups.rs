//! Top-ups: the org's console or admin buys a pack of hours in Stripe Checkout; the paid
//! session becomes a `purchased` grant (`billing::funding`, docs/funding.md).

use axum::extract::{Path, State};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::http::auth::Principal;
use crate::http::error::parse_id;
use crate::http::extract::{JsonBody, OrgPath};
use crate::http::openapi::{BadBody, BadId, Guarded, StripeCalls};
use crate::http::{ApiError, ApiResult, AppState};
use crate::tokens::Scope;

#[derive(Deserialize, ToSchema)]
pub struct TopupBody {
    /// One of the plan's `topup_hours` packs.
    #[schema(minimum = 1)]
    hours: i64,
}

/// A top-up to pay for in Stripe Checkout; paid, it becomes a `purchased` grant.
#[derive(Serialize, ToSchema)]
pub struct TopupView {
    hours: i64,
    /// Decimal, in `currency`: hours × the plan's `topup_hour_price`.
    #[schema(example = "5.50")]
    amount: String,
    currency: String,
    /// Stripe Checkout: where to pay.
    url: String,
    session_id: String,
    /// Days the hours last once paid.
    expires_after_days: i64,
}

/// Buy a pack of hours (the org's console, admin): a Stripe Checkout Session in payment
/// mode for one of the plan's `topup_hours`. The paid session grants the hours once, as a
/// `purchased` grant that lasts the plan's `topup_expiry_days`.
#[utoipa::path(post, path = "/v1/orgs/{org_id}/topups", tag = "funding", params(OrgPath),
    security(("bearer" = ["console", "admin"])), request_body = TopupBody,
    responses((status = 200, description = "Where to pay", body = TopupView),
        Guarded, BadBody, BadId, StripeCalls))]
pub async fn post_topup(
    State(state): State<AppState>,
    principal: Principal,
    Path(OrgPath { org_id }): Path<OrgPath>,
    JsonBody(body): JsonBody<TopupBody>,
) -> ApiResult<Json<TopupView>> {
    principal.require_any(&[Scope::Console])?;
    let org_id = parse_id("org_id", &org_id)?;
    principal.check_org(org_id.as_str())?;
    let org = state.org(org_id.as_str()).await?;
    let (plan, _) = org.subscribed_plan(&state.plans, state.clock.now());
    if !plan.topup_hours.contains(&body.hours) {
        let sold = if plan.topup_hours.is_empty() {
            format!("the {} plan sells no top-ups", plan.name)
        } else {
            let packs: Vec<String> = plan.topup_hours.iter().map(|h| h.to_string()).collect();
            format!(
                "the {} plan sells packs of {} hours (got {})",
                plan.name,
                packs.join(", "),
                body.hours
            )
        };
        return Err(ApiError::invalid("hours", sold));
    }
    let t = crate::billing::funding::open_topup(&state.billing, &org, body.hours).await?;
    Ok(Json(TopupView {
        hours: t.hours,
        amount: format!("{:.2}", t.amount),
        currency: t.currency,
        url: t.url,
        session_id: t.session_id,
        expires_after_days: plan.topup_expiry_days,
    }))
}
