//! Billing through Stripe: webhooks in, subscriptions mapped to plans, upgrades out,
//! reconciliation. Stripe being down never blocks a decision: the gate reads only local
//! state, which these keep in step.

pub mod api;
pub mod checkout;
pub mod events;
pub mod invoice_report;
pub mod reconcile;
pub mod signature;
pub mod subscription;
pub mod sync;

use std::sync::Arc;

use crate::clock::Clock;
use crate::config::StripeConfig;
use crate::ledger::Secs;
use crate::plans::Plans;
use crate::store::{Db, OrgRow};

use api::StripeApi;
use subscription::Subscription;

/// What applying a subscription did.
#[derive(Debug)]
pub struct Applied {
    pub org_id: Option<String>,
    /// What changed, when the org was out of step.
    pub change: Option<String>,
    /// The org as it now stands, when the state was applied.
    pub org: Option<OrgRow>,
}

/// What the Stripe side of the service shares.
#[derive(Clone)]
pub struct Billing {
    pub db: Db,
    pub plans: Arc<Plans>,
    pub clock: Clock,
    pub config: StripeConfig,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// `None` when no secret key is set: nothing is sent to Stripe.
    pub api: Option<StripeApi>,
}

impl Billing {
    pub fn new(
        db: Db,
        plans: Arc<Plans>,
        clock: Clock,
        config: StripeConfig,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Billing {
        let api = config
            .secret_key
            .as_ref()
            .map(|key| StripeApi::new(&config.api_base, key.expose()));
        Billing {
            db,
            plans,
            clock,
            config,
            metrics,
            api,
        }
    }

    /// The API, or the error that says how to turn it on.
    pub fn api(&self) -> Result<&StripeApi, String> {
        self.api
            .as_ref()
            .ok_or_else(|| "Stripe is off: set RUSH_METER_STRIPE_SECRET_KEY".to_owned())
    }

    /// The org a subscription belongs to: the one linked to its customer, else the one its
    /// metadata (or the event's) names, else the one its customer's metadata names.
    pub async fn org_for(&self, sub: &Subscription, hint: Option<&str>) -> Result<OrgRow, String> {
        let customer = sub.customer.id();
        if let Some(org) = self
            .db
            .org_by_stripe_customer(customer)
            .await
            .map_err(|e| e.to_string())?
        {
            return Ok(org);
        }
        let mut named = sub.org_id().or(hint).map(str::to_owned);
        if named.is_none() {
            if let Some(api) = &self.api {
                let c = api
                    .customer(customer)
                    .await
                    .map_err(|e| format!("reading customer {customer} from Stripe: {e}"))?;
                named = c.metadata.get("org_id").cloned();
            }
        }
        let Some(org_id) = named else {
            return Err(format!(
                "no org for Stripe customer {customer}: set metadata.org_id on the customer or subscription"
            ));
        };
        match self.db.get_org(&org_id).await.map_err(|e| e.to_string())? {
            Some(org) if org.stripe_customer_id.as_deref().is_some_and(|c| c != customer) => Err(format!(
                "org {org_id} is linked to Stripe customer {}, but subscription {} belongs to {customer}",
                org.stripe_customer_id.unwrap_or_default(),
                sub.id
            )),
            Some(org) => Ok(org),
            None => Err(format!("subscription {} names org {org_id}, which does not exist", sub.id)),
        }
    }

    /// Apply a subscription read from Stripe at `read_at` to its org.
    pub async fn apply(
        &self,
        sub: &Subscription,
        hint: Option<&str>,
        read_at: Secs,
        source: &str,
    ) -> Result<Applied, String> {
        let org = self.org_for(sub, hint).await?;
        let plans = &self.plans;
        // Decided again on the row as locked: another instance may have applied a newer
        // subscription since `org` was read.
        let done = self
            .db
            .apply_subscription_state(
                &org.org_id,
                |locked| sync::state_for(locked, sub, plans, read_at),
                source,
                self.clock.now(),
            )
            .await
            .map_err(|e| e.to_string())?;
        let (change, after) = match done {
            Some((before, after)) => {
                let c = sync::describe_changes(&before, &after);
                ((!c.is_empty()).then_some(c), Some(after))
            }
            None => (None, None),
        };
        Ok(Applied {
            org_id: Some(org.org_id),
            change,
            org: after,
        })
    }

    /// Link an org to the Stripe customer that names it.
    pub async fn link_customer(&self, org_id: &str, customer: &str) -> Result<(), String> {
        if self
            .db
            .get_org(org_id)
            .await
            .map_err(|e| e.to_string())?
            .is_none()
        {
            return Err(format!(
                "customer {customer} names org {org_id}, which does not exist"
            ));
        }
        let linked = self
            .db
            .link_stripe_customer(org_id, customer, self.clock.now())
            .await
            .map_err(|e| e.to_string())?;
        if linked {
            Ok(())
        } else {
            Err(format!(
                "org {org_id} is linked to another Stripe customer than {customer}"
            ))
        }
    }
}
