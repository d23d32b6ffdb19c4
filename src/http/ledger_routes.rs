//! Heartbeats in, session end, and one session's ledger.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::openapi::{BadBody, BadId, BadQuery, Conflicting, Guarded, OrgPath, SessionPath};

use super::auth::Principal;
use super::error::parse_id;
use super::json::JsonBody;
use super::{ApiError, ApiResult, AppState};
use crate::batch::{self, Batch, BatchError};
use crate::ledger::{EndStatus, Phase, Secs};
use crate::quota::{hours, rfc3339};
use crate::store::{IngestReject, SessionRow};
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
    /// `continue` or `park`: park when the org is out of hours or the session has ended.
    action: &'static str,
    remaining_seconds: i64,
}

impl From<BatchError> for ApiError {
    fn from(e: BatchError) -> Self {
        match e {
            BatchError::Malformed(d) => d.into(),
            BatchError::Invalid { field, message } => ApiError::invalid(field, message),
            BatchError::OtherOrg { field, org_id } => {
                ApiError::org_not_found(&org_id).with_field(field)
            }
        }
    }
}

/// `POST /v1/heartbeats`: answered once every heartbeat of the batch is committed.
#[utoipa::path(post, path = "/v1/heartbeats", tag = "ledger", security(("bearer" = ["ingest", "admin"])),
    request_body = Batch,
    responses(
        (status = 200, description = "Every heartbeat committed; one result each, in order",
            body = BatchResults),
        (status = 404, description = "`org_not_found`: no such org (`field` names the heartbeat)",
            body = super::error::ErrorBody),
        Guarded, BadBody, Conflicting))]
pub async fn post_heartbeats(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(batch): JsonBody<Batch>,
) -> ApiResult<Json<BatchResults>> {
    principal.require_any(&[Scope::Ingest])?;
    let now = state.clock.now();
    let bound = bound_org(&principal);
    let heartbeats = batch::validate(batch.heartbeats, bound, now, &state.rules)?;
    let (outcomes, advice) = state
        .ingestor
        .submit(heartbeats)
        .await
        .map_err(|e| ApiError::from(e.as_ref()))?;
    let outcomes = outcomes.map_err(reject_error)?;
    let results = outcomes
        .into_iter()
        .map(|o| {
            let a = advice
                .get(&o.org_id)
                .copied()
                .unwrap_or(crate::ingest::OrgAdvice {
                    remaining_seconds: 0,
                    park: true,
                });
            HeartbeatResult {
                accepted: true,
                duplicate: o.duplicate,
                // An ended session's VM has no business running.
                action: if a.park || o.phase == Phase::Ended {
                    "park"
                } else {
                    "continue"
                },
                remaining_seconds: a.remaining_seconds,
                session_id: o.session_id,
            }
        })
        .collect();
    Ok(Json(BatchResults { results }))
}

fn reject_error(r: IngestReject) -> ApiError {
    match r {
        IngestReject::UnknownOrg { index, org_id } => {
            ApiError::org_not_found(&org_id).with_field(format!("heartbeats[{index}].org_id"))
        }
        IngestReject::SessionOfAnotherOrg { index, session_id } => ApiError::new(
            StatusCode::CONFLICT,
            "session_conflict",
            format!("session `{session_id}` belongs to another org; session ids are global"),
        )
        .with_field(format!("heartbeats[{index}].session_id")),
    }
}

/// The org an org-bound token is limited to (admin tokens are never limited).
fn bound_org(principal: &Principal) -> Option<&str> {
    if principal.has(Scope::Admin) {
        None
    } else {
        principal.org_id.as_deref()
    }
}

#[derive(Deserialize, ToSchema)]
pub struct EndBody {
    /// `completed`, `needs_review`, `cancelled`, `failed` or `expired`.
    #[schema(schema_with = super::openapi::strings::end_status)]
    status: String,
}

/// One session as every reader shows it.
#[derive(Serialize, ToSchema)]
pub struct SessionView {
    session_id: String,
    org_id: String,
    key_id: Option<String>,
    agent: Option<String>,
    project_id: Option<String>,
    started_by: Option<String>,
    vm_id: Option<String>,
    state: &'static str,
    /// Booked running time, plus a running session's time up to now.
    billed_seconds: i64,
    billed_hours: String,
    heartbeats: i64,
    /// `unadmitted`: billed without the gate's admission; `silent_gap`: spoke again after
    /// a silence past the lease (the gap is unbilled).
    flags: Vec<&'static str>,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    created_at: Secs,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    last_seen_at: Secs,
    #[serde(with = "rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    ended_at: Option<Secs>,
    end_status: Option<String>,
}

pub fn session_view(row: SessionRow, now: Secs, rules: &crate::ledger::Rules) -> SessionView {
    let led = row.ledger();
    let billed = led.billed_seconds + led.provisional(now, rules).map_or(0, |p| p.len());
    let mut flags = Vec::new();
    if row.unadmitted {
        flags.push("unadmitted");
    }
    if row.silences > 0 {
        flags.push("silent_gap");
    }
    SessionView {
        state: led.phase.as_str(),
        billed_seconds: billed,
        billed_hours: hours(billed),
        heartbeats: row.heartbeats,
        flags,
        created_at: row.created_at,
        last_seen_at: row.last_at,
        ended_at: row.ended_at,
        end_status: row.end_status,
        session_id: row.session_id,
        org_id: row.org_id,
        key_id: row.key_id,
        agent: row.agent,
        project_id: row.project_id,
        started_by: row.started_by,
        vm_id: row.vm_id,
    }
}

/// `POST /v1/sessions/{session_id}/end`: close a session; repeating it changes nothing.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/end", tag = "ledger",
    params(SessionPath), security(("bearer" = ["ingest", "admission", "admin"])), request_body = EndBody,
    responses((status = 200, description = "The session, ended", body = SessionView),
        Guarded, BadBody, BadId))]
pub async fn end_session(
    State(state): State<AppState>,
    principal: Principal,
    Path(SessionPath { session_id }): Path<SessionPath>,
    JsonBody(body): JsonBody<EndBody>,
) -> ApiResult<Json<SessionView>> {
    principal.require_any(&[Scope::Ingest, Scope::Admission])?;
    let session_id = parse_id("session_id", &session_id)?;
    let status = EndStatus::parse(&body.status).ok_or_else(|| {
        ApiError::invalid(
            "status",
            format!(
                "status must be one of completed, needs_review, cancelled, failed, expired (got `{}`)",
                body.status
            ),
        )
    })?;
    let now = state.clock.now();
    let row = state
        .db
        .end_session(
            session_id.as_str(),
            bound_org(&principal),
            status,
            now,
            &state.rules,
        )
        .await?
        .ok_or_else(|| ApiError::session_not_found(session_id.as_str()))?;
    state.metrics.session_ends.inc();
    Ok(Json(session_view(row, now, &state.rules)))
}

/// One session with its timeline.
#[derive(Serialize, ToSchema)]
pub struct SessionDetail {
    #[serde(flatten)]
    session: SessionView,
    /// Billed running time in the timeline (equals `billed_seconds`).
    running_seconds: i64,
    /// Parked time in the timeline (free).
    parked_seconds: i64,
    timeline: Vec<crate::timeline::Stretch>,
}

/// `GET /v1/sessions/{session_id}`: one session's ledger and timeline (console for its
/// org's sessions).
#[utoipa::path(get, path = "/v1/sessions/{session_id}", tag = "ledger",
    params(SessionPath), security(("bearer" = ["console", "finance", "admission", "ingest", "admin"])),
    responses((status = 200, description = "The session and its timeline", body = SessionDetail),
        Guarded, BadId))]
pub async fn get_session(
    State(state): State<AppState>,
    principal: Principal,
    Path(SessionPath { session_id }): Path<SessionPath>,
) -> ApiResult<Json<SessionDetail>> {
    principal.require_any(&[
        Scope::Console,
        Scope::Finance,
        Scope::Admission,
        Scope::Ingest,
    ])?;
    let session_id = parse_id("session_id", &session_id)?;
    let row = state
        .db
        .get_session(session_id.as_str())
        .await?
        .filter(|r| bound_org(&principal).is_none_or(|o| o == r.org_id))
        .ok_or_else(|| ApiError::session_not_found(session_id.as_str()))?;
    let now = state.clock.now();
    let closed = state.db.session_spans(&row.org_id, &row.session_id).await?;
    let timeline = crate::timeline::timeline(&closed, &row.ledger(), now, &state.rules);
    Ok(Json(SessionDetail {
        running_seconds: crate::timeline::seconds_of(&timeline, "running"),
        parked_seconds: crate::timeline::seconds_of(&timeline, "parked"),
        timeline,
        session: session_view(row, now, &state.rules),
    }))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SessionsQuery {
    /// Default all.
    #[param(schema_with = super::openapi::strings::phase)]
    state: Option<String>,
    /// Sessions created at or after; default all.
    #[param(format = DateTime)]
    from: Option<String>,
    /// Exclusive; default now.
    #[param(format = DateTime)]
    to: Option<String>,
    /// `next_cursor` of the page before.
    cursor: Option<String>,
    /// 1 to 1000; default 100.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
}

/// A page of sessions.
#[derive(Serialize, ToSchema)]
pub struct SessionPage {
    sessions: Vec<SessionView>,
    /// Pass as `cursor` for the next page; `null` on the last one.
    next_cursor: Option<String>,
}

pub(crate) const PHASES: [&str; 5] = ["admitted", "running", "parked", "silent", "ended"];

/// `GET /v1/orgs/{org_id}/sessions?state=&from=&to=&cursor=&limit=`: an org's sessions
/// created in `[from, to)` (default: all), oldest first, 100 a page (at most 1,000).
#[utoipa::path(get, path = "/v1/orgs/{org_id}/sessions", tag = "ledger",
    security(("bearer" = ["console", "finance", "admin"])),
    params(OrgPath, SessionsQuery),
    responses((status = 200, description = "A page of sessions, oldest first", body = SessionPage),
        Guarded, BadQuery, BadId))]
pub async fn list_sessions(
    State(state): State<AppState>,
    principal: Principal,
    Path(OrgPath { org_id }): Path<OrgPath>,
    query: Result<axum::extract::Query<SessionsQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<SessionPage>> {
    principal.require_any(&[Scope::Console, Scope::Finance])?;
    let org_id = parse_id("org_id", &org_id)?;
    principal.check_org_read(org_id.as_str())?;
    let axum::extract::Query(q) = query.map_err(|e| ApiError::malformed(e.body_text()))?;
    if let Some(s) = q.state.as_deref().filter(|s| !PHASES.contains(s)) {
        return Err(ApiError::invalid(
            "state",
            format!("state must be one of {} (got `{s}`)", PHASES.join(", ")),
        ));
    }
    let time = |name: &str, v: &Option<String>| {
        v.as_deref()
            .map(|t| rfc3339::parse(t).map_err(|m| ApiError::invalid(name, m)))
            .transpose()
    };
    let now = state.clock.now();
    let to = time("to", &q.to)?.unwrap_or(now + 1);
    let from = time("from", &q.from)?.unwrap_or(0);
    if from >= to {
        return Err(ApiError::invalid("from", "from must be before to"));
    }
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid("limit", "limit must be 1 to 1000"));
    }
    let after = q
        .cursor
        .as_deref()
        .map(super::admissions::parse_cursor)
        .transpose()?;
    if state.db.get_org(org_id.as_str()).await?.is_none() {
        return Err(ApiError::org_not_found(org_id.as_str()));
    }
    let rows = state
        .db
        .list_sessions(org_id.as_str(), q.state.as_deref(), from, to, after, limit)
        .await?;
    let next_cursor = (rows.len() as i64 == limit)
        .then(|| {
            rows.last()
                .map(|r| format!("{}.{}", r.created_at, r.session_id))
        })
        .flatten();
    let sessions: Vec<SessionView> = rows
        .into_iter()
        .map(|r| session_view(r, now, &state.rules))
        .collect();
    Ok(Json(SessionPage {
        sessions,
        next_cursor,
    }))
}
