//! The bill of an org's current billing period as it will be invoiced
//! (`GET /v1/orgs/{org_id}/invoice-preview`): the org's funding as every reader counts it,
//! its top-ups bought in the period and its pay-as-you-go recorded and not yet sent, made
//! into lines by `core::bill_preview`.

use rush_meter_core::bill_preview::{preview, Owed, Preview, Purchase, Reads};
use rush_meter_core::funding::GrantKind;
use rush_meter_core::time::{Interval, Secs};

use super::{Outcome, Services};

impl Services {
    /// `org_id`'s bill preview at `now`.
    pub async fn bill_preview(&self, org_id: &str, now: Secs) -> Outcome<Preview> {
        let (standing, grants, charges) = tokio::join!(
            self.standing(org_id, now),
            self.db.list_grants(org_id),
            self.db.overage_charges(org_id),
        );
        let s = standing?;
        let period = Interval {
            start: s.month.start,
            end: s.month.end,
        };
        let purchases: Vec<Purchase> = grants?
            .into_iter()
            .filter(|g| g.kind == GrantKind::Purchased && g.voided_at.is_none())
            .filter(|g| period.contains(g.created_at))
            .map(|g| Purchase {
                grant_id: g.grant_id,
                seconds: g.seconds,
                bought_at: g.created_at,
            })
            .collect();
        // Recorded and not sent yet (or given up on, until an admin puts it back): an
        // earlier window's, which the next invoice carries. One sent is Stripe's.
        let mut owed: Vec<Owed> = charges?
            .into_iter()
            .filter(|c| matches!(c.state.as_str(), "pending" | "failed"))
            .filter(|c| c.window_start < period.start)
            .map(|c| Owed {
                window: Interval {
                    start: c.window_start,
                    end: c.window_end,
                },
                overage_seconds: c.overage_seconds,
                charge_units: c.charge_units,
            })
            .collect();
        owed.sort_by_key(|o| o.window.start);
        // The plan line is what the subscription is billed at, whatever its status grants
        // now (past its grace, Free's terms fund the time; Stripe still invoices the plan).
        let (plan, _) = s.org.subscribed_plan(&self.plans, now);
        Ok(preview(&Reads {
            plan,
            period,
            funding: &s.funding,
            used: s.month.used_seconds,
            purchases: &purchases,
            owed: &owed,
            now,
        }))
    }
}
