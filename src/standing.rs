//! An org's standing at one moment: its effective plan and both windows' figures. What
//! the usage page shows, what heartbeat answers carry, and what the gate decides from.

use std::sync::Arc;

use crate::ledger::{Rules, Secs};
use crate::plans::{Plan, Plans};
use crate::quota::{WindowUsage, Windows};
use crate::store::{Db, OrgRow, StoreResult};

#[derive(Clone, Debug)]
pub struct Standing {
    pub org: OrgRow,
    pub plan: Plan,
    pub month: WindowUsage,
    pub week: WindowUsage,
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

/// The plan an org is on; an id no plan file defines falls back to Free, loudly.
pub fn effective_plan(org: &OrgRow, plans: &Plans) -> Plan {
    match plans.get(&org.plan_id) {
        Some(p) => p.clone(),
        None => {
            tracing::error!(org_id = %org.org_id, plan_id = %org.plan_id, "org is on a plan no plan file defines; treating it as free");
            plans.free().clone()
        }
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
    let plan = effective_plan(&org, plans);
    let windows = Windows::at(now, org.billing_period());
    let used = db
        .window_usage(org_id, &[windows.month, windows.week], now, rules)
        .await?;
    Ok(Some(Standing {
        month: WindowUsage::new(windows.month, used[0], plan.monthly_limit_seconds),
        week: WindowUsage::new(windows.week, used[1], plan.weekly_limit_seconds),
        org,
        plan,
    }))
}
