//! Heartbeats: a supervisor's batch as it arrives (`batch`), and the rules by which a
//! group of batches is applied in one transaction (`group`), or, on a distributed store, one
//! transaction a shard (`shards`).

pub mod batch;
pub mod group;
pub mod shards;

use crate::ids::Id;
use crate::ledger::{Observation, Phase};
use crate::time::Secs;

pub use batch::{parse, validate, Batch, BatchError, RawHeartbeat, MAX_BATCH};
pub use group::{apply, screen, unproven_orgs, RequestOutcome, Screened};

/// One validated heartbeat, its time already clamped to the meter's clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    pub org_id: Id,
    pub session_id: Id,
    pub vm_id: Id,
    pub obs: Observation,
    /// The meter's clock when the heartbeat arrived.
    pub received_at: Secs,
}

/// One heartbeat's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeartbeatOutcome {
    pub session_id: String,
    pub org_id: String,
    /// It changed nothing: a repeated or overtaken `seq`, or an ended session.
    pub duplicate: bool,
    pub phase: Phase,
    /// Its members, `(dimension, id)`: what an org's limits apply to.
    pub members: Vec<(crate::members::Dimension, String)>,
}

/// Why a whole heartbeat request was refused; nothing of it was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IngestReject {
    UnknownOrg { index: usize, org_id: String },
}
