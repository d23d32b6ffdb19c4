//! The HTTP surface: routes by resource (`routes/`), the extractors every handler takes
//! (`extract`, `auth`), the error format and every mapping to it (`error`), the OpenAPI
//! document, and the layers every request passes through.

use std::ops::Deref;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower::ServiceBuilder;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::set_header::SetResponseHeaderLayer;
use tower_http::trace::TraceLayer;

use rush_meter_core::time::Secs;

use crate::app::{App, Services};
use crate::config::Config;
use crate::store::TokenRow;

pub mod auth;
pub mod connections;
pub mod error;
pub mod extract;
pub mod openapi;
pub mod rate_limit;
pub mod routes;
pub mod views;

pub use error::{ApiError, ApiResult};

/// Everything a handler may need, shared by every request.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

pub struct Shared {
    pub services: Services,
    /// Per-token request rates; `None`: unlimited.
    pub rate_limiter: Option<rate_limit::RateLimiter>,
    /// How long an export waits on a client that reads nothing.
    pub export_stall: Duration,
    /// Token hash and freshness epoch (`auth::TOKEN_FRESH_SECS`) to token: a token is
    /// read from the database once an epoch, not once a request.
    pub tokens: moka::future::Cache<(String, Secs), Arc<TokenRow>>,
    /// Hashes of the tokens this instance revoked: refused at once, whatever the cache
    /// holds (a read in flight when the revocation committed may cache the row before it).
    pub revoked_here: std::sync::RwLock<std::collections::HashSet<String>>,
}

impl Deref for AppState {
    type Target = Services;

    fn deref(&self) -> &Services {
        &self.0.services
    }
}

/// How long a token stays in memory (its epoch says whether it is fresh): a bound on the
/// cache's memory, not on how long a revoked token is honoured.
pub const TOKEN_CACHE_TTL: Duration = Duration::from_secs(10);

/// Bounds on what one caller may take, from the configuration.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub rate_limit: Option<crate::config::RateLimit>,
    pub export_stall: Duration,
}

impl Limits {
    pub fn of(config: &Config) -> Limits {
        Limits {
            max_body_bytes: config.max_body_bytes,
            rate_limit: config.rate_limit,
            export_stall: config.export_stall,
        }
    }
}

impl AppState {
    pub fn new(services: Services, limits: Limits) -> AppState {
        AppState(Arc::new(Shared {
            services,
            rate_limiter: limits.rate_limit.map(rate_limit::RateLimiter::new),
            export_stall: limits.export_stall,
            tokens: moka::future::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(TOKEN_CACHE_TTL)
                .build(),
            revoked_here: Default::default(),
        }))
    }

    pub fn shared(&self) -> &Shared {
        &self.0
    }
}

/// Serve `app` on `listener` with the configuration's limits until `shutdown` resolves.
pub async fn serve(
    app: App,
    config: &Config,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = router(
        AppState::new(app.services.clone(), Limits::of(config)),
        config.max_body_bytes,
    );
    let listener = connections::CappedListener::new(
        listener,
        config.max_connections,
        config.idle_connection,
        app.services.metrics.connections.clone(),
    );
    app.serve(listener, router, shutdown).await
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
/// exactly at the path its `#[utoipa::path]` documents. Deprecated routes are served (and
/// documented as deprecated) until they are removed.
#[allow(deprecated)]
pub fn api() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    use routes::*;
    use utoipa::OpenApi;
    use utoipa_axum::{router::OpenApiRouter, routes};
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(me::me))
        .routes(routes!(me::member_usage))
        .routes(routes!(tokens::list_tokens, tokens::create_token))
        .routes(routes!(tokens::revoke_token))
        .routes(routes!(orgs::list_orgs))
        .routes(routes!(orgs::put_org, orgs::get_org))
        .routes(routes!(orgs::put_key, orgs::get_key))
        .routes(routes!(plans::list_plans))
        .routes(routes!(plans::post_migration))
        .routes(routes!(usage::get_usage))
        .routes(routes!(usage::get_invoice_preview))
        .routes(routes!(grants::post_grant, grants::list_grants))
        .routes(routes!(grants::void_grant))
        .routes(routes!(overage::get_overage, overage::put_overage))
        .routes(routes!(overage::list_charges))
        .routes(routes!(overage::retry_charges))
        .routes(routes!(topups::post_topup))
        .routes(routes!(
            auto_topup::get_auto_topup,
            auto_topup::put_auto_topup
        ))
        .routes(routes!(limits::list_limits))
        .routes(routes!(limits::put_limit, limits::delete_limit))
        .routes(routes!(usage::get_breakdown))
        .routes(routes!(usage::get_upgrade_prompt))
        .routes(routes!(heartbeats::post_heartbeats))
        .routes(routes!(admissions::post_admission))
        .routes(routes!(admissions::list_decisions))
        .routes(routes!(sessions::get_session))
        .routes(routes!(sessions::get_org_session))
        .routes(routes!(sessions::end_org_session))
        .routes(routes!(sessions::list_sessions))
        .routes(routes!(sessions::end_session))
        .routes(routes!(stripe::webhook))
        .routes(routes!(stripe::checkout))
        .routes(routes!(stripe::billing_portal))
        .routes(routes!(stripe::list_events))
        .routes(routes!(stripe::retry_event))
        .routes(routes!(exports::get_usage_export))
        .routes(routes!(exports::list_periods))
        .routes(routes!(exports::close_period))
        .routes(routes!(notifications::list_notifications))
        .routes(routes!(audit::org_audit))
        .routes(routes!(audit::service_audit))
        .routes(routes!(ops::healthz))
        .routes(routes!(ops::readyz))
        .routes(routes!(ops::metrics))
        .routes(routes!(ops::openapi))
        .routes(routes!(console::page))
        .routes(routes!(console::script))
        .routes(routes!(console::style))
        .split_for_parts()
}

pub fn router(state: AppState, max_body_bytes: usize) -> Router {
    let (routes, _) = api();
    let api = routes
        .fallback(routes::ops::not_found)
        .method_not_allowed_fallback(routes::ops::method_not_allowed)
        .layer(middleware::from_fn(error::errors_as_json))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(middleware::from_fn_with_state(state.clone(), fail_fast))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            record_metrics,
        ))
        // Nothing that holds data is kept by a browser or a proxy: every answer but the
        // console's assets (which set their own) says `no-store`; outermost, so that the
        // breaker's 503s say it too.
        .layer(SetResponseHeaderLayer::if_not_present(
            header::CACHE_CONTROL,
            HeaderValue::from_static("no-store"),
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
                    // `route` and `org_id` are filled in once the request is routed
                    // (`record_metrics`); every line logged inside carries them.
                    tracing::info_span!("request", method = %req.method(), path = %req.uri().path(),
                        request_id = %id, route = tracing::field::Empty, org_id = tracing::field::Empty)
                })
                // Failures are logged by `record_metrics`, once, with their route.
                .on_failure(()),
            )
            .layer(PropagateRequestIdLayer::new(REQUEST_ID)),
    )
}

/// Count the request in the metrics and log one line for it (`rush_meter::access`: at
/// info, or warn for a 5xx, with its status and latency; the request span adds its id,
/// route and org).
async fn record_metrics(State(state): State<AppState>, req: Request, next: Next) -> Response {
    use axum::RequestPartsExt as _;
    let started = Instant::now();
    let method = req.method().to_string();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_owned();
    let (mut parts, body) = req.into_parts();
    let span = tracing::Span::current();
    span.record("route", route.as_str());
    if let Ok(params) = parts.extract::<axum::extract::RawPathParams>().await {
        if let Some((_, org)) = params.iter().find(|(name, _)| *name == "org_id") {
            span.record("org_id", org);
        }
    }
    let resp = next.run(Request::from_parts(parts, body)).await;
    let status = resp.status();
    let elapsed = started.elapsed();
    state
        .metrics
        .observe_http(&method, &route, status.as_u16(), elapsed);
    let latency_ms = elapsed.as_secs_f64() * 1e3;
    if status.is_server_error() {
        tracing::warn!(target: "rush_meter::access", status = status.as_u16(), latency_ms, "request failed");
    } else {
        tracing::info!(target: "rush_meter::access", status = status.as_u16(), latency_ms, "request");
    }
    if status == StatusCode::INTERNAL_SERVER_ERROR {
        tracing::error!(%route, "answered 500");
    }
    resp
}

/// Set on every 503 that says the database is unreachable.
#[derive(Clone, Copy, Debug)]
pub struct DatabaseUnreachable;

/// Routes that answer without the database, or must say how it is. The console's page
/// loads during an outage, and shows the API's 503s.
fn exempt(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics" | "/openapi.json")
        || path == "/console"
        || path.starts_with("/console/")
}

/// Refuse at once while the breaker is open (`app::breaker`); report every
/// unreachable-database 503 to it.
async fn fail_fast(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if state.breaker.is_open() && !exempt(req.uri().path()) {
        return ApiError::unavailable().into_response();
    }
    let resp = next.run(req).await;
    if resp.extensions().get::<DatabaseUnreachable>().is_some() {
        state.breaker.suspect();
    }
    resp
}
