//! Rows the store reads and writes that belong to the shells (tokens, Stripe's tables,
//! periods, notifications); the core's own types (orgs, keys, sessions, decisions) are read
//! through `Rec`.

use rush_meter_core::export::PeriodFunding;
use rush_meter_core::time::Interval;

/// A core type as read from a row: `query_as::<_, Rec<Org>>`, then `.0`. The core knows
/// nothing of sqlx, so each dialect module implements `FromRow` for `Rec` of each type it
/// reads (store/sql/rows.rs).
pub struct Rec<T>(pub T);

/// What `PUT /v1/orgs/{org_id}` may set; `None` leaves a field as it is (or defaults it
/// on creation).
#[derive(Clone, Debug, Default)]
pub struct OrgUpsert {
    pub org_id: String,
    pub name: Option<String>,
    pub plan_id: Option<String>,
    /// The version of the plan set (or of Free, for a new org without one): the newest.
    pub plan_version: Option<i64>,
    pub suspended: Option<bool>,
}

#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct TokenRow {
    pub token_id: String,
    pub secret_hash: String,
    /// Comma-separated scopes.
    pub scopes: String,
    pub org_id: Option<String>,
    /// The user a member token reads the use of (`Scope::Member`).
    pub user_id: Option<String>,
    pub label: String,
    pub created_at: i64,
    /// Refused from this time on; `None`: never expires.
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
    /// As last written by the batches of `tokens::LastUsed` (up to a minute behind).
    pub last_used_at: Option<i64>,
}

/// A Stripe webhook event as stored.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct StripeEventRow {
    pub event_id: String,
    #[sqlx(rename = "type")]
    pub kind: String,
    pub created: i64,
    pub payload: String,
    pub received_at: i64,
    pub state: String,
    pub attempts: i64,
    pub next_attempt_at: i64,
    pub last_error: Option<String>,
    pub processed_at: Option<i64>,
    pub org_id: Option<String>,
    /// The API version Stripe rendered the event in (`None` before it was recorded).
    pub api_version: Option<String>,
}

/// An org's Stripe state as read from Stripe at `synced_at`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriptionState {
    pub org_id: String,
    pub plan_id: String,
    /// The version of `plan_id` the org is on after it (`sync::state_for`).
    pub plan_version: i64,
    pub customer_id: String,
    pub subscription_id: Option<String>,
    pub status: Option<String>,
    pub period_start: Option<i64>,
    pub period_end: Option<i64>,
    pub cancel_at_period_end: bool,
    pub past_due_since: Option<i64>,
    pub synced_at: i64,
    /// The ticket taken before the read (`StripeStore::stripe_ticket`); `None` for a state
    /// taken from an event's own content (no API key), ordered by `synced_at`.
    pub ticket: Option<i64>,
}

/// An outbound Stripe write, recorded before the call.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct StripeRequestRow {
    pub org_id: String,
    pub operation: String,
    pub idempotency_key: String,
    pub target: String,
    pub created_at: i64,
    pub completed_at: Option<i64>,
    pub object_id: Option<String>,
}

/// A closed billing period and its totals.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct PeriodRow {
    pub period_start: i64,
    pub period_end: i64,
    pub closed_at: i64,
    pub orgs: i64,
    pub sessions: i64,
    pub agent_seconds: i64,
    pub adjustment_seconds: i64,
}

/// Pay-as-you-go of one billing window, as charged (or to be) through Stripe.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct OverageChargeRow {
    pub org_id: String,
    pub window_start: i64,
    pub window_end: i64,
    pub overage_seconds: i64,
    pub charge_units: i64,
    /// Decimal, in `currency`: the window's overage, rounded once to the cent.
    pub amount: String,
    pub currency: String,
    /// `pending`, `charged`, `none`, or `failed` (given up after its tries, until an admin
    /// puts it back).
    pub state: String,
    pub stripe_invoice_id: Option<String>,
    pub stripe_invoice_item_id: Option<String>,
    pub created_at: i64,
    pub charged_at: Option<i64>,
    /// Tries that failed so far.
    pub attempts: i64,
    /// Not tried again before this (0: at once).
    pub next_attempt_at: i64,
    pub last_error: Option<String>,
}

/// A pack of hours an auto top-up bought, or is buying (`core::auto_topup`).
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct AutoTopupRow {
    pub org_id: String,
    /// The org's packs in the order opened, from 1.
    pub seq: i64,
    pub hours: i64,
    /// Decimal, in `currency`: hours × the plan's `topup_hour_price` when opened.
    pub amount: String,
    pub currency: String,
    /// The billing month it counts in against `monthly_max_packs` (Unix seconds).
    pub month_start: i64,
    /// `charging`, `paid`, `failed` (its tries spent: auto top-up turned off),
    /// `needs_customer` (the bank wants the customer present: auto top-up turned off) or
    /// `canceled` (a retry no longer wanted).
    pub status: String,
    /// Charges sent so far.
    pub attempts: i64,
    /// While `charging`: when the next charge may be sent (Unix seconds).
    pub next_attempt_at: i64,
    /// The idempotency key of the charge in flight, recorded before it is sent.
    pub idempotency_key: String,
    pub payment_intent_id: Option<String>,
    pub last_error: Option<String>,
    /// The `purchased` grant it became, once paid.
    pub grant_id: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// An org's line of a closed period, with the plan's terms frozen as text.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct FrozenOrgRow {
    pub period_start: i64,
    pub org_id: String,
    pub plan_id: String,
    pub plan_version: i64,
    pub stripe_customer_id: Option<String>,
    pub stripe_subscription_id: Option<String>,
    pub agent_seconds: i64,
    pub adjustment_seconds: i64,
    pub included_hours: String,
    pub unit_price: String,
    pub price: String,
    pub currency: String,
    pub grant_promo_seconds: i64,
    pub grant_make_good_seconds: i64,
    pub grant_trial_seconds: i64,
    pub grant_purchased_seconds: i64,
    pub overage_seconds: i64,
    pub grace_seconds: i64,
    pub charge_units: i64,
    pub adjustment_overage_seconds: i64,
    pub adjustment_charge_units: i64,
}

impl FrozenOrgRow {
    /// Who paid for the period's seconds, as frozen.
    pub fn funding(&self) -> PeriodFunding {
        PeriodFunding {
            grant: [
                self.grant_promo_seconds,
                self.grant_make_good_seconds,
                self.grant_trial_seconds,
                self.grant_purchased_seconds,
            ],
            overage: self.overage_seconds,
            grace: self.grace_seconds,
            charge_units: self.charge_units,
        }
    }

    /// Who paid for its adjustment, as frozen (what the export shows of it).
    pub fn adjustment_funding(&self) -> PeriodFunding {
        PeriodFunding {
            overage: self.adjustment_overage_seconds,
            charge_units: self.adjustment_charge_units,
            ..PeriodFunding::default()
        }
    }
}

/// Which lines of a period to read: frozen ones of a closed period, or live ones, with
/// adjustments against `adjusts` (the closed period just before it, if it is the first
/// open one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineQuery {
    pub period: Interval,
    pub closed: bool,
    pub adjusts: Option<Interval>,
}

/// A usage-threshold notification as recorded.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct NotificationRow {
    pub org_id: String,
    pub window_kind: String,
    pub window_start: i64,
    pub threshold: i64,
    pub notification_id: String,
    pub body: String,
    pub state: String,
    pub attempts: i64,
    pub next_at: i64,
    pub last_error: Option<String>,
    pub created_at: i64,
    pub sent_at: Option<i64>,
}
