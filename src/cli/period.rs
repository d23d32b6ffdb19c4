//! `rush-meter period close` and `rush-meter period list`.

use rush_meter_core::export::{month_name, parse_month};
use rush_meter_core::time::{format_rfc3339, Interval};

use super::CliResult;
use crate::app::{self, periods::close_through};
use crate::config::{load_plans, Config};

fn month_of(start: i64, end: i64) -> String {
    Interval::new(start, end)
        .map(month_name)
        .unwrap_or_default()
}

pub async fn close(config: &Config, period: &str) -> CliResult {
    let month = parse_month(period).map_err(|m| format!("--{m}"))?;
    let plans = load_plans(&config.plans_dir)?;
    let db = app::open_db(config).await?;
    let closed = close_through(
        &db,
        &plans,
        month,
        chrono::Utc::now().timestamp(),
        &rush_meter_core::audit::Actor::system("rush-meter period close"),
    )
    .await;
    db.close().await;
    let closed = closed.map_err(|e| format!("--{e}"))?;
    if closed.is_empty() {
        println!("{} was already closed", month_name(month));
    }
    for p in closed {
        println!(
            "closed {}: {} orgs, {} sessions, {} agent-seconds, {} adjustment seconds",
            month_of(p.period_start, p.period_end),
            p.orgs,
            p.sessions,
            p.agent_seconds,
            p.adjustment_seconds
        );
    }
    Ok(())
}

/// The closed periods as CSV on standard output, newest first.
pub async fn list(config: &Config) -> CliResult {
    let db = app::open_db(config).await?;
    let periods = db.list_periods().await;
    db.close().await;
    let mut out = csv::Writer::from_writer(std::io::stdout().lock());
    let fail = |e: csv::Error| format!("writing the list: {e}");
    out.write_record([
        "period",
        "closed_at",
        "orgs",
        "sessions",
        "agent_seconds",
        "adjustment_seconds",
    ])
    .map_err(fail)?;
    for p in periods? {
        out.write_record([
            month_of(p.period_start, p.period_end),
            format_rfc3339(p.closed_at),
            p.orgs.to_string(),
            p.sessions.to_string(),
            p.agent_seconds.to_string(),
            p.adjustment_seconds.to_string(),
        ])
        .map_err(fail)?;
    }
    out.flush().map_err(|e| format!("writing the list: {e}"))?;
    Ok(())
}
