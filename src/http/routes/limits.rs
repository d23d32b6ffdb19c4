//! Limits inside an org (docs/limits.md): hours a month and a week on one of its users,
//! projects or API keys. The org's console and admin set and remove them; finance reads
//! them too. The gate and heartbeat answers keep them (`core::gate`, `core::members`).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use rush_meter_core::members::{parse_hours, Limit, LimitKind, MemberUsage};
use rush_meter_core::time::{rfc3339, Interval, Secs, Windows};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::app::limits::LimitsInUse;
use crate::http::auth::Principal;
use crate::http::error::{parse_id, parse_named};
use crate::http::extract::{JsonBody, OrgLimitPath, OrgPath, OrgReader};
use crate::http::openapi::{BadBody, BadId, Guarded};
use crate::http::{ApiError, ApiResult, AppState};
use crate::tokens::Scope;

/// One window of a limit: the member's use counted up to now.
#[derive(Serialize, ToSchema)]
pub struct LimitWindow {
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    start: Secs,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    end: Secs,
    /// The member's agent time in the window, running sessions counted up to now.
    used_seconds: i64,
    /// `null`: no limit in this window.
    limit_seconds: Option<i64>,
    /// `null`: no limit in this window.
    remaining_seconds: Option<i64>,
}

impl LimitWindow {
    pub(crate) fn of(w: Interval, used: i64, limit: Option<i64>) -> LimitWindow {
        LimitWindow {
            start: w.start,
            end: w.end,
            used_seconds: used,
            limit_seconds: limit,
            remaining_seconds: limit.map(|l| (l - used).max(0)),
        }
    }
}

/// A limit and its member's use in the org's month and week.
#[derive(Serialize, ToSchema)]
pub struct LimitView {
    org_id: String,
    #[schema(value_type = LimitKind)]
    kind: String,
    member_id: String,
    /// Decimal hours; `null`: no monthly limit.
    #[schema(example = "40")]
    monthly_hours: Option<String>,
    /// Decimal hours; `null`: no weekly limit.
    #[schema(example = "12")]
    weekly_hours: Option<String>,
    /// The org's billing month.
    month: LimitWindow,
    /// The ISO week.
    week: LimitWindow,
    /// The member has spent a limit: its runs are refused, and its running sessions park
    /// once the plan's grace has passed.
    spent: bool,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    created_at: Secs,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    updated_at: Secs,
}

impl LimitView {
    fn of(l: Limit, windows: Windows, used: &MemberUsage) -> LimitView {
        let u = used
            .get(&(l.kind.dimension(), l.member_id.clone()))
            .copied()
            .unwrap_or_default();
        LimitView {
            month: LimitWindow::of(windows.month, u.0, l.monthly_seconds()),
            week: LimitWindow::of(windows.week, u.1, l.weekly_seconds()),
            spent: l.spent(u),
            kind: l.kind.as_str().to_owned(),
            monthly_hours: l.monthly_hours.map(|h| h.normalize().to_string()),
            weekly_hours: l.weekly_hours.map(|h| h.normalize().to_string()),
            org_id: l.org_id,
            member_id: l.member_id,
            created_at: l.created_at,
            updated_at: l.updated_at,
        }
    }
}

#[derive(Serialize, ToSchema)]
pub struct LimitList {
    limits: Vec<LimitView>,
}

/// An org's limits on its users, projects and keys, each with its member's use in the
/// org's month and week counted up to now (the org's console, finance, admin).
#[utoipa::path(get, path = "/v1/orgs/{org_id}/limits", tag = "limits", params(OrgPath),
    security(("bearer" = ["console", "finance", "admin"])),
    responses((status = 200, description = "Every limit, by kind and member", body = LimitList),
        Guarded, BadId))]
pub async fn list_limits(
    State(state): State<AppState>,
    OrgReader { org_id, .. }: OrgReader,
) -> ApiResult<Json<LimitList>> {
    let LimitsInUse {
        windows,
        limits,
        used,
    } = state.limits_in_use(org_id.as_str()).await?;
    Ok(Json(LimitList {
        limits: limits
            .into_iter()
            .map(|l| LimitView::of(l, windows, &used))
            .collect(),
    }))
}

#[derive(Deserialize, ToSchema)]
pub struct LimitBody {
    /// Decimal hours in the org's billing month, 0 to 100,000 with at most 4 places;
    /// `null` or absent: no monthly limit.
    #[schema(example = "40")]
    monthly_hours: Option<String>,
    /// Decimal hours in the ISO week, as `monthly_hours`.
    #[schema(example = "12")]
    weekly_hours: Option<String>,
}

/// The org, kind and member a path names, checked: the caller may change the org (its
/// console, or admin), and every part is what it must be.
fn limit_path(principal: &Principal, p: OrgLimitPath) -> ApiResult<(String, LimitKind, String)> {
    principal.require_any(&[Scope::Console])?;
    let org_id = parse_id("org_id", &p.org_id)?;
    let kind = parse_named("kind", &p.kind, LimitKind::parse_named)?;
    let member_id = parse_id("member_id", &p.member_id)?;
    principal.check_org(org_id.as_str())?;
    Ok((org_id.into_string(), kind, member_id.into_string()))
}

/// Set a limit on a user, project or key (the org's console, admin): hours a month, a
/// week, or both. Runs of the member are refused once it has spent either, and its
/// running sessions park after the plan's grace; the next decision and heartbeat apply it.
#[utoipa::path(put, path = "/v1/orgs/{org_id}/limits/{kind}/{member_id}", tag = "limits",
    params(OrgLimitPath), security(("bearer" = ["console", "admin"])), request_body = LimitBody,
    responses((status = 200, description = "The limit as stored, and its member's use", body = LimitView),
        Guarded, BadBody, BadId))]
pub async fn put_limit(
    State(state): State<AppState>,
    principal: Principal,
    Path(path): Path<OrgLimitPath>,
    JsonBody(body): JsonBody<LimitBody>,
) -> ApiResult<Json<LimitView>> {
    let (org_id, kind, member_id) = limit_path(&principal, path)?;
    let monthly_hours = parse_hours("monthly_hours", body.monthly_hours.as_deref())?;
    let weekly_hours = parse_hours("weekly_hours", body.weekly_hours.as_deref())?;
    if monthly_hours.is_none() && weekly_hours.is_none() {
        return Err(ApiError::invalid(
            "monthly_hours",
            "give monthly_hours, weekly_hours or both; to remove a limit, DELETE it",
        ));
    }
    let now = state.clock.now();
    let limit = Limit {
        org_id,
        kind,
        member_id,
        monthly_hours,
        weekly_hours,
        created_at: now,
        updated_at: now,
    };
    let (stored, in_use) = state.put_limit(limit, &principal.actor()).await?;
    Ok(Json(LimitView::of(stored, in_use.windows, &in_use.used)))
}

/// Remove a limit (the org's console, admin): the member's runs count against the org's
/// own ceilings only.
#[utoipa::path(delete, path = "/v1/orgs/{org_id}/limits/{kind}/{member_id}", tag = "limits",
    params(OrgLimitPath), security(("bearer" = ["console", "admin"])),
    responses((status = 204, description = "Removed"),
        (status = 404, description = "`not_found`: no such limit in the org",
            body = crate::http::error::ErrorBody),
        Guarded, BadId))]
pub async fn delete_limit(
    State(state): State<AppState>,
    principal: Principal,
    Path(path): Path<OrgLimitPath>,
) -> ApiResult<StatusCode> {
    let (org_id, kind, member_id) = limit_path(&principal, path)?;
    state
        .delete_limit(&org_id, kind, &member_id, &principal.actor())
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
