//! Group commit, for every writer that answers requests: concurrent requests queue, and
//! each writer task takes everything queued at that moment (up to a weight) and commits
//! it in one transaction, then answers every request of the group after the commit. One
//! commit then serves many requests, which is what makes single requests cheap on a
//! database that fsyncs every commit. Heartbeats (`ingest`) and admissions (`admission`)
//! are its two kinds of work.

use std::future::Future;
use std::hash::{Hash, Hasher};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use tokio::sync::{mpsc, oneshot, Mutex};
use tokio::task::JoinHandle;

use crate::store::{Db, StoreError, StoreResult, Written};

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

    /// Whether `commit` tells its `written` once only the group's COMMIT is left (its locks
    /// held, its writes made), so that the writer takes its next group while this one
    /// commits (`writer`). Work that does not tell is committed one group after the other,
    /// inline, and is given no `written`.
    fn tells(&self) -> bool {
        false
    }

    /// Commit a group in one transaction; one answer per job, in order. `writer` numbers
    /// the writer, from 1. `written`, given when the work `tells`, is told (or dropped).
    fn commit(
        &self,
        jobs: &[Self::Job],
        writer: usize,
        written: Option<Written>,
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

/// One writer: take a group, commit it, answer it, again. While a group commits (an
/// fsync, no work of the writer's), the next one may begin: once a group has told that only
/// its COMMIT is left (`Work::tells`), the writer takes what queued meanwhile and
/// starts it, and waits for the committing group only before the one after. At most two
/// transactions of a writer are open at once, the older one committing; the newer one's
/// locks wait on the older one's, so it sees what the older one wrote. A group does not
/// shrink for it: the next group is the requests that arrived while this one ran, as before.
/// (A group whose COMMIT fails and is tried again, whole or job by job, runs beside the
/// newer one as two writers' groups do; and a group failed by an outage drains the queue
/// once the newer one has failed too.)
async fn writer<W: Work>(
    work: Arc<W>,
    rx: Arc<Mutex<mpsc::Receiver<Queued<W>>>>,
    max_weight: usize,
    number: usize,
) {
    let mut committing: Option<JoinHandle<Option<Arc<StoreError>>>> = None;
    loop {
        let Some(group) = take_group(&rx, max_weight).await else {
            break;
        };
        if !work.tells() {
            // Inline, but as a spawned group: one that panics has dropped its replies (its
            // callers are told the writer crashed), and the writer goes on; a writer that
            // died would leave its queue's callers only 503s until a restart.
            let failed = AssertUnwindSafe(commit_group(&*work, group, number, None))
                .catch_unwind()
                .await
                .unwrap_or(None);
            after_group(&*work, &rx, failed).await;
            continue;
        }
        let (written, told) = oneshot::channel();
        let group = tokio::spawn({
            let work = Arc::clone(&work);
            async move { commit_group(&*work, group, number, Some(written)).await }
        });
        // Told (only the COMMIT left), or the group is done without telling.
        let overlapping = told.await.is_ok();
        if let Some(older) = committing.take() {
            after_group(&*work, &rx, joined(older).await).await;
        }
        if overlapping {
            committing = Some(group);
        } else {
            after_group(&*work, &rx, joined(group).await).await;
        }
    }
    if let Some(older) = committing {
        after_group(&*work, &rx, joined(older).await).await;
    }
}

/// A spawned group's failure, if the database was unreachable. A group whose task
/// panicked has dropped its replies: its callers are told the writer crashed, and the
/// writer goes on.
async fn joined(group: JoinHandle<Option<Arc<StoreError>>>) -> Option<Arc<StoreError>> {
    group.await.ok().flatten()
}

/// Everything queued at this moment, up to `max_weight` (at least one job); None once the
/// queue is closed and drained.
async fn take_group<W: Work>(
    rx: &Mutex<mpsc::Receiver<Queued<W>>>,
    max_weight: usize,
) -> Option<Vec<Queued<W>>> {
    let mut rx = rx.lock().await;
    let first = rx.recv().await?;
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
    Some(group)
}

/// After a group's commit: what queued behind a group that waited out the acquire
/// timeout has waited most of one already: if the database is down (not merely busy),
/// answer it now rather than after another, so a request fails within one timeout, not
/// two. A writer holding the queue is already taking it.
async fn after_group<W: Work>(
    work: &W,
    rx: &Mutex<mpsc::Receiver<Queued<W>>>,
    failed: Option<Arc<StoreError>>,
) {
    let Some(e) = failed else { return };
    if work.db().reachable().await {
        return;
    }
    if let Ok(mut rx) = rx.try_lock() {
        while let Ok(queued) = rx.try_recv() {
            let _ = queued.reply.send(Err(Arc::clone(&e)));
        }
    }
}

/// Commit one group and answer it; the error, if the database was unreachable.
async fn commit_group<W: Work>(
    work: &W,
    group: Vec<Queued<W>>,
    number: usize,
    written: Option<Written>,
) -> Option<Arc<StoreError>> {
    let (jobs, replies): (Vec<W::Job>, Vec<_>) =
        group.into_iter().map(|q| (q.job, q.reply)).unzip();
    match work.commit(&jobs, number, written).await {
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
                    .commit(std::slice::from_ref(job), number, None)
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex as StdMutex;
    use std::time::Duration;

    use super::*;
    use crate::store::PoolSettings;

    /// Work whose groups each commit when the test lets them (`release`), recording when
    /// each starts and ends; if it `tells`, a group tells `written` as soon as it starts.
    struct Steps<const TELLS: bool> {
        db: Db,
        events: StdMutex<Vec<String>>,
        gates: StdMutex<HashMap<String, oneshot::Receiver<()>>>,
        releases: StdMutex<HashMap<String, oneshot::Sender<()>>>,
    }

    impl<const TELLS: bool> Steps<TELLS> {
        async fn new(dir: &tempfile::TempDir) -> Arc<Steps<TELLS>> {
            let url = format!("sqlite://{}/db.sqlite", dir.path().display());
            let db = Db::connect(&url, PoolSettings::default()).await.unwrap();
            // Connected on the real clock (its pool's timeouts would pass at once on a paused
            // one), then paused for `settle`.
            tokio::time::pause();
            let (mut gates, mut releases) = (HashMap::new(), HashMap::new());
            for job in ["a", "b", "c"] {
                let (tx, rx) = oneshot::channel();
                gates.insert(job.to_owned(), rx);
                releases.insert(job.to_owned(), tx);
            }
            Arc::new(Steps {
                db,
                events: StdMutex::default(),
                gates: StdMutex::new(gates),
                releases: StdMutex::new(releases),
            })
        }

        fn release(&self, job: &str) {
            let tx = self.releases.lock().unwrap().remove(job).unwrap();
            tx.send(()).unwrap();
        }

        fn events(&self) -> Vec<String> {
            self.events.lock().unwrap().clone()
        }
    }

    impl<const TELLS: bool> Work for Steps<TELLS> {
        type Job = String;
        type Done = String;

        fn tells(&self) -> bool {
            TELLS
        }

        async fn commit(
            &self,
            jobs: &[String],
            _writer: usize,
            written: Option<Written>,
        ) -> StoreResult<Vec<String>> {
            let job = jobs.join("+");
            self.events.lock().unwrap().push(format!("start {job}"));
            if let Some(w) = written {
                w.send(()).unwrap();
            }
            let gate = self.gates.lock().unwrap().remove(&jobs[0]).unwrap();
            gate.await.unwrap();
            self.events.lock().unwrap().push(format!("end {job}"));
            Ok(jobs.to_vec())
        }

        fn db(&self) -> &Db {
            &self.db
        }
    }

    /// Run every task that can run to its next wait: the paused clock moves on only once
    /// the runtime has nothing else to do.
    async fn settle() {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    fn shape() -> Shape {
        Shape {
            queues: 1,
            writers_per_queue: 1,
            max_weight: 16,
            capacity: 16,
            first_writer: 1,
        }
    }

    /// Submit `jobs` one after another, each once the one before has started.
    async fn submit_in_turn<const TELLS: bool>(
        queue: &GroupCommit<Steps<TELLS>>,
        jobs: &[&str],
    ) -> Vec<JoinHandle<Reply<Steps<TELLS>>>> {
        let mut answers = Vec::new();
        for job in jobs {
            let q = queue.clone();
            let job = job.to_string();
            answers.push(tokio::spawn(async move { q.submit(job).await }));
            settle().await;
        }
        answers
    }

    /// Work that panics on the job "boom" and answers any other.
    struct Panics<const TELLS: bool> {
        db: Db,
    }

    impl<const TELLS: bool> Work for Panics<TELLS> {
        type Job = String;
        type Done = String;

        fn tells(&self) -> bool {
            TELLS
        }

        async fn commit(
            &self,
            jobs: &[String],
            _writer: usize,
            _written: Option<Written>,
        ) -> StoreResult<Vec<String>> {
            assert!(!jobs.iter().any(|j| j == "boom"), "a bug in a group's work");
            Ok(jobs.to_vec())
        }

        fn db(&self) -> &Db {
            &self.db
        }
    }

    /// A group whose work panics fails its callers, and its writer goes on with the next.
    async fn a_panicking_group_leaves_its_writer_running<const TELLS: bool>() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/db.sqlite", dir.path().display());
        let db = Db::connect(&url, PoolSettings::default()).await.unwrap();
        let work = Arc::new(Panics::<TELLS> { db });
        let (queue, writers) = GroupCommit::start_shared(work, shape());
        let crashed = queue.submit("boom".to_owned()).await.unwrap_err();
        assert!(
            matches!(
                &*crashed,
                StoreError::Unavailable(sqlx::Error::WorkerCrashed)
            ),
            "{crashed:?}"
        );
        assert_eq!(queue.submit("next".to_owned()).await.unwrap(), "next");
        drop(queue);
        for w in writers {
            w.await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_panicking_group_committed_inline_leaves_its_writer_running() {
        a_panicking_group_leaves_its_writer_running::<false>().await;
    }

    #[tokio::test]
    async fn a_panicking_group_committed_in_its_own_task_leaves_its_writer_running() {
        a_panicking_group_leaves_its_writer_running::<true>().await;
    }

    #[tokio::test]
    async fn a_group_that_tells_lets_the_next_begin_while_it_commits_and_no_more() {
        let dir = tempfile::tempdir().unwrap();
        let steps = Steps::<true>::new(&dir).await;
        let (queue, writers) = GroupCommit::start_shared(Arc::clone(&steps), shape());
        let answers = submit_in_turn(&queue, &["a", "b", "c"]).await;
        // b began while a commits; c waits for a, so that a writer holds two transactions
        // at most.
        assert_eq!(steps.events(), ["start a", "start b"]);
        steps.release("a");
        settle().await;
        assert_eq!(steps.events(), ["start a", "start b", "end a", "start c"]);
        steps.release("b");
        steps.release("c");
        for (answer, job) in answers.into_iter().zip(["a", "b", "c"]) {
            assert_eq!(answer.await.unwrap().unwrap(), job);
        }
        drop(queue);
        for w in writers {
            w.await.unwrap();
        }
        assert_eq!(steps.events()[4..], ["end b", "end c"]);
    }

    #[tokio::test]
    async fn a_group_that_does_not_tell_is_committed_before_the_next_begins() {
        let dir = tempfile::tempdir().unwrap();
        let steps = Steps::<false>::new(&dir).await;
        let (queue, writers) = GroupCommit::start_shared(Arc::clone(&steps), shape());
        let answers = submit_in_turn(&queue, &["a", "b"]).await;
        assert_eq!(steps.events(), ["start a"]);
        steps.release("a");
        settle().await;
        assert_eq!(steps.events(), ["start a", "end a", "start b"]);
        steps.release("b");
        for (answer, job) in answers.into_iter().zip(["a", "b"]) {
            assert_eq!(answer.await.unwrap().unwrap(), job);
        }
        drop(queue);
        for w in writers {
            w.await.unwrap();
        }
    }
}
