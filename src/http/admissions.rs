//! The gate (`POST /v1/admissions`) and its record (`GET /v1/orgs/{org_id}/decisions`).

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::openapi::{BadBody, BadId, BadQuery, Conflicting, Guarded, OrgPath};

use super::auth::Principal;
use super::error::parse_id;
use super::json::JsonBody;
use super::{ApiError, ApiResult, AppState};
use crate::ids::Id;
use crate::ledger::{Interval, Secs};
use crate::quota::{rfc3339, WindowUsage};
use crate::store::{AdmissionRequest, AdmitReject, DecisionRow};
use crate::tokens::Scope;

pub const AGENTS: [&str; 3] = ["claude", "codex", "opencode"];

#[derive(Deserialize, ToSchema)]
pub struct AdmissionBody {
    #[schema(schema_with = super::openapi::strings::id)]
    org_id: String,
    /// The API key that starts the run; its concurrency limit applies.
    #[schema(schema_with = super::openapi::strings::id)]
    key_id: String,
    /// Global; resuming a parked session uses its id again.
    #[schema(schema_with = super::openapi::strings::id)]
    session_id: String,
    #[schema(schema_with = super::openapi::strings::agent)]
    agent: String,
    #[schema(schema_with = super::openapi::strings::id_or_null)]
    project_id: Option<String>,
    /// The user who started the run.
    #[schema(schema_with = super::openapi::strings::id_or_null)]
    started_by: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct Windows {
    month: WindowUsage,
    week: WindowUsage,
}

#[derive(Serialize, ToSchema)]
pub struct Concurrency {
    running: i64,
    limit: i64,
}

#[derive(Serialize, ToSchema)]
pub struct Upgrade {
    plan: String,
    reason: String,
}

/// A decision as the orchestrator and support read it.
#[derive(Serialize, ToSchema)]
pub struct DecisionView {
    decision_id: String,
    decision: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    /// The rule that decided: `within_limits`, `already_admitted`, or the reason.
    rule: String,
    session_id: String,
    key_id: String,
    plan: String,
    suspended: bool,
    usage: Windows,
    concurrency: Concurrency,
    #[serde(skip_serializing_if = "Option::is_none")]
    upgrade: Option<Upgrade>,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    as_of: Secs,
}

fn window(start: Secs, end: Secs, used: i64, limit: i64) -> WindowUsage {
    WindowUsage::new(Interval { start, end }, used, limit)
}

impl From<DecisionRow> for DecisionView {
    fn from(d: DecisionRow) -> Self {
        DecisionView {
            usage: Windows {
                month: window(d.month_start, d.month_end, d.month_used, d.month_limit),
                week: window(d.week_start, d.week_end, d.week_used, d.week_limit),
            },
            concurrency: Concurrency {
                running: d.running,
                limit: d.concurrency_limit,
            },
            upgrade: d.upgrade_plan.map(|plan| Upgrade {
                plan,
                reason: d.reason.clone().unwrap_or_default(),
            }),
            decision_id: d.decision_id,
            decision: d.decision,
            reason: d.reason,
            rule: d.rule,
            session_id: d.session_id,
            key_id: d.key_id,
            plan: d.plan_id,
            suspended: d.suspended,
            as_of: d.decided_at,
        }
    }
}

/// `POST /v1/admissions`: allow or deny, with the figures it was decided from. A denial is
/// a 200 with a decision.
#[utoipa::path(post, path = "/v1/admissions", tag = "gate", security(("bearer" = ["admission", "admin"])),
    request_body = AdmissionBody,
    responses(
        (status = 200, description = "The decision, allow or deny, and what it was decided from",
            body = DecisionView),
        (status = 404, description = "`org_not_found` or `key_not_found`: register them first",
            body = super::error::ErrorBody),
        Guarded, BadBody, Conflicting))]
pub async fn post_admission(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody<AdmissionBody>,
) -> ApiResult<Json<DecisionView>> {
    principal.require_any(&[Scope::Admission])?;
    let org_id = parse_id("org_id", &body.org_id)?;
    let key_id = parse_id("key_id", &body.key_id)?;
    let session_id = parse_id("session_id", &body.session_id)?;
    if !AGENTS.contains(&body.agent.as_str()) {
        return Err(ApiError::invalid(
            "agent",
            format!(
                "agent must be one of claude, codex, opencode (got `{}`)",
                body.agent
            ),
        ));
    }
    let project_id = body
        .project_id
        .as_deref()
        .map(|p| parse_id("project_id", p))
        .transpose()?;
    let started_by = body
        .started_by
        .as_deref()
        .map(|p| parse_id("started_by", p))
        .transpose()?;
    principal.check_org(org_id.as_str())?;
    let req = AdmissionRequest {
        org_id: org_id.to_string(),
        key_id: key_id.to_string(),
        session_id: session_id.to_string(),
        agent: body.agent,
        project_id: project_id.map(Id::into_string),
        started_by: started_by.map(Id::into_string),
    };
    let decision = state
        .admitter
        .submit(req.clone())
        .await
        .map_err(|e| ApiError::from(e.as_ref()))?
        .map_err(|r| reject_error(r, &req))?;
    state
        .metrics
        .observe_decision(&decision.decision, decision.reason.as_deref());
    Ok(Json(decision.into()))
}

fn reject_error(r: AdmitReject, req: &AdmissionRequest) -> ApiError {
    match r {
        AdmitReject::UnknownOrg => ApiError::org_not_found(&req.org_id).with_field("org_id"),
        AdmitReject::UnknownKey => ApiError::new(
            StatusCode::NOT_FOUND,
            "key_not_found",
            format!(
                "no key `{}` in org `{}`; register it with PUT /v1/orgs/{}/keys/{}",
                req.key_id, req.org_id, req.org_id, req.key_id
            ),
        )
        .with_field("key_id"),
        AdmitReject::SessionOfAnotherOrg => ApiError::new(
            StatusCode::CONFLICT,
            "session_conflict",
            format!(
                "session `{}` belongs to another org; session ids are global",
                req.session_id
            ),
        )
        .with_field("session_id"),
        AdmitReject::SessionEnded => ApiError::new(
            StatusCode::CONFLICT,
            "session_ended",
            format!(
                "session `{}` has ended; start a new session id",
                req.session_id
            ),
        )
        .with_field("session_id"),
    }
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DecisionsQuery {
    /// Default `to` less 30 days.
    #[param(format = DateTime)]
    from: Option<String>,
    /// Exclusive; default now.
    #[param(format = DateTime)]
    to: Option<String>,
    /// Default both.
    #[param(schema_with = super::openapi::strings::decision)]
    decision: Option<String>,
    /// `next_cursor` of the page before.
    cursor: Option<String>,
    /// 1 to 1000; default 100.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
}

#[derive(Serialize, ToSchema)]
pub struct DecisionPage {
    decisions: Vec<DecisionView>,
    /// Pass as `cursor` for the next page; `null` on the last one.
    next_cursor: Option<String>,
}

/// `GET /v1/orgs/{org_id}/decisions?from=&to=&decision=deny&cursor=&limit=`: the gate's
/// decisions for an org, oldest first, 100 a page by default (at most 1,000). Without
/// `from`/`to`, the last 30 days.
#[utoipa::path(get, path = "/v1/orgs/{org_id}/decisions", tag = "gate",
    security(("bearer" = ["console", "finance", "admin"])),
    params(OrgPath, DecisionsQuery),
    responses((status = 200, description = "A page of decisions, oldest first", body = DecisionPage),
        Guarded, BadQuery, BadId))]
pub async fn list_decisions(
    State(state): State<AppState>,
    principal: Principal,
    Path(OrgPath { org_id }): Path<OrgPath>,
    query: Result<Query<DecisionsQuery>, QueryRejection>,
) -> ApiResult<Json<DecisionPage>> {
    principal.require_any(&[Scope::Console, Scope::Finance])?;
    let org_id = parse_id("org_id", &org_id)?;
    principal.check_org_read(org_id.as_str())?;
    let Query(q) = query.map_err(|e| ApiError::malformed(e.body_text()))?;
    let time = |name: &str, v: &Option<String>| {
        v.as_deref()
            .map(|t| rfc3339::parse(t).map_err(|m| ApiError::invalid(name, m)))
            .transpose()
    };
    let to = time("to", &q.to)?.unwrap_or_else(|| state.clock.now() + 1);
    let from = time("from", &q.from)?.unwrap_or(to - 30 * 86_400);
    if from >= to {
        return Err(ApiError::invalid("from", "from must be before to"));
    }
    let only = match q.decision.as_deref() {
        None => None,
        Some(d @ ("allow" | "deny")) => Some(d),
        Some(other) => {
            return Err(ApiError::invalid(
                "decision",
                format!("decision must be allow or deny (got `{other}`)"),
            ))
        }
    };
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid("limit", "limit must be 1 to 1000"));
    }
    let after = q.cursor.as_deref().map(parse_cursor).transpose()?;
    if state.db.get_org(org_id.as_str()).await?.is_none() {
        return Err(ApiError::org_not_found(org_id.as_str()));
    }
    let rows = state
        .db
        .list_decisions(org_id.as_str(), from, to, only, after, limit)
        .await?;
    let next_cursor = (rows.len() as i64 == limit)
        .then(|| {
            rows.last()
                .map(|r| format!("{}.{}", r.decided_at, r.decision_id))
        })
        .flatten();
    Ok(Json(DecisionPage {
        decisions: rows.into_iter().map(DecisionView::from).collect(),
        next_cursor,
    }))
}

/// A `time.id` cursor as this service gives them out.
pub(super) fn parse_cursor(c: &str) -> ApiResult<(Secs, String)> {
    c.split_once('.')
        .and_then(|(t, id)| Some((t.parse().ok()?, id.to_owned())))
        .ok_or_else(|| ApiError::invalid("cursor", "cursor is not one this service gave out"))
}
