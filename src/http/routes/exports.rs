//! Finance's exports and the list of closed periods.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use axum::Json;
use rush_meter_core::export::{month_name, parse_month, By, Format};
use rush_meter_core::time::{hours, rfc3339, Interval, Secs};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::app::periods::Export;
use crate::http::auth::Principal;
use crate::http::error::parse_id;
use crate::http::extract::{named_param, Query};
use crate::http::openapi::{BadPath, BadQuery, Guarded};
use crate::http::{ApiError, ApiResult, AppState};
use crate::tokens::Scope;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ExportQuery {
    /// The month, `YYYY-MM` (UTC). An `Option` so that its absence gets the error format.
    #[param(required = true, pattern = "^[0-9]{4}-(0[1-9]|1[0-2])$")]
    period: Option<String>,
    /// One line per org (default), or per session.
    #[param(value_type = Option<By>)]
    by: Option<String>,
    /// Default `csv`.
    #[param(value_type = Option<Format>)]
    format: Option<String>,
    /// Only this org's lines; default every org's. A token bound to an org exports its
    /// own org's lines only.
    #[param(pattern = r"^[A-Za-z0-9_.-]{1,64}$")]
    org_id: Option<String>,
}

/// `GET /v1/exports/usage?period=YYYY-MM&by=org|session&format=csv|jsonl`, streamed.
/// Columns and rounding: docs/exports.md.
#[utoipa::path(get, path = "/v1/exports/usage", tag = "finance", security(("bearer" = ["finance", "admin"])),
    params(ExportQuery),
    responses(
        (status = 200, description = "The month's lines, by `org_id` then `session_id`; \
            `Rush-Period-State` says whether the month is `closed` (final) or `open`",
            headers(("Rush-Period-State" = String, description = "`closed` or `open`")),
            content(
                (String = "text/csv"),
                (String = "application/x-ndjson"),
            )),
        (status = 404, description = "`org_not_found`: no org `org_id` (or one the token is not bound to)",
            body = crate::http::error::ErrorBody),
        Guarded, BadQuery))]
pub async fn get_usage_export(
    State(state): State<AppState>,
    principal: Principal,
    query: Query<ExportQuery>,
) -> ApiResult<Response> {
    principal.require_any(&[Scope::Finance])?;
    let q = query.read()?;
    let only = match q.org_id.as_deref() {
        Some(org) => {
            let org = parse_id("org_id", org)?;
            principal.check_org(org.as_str())?;
            state.org(org.as_str()).await?;
            Some(org.into_string())
        }
        None => principal.bound_org().map(str::to_owned),
    };
    let period = q
        .period
        .as_deref()
        .ok_or_else(|| ApiError::invalid("period", "period is required, as YYYY-MM"))
        .and_then(|p| parse_month(p).map_err(|m| ApiError::invalid("period", m)))?;
    let by = named_param("by", q.by.as_deref(), By::parse_named)?.unwrap_or(By::Org);
    let format =
        named_param("format", q.format.as_deref(), Format::parse_named)?.unwrap_or(Format::Csv);
    let export = state.export(period, by, format, only).await?;
    let closed = export.closed;
    let body = stream_export(export, state.shared().export_stall, period).await?;
    let file = format!(
        "attachment; filename=\"usage-{}-{}.{}\"",
        month_name(period),
        by.as_str(),
        format.extension()
    );
    Ok((
        [
            (CONTENT_TYPE, format.content_type().to_owned()),
            (CONTENT_DISPOSITION, file),
            (
                axum::http::HeaderName::from_static("rush-period-state"),
                if closed { "closed" } else { "open" }.to_owned(),
            ),
        ],
        body,
    )
        .into_response())
}

/// The body of `export`, answered once its first chunk is made, so that an export that
/// fails at once is answered with its error, not a 200 cut short. A client that reads
/// nothing for `stall` stops the export, and its body ends in an error, as does an
/// export that fails mid-stream: never as if complete.
async fn stream_export(
    mut export: Export,
    stall: std::time::Duration,
    period: Interval,
) -> ApiResult<Body> {
    let Some(first) = export.chunks.recv().await else {
        return Err(match export.done.await {
            Ok(Err(e)) => e.into(),
            Ok(Ok(())) | Err(_) => ApiError::internal(),
        });
    };
    let (body_tx, body_rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let stalled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stall_flag = stalled.clone();
    tokio::spawn(async move {
        let Export {
            mut chunks, done, ..
        } = export;
        let mut next = Some(first);
        while let Some(chunk) = next {
            match tokio::time::timeout(stall, body_tx.send(Ok(Bytes::from(chunk.bytes)))).await {
                Ok(Ok(())) => {}
                // The client hung up: stop the export (and free its connection).
                Ok(Err(_)) => {
                    chunks.close();
                    break;
                }
                Err(_) => {
                    tracing::warn!(period = %month_name(period), secs = stall.as_secs(),
                        "export cut short: the client read nothing for RUSH_METER_EXPORT_STALL_SECS");
                    stall_flag.store(true, std::sync::atomic::Ordering::Release);
                    chunks.close();
                    break;
                }
            }
            next = chunks.recv().await;
        }
        if let Ok(Err(e)) = done.await {
            // The status is sent; cutting the body short tells the client it is incomplete.
            tracing::error!(error = %e, period = %month_name(period), "export failed mid-stream");
            let _ = body_tx
                .send(Err(std::io::Error::other(e.to_string())))
                .await;
        }
    });
    let stream = futures_util::stream::unfold(Some(body_rx), move |rx| {
        let stalled = stalled.clone();
        async move {
            let mut rx = rx?;
            match rx.recv().await {
                Some(item) => Some((item, Some(rx))),
                None if stalled.load(std::sync::atomic::Ordering::Acquire) => Some((
                    Err(std::io::Error::other(
                        "the client read nothing for too long",
                    )),
                    None,
                )),
                None => None,
            }
        }
    });
    Ok(Body::from_stream(stream))
}

#[derive(Serialize, ToSchema)]
pub struct PeriodView {
    period: String,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    start: Secs,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    end: Secs,
    #[serde(with = "rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    closed_at: Secs,
    orgs: i64,
    sessions: i64,
    agent_seconds: i64,
    agent_hours: String,
    adjustment_seconds: i64,
}

#[derive(Serialize, ToSchema)]
pub struct PeriodList {
    periods: Vec<PeriodView>,
}

#[derive(Serialize, ToSchema)]
pub struct Closed {
    period: String,
    /// The months this call closed, oldest first; empty when all were closed already.
    closed: Vec<String>,
}

/// `GET /v1/periods`: the closed billing periods, newest first, with their totals.
#[utoipa::path(get, path = "/v1/periods", tag = "finance", security(("bearer" = ["finance", "admin"])),
    responses((status = 200, description = "The closed periods", body = PeriodList), Guarded))]
pub async fn list_periods(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<Json<PeriodList>> {
    principal.require_any(&[Scope::Finance])?;
    // A period's totals are every org's.
    principal.require_unbound("the list of closed periods")?;
    let periods: Vec<PeriodView> = state
        .closed_periods()
        .await?
        .into_iter()
        .filter_map(|p| {
            let i = Interval::new(p.period_start, p.period_end)?;
            Some(PeriodView {
                period: month_name(i),
                start: p.period_start,
                end: p.period_end,
                closed_at: p.closed_at,
                orgs: p.orgs,
                sessions: p.sessions,
                agent_seconds: p.agent_seconds,
                agent_hours: hours(p.agent_seconds),
                adjustment_seconds: p.adjustment_seconds,
            })
        })
        .collect();
    Ok(Json(PeriodList { periods }))
}

/// `POST /v1/periods/{period}/close` (admin): close the month and any open month before
/// it, as `rush-meter period close` does. Closing a closed month changes nothing.
#[utoipa::path(post, path = "/v1/periods/{period}/close", tag = "finance",
    security(("bearer" = ["admin"])),
    params(("period" = String, Path, description = "The month, `YYYY-MM`; it must have ended",
        pattern = r"^[0-9]{4}-(0[1-9]|1[0-2])$", example = "2026-11")),
    responses((status = 200, description = "Closed", body = Closed),
        (status = 422, description = "`invalid_value`: not a month, one not yet ended, or one before the first org's",
            body = crate::http::error::ErrorBody),
        Guarded, BadPath))]
pub async fn close_period(
    State(state): State<AppState>,
    principal: Principal,
    axum::extract::Path(period): axum::extract::Path<String>,
) -> ApiResult<Json<Closed>> {
    principal.require_any(&[Scope::Admin])?;
    principal.require_unbound("closing a billing period")?;
    let month = parse_month(&period).map_err(|m| ApiError::invalid("period", m))?;
    let closed = state
        .close_periods_through(month, &principal.actor())
        .await?;
    let closed: Vec<String> = closed
        .iter()
        .filter_map(|p| Interval::new(p.period_start, p.period_end))
        .map(month_name)
        .collect();
    Ok(Json(Closed {
        period: month_name(month),
        closed,
    }))
}
