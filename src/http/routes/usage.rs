//! The console's usage page.

use axum::extract::State;
use axum::Json;

use rush_meter_core::breakdown::{windows_touched, GroupBy, Key};
use rush_meter_core::funding::WindowKind;
use rush_meter_core::standing::WindowUsage;
use rush_meter_core::time::{format_rfc3339, hours, rfc3339, Interval, Secs};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::app::usage::{self, BreakdownAsk};
use crate::http::extract::{named_param, time_param, OrgPath, OrgReader, Query};
use crate::http::openapi::{BadId, BadQuery, Guarded};
use crate::http::views::{FundingView, PlanView};
use crate::http::{ApiResult, AppState};

#[derive(Serialize, ToSchema)]
pub struct UsageView {
    org_id: String,
    plan: String,
    /// The version of the plan the org is on (its terms: `plans/`).
    plan_version: i64,
    month: WindowUsage,
    week: WindowUsage,
    running_sessions: i64,
    parked_sessions: i64,
    /// Of `parked_sessions`, those waiting for room: all of them while the org has none
    /// left from any source (they cannot resume until it returns), else 0.
    parked_for_room: i64,
    /// Past the plan: grants, pay-as-you-go, and the time left from every source.
    funding: FundingView,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    as_of: Secs,
}

/// `GET /v1/orgs/{org_id}/usage`: both windows, running sessions counted up to now.
#[utoipa::path(get, path = "/v1/orgs/{org_id}/usage", tag = "usage", params(OrgPath), security(("bearer" = ["console", "finance", "admin"])),
    responses((status = 200, description = "The month and week windows", body = UsageView),
        Guarded, BadId))]
pub async fn get_usage(
    State(state): State<AppState>,
    OrgReader { org_id, .. }: OrgReader,
) -> ApiResult<Json<UsageView>> {
    let now = state.clock.now();
    let (s, parked) = state.standing_counting_parked(org_id.as_str(), now).await?;
    let funding = FundingView::of(&s);
    let out_of_room = s.remaining_seconds() == 0;
    Ok(Json(UsageView {
        funding,
        org_id: s.org.org_id,
        plan: s.plan.id,
        plan_version: s.plan.version,
        month: s.month,
        week: s.week,
        running_sessions: s.running,
        parked_for_room: if out_of_room { parked } else { 0 },
        parked_sessions: parked,
        as_of: now,
    }))
}

/// `GET /v1/orgs/{org_id}/invoice-preview`: the current billing period's bill as it will be
/// invoiced, and where the pace so far takes it by the period's end.
#[utoipa::path(get, path = "/v1/orgs/{org_id}/invoice-preview", tag = "usage", params(OrgPath), security(("bearer" = ["console", "finance", "admin"])),
    responses((status = 200, description = "The period's lines, what is due, what is projected",
        body = rush_meter_core::bill_preview::Preview), Guarded, BadId))]
pub async fn get_invoice_preview(
    State(state): State<AppState>,
    OrgReader { org_id, .. }: OrgReader,
) -> ApiResult<Json<rush_meter_core::bill_preview::Preview>> {
    let now = state.clock.now();
    Ok(Json(state.bill_preview(org_id.as_str(), now).await?))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct BreakdownQuery {
    /// A whole hour; default the current month window's start.
    #[param(format = DateTime)]
    from: Option<String>,
    /// A whole hour, exclusive; at most 400 days after `from`.
    #[param(format = DateTime)]
    to: Option<String>,
    /// Default `day`.
    #[param(value_type = Option<GroupBy>)]
    group_by: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct Total {
    seconds: i64,
    hours: String,
}

#[derive(Serialize, ToSchema)]
pub struct Breakdown {
    org_id: String,
    plan: String,
    /// The version of the plan whose ceilings these are.
    plan_version: i64,
    #[schema(format = DateTime)]
    from: String,
    #[schema(format = DateTime)]
    to: String,
    group_by: GroupBy,
    rows: Vec<BreakdownRow>,
    total: Total,
    /// The plan's ceiling for every month and week window the range touches.
    ceilings: Vec<Ceiling>,
    #[schema(format = DateTime)]
    as_of: String,
}

#[derive(Serialize, ToSchema)]
pub struct Projections {
    month: rush_meter_core::prompt::Projection,
    week: rush_meter_core::prompt::Projection,
}

/// The call that moves the org to the suggested plan.
#[derive(Serialize, ToSchema)]
pub struct CheckoutCall {
    /// `POST`.
    method: &'static str,
    path: String,
    body: CheckoutCallBody,
}

#[derive(Serialize, ToSchema)]
pub struct CheckoutCallBody {
    plan: String,
}

#[derive(Serialize, ToSchema)]
pub struct UpgradePrompt {
    org_id: String,
    plan: String,
    /// The version of the plan the org is on.
    plan_version: i64,
    /// Show the prompt: some reason holds.
    show: bool,
    reasons: Vec<rush_meter_core::prompt::PromptReason>,
    projection: Projections,
    /// The cheapest plan that holds the projection; `null` when none is needed or none does.
    suggested_plan: Option<PlanView>,
    checkout: Option<CheckoutCall>,
    /// Past the plan by the period's end at this pace: the next plan, top-up packs and
    /// pay-as-you-go priced for the shortfall, and the cheapest that covers it.
    ways_on: rush_meter_core::prompt::WaysOn,
    #[schema(format = DateTime)]
    as_of: String,
}

#[derive(Serialize, ToSchema)]
pub struct BreakdownRow {
    /// An RFC 3339 time (hour, day), a name (session, project, user, agent), or who paid
    /// (`plan`, `grant`, `overage`, `grace`); `null` for sessions without one (no project,
    /// no user).
    key: Option<String>,
    seconds: i64,
    hours: String,
}

#[derive(Serialize, ToSchema)]
pub struct Ceiling {
    window: WindowKind,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    start: Secs,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    end: Secs,
    limit_seconds: i64,
    limit_hours: String,
}

/// `GET /v1/orgs/{org_id}/usage/breakdown?from=&to=&group_by=`: agent time in the whole
/// hours `[from, to)` (default: the current month window, widened to whole hours), grouped
/// by hour, day, session, project, user or agent, with the total and the plan's ceilings
/// for every month and week window the range touches.
#[utoipa::path(get, path = "/v1/orgs/{org_id}/usage/breakdown", tag = "usage",
    security(("bearer" = ["console", "finance", "admin"])), params(OrgPath, BreakdownQuery),
    responses((status = 200, description = "Agent time grouped, with the total and ceilings",
        body = Breakdown), Guarded, BadQuery, BadId))]
pub async fn get_breakdown(
    State(state): State<AppState>,
    OrgReader { org_id, .. }: OrgReader,
    query: Query<BreakdownQuery>,
) -> ApiResult<Json<Breakdown>> {
    let q = query.read()?;
    let by = named_param("group_by", q.group_by.as_deref(), GroupBy::parse_named)?
        .unwrap_or(GroupBy::Day);
    let now = state.clock.now();
    let ask = BreakdownAsk {
        by,
        from: time_param("from", q.from.as_deref())?,
        to: time_param("to", q.to.as_deref())?,
    };
    let usage::Breakdown { org, range, rows } = state.breakdown(org_id.as_str(), ask, now).await?;
    let rows: Vec<BreakdownRow> = rows.into_iter().map(BreakdownRow::of).collect();
    let total: i64 = rows.iter().map(|r| r.seconds).sum();
    let plan = org.effective_plan(&state.plans, now);
    let ceilings = ceilings(range, org.billing_period(), plan);
    Ok(Json(Breakdown {
        org_id: org.org_id,
        plan: plan.id.clone(),
        plan_version: plan.version,
        from: format_rfc3339(range.start),
        to: format_rfc3339(range.end),
        group_by: by,
        rows,
        total: Total {
            seconds: total,
            hours: hours(total),
        },
        ceilings,
        as_of: format_rfc3339(now),
    }))
}

impl BreakdownRow {
    fn of((k, seconds): (Key, i64)) -> BreakdownRow {
        BreakdownRow {
            key: match k {
                Key::Time(t) => Some(format_rfc3339(t)),
                Key::Name(n) => n,
            },
            seconds,
            hours: hours(seconds),
        }
    }
}

/// The plan's ceiling on every month and week window that `range` touches.
fn ceilings(
    range: Interval,
    period: Option<Interval>,
    plan: &rush_meter_core::plans::Plan,
) -> Vec<Ceiling> {
    let (months, weeks) = windows_touched(range, period);
    let ceiling = |window, w: Interval, limit: i64| Ceiling {
        window,
        start: w.start,
        end: w.end,
        limit_seconds: limit,
        limit_hours: hours(limit),
    };
    months
        .into_iter()
        .map(|w| ceiling(WindowKind::Month, w, plan.monthly_limit_seconds))
        .chain(
            weeks
                .into_iter()
                .map(|w| ceiling(WindowKind::Week, w, plan.weekly_limit_seconds)),
        )
        .collect()
}

/// `GET /v1/orgs/{org_id}/upgrade-prompt`: whether to prompt the org to upgrade, why (each
/// window's highest threshold crossed, concurrency denials in the last 24 hours; set per
/// plan), both windows projected to their end at the pace so far, the cheapest plan that
/// holds them, and how to check out to it.
#[utoipa::path(get, path = "/v1/orgs/{org_id}/upgrade-prompt", tag = "usage",
    params(OrgPath), security(("bearer" = ["console", "finance", "admin"])),
    responses((status = 200, description = "Whether to prompt, why, and to which plan",
        body = UpgradePrompt), Guarded, BadId))]
pub async fn get_upgrade_prompt(
    State(state): State<AppState>,
    OrgReader { org_id, .. }: OrgReader,
) -> ApiResult<Json<UpgradePrompt>> {
    use rush_meter_core::prompt::{project, reasons, suggest, ways_on, PromptReason};
    let now = state.clock.now();
    let (s, denials) = state.prompt_reads(org_id.as_str(), now).await?;
    let why = reasons(&s.plan, &s.month, &s.week, denials);
    let (month, week) = (project(&s.month, now), project(&s.week, now));
    let need = why
        .iter()
        .any(|r| matches!(r, PromptReason::ConcurrencyDenials { .. }))
        .then_some(s.plan.concurrency_max);
    // Nothing to suggest while no reason shows the prompt.
    let suggested = (!why.is_empty())
        .then(|| suggest(&state.plans, &s.plan, &month, &week, need))
        .flatten();
    let ways = ways_on(
        &state.plans,
        &s.plan,
        &month,
        &week,
        s.funding.grant_room(now),
    );
    Ok(Json(UpgradePrompt {
        ways_on: ways,
        show: !why.is_empty(),
        reasons: why,
        projection: Projections { month, week },
        suggested_plan: suggested.map(PlanView::of),
        checkout: suggested.map(|p| CheckoutCall {
            method: "POST",
            path: format!("/v1/orgs/{}/checkout", s.org.org_id),
            body: CheckoutCallBody { plan: p.id.clone() },
        }),
        org_id: s.org.org_id,
        plan: s.plan.id,
        plan_version: s.plan.version,
        as_of: format_rfc3339(now),
    }))
}
