//! Group commit, for every writer that answers requests: concurrent requests queue, and
//! each writer task takes everything queued at that moment (up to a weight) and commits
//! it in one transaction, then answers every request of the group after the commit. One
//! commit then serves many requests, which is what makes single requests cheap on a
//! database that fsyncs every commit. Heartbeats (`ingest`) and admissions (`admission`)
//! are its two kinds of work.

use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Mutex};
use tokio::task::JoinHandle;

use crate::store::{Db, StoreError, StoreResult};

/// A kind of work committed in groups.
pub trait Work: Send + Sync + 'static {
    type Job: Send + Sync + 'static;
    type Done: Send + 'static;

    /// How much of a group a job takes (a heartbeat request: its heartbeats).
    fn weight(_job: &Self::Job) -> usize {
        1
    }

    /// What decides a job's queue when there are several: jobs that lock the same rows go
    /// to the same writer, so one instance's writers never wait on each other's locks.
    fn lane(_job: &Self::Job) -> impl Hash {}

    /// Commit a group in one transaction; one answer per job, in order. `writer` numbers
    /// the writer, from 1.
    fn commit(
        &self,
        jobs: &[Self::Job],
        writer: usize,
    ) -> impl Future<Output = StoreResult<Vec<Self::Done>>> + Send;

    /// The database, asked after a failed group whether it is down.
    fn db(&self) -> &Db;
}

/// A job's answer, or the failure that every job of its group shares.
pub type Reply<W> = Result<<W as Work>::Done, Arc<StoreError>>;

/// How the queues and writers are laid out.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Queues, each with its own writers; a job's `lane` picks its queue.
    pub queues: usize,
    /// Writers taking groups from each queue (they overlap their commits).
    pub writers_per_queue: usize,
    /// The weight a group carries at most: big enough to amortise a commit, small enough
    /// to keep one transaction's locks short.
    pub max_weight: usize,
    /// Jobs a queue holds before `submit` waits for room.
    pub capacity: usize,
    /// The number of the first writer (writers are numbered on from it).
    pub first_writer: usize,
}

struct Queued<W: Work> {
    job: W::Job,
    reply: oneshot::Sender<Reply<W>>,
}

/// The queues in front of the writers. Cloning shares them; the writers stop once every
/// clone is dropped and the queues are drained.
pub struct GroupCommit<W: Work> {
    queues: Arc<[mpsc::Sender<Queued<W>>]>,
}

impl<W: Work> Clone for GroupCommit<W> {
    fn clone(&self) -> Self {
        GroupCommit {
            queues: Arc::clone(&self.queues),
        }
    }
}

impl<W: Work> GroupCommit<W> {
    /// Start the writers of `shape`.
    pub fn start(work: W, shape: Shape) -> (GroupCommit<W>, Vec<JoinHandle<()>>) {
        Self::start_shared(Arc::new(work), shape)
    }

    /// Start the writers of `shape` on work that other writers share.
    pub fn start_shared(work: Arc<W>, shape: Shape) -> (GroupCommit<W>, Vec<JoinHandle<()>>) {
        let mut handles = Vec::new();
        let mut queues = Vec::new();
        for q in 0..shape.queues.max(1) {
            let (tx, rx) = mpsc::channel::<Queued<W>>(shape.capacity.max(1));
            let rx = Arc::new(Mutex::new(rx));
            for w in 0..shape.writers_per_queue.max(1) {
                let number = shape.first_writer + q * shape.writers_per_queue.max(1) + w;
                handles.push(tokio::spawn(writer(
                    Arc::clone(&work),
                    Arc::clone(&rx),
                    shape.max_weight.max(1),
                    number,
                )));
            }
            queues.push(tx);
        }
        (
            GroupCommit {
                queues: queues.into(),
            },
            handles,
        )
    }

    /// Queue a job; returns once its group is committed (or failed).
    pub async fn submit(&self, job: W::Job) -> Reply<W> {
        let queue = &self.queues[self.queue_of(&job)];
        let (reply, answer) = oneshot::channel();
        queue
            .send(Queued { job, reply })
            .await
            .map_err(|_| Arc::new(StoreError::Unavailable(sqlx::Error::PoolClosed)))?;
        answer
            .await
            .map_err(|_| Arc::new(StoreError::Unavailable(sqlx::Error::WorkerCrashed)))?
    }

    fn queue_of(&self, job: &W::Job) -> usize {
        if self.queues.len() == 1 {
            return 0;
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        W::lane(job).hash(&mut h);
        (h.finish() % self.queues.len() as u64) as usize
    }
}

/// One writer: take a group, commit it, answer it, again.
async fn writer<W: Work>(
    work: Arc<W>,
    rx: Arc<Mutex<mpsc::Receiver<Queued<W>>>>,
    max_weight: usize,
    number: usize,
) {
    loop {
        let group = {
            let mut rx = rx.lock().await;
            let Some(first) = rx.recv().await else { return };
            let mut weight = W::weight(&first.job);
            let mut group = vec![first];
            while weight < max_weight {
                match rx.try_recv() {
                    Ok(next) => {
                        weight += W::weight(&next.job);
                        group.push(next);
                    }
                    Err(_) => break,
                }
            }
            group
        };
        let Some(e) = commit_group(&*work, group, number).await else {
            continue;
        };
        // What queued behind a group that waited out the acquire timeout has waited most
        // of one already: if the database is down (not merely busy), answer it now rather
        // than after another, so a request fails within one timeout, not two. A writer
        // holding the queue is already taking it.
        if work.db().reachable().await {
            continue;
        }
        if let Ok(mut rx) = rx.try_lock() {
            while let Ok(queued) = rx.try_recv() {
                let _ = queued.reply.send(Err(Arc::clone(&e)));
            }
        }
    }
}

/// Commit one group and answer it; the error, if the database was unreachable.
async fn commit_group<W: Work>(
    work: &W,
    group: Vec<Queued<W>>,
    number: usize,
) -> Option<Arc<StoreError>> {
    let (jobs, replies): (Vec<W::Job>, Vec<_>) =
        group.into_iter().map(|q| (q.job, q.reply)).unzip();
    match work.commit(&jobs, number).await {
        Ok(done) => {
            for (reply, d) in replies.into_iter().zip(done) {
                let _ = reply.send(Ok(d));
            }
            None
        }
        // One job's failure must not fail its neighbours: commit each on its own.
        Err(e) if e.may_be_one_requests() && jobs.len() > 1 => {
            tracing::warn!(error = %e, jobs = jobs.len(), "group commit failed; committing jobs one by one");
            for (job, reply) in jobs.iter().zip(replies) {
                let one = work
                    .commit(std::slice::from_ref(job), number)
                    .await
                    .map(|mut d| d.pop().expect("one answer per job"))
                    .map_err(Arc::new);
                let _ = reply.send(one);
            }
            None
        }
        Err(e) => {
            tracing::error!(error = %e, jobs = jobs.len(), "group commit failed");
            let e = Arc::new(e);
            for reply in replies {
                let _ = reply.send(Err(Arc::clone(&e)));
            }
            e.is_unavailable().then_some(e)
        }
    }
}
