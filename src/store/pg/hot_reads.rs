//! The texts of reads that one PostgreSQL keeps on generic plans (`Pg::begin_hot`,
//! `Pg::keyed`), for tests/generic_plans.rs, which reads their plans on a long history: not
//! an interface of the store.

use super::Secs;

/// A window edge that is not there, for `window_sums`.
pub const NO_EDGE: (Secs, Secs) = super::sql::NO_EDGE;
/// An org's running sessions (`$1`).
pub const RUNNING_SESSIONS: &str = super::sql::RUNNING_SESSIONS;
/// The usage page's read of orgs `$1` with their funding at `$2` and parked sessions.
pub fn funding_counting_parked() -> String {
    super::sql::funding_select_with(true, false)
}

/// The heartbeat group's lock of its sessions: orgs `$1`, session ids `$2`.
pub const SESSION_LOCK: &str = super::sessions::SESSION_LOCK;

/// The gate's key lock on one PostgreSQL: `$1` the shard's orgs, `$2 $3` the keys' orgs and
/// ids.
pub fn key_lock() -> String {
    super::gate::lock_keys_by_key_sql(1, 2)
}

/// The slot counts' statement: `$1` the lease's start, `$2 $3` the keys' orgs and ids, `$4`
/// the shard's orgs, `$5` to `$8` the open phases (`open_phases`).
pub fn slot_counts() -> String {
    super::gate::slot_counts_sql()
}

/// The open phases the slot counts take as `$5` to `$8`, in order.
pub fn open_phases() -> [&'static str; 4] {
    super::gate::OPEN_PHASES.map(|p| p.as_str())
}

/// The window sums' statement for `orgs` org ids and these window edges (absent ones
/// `NO_EDGE`): 21 BIGINT parameters, then the org ids.
pub fn window_sums(orgs: usize, edges: &[[(Secs, Secs); 2]; 2]) -> String {
    super::window_sums_sql(orgs, edges)
}
