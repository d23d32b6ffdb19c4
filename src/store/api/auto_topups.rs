//! Auto top-up (`AutoTopupStore`; its SQL: store/sql/auto_topups.rs).

use async_trait::async_trait;
use rush_meter_core::audit::Actor;
use rush_meter_core::auto_topup::{AfterDecline, Settings};
use rush_meter_core::funding::Grant;
use rush_meter_core::org::Org;
use rush_meter_core::time::Secs;

use super::super::rows::AutoTopupRow;
use super::super::StoreResult;

/// A pack about to be opened: what it buys and costs, and the month it counts in.
#[derive(Clone, Debug)]
pub struct NewPack {
    pub hours: i64,
    /// Decimal text, in `currency`.
    pub amount: String,
    pub currency: String,
    pub month_start: Secs,
    /// How long the opener holds its first charge before any instance may send it.
    pub hold_until: Secs,
}

/// A declined charge, and what follows it.
#[derive(Clone, Debug)]
pub struct DeclineRecord {
    /// The charge declined: 1 for the first.
    pub attempt: i64,
    pub error: String,
    pub payment_intent_id: Option<String>,
    pub next: AfterDecline,
    /// The key of the next charge, when there is one.
    pub next_key: String,
    /// The notification `auto_topup.failed`: its id and body.
    pub notification: (String, String),
}

/// Auto top-up settings, and the packs they buy.
#[async_trait]
pub trait AutoTopupStore: Send + Sync {
    /// Set an org's auto top-up (audited when it changes); `None` if the org does not exist.
    async fn set_auto_topup(
        &self,
        org_id: &str,
        settings: &Settings,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<Option<Org>>;
    /// Open pack `seen + 1` of `org_id`, its charge's key recorded, if the org still has
    /// auto top-up on for packs of `pack.hours`, no pack in flight, `seen` packs opened,
    /// and fewer than its monthly maximum opened or paid in `pack.month_start`'s month.
    /// `None` when any of that no longer holds (another reader opened it, say).
    async fn open_auto_topup(
        &self,
        org_id: &str,
        seen: i64,
        pack: &NewPack,
        now: Secs,
    ) -> StoreResult<Option<AutoTopupRow>>;
    /// One pack of an org.
    async fn auto_topup(&self, org_id: &str, seq: i64) -> StoreResult<Option<AutoTopupRow>>;
    /// An org's packs, newest first, at most `limit`.
    async fn auto_topups_of(&self, org_id: &str, limit: i64) -> StoreResult<Vec<AutoTopupRow>>;
    /// Packs being charged whose next charge may be sent at `now`, oldest first.
    async fn due_auto_topups(&self, now: Secs, limit: i64) -> StoreResult<Vec<AutoTopupRow>>;
    /// Take a pack for its next charge until `until`, if it is still charging and due
    /// at `seen_next_at` (so one instance at a time sends it); the pack as taken.
    async fn take_auto_topup(
        &self,
        org_id: &str,
        seq: i64,
        seen_next_at: Secs,
        until: Secs,
        now: Secs,
    ) -> StoreResult<Option<AutoTopupRow>>;
    /// A charge with no outcome yet: its next try is under `key` (after a 5xx, a new one:
    /// Stripe may replay the 5xx for the old), and reads `payment_intent` back when given
    /// (a payment still processing).
    async fn rekey_auto_topup(
        &self,
        org_id: &str,
        seq: i64,
        key: &str,
        payment_intent: Option<&str>,
    ) -> StoreResult<()>;
    /// Paid by `payment_intent_id`: `grant` made (once: it is keyed by the payment), the
    /// pack `paid`, and the org free to open another. The grant, and whether it was made
    /// now; `None` if the org has no such pack.
    async fn pay_auto_topup(
        &self,
        org_id: &str,
        seq: i64,
        payment_intent_id: &str,
        grant: &Grant,
        actor: &Actor,
    ) -> StoreResult<Option<(Grant, bool)>>;
    /// End a pack waiting for a retry without charging it (`canceled`, `why` its last
    /// error): auto top-up was turned off, or the org has room again. Only while it still
    /// waits after `attempts` declines; whether it was ended now.
    async fn cancel_auto_topup(
        &self,
        org_id: &str,
        seq: i64,
        attempts: i64,
        why: &str,
        now: Secs,
    ) -> StoreResult<bool>;
    /// Record the decline of charge `d.attempt` of a pack once (a second record of it, the
    /// webhook's after the answer's, changes nothing) with its notification; when no
    /// retry follows, the pack ends and auto top-up turns off (audited, by `actor`).
    /// Whether it was recorded now.
    async fn decline_auto_topup(
        &self,
        org_id: &str,
        seq: i64,
        d: &DeclineRecord,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<bool>;
}
