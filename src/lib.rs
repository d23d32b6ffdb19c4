//! rush-meter: the agent-hour ledger, quota gate and billing service behind Rush.
//!
//! A house of layers, each depending only on those below it (tests/architecture.rs checks):
//!
//! - `rush_meter_core` (its own crate, `core/`): the pure rules, no I/O and no clock.
//! - `clock`, `failpoint`, `config`, `metrics`: the meter's time, crash points for drills,
//!   settings, Prometheus metrics.
//! - `store`: PostgreSQL and SQLite, one SQL for both; `tokens` on it.
//! - `billing`: Stripe.
//! - `app`: the services on the core: group commit, the gate's and the ledger's writers,
//!   notifications, periods, background jobs.
//! - `http`, `cli`: the shells; `sim`: fleets simulated against the core and a live server.

pub mod app;
pub mod billing;
pub mod cli;
pub mod clock;
pub mod config;
pub mod failpoint;
pub mod http;
pub mod ids;
pub mod metrics;
pub mod sim;
pub mod store;
pub mod tokens;
