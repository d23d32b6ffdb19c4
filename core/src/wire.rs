//! Decoding JSON bodies so that a type error names the path of the bad field
//! (`heartbeats[3].seq`). Pure: the HTTP layer maps the error to its format, and the fuzz
//! targets call the same code.

use serde::de::DeserializeOwned;

/// A body that is not the JSON it should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// The path of the bad field, when the JSON parsed far enough to have one.
    pub field: Option<String>,
    pub message: String,
}

pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        DecodeError {
            field: (path != "." && path != "?").then_some(path),
            message: format!("malformed JSON: {}", e.inner()),
        }
    })
}
