//! Stripe (`StripeStore`; its SQL: store/sql/stripe.rs).

use async_trait::async_trait;
use rush_meter_core::audit::Actor;
use rush_meter_core::org::Org;
use rush_meter_core::time::Secs;

use super::super::rows::{StripeEventRow, StripeRequestRow, SubscriptionState};
use super::super::StoreResult;

/// What an org's Stripe state is decided from, under its row lock: `None` leaves it.
pub type DecideState<'a> = &'a (dyn Fn(&Org) -> Option<SubscriptionState> + Sync);

/// Stripe's events, the org's subscription state, and outbound writes.
#[async_trait]
pub trait StripeStore: Send + Sync {
    /// Store a webhook event as received; false if its id was stored before.
    async fn insert_stripe_event(
        &self,
        event_id: &str,
        kind: &str,
        created: Secs,
        api_version: Option<&str>,
        payload: &str,
        now: Secs,
    ) -> StoreResult<bool>;
    /// Store a webhook event that cannot be processed as sent (`billing::events::arrival`)
    /// quarantined, with why; false if its id was stored before.
    async fn quarantine_stripe_event(
        &self,
        event_id: &str,
        kind: &str,
        created: Secs,
        payload: &str,
        why: &str,
        now: Secs,
    ) -> StoreResult<bool>;
    /// Take up to `limit` pending events that are due, oldest first, and hold them for
    /// `hold` seconds; each take counts as an attempt.
    async fn claim_stripe_events(
        &self,
        now: Secs,
        hold: Secs,
        limit: i64,
    ) -> StoreResult<Vec<StripeEventRow>>;
    /// Record how processing went: processed, ignored, quarantined, or pending again with
    /// its next attempt at `next_attempt_at`.
    async fn finish_stripe_event(
        &self,
        event_id: &str,
        state: &str,
        org_id: Option<&str>,
        error: Option<&str>,
        next_attempt_at: Secs,
        now: Secs,
    ) -> StoreResult<()>;
    /// Events in `state` (all when `None`), newest first, after the cursor.
    async fn list_stripe_events(
        &self,
        state: Option<&str>,
        before: Option<(Secs, String)>,
        limit: i64,
    ) -> StoreResult<Vec<StripeEventRow>>;
    /// Put a quarantined event back in the queue, due now; false if it is not quarantined.
    async fn requeue_stripe_event(&self, event_id: &str, now: Secs) -> StoreResult<bool>;
    async fn org_by_stripe_customer(&self, customer_id: &str) -> StoreResult<Option<Org>>;
    /// Apply Stripe's state to an org: `decide` turns the org's row, read under its lock,
    /// into the state to write, which is written unless a later read of Stripe was
    /// applied already. Records what changed. `(before, after)` when written.
    async fn apply_subscription_state(
        &self,
        org_id: &str,
        decide: DecideState<'_>,
        source: &str,
        now: Secs,
    ) -> StoreResult<Option<(Org, Org)>>;
    /// An org's billing changes `(at, source, detail)`, newest first.
    async fn list_stripe_changes(
        &self,
        org_id: &str,
        limit: i64,
    ) -> StoreResult<Vec<(Secs, String, String)>>;
    /// Link an org to its Stripe customer; false if it has another one already, or the
    /// customer is another org's.
    async fn link_stripe_customer(
        &self,
        org_id: &str,
        customer_id: &str,
        now: Secs,
    ) -> StoreResult<bool>;
    /// Record an outbound write before it is sent; returns the unfinished request for its
    /// operation and target as stored (this one, or one recorded before, whose key the
    /// caller must then use).
    async fn begin_stripe_request(&self, r: &StripeRequestRow) -> StoreResult<StripeRequestRow>;
    /// The unfinished outbound write of `operation` on `target`, if any.
    async fn open_stripe_request(
        &self,
        org_id: &str,
        operation: &str,
        target: &str,
    ) -> StoreResult<Option<StripeRequestRow>>;
    async fn complete_stripe_request(
        &self,
        org_id: &str,
        idempotency_key: &str,
        object_id: &str,
        now: Secs,
    ) -> StoreResult<()>;
    /// Give an open request a new idempotency key (its next try, after a 5xx).
    async fn rekey_stripe_request(
        &self,
        org_id: &str,
        idempotency_key: &str,
        new_key: &str,
    ) -> StoreResult<()>;
    /// The next ticket of the org's reads of its subscription, to take before a read:
    /// `None` when there is no such org.
    async fn stripe_ticket(&self, org_id: &str) -> StoreResult<Option<i64>>;
    /// Record (`Some((plan, at))`) or clear a downgrade in force from `at`; `in_stripe`:
    /// made in Stripe already (`Org::scheduled_in_stripe`). Audited.
    async fn schedule_plan(
        &self,
        org_id: &str,
        plan: Option<(&str, Secs)>,
        in_stripe: bool,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<()>;
}
