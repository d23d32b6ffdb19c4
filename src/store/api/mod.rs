//! What the store does, one trait an area. Each dialect implements every trait from the
//! same SQL (store/sql/), so a `Db` is one `dyn Store` whichever database it opened, and no
//! method is written out again to pick a backend.

mod audit;
mod auto_topups;
mod funding;
mod gate;
mod ledger;
mod members;
mod notifications;
mod orgs;
mod overage;
mod periods;
mod plans;
mod stripe;

pub use audit::AuditStore;
pub use auto_topups::{AutoTopupStore, DeclineRecord, NewPack};
pub use funding::FundingStore;
pub use gate::{GateStore, Written};
pub use ledger::LedgerStore;
pub use members::MemberStore;
pub use notifications::{NotificationStore, RoomWait};
pub use orgs::OrgStore;
pub use overage::OverageStore;
pub use periods::{PeriodStore, TermsOf};
pub use plans::{PlanStore, RecordedVersion, VersionMove};
pub use stripe::{DecideState, StripeStore};

use async_trait::async_trait;

use super::StoreResult;

/// Every area of the store at once: what `Db` holds.
pub trait Store:
    Admin
    + OrgStore
    + LedgerStore
    + FundingStore
    + OverageStore
    + MemberStore
    + GateStore
    + StripeStore
    + PeriodStore
    + PlanStore
    + NotificationStore
    + AuditStore
    + AutoTopupStore
{
}

impl<T> Store for T where
    T: Admin
        + OrgStore
        + LedgerStore
        + FundingStore
        + OverageStore
        + MemberStore
        + GateStore
        + StripeStore
        + PeriodStore
        + PlanStore
        + NotificationStore
        + AuditStore
        + AutoTopupStore
{
}

/// The database itself.
#[async_trait]
pub trait Admin: Send + Sync {
    /// `postgres` or `sqlite`.
    fn backend(&self) -> super::Backend;
    /// Bring the schema up to date. Safe to run from several instances at once on
    /// PostgreSQL (sqlx takes an advisory lock).
    async fn migrate(&self) -> Result<(), sqlx::migrate::MigrateError>;
    /// One round trip, for `/readyz`.
    async fn ping(&self) -> StoreResult<()>;
    /// Open a connection outside the pools and close it: whether the database can be
    /// reached at all, even while every pooled connection is busy.
    async fn connect_fresh(&self) -> StoreResult<()>;
    async fn close(&self);
    /// Gather the planner's statistics of the hot tables that have rows but none yet, or
    /// that grew past twice what they held when last analyzed (a new deployment, a
    /// restored dump: autovacuum's first look can be a minute away, and a lock planned on
    /// a table's old size scans it). True when there will never be any to gather.
    async fn gather_statistics(&self) -> StoreResult<bool>;
    /// Row counts and sums of every table, for tests that prove nothing was written.
    async fn digest(&self) -> StoreResult<Vec<(String, i64, i64)>>;
    /// The pools underneath, for benchmarks and tests that measure against raw SQL.
    fn pools(&self) -> super::Pools<'_>;
}
