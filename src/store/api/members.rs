//! Inside an org (`MemberStore`; its SQL: store/sql/members.rs).

use std::collections::HashMap;

use async_trait::async_trait;
use rush_meter_core::audit::Actor;
use rush_meter_core::ledger::Rules;
use rush_meter_core::members::{Dimension, Limit, LimitKind, MemberUsage};
use rush_meter_core::org::Org;
use rush_meter_core::session::Session;
use rush_meter_core::time::Secs;

use super::super::StoreResult;

/// Inside an org: its limits on its users, projects and keys, and what they used.
#[async_trait]
pub trait MemberStore: Send + Sync {
    /// Set a limit (created, or its hours replaced).
    async fn put_limit(&self, limit: &Limit, now: Secs, actor: &Actor) -> StoreResult<Limit>;
    /// Remove a limit; the one removed, `None` if there was none.
    async fn delete_limit(
        &self,
        org_id: &str,
        kind: LimitKind,
        member_id: &str,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<Option<Limit>>;
    /// The limits of each of `orgs` that has any, with what each limited user, project
    /// and key used in the org's month and week windows at `now`, running sessions
    /// counted up to now.
    async fn limits_with_usage(
        &self,
        orgs: &[&Org],
        now: Secs,
        rules: &Rules,
    ) -> StoreResult<HashMap<String, (Vec<Limit>, MemberUsage)>>;
    /// A member's booked seconds by hour in `[from, to)` (the member rollup), oldest first.
    async fn member_hours(
        &self,
        org_id: &str,
        dimension: Dimension,
        member_id: &str,
        from: Secs,
        to: Secs,
    ) -> StoreResult<Vec<(Secs, i64)>>;
    /// The running and parked sessions a user started in an org, oldest first.
    async fn open_sessions_of_user(&self, org_id: &str, user: &str) -> StoreResult<Vec<Session>>;
}
