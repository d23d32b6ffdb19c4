//! The audit log (`AuditStore`; its SQL: store/sql/audit.rs).

use async_trait::async_trait;
use rush_meter_core::audit::Entry;
use rush_meter_core::time::Secs;

use super::super::StoreResult;

/// The audit log: who changed what (`core::audit`). Entries are written by the changing
/// methods above, in their transactions; this only reads them.
#[async_trait]
pub trait AuditStore: Send + Sync {
    /// An org's entries (`""`: the service's own) made in `[from, to)`, after the entry
    /// `after` (its time and id), oldest first, at most `limit`.
    async fn list_audit(
        &self,
        org_id: &str,
        from: Secs,
        to: Secs,
        after: Option<(Secs, String)>,
        limit: i64,
    ) -> StoreResult<Vec<Entry>>;
}
