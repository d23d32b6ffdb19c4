//! An org's standing read from the store: both windows' figures counted up to now
//! (`rush_meter_core::standing`). What the usage page, heartbeat answers and the upgrade
//! prompt show.

use std::collections::HashMap;

use rush_meter_core::funding;
use rush_meter_core::ledger::Rules;
use rush_meter_core::org::Org;
use rush_meter_core::plans::Plans;
use rush_meter_core::standing::{by_windows, Standing, WindowTotals};
use rush_meter_core::time::{Interval, Secs, Windows};

use crate::store::{Db, StoreResult};

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
            let r = recorded.remove(&org.org_id).unwrap_or_default();
            out.push(standing_of(org.clone(), plans, now, &used, r));
        }
    }
    Ok(out)
}

/// The billing period each org had when it was last read, to guess its windows from
/// before its row is read: a read whose range depends on them (the window sums, a
/// breakdown's default month) then runs beside the read of the org instead of after it.
/// The row read with it settles the guess; a wrong one (a period renewed since, an org
/// not seen yet and billed by Stripe) costs that read once more, never a wrong figure.
#[derive(Clone)]
pub struct PeriodGuesses(moka::future::Cache<String, Option<Interval>>);

impl Default for PeriodGuesses {
    fn default() -> Self {
        PeriodGuesses(moka::future::Cache::builder().max_capacity(100_000).build())
    }
}

impl PeriodGuesses {
    /// The billing period `org_id` most likely has: the one last read, else none (the
    /// calendar month).
    pub async fn period(&self, org_id: &str) -> Option<Interval> {
        self.0.get(org_id).await.flatten()
    }

    /// Remember the period `org` was read with.
    pub async fn learn(&self, org: &Org) {
        self.0
            .insert(org.org_id.clone(), org.billing_period())
            .await;
    }
}

/// An org's standing (`None` when the org does not exist), with the window sums read
/// beside the org's row from the windows `guesses` expects (read again only when the
/// row says otherwise); with `count_parked`, its parked sessions counted in the
/// statement that reads its funding (the usage page's: its running sessions are the
/// standing's), else 0.
pub async fn standing(
    db: &Db,
    guesses: &PeriodGuesses,
    plans: &Plans,
    org_id: &str,
    now: Secs,
    rules: &Rules,
    count_parked: bool,
) -> StoreResult<Option<(Standing, i64)>> {
    let guess = Windows::at(now, guesses.period(org_id).await);
    let ids = [org_id];
    let funding = async {
        match count_parked {
            true => db.funding_record_counting_parked(org_id, now).await,
            false => Ok(db
                .funding_records(&ids, now)
                .await?
                .pop()
                .map(|(org, recorded)| (org, recorded, 0))),
        }
    };
    let (record, guessed) = tokio::join!(funding, db.window_usage(&ids, &guess, now, rules));
    let Some((org, recorded, parked)) = record? else {
        return Ok(None);
    };
    guesses.learn(&org).await;
    let windows = Windows::at(now, org.billing_period());
    let used = match guessed {
        Ok(used) if windows == guess => used,
        _ => db.window_usage(&ids, &windows, now, rules).await?,
    };
    Ok(Some((
        standing_of(org, plans, now, &used, recorded),
        parked,
    )))
}

/// `org`'s standing from the window sums read for it (none: nothing used).
fn standing_of(
    org: Org,
    plans: &Plans,
    now: Secs,
    used: &HashMap<String, WindowTotals>,
    recorded: funding::Recorded,
) -> Standing {
    warn_if_unknown_plan(&org, plans, now);
    let u = used.get(&org.org_id).copied().unwrap_or_default();
    Standing::of(org, plans, now, u, recorded)
}

/// An org on a plan id no plan file defines is treated as Free: say so loudly.
pub fn warn_if_unknown_plan(org: &Org, plans: &Plans, now: Secs) {
    if org.subscribed_plan(plans, now).1 {
        tracing::error!(org_id = %org.org_id, plan_id = %org.plan_id, "org is on a plan no plan file defines; treating it as free");
    }
}

impl super::Services {
    /// The org, or `OrgNotFound`.
    pub async fn org(&self, org_id: &str) -> super::Outcome<Org> {
        self.db
            .get_org(org_id)
            .await?
            .ok_or_else(|| super::Refusal::OrgNotFound(org_id.to_string()))
    }

    /// The org's standing at `now`, or `OrgNotFound`.
    pub async fn standing(&self, org_id: &str, now: Secs) -> super::Outcome<Standing> {
        Ok(self.standing_with(org_id, now, false).await?.0)
    }

    /// `standing`, and the org's parked sessions (the usage page's).
    pub async fn standing_counting_parked(
        &self,
        org_id: &str,
        now: Secs,
    ) -> super::Outcome<(Standing, i64)> {
        self.standing_with(org_id, now, true).await
    }

    async fn standing_with(
        &self,
        org_id: &str,
        now: Secs,
        count_parked: bool,
    ) -> super::Outcome<(Standing, i64)> {
        standing(
            &self.db,
            &self.periods,
            &self.plans,
            org_id,
            now,
            &self.rules,
            count_parked,
        )
        .await?
        .ok_or_else(|| super::Refusal::OrgNotFound(org_id.to_string()))
    }

    /// The standing of each of `org_ids` that exists, by org id.
    pub async fn standings(
        &self,
        org_ids: &[&str],
        now: Secs,
    ) -> super::Outcome<HashMap<String, Standing>> {
        Ok(standings(&self.db, &self.plans, org_ids, now, &self.rules)
            .await?
            .into_iter()
            .map(|s| (s.org.org_id.clone(), s))
            .collect())
    }
}
