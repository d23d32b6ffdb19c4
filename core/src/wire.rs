//! Decoding JSON bodies so that a type error names the path of the bad field
//! (`heartbeats[3].seq`), and a string the database cannot store (one holding NUL) is
//! refused naming its field. Pure: the HTTP layer maps the error to its format, and the
//! fuzz targets call the same code.

use serde::de::DeserializeOwned;
use serde_json::Value;

/// A body that is not the JSON it should be, or holds a value no store keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// The path of the bad field, when the JSON parsed far enough to have one.
    pub field: Option<String>,
    pub message: String,
    /// The JSON reads, but a value in it cannot be kept (a 422, not a 400).
    pub invalid: bool,
}

pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        DecodeError {
            field: (path != "." && path != "?").then_some(path),
            message: format!("malformed JSON: {}", e.inner()),
            invalid: false,
        }
    })?;
    // JSON can carry NUL only escaped; a body without the escape needs no second look.
    if memchr::memmem::find(bytes, br"\u0000").is_some() {
        // A body the typed read took but a whole read does not (a field it skips holds
        // what JSON values cannot, `1e400` say) is refused too: its NUL is not looked past.
        let field = match serde_json::from_slice::<Value>(bytes) {
            Ok(v) => nul_at(&v, String::new()).map(Some),
            Err(_) => Some(None),
        };
        if let Some(field) = field {
            return Err(DecodeError {
                message: format!(
                    "{} may not contain NUL (U+0000)",
                    field.as_deref().map_or("the body", name_of)
                ),
                field,
                invalid: true,
            });
        }
    }
    Ok(value)
}

/// The path (`heartbeats[3].vm_id`) of the first string in `v` that holds NUL.
fn nul_at(v: &Value, path: String) -> Option<String> {
    match v {
        Value::String(s) => s.contains('\0').then_some(path),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, x)| nul_at(x, format!("{path}[{i}]"))),
        Value::Object(fields) => fields.iter().find_map(|(k, x)| {
            let at = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            nul_at(x, at)
        }),
        _ => None,
    }
}

/// The last name of a path: `note` of `grants[0].note`.
fn name_of(path: &str) -> &str {
    let last = path.rsplit('.').next().unwrap_or(path);
    last.split('[')
        .next()
        .filter(|n| !n.is_empty())
        .unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Body {
        name: String,
        items: Vec<Item>,
    }

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Item {
        note: Option<String>,
    }

    #[test]
    fn nul_in_any_string_is_refused_naming_its_field() {
        let e = decode::<Body>(br#"{"name": "a", "items": [{"note": "x"}, {"note": "a\u0000b"}]}"#)
            .unwrap_err();
        assert!(e.invalid);
        assert_eq!(e.field.as_deref(), Some("items[1].note"));
        assert!(
            e.message.starts_with("note may not contain NUL"),
            "{}",
            e.message
        );
        let e = decode::<Body>(br#"{"name": "\u0000", "items": []}"#).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("name"));
        // Hidden behind a field the typed read skips, it is found all the same.
        let e = decode::<Body>(br#"{"name": "a\u0000", "items": [], "x": 1e400}"#).unwrap_err();
        assert!(e.invalid && e.message.contains("NUL"), "{e:?}");
        // An escaped backslash before `u0000` is text, not NUL.
        let ok = decode::<Body>(br#"{"name": "\\u0000", "items": []}"#).unwrap();
        assert_eq!(ok.name, "\\u0000");
    }

    #[test]
    fn type_errors_stay_malformed() {
        let e = decode::<Body>(br#"{"name": 5, "items": []}"#).unwrap_err();
        assert!(!e.invalid);
        assert_eq!(e.field.as_deref(), Some("name"));
    }
}
