//! The audit log (docs/audit.md): who changed what of an org, and of the service itself.

use axum::extract::State;
use axum::Json;
use rush_meter_core::audit::{Action, ActorKind, Entry};
use rush_meter_core::time::{rfc3339, Secs};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::http::auth::Principal;
use crate::http::extract::{time_range, OrgPath, OrgReader, Page, Query};
use crate::http::openapi::{BadId, BadQuery, Guarded};
use crate::http::{ApiResult, AppState};
use crate::tokens::Scope;

/// Who made a change.
#[derive(Serialize, ToSchema)]
pub struct ActorView {
    kind: ActorKind,
    /// The token's id (`token`); `null` otherwise.
    id: Option<String>,
    /// The token's label, what told us (`stripe`: `webhook`, `checkout cs_…`,
    /// `reconcile`), or the job or command (`system`).
    label: String,
}

/// One change: its subject's state before and after (`null` before a creation, after a
/// removal).
#[derive(Serialize, ToSchema)]
pub struct EntryView {
    entry_id: String,
    /// `""` for the service's own changes.
    org_id: String,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    at: Secs,
    actor: ActorView,
    action: Action,
    /// The org's id, `key:<id>`, `limit:<kind>:<id>`, `grant:<id>`, `overage`,
    /// `auto_topup`, `plan_version`, `token:<id>` or `period:<unix start>`.
    subject: String,
    #[schema(value_type = Option<Object>)]
    before: Option<serde_json::Value>,
    #[schema(value_type = Option<Object>)]
    after: Option<serde_json::Value>,
}

impl From<Entry> for EntryView {
    fn from(e: Entry) -> Self {
        EntryView {
            entry_id: e.entry_id,
            org_id: e.org_id,
            at: e.at,
            actor: ActorView {
                kind: e.actor.kind,
                id: e.actor.id,
                label: e.actor.label,
            },
            action: e.action,
            subject: e.subject,
            before: e.before,
            after: e.after,
        }
    }
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Default: from the first entry.
    #[param(format = DateTime)]
    from: Option<String>,
    /// Exclusive; default now.
    #[param(format = DateTime)]
    to: Option<String>,
    /// `next_cursor` of the page before.
    cursor: Option<String>,
    /// 1 to 1000; default 100.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
}

#[derive(Serialize, ToSchema)]
pub struct AuditPage {
    entries: Vec<EntryView>,
    /// Pass as `cursor` for the next page; `null` on the last one.
    next_cursor: Option<String>,
}

/// A page of `org_id`'s entries (`""`: the service's).
async fn page(state: &AppState, org_id: &str, q: AuditQuery) -> ApiResult<AuditPage> {
    let (from, to) = time_range(
        q.from.as_deref(),
        q.to.as_deref(),
        state.clock.now() + 1,
        |_| 0,
    )?;
    let page = Page::of(q.cursor.as_deref(), q.limit)?;
    let rows = state.audit(org_id, page.slice(from, to)).await?;
    let next_cursor = page.next(&rows, |e| (e.at, e.entry_id.as_str()));
    Ok(AuditPage {
        entries: rows.into_iter().map(EntryView::from).collect(),
        next_cursor,
    })
}

/// `GET /v1/orgs/{org_id}/audit?from=&to=&cursor=&limit=`: who changed what of the org —
/// its plan (by an admin or by Stripe), suspension, keys, limits, grants, pay-as-you-go
/// and tokens — oldest first (the org's console, finance, admin).
#[utoipa::path(get, path = "/v1/orgs/{org_id}/audit", tag = "audit",
    security(("bearer" = ["console", "finance", "admin"])), params(OrgPath, AuditQuery),
    responses((status = 200, description = "A page of entries, oldest first", body = AuditPage),
        Guarded, BadQuery, BadId))]
pub async fn org_audit(
    State(state): State<AppState>,
    OrgReader { org_id, .. }: OrgReader,
    query: Query<AuditQuery>,
) -> ApiResult<Json<AuditPage>> {
    let q = query.read()?;
    state.org(org_id.as_str()).await?;
    Ok(Json(page(&state, org_id.as_str(), q).await?))
}

/// `GET /v1/audit?from=&to=&cursor=&limit=`: the service's own changes — tokens for no
/// org, closed billing periods — oldest first (finance, admin).
#[utoipa::path(get, path = "/v1/audit", tag = "audit",
    security(("bearer" = ["finance", "admin"])), params(AuditQuery),
    responses((status = 200, description = "A page of entries, oldest first", body = AuditPage),
        Guarded, BadQuery))]
pub async fn service_audit(
    State(state): State<AppState>,
    principal: Principal,
    query: Query<AuditQuery>,
) -> ApiResult<Json<AuditPage>> {
    principal.require_any(&[Scope::Finance])?;
    // A token for one org reads that org's log (GET /v1/orgs/{org_id}/audit).
    principal.require_unbound("the service's own log")?;
    let q = query.read()?;
    Ok(Json(page(&state, "", q).await?))
}
