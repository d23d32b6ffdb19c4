//! `rush-meter plans list` and `rush-meter plans migrate`.

use rush_meter_core::audit::Actor;
use rush_meter_core::time::hours;
use rush_meter_core::versions::{MovePreview, When};

use super::CliResult;
use crate::app::{self, plan_versions};
use crate::config::{load_plans, Config};

/// Every version of every plan the files define, with the orgs on each (CSV).
pub async fn list(config: &Config) -> CliResult {
    let plans = load_plans(&config.plans_dir)?;
    let db = app::open_db(config).await?;
    let counts = db.orgs_by_version(chrono::Utc::now().timestamp()).await;
    db.close().await;
    let counts = counts?;
    let mut out = csv::Writer::from_writer(std::io::stdout().lock());
    let fail = |e: csv::Error| format!("writing the list: {e}");
    out.write_record(["plan", "version", "newest", "file", "orgs"])
        .map_err(fail)?;
    for p in plans.all_versions() {
        let orgs = counts
            .iter()
            .find(|(id, v, _)| *id == p.id && *v == p.version)
            .map_or(0, |c| c.2);
        let newest = plans.get(&p.id).is_some_and(|n| n.version == p.version);
        let file = plans
            .file_of(&p.id, p.version)
            .map(|f| f.display().to_string())
            .unwrap_or_default();
        out.write_record([
            p.id.clone(),
            p.version.to_string(),
            newest.to_string(),
            file,
            orgs.to_string(),
        ])
        .map_err(fail)?;
    }
    out.flush().map_err(|e| format!("writing the list: {e}"))?;
    Ok(())
}

/// What `plans migrate` was asked.
pub struct MigrateArgs<'a> {
    pub plan: &'a str,
    pub from: i64,
    pub to: i64,
    pub org: Option<&'a str>,
    pub at: &'a str,
    pub dry_run: bool,
    pub json: bool,
}

pub async fn migrate(config: &Config, a: MigrateArgs<'_>) -> CliResult {
    let when = When::parse(a.at).map_err(|m| format!("--at: {m}"))?;
    let plans = load_plans(&config.plans_dir)?;
    let db = app::open_db(config).await?;
    // The versions are checked as a start-up does, so that a move never lands on a
    // version whose file was edited since it was recorded.
    let sealed = plan_versions::seal(&db, &plans, chrono::Utc::now().timestamp()).await;
    let m = plan_versions::Migration {
        plan: a.plan.to_owned(),
        from: a.from,
        to: a.to,
        org: a.org.map(str::to_owned),
        when,
        dry_run: a.dry_run,
    };
    let target = plan_versions::Target {
        db: &db,
        plans: &plans,
        rules: &config.rules,
    };
    let actor = Actor::system("rush-meter plans migrate");
    let moved = match sealed {
        Ok(()) => plan_versions::migrate(target, &m, chrono::Utc::now().timestamp(), &actor)
            .await
            .map_err(|e| match e {
                // `org_id` is the API's name of the flag.
                app::Refusal::Invalid { field, message } => {
                    format!("--{}: {message}", field.trim_end_matches("_id"))
                }
                e => e.to_string(),
            }),
        Err(e) => Err(e.to_string()),
    };
    db.close().await;
    let moved = moved?;
    for p in &moved {
        if a.json {
            println!(
                "{}",
                serde_json::to_string(p).expect("a preview serialises")
            );
        } else {
            println!("{}", line(p));
        }
    }
    let verb = if a.dry_run { "would move" } else { "moved" };
    eprintln!("{verb} {} org(s) of `{}`", moved.len(), a.plan);
    Ok(())
}

/// One org's move, for a person.
fn line(p: &MovePreview) -> String {
    format!(
        "{}: `{}` version {} -> {} at {}; month room {} h -> {} h, week room {} h -> {} h",
        p.org_id,
        p.plan,
        p.from_version,
        p.to_version,
        p.at,
        hours(p.month_remaining_seconds_before),
        hours(p.month_remaining_seconds_after),
        hours(p.week_remaining_seconds_before),
        hours(p.week_remaining_seconds_after),
    )
}
