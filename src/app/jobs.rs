//! The background jobs, started and stopped in one place: expiry, Stripe events,
//! reconciliation, period closing, notifications, auto top-up charges, the database breaker. Each
//! is safe on several instances at once. The ones that look at every org back off while
//! they find nothing (`pace`), so that idle instances cost a sharded store about nothing.

use std::time::Duration;

use rush_meter_core::time::Secs;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::notifier::{Notifier, Watch};
use super::pace::{until_next, Pace};
use super::periods::{close_through, ExportError};
use super::Services;
use crate::config::Config;

/// Start every job `config` turns on; each stops when `stop` changes.
pub fn start(
    s: &Services,
    config: &Config,
    (watch, crossings): (
        Watch,
        Option<mpsc::Receiver<rush_meter_core::thresholds::Notice>>,
    ),
    opened_packs: mpsc::Receiver<crate::store::AutoTopupRow>,
    stop: &watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    let idle = config.jobs_idle_wait;
    let mut jobs = vec![
        tokio::spawn(expiry(s.clone(), idle, stop.clone())),
        tokio::spawn(super::breaker::watch(
            s.db.clone(),
            std::sync::Arc::clone(&s.breaker),
            stop.clone(),
        )),
        tokio::spawn(stripe_events(s.clone(), stop.clone())),
        tokio::spawn(statistics(s.clone(), stop.clone())),
        tokio::spawn(overage(s.clone(), idle, stop.clone())),
        tokio::spawn(last_used(s.clone(), stop.clone())),
        tokio::spawn(super::auto_topup::run(
            s.auto_topups.clone(),
            s.billing.clone(),
            opened_packs,
            (std::sync::Arc::clone(&s.activity), idle),
            stop.clone(),
        )),
    ];
    if let (Some(notify), Some(rx)) = (&config.notify, crossings) {
        let notifier = Notifier::new(
            s.db.clone(),
            s.clock.clone(),
            notify.clone(),
            std::sync::Arc::clone(&s.metrics),
            watch,
            (std::sync::Arc::clone(&s.plans), s.rules),
        );
        jobs.push(tokio::spawn(super::notifier::run(
            notifier,
            std::sync::Arc::clone(&s.activity),
            idle,
            rx,
            stop.clone(),
        )));
    }
    if let Some(settle) = config.period_settle {
        jobs.push(tokio::spawn(period_close(s.clone(), settle, stop.clone())));
    }
    if let (Some(every), Some(_)) = (config.stripe.reconcile_every, &config.stripe.secret_key) {
        jobs.push(tokio::spawn(reconcile(s.clone(), every, stop.clone())));
    }
    jobs
}

/// How long after a billing window ends its pay-as-you-go is charged by this job, if no
/// invoice took it before (Stripe keeps a renewal invoice a draft for about an hour).
const OVERAGE_SETTLE: Secs = 2 * 3600;

/// Charge the pay-as-you-go of ended windows (`billing::funding::charge_due`). Orgs that do
/// not pay through Stripe have theirs closed all the same: the window's funding is final.
/// Every 5 s while there are charges to send, backing off to `idle` while there are none,
/// traffic or not (a window is charged `OVERAGE_SETTLE` after its end: waiting `idle` more
/// changes nothing).
async fn overage(s: Services, idle: Duration, mut stop: watch::Receiver<bool>) {
    let mut pace = Pace::new(Duration::from_secs(5), idle);
    // Traffic makes no charge due sooner: a window is due by time alone.
    while until_next(&mut pace, None, &mut stop).await {
        let before = s.clock.now() - OVERAGE_SETTLE;
        match crate::billing::funding::charge_due(&s.billing, before, None).await {
            Ok(sent) => pace.after(sent > 0),
            Err(e) => {
                tracing::warn!(error = %e, "charging pay-as-you-go failed; will retry");
                pace.after(true);
            }
        }
    }
}

/// How often the tokens' "last used" times are written.
const LAST_USED_EVERY: Duration = Duration::from_secs(30);

/// Write when tokens were last used, a batch every `LAST_USED_EVERY` (nothing when no
/// token was used), and once more on the way out.
async fn last_used(s: Services, mut stop: watch::Receiver<bool>) {
    loop {
        let stopping = tokio::select! {
            _ = tokio::time::sleep(LAST_USED_EVERY) => false,
            _ = stop.changed() => true,
        };
        let batch = s.last_used.take();
        if let Err(e) = s.db.touch_tokens(&batch).await {
            tracing::warn!(error = %e, "recording when tokens were last used failed; will retry");
            s.last_used.restore(batch);
        }
        if stopping {
            return;
        }
    }
}

/// Give the hot tables planner statistics as soon as they hold rows, and again each time
/// they double, ahead of autovacuum (`Admin::gather_statistics`).
async fn statistics(s: Services, mut stop: watch::Receiver<bool>) {
    loop {
        match s.db.gather_statistics().await {
            Ok(true) => return,
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "gathering statistics failed; will retry"),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Book what time alone decides (silent sessions, parked ones past expiry) every interval
/// while there is traffic or something expired, backing off to `idle` on an idle instance.
/// When it runs changes no total (docs/ledger.md, rule 7), and a session silent past a
/// lease already counts as gone for the gate. Each instance takes rows the others have not
/// locked.
async fn expiry(s: Services, idle: Duration, mut stop: watch::Receiver<bool>) {
    let period = Duration::from_secs((s.rules.interval as u64).clamp(1, 15));
    let mut pace = Pace::new(period, idle);
    while until_next(&mut pace, Some(&s.activity), &mut stop).await {
        pace.after(expire_due(&s).await > 0);
    }
}

/// Book every session due to expire now, a batch at a time; how many were booked.
async fn expire_due(s: &Services) -> usize {
    const BATCH: i64 = 1000;
    let mut booked = 0;
    loop {
        match s
            .db
            .expire_sessions(s.clock.now(), &s.rules, &s.plans, BATCH)
            .await
        {
            Ok(n) => {
                s.metrics.sessions_expired.inc_by(n as u64);
                booked += n;
                if (n as i64) < BATCH {
                    return booked;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "expiry job failed; will retry");
                return booked;
            }
        }
    }
}

/// Processes stored Stripe events: at once when a webhook stores one, and every few seconds
/// for retries that fall due and events another instance left behind.
async fn stripe_events(s: Services, mut stop: watch::Receiver<bool>) {
    loop {
        if let Err(e) = crate::billing::events::process_due(&s.billing).await {
            tracing::warn!(error = %e, "Stripe event job failed; will retry");
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            _ = s.stripe_wake.notified() => {}
            _ = stop.changed() => return,
        }
    }
}

/// Closes each month once `settle` seconds have passed since its end. Every instance runs
/// it; a month is closed by whichever gets there first (`PeriodStore::close_period`). The
/// periods are a reference table on Citus, read where the instance's coordinator is; a
/// month found to have no org before it is not asked about again (orgs made later come
/// later still).
async fn period_close(s: Services, settle: Secs, mut stop: watch::Receiver<bool>) {
    let mut nothing_through = None;
    loop {
        let now = s.clock.now();
        let due = rush_meter_core::export::due_month(now, settle);
        let done = nothing_through == Some(due.end)
            || match s.db.list_periods().await {
                Ok(p) => p.first().is_some_and(|l| l.period_end >= due.end),
                Err(e) => {
                    tracing::warn!(error = %e, "period close check failed; will retry");
                    true
                }
            };
        if !done {
            match close_through(
                &s.db,
                &s.plans,
                due,
                now,
                &rush_meter_core::audit::Actor::system("period close job"),
            )
            .await
            {
                Ok(_) => {}
                // The first org came after the due month (or none yet): nothing is due.
                Err(ExportError::NothingToClose(_)) => nothing_through = Some(due.end),
                Err(e) => tracing::warn!(error = %e, "closing billing periods failed; will retry"),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Reconciles with Stripe every `every`, so that a webhook lost for good is repaired
/// within one period. Every instance runs it; runs are idempotent.
async fn reconcile(s: Services, every: Duration, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
        match crate::billing::reconcile::reconcile(&s.billing, |_| {}).await {
            Ok(r) => tracing::info!(
                subscriptions = r.subscriptions,
                changed = r.changed.len(),
                failed = r.failed.len(),
                "reconciled with Stripe"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "reconcile with Stripe failed; will retry next period")
            }
        }
    }
}
