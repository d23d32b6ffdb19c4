//! JSON bodies whose errors say where: a type error names the path of the bad field.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// Like `axum::Json`, with errors in the API's format (400 with the field's path, 413).
/// An empty body, or `null`, reads as `{}`.
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|r| {
            if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::too_large()
            } else {
                ApiError::malformed(format!("the body could not be read: {}", r.body_text()))
            }
        })?;
        let bytes: &[u8] =
            if bytes.iter().all(u8::is_ascii_whitespace) || bytes.trim_ascii() == b"null" {
                b"{}"
            } else {
                &bytes
            };
        parse_json(bytes).map(JsonBody)
    }
}

/// Deserialize JSON, naming the path of the first bad field (`heartbeats[3].seq`).
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    crate::wire::decode(bytes).map_err(ApiError::from)
}

impl From<crate::wire::DecodeError> for ApiError {
    fn from(e: crate::wire::DecodeError) -> Self {
        let err = ApiError::malformed(e.message);
        match e.field {
            Some(f) => err.with_field(f),
            None => err,
        }
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
