//! The harness of the tests and the benchmarks (benches/common includes this file): a real
//! server on port 0 over a fresh database, SQLite or PostgreSQL, and `every_backend!`, the
//! one way to run a test on both. Its parts, each named here at `common::` as before:
//! - `db`: the backends and a fresh database on each;
//! - `every_backend`: `every_backend!`, running a test on each backend;
//! - `server`: the service in process (`TestServer`), its options and HTTP helpers;
//! - `spawn`: the real `rush-meter` binary, spawned, and its logs;
//! - `sessions`: heartbeats as a supervisor sends them, and sessions run until parked;
//! - `plans`: the repository's plans and the small ones the tests of funding spend;
//!
//! and, each read by its own name (`common::localstripe::…`): `audit` (the statement
//! audit), `shards` (partitioned PostgreSQL), `localstripe` and `fake_stripe` (a Stripe to
//! call), `webhooks` (Stripe's webhooks delivered by hand), `node` and `venv` (the Node and Python tools tests drive).
#![allow(dead_code)]

use std::time::Duration;

use rush_meter_core::time::Secs;

mod db;
mod every_backend;
mod plans;
mod server;
mod sessions;
mod spawn;

pub mod audit;
pub mod citus;
pub mod fake_stripe;
pub mod localstripe;
pub mod node;
pub mod shards;
pub mod venv;
pub mod webhooks;

// The names the tests use, here as before the harness was split; each test binary uses
// some of them (as with `dead_code` above).
#[allow(unused_imports)]
pub use db::{fresh_database, fresh_database_with, pg_base_url, postgres_database, Backend};
#[allow(unused_imports)]
pub use every_backend::{run_on, OnBackend};
#[allow(unused_imports)]
pub use plans::{mini_plans, plans, pro_2, repo_plans, repo_plans_and_mini, repo_plans_copy};
#[allow(unused_imports)]
pub use server::{
    assert_statements_audited, config_of, metric_in, start_with_plans, two_instances, Options,
    TestServer,
};
#[allow(unused_imports)]
pub use sessions::{
    beat_until_told_to_park, hb, run_past_the_plan_to_the_cap, run_staggered_until_parked,
    run_together_until_parked, Parked,
};
#[allow(unused_imports)]
pub use spawn::{spawn_service, spawn_service_logging, spawn_service_with, Logs};

pub const ADMIN: &str = "test-admin-token-0123456789";

/// A usage breakdown's rows as `(key, seconds)`, in the answer's order (for groupings whose
/// every row is named).
pub fn breakdown_rows(b: &serde_json::Value) -> Vec<(String, i64)> {
    b["rows"]
        .as_array()
        .unwrap_or_else(|| panic!("a breakdown: {b}"))
        .iter()
        .map(|r| {
            (
                r["key"].as_str().unwrap().to_owned(),
                r["seconds"].as_i64().unwrap(),
            )
        })
        .collect()
}
/// Monday 2026-11-30 12:00:00 UTC.
pub const T0: Secs = 1_796_040_000;

/// Poll `check` until it holds, for at most `secs` seconds (events are processed in the
/// background); panics with `what` if it never does.
pub async fn eventually<F, Fut>(secs: u64, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while !check().await {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
