//! The record of usage-threshold notifications, for support and operators.

use axum::extract::State;
use axum::Json;
use rush_meter_core::time::{rfc3339, Secs};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::app::notifier::DeliveryState;
use crate::http::auth::Principal;
use crate::http::error::parse_id;
use crate::http::extract::{named_param, Page, Query};
use crate::http::openapi::{BadQuery, Guarded};
use crate::http::{ApiResult, AppState};
use crate::tokens::Scope;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only this org's.
    #[param(schema_with = crate::http::openapi::strings::id)]
    org_id: Option<String>,
    /// Only notifications in this state; default all.
    #[param(value_type = Option<DeliveryState>)]
    state: Option<String>,
    /// 1 to 1000; default 100.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
}

#[derive(Serialize, ToSchema)]
pub struct NotificationList {
    notifications: Vec<NotificationView>,
}

#[derive(Serialize, ToSchema)]
pub struct NotificationView {
    notification_id: String,
    org_id: String,
    /// What it is about: `month`, `week`, `cap`, `grant_used_up:<grant_id>` or
    /// `grant_expiring:<grant_id>`.
    window: String,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    window_start: Secs,
    threshold_percent: i64,
    #[schema(value_type = DeliveryState)]
    state: String,
    attempts: i64,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    next_attempt_at: Secs,
    last_error: Option<String>,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    created_at: Secs,
    #[serde(with = "rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    sent_at: Option<Secs>,
    /// The JSON that is sent.
    body: serde_json::Value,
}

/// `GET /v1/admin/notifications?org_id=&state=pending|sent|failed&limit=`: newest first.
#[utoipa::path(get, path = "/v1/admin/notifications", tag = "admin", security(("bearer" = ["admin"])),
    params(ListQuery),
    responses((status = 200, description = "Threshold notifications and their delivery",
        body = NotificationList), Guarded, BadQuery))]
pub async fn list_notifications(
    State(state): State<AppState>,
    principal: Principal,
    query: Query<ListQuery>,
) -> ApiResult<Json<NotificationList>> {
    principal.require_any(&[Scope::Admin])?;
    let q = query.read()?;
    let only = named_param("state", q.state.as_deref(), DeliveryState::parse_named)?;
    if let Some(org) = q.org_id.as_deref() {
        parse_id("org_id", org)?;
        principal.check_org(org)?;
    }
    let limit = Page::of(None, q.limit)?.limit;
    // A token bound to an org lists that org's notifications only.
    let org = q.org_id.as_deref().or(principal.bound_org());
    let rows = state.notifications(org, only, limit).await?;
    let items: Vec<NotificationView> = rows
        .into_iter()
        .map(|r| NotificationView {
            body: serde_json::from_str(&r.body).unwrap_or(serde_json::Value::String(r.body)),
            notification_id: r.notification_id,
            org_id: r.org_id,
            window: r.window_kind,
            window_start: r.window_start,
            threshold_percent: r.threshold,
            state: r.state,
            attempts: r.attempts,
            next_attempt_at: r.next_at,
            last_error: r.last_error,
            created_at: r.created_at,
            sent_at: r.sent_at,
        })
        .collect();
    Ok(Json(NotificationList {
        notifications: items,
    }))
}
