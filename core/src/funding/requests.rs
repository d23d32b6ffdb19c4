//! What is asked of funding, checked: a grant (`GrantAsk`) and pay-as-you-go on a plan
//! (`check_overage`), each refused with the field at fault; and where a grant stands.

use rust_decimal::Decimal;

use super::{Grant, GrantKind, Overage, DEFAULT_PRIORITY, PRIORITIES};
use crate::plans::Plan;
use crate::time::Secs;

/// A request refused: the field at fault and what to fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    pub field: &'static str,
    pub message: String,
}

fn invalid<T>(field: &'static str, message: impl Into<String>) -> Result<T, Invalid> {
    Err(Invalid {
        field,
        message: message.into(),
    })
}

/// The most a grant may hold: 100,000 hours.
pub const MAX_GRANT_SECONDS: i64 = 100_000 * 3600;

/// A grant as asked for, before it is checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantAsk {
    pub seconds: i64,
    pub kind: GrantKind,
    pub priority: Option<i64>,
    pub starts_at: Option<Secs>,
    pub expires_at: Option<Secs>,
    pub note: Option<String>,
    pub idempotency_key: Option<String>,
}

impl GrantAsk {
    /// The grant to make at `now`, or what is wrong with the ask.
    pub fn check(self, org_id: &str, grant_id: &str, now: Secs) -> Result<Grant, Invalid> {
        if !(1..=MAX_GRANT_SECONDS).contains(&self.seconds) {
            return invalid(
                "seconds",
                format!(
                    "seconds must be 1 to {MAX_GRANT_SECONDS} (100,000 hours); got {}",
                    self.seconds
                ),
            );
        }
        let priority = self.priority.unwrap_or(DEFAULT_PRIORITY);
        if !(PRIORITIES.0..=PRIORITIES.1).contains(&priority) {
            return invalid(
                "priority",
                format!("priority must be 0 (used first) to 100 (used last); got {priority}"),
            );
        }
        let starts_at = self.starts_at.unwrap_or(now);
        if let Some(e) = self.expires_at {
            if e <= starts_at {
                return invalid(
                    "expires_at",
                    "expires_at must be after starts_at (default: now)",
                );
            }
        }
        if let Some(note) = &self.note {
            if let Err(m) = crate::text::Text::Lines.check(note, 500) {
                return invalid("note", format!("note {m}"));
            }
        }
        if let Some(key) = &self.idempotency_key {
            if key.is_empty() || key.len() > 200 || !key.chars().all(|c| c.is_ascii_graphic()) {
                return invalid(
                    "idempotency_key",
                    "idempotency_key must be 1 to 200 printable ASCII characters",
                );
            }
        }
        Ok(Grant {
            org_id: org_id.to_owned(),
            grant_id: grant_id.to_owned(),
            kind: self.kind,
            seconds: self.seconds,
            used_seconds: 0,
            priority,
            starts_at,
            expires_at: self.expires_at,
            note: self.note,
            idempotency_key: self.idempotency_key,
            created_at: now,
            voided_at: None,
            used_up_at: None,
        })
    }

    /// Whether `first`, made earlier under this ask's idempotency key, is what it asks for.
    pub fn matches(&self, first: &Grant) -> bool {
        self.seconds == first.seconds
            && self.kind == first.kind
            && self.priority.unwrap_or(DEFAULT_PRIORITY) == first.priority
            && self.starts_at.is_none_or(|s| s == first.starts_at)
            && self.expires_at == first.expires_at
            && self.note == first.note
    }
}

named! {
    /// Where a grant stands at a moment.
    pub enum GrantStatus {
        /// Funding now, or ready to.
        Active = "active",
        /// Starts later.
        Scheduled = "scheduled",
        UsedUp = "used_up",
        Expired = "expired",
        Voided = "voided",
    }
}

impl Grant {
    pub fn status(&self, t: Secs) -> GrantStatus {
        if self.voided_at.is_some() {
            GrantStatus::Voided
        } else if self.expires_at.is_some_and(|e| e <= t) {
            GrantStatus::Expired
        } else if self.used_seconds >= self.seconds {
            GrantStatus::UsedUp
        } else if self.starts_at > t {
            GrantStatus::Scheduled
        } else {
            GrantStatus::Active
        }
    }
}

/// Pay-as-you-go as asked for on `plan`: it must offer it, and a cap in cents at most
/// its `overage_cap_max` is required to turn it on.
pub fn check_overage(plan: &Plan, enabled: bool, cap: Option<Decimal>) -> Result<Overage, Invalid> {
    if enabled && !plan.offers_overage() {
        return invalid(
            "enabled",
            format!(
                "the {} plan offers no pay-as-you-go; upgrade to a plan that does",
                plan.name
            ),
        );
    }
    let cap = match (enabled, cap) {
        (true, None) => {
            return invalid(
                "monthly_cap",
                "monthly_cap is required to turn pay-as-you-go on, e.g. \"50.00\"",
            )
        }
        (_, Some(c)) => c,
        (false, None) => Decimal::ZERO,
    };
    if cap.is_sign_negative() || cap.round_dp(2) != cap || cap > Decimal::from(1_000_000_000) {
        return invalid(
            "monthly_cap",
            format!("monthly_cap must be an amount of 0 or more, in cents at most (got {cap})"),
        );
    }
    if enabled && cap > plan.overage_cap_max {
        return invalid(
            "monthly_cap",
            format!(
                "monthly_cap may be at most {} {} on the {} plan (got {cap})",
                plan.overage_cap_max, plan.currency, plan.name
            ),
        );
    }
    Ok(Overage {
        enabled,
        monthly_cap: cap,
    })
}
