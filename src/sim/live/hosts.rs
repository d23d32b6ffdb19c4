//! Host supervisors: each batches the beats its sessions hand it and flushes them every
//! `flush`, retrying a batch on 429 and 503 as a real supervisor would.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use super::client::{record, GIVE_UP};
use super::{now_secs, Fleet, LateBeat};
use crate::sim::Beat;

/// One heartbeat on its way to a host supervisor; `acked` hears when the meter took it.
pub(super) struct Outgoing {
    pub(super) beat: Beat,
    pub(super) acked: Option<oneshot::Sender<()>>,
}

/// A host supervisor: batches what its sessions hand it and flushes every `flush`, one
/// request in flight, retrying a batch the meter could not take yet.
pub(super) async fn host(
    fleet: Arc<Fleet>,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
) -> Result<(), String> {
    let mut held: Vec<Outgoing> = Vec::new();
    let mut open = true;
    while open || !held.is_empty() {
        let flush_at = tokio::time::Instant::now() + fleet.opts.flush;
        while open && held.len() < rush_meter_core::heartbeats::MAX_BATCH {
            tokio::select! {
                got = rx.recv() => match got {
                    Some(o) => held.push(o),
                    None => open = false,
                },
                _ = tokio::time::sleep_until(flush_at) => break,
            }
        }
        if held.is_empty() {
            continue;
        }
        let take = held.len().min(rush_meter_core::heartbeats::MAX_BATCH);
        let batch: Vec<Outgoing> = held.drain(..take).collect();
        send_batch(&fleet, batch).await?;
    }
    Ok(())
}

pub(super) async fn send_batch(fleet: &Fleet, batch: Vec<Outgoing>) -> Result<(), String> {
    let body = json!({"heartbeats": batch.iter().map(|o| {
        let b = &o.beat;
        json!({"org_id": b.org, "session_id": b.session, "vm_id": b.vm, "seq": b.seq,
               "state": b.state.as_str(),
               "sent_at": rush_meter_core::time::format_rfc3339(b.sent_at)})
    }).collect::<Vec<_>>()});
    let first_try = Instant::now();
    let first_try_secs = now_secs();
    loop {
        if first_try.elapsed() > GIVE_UP {
            return Err(format!(
                "a heartbeat batch was not taken for {} s; giving up",
                GIVE_UP.as_secs()
            ));
        }
        let started = Instant::now();
        let a = fleet.call("POST", "/v1/heartbeats", Some(&body)).await;
        let a = match a {
            Ok(a) => a,
            // Cut off: the meter may or may not have it; a resend is a no-op if it does.
            Err(_) => {
                fleet.counters.retries.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        match a.status {
            200 => {
                record(&fleet.beat_latency, started);
                let now = now_secs();
                let rules = fleet.opts.rules;
                fleet.counters.batches.fetch_add(1, Ordering::Relaxed);
                fleet
                    .counters
                    .beats_acked
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                let mut reference = fleet.reference.lock().unwrap();
                let mut late = fleet.late.lock().unwrap();
                for o in batch {
                    if now - o.beat.sent_at > rules.lease {
                        let l = late.entry(o.beat.session.clone()).or_default();
                        l.seen.push(LateBeat {
                            seq: o.beat.seq,
                            sent: o.beat.sent_at,
                            first_try: first_try_secs,
                            acked: now,
                        });
                    }
                    reference.heartbeat(&o.beat, now, &rules);
                    if let Some(tx) = o.acked {
                        let _ = tx.send(());
                    }
                }
                return Ok(());
            }
            429 | 503 => {
                fleet.counters.retries.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(a.retry_after.unwrap_or(1))).await;
            }
            s => {
                fleet
                    .counters
                    .rejected
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                return Err(format!("the meter refused a batch with {s}: {}", a.body));
            }
        }
    }
}
