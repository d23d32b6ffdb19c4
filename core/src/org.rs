//! An org, its API keys, and what its subscription grants it (DESIGN.md, the rules the
//! gate keeps): trialing and active grant the plan; past_due keeps it through the plan's
//! grace; every other status, known or not, falls back to Free.

use crate::auto_topup::AutoTopup;
use crate::funding::Overage;
use crate::plans::{Plan, Plans};
use crate::time::{Interval, Secs};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Org {
    pub org_id: String,
    pub name: String,
    pub plan_id: String,
    /// The version of `plan_id` the org is on (`Plans::version`).
    pub plan_version: i64,
    /// A move to another version of its plan, in force from `moving_at` (an operator's,
    /// audited: `rush-meter plans migrate`).
    pub moving_to_version: Option<i64>,
    pub moving_at: Option<Secs>,
    pub suspended: bool,
    pub period_start: Option<Secs>,
    pub period_end: Option<Secs>,
    pub stripe_customer_id: Option<String>,
    pub stripe_subscription_id: Option<String>,
    pub subscription_status: Option<String>,
    pub created_at: Secs,
    pub updated_at: Secs,
    /// When the subscription went `past_due` (the plan is kept through its grace).
    pub past_due_since: Option<Secs>,
    pub cancel_at_period_end: bool,
    /// A downgrade asked for, in force from `scheduled_at` (the end of the period paid for).
    pub scheduled_plan_id: Option<String>,
    pub scheduled_at: Option<Secs>,
    /// The downgrade is made in Stripe already (its renewal is at the new price): the org
    /// keeps its plan until `scheduled_at`, and the scheduled one from then on.
    pub scheduled_in_stripe: bool,
    /// When the Stripe state last applied was read from Stripe.
    pub stripe_synced_at: Option<Secs>,
    /// The ticket of that read (taken from the org's sequence before it): a state read
    /// with a lower one is older and never applied over it.
    pub stripe_applied_seq: i64,
    /// Pay-as-you-go as the org set it (it pays only on a plan that prices overage).
    pub overage: Overage,
    /// Whether the org limits any of its users, projects or keys (docs/limits.md): only
    /// then do the gate and heartbeat answers read the limits and their members' use.
    pub sets_limits: bool,
    /// Packs of hours bought when its plan and grants run low (`auto_topup`).
    pub auto_topup: AutoTopup,
}

impl Org {
    /// A new org on version 1 of `plan_id`, with no subscription.
    pub fn new(org_id: &str, plan_id: &str, at: Secs) -> Org {
        Org {
            org_id: org_id.to_owned(),
            name: org_id.to_owned(),
            plan_id: plan_id.to_owned(),
            plan_version: 1,
            moving_to_version: None,
            moving_at: None,
            suspended: false,
            period_start: None,
            period_end: None,
            stripe_customer_id: None,
            stripe_subscription_id: None,
            subscription_status: None,
            created_at: at,
            updated_at: at,
            past_due_since: None,
            cancel_at_period_end: false,
            scheduled_plan_id: None,
            scheduled_at: None,
            scheduled_in_stripe: false,
            stripe_synced_at: None,
            stripe_applied_seq: 0,
            overage: Overage::default(),
            sets_limits: false,
            auto_topup: AutoTopup::default(),
        }
    }

    /// The Stripe billing period, when one is recorded.
    pub fn billing_period(&self) -> Option<Interval> {
        Interval::new(self.period_start?, self.period_end?)
    }

    /// The version of its plan the org is on at `now`: the one recorded, or the one it is
    /// moving to once the move's time has come.
    pub fn plan_version_at(&self, now: Secs) -> i64 {
        match (self.moving_to_version, self.moving_at) {
            (Some(v), Some(at)) if now >= at => v,
            _ => self.plan_version,
        }
    }

    /// The plan the org pays for (or an admin set), at the version it is on at `now`, and
    /// whether that is one no plan file defines (then Free stands in: the shells say so
    /// loudly; the service refuses to start with orgs on a version whose file is gone).
    pub fn subscribed_plan<'p>(&self, plans: &'p Plans, now: Secs) -> (&'p Plan, bool) {
        match plans.version(&self.plan_id, self.plan_version_at(now)) {
            Some(p) => (p, false),
            None => (plans.free(), true),
        }
    }

    /// The id of the plan in force at `now`: the one paid for, or, once its period has
    /// ended, the downgrade made in Stripe for the next (before Stripe's renewal reaches
    /// the service and makes it the plan paid for).
    pub fn plan_id_at(&self, now: Secs) -> &str {
        match (&self.scheduled_plan_id, self.scheduled_at) {
            (Some(next), Some(at)) if self.scheduled_in_stripe && now >= at => next,
            _ => &self.plan_id,
        }
    }

    /// The plan in force at `now` (`plan_id_at`), and what its subscription's status grants
    /// then.
    pub fn plan_access<'p>(&self, plans: &'p Plans, now: Secs) -> (&'p Plan, Access) {
        // A downgrade made in Stripe lands on the newest version of its plan, the one its
        // price was chosen from.
        let plan = match self.plan_id_at(now) {
            id if id != self.plan_id => plans.get(id),
            _ => None,
        }
        .unwrap_or_else(|| self.subscribed_plan(plans, now).0);
        let access = access(
            self.subscription_status.as_deref(),
            self.past_due_since,
            plan,
            now,
        );
        (plan, access)
    }

    /// The plan its decisions and windows use at `now`: the one it pays for while its
    /// status grants it, Free otherwise.
    pub fn effective_plan<'p>(&self, plans: &'p Plans, now: Secs) -> &'p Plan {
        match self.plan_access(plans, now) {
            (plan, a) if a.grants_plan() => plan,
            _ => plans.free(),
        }
    }
}

/// An API key of an org.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key {
    pub org_id: String,
    pub key_id: String,
    /// `None`: the plan's `concurrency_default`.
    pub concurrency_limit: Option<i64>,
    pub created_at: Secs,
    pub updated_at: Secs,
}

impl Key {
    /// The concurrency limit in force on `plan`: the one set, or the plan's default, never
    /// above the plan's maximum (a downgrade lowers it at once).
    pub fn limit_on(&self, plan: &Plan) -> i64 {
        effective_concurrency_limit(self.concurrency_limit, plan)
    }
}

/// A key's concurrency limit in force: the one set for it, or the plan's default, and
/// never above the plan's maximum.
pub fn effective_concurrency_limit(set: Option<i64>, plan: &Plan) -> i64 {
    set.unwrap_or(plan.concurrency_default)
        .min(plan.concurrency_max)
}

/// What a subscription status grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The plan paid for.
    Granted,
    /// The plan paid for, while a failed payment is retried, until `until`.
    Grace { until: Secs },
    /// Free, until the subscription is paid (or its status is understood).
    Withheld,
}

impl Access {
    pub fn grants_plan(self) -> bool {
        !matches!(self, Access::Withheld)
    }
}

/// Access for a subscription `status` (`None`: no subscription, the plan was set by an
/// admin): trialing and active grant the plan (also while set to cancel at period end);
/// past_due keeps it for the plan's grace from `past_due_since`; everything else, known
/// or not, falls back to Free.
pub fn access(
    status: Option<&str>,
    past_due_since: Option<Secs>,
    plan: &Plan,
    now: Secs,
) -> Access {
    match status {
        None | Some("active" | "trialing") => Access::Granted,
        Some("past_due") => {
            let until = past_due_since.unwrap_or(now) + plan.past_due_grace_days * 86_400;
            if now < until {
                Access::Grace { until }
            } else {
                Access::Withheld
            }
        }
        Some(_) => Access::Withheld,
    }
}

/// What differs between two states of an org's billing, for the change log.
pub fn describe_changes(a: &Org, b: &Org) -> String {
    let mut out = Vec::new();
    let mut diff = |name: &str, x: String, y: String| {
        if x != y {
            out.push(format!("{name}: {x} -> {y}"));
        }
    };
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "none".into());
    let num = |v: Option<i64>| v.map_or_else(|| "none".into(), |n| n.to_string());
    diff("plan", a.plan_id.clone(), b.plan_id.clone());
    diff(
        "plan_version",
        a.plan_version.to_string(),
        b.plan_version.to_string(),
    );
    diff(
        "status",
        opt(&a.subscription_status),
        opt(&b.subscription_status),
    );
    diff(
        "subscription",
        opt(&a.stripe_subscription_id),
        opt(&b.stripe_subscription_id),
    );
    diff(
        "customer",
        opt(&a.stripe_customer_id),
        opt(&b.stripe_customer_id),
    );
    diff("period_start", num(a.period_start), num(b.period_start));
    diff("period_end", num(a.period_end), num(b.period_end));
    diff(
        "cancel_at_period_end",
        a.cancel_at_period_end.to_string(),
        b.cancel_at_period_end.to_string(),
    );
    diff(
        "past_due_since",
        num(a.past_due_since),
        num(b.past_due_since),
    );
    out.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A downgrade made in Stripe is in force from its time, to the second, whatever the
    /// plan paid for still says; one only recorded is not.
    #[test]
    fn a_downgrade_made_in_stripe_is_in_force_from_its_time() {
        let p = crate::shipped_plans();
        let mut org = Org::new("o", "team", 0);
        org.scheduled_plan_id = Some("pro".into());
        org.scheduled_at = Some(100);
        org.scheduled_in_stripe = true;
        assert_eq!(org.effective_plan(&p, 99).id, "team");
        assert_eq!(org.effective_plan(&p, 100).id, "pro");
        org.scheduled_in_stripe = false;
        assert_eq!(org.effective_plan(&p, 100).id, "team");
    }

    #[test]
    fn every_status_maps_to_access() {
        let p = crate::shipped_plans();
        let pro = p.get("pro").unwrap();
        let now = 1_000_000_000;
        let day = 86_400;
        let table: &[(Option<&str>, Option<Secs>, Access)] = &[
            (None, None, Access::Granted),
            (Some("active"), None, Access::Granted),
            (Some("trialing"), None, Access::Granted),
            (
                Some("past_due"),
                Some(now - day),
                Access::Grace {
                    until: now + 6 * day,
                },
            ),
            (
                Some("past_due"),
                Some(now - 7 * day + 1),
                Access::Grace { until: now + 1 },
            ),
            (Some("past_due"), Some(now - 7 * day), Access::Withheld),
            (
                Some("past_due"),
                None,
                Access::Grace {
                    until: now + 7 * day,
                },
            ),
            (Some("incomplete"), None, Access::Withheld),
            (Some("incomplete_expired"), None, Access::Withheld),
            (Some("unpaid"), None, Access::Withheld),
            (Some("canceled"), None, Access::Withheld),
            (Some("paused"), None, Access::Withheld),
            (Some("something_new"), None, Access::Withheld),
        ];
        for (status, since, want) in table {
            assert_eq!(
                access(*status, *since, pro, now),
                *want,
                "{status:?} {since:?}"
            );
        }
    }

    #[test]
    fn a_plan_no_file_defines_is_free_and_says_so() {
        let p = crate::shipped_plans();
        let mut org = Org::new("o", "gold", 0);
        assert_eq!(org.subscribed_plan(&p, 0), (p.free(), true));
        org.plan_id = "team".into();
        assert_eq!(org.subscribed_plan(&p, 0).0.id, "team");
        org.subscription_status = Some("unpaid".into());
        assert_eq!(org.effective_plan(&p, 0).id, "free");
        let (plan, access) = org.plan_access(&p, 0);
        assert_eq!((plan.id.as_str(), access), ("team", Access::Withheld));
    }

    /// An org keeps the version it is on until its move's time, to the second, then has
    /// the new one's terms; a version no file defines is Free, said loudly.
    #[test]
    fn an_org_keeps_its_version_until_it_is_moved() {
        let two = crate::plans::parse_plan(
            &include_str!("../../plans/pro.toml")
                .replace("id = \"pro\"", "id = \"pro\"\nversion = 2")
                .replace("monthly_agent_hours = 40", "monthly_agent_hours = 30")
                .replace("[\"pro_monthly\"]", "[\"pro_monthly_2\"]"),
        )
        .unwrap();
        let shipped = crate::shipped_plans();
        let mut files: Vec<(std::path::PathBuf, Plan)> = shipped
            .all_versions()
            .map(|p| (format!("{}.toml", p.id).into(), p.clone()))
            .collect();
        files.push(("pro-2.toml".into(), two));
        let p = Plans::from_files(std::path::Path::new("plans"), files).unwrap();
        assert_eq!((p.get("pro").unwrap().version, p.iter().count()), (2, 3));
        let mut org = Org::new("o", "pro", 0);
        assert_eq!(org.effective_plan(&p, 0).monthly_limit_seconds, 40 * 3600);
        org.moving_to_version = Some(2);
        org.moving_at = Some(100);
        assert_eq!(org.effective_plan(&p, 99).version, 1);
        assert_eq!(org.effective_plan(&p, 100).monthly_limit_seconds, 30 * 3600);
        org.plan_version = 3;
        org.moving_to_version = None;
        assert_eq!(org.subscribed_plan(&p, 0), (p.free(), true));
    }

    #[test]
    fn changes_are_described_field_by_field() {
        let a = Org::new("o", "free", 0);
        let mut b = a.clone();
        b.plan_id = "pro".into();
        b.subscription_status = Some("active".into());
        assert_eq!(
            describe_changes(&a, &b),
            "plan: free -> pro; status: none -> active"
        );
        assert_eq!(describe_changes(&a, &a), "");
    }
}
