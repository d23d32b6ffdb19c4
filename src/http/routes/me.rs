//! The caller's own token: what a client (the console) needs to know what it may show; and
//! a member token's own page.

use axum::extract::State;
use axum::Json;
use rush_meter_core::members::Limit;
use serde::Serialize;
use utoipa::ToSchema;

use crate::http::auth::Principal;
use crate::http::openapi::Guarded;
use crate::http::routes::limits::LimitWindow;
use crate::http::routes::sessions::{session_view, SessionView};
use crate::http::{ApiResult, AppState};

#[derive(Serialize, ToSchema)]
pub struct Me {
    token_id: String,
    label: String,
    /// `ingest`, `admission`, `console`, `finance`, `admin`, `member`.
    scopes: Vec<&'static str>,
    /// The one org the token acts on, whatever its scopes; `null`: not bound to one.
    org_id: Option<String>,
    /// The user a member token reads the own use of; `null` on other tokens.
    user_id: Option<String>,
    /// When it stops working; `null`: until revoked.
    #[serde(with = "rush_meter_core::time::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    expires_at: Option<i64>,
}

/// `GET /v1/me`: the token's id, label, scopes and org (any token; it shows the caller
/// nothing but itself).
#[utoipa::path(get, path = "/v1/me", tag = "tokens",
    security(("bearer" = ["ingest", "admission", "console", "finance", "admin", "member"])),
    responses((status = 200, description = "The caller's token", body = Me), Guarded))]
pub async fn me(principal: Principal) -> ApiResult<Json<Me>> {
    Ok(Json(Me {
        org_id: principal.bound_org().map(str::to_owned),
        user_id: principal.user().map(str::to_owned),
        scopes: principal.scopes.iter().map(|s| s.as_str()).collect(),
        token_id: principal.token_id,
        label: principal.label,
        expires_at: principal.expires_at,
    }))
}

/// A day of a member's use.
#[derive(Serialize, ToSchema)]
pub struct MemberDay {
    /// The UTC day's start.
    #[serde(with = "rush_meter_core::time::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    day: i64,
    seconds: i64,
}

/// A Team member's own page: their use, their limits, the time left to them.
#[derive(Serialize, ToSchema)]
pub struct MemberUsageView {
    org_id: String,
    user_id: String,
    /// The org's plan and the version it is on.
    plan: String,
    plan_version: i64,
    /// The user's agent time in the org's month window, running sessions counted up to
    /// now, and the limit set on the user in it (`null`: none).
    month: LimitWindow,
    week: LimitWindow,
    /// Seconds the user may still run: the least of their limits' room and what the org
    /// has left (its plan, grants and pay-as-you-go), one figure.
    time_left_seconds: i64,
    /// The user's time by UTC day over `[from, to)` (the month window in whole hours):
    /// they add up to the user's row of the org's usage breakdown by user over that range.
    days: Vec<MemberDay>,
    #[serde(with = "rush_meter_core::time::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    from: i64,
    #[serde(with = "rush_meter_core::time::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    to: i64,
    /// The user's running and parked sessions, oldest first.
    sessions: Vec<SessionView>,
    #[serde(with = "rush_meter_core::time::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    as_of: i64,
}

/// `GET /v1/me/usage`: the member token's user's own page (a member token only: it names
/// the org and the user).
#[utoipa::path(get, path = "/v1/me/usage", tag = "usage",
    security(("bearer" = ["member"])),
    responses((status = 200, description = "The user's own use, limits and time left",
        body = MemberUsageView), Guarded))]
pub async fn member_usage(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<Json<MemberUsageView>> {
    let (org, user) = principal.member()?;
    let now = state.clock.now();
    let page = state.member_page(org, user, now).await?;
    let (m, w) = (page.usage.month_seconds, page.usage.week_seconds);
    let limit = page.limit.as_ref();
    Ok(Json(MemberUsageView {
        org_id: page.org_id,
        user_id: page.user_id,
        plan: page.plan.id,
        plan_version: page.plan.version,
        month: LimitWindow::of(
            page.windows.month,
            m,
            limit.and_then(Limit::monthly_seconds),
        ),
        week: LimitWindow::of(page.windows.week, w, limit.and_then(Limit::weekly_seconds)),
        time_left_seconds: page.time_left_seconds,
        days: page
            .usage
            .days
            .into_iter()
            .map(|(day, seconds)| MemberDay { day, seconds })
            .collect(),
        from: page.range.start,
        to: page.range.end,
        sessions: page
            .sessions
            .into_iter()
            .map(|s| session_view(s, now, &state.rules))
            .collect(),
        as_of: now,
    }))
}
