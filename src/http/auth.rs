//! Bearer tokens: who is calling, what it may do, and which org it may act on.
//!
//! A token bound to an org is confined to it whatever its scopes, admin and finance
//! included: the `org_id` of any route's path is checked here, when the caller is
//! identified, so no handler can forget it; handlers that take an org from a body or a
//! query check it with `check_org`, and routes over every org refuse a bound token
//! (`require_unbound`). `tests/access.rs` walks every route with bound tokens.

use std::sync::Arc;

use axum::extract::{FromRequestParts, RawPathParams};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;

use super::error::ApiError;
use super::AppState;
use crate::store::TokenRow;
use crate::tokens::{hash_secret, Refused, Scope};
use rush_meter_core::time::Secs;

/// The caller, from its token.
#[derive(Clone, Debug)]
pub struct Principal {
    pub token_id: String,
    pub scopes: Vec<Scope>,
    /// The one org the token acts on; `None`: every org its scopes reach.
    bound: Option<String>,
    /// The user a member token reads the use of (`Scope::Member`).
    user: Option<String>,
    /// What the token was made for (`rush-meter token create --label`): shown in the
    /// audit log beside its id.
    pub label: String,
    pub expires_at: Option<Secs>,
}

impl Principal {
    pub(crate) fn from_row(row: &TokenRow) -> Principal {
        let bound = row.org_id.clone();
        let user = row.user_id.clone();
        Principal {
            token_id: row.token_id.clone(),
            // A console token reads one org, a member token one user of one: unbound, the
            // scope grants nothing.
            scopes: row
                .scopes
                .split(',')
                .filter_map(Scope::parse)
                .filter(|s| *s != Scope::Console || bound.is_some())
                .filter(|s| *s != Scope::Member || (bound.is_some() && user.is_some()))
                .collect(),
            bound,
            user,
            label: row.label.clone(),
            expires_at: row.expires_at,
        }
    }

    pub fn has(&self, scope: Scope) -> bool {
        self.scopes.contains(&Scope::Admin) || self.scopes.contains(&scope)
    }

    /// The org this token is confined to, whatever its scopes.
    pub fn bound_org(&self) -> Option<&str> {
        self.bound.as_deref()
    }

    /// The org and user of a member token (`Scope::Member`, which an admin token does not
    /// stand in for: it names no user); 403 for any other token.
    pub fn member(&self) -> Result<(&str, &str), ApiError> {
        match (&self.bound, &self.user) {
            (Some(org), Some(user)) if self.scopes.contains(&Scope::Member) => Ok((org, user)),
            _ => Err(ApiError::forbidden("member")),
        }
    }

    /// The user a member token reads the use of.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// Who the audit log says made a change with this token.
    pub fn actor(&self) -> rush_meter_core::audit::Actor {
        rush_meter_core::audit::Actor::token(&self.token_id, &self.label)
    }

    /// 403 unless the token has one of `scopes` (admin has them all).
    pub fn require_any(&self, scopes: &[Scope]) -> Result<(), ApiError> {
        if scopes.iter().any(|s| self.has(*s)) {
            Ok(())
        } else {
            Err(ApiError::forbidden(
                &scopes
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join("` or `"),
            ))
        }
    }

    /// May this token act on `org_id`? A bound token acts on its own org only; any other
    /// answers as if the org did not exist, so that its existence is not revealed.
    pub fn check_org(&self, org_id: &str) -> Result<(), ApiError> {
        match &self.bound {
            Some(bound) if bound != org_id => Err(ApiError::org_not_found(org_id)),
            _ => Ok(()),
        }
    }

    /// Reading an org: console, finance and admin tokens, each within its binding.
    pub fn check_org_read(&self, org_id: &str) -> Result<(), ApiError> {
        self.require_any(&[Scope::Console, Scope::Finance])?;
        self.check_org(org_id)
    }

    /// Routes that act on every org at once (closing a month, Stripe's event queue, the
    /// service's own log): a token bound to one org may not call them.
    pub fn require_unbound(&self, what: &str) -> Result<(), ApiError> {
        match &self.bound {
            Some(_) => Err(ApiError::bound_token(what)),
            None => Ok(()),
        }
    }

    /// The `org_id` of the route's path, if it has one, checked against the binding.
    async fn check_path(&self, parts: &mut Parts) -> Result<(), ApiError> {
        if self.bound.is_none() {
            return Ok(());
        }
        // Extracting the raw params cannot fail on a routed request; a request without
        // them (a fallback) names no org.
        if let Ok(params) = RawPathParams::from_request_parts(parts, &()).await {
            if let Some((_, org)) = params.iter().find(|(name, _)| *name == "org_id") {
                self.check_org(org)?;
            }
        }
        Ok(())
    }
}

impl FromRequestParts<AppState> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let secret = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .ok_or_else(ApiError::unauthorized)?;
        let row = token(state, secret).await?;
        if let Err(why) = row.usable_at(state.clock.now()) {
            return Err(match why {
                Refused::Revoked => ApiError::token_revoked(),
                Refused::Expired => ApiError::token_expired(),
            });
        }
        if let Some(limiter) = &state.shared().rate_limiter {
            limiter
                .check(&row.token_id)
                .await
                .map_err(ApiError::rate_limited)?;
        }
        let principal = Principal::from_row(&row);
        principal.check_path(parts).await?;
        state.last_used.touch(&row.token_id, state.clock.now());
        Ok(principal)
    }
}

/// Seconds of the meter's clock an instance trusts a token it read: a token revoked on
/// another instance (or by `rush-meter token revoke`) is refused here within this bound.
pub const TOKEN_FRESH_SECS: Secs = 5;

/// The token of `secret`, from the cache or the database; 401 for none.
async fn token(state: &AppState, secret: &str) -> Result<Arc<TokenRow>, ApiError> {
    let hash = hash_secret(secret);
    if state
        .shared()
        .revoked_here
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&hash)
    {
        return Err(ApiError::token_revoked());
    }
    let db = state.db.clone();
    // Read once an epoch of the meter's clock, so that a test moves it as time does; only
    // found tokens are cached: one created a moment ago works at once. Requests waiting on
    // the same read share its outcome, a failed read's included: each must answer 503 for
    // an unreachable database, not 401 as if the token did not exist (a failover's first
    // second of a new epoch did that to every waiter but the reader).
    let epoch = state.clock.now().div_euclid(TOKEN_FRESH_SECS);
    let row = state
        .shared()
        .tokens
        .try_get_with((hash.clone(), epoch), async {
            match db.token_by_hash(&hash).await {
                Ok(Some(row)) => Ok(Arc::new(row)),
                Ok(None) => Err(Lookup::NoSuchToken),
                Err(e) => Err(Lookup::Failed(e)),
            }
        })
        .await;
    row.map_err(|e| match &*e {
        Lookup::NoSuchToken => ApiError::unauthorized(),
        Lookup::Failed(e) => e.into(),
    })
}

/// Why a token's read found none: no token has the secret, or the database failed.
enum Lookup {
    NoSuchToken,
    Failed(crate::store::StoreError),
}
