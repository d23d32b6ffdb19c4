//! An org's standing at one moment: its effective plan and both windows' figures. What
//! the usage page shows, what heartbeat answers carry, and what notifications watch.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::funding::{self, Funds, Split, WindowKind};
use crate::org::Org;
use crate::plans::{Plan, Plans};
use crate::time::{hours, rfc3339, Interval, Secs, Windows};

/// One org's use of its month and week windows, and its running sessions, at one moment:
/// booked time plus running sessions counted up to now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowTotals {
    pub month: i64,
    pub week: i64,
    /// Running sessions heard from within the lease.
    pub running: i64,
    /// Of `month` and `week`, the running sessions' time up to now, not booked yet.
    pub month_provisional: i64,
    pub week_provisional: i64,
}

/// An org's funding state at `now` on the plan its status grants, from what the store
/// read and what its windows hold: windows funded before funding was recorded seeded from
/// what was booked in them, running sessions' time up to now attributed.
pub fn funding_state(
    org: &Org,
    plans: &Plans,
    now: Secs,
    recorded: funding::Recorded,
    used: &WindowTotals,
) -> funding::State {
    funding_state_on(org, org.effective_plan(plans, now), now, recorded, used)
}

/// `funding_state` on `plan`'s terms.
pub fn funding_state_on(
    org: &Org,
    plan: &Plan,
    now: Secs,
    recorded: funding::Recorded,
    used: &WindowTotals,
) -> funding::State {
    let terms = funding::Terms::of(plan, &org.overage);
    let mut state = funding::State::new(
        terms,
        org.billing_period(),
        recorded.floor,
        recorded.windows,
        recorded.grants,
    );
    state.holds_grants = recorded.holds_grants;
    let w = Windows::at(now, org.billing_period());
    state.seed(
        WindowKind::Month,
        w.month,
        used.month - used.month_provisional,
    );
    state.seed(WindowKind::Week, w.week, used.week - used.week_provisional);
    state.project(now, provisional(used));
    state
}

/// Running sessions' time up to now, not booked yet.
fn provisional(used: &WindowTotals) -> i64 {
    used.month_provisional.max(used.week_provisional)
}

/// One window's figures, as every reader shows them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct WindowUsage {
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub start: Secs,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub end: Secs,
    /// All agent time used in the window: the sum of the four sources below.
    pub used_seconds: i64,
    /// The plan's ceiling for this window.
    pub limit_seconds: i64,
    /// Plan time left in this window (grants and pay-as-you-go are on the org's `funding`).
    pub remaining_seconds: i64,
    pub used_hours: String,
    pub limit_hours: String,
    pub remaining_hours: String,
    /// When this window's count starts again from zero.
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub resets_at: Secs,
    // Of `used_seconds`, by who paid: absent where the split is not recorded (a
    // decision's figures, whose `remaining` says what each source had left).
    /// What the plan paid for: the ceiling counts these only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan_seconds: Option<i64>,
    /// What the org's grants paid for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grant_seconds: Option<i64>,
    /// What pay-as-you-go paid for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overage_seconds: Option<i64>,
    /// What ran past every source before sessions parked: never charged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grace_seconds: Option<i64>,
    /// What the overage seconds cost, in the plan's currency.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "0.00")]
    pub overage_amount: Option<String>,
}

impl WindowUsage {
    /// A window's figures without the split by source.
    pub fn new(window: Interval, used_seconds: i64, limit_seconds: i64) -> WindowUsage {
        WindowUsage {
            plan_seconds: None,
            grant_seconds: None,
            overage_seconds: None,
            grace_seconds: None,
            overage_amount: None,
            ..WindowUsage::funded(window, used_seconds, limit_seconds, &Funds::default())
        }
    }

    /// A window whose time `funds` split by source (the plan's is the rest of `used`).
    pub fn funded(
        window: Interval,
        used_seconds: i64,
        limit_seconds: i64,
        funds: &Funds,
    ) -> WindowUsage {
        let split = Split::of(used_seconds, funds);
        let remaining = (limit_seconds - split.plan).max(0);
        WindowUsage {
            start: window.start,
            end: window.end,
            used_seconds,
            limit_seconds,
            remaining_seconds: remaining,
            used_hours: hours(used_seconds),
            limit_hours: hours(limit_seconds),
            remaining_hours: hours(remaining),
            resets_at: window.end,
            plan_seconds: Some(split.plan),
            grant_seconds: Some(split.grant),
            overage_seconds: Some(split.overage),
            grace_seconds: Some(split.grace),
            overage_amount: Some(format!("{:.2}", split.overage_amount)),
        }
    }

    /// Plan seconds used (all of the time where the split is not recorded).
    pub fn plan_seconds(&self) -> i64 {
        self.plan_seconds.unwrap_or(self.used_seconds)
    }

    /// The plan's ceiling for this window is reached.
    pub fn exhausted(&self) -> bool {
        self.plan_seconds() >= self.limit_seconds
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Standing {
    pub org: Org,
    pub plan: Plan,
    pub month: WindowUsage,
    pub week: WindowUsage,
    /// Running sessions heard from within the lease.
    pub running: i64,
    /// Who pays, running sessions' time up to `at` attributed.
    pub funding: funding::State,
    /// Who pays, as booked: before running sessions' time is attributed.
    pub booked: funding::State,
    pub at: Secs,
}

impl Standing {
    /// The standing of `org` at `now`, from what its windows hold and what is recorded of
    /// its funding.
    pub fn of(
        org: Org,
        plans: &Plans,
        now: Secs,
        used: WindowTotals,
        recorded: funding::Recorded,
    ) -> Standing {
        let plan = org.effective_plan(plans, now).clone();
        let w = Windows::at(now, org.billing_period());
        let booked_only = WindowTotals {
            month: used.month - used.month_provisional,
            week: used.week - used.week_provisional,
            month_provisional: 0,
            week_provisional: 0,
            ..used
        };
        let booked = funding_state_on(&org, &plan, now, recorded, &booked_only);
        let mut state = booked.clone();
        state.project(now, provisional(&used));
        let funds = |kind, window| state.funds(kind, window);
        Standing {
            month: WindowUsage::funded(
                w.month,
                used.month,
                plan.monthly_limit_seconds,
                &funds(WindowKind::Month, w.month),
            ),
            week: WindowUsage::funded(
                w.week,
                used.week,
                plan.weekly_limit_seconds,
                &funds(WindowKind::Week, w.week),
            ),
            running: used.running,
            funding: state,
            booked,
            at: now,
            org,
            plan,
        }
    }

    /// Agent time left from every source: the plan (before the first of its two ceilings),
    /// the grants in force, and pay-as-you-go up to its cap.
    pub fn remaining_seconds(&self) -> i64 {
        self.funding.remaining_at(self.at)
    }

    /// Running sessions are told to park once every source is spent and the plan's grace
    /// has run past it.
    pub fn must_park(&self) -> bool {
        funding::must_park(&self.funding, self.at, self.plan.ceiling_grace_seconds)
    }
}

/// Orgs grouped by the windows they count in at `now`: orgs on a Stripe period have a
/// month of their own, the rest share the calendar's, so one read serves each group.
pub fn by_windows<'o, I>(orgs: I, now: Secs) -> BTreeMap<Windows, Vec<&'o Org>>
where
    I: IntoIterator<Item = &'o Org>,
{
    let mut groups: BTreeMap<Windows, Vec<&Org>> = BTreeMap::new();
    for org in orgs {
        groups
            .entry(Windows::at(now, org.billing_period()))
            .or_default()
            .push(org);
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remaining_never_negative() {
        let w = WindowUsage::new(Interval::new(0, 10).unwrap(), 30, 18);
        assert_eq!(w.remaining_seconds, 0);
        assert!(w.exhausted());
    }

    #[test]
    fn park_after_the_grace_of_the_first_ceiling_passed() {
        let plans = crate::shipped_plans();
        let t0 = 1_796_040_000; // Monday 2026-11-30 12:00 UTC
        let org = Org::new("o", "pro", 0);
        let pro = plans.get("pro").unwrap();
        let week = pro.weekly_limit_seconds;
        let at = |used: i64| {
            Standing::of(
                org.clone(),
                &plans,
                t0,
                WindowTotals {
                    month: used,
                    week: used,
                    running: 1,
                    ..WindowTotals::default()
                },
                funding::Recorded::default(),
            )
        };
        assert_eq!(at(week - 5).remaining_seconds(), 5);
        assert!(!at(week + pro.ceiling_grace_seconds - 1).must_park());
        assert!(at(week + pro.ceiling_grace_seconds).must_park());
    }

    #[test]
    fn orgs_on_a_stripe_period_count_in_a_month_of_their_own() {
        let now = 1_796_040_000;
        let a = Org::new("a", "free", 0);
        let mut b = Org::new("b", "pro", 0);
        b.period_start = Some(now - 100);
        b.period_end = Some(now + 100);
        let c = Org::new("c", "team", 0);
        let groups = by_windows([&a, &b, &c], now);
        assert_eq!(groups.len(), 2);
        assert!(groups.values().any(|g| g.len() == 2));
    }
}
