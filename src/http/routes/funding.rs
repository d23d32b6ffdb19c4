//! Past the plan: an org's hour grants (admin makes and voids them; finance and the
//! org's console read them) and its pay-as-you-go (the org's console or admin sets it).
//! The rules are the core's (`core::funding`); docs/funding.md says how they play out.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use rush_meter_core::funding::{
    check_overage, Grant, GrantAsk, GrantKind, GrantStatus, Invalid, WindowKind,
};
use rush_meter_core::org::Org;
use rush_meter_core::plans::Plan;
use rush_meter_core::standing::Standing;
use rush_meter_core::time::{hours, rfc3339, Secs};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::http::auth::Principal;
use crate::http::error::{parse_id, parse_named};
use crate::http::extract::{JsonBody, OrgGrantPath, OrgPath, OrgReader};
use crate::http::openapi::{BadBody, BadId, Conflicting, Guarded, StripeCalls};
use crate::http::{ApiError, ApiResult, AppState};
use crate::tokens::Scope;

impl From<Invalid> for ApiError {
    fn from(e: Invalid) -> Self {
        ApiError::invalid(e.field, e.message)
    }
}

/// A grant of hours, as every reader sees it.
#[derive(Serialize, ToSchema)]
pub struct GrantView {
    grant_id: String,
    org_id: String,
    kind: GrantKind,
    status: GrantStatus,
    seconds: i64,
    /// Used so far, running sessions counted up to now.
    used_seconds: i64,
    /// Left to use: 0 once voided or expired.
    remaining_seconds: i64,
    remaining_hours: String,
    /// 0 is used first, 100 last.
    priority: i64,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    starts_at: Secs,
    #[serde(with = "rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    expires_at: Option<Secs>,
    note: Option<String>,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    created_at: Secs,
    #[serde(with = "rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    voided_at: Option<Secs>,
}

impl GrantView {
    fn of(g: Grant, now: Secs) -> GrantView {
        let status = g.status(now);
        let remaining = match status {
            GrantStatus::Active | GrantStatus::Scheduled => g.remaining(),
            _ => 0,
        };
        GrantView {
            status,
            remaining_seconds: remaining,
            remaining_hours: hours(remaining),
            grant_id: g.grant_id,
            org_id: g.org_id,
            kind: g.kind,
            seconds: g.seconds,
            used_seconds: g.used_seconds,
            priority: g.priority,
            starts_at: g.starts_at,
            expires_at: g.expires_at,
            note: g.note,
            created_at: g.created_at,
            voided_at: g.voided_at,
        }
    }
}

/// Grants with their use counted up to now: what the org's standing attributed to them
/// (running sessions included) replaces what was booked.
fn grants_now(grants: Vec<Grant>, s: &Standing) -> Vec<GrantView> {
    grants
        .into_iter()
        .map(|mut g| {
            if let Some(now) = s.funding.grants.iter().find(|x| x.grant_id == g.grant_id) {
                g.used_seconds = now.used_seconds;
            }
            GrantView::of(g, s.at)
        })
        .collect()
}

#[derive(Deserialize, ToSchema)]
pub struct GrantBody {
    /// Agent seconds granted: 1 to 360,000,000 (100,000 hours).
    #[schema(minimum = 1, maximum = 360_000_000)]
    seconds: i64,
    #[schema(schema_with = crate::http::openapi::strings::grant_kind)]
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
    let now = state.clock.now();
    let id = format!("grt_{:016x}", rand::random::<u64>());
    let grant = ask.clone().check(org_id.as_str(), &id, now)?;
    let (made, created) = state
        .db
        .create_grant(&grant, &principal.actor())
        .await?
        .ok_or_else(|| ApiError::org_not_found(org_id.as_str()))?;
    if !created && !ask.matches(&made) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "idempotency_key_reused",
            format!(
                "idempotency_key was used for grant `{}` with other values; use a new key for a new grant",
                made.grant_id
            ),
        )
        .with_field("idempotency_key"));
    }
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(GrantView::of(made, now))))
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
    let (s, grants) = tokio::join!(
        state.standing(org_id.as_str(), now),
        state.db.list_grants(org_id.as_str())
    );
    let s = s?;
    Ok(Json(GrantList {
        grants: grants_now(grants?, &s),
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
    let now = state.clock.now();
    let g = state
        .db
        .void_grant(org_id.as_str(), grant_id.as_str(), now, &principal.actor())
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no grant `{grant_id}` in org `{org_id}`")))?;
    Ok(Json(GrantView::of(g, now)))
}

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
    /// Price of an agent-hour past the plan and grants.
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
    /// What that costs: never more than the cap.
    #[schema(example = "12.34")]
    spent: String,
    /// Left under the cap (0 while off).
    #[schema(example = "37.66")]
    remaining: String,
}

impl OverageView {
    pub fn of(s: &Standing) -> OverageView {
        let plan: &Plan = &s.plan;
        let org: &Org = &s.org;
        let w = s.funding.windows_at(s.at);
        let funds = s.funding.funds(WindowKind::Month, w.month);
        let spent = funds.overage_amount();
        let cap = org.overage.monthly_cap;
        let remaining = if s.funding.terms.pay_as_you_go() {
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
            unit_price: format!("{:.2}", plan.overage_unit_price),
            currency: plan.currency.clone(),
            month_start: w.month.start,
            month_end: w.month.end,
            overage_seconds: funds.overage,
            spent: format!("{spent:.2}"),
            remaining: format!("{remaining:.2}"),
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
            c.trim().parse::<rust_decimal::Decimal>().map_err(|_| {
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
    let (plan, _) = org.subscribed_plan(&state.plans);
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

/// What funds the org past its plan, as the usage page shows it.
#[derive(Serialize, ToSchema)]
pub struct FundingView {
    /// Agent time left from every source now: the plan, the grants in force, and
    /// pay-as-you-go up to its cap.
    remaining_seconds: i64,
    remaining_hours: String,
    /// What pays for the next second; `null` once everything is spent.
    funded_by: Option<String>,
    /// Grants in force or starting later.
    grants: Vec<GrantView>,
    overage: OverageView,
}

impl FundingView {
    pub fn of(s: &Standing) -> FundingView {
        let remaining = s.remaining_seconds();
        let grants = s
            .funding
            .grants
            .iter()
            .cloned()
            .map(|g| GrantView::of(g, s.at))
            .filter(|g| matches!(g.status, GrantStatus::Active | GrantStatus::Scheduled))
            .collect();
        FundingView {
            remaining_seconds: remaining,
            remaining_hours: hours(remaining),
            funded_by: s
                .funding
                .next_source(s.at)
                .map(|(src, _)| src.as_str().to_owned()),
            grants,
            overage: OverageView::of(s),
        }
    }
}
