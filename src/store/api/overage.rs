//! Pay-as-you-go charges (`OverageStore`; its SQL: store/sql/overage.rs).

use async_trait::async_trait;
use rush_meter_core::audit::Actor;
use rush_meter_core::time::{Interval, Secs};

use super::super::rows::OverageChargeRow;
use super::super::StoreResult;

/// Pay-as-you-go charges: the month windows to charge, and the record of charging them.
#[async_trait]
pub trait OverageStore: Send + Sync {
    /// Month windows that ended by `before` with pay-as-you-go not yet charged, oldest
    /// first, at most `limit`.
    async fn due_overage_windows(
        &self,
        before: Secs,
        limit: i64,
    ) -> StoreResult<Vec<(String, Interval)>>;
    /// Close an ended window's funding and record its pay-as-you-go to charge (`pending`),
    /// under the org's lock: later time of the window is funded in the next one. Returns
    /// the record (the one made before, if any); `None` if the window funded nothing.
    async fn close_overage_window(
        &self,
        org_id: &str,
        window_start: Secs,
        currency: &str,
        now: Secs,
    ) -> StoreResult<Option<OverageChargeRow>>;
    /// Record how charging went: `charged` (with Stripe's ids) or `none`.
    async fn finish_overage_charge(
        &self,
        org_id: &str,
        window_start: Secs,
        state: &str,
        invoice_id: Option<&str>,
        item_id: Option<&str>,
        now: Secs,
    ) -> StoreResult<()>;
    /// Charges recorded, not yet sent and due by `now` (all of `org_id`'s, due or not: an
    /// invoice of that org is open for them), oldest first, at most `limit`.
    async fn pending_overage_charges(
        &self,
        now: Secs,
        org_id: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<OverageChargeRow>>;
    /// Record a failed try of a charge: tried again at `next_at`, or, with `failed`, given
    /// up (audited as `actor`'s). Returns the row as it now stands.
    #[allow(clippy::too_many_arguments)]
    async fn retry_overage_charge(
        &self,
        org_id: &str,
        window_start: Secs,
        error: &str,
        next_at: Secs,
        failed: bool,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<Option<OverageChargeRow>>;
    /// Put an org's failed charges back to be tried at once; audited. Returns how many.
    async fn requeue_overage_charges(
        &self,
        org_id: &str,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<u64>;
    /// An org's charges, newest first.
    async fn overage_charges(&self, org_id: &str) -> StoreResult<Vec<OverageChargeRow>>;
}
