//! The gate (`GateStore`; its SQL: store/sql/gate.rs).

use async_trait::async_trait;
use rush_meter_core::gate::{AdmissionRequest, AdmitReject, Decision};
use rush_meter_core::ledger::Rules;
use rush_meter_core::plans::Plans;
use rush_meter_core::time::Secs;

use super::super::StoreResult;

/// Told when a group's writes are done and only its COMMIT is left (`admit_telling`).
pub type Written = tokio::sync::oneshot::Sender<()>;

/// The gate's writes and its record.
#[async_trait]
pub trait GateStore: Send + Sync {
    /// Decide a group of admissions in one transaction, in order (`core::gate`), holding
    /// the lock of every key the group names.
    async fn admit(
        &self,
        plans: &Plans,
        requests: &[AdmissionRequest],
        now: Secs,
        rules: &Rules,
    ) -> StoreResult<Vec<Result<Decision, AdmitReject>>> {
        self.admit_telling(plans, requests, now, rules, None).await
    }
    /// `admit`, telling `written` once the group's decisions are written and only its
    /// COMMIT is left: from then on the group holds its keys' locks and reads nothing, so
    /// a writer may begin its next group meanwhile, whose locks wait on this one's
    /// (`app::group_commit`). Its answers still come only after the commit.
    async fn admit_telling(
        &self,
        plans: &Plans,
        requests: &[AdmissionRequest],
        now: Secs,
        rules: &Rules,
        written: Option<Written>,
    ) -> StoreResult<Vec<Result<Decision, AdmitReject>>>;
    /// An org's decisions in `[from, to)`, oldest first, after the `(decided_at,
    /// decision_id)` cursor, at most `limit`; `only` keeps `allow` or `deny`.
    #[allow(clippy::too_many_arguments)]
    async fn list_decisions(
        &self,
        org_id: &str,
        from: Secs,
        to: Secs,
        only: Option<&str>,
        after: Option<(Secs, String)>,
        limit: i64,
    ) -> StoreResult<Vec<Decision>>;
    /// Decisions of an org with `reason` since `since`.
    async fn count_decisions(&self, org_id: &str, reason: &str, since: Secs) -> StoreResult<i64>;
}
