//! Usage-threshold notifications (`NotificationStore`; its SQL: store/sql/notifications.rs).

use async_trait::async_trait;
use rush_meter_core::time::Secs;

use super::super::rows::NotificationRow;
use super::super::StoreResult;

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
    /// Notifications, newest first, of one org and/or in one state.
    async fn list_notifications(
        &self,
        org_id: Option<&str>,
        state: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<NotificationRow>>;
}
