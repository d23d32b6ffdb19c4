//! Plan versions: their recorded terms and the orgs on each (`PlanStore`; its SQL:
//! store/sql/plans.rs).

use async_trait::async_trait;
use rush_meter_core::audit::Actor;
use rush_meter_core::org::Org;
use rush_meter_core::time::Secs;

use super::super::StoreResult;

/// A plan version's terms as recorded the first time the service started with it.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct RecordedVersion {
    pub plan_id: String,
    pub version: i64,
    /// `core::plans::terms_text`.
    pub terms: String,
    pub file: String,
    pub recorded_at: Secs,
}

/// A move of one org between versions of its plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VersionMove<'a> {
    pub plan_id: &'a str,
    pub from: i64,
    pub to: i64,
    /// When it takes effect (`now` or later).
    pub at: Secs,
}

#[async_trait]
pub trait PlanStore: Send + Sync {
    /// Record the versions not recorded yet (first seen wins, on any instance) and return
    /// every recorded one.
    async fn record_plan_versions(
        &self,
        seen: &[RecordedVersion],
    ) -> StoreResult<Vec<RecordedVersion>>;
    /// `(plan, version, orgs)` for every version some org is on at `now` or is moving to
    /// later.
    async fn orgs_by_version(&self, now: Secs) -> StoreResult<Vec<(String, i64, i64)>>;
    /// The orgs on `plan_id` whose version in force at `now` is `version`, by id.
    async fn orgs_on_version(
        &self,
        plan_id: &str,
        version: i64,
        now: Secs,
    ) -> StoreResult<Vec<Org>>;
    /// Schedule `org_id`'s move (a move to the version it is on calls a scheduled one
    /// off), audited; a move whose time has come is folded into the version first. `None`
    /// when the org is not on `m.plan_id` at version `m.from` at `now`.
    async fn move_version(
        &self,
        org_id: &str,
        m: VersionMove<'_>,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<Option<Org>>;
}
