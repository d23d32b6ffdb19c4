//! How often a background job looks for work. On a sharded store each look at every org
//! (the expiry job's, the pay-as-you-go charges') is a statement on every shard, so an
//! instance that looks every few seconds with nothing to find keeps the workers busy for
//! nothing. A job looks at its base period while it finds work or while this instance is
//! serving traffic, and doubles its wait each time it finds none, up to a cap; the first
//! heartbeat or admission after a quiet spell brings it back to its base period.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// What this instance serves, as the paced jobs need to know it: that something happened.
#[derive(Debug, Default)]
pub struct Activity {
    /// A job is waiting past its base period: the next touch must wake it.
    waiting: AtomicBool,
    wake: Notify,
}

impl Activity {
    /// Something happened that the jobs may have work from (a heartbeat, an admission).
    /// One atomic load while no job waits past its base period, as under traffic.
    pub fn touch(&self) {
        if self.waiting.load(Ordering::Relaxed) && self.waiting.swap(false, Ordering::AcqRel) {
            self.wake.notify_waiters();
        }
    }
}

/// A job's wait between looks: `base` while there is work, doubling to `cap` while none.
/// It keeps the moment of the next look, so a `wait` raced against other events in a
/// `select!` and started again resumes the same wait.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    base: Duration,
    cap: Duration,
    current: Duration,
    next: Instant,
}

impl Pace {
    /// A pace of `base`, backing off to `cap` (not below `base`) when idle; the first look
    /// a `base` from now.
    pub fn new(base: Duration, cap: Duration) -> Pace {
        Pace {
            base,
            cap: cap.max(base),
            current: base,
            next: Instant::now() + base,
        }
    }

    /// The wait between looks as it stands.
    pub fn current(&self) -> Duration {
        self.current
    }

    /// After a look: the next one at the base period if this one found work, else after
    /// twice the last wait.
    pub fn after(&mut self, found_work: bool) {
        self.current = if found_work {
            self.base
        } else {
            (self.current * 2).min(self.cap)
        };
        self.next = Instant::now() + self.current;
    }

    /// Until the next look; `activity` meanwhile, when given, brings it to a base period
    /// from then. The look after it is a wait later unless `after` says otherwise.
    pub async fn wait(&mut self, activity: Option<&Activity>) {
        while let Some(activity) = activity.filter(|_| self.current > self.base) {
            let woken = activity.wake.notified();
            tokio::pin!(woken);
            // Registered before the flag is raised, so a touch in between is not lost.
            woken.as_mut().enable();
            activity.waiting.store(true, Ordering::Release);
            tokio::select! {
                _ = tokio::time::sleep_until(self.next) => break,
                _ = &mut woken => {
                    self.current = self.base;
                    self.next = self.next.min(Instant::now() + self.base);
                }
            }
        }
        tokio::time::sleep_until(self.next).await;
        self.next = Instant::now() + self.current;
    }
}

/// Wait for `pace`'s next look unless `stop` changes first: false when the job is to end.
pub async fn until_next(
    pace: &mut Pace,
    activity: Option<&Activity>,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    tokio::select! {
        _ = pace.wait(activity) => true,
        _ = stop.changed() => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pace() -> Pace {
        Pace::new(Duration::from_secs(5), Duration::from_secs(60))
    }

    #[test]
    fn an_idle_job_doubles_its_wait_to_the_cap_and_work_brings_it_back() {
        let mut p = pace();
        let waits: Vec<u64> = (0..6)
            .map(|_| {
                p.after(false);
                p.current().as_secs()
            })
            .collect();
        assert_eq!(waits, [10, 20, 40, 60, 60, 60]);
        p.after(true);
        assert_eq!(p.current(), Duration::from_secs(5));
    }

    #[test]
    fn a_cap_below_the_base_is_the_base() {
        let mut p = Pace::new(Duration::from_secs(5), Duration::from_secs(1));
        p.after(false);
        assert_eq!(p.current(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn activity_cuts_a_long_wait_to_the_base_period_from_then() {
        let activity = std::sync::Arc::new(Activity::default());
        let (_keep, mut stop) = watch::channel(false);
        let mut p = pace();
        for _ in 0..4 {
            p.after(false);
        }
        assert_eq!(p.current(), Duration::from_secs(60));
        let started = Instant::now();
        let toucher = {
            let activity = std::sync::Arc::clone(&activity);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(7)).await;
                activity.touch();
            })
        };
        assert!(until_next(&mut p, Some(&activity), &mut stop).await);
        toucher.await.unwrap();
        assert_eq!(started.elapsed(), Duration::from_secs(7 + 5));
        assert_eq!(p.current(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn without_activity_the_whole_wait_is_slept_and_a_stop_ends_it() {
        let activity = Activity::default();
        let (tx, mut stop) = watch::channel(false);
        let mut p = pace();
        p.after(false);
        let started = Instant::now();
        assert!(until_next(&mut p, Some(&activity), &mut stop).await);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        tx.send(true).unwrap();
        assert!(!until_next(&mut p, Some(&activity), &mut stop).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_touch_before_a_wait_does_not_cut_it() {
        let activity = Activity::default();
        let (_keep, mut stop) = watch::channel(false);
        let mut p = pace();
        p.after(false);
        activity.touch();
        let started = Instant::now();
        assert!(until_next(&mut p, Some(&activity), &mut stop).await);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_cut_short_and_started_again_keeps_its_moment() {
        let activity = Activity::default();
        let mut p = pace();
        let started = Instant::now();
        let cut = tokio::time::timeout(Duration::from_secs(2), p.wait(Some(&activity))).await;
        assert!(cut.is_err(), "the first wait is cut at 2 s");
        p.wait(Some(&activity)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }
}
