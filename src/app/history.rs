//! What happened, page by page: an org's decisions, sessions and audit log, and the
//! service's notifications. Each page is rows in time order after a cursor.

use rush_meter_core::audit::Entry;
use rush_meter_core::gate::{Decision, Verdict};
use rush_meter_core::ledger::Phase;
use rush_meter_core::session::Session;
use rush_meter_core::time::Secs;

use super::notifier::DeliveryState;
use super::{Outcome, Services};
use crate::store::NotificationRow;

/// Rows in `[from, to)` after `after` (the last row of the page before: its time and id),
/// `limit` of them at most.
pub struct Slice {
    pub from: Secs,
    pub to: Secs,
    pub after: Option<(Secs, String)>,
    pub limit: i64,
}

impl Services {
    /// A page of an existing org's decisions (`only` those of one verdict).
    pub async fn decisions(
        &self,
        org_id: &str,
        only: Option<Verdict>,
        slice: Slice,
    ) -> Outcome<Vec<Decision>> {
        self.org(org_id).await?;
        Ok(self
            .db
            .list_decisions(
                org_id,
                slice.from,
                slice.to,
                only.map(Verdict::as_str),
                slice.after,
                slice.limit,
            )
            .await?)
    }

    /// A page of an existing org's sessions by creation (`only` those in one phase).
    pub async fn sessions(
        &self,
        org_id: &str,
        only: Option<Phase>,
        slice: Slice,
    ) -> Outcome<Vec<Session>> {
        self.org(org_id).await?;
        Ok(self
            .db
            .list_sessions(org_id, only, slice.from, slice.to, slice.after, slice.limit)
            .await?)
    }

    /// A page of `org_id`'s audit entries (`""`: the service's own).
    pub async fn audit(&self, org_id: &str, slice: Slice) -> Outcome<Vec<Entry>> {
        Ok(self
            .db
            .list_audit(org_id, slice.from, slice.to, slice.after, slice.limit)
            .await?)
    }

    /// The newest `limit` notifications (of `org_id`, in `only` state, when given).
    pub async fn notifications(
        &self,
        org_id: Option<&str>,
        only: Option<DeliveryState>,
        limit: i64,
    ) -> Outcome<Vec<NotificationRow>> {
        Ok(self
            .db
            .list_notifications(org_id, only.map(DeliveryState::as_str), limit)
            .await?)
    }
}
