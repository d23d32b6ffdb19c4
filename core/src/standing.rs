//! An org's standing at one moment: its effective plan and both windows' figures. What
//! the usage page shows, what heartbeat answers carry, and what notifications watch.

use std::collections::BTreeMap;

use serde::Serialize;

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
    pub used_seconds: i64,
    pub limit_seconds: i64,
    pub remaining_seconds: i64,
    pub used_hours: String,
    pub limit_hours: String,
    pub remaining_hours: String,
    /// When this window's count starts again from zero.
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub resets_at: Secs,
}

impl WindowUsage {
    pub fn new(window: Interval, used_seconds: i64, limit_seconds: i64) -> WindowUsage {
        let remaining = (limit_seconds - used_seconds).max(0);
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
        }
    }

    pub fn exhausted(&self) -> bool {
        self.used_seconds >= self.limit_seconds
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
}

impl Standing {
    /// The standing of `org` at `now`, from what its windows hold.
    pub fn of(org: Org, plans: &Plans, now: Secs, used: WindowTotals) -> Standing {
        let plan = org.effective_plan(plans, now).clone();
        let w = Windows::at(now, org.billing_period());
        Standing {
            month: WindowUsage::new(w.month, used.month, plan.monthly_limit_seconds),
            week: WindowUsage::new(w.week, used.week, plan.weekly_limit_seconds),
            running: used.running,
            org,
            plan,
        }
    }

    /// Agent time left before the first of the two ceilings.
    pub fn remaining_seconds(&self) -> i64 {
        self.month
            .remaining_seconds
            .min(self.week.remaining_seconds)
    }

    /// Running sessions are told to park once a ceiling is passed by the plan's grace.
    pub fn must_park(&self) -> bool {
        let grace = self.plan.ceiling_grace_seconds;
        [&self.month, &self.week]
            .iter()
            .any(|w| w.used_seconds >= w.limit_seconds + grace)
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
                },
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
