//! The console's usage page.

use axum::extract::{Path, State};
use axum::Json;
use serde::Serialize;

use super::auth::Principal;
use super::orgs::path_id;
use super::{ApiError, ApiResult, AppState};
use crate::ledger::Secs;
use crate::quota::{rfc3339, WindowUsage};
use crate::standing::standing;
use crate::tokens::Scope;

#[derive(Serialize)]
pub struct UsageView {
    org_id: String,
    plan: String,
    month: WindowUsage,
    week: WindowUsage,
    running_sessions: i64,
    parked_sessions: i64,
    #[serde(with = "rfc3339")]
    as_of: Secs,
}

/// `GET /v1/orgs/{org_id}/usage`: both windows, running sessions counted up to now.
pub async fn get_usage(
    State(state): State<AppState>,
    principal: Principal,
    Path(org_id): Path<String>,
) -> ApiResult<Json<UsageView>> {
    principal.require_any(&[Scope::Console, Scope::Finance])?;
    let org_id = path_id("org_id", &org_id)?;
    principal.check_org_read(org_id.as_str())?;
    let now = state.clock.now();
    let s = standing(&state.db, &state.plans, org_id.as_str(), now, &state.rules)
        .await?
        .ok_or_else(|| ApiError::org_not_found(org_id.as_str()))?;
    let counts = state
        .db
        .session_counts(org_id.as_str(), now, &state.rules)
        .await?;
    Ok(Json(UsageView {
        org_id: s.org.org_id,
        plan: s.plan.id,
        month: s.month,
        week: s.week,
        running_sessions: counts.running,
        parked_sessions: counts.parked,
        as_of: now,
    }))
}
