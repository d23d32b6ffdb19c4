//! The run's progress bar, ticking four times a second.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Fleet;

pub(super) fn progress_bar(
    fleet: &Arc<Fleet>,
) -> (indicatif::ProgressBar, tokio::task::JoinHandle<()>) {
    let secs = fleet.opts.duration.as_secs();
    let bar = if fleet.opts.progress {
        indicatif::ProgressBar::new(secs)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} s  {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    let (b, f) = (bar.clone(), fleet.clone());
    let started = Instant::now();
    let ticker = tokio::spawn(async move {
        loop {
            let c = &f.counters;
            b.set_position(started.elapsed().as_secs().min(secs));
            b.set_message(format!(
                "running {} · parked {} · beats {} acked · {} denied · {} retries",
                c.live_running.load(Ordering::Relaxed),
                c.live_parked.load(Ordering::Relaxed),
                c.beats_acked.load(Ordering::Relaxed),
                f.denials.lock().unwrap().values().sum::<u64>(),
                c.retries.load(Ordering::Relaxed),
            ));
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    (bar, ticker)
}
