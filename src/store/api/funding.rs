//! Funding (`FundingStore`; its SQL: store/sql/funding.rs and overage.rs).

use std::collections::BTreeMap;

use async_trait::async_trait;
use rush_meter_core::audit::Actor;
use rush_meter_core::funding::{self, Grant, Overage, Source, WindowFunds};
use rush_meter_core::org::Org;
use rush_meter_core::time::{Interval, Secs};

use super::super::rows::OverageChargeRow;
use super::super::StoreResult;

/// Grants, pay-as-you-go settings, and what is recorded of who paid for what.
#[async_trait]
pub trait FundingStore: Send + Sync {
    /// Each of `org_ids` that exists, with what is recorded of its funding at `now` (as
    /// committed: `core::standing::funding_state` adds what runs now).
    async fn funding_records(
        &self,
        org_ids: &[&str],
        now: Secs,
    ) -> StoreResult<Vec<(Org, funding::Recorded)>>;
    /// Create a grant, or answer the one made before with the same idempotency key
    /// (`false`: nothing was created). `None` if the org does not exist.
    async fn create_grant(
        &self,
        grant: &Grant,
        actor: &Actor,
    ) -> StoreResult<Option<(Grant, bool)>>;
    /// Every window an org funded in, oldest first.
    async fn funding_windows_of(&self, org_id: &str) -> StoreResult<Vec<WindowFunds>>;
    /// An org's grants, oldest first (voided, expired and used up ones too).
    async fn list_grants(&self, org_id: &str) -> StoreResult<Vec<Grant>>;
    /// Void a grant at `now`: its remainder lapses, what was used stays. Voiding it again
    /// changes nothing. `None` if the org has no such grant.
    async fn void_grant(
        &self,
        org_id: &str,
        grant_id: &str,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<Option<Grant>>;
    /// Seconds (and charge units) an org's sources other than the plan paid for in the whole
    /// hours `[from, to)`, by source.
    async fn funding_totals(
        &self,
        org_id: &str,
        from: Secs,
        to: Secs,
    ) -> StoreResult<BTreeMap<Source, (i64, i64)>>;
    /// Grants to notify about at `now`: used up since `since`, or 7 days or less from
    /// expiring with time left (not voided); at most 1,000.
    async fn grants_to_notify(&self, now: Secs, since: Secs) -> StoreResult<Vec<Grant>>;
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
    /// Charges recorded and not yet sent, oldest first, at most `limit`.
    async fn pending_overage_charges(&self, limit: i64) -> StoreResult<Vec<OverageChargeRow>>;
    /// An org's charges, newest first.
    async fn overage_charges(&self, org_id: &str) -> StoreResult<Vec<OverageChargeRow>>;
    /// Set an org's pay-as-you-go; `None` if the org does not exist.
    async fn set_overage(
        &self,
        org_id: &str,
        overage: &Overage,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<Option<Org>>;
}
