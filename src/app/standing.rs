//! An org's standing read from the store: both windows' figures counted up to now
//! (`rush_meter_core::standing`). What the usage page, heartbeat answers and the upgrade
//! prompt show.

use std::collections::HashMap;

use rush_meter_core::funding;
use rush_meter_core::ledger::Rules;
use rush_meter_core::org::Org;
use rush_meter_core::plans::Plans;
use rush_meter_core::standing::{by_windows, Standing};
use rush_meter_core::time::Secs;

use crate::store::{Db, StoreResult};

/// `None` when the org does not exist.
pub async fn standing(
    db: &Db,
    plans: &Plans,
    org_id: &str,
    now: Secs,
    rules: &Rules,
) -> StoreResult<Option<Standing>> {
    Ok(standings(db, plans, &[org_id], now, rules).await?.pop())
}

/// The standing of each of `org_ids` that exists, reading the orgs that share windows in
/// one statement (what a group of heartbeat requests needs after its commit).
pub async fn standings(
    db: &Db,
    plans: &Plans,
    org_ids: &[&str],
    now: Secs,
    rules: &Rules,
) -> StoreResult<Vec<Standing>> {
    let records = db.funding_records(org_ids, now).await?;
    let mut recorded: HashMap<String, funding::Recorded> = HashMap::with_capacity(records.len());
    let mut orgs = Vec::with_capacity(records.len());
    for (org, r) in records {
        recorded.insert(org.org_id.clone(), r);
        orgs.push(org);
    }
    let mut out = Vec::with_capacity(orgs.len());
    for (windows, group) in by_windows(&orgs, now) {
        let ids: Vec<&str> = group.iter().map(|o| o.org_id.as_str()).collect();
        let used = db.window_usage(&ids, &windows, now, rules).await?;
        for org in group {
            warn_if_unknown_plan(org, plans);
            let u = used.get(&org.org_id).copied().unwrap_or_default();
            let r = recorded.remove(&org.org_id).unwrap_or_default();
            out.push(Standing::of(org.clone(), plans, now, u, r));
        }
    }
    Ok(out)
}

/// An org on a plan id no plan file defines is treated as Free: say so loudly.
pub fn warn_if_unknown_plan(org: &Org, plans: &Plans) {
    if org.subscribed_plan(plans).1 {
        tracing::error!(org_id = %org.org_id, plan_id = %org.plan_id, "org is on a plan no plan file defines; treating it as free");
    }
}
