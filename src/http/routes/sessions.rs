//! Sessions: one session's ledger and timeline, an org's sessions, and ending one.

use axum::extract::{Path, State};
use axum::Json;
use rush_meter_core::gate::Agent;
use rush_meter_core::ledger::{EndStatus, Phase, Rules};
use rush_meter_core::named;
use rush_meter_core::session::Session;
use rush_meter_core::time::{hours, rfc3339, Secs};
use rush_meter_core::timeline;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::http::auth::Principal;
use crate::http::error::{parse_id, parse_named};
use crate::http::extract::{
    named_param, time_range, JsonBody, OrgPath, OrgReader, OrgSessionPath, Page, Query, SessionPath,
};
use crate::http::openapi::{BadBody, BadId, BadQuery, Guarded};
use crate::http::{ApiResult, AppState};
use crate::tokens::Scope;

#[derive(Deserialize, ToSchema)]
pub struct EndBody {
    #[schema(value_type = EndStatus)]
    status: String,
}

named! {
    /// What a reader should know of a session beyond its state.
    pub enum SessionFlag {
        /// Billed without the gate's admission.
        Unadmitted = "unadmitted",
        /// Spoke again after a silence past the lease (the gap is unbilled).
        SilentGap = "silent_gap",
    }
}

/// One session as every reader shows it.
#[derive(Serialize, ToSchema)]
pub struct SessionView {
    session_id: String,
    org_id: String,
    key_id: Option<String>,
    #[schema(value_type = Option<Agent>)]
    agent: Option<String>,
    project_id: Option<String>,
    started_by: Option<String>,
    vm_id: Option<String>,
    state: Phase,
    /// Booked running time, plus a running session's time up to now.
    billed_seconds: i64,
    billed_hours: String,
    heartbeats: i64,
    /// What a reader should know beyond `state` (`SessionFlag` says what each means).
    flags: Vec<SessionFlag>,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    created_at: Secs,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    last_seen_at: Secs,
    #[serde(with = "rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    ended_at: Option<Secs>,
    end_status: Option<EndStatus>,
}

pub fn session_view(row: Session, now: Secs, rules: &Rules) -> SessionView {
    let led = &row.ledger;
    let billed = led.billed_seconds + led.provisional(now, rules).map_or(0, |p| p.len());
    let mut flags = Vec::new();
    if row.unadmitted {
        flags.push(SessionFlag::Unadmitted);
    }
    if led.silences > 0 {
        flags.push(SessionFlag::SilentGap);
    }
    SessionView {
        state: led.phase,
        billed_seconds: billed,
        billed_hours: hours(billed),
        heartbeats: led.heartbeats,
        flags,
        created_at: row.created_at,
        last_seen_at: led.last_at,
        ended_at: led.ended_at,
        end_status: led.end_status,
        session_id: row.session_id,
        org_id: row.org_id,
        key_id: row.key_id,
        agent: row.agent,
        project_id: row.project_id,
        started_by: row.started_by,
        vm_id: row.vm_id,
    }
}

/// The scopes that may end a session.
const ENDERS: [Scope; 2] = [Scope::Ingest, Scope::Admission];
/// The scopes that may read one session.
const READERS: [Scope; 4] = [
    Scope::Console,
    Scope::Finance,
    Scope::Admission,
    Scope::Ingest,
];

/// End `org`'s session (`None`: the one org with a session of that id, or the token's).
async fn end(
    state: &AppState,
    principal: &Principal,
    org: Option<&str>,
    session_id: &str,
    body: EndBody,
) -> ApiResult<Json<SessionView>> {
    let session_id = parse_id("session_id", session_id)?;
    let status = parse_named("status", &body.status, EndStatus::parse_named)?;
    let org = state
        .org_of_session(org.or(principal.bound_org()), session_id.as_str())
        .await?;
    let row = state.end_session(&org, session_id.as_str(), status).await?;
    Ok(Json(session_view(row, state.clock.now(), &state.rules)))
}

/// `POST /v1/orgs/{org_id}/sessions/{session_id}/end`: close the org's session; repeating
/// it changes nothing.
#[utoipa::path(post, path = "/v1/orgs/{org_id}/sessions/{session_id}/end", tag = "ledger",
    params(OrgSessionPath), security(("bearer" = ["ingest", "admission", "admin"])), request_body = EndBody,
    responses((status = 200, description = "The session, ended", body = SessionView),
        Guarded, BadBody, BadId))]
pub async fn end_org_session(
    State(state): State<AppState>,
    principal: Principal,
    Path(OrgSessionPath { org_id, session_id }): Path<OrgSessionPath>,
    JsonBody(body): JsonBody<EndBody>,
) -> ApiResult<Json<SessionView>> {
    principal.require_any(&ENDERS)?;
    let org_id = parse_id("org_id", &org_id)?;
    principal.check_org(org_id.as_str())?;
    end(&state, &principal, Some(org_id.as_str()), &session_id, body).await
}

/// `POST /v1/sessions/{session_id}/end`, deprecated: `POST
/// /v1/orgs/{org_id}/sessions/{session_id}/end`, as a session id is its org's own. Ends
/// the token's org's session, or the one org's with that id (409 `session_conflict` when
/// several orgs have one).
#[utoipa::path(post, path = "/v1/sessions/{session_id}/end", tag = "ledger",
    params(SessionPath), security(("bearer" = ["ingest", "admission", "admin"])), request_body = EndBody,
    responses((status = 200, description = "The session, ended", body = SessionView),
        (status = 409, description = "`session_conflict`: several orgs have a session of this id; name the org",
            body = crate::http::error::ErrorBody),
        Guarded, BadBody, BadId))]
#[deprecated = "name the org: POST /v1/orgs/{org_id}/sessions/{session_id}/end"]
pub async fn end_session(
    State(state): State<AppState>,
    principal: Principal,
    Path(SessionPath { session_id }): Path<SessionPath>,
    JsonBody(body): JsonBody<EndBody>,
) -> ApiResult<Json<SessionView>> {
    principal.require_any(&ENDERS)?;
    end(&state, &principal, None, &session_id, body).await
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
    timeline: Vec<timeline::Stretch>,
}

/// `org`'s session with its timeline (`None`: the one org with a session of that id, or
/// the token's).
async fn detail(
    state: &AppState,
    principal: &Principal,
    org: Option<&str>,
    session_id: &str,
) -> ApiResult<Json<SessionDetail>> {
    let session_id = parse_id("session_id", session_id)?;
    let org = state
        .org_of_session(org.or(principal.bound_org()), session_id.as_str())
        .await?;
    let (row, closed) = state.session_with_spans(&org, session_id.as_str()).await?;
    let now = state.clock.now();
    let timeline = timeline::timeline(&closed, &row.ledger, now, &state.rules);
    Ok(Json(SessionDetail {
        running_seconds: timeline::seconds_of(&timeline, "running"),
        parked_seconds: timeline::seconds_of(&timeline, "parked"),
        timeline,
        session: session_view(row, now, &state.rules),
    }))
}

/// `GET /v1/orgs/{org_id}/sessions/{session_id}`: one session's ledger and timeline
/// (console for its org's sessions).
#[utoipa::path(get, path = "/v1/orgs/{org_id}/sessions/{session_id}", tag = "ledger",
    params(OrgSessionPath), security(("bearer" = ["console", "finance", "admission", "ingest", "admin"])),
    responses((status = 200, description = "The session and its timeline", body = SessionDetail),
        Guarded, BadId))]
pub async fn get_org_session(
    State(state): State<AppState>,
    principal: Principal,
    Path(OrgSessionPath { org_id, session_id }): Path<OrgSessionPath>,
) -> ApiResult<Json<SessionDetail>> {
    principal.require_any(&READERS)?;
    let org_id = parse_id("org_id", &org_id)?;
    principal.check_org(org_id.as_str())?;
    detail(&state, &principal, Some(org_id.as_str()), &session_id).await
}

/// `GET /v1/sessions/{session_id}`, deprecated: `GET
/// /v1/orgs/{org_id}/sessions/{session_id}`, as a session id is its org's own. Reads the
/// token's org's session, or the one org's with that id (409 `session_conflict` when
/// several orgs have one).
#[utoipa::path(get, path = "/v1/sessions/{session_id}", tag = "ledger",
    params(SessionPath), security(("bearer" = ["console", "finance", "admission", "ingest", "admin"])),
    responses((status = 200, description = "The session and its timeline", body = SessionDetail),
        (status = 409, description = "`session_conflict`: several orgs have a session of this id; name the org",
            body = crate::http::error::ErrorBody),
        Guarded, BadId))]
#[deprecated = "name the org: GET /v1/orgs/{org_id}/sessions/{session_id}"]
pub async fn get_session(
    State(state): State<AppState>,
    principal: Principal,
    Path(SessionPath { session_id }): Path<SessionPath>,
) -> ApiResult<Json<SessionDetail>> {
    principal.require_any(&READERS)?;
    detail(&state, &principal, None, &session_id).await
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SessionsQuery {
    /// Only sessions in this phase; default all.
    #[param(value_type = Option<Phase>)]
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

/// `GET /v1/orgs/{org_id}/sessions?state=&from=&to=&cursor=&limit=`: an org's sessions
/// created in `[from, to)` (default: all), oldest first, 100 a page (at most 1,000).
#[utoipa::path(get, path = "/v1/orgs/{org_id}/sessions", tag = "ledger",
    security(("bearer" = ["console", "finance", "admin"])),
    params(OrgPath, SessionsQuery),
    responses((status = 200, description = "A page of sessions, oldest first", body = SessionPage),
        Guarded, BadQuery, BadId))]
pub async fn list_sessions(
    State(state): State<AppState>,
    OrgReader { org_id, .. }: OrgReader,
    query: Query<SessionsQuery>,
) -> ApiResult<Json<SessionPage>> {
    let q = query.read()?;
    let phase = named_param("state", q.state.as_deref(), Phase::parse_named)?;
    let now = state.clock.now();
    let (from, to) = time_range(q.from.as_deref(), q.to.as_deref(), now + 1, |_| 0)?;
    let page = Page::of(q.cursor.as_deref(), q.limit)?;
    let rows = state
        .sessions(org_id.as_str(), phase, page.slice(from, to))
        .await?;
    let next_cursor = page.next(&rows, |r| (r.created_at, r.session_id.as_str()));
    let sessions: Vec<SessionView> = rows
        .into_iter()
        .map(|r| session_view(r, now, &state.rules))
        .collect();
    Ok(Json(SessionPage {
        sessions,
        next_cursor,
    }))
}
