//! `rush-meter simulate`: a synthetic fleet against a running server (`sim::live`).

use std::io::IsTerminal;
use std::time::Duration;

use rush_meter_core::ids::Id;

use super::{CliResult, SimulateArgs};
use crate::clock::Clock;
use crate::config::Config;
use crate::sim::live::{self, Options};

pub async fn simulate(config: &Config, a: SimulateArgs) -> CliResult {
    if !(0.0..=1.0).contains(&a.crash) || !(0.0..=1.0).contains(&(a.crash + a.end)) {
        return Err("--crash and --end are chances: each 0 to 1, and together at most 1".into());
    }
    let run = a
        .run
        .unwrap_or_else(|| format!("sim{}", Clock::System.now()));
    Id::parse(&format!("{run}-org000")).map_err(|m| format!("--run: {m}"))?;
    let outcome = live::run(Options {
        url: a.url.trim_end_matches('/').to_owned(),
        token: a.token,
        orgs: a.orgs,
        sessions: a.sessions,
        hosts: a.hosts,
        duration: Duration::from_secs(a.duration_secs),
        rules: config.rules,
        flush: Duration::from_millis(a.flush_ms.max(1)),
        crash: a.crash,
        end: a.end,
        plans: a.plans,
        seed: a.seed,
        run,
        progress: std::io::stderr().is_terminal(),
    })
    .await?;
    println!("{}\n\n{}", outcome.table(), outcome.summary);
    match outcome.mismatched() {
        0 => Ok(()),
        n => Err(format!(
            "the meter's bill departs from the ledger's rules for {n} sessions (the `mismatched` \
             column); check that --heartbeat-interval-secs and --lease-secs match the server's"
        )
        .into()),
    }
}
