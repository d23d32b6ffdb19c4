//! An org's standing at one moment: its effective plan and both windows' figures. What
//! the usage page shows, what heartbeat answers carry, and what the gate decides from.

use std::collections::HashMap;
use std::sync::Arc;

use crate::billing::subscription::{access, Access};
use crate::ledger::{Interval, Rules, Secs};
use crate::plans::{Plan, Plans};
use crate::quota::{WindowUsage, Windows};
use crate::store::{Db, OrgRow, StoreResult};

#[derive(Clone, Debug)]
pub struct Standing {
    pub org: OrgRow,
    pub plan: Plan,
    pub month: WindowUsage,
    pub week: WindowUsage,
    /// Running sessions heard from within the lease.
    pub running: i64,
}

impl Standing {
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

/// The plan an org pays for (or an admin set); an id no plan file defines falls back to
/// Free, loudly.
pub fn subscribed_plan(org: &OrgRow, plans: &Plans) -> Plan {
    match plans.get(&org.plan_id) {
        Some(p) => p.clone(),
        None => {
            tracing::error!(org_id = %org.org_id, plan_id = %org.plan_id, "org is on a plan no plan file defines; treating it as free");
            plans.free().clone()
        }
    }
}

/// The plan an org's subscription grants now, and what its status grants.
pub fn plan_access(org: &OrgRow, plans: &Plans, now: Secs) -> (Plan, Access) {
    let plan = subscribed_plan(org, plans);
    let access = access(
        org.subscription_status.as_deref(),
        org.past_due_since,
        &plan,
        now,
    );
    (plan, access)
}

/// The plan an org's decisions and windows use now: the one it pays for while its status
/// grants it, Free otherwise.
pub fn effective_plan(org: &OrgRow, plans: &Plans, now: Secs) -> Plan {
    match plan_access(org, plans, now) {
        (plan, a) if a.grants_plan() => plan,
        _ => plans.free().clone(),
    }
}

/// `None` when the org does not exist.
pub async fn standing(
    db: &Db,
    plans: &Arc<Plans>,
    org_id: &str,
    now: Secs,
    rules: &Rules,
) -> StoreResult<Option<Standing>> {
    let Some(org) = db.get_org(org_id).await? else {
        return Ok(None);
    };
    Ok(standings_of(db, plans, vec![org], now, rules).await?.pop())
}

/// The standing of each of `org_ids` that exists, reading the orgs that share windows in
/// one statement (what a group of heartbeat requests needs after its commit).
pub async fn standings(
    db: &Db,
    plans: &Arc<Plans>,
    org_ids: &[&str],
    now: Secs,
    rules: &Rules,
) -> StoreResult<Vec<Standing>> {
    let orgs = db.get_orgs(org_ids).await?;
    standings_of(db, plans, orgs, now, rules).await
}

async fn standings_of(
    db: &Db,
    plans: &Arc<Plans>,
    orgs: Vec<OrgRow>,
    now: Secs,
    rules: &Rules,
) -> StoreResult<Vec<Standing>> {
    let mut by_windows: HashMap<(Interval, Interval), Vec<OrgRow>> = HashMap::new();
    for org in orgs {
        let w = Windows::at(now, org.billing_period());
        by_windows.entry((w.month, w.week)).or_default().push(org);
    }
    let mut out = Vec::new();
    for ((month, week), orgs) in by_windows {
        let windows = Windows { month, week };
        let ids: Vec<&str> = orgs.iter().map(|o| o.org_id.as_str()).collect();
        let used = db.window_usage(&ids, &windows, now, rules).await?;
        for org in orgs {
            let plan = effective_plan(&org, plans, now);
            let u = used.get(&org.org_id).copied().unwrap_or_default();
            out.push(Standing {
                month: WindowUsage::new(month, u.month, plan.monthly_limit_seconds),
                week: WindowUsage::new(week, u.week, plan.weekly_limit_seconds),
                running: u.running,
                org,
                plan,
            });
        }
    }
    Ok(out)
}
