//! The gate (`POST /v1/admissions`) and its record (`GET /v1/orgs/{org_id}/decisions`).

use axum::extract::State;
use axum::Json;
use rush_meter_core::funding::Source;
use rush_meter_core::gate::{AdmissionRequest, Agent, Decision, Reason, Rule, Verdict};
use rush_meter_core::ids::Id;
use rush_meter_core::members::LimitKind;
use rush_meter_core::standing::WindowUsage;
use rush_meter_core::time::{rfc3339, Interval, Secs};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::http::auth::Principal;
use crate::http::error::{parse_id, parse_named};
use crate::http::extract::{named_param, time_range, JsonBody, OrgPath, OrgReader, Page, Query};
use crate::http::openapi::{BadBody, BadId, BadQuery, Conflicting, Guarded};
use crate::http::{ApiError, ApiResult, AppState};
use crate::tokens::Scope;

#[derive(Deserialize, ToSchema)]
pub struct AdmissionBody {
    #[schema(schema_with = crate::http::openapi::strings::id)]
    org_id: String,
    /// The API key that starts the run; its concurrency limit applies.
    #[schema(schema_with = crate::http::openapi::strings::id)]
    key_id: String,
    /// Global; resuming a parked session uses its id again.
    #[schema(schema_with = crate::http::openapi::strings::id)]
    session_id: String,
    #[schema(value_type = Agent)]
    agent: String,
    #[schema(schema_with = crate::http::openapi::strings::id_or_null)]
    project_id: Option<String>,
    /// The user who started the run.
    #[schema(schema_with = crate::http::openapi::strings::id_or_null)]
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
    reason: Reason,
}

/// A decision as the orchestrator and support read it.
#[derive(Serialize, ToSchema)]
pub struct DecisionView {
    decision_id: String,
    decision: Verdict,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<Reason>,
    /// The rule that decided: `within_limits`, `already_admitted`, or the reason.
    #[serde(serialize_with = "rule_name")]
    #[schema(schema_with = crate::http::openapi::strings::rule, value_type = String)]
    rule: Rule,
    session_id: String,
    key_id: String,
    plan: String,
    /// The version of the plan it was decided on.
    plan_version: i64,
    suspended: bool,
    usage: Windows,
    concurrency: Concurrency,
    #[serde(skip_serializing_if = "Option::is_none")]
    upgrade: Option<Upgrade>,
    /// What pays for an allowed run: `plan`, `grant` or `overage`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::http::openapi::strings::funded_by, value_type = String)]
    funded_by: Option<Source>,
    /// What each source had left when this was decided, running sessions counted.
    remaining: Remaining,
    /// The org's limit on the run's user, project or key that refused it
    /// (`user_ceiling_reached`, `project_ceiling_reached`, `key_ceiling_reached`).
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<MemberLimitView>,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    as_of: Secs,
}

/// Seconds each source had left.
#[derive(Serialize, ToSchema)]
pub struct Remaining {
    /// The plan, before the first of its month and week ceilings.
    plan_seconds: i64,
    /// Grants in force.
    grant_seconds: i64,
    /// Pay-as-you-go, up to its monthly cap (0 while off).
    overage_seconds: i64,
}

/// A limit inside the org and what its member had used, running sessions counted.
#[derive(Serialize, ToSchema)]
pub struct MemberLimitView {
    kind: LimitKind,
    member_id: String,
    month_used_seconds: i64,
    /// `null`: no monthly limit.
    month_limit_seconds: Option<i64>,
    week_used_seconds: i64,
    /// `null`: no weekly limit.
    week_limit_seconds: Option<i64>,
}

/// A rule as its name (`Rule::as_str`).
fn rule_name<S: serde::Serializer>(rule: &Rule, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(rule.as_str())
}

fn window(start: Secs, end: Secs, used: i64, limit: i64) -> WindowUsage {
    WindowUsage::new(Interval { start, end }, used, limit)
}

impl From<Decision> for DecisionView {
    fn from(d: Decision) -> Self {
        DecisionView {
            usage: Windows {
                month: window(d.month_start, d.month_end, d.month_used, d.month_limit),
                week: window(d.week_start, d.week_end, d.week_used, d.week_limit),
            },
            concurrency: Concurrency {
                running: d.running,
                limit: d.concurrency_limit,
            },
            upgrade: d
                .upgrade_plan
                .zip(d.reason)
                .map(|(plan, reason)| Upgrade { plan, reason }),
            funded_by: d.funded_by,
            remaining: Remaining {
                plan_seconds: d.plan_room,
                grant_seconds: d.grant_room,
                overage_seconds: d.overage_room,
            },
            limit: d.limit.map(|l| MemberLimitView {
                kind: l.kind,
                member_id: l.member_id,
                month_used_seconds: l.month_used,
                month_limit_seconds: l.month_limit,
                week_used_seconds: l.week_used,
                week_limit_seconds: l.week_limit,
            }),
            decision_id: d.decision_id,
            decision: d.decision,
            reason: d.reason,
            rule: d.rule,
            session_id: d.session_id,
            key_id: d.key_id,
            plan: d.plan_id,
            plan_version: d.plan_version,
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
            body = crate::http::error::ErrorBody),
        Guarded, BadBody, Conflicting))]
pub async fn post_admission(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody<AdmissionBody>,
) -> ApiResult<Json<DecisionView>> {
    principal.require_any(&[Scope::Admission])?;
    let org_id = parse_id("org_id", &body.org_id)?;
    tracing::Span::current().record("org_id", org_id.as_str());
    let key_id = parse_id("key_id", &body.key_id)?;
    let session_id = parse_id("session_id", &body.session_id)?;
    let agent = parse_named("agent", &body.agent, Agent::parse_named)?;
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
        agent,
        project_id: project_id.map(Id::into_string),
        started_by: started_by.map(Id::into_string),
    };
    let decision = state
        .admitter
        .submit(req.clone())
        .await
        .map_err(|e| ApiError::from(e.as_ref()))?
        .map_err(|r| ApiError::admit_reject(r, &req))?;
    state.metrics.observe_decision(
        decision.decision.as_str(),
        decision.reason.map(Reason::as_str),
    );
    Ok(Json(decision.into()))
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
    /// Only this decision; default both.
    #[param(value_type = Option<Verdict>)]
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
    OrgReader { org_id, .. }: OrgReader,
    query: Query<DecisionsQuery>,
) -> ApiResult<Json<DecisionPage>> {
    let q = query.read()?;
    let (from, to) = time_range(
        q.from.as_deref(),
        q.to.as_deref(),
        state.clock.now() + 1,
        |to| to - 30 * 86_400,
    )?;
    let only = named_param("decision", q.decision.as_deref(), Verdict::parse_named)?;
    let page = Page::of(q.cursor.as_deref(), q.limit)?;
    let rows = state
        .decisions(org_id.as_str(), only, page.slice(from, to))
        .await?;
    let next_cursor = page.next(&rows, |r| (r.decided_at, r.decision_id.as_str()));
    Ok(Json(DecisionPage {
        decisions: rows.into_iter().map(DecisionView::from).collect(),
        next_cursor,
    }))
}
