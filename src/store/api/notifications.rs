//! Usage-threshold notifications (`NotificationStore`; its SQL: store/sql/notifications.rs).

use async_trait::async_trait;
use rush_meter_core::time::Secs;

use super::super::rows::NotificationRow;
use super::super::StoreResult;

/// An org waiting for room since its sessions were told to park for want of it.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct RoomWait {
    pub org_id: String,
    pub since: Secs,
    /// `core::room::ParkReason`.
    pub reason: String,
    pub resume_at: Secs,
    pub plan_id: String,
    pub plan_version: i64,
    /// For `member_limit`: the members whose limits were spent, a JSON array of
    /// `[dimension, id]`.
    pub members: Option<String>,
}

/// Usage-threshold notifications.
#[async_trait]
pub trait NotificationStore: Send + Sync {
    /// Record a notification; false if this threshold of this window was recorded before.
    #[allow(clippy::too_many_arguments)]
    async fn insert_notification(
        &self,
        org_id: &str,
        window_kind: &str,
        window_start: Secs,
        threshold: i64,
        notification_id: &str,
        body: &str,
        now: Secs,
    ) -> StoreResult<bool>;
    /// Take up to `limit` pending notifications that are due, oldest first, and hold them
    /// for `hold` seconds; each take counts as an attempt.
    async fn claim_notifications(
        &self,
        now: Secs,
        hold: Secs,
        limit: i64,
    ) -> StoreResult<Vec<NotificationRow>>;
    /// Record how a delivery went, only while the claim that made `attempts` holds it.
    #[allow(clippy::too_many_arguments)]
    async fn finish_notification(
        &self,
        org_id: &str,
        notification_id: &str,
        attempts: i64,
        state: &str,
        error: Option<&str>,
        next_at: Secs,
        now: Secs,
    ) -> StoreResult<()>;
    /// Record that an org waits for room (nothing if it waits already).
    async fn note_room_wait(&self, wait: &RoomWait) -> StoreResult<()>;
    /// The orgs waiting for room, longest first, after the `(since, org_id)` cursor, at
    /// most `limit`.
    async fn room_waits(
        &self,
        after: Option<(Secs, &str)>,
        limit: i64,
    ) -> StoreResult<Vec<RoomWait>>;
    /// The sessions of an org parked at or after `since`, by id.
    async fn parked_since(&self, org_id: &str, since: Secs) -> StoreResult<Vec<String>>;
    /// End an org's wait that began at `since` and record its `org.room_restored`
    /// notification, in one transaction: false if the wait was ended already (by another
    /// instance), and then nothing is recorded.
    async fn end_room_wait(
        &self,
        org_id: &str,
        since: Secs,
        notification_id: &str,
        body: &str,
        now: Secs,
    ) -> StoreResult<bool>;
    /// Notifications, newest first, of one org and/or in one state.
    async fn list_notifications(
        &self,
        org_id: Option<&str>,
        state: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<NotificationRow>>;
}
