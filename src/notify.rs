//! Usage-threshold notifications: when an org's month or week passes one of its plan's
//! `prompt_thresholds`, a signed JSON notification is POSTed to the configured URL.
//!
//! - Detection: every heartbeat commit reads its orgs' standing (ingest.rs `advise`);
//!   `Watch::observe` turns each threshold at or below the usage into a crossing.
//! - Once per threshold per window: the crossing is recorded under the key (org, window,
//!   window start, threshold); a second record of it, from any instance, is a no-op.
//! - Delivery: recorded notifications are taken with `SKIP LOCKED` by any instance and
//!   sent, signed like Stripe's webhooks (`Rush-Signature: t=…,v1=HMAC-SHA256 of "t.body"`,
//!   the timestamp fresh on each try), with the id in `Rush-Notification-Id` for the
//!   receiver's own dedup. A failure is retried after 10 s, doubling up to 4 h, 16 tries
//!   (about 22 h), then the notification is marked `failed`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch};

use crate::clock::Clock;
use crate::config::NotifyConfig;
use crate::ledger::Secs;
use crate::metrics::{Metrics, ResultLabels};
use crate::plans::Plan;
use crate::quota::{format_rfc3339, hours, WindowUsage};
use crate::standing::Standing;
use crate::store::{Db, NotificationRow, StoreResult};

/// Tries before a notification is given up as `failed`.
pub const MAX_ATTEMPTS: i64 = 16;
const TAKE: i64 = 5;
const TIMEOUT: Duration = Duration::from_secs(10);
/// How long an instance holds the notifications it took: longer than delivering all of
/// them at the timeout, so no other instance takes one while it is being sent.
const HOLD: Secs = TAKE * TIMEOUT.as_secs() as Secs + 60;

/// A window's usage at or past one of its plan's thresholds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Crossing {
    pub org_id: String,
    pub plan_id: String,
    pub window: &'static str,
    pub start: Secs,
    pub end: Secs,
    pub threshold: u8,
    pub used_seconds: i64,
    pub limit_seconds: i64,
}

impl Crossing {
    /// Its key, and its id: the same on every instance, so the record is once only.
    pub fn id(&self) -> String {
        let key = format!(
            "{}|{}|{}|{}",
            self.org_id, self.window, self.start, self.threshold
        );
        format!("ntf_{}", &hex::encode(Sha256::digest(key.as_bytes()))[..24])
    }
}

/// Every threshold of `plan` that each window has reached, lowest first.
pub fn crossings(
    org_id: &str,
    plan: &Plan,
    month: &WindowUsage,
    week: &WindowUsage,
) -> Vec<Crossing> {
    let mut out = Vec::new();
    for (window, w) in [("month", month), ("week", week)] {
        for t in &plan.prompt_thresholds {
            if w.limit_seconds > 0
                && i128::from(w.used_seconds) * 100 >= i128::from(*t) * i128::from(w.limit_seconds)
            {
                out.push(Crossing {
                    org_id: org_id.to_owned(),
                    plan_id: plan.id.clone(),
                    window,
                    start: w.start,
                    end: w.end,
                    threshold: *t,
                    used_seconds: w.used_seconds,
                    limit_seconds: w.limit_seconds,
                });
            }
        }
    }
    out
}

/// Seconds until the lowest threshold not yet reached, over both windows.
pub fn room_to_next(plan: &Plan, month: &WindowUsage, week: &WindowUsage) -> i64 {
    [month, week]
        .iter()
        .flat_map(|w| {
            plan.prompt_thresholds.iter().map(move |t| {
                // The first whole second at or past t% of the limit.
                let at = (i128::from(*t) * i128::from(w.limit_seconds) + 99) / 100;
                i64::try_from(at - i128::from(w.used_seconds)).unwrap_or(i64::MAX)
            })
        })
        .filter(|r| *r > 0)
        .min()
        .unwrap_or(i64::MAX)
}

#[derive(Serialize)]
struct Body<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    created_at: String,
    org_id: &'a str,
    plan: &'a str,
    window: &'a str,
    window_start: String,
    window_end: String,
    threshold_percent: u8,
    used_seconds: i64,
    used_hours: String,
    limit_seconds: i64,
    limit_hours: String,
    upgrade_prompt: String,
}

/// The JSON body of a crossing's notification, as recorded (and sent on every try).
pub fn body(c: &Crossing, now: Secs) -> String {
    serde_json::to_string(&Body {
        id: &c.id(),
        kind: "usage.threshold_crossed",
        created_at: format_rfc3339(now),
        org_id: &c.org_id,
        plan: &c.plan_id,
        window: c.window,
        window_start: format_rfc3339(c.start),
        window_end: format_rfc3339(c.end),
        threshold_percent: c.threshold,
        used_seconds: c.used_seconds,
        used_hours: hours(c.used_seconds),
        limit_seconds: c.limit_seconds,
        limit_hours: hours(c.limit_seconds),
        upgrade_prompt: format!("/v1/orgs/{}/upgrade-prompt", c.org_id),
    })
    .expect("a notification serialises")
}

/// Hands crossings seen by the ingest path to the notifier; off when notifications are.
#[derive(Clone, Default)]
pub struct Watch(Option<Arc<WatchInner>>);

struct WatchInner {
    tx: mpsc::Sender<Crossing>,
    /// Crossings handed on already: an org past 80% is seen on every commit after.
    seen: Mutex<HashSet<String>>,
}

/// Crossings remembered per instance before the memory is cleared (the store's key
/// still makes each once only).
const SEEN_MAX: usize = 100_000;

impl Watch {
    pub fn new() -> (Watch, mpsc::Receiver<Crossing>) {
        let (tx, rx) = mpsc::channel(1024);
        let inner = WatchInner {
            tx,
            seen: Mutex::default(),
        };
        (Watch(Some(Arc::new(inner))), rx)
    }

    /// Note the thresholds an org's standing has reached. Never waits: with the queue
    /// full a crossing is dropped from memory and picked up again on a later commit.
    pub fn observe(&self, s: &Standing) {
        let Some(inner) = &self.0 else { return };
        for c in crossings(&s.org.org_id, &s.plan, &s.month, &s.week) {
            let id = c.id();
            let mut seen = inner.seen.lock().expect("seen lock");
            if seen.contains(&id) {
                continue;
            }
            if seen.len() >= SEEN_MAX {
                seen.clear();
            }
            if inner.tx.try_send(c).is_ok() {
                seen.insert(id);
            }
        }
    }

    /// Seconds of usage before the next threshold either window has not reached
    /// (`i64::MAX` when notifications are off or none is left).
    pub fn room(&self, s: &Standing) -> i64 {
        if self.0.is_none() {
            return i64::MAX;
        }
        room_to_next(&s.plan, &s.month, &s.week)
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
    client: reqwest::Client,
}

impl Notifier {
    pub fn new(
        db: Db,
        clock: Clock,
        config: NotifyConfig,
        metrics: Arc<Metrics>,
        watch: Watch,
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
            client,
        }
    }

    fn count(&self, result: &str) {
        self.metrics
            .notifications
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    async fn record(&self, c: &Crossing) {
        let now = self.clock.now();
        let id = c.id();
        let threshold = i64::from(c.threshold);
        match self
            .db
            .insert_notification(
                &c.org_id,
                c.window,
                c.start,
                threshold,
                &id,
                &body(c, now),
                now,
            )
            .await
        {
            Ok(true) => {
                tracing::info!(org_id = %c.org_id, window = c.window, threshold = c.threshold, id = %id, "usage threshold crossed");
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
                    Err(e) => (
                        "pending",
                        Some(e.as_str()),
                        now + crate::billing::events::backoff(row.attempts),
                    ),
                };
                self.count(if state == "pending" { "retry" } else { state });
                if let Err(e) = &outcome {
                    tracing::warn!(id = %row.notification_id, attempts = row.attempts, error = %e, state, "notification not delivered");
                }
                self.db
                    .finish_notification(
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
        let signature =
            crate::billing::signature::sign(self.config.secret.expose(), t, row.body.as_bytes());
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

/// Record what the watch hands on and deliver what is due, until `stop`.
pub async fn run(
    n: Notifier,
    mut crossings: mpsc::Receiver<Crossing>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            c = crossings.recv() => match c {
                Some(c) => n.record(&c).await,
                None => return,
            },
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.changed() => return,
        }
        if let Err(e) = n.deliver_due().await {
            tracing::warn!(error = %e, "delivering notifications failed; will retry");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Interval;

    fn usage(used: i64, limit: i64) -> WindowUsage {
        WindowUsage::new(Interval::new(0, 1000).unwrap(), used, limit)
    }

    #[test]
    fn every_threshold_reached_is_a_crossing() {
        let plans = crate::plans::shipped();
        let pro = plans.get("pro").unwrap();
        let month = pro.monthly_limit_seconds;
        let week = pro.weekly_limit_seconds;
        let at = |m: i64, w: i64| -> Vec<(&str, u8)> {
            crossings("o", pro, &usage(m, month), &usage(w, week))
                .iter()
                .map(|c| (c.window, c.threshold))
                .collect()
        };
        assert_eq!(at(0, 0), vec![]);
        assert_eq!(at(month * 8 / 10 - 1, 0), vec![]);
        assert_eq!(at(month * 8 / 10, 0), vec![("month", 80)]);
        assert_eq!(
            at(month, week),
            vec![("month", 80), ("month", 100), ("week", 80), ("week", 100)]
        );
    }

    #[test]
    fn room_is_the_distance_to_the_next_threshold() {
        let plans = crate::plans::shipped();
        let free = plans.get("free").unwrap();
        let (m, w) = (free.monthly_limit_seconds, free.weekly_limit_seconds);
        // Week 7200 s: 80% at 5760; month 18000 s: 80% at 14400.
        assert_eq!(room_to_next(free, &usage(0, m), &usage(0, w)), 5760);
        assert_eq!(room_to_next(free, &usage(5000, m), &usage(5750, w)), 10);
        // Past the week's 80%: its 100% (1440 s away) is next.
        assert_eq!(room_to_next(free, &usage(5760, m), &usage(5760, w)), 1440);
        assert_eq!(room_to_next(free, &usage(m, m), &usage(w, w)), i64::MAX);
        // The boundary itself is reached, not ahead: crossings() agrees.
        assert!(crossings("o", free, &usage(0, m), &usage(5760, w))
            .iter()
            .any(|c| c.threshold == 80));
    }

    #[test]
    fn a_crossing_has_one_id_per_threshold_and_window() {
        let plans = crate::plans::shipped();
        let pro = plans.get("pro").unwrap();
        let c = crossings(
            "o",
            pro,
            &usage(pro.monthly_limit_seconds, pro.monthly_limit_seconds),
            &usage(0, 1),
        );
        assert_eq!(c.len(), 2);
        assert_ne!(c[0].id(), c[1].id());
        let mut later = c[0].clone();
        later.used_seconds += 100;
        assert_eq!(
            later.id(),
            c[0].id(),
            "more usage in the same window is the same crossing"
        );
        later.start += 1;
        assert_ne!(later.id(), c[0].id(), "a new window is a new one");
        let v: serde_json::Value = serde_json::from_str(&body(&c[0], 0)).unwrap();
        assert_eq!(v["id"], c[0].id());
        assert_eq!(v["threshold_percent"], 80);
        assert_eq!(v["type"], "usage.threshold_crossed");
    }
}
