//! Prometheus metrics, served as text at `/metrics`. What each one means is in
//! docs/operations.md.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use rush_meter_core::heartbeats::RequestOutcome;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: String,
    pub route: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: String,
}

/// Count one of `family`'s results (`stripe_events`, `notifications`, `auto_topups`).
pub fn count(family: &Family<ResultLabels, Counter>, result: &str) {
    family
        .get_or_create(&ResultLabels {
            result: result.to_owned(),
        })
        .inc();
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabels {
    pub api_version: String,
}

pub struct Metrics {
    registry: Registry,
    pub http_requests: Family<HttpLabels, Counter>,
    pub http_duration: Family<RouteLabels, Histogram>,
    pub heartbeats: Family<ResultLabels, Counter>,
    pub ingest_group_requests: Histogram,
    pub ingest_commit_seconds: Histogram,
    pub sessions_expired: Counter,
    pub session_ends: Counter,
    pub decisions: Family<DecisionLabels, Counter>,
    pub stripe_webhooks_refused: Counter,
    pub overage_charges_failed: Counter,
    pub stripe_events: Family<ResultLabels, Counter>,
    pub stripe_event_versions_other: Family<VersionLabels, Counter>,
    pub notifications: Family<ResultLabels, Counter>,
    pub auto_topups: Family<ResultLabels, Counter>,
    /// 1 while the database breaker is open (set when scraped).
    pub breaker_open: Gauge,
    pub connections: ConnectionMetrics,
}

/// What `http::connections` counts: open client connections, and those closed idle.
#[derive(Clone, Debug, Default)]
pub struct ConnectionMetrics {
    pub open: Gauge,
    pub idle_closed: Counter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub decision: String,
    pub reason: String,
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 14))
}

/// `metric`, registered under `name` with its `help`.
fn registered<M>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M
where
    M: prometheus_client::metrics::TypedMetric
        + prometheus_client::encoding::EncodeMetric
        + Clone
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    registry.register(name, help, metric.clone());
    metric
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("rush_meter");
        let http_requests = registered(
            &mut registry,
            "http_requests",
            "HTTP requests answered, by method, route template and status",
            Family::<HttpLabels, Counter>::default(),
        );
        let http_duration = registered(
            &mut registry,
            "http_request_duration_seconds",
            "Time from request to response, by route template",
            Family::<RouteLabels, Histogram>::new_with_constructor(
                latency_histogram as fn() -> Histogram,
            ),
        );
        let heartbeats = registered(
            &mut registry,
            "heartbeats",
            "Heartbeats by result: applied, duplicate (repeated or overtaken seq), rejected (its request was refused)",
            Family::<ResultLabels, Counter>::default(),
        );
        let ingest_group_requests = registered(
            &mut registry,
            "ingest_group_requests",
            "Heartbeat requests committed together in one transaction",
            Histogram::new(exponential_buckets(1.0, 2.0, 12)),
        );
        let ingest_commit_seconds = registered(
            &mut registry,
            "ingest_commit_seconds",
            "Time to apply and commit one group of heartbeat requests",
            latency_histogram(),
        );
        let sessions_expired = registered(
            &mut registry,
            "sessions_expired",
            "Sessions changed by the expiry job (silent past the lease, or parked 7 days)",
            Counter::default(),
        );
        let session_ends = registered(
            &mut registry,
            "session_ends",
            "Session end requests that closed a session",
            Counter::default(),
        );
        let decisions = registered(
            &mut registry,
            "decisions",
            "Gate decisions, by decision (allow, deny) and reason (empty for allow)",
            Family::<DecisionLabels, Counter>::default(),
        );
        let stripe_webhooks_refused = registered(
            &mut registry,
            "stripe_webhooks_refused",
            "Stripe webhook deliveries refused for their signature (wrong secret, tampered, or older than the tolerance)",
            Counter::default(),
        );
        let overage_charges_failed = registered(
            &mut registry,
            "overage_charges_failed",
            "Pay-as-you-go charges given up after their tries (alert on any): each waits for POST /v1/orgs/{org_id}/overage/charges/retry",
            Counter::default(),
        );
        let stripe_events = registered(
            &mut registry,
            "stripe_events",
            "Stripe events processed, by result: processed, ignored, retry, quarantined (alert on quarantined)",
            Family::<ResultLabels, Counter>::default(),
        );
        let stripe_event_versions_other = registered(
            &mut registry,
            "stripe_event_versions_other",
            "Stripe webhook events rendered in another API version than the one the service sends (Stripe-Version), by that version: the endpoint's version should be changed to match (docs/billing.md)",
            Family::<VersionLabels, Counter>::default(),
        );
        let notifications = registered(
            &mut registry,
            "notifications",
            "Usage-threshold notifications, by result: recorded, sent, retry, failed (alert on failed)",
            Family::<ResultLabels, Counter>::default(),
        );
        let auto_topups = registered(
            &mut registry,
            "auto_topups",
            "Auto top-up packs, by result: opened, paid, declined (retried later), given_up (auto top-up turned off: alert on any)",
            Family::<ResultLabels, Counter>::default(),
        );
        let breaker_open = registered(
            &mut registry,
            "breaker_open",
            "1 while the database is unreachable and requests that need it are answered 503 at once (app::breaker); 0 otherwise",
            Gauge::default(),
        );
        let connections = ConnectionMetrics::default();
        registry.register(
            "http_connections_open",
            "Client connections open; at RUSH_METER_MAX_CONNECTIONS the instance accepts no more until one closes",
            connections.open.clone(),
        );
        registry.register(
            "http_connections_idle_closed",
            "Client connections closed after RUSH_METER_IDLE_CONNECTION_SECS without a byte either way",
            connections.idle_closed.clone(),
        );
        Metrics {
            connections,
            breaker_open,
            notifications,
            auto_topups,
            stripe_webhooks_refused,
            overage_charges_failed,
            stripe_events,
            stripe_event_versions_other,
            decisions,
            registry,
            http_requests,
            http_duration,
            heartbeats,
            ingest_group_requests,
            ingest_commit_seconds,
            sessions_expired,
            session_ends,
        }
    }
}

impl Metrics {
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    pub fn observe_http(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        self.http_requests
            .get_or_create(&HttpLabels {
                method: method.to_owned(),
                route: route.to_owned(),
                status,
            })
            .inc();
        self.http_duration
            .get_or_create(&RouteLabels {
                route: route.to_owned(),
            })
            .observe(elapsed.as_secs_f64());
    }

    pub fn observe_decision(&self, decision: &str, reason: Option<&str>) {
        self.decisions
            .get_or_create(&DecisionLabels {
                decision: decision.to_owned(),
                reason: reason.unwrap_or("").to_owned(),
            })
            .inc();
    }

    pub fn observe_ingest_group(&self, results: &[RequestOutcome], elapsed: Duration) {
        self.ingest_group_requests.observe(results.len() as f64);
        self.ingest_commit_seconds.observe(elapsed.as_secs_f64());
        let (mut applied, mut duplicate, mut rejected) = (0, 0, 0);
        for r in results {
            match r {
                Ok(outs) => {
                    let dups = outs.iter().filter(|o| o.duplicate).count() as u64;
                    duplicate += dups;
                    applied += outs.len() as u64 - dups;
                }
                Err(_) => rejected += 1,
            }
        }
        for (result, n) in [
            ("applied", applied),
            ("duplicate", duplicate),
            ("rejected_requests", rejected),
        ] {
            if n > 0 {
                self.heartbeats
                    .get_or_create(&ResultLabels {
                        result: result.to_owned(),
                    })
                    .inc_by(n);
            }
        }
    }
}
