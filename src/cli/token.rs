//! `rush-meter token create`.

use rush_meter_core::ids::Id;

use super::CliResult;
use crate::app;
use crate::config::Config;
use crate::tokens::{new_token, parse_scopes, Scope};

pub async fn create(config: &Config, scope: &str, org: Option<&str>, label: &str) -> CliResult {
    let scopes = parse_scopes(scope).map_err(|e| format!("--scope: {e}"))?;
    if let Some(o) = org {
        Id::parse(o).map_err(|e| format!("--org: {e}"))?;
    }
    if scopes.contains(&Scope::Console) && org.is_none() {
        return Err("--org: a console token reads one org; name it with --org ORG".into());
    }
    let db = app::open_db(config).await?;
    if let Some(o) = org {
        if db.get_org(o).await?.is_none() {
            return Err(format!("--org: no org `{o}`; create it first (PUT /v1/orgs/{o})").into());
        }
    }
    let now = chrono::Utc::now().timestamp();
    let (row, secret) = new_token(&scopes, org, label, now);
    let actor = rush_meter_core::audit::Actor::system("rush-meter token create");
    db.insert_token(&row, &actor).await?;
    db.close().await;
    eprintln!(
        "created token {} with scopes {}{}; the secret is shown once:",
        row.token_id,
        row.scopes,
        org.map(|o| format!(" for org {o}")).unwrap_or_default()
    );
    println!("{secret}");
    Ok(())
}
