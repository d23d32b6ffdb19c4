//! An org's pay-as-you-go: the org's console or admin turns it on or off and sets its
//! monthly cap; finance reads it too, with this month's spend (docs/funding.md).

use axum::extract::{Path, State};
use axum::Json;
use rush_meter_core::funding::{check_overage, WindowKind};
use rush_meter_core::org::Org;
use rush_meter_core::plans::Plan;
use rush_meter_core::standing::Standing;
use rush_meter_core::time::{rfc3339, Secs};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::http::auth::Principal;
use crate::http::error::parse_id;
use crate::http::extract::{JsonBody, OrgPath, OrgReader};
use crate::http::openapi::{BadBody, BadId, Guarded};
use crate::http::{ApiError, ApiResult, AppState};
use crate::tokens::Scope;

/// Pay-as-you-go: as the org set it, and this month's spend against its cap.
#[derive(Serialize, ToSchema)]
pub struct OverageView {
    org_id: String,
    /// The org's plan offers pay-as-you-go.
    offered: bool,
    enabled: bool,
    /// Decimal, in `currency`.
    #[schema(example = "50.00")]
    monthly_cap: String,
    /// The highest cap the plan allows.
    #[schema(example = "200.00")]
    cap_max: String,
    /// Price of an agent-hour past the plan and grants, exact: 2 places, or the 3 or 4 the
    /// plan gives it.
    #[schema(example = "0.60")]
    unit_price: String,
    currency: String,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    month_start: Secs,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    month_end: Secs,
    /// Paid as it went this month, running sessions counted up to now.
    overage_seconds: i64,
    /// What that cost. Never more than the cap in force when it was spent: above
    /// `monthly_cap` only when the cap was lowered (or pay-as-you-go turned off) after.
    #[schema(example = "12.34")]
    spent: String,
    /// Left under the cap (0 while off, and once `spent` reaches `monthly_cap`).
    #[schema(example = "37.66")]
    remaining: String,
    /// On, and `spent` has reached `monthly_cap`: nothing more is paid as it goes this
    /// month (runs past the plan and grants are refused with `spend_cap_reached`).
    cap_reached: bool,
}

impl OverageView {
    pub fn of(s: &Standing) -> OverageView {
        let plan: &Plan = &s.plan;
        let org: &Org = &s.org;
        let w = s.funding.windows_at(s.at);
        let funds = s.funding.funds(WindowKind::Month, w.month);
        let spent = funds.overage_amount();
        let cap = org.overage.monthly_cap;
        let on = s.funding.terms.pay_as_you_go();
        let remaining = if on {
            (cap - spent).max(rust_decimal::Decimal::ZERO)
        } else {
            rust_decimal::Decimal::ZERO
        };
        OverageView {
            org_id: org.org_id.clone(),
            offered: plan.offers_overage(),
            enabled: org.overage.enabled,
            monthly_cap: format!("{cap:.2}"),
            cap_max: format!("{:.2}", plan.overage_cap_max),
            unit_price: rush_meter_core::charges::unit_price(plan.overage_unit_price),
            currency: plan.currency.clone(),
            month_start: w.month.start,
            month_end: w.month.end,
            overage_seconds: funds.overage,
            spent: format!("{spent:.2}"),
            remaining: format!("{remaining:.2}"),
            cap_reached: on && spent >= cap,
        }
    }
}

async fn overage_view(state: &AppState, org_id: &str) -> ApiResult<OverageView> {
    let now = state.clock.now();
    let s = state.standing(org_id, now).await?;
    Ok(OverageView::of(&s))
}

/// An org's pay-as-you-go and this month's spend (admin, finance, the org's console).
#[utoipa::path(get, path = "/v1/orgs/{org_id}/overage", tag = "funding", params(OrgPath),
    security(("bearer" = ["console", "finance", "admin"])),
    responses((status = 200, description = "The setting and this month's spend", body = OverageView),
        Guarded, BadId))]
pub async fn get_overage(
    State(state): State<AppState>,
    OrgReader { org_id, .. }: OrgReader,
) -> ApiResult<Json<OverageView>> {
    Ok(Json(overage_view(&state, org_id.as_str()).await?))
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
    let org = state.org(org_id.as_str()).await?;
    let plan = org.effective_plan(&state.plans, state.clock.now());
    let overage = check_overage(plan, body.enabled, cap)?;
    state
        .db
        .set_overage(
            org_id.as_str(),
            &overage,
            state.clock.now(),
            &principal.actor(),
        )
        .await?
        .ok_or_else(|| ApiError::org_not_found(org_id.as_str()))?;
    Ok(Json(overage_view(&state, org_id.as_str()).await?))
}
