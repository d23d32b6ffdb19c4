//! An org's auto top-up: the org's console or admin turns it on, off or changes it;
//! finance reads it too, with the packs bought (docs/funding.md).

use axum::extract::{Path, State};
use axum::Json;
use rush_meter_core::auto_topup::{check, pack_amount, Settings, MAX_PACKS_A_MONTH};
use rush_meter_core::time::{hours, rfc3339, Secs, Windows};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::http::auth::Principal;
use crate::http::error::parse_id;
use crate::http::extract::{JsonBody, OrgPath, OrgReader};
use crate::http::openapi::{BadBody, BadId, Guarded, StripeCalls};
use crate::http::{ApiError, ApiResult, AppState};
use crate::store::AutoTopupRow;
use crate::tokens::Scope;

/// Packs listed at most.
const RECENT: usize = 24;

/// A pack an auto top-up bought, or is buying.
#[derive(Serialize, ToSchema)]
pub struct PackView {
    /// The org's packs in the order opened, from 1.
    seq: i64,
    hours: i64,
    /// Decimal, in `currency`.
    #[schema(example = "5.50")]
    amount: String,
    currency: String,
    /// `charging` (in flight, or waiting for a retry after a decline), `paid`, `failed`
    /// (its tries declined: auto top-up was turned off), `needs_customer` (the bank wants
    /// the customer present: auto top-up was turned off, a Checkout link sent) or
    /// `canceled` (declined, and not charged again: auto top-up was turned off meanwhile,
    /// or the org had room again).
    status: String,
    /// Charges declined so far.
    attempts: i64,
    /// While `charging`: when its charge is sent (again).
    #[serde(with = "rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    next_attempt_at: Option<Secs>,
    payment_intent_id: Option<String>,
    last_error: Option<String>,
    /// The `purchased` grant it became, once paid.
    grant_id: Option<String>,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    month_start: Secs,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    created_at: Secs,
}

impl PackView {
    fn of(r: AutoTopupRow) -> PackView {
        PackView {
            seq: r.seq,
            hours: r.hours,
            amount: r.amount,
            currency: r.currency,
            next_attempt_at: (r.status == "charging").then_some(r.next_attempt_at),
            status: r.status,
            attempts: r.attempts,
            payment_intent_id: r.payment_intent_id,
            last_error: r.last_error,
            grant_id: r.grant_id,
            month_start: r.month_start,
            created_at: r.created_at,
        }
    }
}

/// An org's auto top-up, and its packs.
#[derive(Serialize, ToSchema)]
pub struct AutoTopupView {
    org_id: String,
    enabled: bool,
    /// Below this many hours of plan and grant time (what the gate reads), a pack is bought.
    #[schema(example = "2.0000")]
    below_hours: String,
    /// Hours a pack buys (0: never set).
    pack_hours: i64,
    monthly_max_packs: i64,
    /// What a pack costs now: `pack_hours` × the plan's `topup_hour_price`.
    #[schema(example = "5.50")]
    pack_amount: String,
    currency: String,
    /// Hours of plan and grant time the org has now (running sessions counted up to now).
    #[schema(example = "12.5000")]
    usable_hours: String,
    /// A pack is being charged: no other is bought until it is paid or given up.
    pending: bool,
    /// The billing month `packs_this_month` counts in.
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    month_start: Secs,
    /// Packs paid or being charged this billing month (at most `monthly_max_packs`).
    packs_this_month: i64,
    /// The newest packs first (at most 24).
    packs: Vec<PackView>,
}

async fn view(state: &AppState, org_id: &str) -> ApiResult<AutoTopupView> {
    let now = state.clock.now();
    let (s, packs) = tokio::join!(
        state.standing(org_id, now),
        // Enough to count the month's, whatever the maximum (`MAX_PACKS_A_MONTH`), with the
        // month's declined ones.
        state.db.auto_topups_of(org_id, 4 * MAX_PACKS_A_MONTH)
    );
    let (s, packs) = (s?, packs?);
    let a = &s.org.auto_topup;
    let (plan, _) = s.org.subscribed_plan(&state.plans, now);
    let month = Windows::at(now, s.org.billing_period()).month.start;
    let this_month = packs
        .iter()
        .filter(|p| p.month_start == month && matches!(p.status.as_str(), "charging" | "paid"))
        .count();
    Ok(AutoTopupView {
        org_id: s.org.org_id.clone(),
        enabled: a.enabled,
        below_hours: hours(a.below_seconds),
        pack_hours: a.pack_hours,
        monthly_max_packs: a.monthly_max_packs,
        pack_amount: format!("{:.2}", pack_amount(plan, a.pack_hours)),
        currency: plan.currency.clone(),
        usable_hours: hours(rush_meter_core::auto_topup::usable_seconds(&s.funding, now)),
        pending: a.pending,
        month_start: month,
        packs_this_month: this_month as i64,
        packs: packs.into_iter().take(RECENT).map(PackView::of).collect(),
    })
}

/// An org's auto top-up and its packs (admin, finance, the org's console).
#[utoipa::path(get, path = "/v1/orgs/{org_id}/auto-topup", tag = "funding", params(OrgPath),
    security(("bearer" = ["console", "finance", "admin"])),
    responses((status = 200, description = "The setting and the packs bought", body = AutoTopupView),
        Guarded, BadId))]
pub async fn get_auto_topup(
    State(state): State<AppState>,
    OrgReader { org_id, .. }: OrgReader,
) -> ApiResult<Json<AutoTopupView>> {
    Ok(Json(view(&state, org_id.as_str()).await?))
}

#[derive(Deserialize, ToSchema)]
pub struct AutoTopupBody {
    enabled: bool,
    /// Hours, a decimal string of whole seconds: below this much plan and grant time a pack
    /// is bought. Absent: as stored.
    #[schema(example = "2")]
    below_hours: Option<String>,
    /// One of the plan's `topup_hours`, more than `below_hours`. Absent: as stored.
    #[schema(example = 10)]
    pack_hours: Option<i64>,
    /// 1 to 100 packs a billing month. Absent: as stored.
    #[schema(example = 3)]
    monthly_max_packs: Option<i64>,
}

/// Turn auto top-up on, off or change it (the org's console, admin). Turning it on needs a
/// payment method saved on the org's Stripe customer (else 409 `no_payment_method`: add
/// one in the billing portal, `POST /v1/orgs/{org_id}/billing-portal`). An org already
/// below the threshold buys its first pack at once.
#[utoipa::path(put, path = "/v1/orgs/{org_id}/auto-topup", tag = "funding", params(OrgPath),
    security(("bearer" = ["console", "admin"])), request_body = AutoTopupBody,
    responses((status = 200, description = "The setting as stored, and the packs", body = AutoTopupView),
        Guarded, BadBody, BadId, StripeCalls))]
pub async fn put_auto_topup(
    State(state): State<AppState>,
    principal: Principal,
    Path(OrgPath { org_id }): Path<OrgPath>,
    JsonBody(body): JsonBody<AutoTopupBody>,
) -> ApiResult<Json<AutoTopupView>> {
    principal.require_any(&[Scope::Console])?;
    let org_id = parse_id("org_id", &org_id)?;
    principal.check_org(org_id.as_str())?;
    let org = state.org(org_id.as_str()).await?;
    let now = state.clock.now();
    let (plan, _) = org.subscribed_plan(&state.plans, now);
    let stored = &org.auto_topup;
    let below = match body.below_hours.as_deref() {
        Some(text) => rush_meter_core::charges::parse_decimal(text).ok_or_else(|| {
            ApiError::invalid(
                "below_hours",
                format!("below_hours `{text}` is not a decimal number of hours such as \"2\""),
            )
        })?,
        None => {
            rust_decimal::Decimal::from(stored.below_seconds) / rust_decimal::Decimal::from(3600)
        }
    };
    let pack_hours = body.pack_hours.unwrap_or(stored.pack_hours);
    let max_packs = body.monthly_max_packs.unwrap_or(stored.monthly_max_packs);
    let only_off = !body.enabled
        && body.below_hours.is_none()
        && body.pack_hours.is_none()
        && body.monthly_max_packs.is_none();
    let settings = if only_off {
        // Off as stored: nothing to check (the plan may no longer sell the stored pack).
        Settings {
            enabled: false,
            below_seconds: stored.below_seconds,
            pack_hours: stored.pack_hours,
            monthly_max_packs: stored.monthly_max_packs,
        }
    } else {
        check(body.enabled, below, pack_hours, max_packs, plan)
            .map_err(|e| ApiError::invalid(e.field, e.message))?
    };
    if settings.enabled
        && crate::billing::auto_topup::payment_method(&state.billing, &org)
            .await?
            .is_none()
    {
        return Err(ApiError::no_payment_method(org_id.as_str()));
    }
    state
        .db
        .set_auto_topup(org_id.as_str(), &settings, now, &principal.actor())
        .await?
        .ok_or_else(|| ApiError::org_not_found(org_id.as_str()))?;
    if settings.enabled {
        state.auto_topups.consider_orgs(&[org_id.as_str()]).await?;
    }
    Ok(Json(view(&state, org_id.as_str()).await?))
}
