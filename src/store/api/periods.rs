//! Closed periods and the finance export (`PeriodStore`; its SQL: store/sql/periods.rs).

use std::collections::HashMap;

use async_trait::async_trait;
use rush_meter_core::audit::Actor;
use rush_meter_core::charges::Terms;
use rush_meter_core::export::{PeriodFunding, SessionLine};
use rush_meter_core::org::Org;
use rush_meter_core::time::Secs;
use tokio::sync::mpsc;

use super::super::rows::{FrozenOrgRow, LineQuery, PeriodRow};
use super::super::StoreResult;

/// What an org is billed on when a period closes.
pub type TermsOf<'a> = &'a (dyn Fn(&Org) -> Terms + Sync);

/// Closed periods and the finance export.
#[async_trait]
pub trait PeriodStore: Send + Sync {
    /// Send a period's session lines down `tx` in `(org_id, session_id)` order; stops
    /// early (without error) if the receiver goes away.
    async fn send_session_lines(
        &self,
        q: &LineQuery,
        tx: &mpsc::Sender<Vec<SessionLine>>,
    ) -> StoreResult<()>;
    /// How many session lines a period has (for a progress bar).
    async fn count_session_lines(&self, q: &LineQuery) -> StoreResult<i64>;
    /// `(org_id, running seconds, adjustment seconds)` of an open period, by org.
    async fn live_org_sums(&self, q: &LineQuery) -> StoreResult<Vec<(String, i64, i64)>>;
    /// Who paid for each org's seconds of an open period (`q.period`), and of its
    /// adjustment against the closed period before it (`q.adjusts`), by org.
    async fn period_funding(
        &self,
        q: &LineQuery,
    ) -> StoreResult<HashMap<String, (PeriodFunding, PeriodFunding)>>;
    /// A closed period's org lines, by org id.
    async fn frozen_orgs(&self, period_start: Secs) -> StoreResult<Vec<FrozenOrgRow>>;
    async fn get_period(&self, period_start: Secs) -> StoreResult<Option<PeriodRow>>;
    /// Closed periods, newest first.
    async fn list_periods(&self) -> StoreResult<Vec<PeriodRow>>;
    /// Close `q.period` in one transaction: freeze every session's line and every org's
    /// totals with `terms`. `None` when it was closed already (by another instance, say).
    async fn close_period(
        &self,
        q: &LineQuery,
        now: Secs,
        terms: TermsOf<'_>,
        actor: &Actor,
    ) -> StoreResult<Option<PeriodRow>>;
}
