//! API tokens: list, make and revoke them (admin). A token bound to an org manages that
//! org's tokens only; the secret is shown once, when the token is made.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use rush_meter_core::time::{rfc3339, Secs};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::app::tokens::{self, Ask};
use crate::http::auth::Principal;
use crate::http::error::parse_id;
use crate::http::extract::{JsonBody, Query};
use crate::http::openapi::{BadBody, BadId, BadQuery, Guarded};
use crate::http::{ApiError, ApiResult, AppState};
use crate::store::TokenRow;
use crate::tokens::{Scope, TokenState};

/// A token as listed: never its secret.
#[derive(Serialize, ToSchema)]
pub struct TokenView {
    token_id: String,
    label: String,
    /// `ingest`, `admission`, `console`, `finance`, `admin`, `member`.
    scopes: Vec<String>,
    /// The one org the token acts on; `null`: every org its scopes reach.
    org_id: Option<String>,
    /// The user whose own use a member token reads; `null` on other tokens.
    user_id: Option<String>,
    state: TokenState,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    created_at: Secs,
    /// When it was last used, written every 30 s or so: up to a minute behind.
    #[serde(with = "rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    last_used_at: Option<Secs>,
    /// Refused from this time on; `null`: until revoked.
    #[serde(with = "rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    expires_at: Option<Secs>,
    #[serde(with = "rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    revoked_at: Option<Secs>,
}

impl TokenView {
    pub fn of(row: TokenRow, now: Secs) -> TokenView {
        TokenView {
            state: row.state_at(now),
            scopes: row.scopes.split(',').map(str::to_owned).collect(),
            token_id: row.token_id,
            label: row.label,
            org_id: row.org_id,
            user_id: row.user_id,
            created_at: row.created_at,
            last_used_at: row.last_used_at,
            expires_at: row.expires_at,
            revoked_at: row.revoked_at,
        }
    }
}

#[derive(Serialize, ToSchema)]
pub struct TokenList {
    tokens: Vec<TokenView>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TokensQuery {
    /// Only the tokens bound to this org; default every token (a token bound to an org
    /// lists that org's).
    #[param(pattern = r"^[A-Za-z0-9_.-]{1,64}$")]
    org_id: Option<String>,
}

/// `GET /v1/tokens?org_id=`: tokens, oldest first, revoked and expired ones too (admin).
#[utoipa::path(get, path = "/v1/tokens", tag = "tokens", security(("bearer" = ["admin"])),
    params(TokensQuery),
    responses((status = 200, description = "The tokens, oldest first; never a secret", body = TokenList),
        Guarded, BadQuery))]
pub async fn list_tokens(
    State(state): State<AppState>,
    principal: Principal,
    query: Query<TokensQuery>,
) -> ApiResult<Json<TokenList>> {
    principal.require_any(&[Scope::Admin])?;
    let q = query.read()?;
    if let Some(org) = q.org_id.as_deref() {
        parse_id("org_id", org)?;
        principal.check_org(org)?;
    }
    let org = q.org_id.as_deref().or(principal.bound_org());
    let now = state.clock.now();
    let tokens = tokens::list(&state.db, org)
        .await?
        .into_iter()
        .map(|t| TokenView::of(t, now))
        .collect();
    Ok(Json(TokenList { tokens }))
}

#[derive(Deserialize, ToSchema)]
pub struct NewToken {
    /// At least one of `ingest`, `admission`, `console`, `finance`, `admin`; or `member`
    /// alone.
    #[schema(min_items = 1)]
    scopes: Vec<String>,
    /// The one org it acts on, whatever its scopes; required for `console` and `member`.
    /// A token bound to an org makes tokens bound to that org only.
    #[schema(pattern = r"^[A-Za-z0-9_.-]{1,64}$")]
    org_id: Option<String>,
    /// The user a `member` token reads the own use of (an admission's `started_by`);
    /// required for `member`, refused on any other token.
    #[schema(pattern = r"^[A-Za-z0-9_.-]{1,64}$")]
    user_id: Option<String>,
    /// What it is for, shown in the audit log; at most 200 characters, no control
    /// characters.
    #[schema(max_length = 200)]
    label: Option<String>,
    /// Seconds it lasts; default until revoked.
    #[schema(minimum = 1, maximum = 316224000)]
    expires_in_seconds: Option<i64>,
}

/// A token just made: the one time its secret is shown.
#[derive(Serialize, ToSchema)]
pub struct CreatedToken {
    #[serde(flatten)]
    token: TokenView,
    /// `Authorization: Bearer <secret>`. Shown once; only its hash is kept.
    secret: String,
}

/// `POST /v1/tokens`: make a token (admin); audited.
#[utoipa::path(post, path = "/v1/tokens", tag = "tokens", security(("bearer" = ["admin"])),
    request_body = NewToken,
    responses((status = 201, description = "The token, with its secret shown once", body = CreatedToken),
        (status = 404, description = "`org_not_found`: no such org", body = crate::http::error::ErrorBody),
        Guarded, BadBody))]
pub async fn create_token(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody<NewToken>,
) -> ApiResult<(StatusCode, Json<CreatedToken>)> {
    principal.require_any(&[Scope::Admin])?;
    let mut scopes = Vec::new();
    for (i, s) in body.scopes.iter().enumerate() {
        let scope = Scope::parse(s).ok_or_else(|| {
            ApiError::invalid(
                format!("scopes[{i}]"),
                format!(
                    "unknown scope `{s}`: use ingest, admission, console, finance, admin or \
                     member"
                ),
            )
        })?;
        if !scopes.contains(&scope) {
            scopes.push(scope);
        }
    }
    scopes.sort();
    match (principal.bound_org(), body.org_id.as_deref()) {
        (Some(_), None) => {
            return Err(ApiError::invalid(
                "org_id",
                "a token bound to an org makes tokens bound to that org: give its org_id",
            ))
        }
        (_, Some(org)) => principal.check_org(org)?,
        (None, None) => {}
    }
    let now = state.clock.now();
    // A token that expires makes none that outlives it: expiry would be no control else.
    if let Some(until) = principal.expires_at {
        let left = until - now;
        if body.expires_in_seconds.is_none_or(|s| s > left) {
            return Err(ApiError::invalid(
                "expires_in_seconds",
                format!(
                    "this token expires in {left} s, and makes tokens that expire by then: \
                     give expires_in_seconds of at most {left}"
                ),
            ));
        }
    }
    let ask = Ask {
        scopes,
        org_id: body.org_id,
        user_id: body.user_id,
        label: body.label.unwrap_or_default(),
        expires_in: body.expires_in_seconds,
    };
    let (row, secret) = tokens::create(&state.db, &ask, now, &principal.actor()).await?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedToken {
            token: TokenView::of(row, now),
            secret,
        }),
    ))
}

#[derive(Deserialize)]
pub struct TokenPath {
    token_id: String,
}

impl IntoParams for TokenPath {
    fn into_params(
        _: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        vec![crate::http::extract::id_param(
            "token_id",
            "The token's id, `tok_…`",
        )]
    }
}

/// `POST /v1/tokens/{token_id}/revoke`: refused at once on this instance, within 5 s on
/// every other (admin); audited. Revoking it again changes nothing.
#[utoipa::path(post, path = "/v1/tokens/{token_id}/revoke", tag = "tokens",
    params(TokenPath), security(("bearer" = ["admin"])),
    responses((status = 200, description = "The token, revoked", body = TokenView), Guarded, BadId))]
pub async fn revoke_token(
    State(state): State<AppState>,
    principal: Principal,
    Path(TokenPath { token_id }): Path<TokenPath>,
) -> ApiResult<Json<TokenView>> {
    principal.require_any(&[Scope::Admin])?;
    let token_id = parse_id("token_id", &token_id)?;
    let now = state.clock.now();
    let row = tokens::revoke(
        &state.db,
        token_id.as_str(),
        principal.bound_org(),
        now,
        &principal.actor(),
    )
    .await?;
    let shared = state.shared();
    shared
        .revoked_here
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(row.secret_hash.clone());
    Ok(Json(TokenView::of(row, now)))
}
