//! Bringing an org in step with its Stripe subscription: which org a subscription belongs
//! to, and the state it gives that org. Used alike by webhooks, reconciliation and
//! checkouts, so that all three apply Stripe's state the same way.

use rush_meter_core::org::Org;
use rush_meter_core::plans::{Plan, Plans};
use rush_meter_core::time::Secs;

use crate::store::SubscriptionState;

use super::subscription::Subscription;

/// When, and in what order, a subscription was read from Stripe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Read {
    /// The meter's time of the read (the hold of a downgrade is judged by it).
    pub at: Secs,
    /// A ticket of the org's sequence taken before the read (`Billing::ticket`): the state
    /// read after the highest ticket is the newest, whatever instances' clocks say. `None`
    /// for a state taken from an event's own content (no API key), ordered by `at`.
    pub ticket: Option<i64>,
}

/// Statuses that grant the plan, now or through a grace.
fn is_live(status: &str) -> bool {
    matches!(status, "active" | "trialing" | "past_due")
}

/// The state `sub`, read from Stripe at `synced_at`, gives `org`; `None` when it must not
/// touch the org (an old subscription of the org ending after a new one began).
pub fn state_for(
    org: &Org,
    sub: &Subscription,
    plans: &Plans,
    read: Read,
) -> Option<SubscriptionState> {
    let synced_at = read.at;
    let current = org.stripe_subscription_id.as_deref();
    if current.is_some_and(|c| c != sub.id) {
        // Another subscription than the org's current one: it ending changes nothing, and
        // one that grants nothing does not displace one that grants the plan.
        let current_live = org.subscription_status.as_deref().is_some_and(is_live);
        if sub.is_over() || (current_live && !is_live(sub.acting_status())) {
            return None;
        }
    }
    let status = sub.acting_status();
    if status != sub.status {
        tracing::warn!(org_id = %org.org_id, subscription = %sub.id, stripe_status = %sub.status, status, "Stripe paused the subscription on a failed payment: held as past due, with the plan's grace");
    }
    // A subscription of a shape the service does not know is refused before it gets here
    // (`Subscription::recognized`): the org keeps its plan.
    let priced = if sub.is_over() {
        Some(plans.free())
    } else {
        sub.plan(plans)
    };
    let plan_id = priced.map_or_else(|| org.plan_id.clone(), |p| p.id.clone());
    // A downgrade made in Stripe ahead of the period's end: Stripe bills the next period at
    // the new price, and the org keeps the plan it paid for until then.
    let held = org.scheduled_in_stripe
        && current == Some(sub.id.as_str())
        && org.scheduled_plan_id.as_deref() == Some(plan_id.as_str())
        && org.scheduled_at.is_some_and(|at| synced_at < at);
    let plan_id = if held { org.plan_id.clone() } else { plan_id };
    let plan_version = plan_version(org, &plan_id, priced.or(plans.get(&plan_id)), synced_at);
    let past_due_since = (status == "past_due").then(|| {
        let was_past_due = org.subscription_status.as_deref() == Some("past_due")
            && current == Some(sub.id.as_str());
        org.past_due_since
            .filter(|_| was_past_due)
            .unwrap_or(synced_at)
    });
    let period = (!sub.is_over()).then(|| sub.period(plans)).flatten();
    Some(SubscriptionState {
        org_id: org.org_id.clone(),
        plan_id,
        plan_version,
        customer_id: sub.customer.id().to_owned(),
        subscription_id: Some(sub.id.clone()),
        status: Some(status.to_owned()),
        period_start: period.map(|p| p.start),
        period_end: period.map(|p| p.end),
        cancel_at_period_end: sub.cancel_at_period_end,
        past_due_since,
        synced_at,
        ticket: read.ticket,
    })
}

/// The version of `plan_id` an org is on after a state of its subscription: on the same
/// plan, the one it is on (a version changes only by an operator's move, whatever price
/// Stripe renews at); on another, the version whose price the subscription pays (each
/// version's prices are its own), or that plan's newest (Free, or a price no file names).
fn plan_version(org: &Org, plan_id: &str, priced: Option<&Plan>, at: Secs) -> i64 {
    match priced {
        _ if plan_id == org.plan_id => org.plan_version_at(at),
        Some(p) if p.id == plan_id => p.version,
        _ => 1,
    }
}

/// Whether `s` would change what `org` records of its subscription (a read worth making
/// again under a ticket before it is applied).
pub fn changes(org: &Org, s: &SubscriptionState) -> bool {
    org.plan_id != s.plan_id
        || org.plan_version != s.plan_version
        || org.stripe_customer_id.as_deref() != Some(s.customer_id.as_str())
        || org.stripe_subscription_id != s.subscription_id
        || org.subscription_status != s.status
        || org.period_start != s.period_start
        || org.period_end != s.period_end
        || org.cancel_at_period_end != s.cancel_at_period_end
        || org.past_due_since != s.past_due_since
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::shipped_plans as plans;

    fn at(t: Secs) -> Read {
        Read {
            at: t,
            ticket: None,
        }
    }

    fn org() -> Org {
        let mut o = Org::new("org_1", "free", 0);
        o.stripe_customer_id = Some("cus_1".into());
        o
    }

    fn sub(id: &str, status: &str, plan: &str) -> Subscription {
        serde_json::from_value(
            serde_json::json!({"id": id, "status": status, "customer": "cus_1",
            "current_period_start": 100, "current_period_end": 200,
            "items": {"data": [{"id": "si_1", "plan": {"id": plan}}]}}),
        )
        .unwrap()
    }

    fn apply(org: &mut Org, s: &SubscriptionState) {
        org.plan_id.clone_from(&s.plan_id);
        org.stripe_subscription_id.clone_from(&s.subscription_id);
        org.subscription_status.clone_from(&s.status);
        org.past_due_since = s.past_due_since;
        org.period_start = s.period_start;
        org.period_end = s.period_end;
    }

    /// A downgrade made in Stripe ahead of the period's end: Stripe's word on the changed
    /// subscription leaves the org on the plan it paid for until the schedule's time, and
    /// from then on puts it on the new one.
    #[test]
    fn a_downgrade_made_in_stripe_holds_the_paid_plan_until_its_time() {
        let p = plans();
        let mut o = org();
        o.plan_id = "team".into();
        o.stripe_subscription_id = Some("sub_1".into());
        o.subscription_status = Some("active".into());
        o.scheduled_plan_id = Some("pro".into());
        o.scheduled_at = Some(200);
        o.scheduled_in_stripe = true;
        let s = sub("sub_1", "active", "pro_monthly");
        assert_eq!(state_for(&o, &s, &p, at(150)).unwrap().plan_id, "team");
        assert_eq!(state_for(&o, &s, &p, at(200)).unwrap().plan_id, "pro");
        // Recorded to be made later (an older release): Stripe's word applies as it is.
        o.scheduled_in_stripe = false;
        assert_eq!(state_for(&o, &s, &p, at(150)).unwrap().plan_id, "pro");
    }

    #[test]
    fn a_subscription_sets_plan_period_and_status() {
        let p = plans();
        let s = state_for(&org(), &sub("sub_1", "active", "team_monthly"), &p, at(50)).unwrap();
        assert_eq!(
            (s.plan_id.as_str(), s.period_start, s.period_end),
            ("team", Some(100), Some(200))
        );
        assert_eq!(
            (s.status.as_deref(), s.past_due_since),
            (Some("active"), None)
        );
        let over = state_for(
            &org(),
            &sub("sub_1", "canceled", "team_monthly"),
            &p,
            at(50),
        )
        .unwrap();
        assert_eq!((over.plan_id.as_str(), over.period_start), ("free", None));
        // Refused before it gets here (`Subscription::recognized`); were it not, the org
        // would keep the plan it pays for, not drop to Free.
        let mut paying = org();
        paying.plan_id = "team".into();
        let unknown =
            state_for(&paying, &sub("sub_1", "active", "gold_monthly"), &p, at(50)).unwrap();
        assert_eq!(unknown.plan_id, "team");
    }

    #[test]
    fn past_due_keeps_the_time_it_began() {
        let p = plans();
        let mut o = org();
        let s = state_for(&o, &sub("sub_1", "past_due", "pro_monthly"), &p, at(1000)).unwrap();
        assert_eq!(s.past_due_since, Some(1000));
        apply(&mut o, &s);
        let again = state_for(&o, &sub("sub_1", "past_due", "pro_monthly"), &p, at(5000)).unwrap();
        assert_eq!(again.past_due_since, Some(1000));
        let active = state_for(&o, &sub("sub_1", "active", "pro_monthly"), &p, at(6000)).unwrap();
        apply(&mut o, &active);
        let later = state_for(&o, &sub("sub_1", "past_due", "pro_monthly"), &p, at(9000)).unwrap();
        assert_eq!(later.past_due_since, Some(9000));
    }

    #[test]
    fn an_old_subscription_ending_does_not_touch_the_new_one() {
        let p = plans();
        let mut o = org();
        let first = state_for(&o, &sub("sub_new", "active", "pro_monthly"), &p, at(10)).unwrap();
        apply(&mut o, &first);
        assert_eq!(
            state_for(&o, &sub("sub_old", "canceled", "team_monthly"), &p, at(20)),
            None
        );
        // One that grants nothing does not displace it; a new live one replaces it.
        assert_eq!(
            state_for(&o, &sub("sub_x", "incomplete", "team_monthly"), &p, at(25)),
            None
        );
        let s = state_for(&o, &sub("sub_newer", "active", "team_monthly"), &p, at(30)).unwrap();
        assert_eq!(s.subscription_id.as_deref(), Some("sub_newer"));
    }

    /// Each version's prices are its own: a subscription that puts an org on a plan puts it
    /// on the version its price belongs to; on the plan it is on, only an operator's move
    /// changes the version, whatever price Stripe renews at.
    #[test]
    fn a_price_names_its_version_and_a_renewal_keeps_the_one_moved_to() {
        let pro = include_str!("../../plans/pro.toml");
        let two = pro
            .replace("id = \"pro\"", "id = \"pro\"\nversion = 2")
            .replace("[\"pro_monthly\"]", "[\"pro_monthly_v2\"]");
        let mut files: Vec<(std::path::PathBuf, String)> = ["free", "team"]
            .iter()
            .map(|f| {
                let path = format!("{}/plans/{f}.toml", env!("CARGO_MANIFEST_DIR"));
                (path.clone().into(), std::fs::read_to_string(path).unwrap())
            })
            .collect();
        files.push(("pro.toml".into(), pro.to_owned()));
        files.push(("pro-2.toml".into(), two));
        let p = Plans::from_texts(std::path::Path::new("plans"), files).unwrap();
        let on = |o: &Org, price: &str| {
            let s = state_for(o, &sub("sub_1", "active", price), &p, at(50)).unwrap();
            (s.plan_id, s.plan_version)
        };
        assert_eq!(on(&org(), "pro_monthly"), ("pro".into(), 1));
        assert_eq!(on(&org(), "pro_monthly_v2"), ("pro".into(), 2));
        let mut moved = org();
        moved.plan_id = "pro".into();
        moved.plan_version = 2;
        assert_eq!(on(&moved, "pro_monthly"), ("pro".into(), 2));
        // A move waiting is the version once its time has come.
        moved.plan_version = 1;
        moved.moving_to_version = Some(2);
        moved.moving_at = Some(40);
        assert_eq!(on(&moved, "pro_monthly"), ("pro".into(), 2));
        assert_eq!(on(&moved, "team_monthly"), ("team".into(), 1));
    }
}
