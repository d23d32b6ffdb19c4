//! What handlers take from a request, each refused in the error format: JSON bodies
//! whose errors name the bad field, query parameters read after the access checks, the
//! ids of a path, a page of a listing (cursor and limit), and the org a reader may see.

use std::convert::Infallible;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use rush_meter_core::ids::Id;
use rush_meter_core::time::{rfc3339, Secs};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::Required;
use utoipa::IntoParams;

use super::auth::Principal;
use super::error::{parse_id, ApiError, ApiResult};
use super::AppState;
use crate::tokens::Scope;

/// Like `axum::Json`, with errors in the API's format (400 with the field's path, 413, 415
/// for a body that says it is not JSON). An empty body, or `null`, reads as `{}`.
pub struct JsonBody<T>(pub T);

/// Whether a `Content-Type` says JSON: `application/json` or `application/…+json`, with
/// or without parameters (`; charset=utf-8`).
fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || essence
            .strip_prefix("application/")
            .is_some_and(|t| t.ends_with("+json"))
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let content_type = req
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .map(|v| v.to_str().map(str::to_owned).unwrap_or_default());
        let bytes = Bytes::from_request(req, state).await.map_err(|r| {
            if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::too_large()
            } else {
                ApiError::malformed(format!("the body could not be read: {}", r.body_text()))
            }
        })?;
        let empty = bytes.iter().all(u8::is_ascii_whitespace);
        if !empty && !content_type.as_deref().is_some_and(is_json) {
            return Err(ApiError::unsupported_media_type(content_type.as_deref()));
        }
        let bytes: &[u8] = if empty || bytes.trim_ascii() == b"null" {
            b"{}"
        } else {
            &bytes
        };
        parse_json(bytes).map(JsonBody)
    }
}

/// Deserialize JSON, naming the path of the first bad field (`heartbeats[3].seq`).
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    rush_meter_core::wire::decode(bytes).map_err(ApiError::from)
}

/// Query parameters, read when the handler asks (`read()`), after its access checks: a
/// caller without access learns nothing from a 400 about the parameters. A parameter
/// holding NUL (`%00`), which no database column keeps, is a 422 naming it.
pub struct Query<T>(Result<T, ApiError>);

impl<T> Query<T> {
    pub fn read(self) -> ApiResult<T> {
        self.0
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Infallible> {
        if let Some(name) = parts.uri.query().and_then(nul_parameter) {
            return Ok(Query(Err(ApiError::invalid(
                name.clone(),
                format!("{name} may not contain NUL (%00)"),
            ))));
        }
        Ok(Query(
            axum::extract::Query::<T>::from_request_parts(parts, state)
                .await
                .map(|q| q.0)
                .map_err(|e: QueryRejection| ApiError::malformed(e.body_text())),
        ))
    }
}

/// The name of the first query parameter whose value (or name) holds NUL.
fn nul_parameter(query: &str) -> Option<String> {
    if !query.contains("%00") {
        return None;
    }
    url::form_urlencoded::parse(query.as_bytes())
        .find(|(k, v)| k.contains('\0') || v.contains('\0'))
        .map(|(k, _)| k.replace('\0', "\\0"))
}

/// A time parameter (RFC 3339), or the 422 that names it.
pub fn time_param(name: &str, value: Option<&str>) -> ApiResult<Option<Secs>> {
    value
        .map(|t| rfc3339::parse(t).map_err(|m| ApiError::invalid(name, m)))
        .transpose()
}

/// `[from, to)` of a listing's query: `to` defaults to `default_to`, `from` to what
/// `default_from` makes of `to`; refused unless `from` is before `to`.
pub fn time_range(
    from: Option<&str>,
    to: Option<&str>,
    default_to: Secs,
    default_from: impl FnOnce(Secs) -> Secs,
) -> ApiResult<(Secs, Secs)> {
    let to = time_param("to", to)?.unwrap_or(default_to);
    let from = time_param("from", from)?.unwrap_or_else(|| default_from(to));
    if from >= to {
        return Err(ApiError::invalid("from", "from must be before to"));
    }
    Ok((from, to))
}

/// An optional parameter naming one of an enum's values, or the 422 that lists them.
pub fn named_param<T>(
    name: &str,
    value: Option<&str>,
    parse: fn(&str) -> Result<T, rush_meter_core::names::Unknown>,
) -> ApiResult<Option<T>> {
    value
        .map(|v| super::error::parse_named(name, v, parse))
        .transpose()
}

/// A page of a listing: after the `cursor` of the page before, at most `limit` rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    pub after: Option<(Secs, String)>,
    pub limit: i64,
}

impl Page {
    /// Rows a page has at most, and by default.
    pub const MAX: i64 = 1000;
    pub const DEFAULT: i64 = 100;

    /// The rows of this page within `[from, to)`.
    pub fn slice(&self, from: Secs, to: Secs) -> crate::app::history::Slice {
        crate::app::history::Slice {
            from,
            to,
            after: self.after.clone(),
            limit: self.limit,
        }
    }

    /// `cursor` and `limit` as a caller gave them.
    pub fn of(cursor: Option<&str>, limit: Option<i64>) -> ApiResult<Page> {
        let limit = limit.unwrap_or(Page::DEFAULT);
        if !(1..=Page::MAX).contains(&limit) {
            return Err(ApiError::invalid("limit", "limit must be 1 to 1000"));
        }
        let after = cursor.map(parse_cursor).transpose()?;
        Ok(Page { after, limit })
    }

    /// The cursor of the page after `rows` (keyed by `key`), when `rows` filled this one.
    pub fn next<T>(&self, rows: &[T], key: impl Fn(&T) -> (Secs, &str)) -> Option<String> {
        (rows.len() as i64 == self.limit)
            .then(|| rows.last())
            .flatten()
            .map(|r| {
                let (at, id) = key(r);
                format!("{at}.{id}")
            })
    }
}

/// A `time.id` cursor as this service gives them out (an id of one line, as long as a
/// Stripe event's at most).
fn parse_cursor(c: &str) -> ApiResult<(Secs, String)> {
    c.split_once('.')
        .filter(|(_, id)| rush_meter_core::text::Text::Line.check(id, 255).is_ok())
        .and_then(|(t, id)| Some((t.parse().ok()?, id.to_owned())))
        .ok_or_else(|| ApiError::invalid("cursor", "cursor is not one this service gave out"))
}

/// The ids in a route's path, each described once: a handler takes one of these as its
/// `Path` and names it in `params(…)`. `IntoParams` is written by hand: the derived one
/// drops `required` and the description from a parameter with a custom schema.
#[derive(Deserialize)]
pub struct OrgPath {
    pub org_id: String,
}

#[derive(Deserialize)]
pub struct OrgKeyPath {
    pub org_id: String,
    pub key_id: String,
}

#[derive(Deserialize)]
pub struct OrgGrantPath {
    pub org_id: String,
    pub grant_id: String,
}

#[derive(Deserialize)]
pub struct OrgLimitPath {
    pub org_id: String,
    pub kind: String,
    pub member_id: String,
}

#[derive(Deserialize)]
pub struct SessionPath {
    pub session_id: String,
}

#[derive(Deserialize)]
pub struct OrgSessionPath {
    pub org_id: String,
    pub session_id: String,
}

/// A path id: required, described, with the id pattern.
pub(crate) fn id_param(name: &str, description: &str) -> Parameter {
    ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Path)
        .required(Required::True)
        .description(Some(description))
        .schema(Some(rush_meter_core::ids::schema()))
        .build()
}

const ORG_ID: (&str, &str) = ("org_id", "The org's id");

impl IntoParams for OrgPath {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![id_param(ORG_ID.0, ORG_ID.1)]
    }
}

impl IntoParams for OrgKeyPath {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![
            id_param(ORG_ID.0, ORG_ID.1),
            id_param("key_id", "The API key's id"),
        ]
    }
}

impl IntoParams for OrgGrantPath {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![
            id_param(ORG_ID.0, ORG_ID.1),
            id_param("grant_id", "The grant's id"),
        ]
    }
}

impl IntoParams for OrgLimitPath {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        let kind = ParameterBuilder::new()
            .name("kind")
            .parameter_in(ParameterIn::Path)
            .required(Required::True)
            .description(Some(
                "What is limited: `user` (an admission's `started_by`), `project` or `key`",
            ))
            .schema(Some(crate::http::openapi::strings::limit_kind()))
            .build();
        vec![
            id_param(ORG_ID.0, ORG_ID.1),
            kind,
            id_param("member_id", "The user's, project's or key's id"),
        ]
    }
}

impl IntoParams for SessionPath {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![id_param("session_id", "The session's id")]
    }
}

impl IntoParams for OrgSessionPath {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![
            id_param(ORG_ID.0, ORG_ID.1),
            id_param("session_id", "The session's id, its org's own"),
        ]
    }
}

/// The org of the path, for a token that may read it: admin and finance read every org,
/// console its own. Refused in order: no token (401), no reading scope (403), an id that
/// is not one (422), another org's console token (404, as for an org that does not exist).
pub struct OrgReader {
    pub principal: Principal,
    pub org_id: Id,
}

impl FromRequestParts<AppState> for OrgReader {
    type Rejection = axum::response::Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        use axum::response::IntoResponse;
        let principal = Principal::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let axum::extract::Path(OrgPath { org_id }) =
            axum::extract::Path::<OrgPath>::from_request_parts(parts, state)
                .await
                .map_err(IntoResponse::into_response)?;
        let org_id = (|| {
            principal.require_any(&[Scope::Console, Scope::Finance])?;
            let org_id = parse_id("org_id", &org_id)?;
            principal.check_org_read(org_id.as_str())?;
            Ok::<_, ApiError>(org_id)
        })()
        .map_err(IntoResponse::into_response)?;
        Ok(OrgReader { principal, org_id })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Batch {
        heartbeats: Vec<Beat>,
    }

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Beat {
        seq: i64,
    }

    #[test]
    fn type_errors_name_the_path() {
        let e = parse_json::<Batch>(br#"{"heartbeats":[{"seq":1},{"seq":"x"}]}"#).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.field.as_deref(), Some("heartbeats[1].seq"));
    }

    #[test]
    fn syntax_errors_are_400_without_field() {
        let e = parse_json::<Batch>(b"{not json").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.field, None);
    }
}
