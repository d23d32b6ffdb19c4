//! What is notified, once each (the service records it under its key and delivers it
//! signed): an org's month or week reaching one of its plan's `prompt_thresholds`; its
//! pay-as-you-go reaching 50, 80 and 100% of its monthly cap; a grant used up; a grant 7
//! days from expiring. This says which have happened, how far the next threshold is, and
//! what each notification says.

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::funding::{self, Grant, WindowKind};
use crate::plans::Plan;
use crate::standing::WindowUsage;
use crate::time::{format_rfc3339, hours, Secs};

/// A notification to record once: under `(org_id, kind, start, threshold)`, whatever
/// instance sees it first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    pub org_id: String,
    /// What it is about: `month`, `week`, `cap`, `grant_used_up:<grant>` or
    /// `grant_expiring:<grant>` (the store's `window_kind`).
    pub kind: String,
    pub start: Secs,
    pub threshold: i64,
    pub body: String,
}

impl Notice {
    /// Its id: the same on every instance, so the record is once only.
    pub fn id(&self) -> String {
        notice_id(&self.org_id, &self.kind, self.start, self.threshold)
    }
}

fn notice_id(org_id: &str, kind: &str, start: Secs, threshold: i64) -> String {
    let key = format!("{org_id}|{kind}|{start}|{threshold}");
    format!("ntf_{}", &hex::encode(Sha256::digest(key.as_bytes()))[..24])
}

/// Percentages of the monthly cap at which pay-as-you-go is notified.
pub const CAP_THRESHOLDS: [u8; 3] = [50, 80, 100];

/// Days before a grant expires at which that is notified.
pub const EXPIRY_NOTICE_DAYS: i64 = 7;

#[derive(Serialize)]
struct CapBody<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    created_at: String,
    org_id: &'a str,
    month_start: String,
    month_end: String,
    threshold_percent: u8,
    spent: String,
    monthly_cap: String,
    currency: &'a str,
    overage: String,
}

/// Each threshold of the monthly cap that pay-as-you-go has reached in the month of `now`
/// (nothing while it is off).
pub fn cap_notices(
    org_id: &str,
    state: &funding::State,
    overage: &funding::Overage,
    currency: &str,
    now: Secs,
) -> Vec<Notice> {
    if !state.terms.pay_as_you_go() || state.terms.cap_units <= 0 {
        return Vec::new();
    }
    let w = state.windows_at(now);
    let units = state.funds(WindowKind::Month, w.month).charge_units;
    CAP_THRESHOLDS
        .iter()
        .filter(|t| i128::from(units) * 100 >= i128::from(**t) * i128::from(state.terms.cap_units))
        .map(|t| {
            let id = notice_id(org_id, "cap", w.month.start, i64::from(*t));
            let body = serde_json::to_string(&CapBody {
                id: &id,
                kind: "overage.cap_threshold_crossed",
                created_at: format_rfc3339(now),
                org_id,
                month_start: format_rfc3339(w.month.start),
                month_end: format_rfc3339(w.month.end),
                threshold_percent: *t,
                spent: format!("{:.2}", funding::amount(units)),
                monthly_cap: format!("{:.2}", overage.monthly_cap),
                currency,
                overage: format!("/v1/orgs/{org_id}/overage"),
            })
            .expect("a notification serialises");
            Notice {
                org_id: org_id.to_owned(),
                kind: "cap".into(),
                start: w.month.start,
                threshold: i64::from(*t),
                body,
            }
        })
        .collect()
}

#[derive(Serialize)]
struct GrantBody<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    created_at: String,
    org_id: &'a str,
    grant_id: &'a str,
    grant_kind: &'static str,
    seconds: i64,
    used_seconds: i64,
    remaining_seconds: i64,
    remaining_hours: String,
    expires_at: Option<String>,
    grants: String,
}

/// A grant used up, or 7 days (or less) from expiring with time left, as of `now`.
pub fn grant_notices(g: &Grant, now: Secs) -> Vec<Notice> {
    let used_up = g.voided_at.is_none() && g.used_seconds >= g.seconds;
    let expiring = g.voided_at.is_none()
        && g.remaining() > 0
        && g.expires_at
            .is_some_and(|e| now < e && e - now <= EXPIRY_NOTICE_DAYS * 86_400);
    [
        (used_up, "grant_used_up", "grant.used_up"),
        (expiring, "grant_expiring", "grant.expiring"),
    ]
    .into_iter()
    .filter(|(due, _, _)| *due)
    .map(|(_, kind, event)| {
        let kind = format!("{kind}:{}", g.grant_id);
        let id = notice_id(&g.org_id, &kind, g.created_at, 100);
        let body = serde_json::to_string(&GrantBody {
            id: &id,
            kind: event,
            created_at: format_rfc3339(now),
            org_id: &g.org_id,
            grant_id: &g.grant_id,
            grant_kind: g.kind.as_str(),
            seconds: g.seconds,
            used_seconds: g.used_seconds,
            remaining_seconds: g.remaining(),
            remaining_hours: hours(g.remaining()),
            expires_at: g.expires_at.map(format_rfc3339),
            grants: format!("/v1/orgs/{}/grants", g.org_id),
        })
        .expect("a notification serialises");
        Notice {
            org_id: g.org_id.clone(),
            kind,
            start: g.created_at,
            threshold: 100,
            body,
        }
    })
    .collect()
}

/// A window's usage at or past one of its plan's thresholds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Crossing {
    pub org_id: String,
    pub plan_id: String,
    /// The version of the plan whose thresholds and ceilings these are.
    pub plan_version: i64,
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
        notice_id(
            &self.org_id,
            self.window,
            self.start,
            i64::from(self.threshold),
        )
    }

    /// The notification it makes at `now`.
    pub fn notice(&self, now: Secs) -> Notice {
        Notice {
            org_id: self.org_id.clone(),
            kind: self.window.to_owned(),
            start: self.start,
            threshold: i64::from(self.threshold),
            body: body(self, now),
        }
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
                    plan_version: plan.version,
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

/// Seconds of pay-as-you-go until the next cap threshold not yet reached in the month of
/// `now` (`i64::MAX` while it is off or none is left).
pub fn cap_room_to_next(state: &funding::State, now: Secs) -> i64 {
    if !state.terms.pay_as_you_go() {
        return i64::MAX;
    }
    let w = state.windows_at(now);
    let units = state.funds(WindowKind::Month, w.month).charge_units;
    CAP_THRESHOLDS
        .iter()
        .map(|t| i128::from(*t) * i128::from(state.terms.cap_units) / 100 - i128::from(units))
        .filter(|r| *r > 0)
        .map(|r| i64::try_from(r / i128::from(state.terms.price_units) + 1).unwrap_or(i64::MAX))
        .min()
        .unwrap_or(i64::MAX)
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
    plan_version: i64,
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
        plan_version: c.plan_version,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Interval;

    fn usage(used: i64, limit: i64) -> WindowUsage {
        WindowUsage::new(Interval::new(0, 1000).unwrap(), used, limit)
    }

    #[test]
    fn every_threshold_reached_is_a_crossing() {
        let plans = crate::shipped_plans();
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
        let plans = crate::shipped_plans();
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
        let plans = crate::shipped_plans();
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
