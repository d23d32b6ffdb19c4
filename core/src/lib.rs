//! The pure core of rush-meter: how heartbeats become billed seconds, the windows and
//! ceilings they count against, the gate's decisions, and everything the readers compute
//! from the ledger. Nothing here does I/O or reads a clock: the shells (the service's
//! store, HTTP and Stripe code) gather the facts, call these functions with the time, and
//! write what they return. So the property tests and the seeded simulation drive exactly
//! the code the service runs.
//!
//! - `time`: seconds, intervals, month and week windows, hours and RFC 3339 as shown.
//! - `ledger`, `booking`, `session`: accrual of one session, and what a transaction books.
//! - `plans`, `org`, `standing`: plan files, an org's access, its windows' figures.
//! - `gate`: admissions decided in a group, exactly as one at a time.
//! - `heartbeats`: a supervisor's batch checked, and a group of batches applied.
//! - `breakdown`, `timeline`, `prompt`, `thresholds`: what the console reads.
//! - `charges`, `export`, `periods`: money, finance's export lines, billing periods.
//! - `auto_topup`, `bill_preview`, `room`: packs bought at a crossing, the bill to come,
//!   and room that returns.
//! - `members`, `audit`: limits inside an org, and who changed what.
//! - `signature`, `retry`, `wire`, `ids`, `names`, `text`: small rules several shells share.

#[macro_use]
pub mod names;

pub mod audit;
pub mod auto_topup;
pub mod bill_preview;
pub mod booking;
pub mod breakdown;
pub mod charges;
pub mod export;
pub mod funding;
pub mod gate;
pub mod heartbeats;
pub mod ids;
pub mod ledger;
pub mod members;
pub mod org;
pub mod own_use;
pub mod periods;
pub mod plans;
pub mod prompt;
pub mod retry;
pub mod room;
pub mod session;
pub mod signature;
pub mod standing;
pub mod text;
pub mod thresholds;
pub mod time;
pub mod timeline;
pub mod versions;
pub mod wire;

/// The plans of `plans/`, built into the crate's tests.
#[cfg(test)]
pub(crate) fn shipped_plans() -> plans::Plans {
    plans::Plans::from_texts(
        std::path::Path::new("plans"),
        vec![
            (
                "free.toml".into(),
                include_str!("../../plans/free.toml").into(),
            ),
            (
                "pro.toml".into(),
                include_str!("../../plans/pro.toml").into(),
            ),
            (
                "team.toml".into(),
                include_str!("../../plans/team.toml").into(),
            ),
        ],
    )
    .expect("plans/ loads")
}
