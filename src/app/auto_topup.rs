//! Auto top-up in the service (docs/funding.md): a pack is opened where the crossing is
//! seen, on the standing read after each heartbeat commit (the figure the gate reads, as
//! just committed), after a denial for want of room (an org with nothing running has no
//! heartbeats), and when it is turned on; the instance that opens it charges it at once
//! (`billing::auto_topup`). Packs whose charge is due again (a retry after a decline, an
//! instance that died before the answer) are swept every 5 s with traffic, backing off
//! to the idle wait without (`pace`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rush_meter_core::auto_topup::{pack_amount, AutoTopup};
use rush_meter_core::ledger::Rules;
use rush_meter_core::plans::Plans;
use rush_meter_core::standing::Standing;
use rush_meter_core::time::{Secs, Windows};
use tokio::sync::{mpsc, watch};

use super::pace::{Activity, Pace};
use super::standing::standings;
use crate::billing::auto_topup::charge;
use crate::billing::Billing;
use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::store::{AutoTopupRow, Db, NewPack, StoreResult};

/// How long the instance that opened (or took) a pack holds its charge before any other
/// may send it: past one Stripe call with its retries (`billing::api`, 30 s timeouts).
const HOLD: Secs = 120;

/// Packs swept at a time.
const SWEEP: i64 = 50;

/// Opens packs at crossings and hands them to this instance's charger.
#[derive(Clone)]
pub struct AutoTopups(Arc<Inner>);

struct Inner {
    db: Db,
    plans: Arc<Plans>,
    rules: Rules,
    clock: Clock,
    metrics: Arc<Metrics>,
    charge: mpsc::Sender<AutoTopupRow>,
    /// Orgs a pack could not be opened for: what they were seen with (packs opened, the
    /// month, the settings), so that each heartbeat of an org below its threshold at its
    /// monthly maximum does not try again until one of them changes.
    full: Mutex<HashMap<String, Seen>>,
    /// When each org denied for want of room may be looked at again.
    looked: Mutex<HashMap<String, Secs>>,
}

/// What an org was seen with when no pack could be opened for it.
type Seen = (i64, Secs, AutoTopup);

/// How often an org denied for want of room is looked at for a pack, an instance: with
/// auto top-up on, and without (it may be turned on on another instance).
const DENIAL_LOOK: (Secs, Secs) = (5, 60);

impl AutoTopups {
    pub fn new(
        db: Db,
        (plans, rules): (Arc<Plans>, Rules),
        clock: Clock,
        metrics: Arc<Metrics>,
    ) -> (AutoTopups, mpsc::Receiver<AutoTopupRow>) {
        let (tx, rx) = mpsc::channel(1024);
        let inner = Inner {
            db,
            plans,
            rules,
            clock,
            metrics,
            charge: tx,
            full: Mutex::default(),
            looked: Mutex::default(),
        };
        (AutoTopups(Arc::new(inner)), rx)
    }

    /// Open a pack if `s` shows the org below its threshold, with none in flight.
    pub async fn consider(&self, s: &Standing) -> StoreResult<Option<AutoTopupRow>> {
        let a = &s.org.auto_topup;
        if !a.due(&s.funding, s.at) {
            return Ok(None);
        }
        let inner = &self.0;
        let month = Windows::at(s.at, s.org.billing_period()).month.start;
        let seen: Seen = (a.opened, month, a.clone());
        if inner.full.lock().expect("full lock").get(&s.org.org_id) == Some(&seen) {
            return Ok(None);
        }
        let (plan, _) = s.org.subscribed_plan(&inner.plans, s.at);
        if !plan.topup_hours.contains(&a.pack_hours) {
            // Another plan since it was set, which does not sell the pack: none is bought
            // until the org sets one it sells.
            tracing::warn!(org_id = %s.org.org_id, plan = %plan.id, pack_hours = a.pack_hours, "auto top-up: the plan does not sell the org's pack; none bought");
            return Ok(None);
        }
        let pack = NewPack {
            hours: a.pack_hours,
            amount: format!("{:.2}", pack_amount(plan, a.pack_hours)),
            currency: plan.currency.clone(),
            month_start: month,
            hold_until: s.at + HOLD,
        };
        let opened = inner
            .db
            .open_auto_topup(&s.org.org_id, a.opened, &pack, s.at)
            .await?;
        let Some(row) = opened else {
            // Opened by another reader, or the month is full: which, the next read says.
            let mut full = inner.full.lock().expect("full lock");
            if full.len() > 100_000 {
                full.clear();
            }
            full.insert(s.org.org_id.clone(), seen);
            return Ok(None);
        };
        crate::metrics::count(&inner.metrics.auto_topups, "opened");
        tracing::info!(org_id = %row.org_id, seq = row.seq, hours = row.hours, "auto top-up: pack opened at the crossing");
        // Full queue: the sweep sends it once its hold ends.
        let _ = inner.charge.try_send(row.clone());
        Ok(Some(row))
    }

    /// Read each org's standing now and open a pack where one is due: after a denial for
    /// want of room, and when auto top-up is turned on.
    pub async fn consider_orgs(&self, org_ids: &[&str]) -> StoreResult<()> {
        let inner = &self.0;
        let now = inner.clock.now();
        for s in standings(&inner.db, &inner.plans, org_ids, now, &inner.rules).await? {
            let again = match s.org.auto_topup.enabled {
                true => DENIAL_LOOK.0,
                false => DENIAL_LOOK.1,
            };
            inner
                .looked
                .lock()
                .expect("looked lock")
                .insert(s.org.org_id.clone(), now + again);
            self.consider(&s).await?;
        }
        Ok(())
    }

    /// Look at orgs denied for want of room in the background, each at most once a
    /// `DENIAL_LOOK` on this instance: the denial is answered meanwhile, and an org with
    /// auto top-up on is admitted by the next request once its pack is paid.
    pub fn after_denials(&self, org_ids: &[&str], now: Secs) {
        let due: Vec<String> = {
            let mut looked = self.0.looked.lock().expect("looked lock");
            if looked.len() > 100_000 {
                looked.clear();
            }
            let mut due = Vec::new();
            for id in org_ids {
                if looked.get(*id).is_some_and(|next| now < *next) {
                    continue;
                }
                // Until it is read: the read sets when to look again.
                looked.insert((*id).to_owned(), now + DENIAL_LOOK.1);
                due.push((*id).to_owned());
            }
            due
        };
        if due.is_empty() {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let ids: Vec<&str> = due.iter().map(String::as_str).collect();
            if let Err(e) = this.consider_orgs(&ids).await {
                tracing::warn!(error = %e, "auto top-up: looking at orgs denied for want of room failed");
            }
        });
    }

    /// `consider` for a heartbeat's standings: a failure is logged, never the answer's.
    pub async fn consider_all(&self, fresh: &[Standing]) {
        for s in fresh.iter().filter(|s| s.org.auto_topup.enabled) {
            if let Err(e) = self.consider(s).await {
                tracing::warn!(org_id = %s.org.org_id, error = %e, "auto top-up: opening a pack failed; the next heartbeat tries again");
            }
        }
    }
}

/// Charge what this instance opens at once, and sweep what is due, until `stop`.
pub async fn run(
    topups: AutoTopups,
    billing: Billing,
    mut opened: mpsc::Receiver<AutoTopupRow>,
    (activity, idle): (Arc<Activity>, Duration),
    mut stop: watch::Receiver<bool>,
) {
    let mut pace = Pace::new(Duration::from_secs(5), idle);
    loop {
        tokio::select! {
            row = opened.recv() => match row {
                Some(row) => send(&billing, &row).await,
                None => return,
            },
            _ = pace.wait(Some(&activity)) => {
                match topups.sweep(&billing).await {
                    Ok(n) => pace.after(n > 0),
                    Err(e) => {
                        tracing::warn!(error = %e, "auto top-up: sweeping due packs failed; will retry");
                        pace.after(true);
                    }
                }
            }
            _ = stop.changed() => return,
        }
    }
}

impl AutoTopups {
    /// Take each due pack (so one instance sends it) and charge it, or end a retry no
    /// longer wanted; how many were taken.
    async fn sweep(&self, b: &Billing) -> StoreResult<usize> {
        let now = b.clock.now();
        let mut taken = 0;
        for row in b.db.due_auto_topups(now, SWEEP).await? {
            let held =
                b.db.take_auto_topup(&row.org_id, row.seq, row.next_attempt_at, now + HOLD, now)
                    .await?;
            let Some(row) = held else { continue };
            taken += 1;
            if let Some(why) = self.unwanted(&row, now).await? {
                match crate::billing::auto_topup::call_off(b, &row, why).await {
                    Ok(true) => {
                        tracing::info!(org_id = %row.org_id, seq = row.seq, why, "auto top-up: a declined pack is not charged again");
                    }
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(org_id = %row.org_id, seq = row.seq, error = %e, "auto top-up: calling off a pack failed; tried again when its hold ends");
                    }
                }
                continue;
            }
            send(b, &row).await;
        }
        Ok(taken)
    }

    /// Why a pack waiting to be charged again after a decline is no longer wanted: auto
    /// top-up was turned off, or the org is back above its threshold (a week reset, a grant
    /// or top-up bought meanwhile). A first charge is always sent (again): its outcome may
    /// be unknown, and only its key can learn it.
    async fn unwanted(&self, row: &AutoTopupRow, now: Secs) -> StoreResult<Option<&'static str>> {
        if row.attempts == 0 {
            return Ok(None);
        }
        let inner = &self.0;
        let ids = [row.org_id.as_str()];
        let Some(s) = standings(&inner.db, &inner.plans, &ids, now, &inner.rules)
            .await?
            .pop()
        else {
            return Ok(Some("the org is gone"));
        };
        let a = &s.org.auto_topup;
        Ok(if !a.enabled {
            Some("auto top-up was turned off")
        } else if rush_meter_core::auto_topup::usable_seconds(&s.funding, now) >= a.below_seconds {
            Some("the org has room again")
        } else {
            None
        })
    }
}

async fn send(b: &Billing, row: &AutoTopupRow) {
    if let Err(e) = charge(b, row).await {
        tracing::warn!(org_id = %row.org_id, seq = row.seq, error = %e, "auto top-up: charge not sent; tried again when its hold ends");
    }
}
