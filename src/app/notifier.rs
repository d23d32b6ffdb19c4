//! Notifications (`rush_meter_core::thresholds`): when an org's month or week passes one
//! of its plan's `prompt_thresholds`, its pay-as-you-go passes 50, 80 or 100% of its cap,
//! a grant is used up or comes within 7 days of expiring, a signed JSON notification is
//! POSTed to the configured URL.
//!
//! - Detection: every heartbeat commit reads its orgs' standing (ingest.rs `advise`);
//!   `Watch::observe` turns each threshold at or below the usage into a notice. Grants are
//!   looked at every 5 s.
//! - Once per threshold per window: the crossing is recorded under the key (org, window,
//!   window start, threshold); a second record of it, from any instance, is a no-op.
//! - Delivery: recorded notifications are taken with `SKIP LOCKED` by any instance and
//!   sent, signed like Stripe's webhooks (`Rush-Signature: t=…,v1=HMAC-SHA256 of "t.body"`,
//!   the timestamp fresh on each try), with the id in `Rush-Notification-Id` for the
//!   receiver's own dedup. A failure is retried after 10 s, doubling up to 4 h, 16 tries
//!   (about 22 h), then the notification is marked `failed`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rush_meter_core::ledger::Rules;
use rush_meter_core::plans::Plans;
use rush_meter_core::retry::{backoff, MAX_ATTEMPTS};
use rush_meter_core::room::{member_restored_by, restored_body, restored_by, restored_id};
use rush_meter_core::standing::Standing;
use rush_meter_core::thresholds::{
    cap_notices, cap_room_to_next, crossings, grant_notices, room_to_next, Notice,
};
use rush_meter_core::time::Secs;
use secrecy::ExposeSecret;
use tokio::sync::{mpsc, watch};

use super::pace::{Activity, Pace};
use super::standing::standings;
use crate::clock::Clock;
use crate::config::NotifyConfig;
use crate::metrics::Metrics;
use crate::store::{Db, NotificationRow, RoomWait, StoreResult};

rush_meter_core::named! {
    /// Where a notification's delivery stands.
    pub enum DeliveryState {
        Pending = "pending",
        Sent = "sent",
        /// Given up after `MAX_ATTEMPTS` tries.
        Failed = "failed",
    }
}

const TAKE: i64 = 5;
const TIMEOUT: Duration = Duration::from_secs(10);
/// How long an instance holds the notifications it took: longer than delivering all of
/// them at the timeout, so no other instance takes one while it is being sent.
const HOLD: Secs = TAKE * TIMEOUT.as_secs() as Secs + 60;

/// Hands crossings seen by the ingest path to the notifier; off when notifications are.
#[derive(Clone, Default)]
pub struct Watch(Option<Arc<WatchInner>>);

struct WatchInner {
    tx: mpsc::Sender<Notice>,
    /// Crossings handed on already: an org past 80% is seen on every commit after.
    seen: Mutex<HashSet<String>>,
    /// When this instance last recorded that an org waits for room.
    waits: Mutex<HashMap<String, Secs>>,
}

/// How often an instance records again that an org still waits for room: the record is
/// keyed by org (again changes nothing), and a wait ended meanwhile is begun anew.
const WAIT_AGAIN: Secs = 60;

/// Crossings remembered per instance before the memory is cleared (the store's key
/// still makes each once only).
const SEEN_MAX: usize = 100_000;

impl Watch {
    pub fn new() -> (Watch, mpsc::Receiver<Notice>) {
        let (tx, rx) = mpsc::channel(1024);
        let inner = WatchInner {
            tx,
            seen: Mutex::default(),
            waits: Mutex::default(),
        };
        (Watch(Some(Arc::new(inner))), rx)
    }

    /// Note the thresholds an org's standing has reached: its plan's windows and its
    /// pay-as-you-go's cap.
    pub fn observe(&self, s: &Standing) {
        if self.0.is_none() {
            return;
        }
        let windows = crossings(&s.org.org_id, &s.plan, &s.month, &s.week)
            .into_iter()
            .map(|c| c.notice(s.at));
        let cap = cap_notices(
            &s.org.org_id,
            &s.funding,
            &s.org.overage,
            &s.plan.currency,
            s.at,
        );
        for n in windows.chain(cap) {
            self.hand_on(n);
        }
    }

    /// Hand a notice to the notifier once. Never waits: with the queue full it is dropped
    /// from memory and picked up again when next seen.
    fn hand_on(&self, n: Notice) {
        let Some(inner) = &self.0 else { return };
        let id = n.id();
        let mut seen = inner.seen.lock().expect("seen lock");
        if seen.contains(&id) {
            return;
        }
        if seen.len() >= SEEN_MAX {
            seen.clear();
        }
        if inner.tx.try_send(n).is_ok() {
            seen.insert(id);
        }
    }

    /// Seconds of usage before the next threshold either window has not reached
    /// (`i64::MAX` when notifications are off or none is left).
    pub fn room(&self, s: &Standing) -> i64 {
        if self.0.is_none() {
            return i64::MAX;
        }
        room_to_next(&s.plan, &s.month, &s.week).min(cap_room_to_next(&s.funding, s.at))
    }

    /// Whether to record now that `org_id`'s sessions park for want of room: when
    /// notifications are on, at most once a `WAIT_AGAIN` an org on this instance.
    pub fn wait_due(&self, org_id: &str, now: Secs) -> bool {
        let Some(inner) = &self.0 else { return false };
        let mut waits = inner.waits.lock().expect("waits lock");
        if waits.get(org_id).is_some_and(|at| now - at < WAIT_AGAIN) {
            return false;
        }
        if waits.len() >= SEEN_MAX {
            waits.clear();
        }
        waits.insert(org_id.to_owned(), now);
        true
    }

    /// Forget a wait that could not be recorded, so a later commit tries again.
    pub fn forget_wait(&self, org_id: &str) {
        if let Some(inner) = &self.0 {
            inner.waits.lock().expect("waits lock").remove(org_id);
        }
    }

    /// Forget a crossing that could not be recorded, so a later commit tries again.
    fn forget(&self, id: &str) {
        if let Some(inner) = &self.0 {
            inner.seen.lock().expect("seen lock").remove(id);
        }
    }
}

/// Records crossings and delivers notifications.
pub struct Notifier {
    pub db: Db,
    pub clock: Clock,
    pub config: NotifyConfig,
    pub metrics: Arc<Metrics>,
    pub watch: Watch,
    /// What the standing of an org waiting for room is read on (`scan_room_waits`).
    pub plans: Arc<Plans>,
    pub rules: Rules,
    client: reqwest::Client,
}

impl Notifier {
    pub fn new(
        db: Db,
        clock: Clock,
        config: NotifyConfig,
        metrics: Arc<Metrics>,
        watch: Watch,
        (plans, rules): (Arc<Plans>, Rules),
    ) -> Self {
        let client = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .build()
            .expect("an HTTP client builds");
        Notifier {
            db,
            clock,
            config,
            metrics,
            watch,
            plans,
            rules,
            client,
        }
    }

    fn count(&self, result: &str) {
        crate::metrics::count(&self.metrics.notifications, result);
    }

    async fn record(&self, n: &Notice) {
        let now = self.clock.now();
        let id = n.id();
        match self
            .db
            .insert_notification(&n.org_id, &n.kind, n.start, n.threshold, &id, &n.body, now)
            .await
        {
            Ok(true) => {
                tracing::info!(org_id = %n.org_id, kind = %n.kind, threshold = n.threshold, id = %id, "notification recorded");
                self.count("recorded");
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, id = %id, "recording a notification failed; will retry on a later heartbeat");
                self.watch.forget(&id);
            }
        }
    }

    /// Deliver every notification that is due; returns how many were tried.
    pub async fn deliver_due(&self) -> StoreResult<usize> {
        let mut tried = 0;
        loop {
            let rows = self
                .db
                .claim_notifications(self.clock.now(), HOLD, TAKE)
                .await?;
            if rows.is_empty() {
                return Ok(tried);
            }
            tried += rows.len();
            for row in rows {
                let outcome = self.send(&row).await;
                let now = self.clock.now();
                let (state, error, next_at) = match &outcome {
                    Ok(()) => ("sent", None, now),
                    Err(e) if row.attempts >= MAX_ATTEMPTS => ("failed", Some(e.as_str()), now),
                    Err(e) => ("pending", Some(e.as_str()), now + backoff(row.attempts)),
                };
                self.count(if state == "pending" { "retry" } else { state });
                if let Err(e) = &outcome {
                    tracing::warn!(id = %row.notification_id, attempts = row.attempts, error = %e, state, "notification not delivered");
                }
                self.db
                    .finish_notification(
                        &row.org_id,
                        &row.notification_id,
                        row.attempts,
                        state,
                        error,
                        next_at,
                        now,
                    )
                    .await?;
            }
        }
    }

    async fn send(&self, row: &NotificationRow) -> Result<(), String> {
        // The receiver checks the timestamp against its own clock: wall time, fresh per try.
        let t = chrono::Utc::now().timestamp();
        let signature = rush_meter_core::signature::sign(
            self.config.secret.expose_secret(),
            t,
            row.body.as_bytes(),
        );
        let resp = self
            .client
            .post(&self.config.url)
            .header("content-type", "application/json")
            .header("rush-signature", signature)
            .header("rush-notification-id", &row.notification_id)
            .body(row.body.clone())
            .send()
            .await
            .map_err(|e| format!("sending to {}: {e}", self.config.url))?;
        if resp.status().is_success() {
            Ok(())
        } else {
            Err(format!("{} answered {}", self.config.url, resp.status()))
        }
    }
}

/// How often grants are looked at for ones used up or about to expire.
const GRANT_SCAN: Duration = Duration::from_secs(5);

/// Grants used up this long ago or less are still notified (once: the record is keyed).
const USED_UP_WITHIN: Secs = 86_400;

/// Orgs waiting for room read at a time.
const WAITS: i64 = 100;

impl Notifier {
    /// End the wait of every org waiting for room that has some again: one
    /// `org.room_restored` each, recorded with the wait's end (whichever instance ends it).
    async fn scan_room_waits(&self) -> StoreResult<()> {
        let now = self.clock.now();
        let mut after: Option<(Secs, String)> = None;
        loop {
            let cursor = after.as_ref().map(|(t, o)| (*t, o.as_str()));
            let page = self.db.room_waits(cursor, WAITS).await?;
            for w in &page {
                // One org that cannot be read holds up no other.
                if let Err(e) = self.end_wait_if_room(w, now).await {
                    tracing::warn!(error = %e, org_id = %w.org_id, "looking at an org waiting for room failed; will retry");
                }
            }
            match page.last() {
                Some(w) if page.len() as i64 == WAITS => {
                    after = Some((w.since, w.org_id.clone()));
                }
                _ => return Ok(()),
            }
        }
    }

    /// End `w` with its notification if its org has room again.
    async fn end_wait_if_room(&self, w: &RoomWait, now: Secs) -> StoreResult<()> {
        let ids = [w.org_id.as_str()];
        let Some(s) = standings(&self.db, &self.plans, &ids, now, &self.rules)
            .await?
            .pop()
        else {
            return Ok(());
        };
        let by = match &w.members {
            Some(members) => {
                let spent = self.still_spent(&s, members, now).await?;
                member_restored_by(&s, spent, w.resume_at)
            }
            None => restored_by(&s, w.resume_at, (w.plan_id.as_str(), w.plan_version)),
        };
        let Some(by) = by else {
            return Ok(());
        };
        let sessions = self.db.parked_since(&w.org_id, w.since).await?;
        let body = restored_body(&s, w.since, by, &sessions);
        let id = restored_id(&w.org_id, w.since);
        if self
            .db
            .end_room_wait(&w.org_id, w.since, &id, &body, now)
            .await?
        {
            tracing::info!(org_id = %w.org_id, reason = by.as_str(), id = %id, "room restored: notification recorded");
            self.count("recorded");
        }
        Ok(())
    }

    /// Whether any of `members` (a wait's JSON array of `[dimension, id]`) still has its
    /// limit spent in `s`'s org (a limit removed is not).
    async fn still_spent(&self, s: &Standing, members: &str, now: Secs) -> StoreResult<bool> {
        let waited: Vec<(String, String)> = serde_json::from_str(members).unwrap_or_default();
        if !s.org.sets_limits || waited.is_empty() {
            return Ok(false);
        }
        let mut found = self
            .db
            .limits_with_usage(&[&s.org], now, &self.rules)
            .await?;
        let Some((limits, used)) = found.remove(&s.org.org_id) else {
            return Ok(false);
        };
        let rooms = rush_meter_core::members::rooms(&limits, &used, s.plan.ceiling_grace_seconds);
        Ok(rooms.iter().any(|((d, id), r)| {
            r.park && waited.iter().any(|(wd, wid)| wd == d.as_str() && wid == id)
        }))
    }

    /// Hand on every grant used up lately, or 7 days or less from expiring.
    async fn scan_grants(&self) -> StoreResult<()> {
        let now = self.clock.now();
        for g in self.db.grants_to_notify(now, now - USED_UP_WITHIN).await? {
            for n in grant_notices(&g, now) {
                self.watch.hand_on(n);
            }
        }
        Ok(())
    }
}

/// Record what the watch hands on and deliver what is due, until `stop`. What this
/// instance records it delivers at once; retries, and what a dead peer left, are looked
/// for every second while some are found, backing off to `idle` (`pace`) while none are,
/// traffic or not (they fall due by time alone). Grants are
/// scanned every `GRANT_SCAN` while this instance serves traffic (grants are used up by
/// bookings), backing off to `idle` without it (an expiry a week away loses nothing).
pub async fn run(
    n: Notifier,
    activity: Arc<Activity>,
    idle: Duration,
    mut notices: mpsc::Receiver<Notice>,
    mut stop: watch::Receiver<bool>,
) {
    let mut scan = Pace::new(GRANT_SCAN, idle);
    let mut deliver = Pace::new(Duration::from_secs(1), idle);
    loop {
        tokio::select! {
            c = notices.recv() => match c {
                Some(c) => n.record(&c).await,
                None => return,
            },
            _ = scan.wait(Some(&activity)) => {
                if let Err(e) = n.scan_grants().await {
                    tracing::warn!(error = %e, "looking for grants to notify failed; will retry");
                }
                if let Err(e) = n.scan_room_waits().await {
                    tracing::warn!(error = %e, "looking for orgs with room back failed; will retry");
                }
                scan.after(false);
            }
            _ = deliver.wait(None) => {}
            _ = stop.changed() => return,
        }
        match n.deliver_due().await {
            Ok(tried) => deliver.after(tried > 0),
            Err(e) => {
                tracing::warn!(error = %e, "delivering notifications failed; will retry");
                deliver.after(true);
            }
        }
    }
}
