//! rush-meter: the agent-hour ledger, quota gate and billing service behind Rush.
//!
//! A pure core (`ledger`, `quota`, `usage`, `plans`) under thin shells (`store`, `http`,
//! `ingest`, `server`). See DESIGN.md for the rules and docs/ for the contract.

pub mod admission;
pub mod batch;
pub mod billing;
pub mod breakdown;
pub mod clock;
pub mod config;
pub mod export;
pub mod failpoint;
pub mod gate;
pub mod http;
pub mod ids;
pub mod ingest;
pub mod ledger;
pub mod metrics;
pub mod notify;
pub mod plans;
pub mod prompt;
pub mod quota;
pub mod rate_limit;
pub mod server;
pub mod sim;
pub mod simulate;
pub mod standing;
pub mod store;
pub mod timeline;
pub mod tokens;
pub mod usage;
pub mod wire;
