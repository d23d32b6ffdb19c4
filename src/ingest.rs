//! Group commit for heartbeats: concurrent requests are queued, and each writer task
//! applies everything queued at that moment in one transaction, then answers every
//! request of the group after the commit. One commit then serves many requests, which is
//! what makes single-heartbeat requests cheap on a database that fsyncs every commit.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Mutex};
use tokio::task::JoinHandle;

use crate::clock::Clock;
use crate::ledger::{Rules, Secs};
use crate::metrics::Metrics;
use crate::plans::Plans;
use crate::standing::standings;
use crate::store::{Db, HeartbeatOutcome, IngestReject, StoreError};

pub use crate::batch::Heartbeat;

pub type RequestOutcome = Result<Vec<HeartbeatOutcome>, IngestReject>;

/// What a heartbeat answer tells a running session about its org, read after the commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OrgAdvice {
    pub remaining_seconds: i64,
    pub park: bool,
}

/// A request's answer: its outcome, and the advice for every org of its group.
pub type Answer = (RequestOutcome, Arc<HashMap<String, OrgAdvice>>);

struct Job {
    heartbeats: Vec<Heartbeat>,
    reply: oneshot::Sender<Result<Answer, Arc<StoreError>>>,
}

/// What the writers share.
#[derive(Clone)]
pub struct Writer {
    pub db: Db,
    pub plans: Arc<Plans>,
    pub rules: Rules,
    pub clock: Clock,
    pub metrics: Arc<Metrics>,
    advice: Arc<std::sync::Mutex<HashMap<String, (OrgAdvice, Secs)>>>,
    /// Sees each org's standing after a commit, for usage-threshold notifications.
    pub watch: crate::notify::Watch,
}

/// How long an org's advice may be reused, and only while the org has so much time left
/// that it could not run out meanwhile (see `reusable`). Orgs near a ceiling are read
/// fresh after every commit.
const ADVICE_TTL: Secs = 2;

/// Advice may be reused for `ADVICE_TTL` only if the org's running sessions, doubled, plus
/// 100 newly admitted ones, could not spend what it has left in that time.
fn reusable(remaining_seconds: i64, running: i64) -> bool {
    remaining_seconds > (2 * running + 100) * ADVICE_TTL
}

impl Writer {
    pub fn new(
        db: Db,
        plans: Arc<Plans>,
        rules: Rules,
        clock: Clock,
        metrics: Arc<Metrics>,
    ) -> Self {
        Writer {
            db,
            plans,
            rules,
            clock,
            metrics,
            advice: Arc::default(),
            watch: crate::notify::Watch::default(),
        }
    }

    /// Hand every standing read after a commit to `watch`.
    pub fn with_watch(mut self, watch: crate::notify::Watch) -> Self {
        self.watch = watch;
        self
    }
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
    pub fn start(w: Writer, writers: usize) -> (Ingestor, Vec<JoinHandle<()>>) {
        let (queue, rx) = mpsc::channel::<Job>(8192);
        let rx = Arc::new(Mutex::new(rx));
        let handles = (0..writers.max(1))
            .map(|i| tokio::spawn(writer(w.clone(), Arc::clone(&rx), i as i64 + 1)))
            .collect();
        (Ingestor { queue }, handles)
    }

    /// Apply one request's heartbeats; returns once they are committed (or refused whole).
    pub async fn submit(&self, heartbeats: Vec<Heartbeat>) -> Result<Answer, Arc<StoreError>> {
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

/// One writer task. `shard` keeps its rollup rows apart from the other writers' (shard 0
/// is left to session ends and the expiry job).
async fn writer(w: Writer, rx: Arc<Mutex<mpsc::Receiver<Job>>>, shard: i64) {
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
        let Some(e) = commit_group(&w, jobs, shard).await else {
            continue;
        };
        // The jobs queued behind a group that waited out the acquire timeout have waited
        // most of one already: if the database is down (not merely busy), answer them now
        // rather than after another, so a request fails within one timeout, not two. A
        // writer holding the queue is already taking them.
        if w.db.reachable().await {
            continue;
        }
        if let Ok(mut rx) = rx.try_lock() {
            while let Ok(job) = rx.try_recv() {
                let _ = job.reply.send(Err(Arc::clone(&e)));
            }
        }
    }
}

/// Commit one group and answer its requests; the error, if the database was unreachable.
async fn commit_group(w: &Writer, jobs: Vec<Job>, shard: i64) -> Option<Arc<StoreError>> {
    let (requests, replies): (Vec<Vec<Heartbeat>>, Vec<_>) =
        jobs.into_iter().map(|j| (j.heartbeats, j.reply)).unzip();
    let started = std::time::Instant::now();
    let results = match w.db.ingest(&requests, &w.rules, shard).await {
        Ok(results) => {
            w.metrics.observe_ingest_group(&results, started.elapsed());
            Ok(results)
        }
        // One request's failure must not fail its neighbours: retry each on its own.
        Err(e @ (StoreError::Other(_) | StoreError::Conflict(_))) if requests.len() > 1 => {
            tracing::warn!(error = %e, requests = requests.len(), "group commit failed; retrying requests one by one");
            let mut each = Vec::with_capacity(requests.len());
            for request in &requests {
                each.push(
                    w.db.ingest(std::slice::from_ref(request), &w.rules, shard)
                        .await
                        .map(|mut r| r.pop().expect("one result per request"))
                        .map_err(Arc::new),
                );
            }
            Err(each)
        }
        Err(e) => {
            tracing::error!(error = %e, requests = requests.len(), "group commit failed");
            let e = Arc::new(e);
            for reply in replies {
                let _ = reply.send(Err(Arc::clone(&e)));
            }
            return e.is_unavailable().then_some(e);
        }
    };
    let results: Vec<Result<RequestOutcome, Arc<StoreError>>> = match results {
        Ok(r) => r.into_iter().map(Ok).collect(),
        Err(each) => each,
    };
    // Every org of the group once, after the commit, so each answer counts its own batch.
    let advice = match advise(w, &results).await {
        Ok(a) => Arc::new(a),
        Err(e) => {
            let e = Arc::new(e);
            for reply in replies {
                let _ = reply.send(Err(Arc::clone(&e)));
            }
            return e.is_unavailable().then_some(e);
        }
    };
    for (reply, result) in replies.into_iter().zip(results) {
        let _ = reply.send(result.map(|r| (r, Arc::clone(&advice))));
    }
    None
}

async fn advise(
    w: &Writer,
    results: &[Result<RequestOutcome, Arc<StoreError>>],
) -> Result<HashMap<String, OrgAdvice>, StoreError> {
    let mut ids: Vec<&str> = results
        .iter()
        .flatten()
        .flatten()
        .flatten()
        .map(|o| o.org_id.as_str())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    // Meter time, not wall time: what matters is how much agent time can pass.
    let now = w.clock.now();
    let mut advice = HashMap::with_capacity(ids.len());
    let mut missing = Vec::new();
    {
        let cache = w.advice.lock().expect("advice cache lock");
        for id in ids {
            match cache.get(id) {
                Some((a, until)) if *until > now => {
                    advice.insert(id.to_owned(), *a);
                }
                _ => missing.push(id),
            }
        }
    }
    if missing.is_empty() {
        return Ok(advice);
    }
    let fresh = standings(&w.db, &w.plans, &missing, now, &w.rules).await?;
    let mut cache = w.advice.lock().expect("advice cache lock");
    if cache.len() > 100_000 {
        cache.retain(|_, (_, until)| *until > now);
    }
    for s in fresh {
        w.watch.observe(&s);
        let a = OrgAdvice {
            remaining_seconds: s.remaining_seconds(),
            park: s.must_park(),
        };
        // Near a notification threshold, read fresh too, so the commit that crosses it
        // is the one that sees it.
        let room = a.remaining_seconds.min(w.watch.room(&s));
        if reusable(room, s.running) {
            cache.insert(s.org.org_id.clone(), (a, now + ADVICE_TTL));
        } else {
            cache.remove(&s.org.org_id);
        }
        advice.insert(s.org.org_id, a);
    }
    Ok(advice)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advice_is_reused_only_with_room_to_spare() {
        assert!(!reusable(0, 0));
        assert!(!reusable(200, 0));
        assert!(reusable(201, 0));
        assert!(!reusable(600, 100));
        assert!(reusable(601, 100));
    }
}
