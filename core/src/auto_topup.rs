//! Auto top-up: when the hours an org can use now from its plan and its grants (the
//! figure the gate reads) fall below its threshold, one pack of the plan's `topup_hours` is
//! charged off-session, and becomes a `purchased` grant once paid (docs/funding.md).
//!
//! Once per crossing: a pack is opened by a guarded update of the org's row (enabled, no
//! pack in flight, and as many packs opened as the reader saw), so of all the instances
//! and heartbeats that see the same crossing, one opens it; a reader whose view predates
//! the last pack cannot open another. While a pack is in flight no other is opened; once
//! paid the org holds more than its threshold (`pack_hours` exceeds `below_hours`), so the
//! next pack needs a new crossing.

use rust_decimal::Decimal;
use serde::Serialize;

use crate::funding;
use crate::plans::Plan;
use crate::time::{format_rfc3339, hours, Secs};

/// An org's auto top-up as it set it, and where its packs stand.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AutoTopup {
    pub enabled: bool,
    /// Below this many seconds of plan and grant time, a pack is bought.
    pub below_seconds: i64,
    /// Hours a pack buys: one of the plan's `topup_hours`.
    pub pack_hours: i64,
    /// Packs bought at most in one billing month.
    pub monthly_max_packs: i64,
    /// Packs opened ever: the next pack's number is one more.
    pub opened: i64,
    /// A pack is opened and neither paid nor given up.
    pub pending: bool,
}

impl AutoTopup {
    /// Whether a pack is due at `t` for an org whose funding is `state`.
    pub fn due(&self, state: &funding::State, t: Secs) -> bool {
        self.enabled && !self.pending && usable_seconds(state, t) < self.below_seconds
    }

    /// Seconds of use before a pack falls due (`i64::MAX` while none can).
    pub fn room_to_crossing(&self, state: &funding::State, t: Secs) -> i64 {
        if !self.enabled || self.pending {
            return i64::MAX;
        }
        usable_seconds(state, t) - self.below_seconds
    }
}

/// What an org can use now without paying as it goes: the plan's room (the lesser of the
/// month's and the week's) and its grants in force.
pub fn usable_seconds(state: &funding::State, t: Secs) -> i64 {
    state.plan_room(&state.windows_at(t)) + state.grant_room(t)
}

/// Auto top-up as asked for, checked against the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub enabled: bool,
    pub below_seconds: i64,
    pub pack_hours: i64,
    pub monthly_max_packs: i64,
}

/// A field of the settings that is wrong, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    pub field: &'static str,
    pub message: String,
}

fn invalid(field: &'static str, message: String) -> Invalid {
    Invalid { field, message }
}

/// Packs a month an org may allow at most.
pub const MAX_PACKS_A_MONTH: i64 = 100;

/// Check auto top-up settings against `plan`: `below_hours` a decimal of whole seconds,
/// not negative; `pack_hours` one of the plan's packs and more than `below_hours` (else a
/// pack would leave the org below the threshold, and the next heartbeat buy another);
/// `monthly_max_packs` 1 to 100.
pub fn check(
    enabled: bool,
    below_hours: Decimal,
    pack_hours: i64,
    monthly_max_packs: i64,
    plan: &Plan,
) -> Result<Settings, Invalid> {
    let seconds = below_hours * Decimal::from(3600);
    if below_hours.is_sign_negative() || seconds.fract() != Decimal::ZERO {
        return Err(invalid(
            "below_hours",
            format!("must be hours of whole seconds, 0 or more (got {below_hours})"),
        ));
    }
    let below_seconds = i64::try_from(seconds)
        .ok()
        .filter(|s| *s <= 10_000 * 3600)
        .ok_or_else(|| invalid("below_hours", "must be at most 10000".into()))?;
    if !plan.topup_hours.contains(&pack_hours) {
        let sold = if plan.topup_hours.is_empty() {
            format!("the {} plan sells no top-ups", plan.name)
        } else {
            let packs: Vec<String> = plan.topup_hours.iter().map(i64::to_string).collect();
            format!(
                "the {} plan sells packs of {} hours (got {pack_hours})",
                plan.name,
                packs.join(", ")
            )
        };
        return Err(invalid("pack_hours", sold));
    }
    if pack_hours * 3600 <= below_seconds {
        return Err(invalid(
            "pack_hours",
            format!(
                "must be more than below_hours ({}): a pack must lift the org above the threshold",
                hours(below_seconds)
            ),
        ));
    }
    if !(1..=MAX_PACKS_A_MONTH).contains(&monthly_max_packs) {
        return Err(invalid(
            "monthly_max_packs",
            format!("must be 1 to {MAX_PACKS_A_MONTH} (got {monthly_max_packs})"),
        ));
    }
    Ok(Settings {
        enabled,
        below_seconds,
        pack_hours,
        monthly_max_packs,
    })
}

/// What a pack of `hours` costs on `plan`: hours × `topup_hour_price`, in its currency.
pub fn pack_amount(plan: &Plan, hours: i64) -> Decimal {
    plan.topup_hour_price * Decimal::from(hours)
}

/// Charges of one pack at most: the first, then a retry after each of these waits.
pub const RETRY_AFTER: [Secs; 2] = [3600, 6 * 3600];

/// What follows a declined charge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterDecline {
    /// Charge again at this time.
    RetryAt(Secs),
    /// The pack's tries are spent: auto top-up turns off.
    GiveUp,
    /// The bank wants the customer present (SCA): no retry off-session can pass, so auto
    /// top-up turns off and the customer is sent a Checkout link for the same pack.
    NeedsCustomer,
}

/// The decline code that means the customer must be present.
pub const AUTHENTICATION_REQUIRED: &str = "authentication_required";

/// What to do after the `attempts`-th charge of a pack was declined with `code` (Stripe's
/// error code, or its `decline_code`) at `now`.
pub fn after_decline(codes: &[Option<&str>], attempts: i64, now: Secs) -> AfterDecline {
    if codes
        .iter()
        .flatten()
        .any(|c| *c == AUTHENTICATION_REQUIRED)
    {
        return AfterDecline::NeedsCustomer;
    }
    match usize::try_from(attempts - 1)
        .ok()
        .and_then(|i| RETRY_AFTER.get(i))
    {
        Some(wait) => AfterDecline::RetryAt(now + wait),
        None => AfterDecline::GiveUp,
    }
}

/// The idempotency key of the `attempt`-th charge of pack `seq` of `org_id`: recorded with
/// the pack before the first request, the same on every instance and after a crash.
pub fn charge_key(org_id: &str, seq: i64, attempt: i64) -> String {
    match attempt {
        ..=1 => format!("auto-topup-{org_id}-{seq:04}"),
        n => format!("auto-topup-{org_id}-{seq:04}-r{n}"),
    }
}

/// The pack and attempt a charge's idempotency key names, for `org_id`.
pub fn parse_charge_key(org_id: &str, key: &str) -> Option<(i64, i64)> {
    let rest = key.strip_prefix("auto-topup-")?.strip_prefix(org_id)?;
    let rest = rest.strip_prefix('-')?;
    let rest = rest.split('~').next()?;
    let (seq, attempt) = match rest.split_once("-r") {
        Some((s, a)) => (s, a.parse().ok()?),
        None => (rest, 1),
    };
    Some((seq.parse().ok()?, attempt))
}

#[derive(Serialize)]
struct FailedBody<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    created_at: String,
    org_id: &'a str,
    pack: i64,
    hours: i64,
    amount: String,
    currency: &'a str,
    attempts: i64,
    /// Stripe's message and code for the decline.
    error: &'a str,
    decline_code: Option<&'a str>,
    /// When the charge is tried again; absent once auto top-up is off.
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_at: Option<String>,
    auto_topup_disabled: bool,
    /// Stripe Checkout for the same pack, where the customer can pay it in person.
    #[serde(skip_serializing_if = "Option::is_none")]
    checkout_url: Option<&'a str>,
}

/// A declined pack, as the notification `auto_topup.failed` tells it.
#[derive(Clone, Debug)]
pub struct Declined<'a> {
    pub org_id: &'a str,
    pub seq: i64,
    pub hours: i64,
    pub amount: Decimal,
    pub currency: &'a str,
    pub attempts: i64,
    pub error: &'a str,
    pub decline_code: Option<&'a str>,
    pub next: AfterDecline,
    pub checkout_url: Option<&'a str>,
}

impl Declined<'_> {
    /// The notification's id: one per charge of a pack.
    pub fn id(&self) -> String {
        format!("ntf_atu_{}_{}_{}", self.org_id, self.seq, self.attempts)
    }

    /// The notification's body at `now`.
    pub fn body(&self, now: Secs) -> String {
        let id = self.id();
        let body = FailedBody {
            id: &id,
            kind: "auto_topup.failed",
            created_at: format_rfc3339(now),
            org_id: self.org_id,
            pack: self.seq,
            hours: self.hours,
            amount: format!("{:.2}", self.amount),
            currency: self.currency,
            attempts: self.attempts,
            error: self.error,
            decline_code: self.decline_code,
            retry_at: match self.next {
                AfterDecline::RetryAt(t) => Some(format_rfc3339(t)),
                _ => None,
            },
            auto_topup_disabled: !matches!(self.next, AfterDecline::RetryAt(_)),
            checkout_url: self.checkout_url,
        };
        serde_json::to_string(&body).expect("a notification serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::funding::{Grant, GrantKind, Overage, Recorded, State, Terms};

    fn pro() -> Plan {
        crate::shipped_plans().get("pro").unwrap().clone()
    }

    fn state_with_grant(plan: &Plan, grant_seconds: i64, plan_used: i64, t: Secs) -> State {
        let grant = Grant {
            org_id: "o".into(),
            grant_id: "g".into(),
            kind: GrantKind::Purchased,
            seconds: grant_seconds,
            used_seconds: 0,
            priority: 100,
            starts_at: 0,
            expires_at: None,
            note: None,
            idempotency_key: None,
            created_at: 0,
            voided_at: None,
            used_up_at: None,
        };
        let recorded = Recorded {
            grants: vec![grant],
            ..Recorded::default()
        };
        let mut s = State::new(
            Terms::of(plan, &Overage::default()),
            None,
            recorded.floor,
            recorded.windows,
            recorded.grants,
        );
        let w = s.windows_at(t);
        s.seed(funding::WindowKind::Month, w.month, plan_used);
        s.seed(funding::WindowKind::Week, w.week, plan_used);
        s
    }

    #[test]
    fn a_pack_falls_due_below_the_threshold_of_plan_and_grants() {
        let plan = pro();
        let t = 1_796_040_000;
        let a = AutoTopup {
            enabled: true,
            below_seconds: 7200,
            pack_hours: 10,
            monthly_max_packs: 3,
            opened: 0,
            pending: false,
        };
        let week = plan.weekly_limit_seconds;
        // Plan spent; a grant of 2 h 1 s left: not yet.
        let s = state_with_grant(&plan, 7201, week, t);
        assert_eq!(usable_seconds(&s, t), 7201);
        assert!(!a.due(&s, t));
        assert_eq!(a.room_to_crossing(&s, t), 1);
        let s = state_with_grant(&plan, 7199, week, t);
        assert!(a.due(&s, t));
        // In flight, or off: never.
        assert!(!AutoTopup {
            pending: true,
            ..a.clone()
        }
        .due(&s, t));
        assert!(!AutoTopup {
            enabled: false,
            ..a.clone()
        }
        .due(&s, t));
        assert_eq!(
            AutoTopup { pending: true, ..a }.room_to_crossing(&s, t),
            i64::MAX
        );
    }

    #[test]
    fn settings_are_checked_against_the_plan() {
        let plan = pro();
        let ok = check(true, "2".parse().unwrap(), 10, 3, &plan).unwrap();
        assert_eq!(ok.below_seconds, 7200);
        assert_eq!(
            check(true, "0.5".parse().unwrap(), 10, 3, &plan)
                .unwrap()
                .below_seconds,
            1800
        );
        let field = |r: Result<Settings, Invalid>| r.unwrap_err().field;
        assert_eq!(
            field(check(true, "0.0001".parse().unwrap(), 10, 3, &plan)),
            "below_hours"
        );
        assert_eq!(
            field(check(true, "-1".parse().unwrap(), 10, 3, &plan)),
            "below_hours"
        );
        assert_eq!(
            field(check(true, "2".parse().unwrap(), 7, 3, &plan)),
            "pack_hours"
        );
        assert_eq!(
            field(check(true, "10".parse().unwrap(), 10, 3, &plan)),
            "pack_hours"
        );
        assert_eq!(
            field(check(true, "2".parse().unwrap(), 10, 0, &plan)),
            "monthly_max_packs"
        );
        assert_eq!(
            field(check(true, "2".parse().unwrap(), 10, 101, &plan)),
            "monthly_max_packs"
        );
    }

    #[test]
    fn declines_are_retried_a_bounded_number_of_times() {
        let now = 1000;
        assert_eq!(
            after_decline(&[Some("card_declined")], 1, now),
            AfterDecline::RetryAt(now + 3600)
        );
        assert_eq!(
            after_decline(&[Some("card_declined"), Some("insufficient_funds")], 2, now),
            AfterDecline::RetryAt(now + 6 * 3600)
        );
        assert_eq!(after_decline(&[None], 3, now), AfterDecline::GiveUp);
        assert_eq!(
            after_decline(
                &[Some("card_declined"), Some(AUTHENTICATION_REQUIRED)],
                1,
                now
            ),
            AfterDecline::NeedsCustomer
        );
    }

    #[test]
    fn charge_keys_name_their_pack_and_attempt() {
        assert_eq!(charge_key("org_1", 1, 1), "auto-topup-org_1-0001");
        assert_eq!(charge_key("a-b", 12, 3), "auto-topup-a-b-0012-r3");
        assert_eq!(
            parse_charge_key("org_1", "auto-topup-org_1-0001"),
            Some((1, 1))
        );
        assert_eq!(
            parse_charge_key("a-b", "auto-topup-a-b-0012-r3"),
            Some((12, 3))
        );
        assert_eq!(
            parse_charge_key("a-b", "auto-topup-a-b-0012-r3~2"),
            Some((12, 3))
        );
        assert_eq!(parse_charge_key("a", "auto-topup-a-b-0012"), None);
        assert_eq!(parse_charge_key("a", "rm-topup-a-1"), None);
    }

    #[test]
    fn a_decline_notification_says_what_follows() {
        let d = Declined {
            org_id: "o",
            seq: 2,
            hours: 10,
            amount: "5.5".parse().unwrap(),
            currency: "usd",
            attempts: 1,
            error: "Your card was declined.",
            decline_code: Some("insufficient_funds"),
            next: AfterDecline::RetryAt(3600),
            checkout_url: None,
        };
        let v: serde_json::Value = serde_json::from_str(&d.body(0)).unwrap();
        assert_eq!(v["type"], "auto_topup.failed");
        assert_eq!(v["amount"], "5.50");
        assert_eq!(v["retry_at"], "1970-01-01T01:00:00Z");
        assert_eq!(v["auto_topup_disabled"], false);
        let d = Declined {
            next: AfterDecline::NeedsCustomer,
            checkout_url: Some("https://checkout"),
            ..d
        };
        let v: serde_json::Value = serde_json::from_str(&d.body(0)).unwrap();
        assert_eq!(v["auto_topup_disabled"], true);
        assert_eq!(v["checkout_url"], "https://checkout");
        assert!(v.get("retry_at").is_none());
    }
}
