//! Orgs and their API keys (admin).

use axum::extract::{Path, State};
use axum::Json;
use rush_meter_core::org::{Key, Org};
use rush_meter_core::plans::Plans;
use rush_meter_core::standing::WindowUsage;
use rush_meter_core::text::Text;
use rush_meter_core::time::{rfc3339, Secs};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::http::auth::Principal;
use crate::http::error::parse_id;
use crate::http::extract::{JsonBody, OrgKeyPath, OrgPath, OrgReader, Page, Query};
use crate::http::openapi::{BadBody, BadId, BadQuery, Guarded};
use crate::http::{ApiError, ApiResult, AppState};
use crate::store::OrgUpsert;
use crate::tokens::Scope;

#[derive(Deserialize, ToSchema)]
pub struct PutOrg {
    /// Default: the org's id.
    #[schema(min_length = 1, max_length = 200)]
    name: Option<String>,
    /// A plan id of `plans/`; default `free`.
    plan: Option<String>,
    suspended: Option<bool>,
}

#[derive(Serialize, ToSchema)]
pub struct OrgView {
    org_id: String,
    name: String,
    /// The plan in force: the one paid for, or a downgrade once its `scheduled_at` has come.
    plan: String,
    /// The version of that plan the org is on (its terms: `plans/`).
    plan_version: i64,
    /// A move to another version of the plan, scheduled by an operator; `null`: none.
    moving: Option<MovingView>,
    suspended: bool,
    subscription: Option<SubscriptionView>,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    created_at: Secs,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    updated_at: Secs,
}

#[derive(Serialize, ToSchema)]
struct MovingView {
    to_version: i64,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    at: Secs,
}

#[derive(Serialize, ToSchema)]
struct SubscriptionView {
    status: Option<String>,
    stripe_customer_id: Option<String>,
    stripe_subscription_id: Option<String>,
    #[serde(with = "rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    current_period_start: Option<Secs>,
    #[serde(with = "rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    current_period_end: Option<Secs>,
    cancel_at_period_end: bool,
    /// A downgrade asked for (made in Stripe, which bills the next period at its price),
    /// in force from `scheduled_at`, the end of the period paid for.
    scheduled_plan: Option<String>,
    #[serde(with = "rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    scheduled_at: Option<Secs>,
    #[serde(with = "rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    past_due_since: Option<Secs>,
}

impl OrgView {
    /// `o` as it stands at `now`.
    fn of(o: Org, plans: &Plans, now: Secs) -> Self {
        let plan = o.plan_id_at(now).to_owned();
        let plan_version = o.plan_access(plans, now).0.version;
        let moving = match (o.moving_to_version, o.moving_at) {
            (Some(to_version), Some(at)) if at > now => Some(MovingView { to_version, at }),
            _ => None,
        };
        let subscription = (o.stripe_customer_id.is_some() || o.stripe_subscription_id.is_some())
            .then(|| SubscriptionView {
                status: o.subscription_status.clone(),
                stripe_customer_id: o.stripe_customer_id.clone(),
                stripe_subscription_id: o.stripe_subscription_id.clone(),
                current_period_start: o.period_start,
                cancel_at_period_end: o.cancel_at_period_end,
                scheduled_plan: o.scheduled_plan_id.clone(),
                scheduled_at: o.scheduled_at,
                past_due_since: o.past_due_since,
                current_period_end: o.period_end,
            });
        OrgView {
            org_id: o.org_id,
            name: o.name,
            plan,
            plan_version,
            moving,
            suspended: o.suspended,
            subscription,
            created_at: o.created_at,
            updated_at: o.updated_at,
        }
    }
}

/// Create or update an org; its plan applies at once (admin).
#[utoipa::path(put, path = "/v1/orgs/{org_id}", tag = "orgs", params(OrgPath), security(("bearer" = ["admin"])),
     request_body(content = Option<PutOrg>, description = "May be empty: fields left out stay as they are"),
    responses((status = 200, description = "The org as stored", body = OrgView),
        Guarded, BadBody, BadId))]
pub async fn put_org(
    State(state): State<AppState>,
    principal: Principal,
    Path(OrgPath { org_id }): Path<OrgPath>,
    JsonBody(body): JsonBody<PutOrg>,
) -> ApiResult<Json<OrgView>> {
    principal.require_any(&[Scope::Admin])?;
    let org_id = parse_id("org_id", &org_id)?;
    let row = state
        .upsert_org(
            OrgUpsert {
                org_id: org_id.into_string(),
                name: body.name,
                plan_id: body.plan,
                plan_version: None,
                suspended: body.suspended,
            },
            &principal.actor(),
        )
        .await?;
    Ok(Json(OrgView::of(row, &state.plans, state.clock.now())))
}

/// An org with its plan and subscription (console for its own org, finance, admin).
#[utoipa::path(get, path = "/v1/orgs/{org_id}", tag = "orgs", params(OrgPath), security(("bearer" = ["console", "finance", "admin"])),
    responses((status = 200, description = "The org", body = OrgView), Guarded, BadId))]
pub async fn get_org(
    State(state): State<AppState>,
    OrgReader { org_id, .. }: OrgReader,
) -> ApiResult<Json<OrgView>> {
    let row = state.org(org_id.as_str()).await?;
    Ok(Json(OrgView::of(row, &state.plans, state.clock.now())))
}

#[derive(Deserialize, ToSchema)]
pub struct PutKey {
    /// At most the plan's `concurrency_max` (100 at most on any plan); default the plan's
    /// `concurrency_default`.
    #[schema(minimum = 1, maximum = 100)]
    concurrency_limit: Option<i64>,
}

#[derive(Serialize, ToSchema)]
pub struct KeyView {
    org_id: String,
    key_id: String,
    /// The limit in force: the one set, or the plan's default, never above the plan's max.
    concurrency_limit: i64,
    /// The limit set for this key, `null` when it follows the plan's default.
    concurrency_limit_set: Option<i64>,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    created_at: Secs,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    updated_at: Secs,
}

fn key_view(key: Key, org: &Org, state: &AppState) -> KeyView {
    let plan = org.effective_plan(&state.plans, state.clock.now());
    KeyView {
        concurrency_limit: key.limit_on(plan),
        concurrency_limit_set: key.concurrency_limit,
        org_id: key.org_id,
        key_id: key.key_id,
        created_at: key.created_at,
        updated_at: key.updated_at,
    }
}

/// Register a key and its concurrency limit (admin).
#[utoipa::path(put, path = "/v1/orgs/{org_id}/keys/{key_id}", tag = "orgs",
    params(OrgKeyPath), security(("bearer" = ["admin"])), request_body(content = Option<PutKey>, description = "May be empty: a limit left out or `null` is the plan's `concurrency_default`"),
    responses((status = 200, description = "The key as stored", body = KeyView),
        Guarded, BadBody, BadId))]
pub async fn put_key(
    State(state): State<AppState>,
    principal: Principal,
    Path(OrgKeyPath { org_id, key_id }): Path<OrgKeyPath>,
    JsonBody(body): JsonBody<PutKey>,
) -> ApiResult<Json<KeyView>> {
    principal.require_any(&[Scope::Admin])?;
    let org_id = parse_id("org_id", &org_id)?;
    let key_id = parse_id("key_id", &key_id)?;
    let (key, org) = state
        .put_key(
            org_id.as_str(),
            key_id.as_str(),
            body.concurrency_limit,
            &principal.actor(),
        )
        .await?;
    Ok(Json(key_view(key, &org, &state)))
}

/// A key and the concurrency limit in force (admin, admission).
#[utoipa::path(get, path = "/v1/orgs/{org_id}/keys/{key_id}", tag = "orgs",
    params(OrgKeyPath), security(("bearer" = ["admin", "admission"])),
    responses((status = 200, description = "The key", body = KeyView), Guarded, BadId))]
pub async fn get_key(
    State(state): State<AppState>,
    principal: Principal,
    Path(OrgKeyPath { org_id, key_id }): Path<OrgKeyPath>,
) -> ApiResult<Json<KeyView>> {
    principal.require_any(&[Scope::Admin, Scope::Admission])?;
    let org_id = parse_id("org_id", &org_id)?;
    let key_id = parse_id("key_id", &key_id)?;
    principal.check_org(org_id.as_str())?;
    let (key, org) = state.key(org_id.as_str(), key_id.as_str()).await?;
    Ok(Json(key_view(key, &org, &state)))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct OrgsQuery {
    /// Orgs whose id or name contains this, ignoring case (ASCII letters only on SQLite);
    /// default every org.
    #[param(max_length = 200)]
    q: Option<String>,
    /// The `next_cursor` of the page before.
    cursor: Option<String>,
    /// 1 to 1,000; default 100.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
}

/// An org as the console's list shows it: plan, status, and both windows counted up to
/// now, exactly as its usage page counts them.
#[derive(Serialize, ToSchema)]
pub struct OrgSummary {
    org_id: String,
    name: String,
    plan: String,
    plan_version: i64,
    suspended: bool,
    /// Stripe's subscription status (`active`, `past_due`, …); `null` without one.
    subscription_status: Option<String>,
    month: WindowUsage,
    week: WindowUsage,
}

#[derive(Serialize, ToSchema)]
pub struct OrgPage {
    orgs: Vec<OrgSummary>,
    /// Pass as `cursor` for the next page; `null` on the last.
    next_cursor: Option<String>,
}

/// `GET /v1/orgs?q=&cursor=&limit=`: orgs by id, each with its month and week (finance,
/// admin).
#[utoipa::path(get, path = "/v1/orgs", tag = "orgs", security(("bearer" = ["finance", "admin"])),
    params(OrgsQuery),
    responses((status = 200, description = "A page of orgs, by id (byte order)", body = OrgPage),
        Guarded, BadQuery))]
pub async fn list_orgs(
    State(state): State<AppState>,
    principal: Principal,
    query: Query<OrgsQuery>,
) -> ApiResult<Json<OrgPage>> {
    principal.require_any(&[Scope::Finance])?;
    let q = query.read()?;
    let text = q.q.unwrap_or_default();
    Text::Line
        .check(&text, 200)
        .map_err(|m| ApiError::invalid("q", format!("q {m}")))?;
    let after = q
        .cursor
        .as_deref()
        .map(|c| {
            parse_id("cursor", c)
                .map_err(|_| ApiError::invalid("cursor", "cursor is not one this service gave out"))
        })
        .transpose()?;
    let limit = Page::of(None, q.limit)?.limit;
    let (found, next_cursor) = state
        .search_orgs(
            text.trim(),
            after.as_ref().map(|a| a.as_str()),
            limit,
            principal.bound_org(),
        )
        .await?;
    let orgs = found
        .into_iter()
        .map(|s| OrgSummary {
            subscription_status: s.org.subscription_status,
            org_id: s.org.org_id,
            name: s.org.name,
            plan: s.plan.id,
            plan_version: s.plan.version,
            suspended: s.org.suspended,
            month: s.month,
            week: s.week,
        })
        .collect();
    Ok(Json(OrgPage { orgs, next_cursor }))
}
