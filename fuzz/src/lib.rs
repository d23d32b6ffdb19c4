//! The parsers the fuzz targets drive, from the service's pure core (`rush-meter-core`):
//! a heartbeat batch, a `Stripe-Signature` header, a plan file.

pub use rush_meter_core::heartbeats::batch;
pub use rush_meter_core::{ledger, plans, signature};
