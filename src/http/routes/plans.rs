//! Plan versions (admin): which there are, and moving orgs between them.

use axum::extract::{Path, State};
use axum::Json;
use rush_meter_core::versions::{MovePreview, When};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::app::plan_versions::Migration;
use crate::http::auth::Principal;
use crate::http::error::parse_id;
use crate::http::extract::{id_param, JsonBody};
use crate::http::openapi::{BadBody, BadId, Guarded};
use crate::http::views::PlanView;
use crate::http::{ApiError, ApiResult, AppState};
use crate::tokens::Scope;

/// One version of a plan.
#[derive(Serialize, ToSchema)]
pub struct PlanVersionView {
    #[serde(flatten)]
    plan: PlanView,
    /// The newest version of its plan: what new orgs, subscriptions and upgrades get.
    newest: bool,
    concurrency_default: i64,
    stripe_prices: Vec<String>,
    /// Orgs on it now or moving to it.
    orgs: i64,
}

/// `GET /v1/plans`: every version of every plan, with the orgs on each (admin).
#[utoipa::path(get, path = "/v1/plans", tag = "plans", security(("bearer" = ["admin"])),
    responses((status = 200, description = "Every version of every plan, by id then version",
        body = [PlanVersionView]), Guarded))]
pub async fn list_plans(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<Json<Vec<PlanVersionView>>> {
    principal.require_any(&[Scope::Admin])?;
    principal.require_unbound("the list of plan versions, with their orgs,")?;
    let counts = state.db.orgs_by_version(state.clock.now()).await?;
    let views = state
        .plans
        .all_versions()
        .map(|p| PlanVersionView {
            newest: state
                .plans
                .get(&p.id)
                .is_some_and(|n| n.version == p.version),
            orgs: counts
                .iter()
                .find(|(id, v, _)| *id == p.id && *v == p.version)
                .map_or(0, |c| c.2),
            plan: PlanView::of(p),
            concurrency_default: p.concurrency_default,
            stripe_prices: p.stripe_prices.clone(),
        })
        .collect();
    Ok(Json(views))
}

#[derive(Deserialize)]
pub struct PlanPath {
    pub plan_id: String,
}

impl IntoParams for PlanPath {
    fn into_params(
        _: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        vec![id_param("plan_id", "The plan's id (`plans/*.toml`)")]
    }
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MigrationBody {
    /// The version the orgs are on.
    #[schema(minimum = 1)]
    from: i64,
    /// The version they go to (the one they are on: a waiting move is called off).
    #[schema(minimum = 1)]
    to: i64,
    /// Only this org; default every org on `from`.
    org_id: Option<String>,
    /// `renewal` (with each org's next billing period), `now` (at its next decision, the
    /// window's use carried over) or an RFC 3339 time.
    #[schema(example = "renewal")]
    at: String,
    /// List what would move, and move nothing.
    #[serde(default)]
    dry_run: bool,
}

#[derive(Serialize, ToSchema)]
pub struct MigrationView {
    dry_run: bool,
    /// Each org moved (or that would be), by id, with its room on both versions.
    moves: Vec<MovePreview>,
}

/// `POST /v1/plans/{plan_id}/migrations`: move orgs between versions of a plan, each move
/// audited; with `dry_run`, only say which would move (admin).
#[utoipa::path(post, path = "/v1/plans/{plan_id}/migrations", tag = "plans", params(PlanPath),
    security(("bearer" = ["admin"])), request_body = MigrationBody,
    responses((status = 200, description = "The orgs moved, or that would be", body = MigrationView),
        Guarded, BadBody, BadId))]
pub async fn post_migration(
    State(state): State<AppState>,
    principal: Principal,
    Path(PlanPath { plan_id }): Path<PlanPath>,
    JsonBody(body): JsonBody<MigrationBody>,
) -> ApiResult<Json<MigrationView>> {
    principal.require_any(&[Scope::Admin])?;
    // A move of every org on a version: a token bound to one org may not make it.
    principal.require_unbound("moving orgs between plan versions")?;
    let plan = parse_id("plan_id", &plan_id)?;
    let org = match &body.org_id {
        Some(o) => Some(parse_id("org_id", o)?.into_string()),
        None => None,
    };
    let when = When::parse(&body.at).map_err(|m| ApiError::invalid("at", format!("at {m}")))?;
    let m = Migration {
        plan: plan.into_string(),
        from: body.from,
        to: body.to,
        org,
        when,
        dry_run: body.dry_run,
    };
    let moves = state.migrate_versions(&m, &principal.actor()).await?;
    Ok(Json(MigrationView {
        dry_run: body.dry_run,
        moves,
    }))
}
