//! The service's parsers, compiled from its own source files (not copies) with only the
//! pure modules they need: fuzzing them does not instrument the whole service.
#![allow(dead_code)]

#[path = "../../src/batch.rs"]
pub mod batch;
#[path = "../../src/ids.rs"]
pub mod ids;
#[path = "../../src/ledger.rs"]
pub mod ledger;
#[path = "../../src/plans.rs"]
pub mod plans;
#[path = "../../src/quota.rs"]
pub mod quota;
/// `billing::signature` in the service.
#[path = "../../src/billing/signature.rs"]
pub mod signature;
#[path = "../../src/wire.rs"]
pub mod wire;
