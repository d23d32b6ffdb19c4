//! An org's funding past its plan as admins, finance and the console change and read it:
//! grants, pay-as-you-go and its charges (the rules are `core::funding`'s).

use rush_meter_core::audit::Actor;
use rush_meter_core::funding::{check_overage, Grant, GrantAsk};
use rush_meter_core::standing::Standing;
use rust_decimal::Decimal;

use super::{Outcome, Refusal, Services};
use crate::ids::{mint, Kind};
use crate::store::OverageChargeRow;

/// A grant asked for: made, or the one its idempotency key made before.
pub struct Granted {
    pub grant: Grant,
    pub created: bool,
}

impl Services {
    /// Make the grant `ask` asks of `org_id`, or answer the one its idempotency key made
    /// before (`GrantKeyReused` when that one differs).
    pub async fn create_grant(
        &self,
        org_id: &str,
        ask: GrantAsk,
        actor: &Actor,
    ) -> Outcome<Granted> {
        let now = self.clock.now();
        let grant = ask.clone().check(org_id, &mint(Kind::Grant), now)?;
        let (made, created) = self
            .db
            .create_grant(&grant, actor)
            .await?
            .ok_or_else(|| Refusal::OrgNotFound(org_id.to_string()))?;
        if !created && !ask.matches(&made) {
            return Err(Refusal::GrantKeyReused(made.grant_id));
        }
        Ok(Granted {
            grant: made,
            created,
        })
    }

    /// The org's grants, oldest first, with their use counted up to now: what its standing
    /// attributes to them (running sessions included) replaces what was booked.
    pub async fn grants_now(&self, org_id: &str) -> Outcome<Vec<Grant>> {
        let now = self.clock.now();
        let (s, grants) = tokio::join!(self.standing(org_id, now), self.db.list_grants(org_id));
        let s = s?;
        Ok(grants?
            .into_iter()
            .map(|mut g| {
                if let Some(now) = s.funding.grants.iter().find(|x| x.grant_id == g.grant_id) {
                    g.used_seconds = now.used_seconds;
                }
                g
            })
            .collect())
    }

    /// Void a grant: its remainder lapses now; voiding it again changes nothing.
    pub async fn void_grant(&self, org_id: &str, grant_id: &str, actor: &Actor) -> Outcome<Grant> {
        self.db
            .void_grant(org_id, grant_id, self.clock.now(), actor)
            .await?
            .ok_or_else(|| Refusal::NotFound(format!("no grant `{grant_id}` in org `{org_id}`")))
    }

    /// Turn the org's pay-as-you-go on or off under `cap`, checked against its plan; its
    /// standing after.
    pub async fn set_overage(
        &self,
        org_id: &str,
        enabled: bool,
        cap: Option<Decimal>,
        actor: &Actor,
    ) -> Outcome<Standing> {
        let now = self.clock.now();
        let org = self.org(org_id).await?;
        let overage = check_overage(org.effective_plan(&self.plans, now), enabled, cap)?;
        self.db
            .set_overage(org_id, &overage, now, actor)
            .await?
            .ok_or_else(|| Refusal::OrgNotFound(org_id.to_string()))?;
        self.standing(org_id, self.clock.now()).await
    }

    /// The org's pay-as-you-go charges, newest window first.
    pub async fn overage_charges(&self, org_id: &str) -> Outcome<Vec<OverageChargeRow>> {
        self.org(org_id).await?;
        Ok(self.db.overage_charges(org_id).await?)
    }

    /// Put the org's failed charges back to be sent at once; how many were.
    pub async fn requeue_charges(&self, org_id: &str, actor: &Actor) -> Outcome<u64> {
        self.org(org_id).await?;
        Ok(self
            .db
            .requeue_overage_charges(org_id, self.clock.now(), actor)
            .await?)
    }
}
