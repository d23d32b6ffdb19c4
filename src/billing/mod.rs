//! Billing through Stripe: webhooks in, subscriptions mapped to plans, upgrades out,
//! reconciliation. Stripe being down never blocks a decision: the gate reads only local
//! state, which these keep in step.

pub mod signature;
pub mod subscription;
pub mod sync;
