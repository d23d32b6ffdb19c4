//! The ledger (`LedgerStore`; its SQL: store/sql/ledger.rs).

use std::collections::HashMap;

use async_trait::async_trait;
use rush_meter_core::breakdown::{GroupBy, Piece};
use rush_meter_core::heartbeats::{Heartbeat, RequestOutcome};
use rush_meter_core::ledger::{EndStatus, Phase, Rules};
use rush_meter_core::plans::Plans;
use rush_meter_core::session::Session;
use rush_meter_core::standing::WindowTotals;
use rush_meter_core::time::{Secs, Windows};

use super::super::StoreResult;

/// The ledger: heartbeats in, sessions and their time out.
#[async_trait]
pub trait LedgerStore: Send + Sync {
    /// Apply a group of heartbeat requests in one transaction, each accepted or refused
    /// whole (`core::heartbeats::group`). `shard` names the `org_hourly` rows this writer
    /// adds to; give each concurrent writer its own.
    /// What is billed is funded at `now` on `plans` (`core::funding`).
    async fn ingest(
        &self,
        requests: &[Vec<Heartbeat>],
        rules: &Rules,
        plans: &Plans,
        now: Secs,
        shard: i64,
    ) -> StoreResult<Vec<RequestOutcome>>;
    /// End the org's session; `None` if it has none of that id.
    async fn end_session(
        &self,
        org_id: &str,
        session_id: &str,
        status: EndStatus,
        now: Secs,
        rules: &Rules,
        plans: &Plans,
    ) -> StoreResult<Option<Session>>;
    /// Book what time alone decides for up to `limit` sessions: silent sessions and
    /// parked ones past expiry. Returns how many changed.
    async fn expire_sessions(
        &self,
        now: Secs,
        rules: &Rules,
        plans: &Plans,
        limit: i64,
    ) -> StoreResult<usize>;
    async fn get_session(&self, org_id: &str, session_id: &str) -> StoreResult<Option<Session>>;
    /// The orgs that have a session of this id, by id, `limit` at most: what the routes
    /// that name a session without its org look it up by (a read of every shard).
    async fn orgs_with_session(&self, session_id: &str, limit: i64) -> StoreResult<Vec<String>>;
    async fn sessions_of_org(&self, org_id: &str) -> StoreResult<Vec<Session>>;
    /// An org's running sessions.
    async fn running_sessions(&self, org_id: &str) -> StoreResult<Vec<Session>>;
    /// An org's sessions created in `[from, to)`, in `phase` if given, oldest first, after
    /// the `(created_at, session_id)` cursor, at most `limit`.
    #[allow(clippy::too_many_arguments)]
    async fn list_sessions(
        &self,
        org_id: &str,
        phase: Option<Phase>,
        from: Secs,
        to: Secs,
        after: Option<(Secs, String)>,
        limit: i64,
    ) -> StoreResult<Vec<Session>>;
    /// Seconds used in the month and week windows by each of `org_ids` (orgs that share
    /// those windows), booked time plus running sessions counted up to `now`. Orgs with
    /// nothing used are absent.
    async fn window_usage(
        &self,
        org_ids: &[&str],
        windows: &Windows,
        now: Secs,
        rules: &Rules,
    ) -> StoreResult<HashMap<String, WindowTotals>>;
    /// `(session_id, start, end)` of every booked running stretch of an org, for audits
    /// and tests: closed spans, and the booked part of each open one.
    async fn running_spans(&self, org_id: &str) -> StoreResult<Vec<(String, Secs, Secs)>>;
    /// A session's closed spans `(start, end, kind)`, in order.
    async fn session_spans(
        &self,
        org_id: &str,
        session_id: &str,
    ) -> StoreResult<Vec<(Secs, Secs, String)>>;
    /// An org's `(hour, seconds)` from its hourly rollup.
    async fn hourly_totals(&self, org_id: &str) -> StoreResult<Vec<(Secs, i64)>>;
    /// An org's `(session, seconds)` from the per-session hourly rollup.
    async fn session_hourly_totals(&self, org_id: &str) -> StoreResult<Vec<(String, i64)>>;
    /// An org's booked time in the whole hours `[from, to)`, summed by the database under
    /// `by`'s key.
    async fn session_hour_pieces(
        &self,
        org_id: &str,
        from: Secs,
        to: Secs,
        by: GroupBy,
    ) -> StoreResult<Vec<Piece>>;
}
