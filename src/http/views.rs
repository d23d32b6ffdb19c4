//! Views of an org's standing that several routes answer with: its pay-as-you-go, its
//! grants, and the summary of what funds it past its plan.

use rush_meter_core::funding::{Grant, GrantKind, GrantStatus, Source, WindowKind};
use rush_meter_core::org::Org;
use rush_meter_core::plans::Plan;
use rush_meter_core::standing::Standing;
use rush_meter_core::time::{hours, rfc3339, Secs};
use serde::Serialize;
use utoipa::ToSchema;

/// Pay-as-you-go: as the org set it, and this month's spend against its cap.
#[derive(Serialize, ToSchema)]
pub struct OverageView {
    org_id: String,
    /// The org's plan offers pay-as-you-go.
    offered: bool,
    enabled: bool,
    /// Decimal, in `currency`.
    #[schema(example = "50.00")]
    monthly_cap: String,
    /// The highest cap the plan allows.
    #[schema(example = "200.00")]
    cap_max: String,
    /// Price of an agent-hour past the plan and grants, exact: 2 places, or the 3 or 4 the
    /// plan gives it.
    #[schema(example = "0.60")]
    unit_price: String,
    currency: String,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    month_start: Secs,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    month_end: Secs,
    /// Paid as it went this month, running sessions counted up to now.
    overage_seconds: i64,
    /// What that cost. Never more than the cap in force when it was spent: above
    /// `monthly_cap` only when the cap was lowered (or pay-as-you-go turned off) after.
    #[schema(example = "12.34")]
    spent: String,
    /// Left under the cap (0 while off, and once `spent` reaches `monthly_cap`).
    #[schema(example = "37.66")]
    remaining: String,
    /// On, and `spent` has reached `monthly_cap`: nothing more is paid as it goes this
    /// month (runs past the plan and grants are refused with `spend_cap_reached`).
    cap_reached: bool,
}

impl OverageView {
    pub fn of(s: &Standing) -> OverageView {
        let plan: &Plan = &s.plan;
        let org: &Org = &s.org;
        let w = s.funding.windows_at(s.at);
        let funds = s.funding.funds(WindowKind::Month, w.month);
        let spent = funds.overage_amount();
        let cap = org.overage.monthly_cap;
        let on = s.funding.terms.pay_as_you_go();
        let remaining = if on {
            (cap - spent).max(rust_decimal::Decimal::ZERO)
        } else {
            rust_decimal::Decimal::ZERO
        };
        OverageView {
            org_id: org.org_id.clone(),
            offered: plan.offers_overage(),
            enabled: org.overage.enabled,
            monthly_cap: format!("{cap:.2}"),
            cap_max: format!("{:.2}", plan.overage_cap_max),
            unit_price: rush_meter_core::charges::unit_price(plan.overage_unit_price),
            currency: plan.currency.clone(),
            month_start: w.month.start,
            month_end: w.month.end,
            overage_seconds: funds.overage,
            spent: format!("{spent:.2}"),
            remaining: format!("{remaining:.2}"),
            cap_reached: on && spent >= cap,
        }
    }
}

/// A grant of hours, as every reader sees it.
#[derive(Serialize, ToSchema)]
pub struct GrantView {
    grant_id: String,
    org_id: String,
    kind: GrantKind,
    status: GrantStatus,
    seconds: i64,
    /// Used so far, running sessions counted up to now.
    used_seconds: i64,
    /// Left to use: 0 once voided or expired.
    remaining_seconds: i64,
    remaining_hours: String,
    /// 0 is used first, 100 last.
    priority: i64,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    starts_at: Secs,
    #[serde(with = "rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    expires_at: Option<Secs>,
    note: Option<String>,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    created_at: Secs,
    #[serde(with = "rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    voided_at: Option<Secs>,
}

impl GrantView {
    pub fn of(g: Grant, now: Secs) -> GrantView {
        let status = g.status(now);
        let remaining = match status {
            GrantStatus::Active | GrantStatus::Scheduled => g.remaining(),
            _ => 0,
        };
        GrantView {
            status,
            remaining_seconds: remaining,
            remaining_hours: hours(remaining),
            grant_id: g.grant_id,
            org_id: g.org_id,
            kind: g.kind,
            seconds: g.seconds,
            used_seconds: g.used_seconds,
            priority: g.priority,
            starts_at: g.starts_at,
            expires_at: g.expires_at,
            note: g.note,
            created_at: g.created_at,
            voided_at: g.voided_at,
        }
    }
}

/// What funds the org past its plan, as the usage page shows it.
#[derive(Serialize, ToSchema)]
pub struct FundingView {
    /// Agent time left from every source now: the plan, the grants in force, and
    /// pay-as-you-go up to its cap.
    remaining_seconds: i64,
    remaining_hours: String,
    /// What pays for the next second; `null` once everything is spent.
    funded_by: Option<Source>,
    /// Grants in force or starting later.
    grants: Vec<GrantView>,
    overage: OverageView,
}

impl FundingView {
    pub fn of(s: &Standing) -> FundingView {
        let remaining = s.remaining_seconds();
        let grants = s
            .funding
            .grants
            .iter()
            .cloned()
            .map(|g| GrantView::of(g, s.at))
            .filter(|g| matches!(g.status, GrantStatus::Active | GrantStatus::Scheduled))
            .collect();
        FundingView {
            remaining_seconds: remaining,
            remaining_hours: hours(remaining),
            funded_by: s.funding.next_source(s.at).map(|(src, _)| src),
            grants,
            overage: OverageView::of(s),
        }
    }
}

/// A plan version as sold: what the upgrade prompt suggests and the list of plans shows.
#[derive(Serialize, ToSchema)]
pub struct PlanView {
    id: String,
    /// The version of the plan's terms (the newest, where a plan is offered).
    version: i64,
    name: String,
    /// Decimal, per month.
    price: String,
    currency: String,
    monthly_agent_hours: String,
    weekly_agent_hours: String,
    concurrency_max: i64,
}

impl PlanView {
    pub fn of(p: &Plan) -> PlanView {
        PlanView {
            id: p.id.clone(),
            version: p.version,
            name: p.name.clone(),
            price: p.price.to_string(),
            currency: p.currency.clone(),
            monthly_agent_hours: p.monthly_agent_hours.to_string(),
            weekly_agent_hours: p.weekly_agent_hours.to_string(),
            concurrency_max: p.concurrency_max,
        }
    }
}
