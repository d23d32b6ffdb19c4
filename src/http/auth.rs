//! Bearer tokens: who is calling, what it may do, and which org it may see.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;

use super::error::ApiError;
use super::AppState;
use crate::store::TokenRow;
use crate::tokens::{hash_secret, Scope};

/// The caller, from its token.
#[derive(Clone, Debug)]
pub struct Principal {
    pub token_id: String,
    pub scopes: Vec<Scope>,
    /// The one org a console (or org-bound) token may see.
    pub org_id: Option<String>,
    /// What the token was made for (`rush-meter token create --label`): shown in the
    /// audit log beside its id.
    pub label: String,
}

impl Principal {
    fn from_row(row: &TokenRow) -> Principal {
        Principal {
            token_id: row.token_id.clone(),
            scopes: row.scopes.split(',').filter_map(Scope::parse).collect(),
            org_id: row.org_id.clone(),
            label: row.label.clone(),
        }
    }

    pub fn has(&self, scope: Scope) -> bool {
        self.scopes.contains(&Scope::Admin) || self.scopes.contains(&scope)
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

    /// May this token act on `org_id` at all? An org-bound token sees only its org; any
    /// other answers as if the org did not exist, so its existence is not revealed.
    pub fn check_org(&self, org_id: &str) -> Result<(), ApiError> {
        match &self.org_id {
            Some(bound) if bound != org_id && !self.scopes.contains(&Scope::Admin) => {
                Err(ApiError::org_not_found(org_id))
            }
            _ => Ok(()),
        }
    }

    /// Reading an org's usage: admin and finance read every org, console its own.
    pub fn check_org_read(&self, org_id: &str) -> Result<(), ApiError> {
        self.require_any(&[Scope::Console, Scope::Finance])?;
        if self.has(Scope::Finance) {
            return Ok(());
        }
        match &self.org_id {
            Some(bound) if bound == org_id => Ok(()),
            _ => Err(ApiError::org_not_found(org_id)),
        }
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
        let hash = hash_secret(secret);
        let db = state.db.clone();
        let mut failure = None;
        // Only found tokens are cached: one created a moment ago works at once.
        let row: Option<Arc<TokenRow>> = state
            .shared()
            .tokens
            .optionally_get_with(hash.clone(), async {
                match db.token_by_hash(&hash).await {
                    Ok(row) => row.map(Arc::new),
                    Err(e) => {
                        failure = Some(e);
                        None
                    }
                }
            })
            .await;
        if let Some(e) = failure {
            return Err(e.into());
        }
        let row = row.ok_or_else(ApiError::unauthorized)?;
        if let Some(limiter) = &state.shared().rate_limiter {
            limiter
                .check(&row.token_id)
                .await
                .map_err(ApiError::rate_limited)?;
        }
        Ok(Principal::from_row(&row))
    }
}
