//! The operator console (`/console`): one static page, its script and its style, embedded
//! in the binary so that `cargo run` serves it with nothing else installed. The page holds
//! no data: it signs in with a pasted token (kept in the tab's `sessionStorage`, never in
//! a URL) and reads everything through the JSON API, under the same access checks as any
//! other caller (docs/console.md).

use axum::http::header;
use axum::response::IntoResponse;

/// No script, style or connection but this service's own; no framing; no inline script.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; \
     form-action 'none'";

const PAGE: &str = include_str!("../console/index.html");
const SCRIPT: &str = include_str!("../console/app.js");
const STYLE: &str = include_str!("../console/app.css");

/// An asset with the headers every console response carries. The assets hold no data,
/// but are revalidated on each load (`no-cache`) so that an upgrade shows at once.
fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::X_FRAME_OPTIONS, "DENY"),
        ],
        body,
    )
}

/// The console: sign in with a token, then orgs, an org's usage, and billing.
#[utoipa::path(get, path = "/console", tag = "console",
    responses((status = 200, description = "The console's page", body = String,
        content_type = "text/html")))]
pub async fn page() -> impl IntoResponse {
    asset("text/html; charset=utf-8", PAGE)
}

/// The console's script.
#[utoipa::path(get, path = "/console/app.js", tag = "console",
    responses((status = 200, description = "JavaScript", body = String,
        content_type = "text/javascript")))]
pub async fn script() -> impl IntoResponse {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

/// The console's style sheet.
#[utoipa::path(get, path = "/console/app.css", tag = "console",
    responses((status = 200, description = "CSS", body = String, content_type = "text/css")))]
pub async fn style() -> impl IntoResponse {
    asset("text/css; charset=utf-8", STYLE)
}
