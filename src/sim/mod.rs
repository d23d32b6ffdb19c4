//! Fleets of sessions, simulated: a seeded model of what microVMs do and what reaches the
//! meter (`model`), the ledger the core computes for it (`reference`), and the live
//! driver of `rush-meter simulate` (`live`), which runs a fleet against a real server in
//! real time and reconciles its bill against the reference.

pub mod live;
pub mod model;
pub mod reference;

pub use model::{generate, org_name, Beat, Delivery, Fleet, Params, Truth};
pub use reference::{bound, observation, uncovered, Bound, RefSession, Reference};
