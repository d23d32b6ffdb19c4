//! `rush-meter token create|list|revoke`: the same checks as the API's (`app::tokens`).
//! A revocation here reaches every running instance within `auth::TOKEN_FRESH_SECS`.

use rush_meter_core::audit::Actor;
use rush_meter_core::ids::Id;
use rush_meter_core::time::format_rfc3339;

use super::CliResult;
use crate::app::tokens::{self, Ask, TokenError};
use crate::app::{self as services};
use crate::config::Config;
use crate::tokens::parse_scopes;

/// `--expires-in` as seconds: `90d`, `12h`, `30m`, `1h 30m` (humantime's forms).
fn parse_lifetime(text: &str) -> Result<i64, String> {
    let d = humantime::parse_duration(text).map_err(|e| {
        format!("--expires-in: `{text}` is not a duration such as 90d or 12h ({e})")
    })?;
    i64::try_from(d.as_secs()).map_err(|_| format!("--expires-in: `{text}` is too long"))
}

pub async fn create(
    config: &Config,
    scope: &str,
    (org, user): (Option<&str>, Option<&str>),
    label: &str,
    expires_in: Option<&str>,
) -> CliResult {
    let ask = Ask {
        scopes: parse_scopes(scope).map_err(|e| format!("--scope: {e}"))?,
        org_id: org.map(str::to_owned),
        user_id: user.map(str::to_owned),
        label: label.to_owned(),
        expires_in: expires_in.map(parse_lifetime).transpose()?,
    };
    let db = services::open_db(config).await?;
    let now = chrono::Utc::now().timestamp();
    let made = tokens::create(&db, &ask, now, &Actor::system("rush-meter token create")).await;
    db.close().await;
    let (row, secret) = made.map_err(|e| match e {
        TokenError::Invalid { field, message } => format!("{}: {message}", flag(field)),
        TokenError::OrgNotFound(o) => {
            format!("--org: no org `{o}`; create it first (PUT /v1/orgs/{o})")
        }
        e @ (TokenError::Store(_) | TokenError::NotFound(_)) => e.to_string(),
    })?;
    eprintln!(
        "created token {} with scopes {}{}{}; the secret is shown once:",
        row.token_id,
        row.scopes,
        org.map(|o| format!(" for org {o}")).unwrap_or_default(),
        row.expires_at
            .map(|t| format!(", expiring at {}", format_rfc3339(t)))
            .unwrap_or_default()
    );
    println!("{secret}");
    Ok(())
}

/// The flag an API field comes from.
fn flag(field: &str) -> &'static str {
    match field {
        "org_id" => "--org",
        "user_id" => "--user",
        "label" => "--label",
        "expires_in_seconds" => "--expires-in",
        _ => "--scope",
    }
}

/// Every token (or `org`'s), oldest first, as CSV: never a secret.
pub async fn list(config: &Config, org: Option<&str>) -> CliResult {
    if let Some(o) = org {
        Id::parse(o).map_err(|e| format!("--org: {e}"))?;
    }
    let db = services::open_db(config).await?;
    let rows = tokens::list(&db, org).await;
    db.close().await;
    let now = chrono::Utc::now().timestamp();
    let time = |t: Option<i64>| t.map(format_rfc3339).unwrap_or_default();
    let mut out = csv::Writer::from_writer(std::io::stdout().lock());
    let fail = |e: csv::Error| format!("writing the list: {e}");
    out.write_record([
        "token_id",
        "label",
        "scopes",
        "org_id",
        "state",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
        "user_id",
    ])
    .map_err(fail)?;
    for t in rows? {
        out.write_record([
            t.token_id.as_str(),
            t.label.as_str(),
            t.scopes.as_str(),
            t.org_id.as_deref().unwrap_or(""),
            t.state_at(now).as_str(),
            format_rfc3339(t.created_at).as_str(),
            time(t.last_used_at).as_str(),
            time(t.expires_at).as_str(),
            time(t.revoked_at).as_str(),
            t.user_id.as_deref().unwrap_or(""),
        ])
        .map_err(fail)?;
    }
    out.flush().map_err(|e| format!("writing the list: {e}"))?;
    Ok(())
}

/// Revoke a token by its id (`tok_…`); revoking it again changes nothing.
pub async fn revoke(config: &Config, token_id: &str) -> CliResult {
    Id::parse(token_id).map_err(|e| format!("token id: {e}"))?;
    let db = services::open_db(config).await?;
    let now = chrono::Utc::now().timestamp();
    let revoked = tokens::revoke(
        &db,
        token_id,
        None,
        now,
        &Actor::system("rush-meter token revoke"),
    )
    .await;
    db.close().await;
    let row = revoked.map_err(|e| match e {
        tokens::TokenError::NotFound(_) => {
            format!("no token `{token_id}`; `rush-meter token list` shows them")
        }
        e => e.to_string(),
    })?;
    eprintln!(
        "token {} revoked at {}: every instance refuses it within {} s",
        row.token_id,
        format_rfc3339(row.revoked_at.unwrap_or(now)),
        crate::http::auth::TOKEN_FRESH_SECS
    );
    Ok(())
}
