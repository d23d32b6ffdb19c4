//! What the store does, one trait an area. Each dialect implements every trait from the
//! same SQL (store/sql/), so a `Db` is one `dyn Store` whichever database it opened, and no
//! method is written out again to pick a backend.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use rush_meter_core::audit::{Actor, Entry};
use rush_meter_core::breakdown::{GroupBy, Piece};
use rush_meter_core::charges::Terms;
use rush_meter_core::export::{PeriodFunding, SessionLine};
use rush_meter_core::funding::{self, Grant, Overage, Source, WindowFunds};
use rush_meter_core::gate::{AdmissionRequest, AdmitReject, Decision};
use rush_meter_core::heartbeats::{Heartbeat, RequestOutcome};
use rush_meter_core::ledger::{EndStatus, Phase, Rules};
use rush_meter_core::members::{Limit, LimitKind, MemberUsage};
use rush_meter_core::org::{Key, Org};
use rush_meter_core::plans::Plans;
use rush_meter_core::session::Session;
use rush_meter_core::standing::WindowTotals;
use rush_meter_core::time::{Interval, Secs, Windows};
use tokio::sync::mpsc;

use super::rows::{
    FrozenOrgRow, LineQuery, NotificationRow, OrgUpsert, OverageChargeRow, PeriodRow,
    SessionCounts, StripeEventRow, StripeRequestRow, SubscriptionState, TokenRow,
};
use super::StoreResult;

/// Every area of the store at once: what `Db` holds.
pub trait Store:
    Admin
    + OrgStore
    + LedgerStore
    + FundingStore
    + MemberStore
    + GateStore
    + StripeStore
    + PeriodStore
    + NotificationStore
    + AuditStore
{
}

impl<T> Store for T where
    T: Admin
        + OrgStore
        + LedgerStore
        + FundingStore
        + MemberStore
        + GateStore
        + StripeStore
        + PeriodStore
        + NotificationStore
        + AuditStore
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

/// Orgs, their API keys, and tokens.
#[async_trait]
pub trait OrgStore: Send + Sync {
    async fn upsert_org(&self, org: &OrgUpsert, now: Secs, actor: &Actor) -> StoreResult<Org>;
    async fn get_org(&self, org_id: &str) -> StoreResult<Option<Org>>;
    /// The orgs among `org_ids` that exist.
    async fn get_orgs(&self, org_ids: &[&str]) -> StoreResult<Vec<Org>>;
    /// Every org, in id order.
    async fn list_orgs(&self) -> StoreResult<Vec<Org>>;
    /// The ids of a page of orgs whose id or name contains `q` (any case), by id (byte
    /// order), after the id `after`: the console's list of orgs (whose rows the standings
    /// read with their funding).
    async fn search_orgs(
        &self,
        q: &str,
        after: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<String>>;
    /// Orgs that existed before `end`, by id (byte order).
    async fn orgs_before(&self, end: Secs) -> StoreResult<Vec<Org>>;
    /// When the first org was created, if any was.
    async fn first_org_created(&self) -> StoreResult<Option<Secs>>;
    async fn upsert_key(
        &self,
        org_id: &str,
        key_id: &str,
        limit: Option<i64>,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<Key>;
    async fn get_key(&self, org_id: &str, key_id: &str) -> StoreResult<Option<Key>>;
    /// Insert a token, or give an existing secret (the bootstrap token) the row's scopes.
    async fn insert_token(&self, token: &TokenRow, actor: &Actor) -> StoreResult<()>;
    async fn token_by_hash(&self, hash: &str) -> StoreResult<Option<TokenRow>>;
}

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
    /// End a session; `None` if it does not exist (or belongs to another org than
    /// `scope_org`).
    async fn end_session(
        &self,
        session_id: &str,
        scope_org: Option<&str>,
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
    async fn get_session(&self, session_id: &str) -> StoreResult<Option<Session>>;
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
    /// Running sessions heard from within the lease, and parked ones.
    async fn session_counts(
        &self,
        org_id: &str,
        now: Secs,
        rules: &Rules,
    ) -> StoreResult<SessionCounts>;
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

/// Grants, pay-as-you-go settings, and what is recorded of who paid for what.
#[async_trait]
pub trait FundingStore: Send + Sync {
    /// Each of `org_ids` that exists, with what is recorded of its funding at `now` (as
    /// committed: `core::standing::funding_state` adds what runs now).
    async fn funding_records(
        &self,
        org_ids: &[&str],
        now: Secs,
    ) -> StoreResult<Vec<(Org, funding::Recorded)>>;
    /// Create a grant, or answer the one made before with the same idempotency key
    /// (`false`: nothing was created). `None` if the org does not exist.
    async fn create_grant(
        &self,
        grant: &Grant,
        actor: &Actor,
    ) -> StoreResult<Option<(Grant, bool)>>;
    /// Every window an org funded in, oldest first.
    async fn funding_windows_of(&self, org_id: &str) -> StoreResult<Vec<WindowFunds>>;
    /// An org's grants, oldest first (voided, expired and used up ones too).
    async fn list_grants(&self, org_id: &str) -> StoreResult<Vec<Grant>>;
    /// Void a grant at `now`: its remainder lapses, what was used stays. Voiding it again
    /// changes nothing. `None` if the org has no such grant.
    async fn void_grant(
        &self,
        org_id: &str,
        grant_id: &str,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<Option<Grant>>;
    /// Seconds (and charge units) an org's sources other than the plan paid for in the whole
    /// hours `[from, to)`, by source.
    async fn funding_totals(
        &self,
        org_id: &str,
        from: Secs,
        to: Secs,
    ) -> StoreResult<BTreeMap<Source, (i64, i64)>>;
    /// Grants to notify about at `now`: used up since `since`, or 7 days or less from
    /// expiring with time left (not voided); at most 1,000.
    async fn grants_to_notify(&self, now: Secs, since: Secs) -> StoreResult<Vec<Grant>>;
    /// Month windows that ended by `before` with pay-as-you-go not yet charged, oldest
    /// first, at most `limit`.
    async fn due_overage_windows(
        &self,
        before: Secs,
        limit: i64,
    ) -> StoreResult<Vec<(String, Interval)>>;
    /// Close an ended window's funding and record its pay-as-you-go to charge (`pending`),
    /// under the org's lock: later time of the window is funded in the next one. Returns
    /// the record (the one made before, if any); `None` if the window funded nothing.
    async fn close_overage_window(
        &self,
        org_id: &str,
        window_start: Secs,
        currency: &str,
        now: Secs,
    ) -> StoreResult<Option<OverageChargeRow>>;
    /// Record how charging went: `charged` (with Stripe's ids) or `none`.
    async fn finish_overage_charge(
        &self,
        org_id: &str,
        window_start: Secs,
        state: &str,
        invoice_id: Option<&str>,
        item_id: Option<&str>,
        now: Secs,
    ) -> StoreResult<()>;
    /// Charges recorded and not yet sent, oldest first, at most `limit`.
    async fn pending_overage_charges(&self, limit: i64) -> StoreResult<Vec<OverageChargeRow>>;
    /// An org's charges, newest first.
    async fn overage_charges(&self, org_id: &str) -> StoreResult<Vec<OverageChargeRow>>;
    /// Set an org's pay-as-you-go; `None` if the org does not exist.
    async fn set_overage(
        &self,
        org_id: &str,
        overage: &Overage,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<Option<Org>>;
}

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
}

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

/// What an org's Stripe state is decided from, under its row lock: `None` leaves it.
pub type DecideState<'a> = &'a (dyn Fn(&Org) -> Option<SubscriptionState> + Sync);

/// Stripe's events, the org's subscription state, and outbound writes.
#[async_trait]
pub trait StripeStore: Send + Sync {
    /// Store a webhook event as received; false if its id was stored before.
    async fn insert_stripe_event(
        &self,
        event_id: &str,
        kind: &str,
        created: Secs,
        api_version: Option<&str>,
        payload: &str,
        now: Secs,
    ) -> StoreResult<bool>;
    /// Take up to `limit` pending events that are due, oldest first, and hold them for
    /// `hold` seconds; each take counts as an attempt.
    async fn claim_stripe_events(
        &self,
        now: Secs,
        hold: Secs,
        limit: i64,
    ) -> StoreResult<Vec<StripeEventRow>>;
    /// Record how processing went: processed, ignored, quarantined, or pending again with
    /// its next attempt at `next_attempt_at`.
    async fn finish_stripe_event(
        &self,
        event_id: &str,
        state: &str,
        org_id: Option<&str>,
        error: Option<&str>,
        next_attempt_at: Secs,
        now: Secs,
    ) -> StoreResult<()>;
    /// Events in `state` (all when `None`), newest first, after the cursor.
    async fn list_stripe_events(
        &self,
        state: Option<&str>,
        before: Option<(Secs, String)>,
        limit: i64,
    ) -> StoreResult<Vec<StripeEventRow>>;
    /// Put a quarantined event back in the queue, due now; false if it is not quarantined.
    async fn requeue_stripe_event(&self, event_id: &str, now: Secs) -> StoreResult<bool>;
    async fn org_by_stripe_customer(&self, customer_id: &str) -> StoreResult<Option<Org>>;
    /// Apply Stripe's state to an org: `decide` turns the org's row, read under its lock,
    /// into the state to write, which is written unless a later read of Stripe was
    /// applied already. Records what changed. `(before, after)` when written.
    async fn apply_subscription_state(
        &self,
        org_id: &str,
        decide: DecideState<'_>,
        source: &str,
        now: Secs,
    ) -> StoreResult<Option<(Org, Org)>>;
    /// An org's billing changes `(at, source, detail)`, newest first.
    async fn list_stripe_changes(
        &self,
        org_id: &str,
        limit: i64,
    ) -> StoreResult<Vec<(Secs, String, String)>>;
    /// Link an org to its Stripe customer; false if it has another one already, or the
    /// customer is another org's.
    async fn link_stripe_customer(
        &self,
        org_id: &str,
        customer_id: &str,
        now: Secs,
    ) -> StoreResult<bool>;
    /// Record an outbound write before it is sent; returns the unfinished request for its
    /// operation and target as stored (this one, or one recorded before, whose key the
    /// caller must then use).
    async fn begin_stripe_request(&self, r: &StripeRequestRow) -> StoreResult<StripeRequestRow>;
    /// The unfinished outbound write of `operation` on `target`, if any.
    async fn open_stripe_request(
        &self,
        org_id: &str,
        operation: &str,
        target: &str,
    ) -> StoreResult<Option<StripeRequestRow>>;
    async fn complete_stripe_request(
        &self,
        org_id: &str,
        idempotency_key: &str,
        object_id: &str,
        now: Secs,
    ) -> StoreResult<()>;
    /// Give an open request a new idempotency key (its next try, after a 5xx).
    async fn rekey_stripe_request(
        &self,
        org_id: &str,
        idempotency_key: &str,
        new_key: &str,
    ) -> StoreResult<()>;
    /// Record (`Some((plan, at))`) or clear a downgrade to make at `at`.
    async fn schedule_plan(
        &self,
        org_id: &str,
        plan: Option<(&str, Secs)>,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<()>;
    /// Orgs with a downgrade whose period has ended.
    async fn due_downgrades(&self, now: Secs, limit: i64) -> StoreResult<Vec<Org>>;
}

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
