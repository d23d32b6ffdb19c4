//! API tokens made, listed and revoked: the one place the command line and the API do it,
//! so both check alike (docs/api.md, "Tokens").

use rush_meter_core::audit::Actor;
use rush_meter_core::ids::Id;
use rush_meter_core::text::Text;
use rush_meter_core::time::Secs;

use crate::store::{Db, StoreError, TokenRow};
use crate::tokens::{check_binding, new_token, Scope, MAX_LIFETIME};

/// A token to make.
#[derive(Clone, Debug)]
pub struct Ask {
    pub scopes: Vec<Scope>,
    pub org_id: Option<String>,
    /// The user a member token reads the use of.
    pub user_id: Option<String>,
    pub label: String,
    /// Seconds it lasts from its making; `None`: until revoked.
    pub expires_in: Option<Secs>,
}

/// Why a token was not made; `field` names the API's field (the command line's flag is
/// named alike).
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("no org `{0}`; create it first (PUT /v1/orgs/{0})")]
    OrgNotFound(String),
    #[error("no token `{0}`")]
    NotFound(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The longest label a token takes.
pub const LABEL_MAX: usize = 200;

fn invalid(field: &'static str, message: impl Into<String>) -> TokenError {
    TokenError::Invalid {
        field,
        message: message.into(),
    }
}

/// Check `ask` and make its token, audited as `actor`'s: its row and its secret, which is
/// shown once and kept nowhere.
pub async fn create(
    db: &Db,
    ask: &Ask,
    now: Secs,
    actor: &Actor,
) -> Result<(TokenRow, String), TokenError> {
    if ask.scopes.is_empty() {
        return Err(invalid("scopes", "at least one scope is needed"));
    }
    if let Some(org) = &ask.org_id {
        Id::parse(org).map_err(|m| invalid("org_id", format!("org_id {m}")))?;
    }
    if let Some(user) = &ask.user_id {
        // An admission's `started_by`, which names the user, is an id.
        Id::parse(user).map_err(|m| invalid("user_id", format!("user_id {m}")))?;
    }
    check_binding(&ask.scopes, ask.org_id.as_deref(), ask.user_id.as_deref())
        .map_err(|(field, m)| invalid(field, m))?;
    Text::Line
        .check(&ask.label, LABEL_MAX)
        .map_err(|m| invalid("label", format!("label {m}")))?;
    if let Some(secs) = ask.expires_in {
        if !(1..=MAX_LIFETIME).contains(&secs) {
            return Err(invalid(
                "expires_in_seconds",
                format!("a token lasts 1 to {MAX_LIFETIME} seconds (ten years); got {secs}"),
            ));
        }
    }
    if let Some(org) = &ask.org_id {
        if db.get_org(org).await?.is_none() {
            return Err(TokenError::OrgNotFound(org.clone()));
        }
    }
    let (mut row, secret) = new_token(&ask.scopes, ask.org_id.as_deref(), &ask.label, now);
    row.expires_at = ask.expires_in.map(|s| now + s);
    row.user_id.clone_from(&ask.user_id);
    db.insert_token(&row, actor).await?;
    Ok((row, secret))
}

/// Every token (or `org_id`'s), oldest first.
pub async fn list(db: &Db, org_id: Option<&str>) -> Result<Vec<TokenRow>, StoreError> {
    db.list_tokens(org_id).await
}

/// Revoke a token (`within` an org, when the caller is bound to one), audited as
/// `actor`'s; revoking it again changes nothing. The token as revoked.
pub async fn revoke(
    db: &Db,
    token_id: &str,
    within: Option<&str>,
    now: Secs,
    actor: &Actor,
) -> Result<TokenRow, TokenError> {
    db.revoke_token(token_id, within, now, actor)
        .await?
        .ok_or_else(|| TokenError::NotFound(token_id.to_string()))
}
