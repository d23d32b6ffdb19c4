//! The HTTP surface: routes, auth, errors, and the layers every request passes through.

use std::ops::Deref;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderName, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::Router;
use tower::ServiceBuilder;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::trace::TraceLayer;

use crate::admission::Admitter;
use crate::billing::Billing;
use crate::clock::Clock;
use crate::ingest::Ingestor;
use crate::ledger::Rules;
use crate::metrics::Metrics;
use crate::plans::Plans;
use crate::store::{Db, TokenRow};

pub(crate) mod admissions;
pub mod auth;
pub mod breaker;
pub mod error;
mod export_routes;
pub mod json;
pub(crate) mod ledger_routes;
pub(crate) mod notify_routes;
pub mod openapi;
mod ops;
mod orgs;
pub(crate) mod stripe_routes;
mod usage_routes;

pub use error::{ApiError, ApiResult};

/// Everything a handler may need, shared by every request.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

pub struct Shared {
    pub db: Db,
    pub plans: Arc<Plans>,
    pub rules: Rules,
    pub clock: Clock,
    pub ingestor: Ingestor,
    pub admitter: Admitter,
    pub billing: Billing,
    /// Wakes the Stripe event job when a webhook stored a new event.
    pub stripe_wake: Arc<tokio::sync::Notify>,
    /// Per-token request rates; `None`: unlimited.
    pub rate_limiter: Option<crate::rate_limit::RateLimiter>,
    pub metrics: Arc<Metrics>,
    /// How long an export waits on a client that reads nothing.
    pub export_stall: Duration,
    /// Open while the database is known to be down: requests get 503 at once.
    pub breaker: Arc<breaker::Breaker>,
    /// Token hash to token, briefly: a token's scopes change rarely, and every request
    /// would otherwise pay a database read for them.
    pub tokens: moka::future::Cache<String, Arc<TokenRow>>,
}

impl Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// The queues and gateways in front of the store.
pub struct Workers {
    pub ingestor: Ingestor,
    pub admitter: Admitter,
    pub billing: Billing,
}

/// Bounds on what one caller may take.
pub struct Limits {
    /// Per-token request rates; `None`: unlimited.
    pub rate_limit: Option<crate::rate_limit::Limit>,
    /// How long an export waits on a client that reads nothing.
    pub export_stall: Duration,
}

/// How long a token stays cached after it was read.
pub const TOKEN_CACHE_TTL: Duration = Duration::from_secs(60);

impl AppState {
    pub fn new(
        db: Db,
        plans: Arc<Plans>,
        rules: Rules,
        clock: Clock,
        workers: Workers,
        metrics: Arc<Metrics>,
        limits: Limits,
    ) -> AppState {
        let Limits {
            rate_limit,
            export_stall,
        } = limits;
        let Workers {
            ingestor,
            admitter,
            billing,
        } = workers;
        AppState(Arc::new(Shared {
            db,
            plans,
            rules,
            clock,
            ingestor,
            admitter,
            billing,
            stripe_wake: Arc::default(),
            rate_limiter: rate_limit.map(crate::rate_limit::RateLimiter::new),
            metrics,
            breaker: Arc::default(),
            export_stall,
            tokens: moka::future::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(TOKEN_CACHE_TTL)
                .build(),
        }))
    }
}

impl AppState {
    /// The org, or the 404 every route answers for one it does not have.
    pub async fn org(&self, org_id: &str) -> ApiResult<crate::store::OrgRow> {
        self.db
            .get_org(org_id)
            .await?
            .ok_or_else(|| ApiError::org_not_found(org_id))
    }
}

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// A random id for each request that arrives without one.
#[derive(Clone, Default)]
struct RandomRequestId;

impl MakeRequestId for RandomRequestId {
    fn make_request_id<B>(&mut self, _: &axum::http::Request<B>) -> Option<RequestId> {
        let id = format!("{:016x}", rand::random::<u64>());
        Some(RequestId::new(
            id.parse().expect("hex is a valid header value"),
        ))
    }
}

/// The routes and the OpenAPI document, from the same `routes!` lists: a handler is served
/// exactly at the path its `#[utoipa::path]` documents.
pub fn routes() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    use utoipa::OpenApi;
    use utoipa_axum::{router::OpenApiRouter, routes};
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(orgs::put_org, orgs::get_org))
        .routes(routes!(orgs::put_key, orgs::get_key))
        .routes(routes!(usage_routes::get_usage))
        .routes(routes!(usage_routes::get_breakdown))
        .routes(routes!(usage_routes::get_upgrade_prompt))
        .routes(routes!(ledger_routes::post_heartbeats))
        .routes(routes!(admissions::post_admission))
        .routes(routes!(admissions::list_decisions))
        .routes(routes!(ledger_routes::get_session))
        .routes(routes!(ledger_routes::list_sessions))
        .routes(routes!(ledger_routes::end_session))
        .routes(routes!(stripe_routes::webhook))
        .routes(routes!(stripe_routes::checkout))
        .routes(routes!(stripe_routes::billing_portal))
        .routes(routes!(stripe_routes::list_events))
        .routes(routes!(stripe_routes::retry_event))
        .routes(routes!(export_routes::get_usage_export))
        .routes(routes!(export_routes::list_periods))
        .routes(routes!(export_routes::close_period))
        .routes(routes!(notify_routes::list_notifications))
        .routes(routes!(ops::healthz))
        .routes(routes!(ops::readyz))
        .routes(routes!(ops::metrics))
        .routes(routes!(ops::openapi))
        .split_for_parts()
}

pub fn router(state: AppState, max_body_bytes: usize) -> Router {
    let (routes, _) = routes();
    let api = routes
        .fallback(ops::not_found)
        .method_not_allowed_fallback(ops::method_not_allowed)
        .layer(middleware::from_fn(error::errors_as_json))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            breaker::fail_fast,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            record_metrics,
        ))
        .with_state(state);

    api.layer(
        ServiceBuilder::new()
            .layer(SetRequestIdLayer::new(REQUEST_ID, RandomRequestId))
            .layer(
                TraceLayer::new_for_http().make_span_with(|req: &axum::http::Request<_>| {
                    let id = req
                        .headers()
                        .get(REQUEST_ID)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("");
                    tracing::info_span!("request", method = %req.method(), path = %req.uri().path(), request_id = %id)
                }),
            )
            .layer(PropagateRequestIdLayer::new(REQUEST_ID)),
    )
}

async fn record_metrics(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().to_string();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_owned();
    let resp = next.run(req).await;
    let status = resp.status();
    state
        .metrics
        .observe_http(&method, &route, status.as_u16(), started.elapsed());
    if status == StatusCode::INTERNAL_SERVER_ERROR {
        tracing::error!(%route, "answered 500");
    }
    resp
}
