//! Limits inside an org as its console and admins set, remove and read them (the rules
//! are `core::members`'s).

use rush_meter_core::audit::Actor;
use rush_meter_core::members::{Limit, LimitKind, MemberUsage};
use rush_meter_core::time::Windows;

use super::{Outcome, Refusal, Services};

/// An org's limits as read at one time: its windows then, its limits, and what their
/// members used in those windows.
pub struct LimitsInUse {
    pub windows: Windows,
    pub limits: Vec<Limit>,
    pub used: MemberUsage,
}

impl Services {
    /// The org's limits with their members' use up to now (one read), or `OrgNotFound`.
    pub async fn limits_in_use(&self, org_id: &str) -> Outcome<LimitsInUse> {
        let now = self.clock.now();
        let org = self.org(org_id).await?;
        let (limits, used) = self
            .db
            .limits_with_usage(&[&org], now, &self.rules)
            .await?
            .remove(org_id)
            .unwrap_or_default();
        Ok(LimitsInUse {
            windows: Windows::at(now, org.billing_period()),
            limits,
            used,
        })
    }

    /// Store `limit` (its org must exist: nothing is written otherwise); the limit as
    /// stored and the org's limits in use after.
    pub async fn put_limit(&self, limit: Limit, actor: &Actor) -> Outcome<(Limit, LimitsInUse)> {
        self.org(&limit.org_id).await?;
        let stored = self.db.put_limit(&limit, self.clock.now(), actor).await?;
        let in_use = self.limits_in_use(&limit.org_id).await?;
        Ok((stored, in_use))
    }

    /// Remove the limit on `member_id`, or `NotFound` if there is none.
    pub async fn delete_limit(
        &self,
        org_id: &str,
        kind: LimitKind,
        member_id: &str,
        actor: &Actor,
    ) -> Outcome<Limit> {
        self.db
            .delete_limit(org_id, kind, member_id, self.clock.now(), actor)
            .await?
            .ok_or_else(|| {
                Refusal::NotFound(format!(
                    "no {} limit on `{member_id}` in org `{org_id}`",
                    kind.as_str()
                ))
            })
    }
}
