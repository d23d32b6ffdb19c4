//! The gate: may an org start (or resume) a run now? Pure: the store gathers the facts
//! inside the transaction that holds the key's lock, and writes what this decides.

mod group;

use crate::funding::{self, Source, WindowKind};
use crate::members::LimitKind;
use crate::plans::{Plan, Plans};
use crate::standing::WindowUsage;
use crate::time::Secs;

pub use group::{decide_group, holds_slot, GroupFacts, GroupOutcome, RunMembers};

named! {
    /// The coding agent a session runs.
    pub enum Agent {
        Claude = "claude",
        Codex = "codex",
        Opencode = "opencode",
    }
}

named! {
    /// What the gate answered.
    pub enum Verdict {
        Allow = "allow",
        Deny = "deny",
    }
}

/// What the orchestrator asks the gate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdmissionRequest {
    pub org_id: String,
    pub key_id: String,
    pub session_id: String,
    pub agent: Agent,
    pub project_id: Option<String>,
    pub started_by: Option<String>,
}

/// Why an admission request could not be decided at all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdmitReject {
    UnknownOrg,
    UnknownKey,
    SessionEnded,
}

/// One decision of the gate, as recorded: what it answered, by which rule, and every
/// figure it was decided from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub org_id: String,
    pub decision_id: String,
    pub decided_at: Secs,
    pub session_id: String,
    pub key_id: String,
    pub decision: Verdict,
    pub reason: Option<Reason>,
    pub rule: Rule,
    pub plan_id: String,
    /// The version of the plan it was decided on.
    pub plan_version: i64,
    pub suspended: bool,
    pub month_start: Secs,
    pub month_end: Secs,
    pub month_used: i64,
    pub month_limit: i64,
    pub week_start: Secs,
    pub week_end: Secs,
    pub week_used: i64,
    pub week_limit: i64,
    pub running: i64,
    pub concurrency_limit: i64,
    pub upgrade_plan: Option<String>,
    /// What pays for an allowed run's first second: plan, grant or overage.
    pub funded_by: Option<Source>,
    /// Seconds each source had left at the decision (running sessions counted up to now).
    pub plan_room: i64,
    pub grant_room: i64,
    pub overage_room: i64,
    /// The org's limit on one of the run's members that decided it (a denial), with what
    /// its member had used in each window: `kind`, id, month used and limit, week used
    /// and limit (a window without a limit: `None`).
    pub limit: Option<LimitFigures>,
}

/// A member's limit and use, as a decision records them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitFigures {
    pub kind: LimitKind,
    pub member_id: String,
    pub month_used: i64,
    pub month_limit: Option<i64>,
    pub week_used: i64,
    pub week_limit: Option<i64>,
}

named! {
    /// Why a run is refused.
    pub enum Reason {
        OrgSuspended = "org_suspended",
        SubscriptionInactive = "subscription_inactive",
        MonthlyCeilingReached = "monthly_ceiling_reached",
        WeeklyCeilingReached = "weekly_ceiling_reached",
        ConcurrencyLimitReached = "concurrency_limit_reached",
        /// Past the plan, and the grants in force are used up.
        GrantsExhausted = "grants_exhausted",
        /// Past the plan and the grants, and pay-as-you-go has reached its monthly cap.
        SpendCapReached = "spend_cap_reached",
        /// The run's user (`started_by`) has spent a limit the org set on it.
        UserCeilingReached = "user_ceiling_reached",
        /// The run's project has spent a limit the org set on it.
        ProjectCeilingReached = "project_ceiling_reached",
        /// The run's API key has spent a limit the org set on it.
        KeyCeilingReached = "key_ceiling_reached",
    }
}

impl Reason {
    /// A denial for want of plan time, grants or money: room an auto top-up can buy.
    pub fn for_want_of_room(self) -> bool {
        matches!(
            self,
            Reason::MonthlyCeilingReached
                | Reason::WeeklyCeilingReached
                | Reason::GrantsExhausted
                | Reason::SpendCapReached
        )
    }
}

/// The rule that decided, recorded with every decision (and written as its name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// The session already holds a slot: the same answer again, no second slot.
    AlreadyAdmitted,
    /// Every check passed.
    WithinLimits,
    Denied(Reason),
}

impl Rule {
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::AlreadyAdmitted => "already_admitted",
            Rule::WithinLimits => "within_limits",
            Rule::Denied(r) => r.as_str(),
        }
    }

    /// The rule of a name `as_str` gave.
    pub fn parse(s: &str) -> Option<Rule> {
        match s {
            "already_admitted" => Some(Rule::AlreadyAdmitted),
            "within_limits" => Some(Rule::WithinLimits),
            _ => Reason::parse(s).map(Rule::Denied),
        }
    }

    pub fn allows(self) -> bool {
        !matches!(self, Rule::Denied(_))
    }

    /// Every name a rule takes: the two that allow, then every reason.
    pub fn names() -> Vec<&'static str> {
        let allowing = [Rule::AlreadyAdmitted, Rule::WithinLimits].map(Rule::as_str);
        allowing
            .into_iter()
            .chain(Reason::NAMES.iter().copied())
            .collect()
    }
}

/// What a decision is made from.
#[derive(Clone, Debug)]
pub struct Facts<'a> {
    pub suspended: bool,
    pub plan: &'a Plan,
    pub month: &'a WindowUsage,
    pub week: &'a WindowUsage,
    /// Slots the key's other sessions hold.
    pub running: i64,
    pub limit: i64,
    pub holds_slot: bool,
    /// Who would pay, running sessions counted up to `now`.
    pub funding: &'a funding::State,
    pub now: Secs,
    /// The org's limit on one of the run's members that is spent, if one is.
    pub spent_limit: Option<LimitKind>,
}

/// The gate's rules, in the order they bind.
pub fn decide(f: &Facts) -> Rule {
    if f.holds_slot {
        Rule::AlreadyAdmitted
    } else if f.suspended {
        Rule::Denied(Reason::OrgSuspended)
    } else if let Some(reason) = spent(f.funding, f.now) {
        Rule::Denied(reason)
    } else if let Some(kind) = f.spent_limit {
        Rule::Denied(match kind {
            LimitKind::User => Reason::UserCeilingReached,
            LimitKind::Project => Reason::ProjectCeilingReached,
            LimitKind::Key => Reason::KeyCeilingReached,
        })
    } else if f.running >= f.limit {
        Rule::Denied(Reason::ConcurrencyLimitReached)
    } else {
        Rule::WithinLimits
    }
}

/// Why nothing is left to pay for a run at `now`, if nothing is: the spend cap when the org
/// pays as it goes, its grants when it holds any, else the ceiling that binds (the month's
/// first).
pub fn spent(state: &funding::State, now: Secs) -> Option<Reason> {
    if state.next_source(now).is_some() {
        return None;
    }
    let w = state.windows_at(now);
    let month_full = state.funds(WindowKind::Month, w.month).plan >= state.terms.month_limit;
    Some(if state.terms.pay_as_you_go() {
        Reason::SpendCapReached
    } else if state.holds_grants {
        Reason::GrantsExhausted
    } else if month_full {
        Reason::MonthlyCeilingReached
    } else {
        Reason::WeeklyCeilingReached
    })
}

/// Seconds each source has left, running sessions counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rooms {
    pub plan: i64,
    pub grant: i64,
    pub overage: i64,
}

/// What pays for a run allowed at `now`, and each source's room then.
pub fn funded_by(state: &funding::State, now: Secs) -> (Option<Source>, Rooms) {
    let w = state.windows_at(now);
    let rooms = Rooms {
        plan: state.plan_room(&w),
        grant: state.grant_room(now),
        overage: state.overage_room(&w),
    };
    (state.next_source(now).map(|(s, _)| s), rooms)
}

/// The cheapest dearer plan whose ceilings or concurrency would have allowed the run.
pub fn upgrade_for<'p>(plans: &'p Plans, reason: Reason, f: &Facts) -> Option<&'p Plan> {
    let fits = |p: &Plan| match reason {
        Reason::MonthlyCeilingReached
        | Reason::WeeklyCeilingReached
        | Reason::GrantsExhausted
        | Reason::SpendCapReached => {
            p.monthly_limit_seconds > f.month.used_seconds
                && p.weekly_limit_seconds > f.week.used_seconds
        }
        Reason::ConcurrencyLimitReached => p.concurrency_max > f.running,
        // The org's own limits: no plan lifts them.
        Reason::OrgSuspended
        | Reason::SubscriptionInactive
        | Reason::UserCeilingReached
        | Reason::ProjectCeilingReached
        | Reason::KeyCeilingReached => false,
    };
    plans
        .iter()
        .filter(|p| p.price > f.plan.price && fits(p))
        .min_by(|a, b| a.price.cmp(&b.price).then_with(|| a.id.cmp(&b.id)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::funding::{Grant, GrantKind, State, Terms};
    use crate::time::{Interval, Windows};

    /// Monday 2026-11-30 12:00 UTC.
    const NOW: Secs = 1_796_040_000;

    fn plans() -> Plans {
        crate::shipped_plans()
    }

    fn window(used: i64, limit: i64) -> WindowUsage {
        WindowUsage::new(Interval::new(0, 10).unwrap(), used, limit)
    }

    /// Funding with these ceilings, the plan having paid `month` and `week` seconds.
    fn funded(month: (i64, i64), week: (i64, i64)) -> State {
        let mut s = State::new(
            Terms {
                month_limit: month.1,
                week_limit: week.1,
                price_units: 0,
                cap_units: 0,
            },
            None,
            0,
            [],
            vec![],
        );
        let w = Windows::at(NOW, None);
        s.seed(WindowKind::Month, w.month, month.0);
        s.seed(WindowKind::Week, w.week, week.0);
        s
    }

    #[test]
    fn rules_bind_in_order() {
        let p = plans();
        let free = p.free();
        let (m, w) = (window(0, 100), window(0, 50));
        let room = funded((0, 100), (0, 50));
        let base = Facts {
            suspended: false,
            plan: free,
            month: &m,
            week: &w,
            running: 0,
            limit: 4,
            holds_slot: false,
            funding: &room,
            now: NOW,
            spent_limit: None,
        };
        assert_eq!(decide(&base), Rule::WithinLimits);
        let full_week = funded((50, 100), (50, 50));
        let f = Facts {
            funding: &full_week,
            ..base.clone()
        };
        assert_eq!(decide(&f), Rule::Denied(Reason::WeeklyCeilingReached));
        let full = funded((100, 100), (50, 50));
        let f = Facts {
            funding: &full,
            ..base.clone()
        };
        assert_eq!(decide(&f), Rule::Denied(Reason::MonthlyCeilingReached));
        let f = Facts {
            running: 4,
            ..base.clone()
        };
        assert_eq!(decide(&f), Rule::Denied(Reason::ConcurrencyLimitReached));
        let f = Facts {
            running: 4,
            suspended: true,
            ..base.clone()
        };
        assert_eq!(decide(&f), Rule::Denied(Reason::OrgSuspended));
        let f = Facts {
            running: 9,
            holds_slot: true,
            ..base
        };
        assert_eq!(decide(&f), Rule::AlreadyAdmitted);
    }

    #[test]
    fn past_the_plan_a_grant_or_the_cap_lets_it_run_and_says_why_not_when_spent() {
        let mut with_grant = funded((100, 100), (50, 50));
        with_grant.grants.push(Grant {
            org_id: "o".into(),
            grant_id: "g".into(),
            kind: GrantKind::Promo,
            seconds: 10,
            used_seconds: 0,
            priority: 50,
            starts_at: 0,
            expires_at: None,
            note: None,
            idempotency_key: None,
            created_at: 0,
            voided_at: None,
            used_up_at: None,
        });
        with_grant.holds_grants = true;
        assert_eq!(spent(&with_grant, NOW), None);
        assert_eq!(funded_by(&with_grant, NOW).0, Some(Source::Grant));
        with_grant.project(NOW, 10);
        assert_eq!(spent(&with_grant, NOW), Some(Reason::GrantsExhausted));

        let capped = funded((100, 100), (50, 50)).on_terms(Terms {
            month_limit: 100,
            week_limit: 50,
            price_units: 5000,
            cap_units: 5000 * 60,
        });
        assert_eq!(
            funded_by(&capped, NOW),
            (
                Some(Source::Overage),
                Rooms {
                    plan: 0,
                    grant: 0,
                    overage: 60
                }
            )
        );
        let mut spent_cap = capped.clone();
        spent_cap.project(NOW, 60);
        assert_eq!(spent(&spent_cap, NOW), Some(Reason::SpendCapReached));
    }

    #[test]
    fn upgrade_is_the_cheapest_plan_that_fits() {
        let p = plans();
        let (m, w) = (window(4 * 3600, 5 * 3600), window(2 * 3600, 2 * 3600));
        let room = funded((0, 1), (0, 1));
        let f = Facts {
            suspended: false,
            plan: p.free(),
            month: &m,
            week: &w,
            running: 0,
            limit: 4,
            holds_slot: false,
            funding: &room,
            now: NOW,
            spent_limit: None,
        };
        assert_eq!(
            upgrade_for(&p, Reason::WeeklyCeilingReached, &f).map(|x| x.id.as_str()),
            Some("pro")
        );
        let big = window(20 * 3600, 2 * 3600);
        let f2 = Facts {
            week: &big,
            ..f.clone()
        };
        assert_eq!(
            upgrade_for(&p, Reason::WeeklyCeilingReached, &f2).map(|x| x.id.as_str()),
            Some("team")
        );
        let f3 = Facts {
            running: 10,
            plan: p.get("pro").unwrap(),
            ..f.clone()
        };
        assert_eq!(
            upgrade_for(&p, Reason::ConcurrencyLimitReached, &f3).map(|x| x.id.as_str()),
            Some("team")
        );
        assert!(upgrade_for(&p, Reason::OrgSuspended, &f).is_none());
    }
}
