//! The gate, through group commit: each writer decides everything queued at that moment
//! in one transaction (`GateStore::admit`), in arrival order, then answers after the
//! commit. A key always goes to the same writer, so one instance's writers never wait on
//! each other's key locks; the row locks still order instances.

use std::sync::Arc;

use rush_meter_core::gate::{AdmissionRequest, AdmitReject, Decision, Reason};
use rush_meter_core::ledger::Rules;
use rush_meter_core::plans::Plans;

use super::auto_topup::AutoTopups;
use super::group_commit::{GroupCommit, Shape, Work};
use super::pace::Activity;
use crate::clock::Clock;
use crate::store::{Db, StoreResult, Written};

/// The queues in front of the gate's writers.
pub type Admitter = GroupCommit<Gate>;

/// Admissions a group carries at most: a commit's worth that keeps locks brief.
const MAX_GROUP: usize = 256;

/// What the gate's writers share.
pub struct Gate {
    pub db: Db,
    pub plans: Arc<Plans>,
    pub rules: Rules,
    pub clock: Clock,
    /// Told of each group, so that the expiry job looks at its base period (`pace`).
    pub activity: Arc<Activity>,
    /// Told of orgs denied for want of room, which may have auto top-up on.
    pub auto_topups: AutoTopups,
}

impl Gate {
    /// Start the writers. Gate groups are bigger with fewer writers; two keep one key's
    /// lock wait (on another instance) from holding up every admission
    /// (reports/admission.md).
    pub fn start(self) -> (Admitter, Vec<tokio::task::JoinHandle<()>>) {
        let shape = Shape {
            queues: self.db.writers().min(2),
            writers_per_queue: 1,
            max_weight: MAX_GROUP,
            capacity: 4096,
            first_writer: 1,
        };
        GroupCommit::start(self, shape)
    }
}

impl Work for Gate {
    type Job = AdmissionRequest;
    type Done = Result<Decision, AdmitReject>;

    fn lane(job: &AdmissionRequest) -> impl std::hash::Hash {
        (job.org_id.clone(), job.key_id.clone())
    }

    /// Told before each group's COMMIT (`GateStore::admit_telling`), where the database
    /// overlaps commits.
    fn tells(&self) -> bool {
        self.db.overlaps_commits()
    }

    async fn commit(
        &self,
        jobs: &[AdmissionRequest],
        _writer: usize,
        written: Option<Written>,
    ) -> StoreResult<Vec<Result<Decision, AdmitReject>>> {
        let now = self.clock.now();
        self.activity.touch();
        let decided = self
            .db
            .admit_telling(&self.plans, jobs, now, &self.rules, written)
            .await?;
        let short: Vec<&str> = decided
            .iter()
            .flatten()
            .filter(|d| d.reason.is_some_and(Reason::for_want_of_room))
            .map(|d| d.org_id.as_str())
            .collect();
        self.auto_topups.after_denials(&short, now);
        Ok(decided)
    }

    fn db(&self) -> &Db {
        &self.db
    }
}
