//! Funding (`FundingStore`; its SQL: store/sql/funding.rs).

use std::collections::BTreeMap;

use async_trait::async_trait;
use rush_meter_core::audit::Actor;
use rush_meter_core::funding::{self, Grant, Overage, Source, WindowFunds};
use rush_meter_core::org::Org;
use rush_meter_core::time::Secs;

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
    /// One org's funding as `funding_records` reads it, with its parked sessions counted
    /// in the same statement (the usage page's); `None` if the org does not exist.
    async fn funding_record_counting_parked(
        &self,
        org_id: &str,
        now: Secs,
    ) -> StoreResult<Option<(Org, funding::Recorded, i64)>>;
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
    /// Set an org's pay-as-you-go; `None` if the org does not exist.
    async fn set_overage(
        &self,
        org_id: &str,
        overage: &Overage,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<Option<Org>>;
}
