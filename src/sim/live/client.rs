//! The meter's HTTP API as the fleet calls it: answers read leniently, calls that must
//! succeed retried while the meter asks to wait.

use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::{Fleet, Outgoing};
use crate::sim::Beat;

/// How long a request is retried (429, 503, cut off) before the run gives up.
pub(super) const GIVE_UP: Duration = Duration::from_secs(120);

/// An answer the meter gave, or why there was none.
pub(super) struct Answer {
    pub(super) status: u16,
    pub(super) body: Value,
    pub(super) retry_after: Option<u64>,
}

impl Fleet {
    pub(super) async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, String> {
        let method: reqwest::Method = method.parse().expect("a method");
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.opts.url))
            .bearer_auth(&self.opts.token);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.map_err(|e| format!("{path}: {e}"))?;
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()?.parse().ok());
        let text = resp.text().await.map_err(|e| format!("{path}: {e}"))?;
        Ok(Answer {
            status,
            body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
            retry_after,
        })
    }

    /// A call that must succeed, retried while the meter asks to (429, 503) or does not
    /// answer. Every call made through it is safe to repeat: a repeated admission of the
    /// same session takes no second slot, a repeated end changes nothing.
    pub(super) async fn must(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, String> {
        let started = Instant::now();
        loop {
            let a = match self.call(method, path, body).await {
                Ok(a) => a,
                Err(e) if started.elapsed() > GIVE_UP => {
                    return Err(format!(
                        "{e}; no answer for {} s, giving up",
                        GIVE_UP.as_secs()
                    ))
                }
                Err(_) => {
                    self.counters.retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            match a.status {
                200..=299 => return Ok(a.body),
                s @ (429 | 503) if started.elapsed() > GIVE_UP => {
                    return Err(format!(
                        "{method} {path} answered {s} for {} s; giving up",
                        GIVE_UP.as_secs()
                    ))
                }
                429 | 503 => {
                    self.counters.retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_secs(a.retry_after.unwrap_or(1))).await;
                }
                s => return Err(format!("{method} {path} answered {s}: {}", a.body)),
            }
        }
    }

    pub(super) async fn admit(
        &self,
        org: &str,
        session: &str,
        agent: &str,
    ) -> Result<Option<String>, String> {
        let started = Instant::now();
        let d = self
            .must(
                "POST",
                "/v1/admissions",
                Some(
                    &json!({"org_id": org, "key_id": "k1", "session_id": session, "agent": agent}),
                ),
            )
            .await?;
        record(&self.gate_latency, started);
        if d["decision"] == "allow" {
            self.counters.allowed.fetch_add(1, Ordering::Relaxed);
            Ok(None)
        } else {
            let reason = d["reason"].as_str().unwrap_or("unknown").to_owned();
            *self
                .denials
                .lock()
                .unwrap()
                .entry(reason.clone())
                .or_default() += 1;
            Ok(Some(reason))
        }
    }

    /// Hand a beat to the session's host; `wait`: until the meter acknowledged it.
    pub(super) async fn beat(&self, host: usize, beat: Beat, wait: bool) {
        self.counters.beats_sent.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let out = Outgoing {
            beat,
            acked: wait.then_some(tx),
        };
        if self.hosts[host].send(out).is_ok() && wait {
            let _ = rx.await;
        }
    }
}

pub(super) fn record(latencies: &Mutex<Vec<u32>>, started: Instant) {
    let micros = started.elapsed().as_micros().min(u32::MAX as u128) as u32;
    latencies.lock().unwrap().push(micros);
}
