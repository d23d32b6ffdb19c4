//! Orgs, their API keys, and tokens (`OrgStore`; its SQL: store/sql/orgs.rs).

use async_trait::async_trait;
use rush_meter_core::audit::Actor;
use rush_meter_core::org::{Key, Org};
use rush_meter_core::time::Secs;

use super::super::rows::{OrgUpsert, TokenRow};
use super::super::StoreResult;

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
    /// order), after the id `after`, among `only` when it is given: the console's list of
    /// orgs (whose rows the standings read with their funding).
    async fn search_orgs(
        &self,
        q: &str,
        after: Option<&str>,
        limit: i64,
        only: Option<&str>,
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
    /// Every token, or `org_id`'s, oldest first.
    async fn list_tokens(&self, org_id: Option<&str>) -> StoreResult<Vec<TokenRow>>;
    /// Revoke a token (`within` an org, if given), audited; revoking it again changes
    /// nothing. `None`: no such token (in that org).
    async fn revoke_token(
        &self,
        token_id: &str,
        within: Option<&str>,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<Option<TokenRow>>;
    /// Record when tokens were last used (a batch of `tokens::LastUsed`); never moves a
    /// time back.
    async fn touch_tokens(&self, used: &[(String, Secs)]) -> StoreResult<()>;
}
