//! Heartbeats in, through group commit: each group's requests are applied in one
//! transaction (`LedgerStore::ingest`), and after the commit every org of the group is
//! advised once (how much it has left, whether its sessions must park), so each answer
//! counts its own batch.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use rush_meter_core::heartbeats::{Heartbeat, RequestOutcome};
use rush_meter_core::ledger::Rules;
use rush_meter_core::members::{self, Dimension, MemberRoom};
use rush_meter_core::org::Org;
use rush_meter_core::plans::Plans;
use rush_meter_core::room::{park_reason, ParkReason};
use rush_meter_core::standing::Standing;
use rush_meter_core::time::Secs;

use super::auto_topup::AutoTopups;
use super::group_commit::{GroupCommit, Reply, Shape, Work};
use super::notifier::Watch;
use super::pace::Activity;
use super::standing::standings;
use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::store::{Db, RoomWait, StoreResult, Written};

/// What a heartbeat answer tells a running session about its org, read after the commit:
/// the org's room, and the room of each member the org limits (docs/limits.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrgAdvice {
    pub remaining_seconds: i64,
    pub park: bool,
    /// Why the org's sessions park, and when a reset brings its plan room back.
    pub why: Option<(ParkReason, Secs)>,
    pub members: BTreeMap<(Dimension, String), MemberRoom>,
}

/// What one session is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionAdvice {
    pub remaining_seconds: i64,
    pub park: bool,
    /// Why it parks for want of room; `None` when it may go on (or its org was not read).
    pub reason: Option<ParkReason>,
    /// When a window's reset brings room back, if that is what will.
    pub resume_at: Option<Secs>,
}

impl OrgAdvice {
    /// For an org that was not found: nothing left.
    pub const NONE: OrgAdvice = OrgAdvice {
        remaining_seconds: 0,
        park: true,
        why: None,
        members: BTreeMap::new(),
    };

    /// The advice for a session of these members (its user, project and key): the least
    /// room of the org and of each limited member, and park if any of them must.
    pub fn for_session(&self, members: &[(Dimension, String)]) -> SessionAdvice {
        let mut a = SessionAdvice {
            remaining_seconds: self.remaining_seconds,
            park: self.park,
            reason: self.why.filter(|_| self.park).map(|w| w.0),
            resume_at: self.why.filter(|_| self.park).map(|w| w.1),
        };
        for m in members {
            if let Some(r) = self.members.get(m) {
                a.remaining_seconds = a.remaining_seconds.min(r.remaining_seconds);
                if r.park && !a.park {
                    // A member's limit: its windows are the org's, but which one binds is
                    // the limit's, so no reset time is told.
                    a.park = true;
                    a.reason = Some(ParkReason::MemberLimit);
                }
            }
        }
        a
    }

    /// What the org's sessions park for want of, if any do: the org's own room (why, and
    /// when a reset brings it back), else limits inside it (the members whose limits are
    /// spent, as JSON, and the end of the week their limits count in).
    fn wait(&self, s: &Standing) -> Option<(ParkReason, Secs, Option<String>)> {
        if let Some((reason, at)) = self.why {
            return Some((reason, at, None));
        }
        let spent: Vec<(&str, &str)> = self
            .members
            .iter()
            .filter(|(_, r)| r.park)
            .map(|((d, id), _)| (d.as_str(), id.as_str()))
            .collect();
        if spent.is_empty() {
            return None;
        }
        let week_end = rush_meter_core::time::Windows::at(s.at, s.org.billing_period())
            .week
            .end;
        let members = serde_json::to_string(&spent).expect("pairs of strings serialize");
        Some((ParkReason::MemberLimit, week_end, Some(members)))
    }

    /// The least room of the org and its limited members.
    fn least_room(&self) -> i64 {
        self.members
            .values()
            .map(|r| r.remaining_seconds)
            .fold(self.remaining_seconds, i64::min)
    }
}

/// A request's answer: its outcome, and the advice for every org of its group.
pub type Answer = (RequestOutcome, Arc<HashMap<String, Arc<OrgAdvice>>>);

/// The queues in front of the heartbeat writers. A request whose heartbeats are all of one
/// org goes to the writer of that org (bookings of an org lock its row: docs/funding.md,
/// so requests of one org are then grouped by one writer rather than waiting on each
/// other across writers); a request of several orgs to writers that take any. One writer
/// (SQLite) takes everything.
#[derive(Clone)]
pub struct Ingestor {
    one_org: GroupCommit<Ingest>,
    mixed: Option<GroupCommit<Ingest>>,
}

impl Ingestor {
    pub async fn submit(&self, job: Vec<Heartbeat>) -> Reply<Ingest> {
        match &self.mixed {
            Some(mixed) if !one_org(&job) => mixed.submit(job).await,
            _ => self.one_org.submit(job).await,
        }
    }
}

fn one_org(job: &[Heartbeat]) -> bool {
    job.windows(2).all(|w| w[0].org_id == w[1].org_id)
}

/// Heartbeats a group carries at most: big enough to amortise a commit, small enough to
/// keep one transaction's locks short.
const MAX_GROUP_HEARTBEATS: usize = 4000;

/// How long an org's advice may be reused, and only while the org has so much time left
/// that it could not run out meanwhile (see `reusable`). Orgs near a ceiling are read
/// fresh after every commit.
const ADVICE_TTL: Secs = 2;

/// Advice may be reused for `ADVICE_TTL` only if the org's running sessions, doubled, plus
/// 100 newly admitted ones, could not spend what it has left in that time.
fn reusable(remaining_seconds: i64, running: i64) -> bool {
    remaining_seconds > (2 * running + 100) * ADVICE_TTL
}

/// What the heartbeat writers share.
pub struct Ingest {
    pub db: Db,
    pub plans: Arc<Plans>,
    pub rules: Rules,
    pub clock: Clock,
    pub metrics: Arc<Metrics>,
    /// Sees each org's standing after a commit, for usage-threshold notifications.
    pub watch: Watch,
    /// Told of each group, so that the expiry job looks at its base period (`pace`).
    activity: Arc<Activity>,
    /// Opens a pack where a commit takes an org below its auto top-up threshold.
    auto_topups: AutoTopups,
    /// Each org's advice, shared (not copied: it holds every limited member) until it expires.
    advice: Mutex<HashMap<String, (Arc<OrgAdvice>, Secs)>>,
}

impl Ingest {
    pub fn new(
        db: Db,
        plans: Arc<Plans>,
        rules: Rules,
        clock: Clock,
        metrics: Arc<Metrics>,
        (watch, auto_topups): (Watch, AutoTopups),
        activity: Arc<Activity>,
    ) -> Ingest {
        Ingest {
            db,
            plans,
            rules,
            clock,
            metrics,
            watch,
            activity,
            auto_topups,
            advice: Mutex::default(),
        }
    }

    /// Start the writers: as many as the database overlaps commits for requests of one
    /// org, one queue each by org, and as many again for requests of several orgs, sharing
    /// one queue (each writer adds to its own `org_hourly` rows, its shard: 0 is left to
    /// session ends and the expiry job). With one writer (SQLite), one queue for all.
    pub fn start(self) -> (Ingestor, Vec<tokio::task::JoinHandle<()>>) {
        let writers = self.db.writers();
        let work = Arc::new(self);
        let shape = |queues, writers_per_queue, first_writer| Shape {
            queues,
            writers_per_queue,
            max_weight: MAX_GROUP_HEARTBEATS,
            capacity: 8192,
            first_writer,
        };
        if writers == 1 {
            let (one_org, handles) = GroupCommit::start_shared(work, shape(1, 1, 1));
            return (
                Ingestor {
                    one_org,
                    mixed: None,
                },
                handles,
            );
        }
        let (one_org, mut handles) =
            GroupCommit::start_shared(Arc::clone(&work), shape(writers, 1, 1));
        let (mixed, more) = GroupCommit::start_shared(work, shape(1, writers, writers + 1));
        handles.extend(more);
        (
            Ingestor {
                one_org,
                mixed: Some(mixed),
            },
            handles,
        )
    }

    /// Every org of a group once, after its commit.
    async fn advise(
        &self,
        results: &[RequestOutcome],
    ) -> StoreResult<HashMap<String, Arc<OrgAdvice>>> {
        let mut ids: Vec<&str> = results
            .iter()
            .flatten()
            .flatten()
            .map(|o| o.org_id.as_str())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        // Meter time, not wall time: what matters is how much agent time can pass.
        let now = self.clock.now();
        let mut advice = HashMap::with_capacity(ids.len());
        let mut missing = Vec::new();
        {
            let cache = self.advice_cache();
            for id in ids {
                match cache.get(id) {
                    Some((a, until)) if *until > now => {
                        advice.insert(id.to_owned(), Arc::clone(a));
                    }
                    _ => missing.push(id),
                }
            }
        }
        if missing.is_empty() {
            return Ok(advice);
        }
        let fresh = standings(&self.db, &self.plans, &missing, now, &self.rules).await?;
        self.auto_topups.consider_all(&fresh).await;
        let mut rooms = self.member_rooms(&fresh, now).await?;
        let mut waits = Vec::new();
        {
            let mut cache = self.advice_cache();
            if cache.len() > 100_000 {
                cache.retain(|_, (_, until)| *until > now);
            }
            for s in fresh {
                self.watch.observe(&s);
                let park = s.must_park();
                let a = Arc::new(OrgAdvice {
                    remaining_seconds: s.remaining_seconds(),
                    park,
                    why: park.then(|| park_reason(&s)).flatten(),
                    members: rooms.remove(&s.org.org_id).unwrap_or_default(),
                });
                // Near a notification or auto top-up threshold, read fresh too, so the commit
                // that crosses it is the one that sees it. Below its auto top-up threshold
                // the org was looked at just now (`consider_all`): a pack opened, or its
                // month is full.
                let crossing = s.org.auto_topup.room_to_crossing(&s.funding, s.at);
                let room = a
                    .least_room()
                    .min(self.watch.room(&s))
                    .min(if crossing > 0 { crossing } else { i64::MAX });
                if reusable(room, s.running) {
                    cache.insert(s.org.org_id.clone(), (Arc::clone(&a), now + ADVICE_TTL));
                } else {
                    cache.remove(&s.org.org_id);
                }
                if let Some((reason, resume_at, members)) = a
                    .wait(&s)
                    .filter(|_| self.watch.wait_due(&s.org.org_id, now))
                {
                    waits.push(RoomWait {
                        org_id: s.org.org_id.clone(),
                        since: now,
                        reason: reason.as_str().to_owned(),
                        resume_at,
                        plan_id: s.plan.id.clone(),
                        plan_version: s.plan.version,
                        members,
                    });
                }
                advice.insert(s.org.org_id, a);
            }
        }
        // Orgs whose sessions park for want of room wait for it (`notifier`): a keyed row,
        // so another instance's record of the same wait changes nothing.
        for w in waits {
            if let Err(e) = self.db.note_room_wait(&w).await {
                tracing::warn!(error = %e, org_id = %w.org_id, "recording a wait for room failed; will retry on a later heartbeat");
                self.watch.forget_wait(&w.org_id);
            }
        }
        Ok(advice)
    }

    /// The advice cache, even after a group panicked holding it (its writer goes on,
    /// `group_commit::writer`): a map left whole by any panic, at worst an entry short.
    fn advice_cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Arc<OrgAdvice>, Secs)>> {
        self.advice
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The advice last read for each org of a group, however old: what a committed group
    /// is answered with when its fresh read fails. An org never read gets `OrgAdvice::NONE`
    /// (park), erring on the side of its spend cap; the next heartbeat reads it again.
    fn last_advice(&self, results: &[RequestOutcome]) -> HashMap<String, Arc<OrgAdvice>> {
        let cache = self.advice_cache();
        results
            .iter()
            .flatten()
            .flatten()
            .filter_map(|o| {
                let (advice, _) = cache.get(o.org_id.as_str())?;
                Some((o.org_id.clone(), Arc::clone(advice)))
            })
            .collect()
    }

    /// The room of the members each org limits (orgs that limit none are absent, and cost
    /// no statement: their rows say so).
    async fn member_rooms(
        &self,
        fresh: &[Standing],
        now: Secs,
    ) -> StoreResult<HashMap<String, BTreeMap<(Dimension, String), MemberRoom>>> {
        let limited: Vec<&Standing> = fresh.iter().filter(|s| s.org.sets_limits).collect();
        if limited.is_empty() {
            return Ok(HashMap::new());
        }
        let orgs: Vec<&Org> = limited.iter().map(|s| &s.org).collect();
        let mut found = self.db.limits_with_usage(&orgs, now, &self.rules).await?;
        Ok(limited
            .into_iter()
            .filter_map(|s| {
                let (limits, used) = found.remove(&s.org.org_id)?;
                let rooms = members::rooms(&limits, &used, s.plan.ceiling_grace_seconds);
                Some((s.org.org_id.clone(), rooms))
            })
            .collect())
    }
}

impl Work for Ingest {
    type Job = Vec<Heartbeat>;
    type Done = Answer;

    fn weight(job: &Vec<Heartbeat>) -> usize {
        job.len()
    }

    fn lane(job: &Vec<Heartbeat>) -> impl std::hash::Hash {
        job.first().map(|h| h.org_id.to_string())
    }

    async fn commit(
        &self,
        jobs: &[Vec<Heartbeat>],
        writer: usize,
        _written: Option<Written>,
    ) -> StoreResult<Vec<Answer>> {
        let started = std::time::Instant::now();
        let now = self.clock.now();
        self.activity.touch();
        let results = self
            .db
            .ingest(jobs, &self.rules, &self.plans, now, writer as i64)
            .await?;
        self.metrics
            .observe_ingest_group(&results, started.elapsed());
        // The heartbeats are committed: from here the group is answered, never failed (a
        // failed group's jobs are run again one by one, and their callers would be told
        // `duplicate` for what their own group booked).
        let advice = match self.advise(&results).await {
            Ok(advice) => advice,
            Err(e) => {
                tracing::warn!(error = %e, "org advice unread after a heartbeat commit; answering from the last advice read");
                self.last_advice(&results)
            }
        };
        let advice = Arc::new(advice);
        Ok(results
            .into_iter()
            .map(|r| (r, Arc::clone(&advice)))
            .collect())
    }

    fn db(&self) -> &Db {
        &self.db
    }
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
