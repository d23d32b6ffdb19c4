//! Plan versions: sealed at start-up (a version's terms never change once recorded), and
//! orgs moved between them by an operator (`rush-meter plans migrate`, or an admin's
//! `POST /v1/plans/{plan_id}/migrations`).

use std::collections::HashMap;

use rush_meter_core::audit::Actor;
use rush_meter_core::ledger::Rules;
use rush_meter_core::org::Org;
use rush_meter_core::plans::{changed_terms, terms_text, Plan, PlanError, Plans};
use rush_meter_core::time::Secs;
use rush_meter_core::versions::{preview, MovePreview, When};

use super::standing::standings;
use super::{Outcome, Refusal, Services, StartError};
use crate::store::{Db, RecordedVersion, VersionMove};

/// Record each plan version the first time the service starts with it, and refuse to
/// start when a recorded version's file now says something else, or is gone while orgs
/// are on it: what those orgs were promised would change under them.
pub async fn seal(db: &Db, plans: &Plans, now: Secs) -> Result<(), StartError> {
    let file = |id: &str, v: i64| {
        plans
            .file_of(id, v)
            .map(|f| f.display().to_string())
            .unwrap_or_default()
    };
    let seen: Vec<RecordedVersion> = plans
        .all_versions()
        .map(|p| RecordedVersion {
            plan_id: p.id.clone(),
            version: p.version,
            terms: terms_text(p),
            file: file(&p.id, p.version),
            recorded_at: now,
        })
        .collect();
    let recorded = db.record_plan_versions(&seen).await?;
    for r in &recorded {
        let Some(p) = plans.version(&r.plan_id, r.version) else {
            continue;
        };
        let changed = changed_terms(&r.terms, &terms_text(p));
        if !changed.is_empty() {
            return Err(StartError::Plans(PlanError {
                file: file(&r.plan_id, r.version).into(),
                message: format!(
                    "`{}` version {} changed since it was recorded on {} ({}); orgs on it \
                     keep the terms they were sold: put them back, and write the new terms \
                     as a new version (a file with the same id and `version = {}`)",
                    r.plan_id,
                    r.version,
                    rush_meter_core::time::format_rfc3339(r.recorded_at),
                    changed.join("; "),
                    newest(plans, &r.plan_id) + 1
                ),
            }));
        }
    }
    // Every org is on a version the files define, if they define its plan at all (a plan
    // id no file has is Free, said loudly, as before versions): recorded or not, for an
    // older release's orgs are on version 1 whether or not it ever was recorded.
    for (plan, version, orgs) in db.orgs_by_version(now).await? {
        if plans.get(&plan).is_none() || plans.version(&plan, version).is_some() {
            continue;
        }
        let file = recorded
            .iter()
            .find(|r| r.plan_id == plan && r.version == version)
            .map_or_else(|| format!("plans/ (`{plan}`)"), |r| r.file.clone());
        return Err(StartError::Plans(PlanError {
            file: file.into(),
            message: format!(
                "`{plan}` version {version} is not in the plan files, and {orgs} org(s) are \
                 on it or moving to it: put its file back (a file without `version` is \
                 version 1), or move them first with `rush-meter plans migrate`"
            ),
        }));
    }
    Ok(())
}

fn newest(plans: &Plans, id: &str) -> i64 {
    plans.get(id).map_or(0, |p| p.version)
}

/// A move of orgs between two versions of a plan, as an operator asks for it.
#[derive(Clone, Debug)]
pub struct Migration {
    pub plan: String,
    pub from: i64,
    pub to: i64,
    /// One org, or every org on `from`.
    pub org: Option<String>,
    pub when: When,
    /// List what would move, and move nothing.
    pub dry_run: bool,
}

/// Orgs whose use is read at once for a migration's preview.
const PREVIEW_CHUNK: usize = 500;

impl Services {
    /// `migrate` on the service's store, plans and clock.
    pub async fn migrate_versions(
        &self,
        m: &Migration,
        actor: &Actor,
    ) -> Outcome<Vec<MovePreview>> {
        let on = Target {
            db: &self.db,
            plans: &self.plans,
            rules: &self.rules,
        };
        migrate(on, m, self.clock.now(), actor).await
    }
}

/// What a migration runs against.
#[derive(Clone, Copy)]
pub struct Target<'a> {
    pub db: &'a Db,
    pub plans: &'a Plans,
    pub rules: &'a Rules,
}

/// Move orgs (or, with `dry_run`, say which would move and what it does to their room),
/// each move audited. A move to the version an org is on calls off one it has waiting.
/// The answer lists the orgs moved (or that would be), by id.
pub async fn migrate(
    on: Target<'_>,
    m: &Migration,
    now: Secs,
    actor: &Actor,
) -> Outcome<Vec<MovePreview>> {
    let (from, to) = (
        version(on.plans, m, m.from, "from")?,
        version(on.plans, m, m.to, "to")?,
    );
    let orgs = orgs_to_move(on.db, m, now).await?;
    let mut out = Vec::with_capacity(orgs.len());
    for chunk in orgs.chunks(PREVIEW_CHUNK) {
        let ids: Vec<&str> = chunk.iter().map(|o| o.org_id.as_str()).collect();
        let used: HashMap<String, (i64, i64)> = standings(on.db, on.plans, &ids, now, on.rules)
            .await?
            .into_iter()
            .map(|s| (s.org.org_id, (s.month.used_seconds, s.week.used_seconds)))
            .collect();
        for org in chunk {
            let at = m.when.time(now, org.billing_period());
            if !m.dry_run {
                let step = VersionMove {
                    plan_id: &m.plan,
                    from: m.from,
                    to: m.to,
                    at,
                };
                // An org moved or changed plan meanwhile is left as it is now.
                let moved = on.db.move_version(&org.org_id, step, now, actor).await?;
                if moved.is_none() {
                    continue;
                }
            }
            let used = used.get(&org.org_id).copied().unwrap_or_default();
            out.push(preview(&org.org_id, from, to, at, used));
        }
    }
    Ok(out)
}

/// Version `v` of the migration's plan, or a refusal naming the versions there are.
fn version<'p>(plans: &'p Plans, m: &Migration, v: i64, field: &'static str) -> Outcome<&'p Plan> {
    plans.version(&m.plan, v).ok_or_else(|| {
        let known: Vec<String> = plans
            .all_versions()
            .filter(|p| p.id == m.plan)
            .map(|p| p.version.to_string())
            .collect();
        if known.is_empty() {
            return Refusal::invalid("plan", format!("no plan `{}`", m.plan));
        }
        Refusal::invalid(
            field,
            format!(
                "`{}` has no version {v}; its versions are {}",
                m.plan,
                known.join(", ")
            ),
        )
    })
}

/// The orgs a migration names: the one given (which must be on its plan and version), or
/// every org on the version.
async fn orgs_to_move(db: &Db, m: &Migration, now: Secs) -> Outcome<Vec<Org>> {
    let Some(id) = &m.org else {
        return Ok(db.orgs_on_version(&m.plan, m.from, now).await?);
    };
    let org = db
        .get_org(id)
        .await?
        .ok_or_else(|| Refusal::OrgNotFound(id.clone()))?;
    let on = (org.plan_id.as_str(), org.plan_version_at(now));
    if on != (m.plan.as_str(), m.from) {
        return Err(Refusal::invalid(
            "org_id",
            format!(
                "org `{id}` is on `{}` version {}, not `{}` version {}",
                on.0, on.1, m.plan, m.from
            ),
        ));
    }
    Ok(vec![org])
}
