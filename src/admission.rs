//! Group commit for the gate: admissions queue per writer, and each writer decides
//! everything queued at that moment in one transaction (`Db::admit`), in arrival order,
//! then answers after the commit. A key always goes to the same writer, so one instance's
//! writers never wait on each other's key locks; the row locks still order instances.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::clock::Clock;
use crate::ledger::Rules;
use crate::plans::Plans;
use crate::store::{AdmissionRequest, AdmitReject, Db, DecisionRow, StoreError};

pub type Answer = Result<Result<DecisionRow, AdmitReject>, Arc<StoreError>>;

struct Job {
    request: AdmissionRequest,
    reply: oneshot::Sender<Answer>,
}

/// What the gate's writers share.
#[derive(Clone)]
pub struct Gatekeeper {
    pub db: Db,
    pub plans: Arc<Plans>,
    pub rules: Rules,
    pub clock: Clock,
}

/// Admissions a group carries at most: a commit's worth that keeps locks brief.
const MAX_GROUP: usize = 256;

/// The queues in front of the gate's writers. Cloning shares them; the writers stop once
/// every clone is dropped and the queues are drained.
#[derive(Clone)]
pub struct Admitter {
    queues: Arc<[mpsc::Sender<Job>]>,
}

impl Admitter {
    /// Start `writers` writer tasks (1 for SQLite, which has one write connection).
    pub fn start(g: Gatekeeper, writers: usize) -> (Admitter, Vec<JoinHandle<()>>) {
        let (queues, handles): (Vec<_>, Vec<_>) = (0..writers.max(1))
            .map(|_| {
                let (tx, rx) = mpsc::channel::<Job>(4096);
                (tx, tokio::spawn(writer(g.clone(), rx)))
            })
            .unzip();
        (
            Admitter {
                queues: queues.into(),
            },
            handles,
        )
    }

    /// Decide one admission; returns once its decision is committed.
    pub async fn submit(&self, request: AdmissionRequest) -> Answer {
        let queue = &self.queues[shard(&request, self.queues.len())];
        let (reply, answer) = oneshot::channel();
        queue
            .send(Job { request, reply })
            .await
            .map_err(|_| Arc::new(StoreError::Unavailable(sqlx::Error::PoolClosed)))?;
        answer
            .await
            .map_err(|_| Arc::new(StoreError::Unavailable(sqlx::Error::WorkerCrashed)))?
    }
}

/// The writer a key's admissions go to.
fn shard(r: &AdmissionRequest, writers: usize) -> usize {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (&r.org_id, &r.key_id).hash(&mut h);
    (h.finish() % writers as u64) as usize
}

async fn writer(g: Gatekeeper, mut rx: mpsc::Receiver<Job>) {
    let mut jobs = Vec::with_capacity(MAX_GROUP);
    while rx.recv_many(&mut jobs, MAX_GROUP).await > 0 {
        let Some(e) = commit_group(&g, std::mem::take(&mut jobs)).await else {
            continue;
        };
        // As for heartbeats (crate::ingest): if the database is down, not merely busy,
        // what queued behind the failed group is answered now, not after another timeout.
        if !g.db.reachable().await {
            while let Ok(job) = rx.try_recv() {
                let _ = job.reply.send(Err(Arc::clone(&e)));
            }
        }
    }
}

/// Decide one group and answer it; the error, if the database was unreachable.
async fn commit_group(g: &Gatekeeper, jobs: Vec<Job>) -> Option<Arc<StoreError>> {
    let (requests, replies): (Vec<_>, Vec<_>) =
        jobs.into_iter().map(|j| (j.request, j.reply)).unzip();
    let now = g.clock.now();
    let answers: Vec<Answer> = match g.db.admit(&g.plans, &requests, now, &g.rules).await {
        Ok(decided) => decided.into_iter().map(Ok).collect(),
        // One request's failure must not fail its neighbours: decide each on its own.
        Err(e @ (StoreError::Other(_) | StoreError::Conflict(_))) if requests.len() > 1 => {
            tracing::warn!(error = %e, requests = requests.len(), "admission group failed; deciding requests one by one");
            let mut each = Vec::with_capacity(requests.len());
            for r in &requests {
                let now = g.clock.now();
                each.push(
                    g.db.admit(&g.plans, std::slice::from_ref(r), now, &g.rules)
                        .await
                        .map(|mut d| d.pop().expect("one answer per request"))
                        .map_err(Arc::new),
                );
            }
            each
        }
        Err(e) => {
            tracing::error!(error = %e, requests = requests.len(), "admission group failed");
            let e = Arc::new(e);
            for reply in replies {
                let _ = reply.send(Err(Arc::clone(&e)));
            }
            return e.is_unavailable().then_some(e);
        }
    };
    for (reply, answer) in replies.into_iter().zip(answers) {
        let _ = reply.send(answer);
    }
    None
}
