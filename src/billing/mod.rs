//! Billing through Stripe: webhooks in, subscriptions mapped to plans, upgrades out,
//! reconciliation. Stripe being down never blocks a decision: the gate reads only local
//! state, which these keep in step.

pub mod api;
pub mod auto_topup;
pub mod checkout;
pub mod events;
pub mod funding;
pub mod invoice_report;
pub mod reconcile;
pub mod subscription;
pub mod sync;

use std::sync::Arc;

use rush_meter_core::org::Org;
use rush_meter_core::plans::Plans;
use secrecy::ExposeSecret;

use crate::clock::Clock;
use crate::config::StripeConfig;
use crate::store::{Db, StoreError};

use api::{StripeApi, StripeFailure};
use subscription::Subscription;

/// Why billing could not do what was asked, sorted by what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum BillingError {
    #[error("Stripe is off: set RUSH_METER_STRIPE_SECRET_KEY")]
    Off,
    /// Stripe failed or refused (`StripeFailure` says which).
    #[error(transparent)]
    Stripe(#[from] StripeFailure),
    /// The store failed: worth trying again.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Stripe's objects name no org here, or one linked to another customer: trying the
    /// same again will not help until someone fixes the link.
    #[error("{0}")]
    Unmatched(String),
    #[error("the org is on the {0} plan already")]
    SamePlan(String),
    #[error("plan {0} has no stripe_prices to subscribe with")]
    NoPrice(String),
    #[error("the subscription has no item to change")]
    NoItem,
    /// The org changed meanwhile (linked to another customer, say).
    #[error("{0}")]
    Conflict(String),
    /// A subscription of a shape the service does not know (`Subscription::recognized`):
    /// nothing applied, the org keeps its plan; retried, as the plans may be fixed.
    #[error("{0}; the org keeps its plan until the service knows it")]
    Unrecognized(String),
}

pub type BillingResult<T> = Result<T, BillingError>;

/// What processing a webhook event came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Applied to this org (or found it in step already).
    Applied(Option<String>),
    /// Nothing to do for this type or object.
    Ignored(String),
}

/// What applying a subscription did.
#[derive(Debug)]
pub struct Applied {
    pub org_id: Option<String>,
    /// What changed, when the org was out of step.
    pub change: Option<String>,
    /// The org as it now stands, when the state was applied.
    pub org: Option<Org>,
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
            .map(|key| StripeApi::new(&config.api_base, key.expose_secret()));
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
    pub fn api(&self) -> BillingResult<&StripeApi> {
        self.api.as_ref().ok_or(BillingError::Off)
    }

    /// The org a subscription belongs to: the one linked to its customer, else the one its
    /// metadata (or the event's) names, else the one its customer's metadata names.
    pub async fn org_for(&self, sub: &Subscription, hint: Option<&str>) -> BillingResult<Org> {
        let customer = sub.customer.id();
        if let Some(org) = self.db.org_by_stripe_customer(customer).await? {
            return Ok(org);
        }
        let mut named = sub.org_id().or(hint).map(str::to_owned);
        if named.is_none() {
            if let Some(api) = &self.api {
                named = api
                    .customer(customer)
                    .await?
                    .metadata
                    .get("org_id")
                    .cloned();
            }
        }
        let Some(org_id) = named else {
            return Err(BillingError::Unmatched(format!(
                "no org for Stripe customer {customer}: set metadata.org_id on the customer or subscription"
            )));
        };
        match self.db.get_org(&org_id).await? {
            Some(org) if org.stripe_customer_id.as_deref().is_some_and(|c| c != customer) => {
                Err(BillingError::Unmatched(format!(
                    "org {org_id} is linked to Stripe customer {}, but subscription {} belongs to {customer}",
                    org.stripe_customer_id.unwrap_or_default(),
                    sub.id
                )))
            }
            Some(org) => Ok(org),
            None => Err(BillingError::Unmatched(format!(
                "subscription {} names org {org_id}, which does not exist",
                sub.id
            ))),
        }
    }

    /// A ticket for a read of `org_id`'s subscription, taken just before the read: what it
    /// reads is applied only over reads with lower tickets (`sync::Read`).
    pub async fn ticket(&self, org_id: &str) -> BillingResult<sync::Read> {
        let ticket = self
            .db
            .stripe_ticket(org_id)
            .await?
            .ok_or_else(|| BillingError::Unmatched(format!("org {org_id} does not exist")))?;
        Ok(sync::Read {
            at: self.clock.now(),
            ticket: Some(ticket),
        })
    }

    /// Apply a subscription read from Stripe (`read`) to its org.
    pub async fn apply(
        &self,
        sub: &Subscription,
        hint: Option<&str>,
        read: sync::Read,
        source: &str,
    ) -> BillingResult<Applied> {
        sub.recognized(&self.plans)
            .map_err(BillingError::Unrecognized)?;
        let org = self.org_for(sub, hint).await?;
        let plans = &self.plans;
        // Decided again on the row as locked: another instance may have applied a newer
        // subscription since `org` was read.
        let decide = |locked: &Org| sync::state_for(locked, sub, plans, read);
        let done = self
            .db
            .apply_subscription_state(&org.org_id, &decide, source, self.clock.now())
            .await?;
        let (change, after) = match done {
            Some((before, after)) => {
                let c = rush_meter_core::org::describe_changes(&before, &after);
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

    /// Link an org to the Stripe customer that names it. A store failure is an error to
    /// retry; an org that does not exist or has another customer is `Unmatched`.
    pub async fn link_customer(&self, org_id: &str, customer: &str) -> BillingResult<()> {
        if self.db.get_org(org_id).await?.is_none() {
            return Err(BillingError::Unmatched(format!(
                "customer {customer} names org {org_id}, which does not exist"
            )));
        }
        if self
            .db
            .link_stripe_customer(org_id, customer, self.clock.now())
            .await?
        {
            Ok(())
        } else {
            Err(BillingError::Unmatched(format!(
                "org {org_id} is linked to another Stripe customer than {customer}, or {customer} to another org"
            )))
        }
    }
}
