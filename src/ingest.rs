//! Group commit for heartbeats: concurrent requests are queued, and each writer task
//! applies everything queued at that moment in one transaction, then answers every
//! request of the group after the commit. One commit then serves many requests, which is
//! what makes single-heartbeat requests cheap on a database that fsyncs every commit.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Mutex};
use tokio::task::JoinHandle;

use crate::ids::Id;
use crate::ledger::{Observation, Rules};
use crate::metrics::Metrics;
use crate::store::{Db, HeartbeatOutcome, IngestReject, StoreError};

/// One validated heartbeat, its time already clamped to the meter's clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    pub org_id: Id,
    pub session_id: Id,
    pub vm_id: Id,
    pub obs: Observation,
}

pub type RequestOutcome = Result<Vec<HeartbeatOutcome>, IngestReject>;

struct Job {
    heartbeats: Vec<Heartbeat>,
    reply: oneshot::Sender<Result<RequestOutcome, Arc<StoreError>>>,
}

/// Heartbeats a group carries at most: big enough to amortise a commit, small enough to
/// keep one transaction's locks short.
const MAX_GROUP_HEARTBEATS: usize = 4000;

/// The queue in front of the writers. Cloning shares it; the writers stop once every
/// clone is dropped and the queue is drained.
#[derive(Clone)]
pub struct Ingestor {
    queue: mpsc::Sender<Job>,
}

impl Ingestor {
    /// Start `writers` writer tasks (1 for SQLite, which has one write connection).
    pub fn start(
        db: Db,
        rules: Rules,
        writers: usize,
        metrics: Arc<Metrics>,
    ) -> (Ingestor, Vec<JoinHandle<()>>) {
        let (queue, rx) = mpsc::channel::<Job>(8192);
        let rx = Arc::new(Mutex::new(rx));
        let handles = (0..writers.max(1))
            .map(|_| {
                tokio::spawn(writer(
                    db.clone(),
                    rules,
                    Arc::clone(&rx),
                    Arc::clone(&metrics),
                ))
            })
            .collect();
        (Ingestor { queue }, handles)
    }

    /// Apply one request's heartbeats; returns once they are committed (or refused whole).
    pub async fn submit(
        &self,
        heartbeats: Vec<Heartbeat>,
    ) -> Result<RequestOutcome, Arc<StoreError>> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Job { heartbeats, reply })
            .await
            .map_err(|_| Arc::new(StoreError::Unavailable(sqlx::Error::PoolClosed)))?;
        answer
            .await
            .map_err(|_| Arc::new(StoreError::Unavailable(sqlx::Error::WorkerCrashed)))?
    }
}

async fn writer(db: Db, rules: Rules, rx: Arc<Mutex<mpsc::Receiver<Job>>>, metrics: Arc<Metrics>) {
    loop {
        let jobs = {
            let mut rx = rx.lock().await;
            let Some(first) = rx.recv().await else { return };
            let mut size = first.heartbeats.len();
            let mut jobs = vec![first];
            while size < MAX_GROUP_HEARTBEATS {
                match rx.try_recv() {
                    Ok(job) => {
                        size += job.heartbeats.len();
                        jobs.push(job);
                    }
                    Err(_) => break,
                }
            }
            jobs
        };
        commit_group(&db, &rules, jobs, &metrics).await;
    }
}

async fn commit_group(db: &Db, rules: &Rules, jobs: Vec<Job>, metrics: &Metrics) {
    let (requests, replies): (Vec<Vec<Heartbeat>>, Vec<_>) =
        jobs.into_iter().map(|j| (j.heartbeats, j.reply)).unzip();
    let started = std::time::Instant::now();
    match db.ingest(&requests, rules).await {
        Ok(results) => {
            metrics.observe_ingest_group(&results, started.elapsed());
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(Ok(result));
            }
        }
        // One request's failure must not fail its neighbours: retry each on its own.
        Err(StoreError::Other(e)) if requests.len() > 1 => {
            tracing::warn!(error = %e, requests = requests.len(), "group commit failed; retrying requests one by one");
            for (request, reply) in requests.iter().zip(replies) {
                let result = db.ingest(std::slice::from_ref(request), rules).await;
                let _ = reply.send(
                    result
                        .map(|mut r| r.pop().expect("one result per request"))
                        .map_err(Arc::new),
                );
            }
        }
        Err(e) => {
            tracing::error!(error = %e, requests = requests.len(), "group commit failed");
            let e = Arc::new(e);
            for reply in replies {
                let _ = reply.send(Err(Arc::clone(&e)));
            }
        }
    }
}
