//! Rows as stored, and their conversion to the ledger's types.

use crate::ledger::{EndStatus, Phase, Secs, SessionLedger};

#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct OrgRow {
    pub org_id: String,
    pub name: String,
    pub plan_id: String,
    pub suspended: bool,
    pub period_start: Option<i64>,
    pub period_end: Option<i64>,
    pub stripe_customer_id: Option<String>,
    pub stripe_subscription_id: Option<String>,
    pub subscription_status: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    /// When the subscription went `past_due` (the plan is kept through its grace).
    pub past_due_since: Option<i64>,
    pub cancel_at_period_end: bool,
    /// A downgrade asked for, made in Stripe at `scheduled_at`.
    pub scheduled_plan_id: Option<String>,
    pub scheduled_at: Option<i64>,
    /// When the Stripe state last applied was read from Stripe.
    pub stripe_synced_at: Option<i64>,
}

impl OrgRow {
    /// The Stripe billing period, when one is recorded.
    pub fn billing_period(&self) -> Option<crate::ledger::Interval> {
        crate::ledger::Interval::new(self.period_start?, self.period_end?)
    }
}

/// What `PUT /v1/orgs/{org_id}` may set; `None` leaves a field as it is (or defaults it
/// on creation).
#[derive(Clone, Debug, Default)]
pub struct OrgUpsert {
    pub org_id: String,
    pub name: Option<String>,
    pub plan_id: Option<String>,
    pub suspended: Option<bool>,
}

#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct KeyRow {
    pub org_id: String,
    pub key_id: String,
    /// `None`: the plan's `concurrency_default`.
    pub concurrency_limit: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct TokenRow {
    pub token_id: String,
    pub secret_hash: String,
    /// Comma-separated scopes.
    pub scopes: String,
    pub org_id: Option<String>,
    pub label: String,
    pub created_at: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct SessionRow {
    pub org_id: String,
    pub session_id: String,
    pub key_id: Option<String>,
    pub agent: Option<String>,
    pub project_id: Option<String>,
    pub started_by: Option<String>,
    pub vm_id: Option<String>,
    pub phase: String,
    pub last_seq: Option<i64>,
    pub last_at: i64,
    pub span_start: i64,
    pub billed_seconds: i64,
    pub heartbeats: i64,
    pub silences: i64,
    pub unadmitted: bool,
    pub created_at: i64,
    pub ended_at: Option<i64>,
    pub end_status: Option<String>,
    /// The meter's clock when a heartbeat was last applied.
    pub heard_at: Option<i64>,
    /// Last admission by the gate (written only by the gate, never by heartbeats).
    pub slot_at: Option<i64>,
}

impl SessionRow {
    /// A session first seen through a heartbeat, never admitted by the gate: it is billed
    /// all the same (its VM runs) and flagged.
    pub fn unadmitted(org_id: &str, session_id: &str, vm_id: &str, at: Secs) -> SessionRow {
        // `heard_at` is set as its heartbeats are applied.
        let mut row = SessionRow::from_ledger(org_id, session_id, &SessionLedger::admitted(at));
        row.vm_id = Some(vm_id.to_owned());
        row.unadmitted = true;
        row.created_at = at;
        row
    }

    pub fn from_ledger(org_id: &str, session_id: &str, led: &SessionLedger) -> SessionRow {
        let mut row = SessionRow {
            org_id: org_id.to_owned(),
            session_id: session_id.to_owned(),
            key_id: None,
            agent: None,
            project_id: None,
            started_by: None,
            vm_id: None,
            phase: String::new(),
            last_seq: None,
            last_at: 0,
            span_start: 0,
            billed_seconds: 0,
            heartbeats: 0,
            silences: 0,
            unadmitted: false,
            created_at: led.last_at,
            ended_at: None,
            end_status: None,
            heard_at: None,
            slot_at: None,
        };
        row.set_ledger(led);
        row
    }

    pub fn ledger(&self) -> SessionLedger {
        SessionLedger {
            // The column is only ever written from `Phase::as_str`.
            phase: Phase::parse(&self.phase).unwrap_or(Phase::Ended),
            last_seq: self.last_seq,
            last_at: self.last_at,
            span_start: self.span_start,
            billed_seconds: self.billed_seconds,
            heartbeats: self.heartbeats,
            silences: self.silences,
            ended_at: self.ended_at,
            end_status: self.end_status.as_deref().and_then(EndStatus::parse),
        }
    }

    pub fn set_ledger(&mut self, led: &SessionLedger) {
        self.phase = led.phase.as_str().to_owned();
        self.last_seq = led.last_seq;
        self.last_at = led.last_at;
        self.span_start = led.span_start;
        self.billed_seconds = led.billed_seconds;
        self.heartbeats = led.heartbeats;
        self.silences = led.silences;
        self.ended_at = led.ended_at;
        self.end_status = led.end_status.map(|s| s.as_str().to_owned());
    }
}

/// One heartbeat's answer from the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeartbeatOutcome {
    pub session_id: String,
    pub org_id: String,
    /// It changed nothing: a repeated or overtaken `seq`, or an ended session.
    pub duplicate: bool,
    pub phase: Phase,
}

/// Why a whole heartbeat request was refused; nothing of it was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IngestReject {
    UnknownOrg { index: usize, org_id: String },
    SessionOfAnotherOrg { index: usize, session_id: String },
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionCounts {
    pub running: i64,
    pub parked: i64,
}

/// One org's use of its month and week windows, and its running sessions, at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowTotals {
    pub month: i64,
    pub week: i64,
    /// Running sessions heard from within the lease.
    pub running: i64,
}

/// One decision of the gate, as recorded.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct DecisionRow {
    pub org_id: String,
    pub decision_id: String,
    pub decided_at: i64,
    pub session_id: String,
    pub key_id: String,
    pub decision: String,
    pub reason: Option<String>,
    pub rule: String,
    pub plan_id: String,
    pub suspended: bool,
    pub month_start: i64,
    pub month_end: i64,
    pub month_used: i64,
    pub month_limit: i64,
    pub week_start: i64,
    pub week_end: i64,
    pub week_used: i64,
    pub week_limit: i64,
    pub running: i64,
    pub concurrency_limit: i64,
    pub upgrade_plan: Option<String>,
}

/// What the orchestrator asks the gate.
#[derive(Clone, Debug)]
pub struct AdmissionRequest {
    pub org_id: String,
    pub key_id: String,
    pub session_id: String,
    pub agent: String,
    pub project_id: Option<String>,
    pub started_by: Option<String>,
}

/// Why an admission request could not be decided at all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdmitReject {
    UnknownOrg,
    UnknownKey,
    SessionOfAnotherOrg,
    SessionEnded,
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
}

/// An org's Stripe state as read from Stripe at `synced_at`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriptionState {
    pub org_id: String,
    pub plan_id: String,
    pub customer_id: String,
    pub subscription_id: Option<String>,
    pub status: Option<String>,
    pub period_start: Option<i64>,
    pub period_end: Option<i64>,
    pub cancel_at_period_end: bool,
    pub past_due_since: Option<i64>,
    pub synced_at: i64,
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

/// An org's line of a closed period, with the plan's terms frozen as text.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct FrozenOrgRow {
    pub period_start: i64,
    pub org_id: String,
    pub plan_id: String,
    pub stripe_customer_id: Option<String>,
    pub stripe_subscription_id: Option<String>,
    pub agent_seconds: i64,
    pub adjustment_seconds: i64,
    pub included_hours: String,
    pub unit_price: String,
    pub price: String,
    pub currency: String,
}

/// Which lines of a period to read: frozen ones of a closed period, or live ones, with
/// adjustments against `adjusts` (the closed period just before it, if it is the first
/// open one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineQuery {
    pub period: crate::ledger::Interval,
    pub closed: bool,
    pub adjusts: Option<crate::ledger::Interval>,
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
