//! Orgs and their API keys as admins make them and the console lists them.

use rush_meter_core::audit::Actor;
use rush_meter_core::org::{Key, Org};
use rush_meter_core::standing::Standing;
use rush_meter_core::text::Text;

use super::{Outcome, Refusal, Services};
use crate::store::OrgUpsert;

/// The longest name an org takes.
pub const NAME_MAX: usize = 200;

impl Services {
    /// Create or update an org: its name a line of 1 to 200 characters, its plan one the
    /// plan files define.
    pub async fn upsert_org(&self, mut org: OrgUpsert, actor: &Actor) -> Outcome<Org> {
        if let Some(name) = &org.name {
            if name.trim().is_empty() {
                return Err(Refusal::invalid("name", "name must be 1 to 200 characters"));
            }
            Text::Line
                .check(name, NAME_MAX)
                .map_err(|m| Refusal::invalid("name", format!("name {m}")))?;
        }
        if let Some(plan) = &org.plan_id {
            if self.plans.get(plan).is_none() {
                let known: Vec<&str> = self.plans.iter().map(|p| p.id.as_str()).collect();
                return Err(Refusal::invalid(
                    "plan",
                    format!("no plan `{plan}`; plans are: {}", known.join(", ")),
                ));
            }
        }
        // A plan set, or Free for a new org, starts at its newest version.
        let plan = org
            .plan_id
            .as_deref()
            .unwrap_or(rush_meter_core::plans::FREE);
        org.plan_version = self.plans.get(plan).map(|p| p.version);
        Ok(self.db.upsert_org(&org, self.clock.now(), actor).await?)
    }

    /// Register a key of an existing org, its concurrency limit within the org's plan
    /// (`None`: the plan's default); the key and its org.
    pub async fn put_key(
        &self,
        org_id: &str,
        key_id: &str,
        limit: Option<i64>,
        actor: &Actor,
    ) -> Outcome<(Key, Org)> {
        let org = self.org(org_id).await?;
        let (plan, _) = org.subscribed_plan(&self.plans, self.clock.now());
        if let Some(limit) = limit {
            if !(1..=plan.concurrency_max).contains(&limit) {
                return Err(Refusal::invalid(
                    "concurrency_limit",
                    format!(
                        "concurrency_limit must be 1 to {} on the {} plan (got {limit})",
                        plan.concurrency_max, plan.id
                    ),
                ));
            }
        }
        let key = self
            .db
            .upsert_key(org_id, key_id, limit, self.clock.now(), actor)
            .await?;
        Ok((key, org))
    }

    /// A key and its org, or the refusal for whichever is not there.
    pub async fn key(&self, org_id: &str, key_id: &str) -> Outcome<(Key, Org)> {
        let org = self.org(org_id).await?;
        let key = self
            .db
            .get_key(org_id, key_id)
            .await?
            .ok_or_else(|| Refusal::NotFound(format!("no key `{key_id}` in org `{org_id}`")))?;
        Ok((key, org))
    }

    /// A page of orgs whose id or name contains `text` (by id, after `after`, among `only`
    /// when given), each with its standing now; and whether the page was full.
    pub async fn search_orgs(
        &self,
        text: &str,
        after: Option<&str>,
        limit: i64,
        only: Option<&str>,
    ) -> Outcome<(Vec<Standing>, Option<String>)> {
        let found = self.db.search_orgs(text, after, limit, only).await?;
        let ids: Vec<&str> = found.iter().map(String::as_str).collect();
        let mut standings = self.standings(&ids, self.clock.now()).await?;
        let next = (found.len() as i64 == limit)
            .then(|| found.last().cloned())
            .flatten();
        let page = found.iter().filter_map(|id| standings.remove(id)).collect();
        Ok((page, next))
    }
}
