//! Heartbeats in (`POST /v1/heartbeats`), answered once every one is committed.

use axum::extract::State;
use axum::Json;
use rush_meter_core::heartbeats::{self, Batch};
use rush_meter_core::ledger::Phase;
use rush_meter_core::time::Secs;
use serde::Serialize;
use utoipa::ToSchema;

use crate::app::ingest::OrgAdvice;
use crate::http::auth::Principal;
use crate::http::extract::JsonBody;
use crate::http::openapi::{BadBody, Conflicting, Guarded};
use crate::http::{ApiError, ApiResult, AppState};
use crate::tokens::Scope;

#[derive(Serialize, ToSchema)]
pub struct BatchResults {
    results: Vec<HeartbeatResult>,
}

#[derive(Serialize, ToSchema)]
pub struct HeartbeatResult {
    session_id: String,
    accepted: bool,
    /// This heartbeat changed nothing: its `seq` was seen (or overtaken) before, or the
    /// session has ended.
    duplicate: bool,
    /// `continue` or `park`: park when the org is out of hours, a limit on the session's
    /// user, project or key is spent (and the plan's grace has run past it), or the
    /// session has ended.
    action: &'static str,
    /// Seconds left to the org, or to the session's user, project or key if a limit on
    /// one of them leaves less.
    remaining_seconds: i64,
    /// Why it parks for want of room (`monthly_ceiling`, `weekly_ceiling`, `grants_spent`,
    /// `spend_cap`, `member_limit`); `null` when it goes on, or parks for having ended.
    #[schema(value_type = Option<String>)]
    park_reason: Option<&'static str>,
    /// When a window's reset brings the org's plan room back, if that is what will (a
    /// grant, a top-up, a higher cap or another plan may bring it sooner); `null`
    /// otherwise.
    #[serde(with = "rush_meter_core::time::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    resume_at: Option<Secs>,
}

/// `POST /v1/heartbeats`: answered once every heartbeat of the batch is committed.
#[utoipa::path(post, path = "/v1/heartbeats", tag = "ledger", security(("bearer" = ["ingest", "admin"])),
    request_body = Batch,
    responses(
        (status = 200, description = "Every heartbeat committed; one result each, in order",
            body = BatchResults),
        (status = 404, description = "`org_not_found`: no such org (`field` names the heartbeat)",
            body = crate::http::error::ErrorBody),
        Guarded, BadBody, Conflicting))]
pub async fn post_heartbeats(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(batch): JsonBody<Batch>,
) -> ApiResult<Json<BatchResults>> {
    principal.require_any(&[Scope::Ingest])?;
    let now = state.clock.now();
    let bound = principal.bound_org();
    let heartbeats = heartbeats::validate(batch.heartbeats, bound, now, &state.rules)?;
    let (outcomes, advice) = state
        .ingestor
        .submit(heartbeats)
        .await
        .map_err(|e| ApiError::from(e.as_ref()))?;
    let outcomes = outcomes?;
    let results = outcomes
        .into_iter()
        .map(|o| {
            let a = advice
                .get(&o.org_id)
                .map_or(&OrgAdvice::NONE, |a| a)
                .for_session(&o.members);
            // An ended session's VM has no business running, for want of room or not.
            let ended = o.phase == Phase::Ended;
            HeartbeatResult {
                accepted: true,
                duplicate: o.duplicate,
                action: if a.park || ended { "park" } else { "continue" },
                remaining_seconds: a.remaining_seconds,
                park_reason: a.reason.filter(|_| !ended).map(|r| r.as_str()),
                resume_at: a.resume_at.filter(|_| !ended),
                session_id: o.session_id,
            }
        })
        .collect();
    Ok(Json(BatchResults { results }))
}
