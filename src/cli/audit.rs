//! `rush-meter audit`: an org's audit log (or the service's), oldest first.

use rush_meter_core::audit::Entry;
use rush_meter_core::ids::Id;
use rush_meter_core::time::{format_rfc3339, rfc3339};

use super::CliResult;
use crate::app;
use crate::config::Config;

/// Entries read a page at a time.
const PAGE: i64 = 1000;

pub async fn audit(
    config: &Config,
    org: Option<&str>,
    from: Option<&str>,
    to: Option<&str>,
    json: bool,
) -> CliResult {
    if let Some(o) = org {
        Id::parse(o).map_err(|e| format!("--org: {e}"))?;
    }
    let time = |flag: &str, v: Option<&str>, default: i64| -> Result<i64, String> {
        v.map_or(Ok(default), |v| {
            rfc3339::parse(v).map_err(|m| format!("--{flag}: {m}"))
        })
    };
    let from = time("from", from, 0)?;
    let to = time("to", to, i64::MAX)?;
    let db = app::open_db(config).await?;
    let org_id = org.unwrap_or("");
    if !org_id.is_empty() && db.get_org(org_id).await?.is_none() {
        db.close().await;
        return Err(format!("--org: no org `{org_id}`").into());
    }
    let mut after = None;
    loop {
        let page = db.list_audit(org_id, from, to, after.clone(), PAGE).await?;
        for e in &page {
            println!("{}", if json { as_json(e) } else { as_line(e) });
        }
        match page.last() {
            Some(last) if page.len() as i64 == PAGE => {
                after = Some((last.at, last.entry_id.clone()))
            }
            _ => break,
        }
    }
    db.close().await;
    Ok(())
}

/// `2026-12-02T10:00:00Z limit.set limit:project:web by token tok_1 (ops): {…} -> {…}`
fn as_line(e: &Entry) -> String {
    let who = match &e.actor.id {
        Some(id) => format!("{} {id} ({})", e.actor.kind.as_str(), e.actor.label),
        None => format!("{} ({})", e.actor.kind.as_str(), e.actor.label),
    };
    let state = |v: &Option<serde_json::Value>| v.as_ref().map_or("null".into(), |v| v.to_string());
    format!(
        "{} {} {} by {who}: {} -> {}",
        format_rfc3339(e.at),
        e.action.as_str(),
        e.subject,
        state(&e.before),
        state(&e.after)
    )
}

fn as_json(e: &Entry) -> String {
    serde_json::json!({
        "entry_id": e.entry_id,
        "org_id": e.org_id,
        "at": format_rfc3339(e.at),
        "actor": { "kind": e.actor.kind, "id": e.actor.id, "label": e.actor.label },
        "action": e.action,
        "subject": e.subject,
        "before": e.before,
        "after": e.after,
    })
    .to_string()
}
