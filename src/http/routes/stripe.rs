//! Stripe's webhook, the admin view of its events, and checkout and portal links.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Json;
use rush_meter_core::signature;
use rush_meter_core::time::{format_rfc3339, rfc3339, Secs};
use secrecy::ExposeSecret;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::billing::checkout::{self, Change};
use crate::billing::events::EventState;
use crate::http::auth::Principal;
use crate::http::error::parse_id;
use crate::http::extract::{named_param, JsonBody, OrgPath, Page, Query};
use crate::http::openapi::{BadBody, BadId, BadPath, BadQuery, Guarded, StripeCalls, Unsigned};
use crate::http::{ApiError, ApiResult, AppState};
use crate::store::StripeEventRow;
use crate::tokens::Scope;

/// `POST /v1/stripe/webhook`: verify the signature, store the raw event (a redelivery is a
/// no-op), answer 200, then process it in the background. Authenticated by the signature
/// alone: an unsigned body is a 400 and stores nothing. A signed one that cannot be
/// processed as sent is stored quarantined and acknowledged (`billing::events::arrival`).
#[utoipa::path(post, path = "/v1/stripe/webhook", tag = "billing",
    params(("Stripe-Signature" = String, Header,
        description = "`t=<unix time>,v1=<HMAC-SHA256 hex>` as Stripe signs")),
    request_body(content = Object, description = "A Stripe event, as Stripe sends it"),
    responses((status = 200, description = "Stored (or already stored)", body = Received),
        Unsigned))]
pub async fn webhook(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<Received>> {
    let cfg = &state.billing.config;
    if cfg.webhook_secrets.is_empty() {
        return Err(ApiError::webhooks_off());
    }
    let secrets: Vec<String> = cfg
        .webhook_secrets
        .iter()
        .map(|s| s.expose_secret().to_owned())
        .collect();
    let header = headers
        .get("stripe-signature")
        .and_then(|v| v.to_str().ok());
    let now = state.clock.now();
    signature::verify(header, &body, &secrets, now, cfg.webhook_tolerance_secs).map_err(|e| {
        state.metrics.stripe_webhooks_refused.inc();
        ApiError::from(e)
    })?;
    let event = crate::billing::events::arrival(&body, now);
    let stored = state.receive_stripe_event(&event).await?;
    Ok(Json(Received {
        received: true,
        duplicate: !stored,
    }))
}

#[derive(Serialize, ToSchema)]
pub struct Received {
    received: bool,
    /// The event was stored before: a redelivery, which changes nothing.
    duplicate: bool,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Only events in this state; default all.
    #[param(value_type = Option<EventState>)]
    state: Option<String>,
    /// `next_cursor` of the page before.
    cursor: Option<String>,
    /// 1 to 1000; default 100.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
}

#[derive(Serialize, ToSchema)]
pub struct EventPage {
    events: Vec<EventView>,
    /// Pass as `cursor` for the next page; `null` on the last one.
    next_cursor: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct EventView {
    event_id: String,
    #[serde(rename = "type")]
    kind: String,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    created: Secs,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    received_at: Secs,
    #[schema(value_type = EventState)]
    state: String,
    attempts: i64,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    next_attempt_at: Secs,
    last_error: Option<String>,
    org_id: Option<String>,
    /// The API version Stripe rendered the event in (`null` for events stored before it
    /// was recorded).
    api_version: Option<String>,
}

impl From<StripeEventRow> for EventView {
    fn from(e: StripeEventRow) -> Self {
        EventView {
            event_id: e.event_id,
            kind: e.kind,
            created: e.created,
            received_at: e.received_at,
            state: e.state,
            attempts: e.attempts,
            next_attempt_at: e.next_attempt_at,
            last_error: e.last_error,
            org_id: e.org_id,
            api_version: e.api_version,
        }
    }
}

/// `GET /v1/admin/stripe/events?state=quarantined&cursor=&limit=`: newest first.
#[utoipa::path(get, path = "/v1/admin/stripe/events", tag = "admin", security(("bearer" = ["admin"])),
    params(EventsQuery),
    responses((status = 200, description = "A page of Stripe events, newest first",
        body = EventPage), Guarded, BadQuery))]
pub async fn list_events(
    State(state): State<AppState>,
    principal: Principal,
    query: Query<EventsQuery>,
) -> ApiResult<Json<EventPage>> {
    principal.require_any(&[Scope::Admin])?;
    principal.require_unbound("Stripe's event queue")?;
    let q = query.read()?;
    let only = named_param("state", q.state.as_deref(), EventState::parse_named)?;
    let page = Page::of(q.cursor.as_deref(), q.limit)?;
    let rows = state
        .stripe_events(only, page.after.clone(), page.limit)
        .await?;
    let next = page.next(&rows, |r| (r.received_at, r.event_id.as_str()));
    let events: Vec<EventView> = rows.into_iter().map(EventView::from).collect();
    Ok(Json(EventPage {
        events,
        next_cursor: next,
    }))
}

/// `POST /v1/admin/stripe/events/{event_id}/retry`: put a quarantined event back in the
/// queue, once its cause is fixed.
#[utoipa::path(post, path = "/v1/admin/stripe/events/{event_id}/retry", tag = "admin",
    security(("bearer" = ["admin"])),
    params(("event_id" = String, Path, description = "Stripe's event id, `evt_…`")),
    responses((status = 200, description = "Queued again", body = Requeued),
        (status = 404, description = "`not_found`: no quarantined event by that id",
            body = crate::http::error::ErrorBody),
        (status = 422, description = "`invalid_value`: not an id this service keeps (one line, at most 255 characters)",
            body = crate::http::error::ErrorBody),
        Guarded, BadPath))]
pub async fn retry_event(
    State(state): State<AppState>,
    principal: Principal,
    Path(event_id): Path<String>,
) -> ApiResult<Json<Requeued>> {
    principal.require_any(&[Scope::Admin])?;
    principal.require_unbound("Stripe's event queue")?;
    if rush_meter_core::text::Text::Line
        .check(&event_id, crate::billing::events::EVENT_ID_MAX)
        .is_err()
    {
        return Err(ApiError::invalid(
            "event_id",
            "event_id is not one this service keeps: one line of at most 255 characters",
        ));
    }
    state.requeue_stripe_event(&event_id).await?;
    Ok(Json(Requeued {
        event_id,
        state: "pending",
    }))
}

#[derive(Serialize, ToSchema)]
pub struct Requeued {
    event_id: String,
    /// `pending`.
    state: &'static str,
}

#[derive(Deserialize, ToSchema)]
pub struct CheckoutBody {
    /// The plan to move to, as in `plans/*.toml`.
    #[schema(example = "pro")]
    plan: String,
}

/// What a checkout did, by `action`.
#[derive(Serialize, ToSchema)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum CheckoutOutcome {
    /// No live subscription: pay at `url`, a Stripe Checkout Session.
    Checkout {
        plan: String,
        url: String,
        session_id: String,
    },
    /// An upgrade, made at once (prorated).
    Changed {
        plan: String,
        subscription_status: Option<String>,
        stripe_subscription_id: Option<String>,
    },
    /// A downgrade, made when the period ends at `at`.
    Scheduled {
        plan: String,
        #[schema(value_type = String, format = DateTime)]
        at: String,
    },
}

#[derive(Serialize, ToSchema)]
pub struct PortalLink {
    /// Stripe's customer portal for this org.
    url: String,
}

/// `POST /v1/orgs/{org_id}/checkout {"plan": "pro"}`: without a subscription, a Stripe
/// Checkout Session to pay in (`url`); with one, an upgrade made at once (prorated) or a
/// downgrade made when the period ends.
#[utoipa::path(post, path = "/v1/orgs/{org_id}/checkout", tag = "billing",
    params(OrgPath), security(("bearer" = ["console", "admin"])), request_body = CheckoutBody,
    responses((status = 200, description = "What was done, by `action`", body = CheckoutOutcome),
        Guarded, BadBody, BadId, StripeCalls))]
pub async fn checkout(
    State(state): State<AppState>,
    principal: Principal,
    Path(OrgPath { org_id }): Path<OrgPath>,
    JsonBody(body): JsonBody<CheckoutBody>,
) -> ApiResult<Json<CheckoutOutcome>> {
    principal.require_any(&[Scope::Console])?;
    let org_id = parse_id("org_id", &org_id)?;
    principal.check_org(org_id.as_str())?;
    let target = state.plans.get(&body.plan).ok_or_else(|| {
        let names: Vec<&str> = state.plans.iter().map(|p| p.id.as_str()).collect();
        ApiError::invalid(
            "plan",
            format!("no plan `{}`; plans: {}", body.plan, names.join(", ")),
        )
    })?;
    let org = state.org(org_id.as_str()).await?;
    let change = checkout::change_plan(&state.billing, &org, target, &principal.actor()).await?;
    Ok(Json(match change {
        Change::Checkout { url, session_id } => CheckoutOutcome::Checkout {
            plan: target.id.clone(),
            url,
            session_id,
        },
        Change::Changed(org) => CheckoutOutcome::Changed {
            plan: org.plan_id,
            subscription_status: org.subscription_status,
            stripe_subscription_id: org.stripe_subscription_id,
        },
        Change::Scheduled { plan, at } => CheckoutOutcome::Scheduled {
            plan,
            at: format_rfc3339(at),
        },
    }))
}

/// `POST /v1/orgs/{org_id}/billing-portal`: a link to Stripe's customer portal.
#[utoipa::path(post, path = "/v1/orgs/{org_id}/billing-portal", tag = "billing",
    params(OrgPath), security(("bearer" = ["console", "admin"])),
    responses((status = 200, description = "The portal link", body = PortalLink),
        Guarded, BadId, StripeCalls))]
pub async fn billing_portal(
    State(state): State<AppState>,
    principal: Principal,
    Path(OrgPath { org_id }): Path<OrgPath>,
) -> ApiResult<Json<PortalLink>> {
    principal.require_any(&[Scope::Console])?;
    let org_id = parse_id("org_id", &org_id)?;
    principal.check_org(org_id.as_str())?;
    let org = state.org(org_id.as_str()).await?;
    let url = checkout::portal(&state.billing, &org).await?;
    Ok(Json(PortalLink { url }))
}
