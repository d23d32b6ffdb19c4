//! Ids of orgs, keys, sessions, projects, users and VMs: validated once at the edge.

use std::fmt;

use serde::Serialize;

/// 1 to 64 characters of `A-Za-z0-9_.-`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct Id(String);

impl Id {
    pub const MAX_LEN: usize = 64;
    /// What `parse` accepts, as a JSON Schema pattern for the OpenAPI document.
    pub const PATTERN: &'static str = "^[A-Za-z0-9_.-]{1,64}$";

    pub fn parse(s: &str) -> Result<Id, String> {
        if s.is_empty() || s.len() > Self::MAX_LEN {
            return Err(format!(
                "must be 1 to {} characters long (got {})",
                Self::MAX_LEN,
                s.len()
            ));
        }
        if let Some(c) = s
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
        {
            return Err(format!(
                "may contain only A-Z, a-z, 0-9, `_`, `.` and `-` (found {c:?})"
            ));
        }
        Ok(Id(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

/// The schema of an id in the OpenAPI document.
pub fn schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::String)
        .pattern(Some(Id::PATTERN))
        .build()
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Id {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_alphabet() {
        assert!(Id::parse("ses_1.a-B").is_ok());
        assert!(Id::parse(&"x".repeat(64)).is_ok());
    }

    #[test]
    fn rejects_empty_long_and_foreign_characters() {
        assert!(Id::parse("").is_err());
        assert!(Id::parse(&"x".repeat(65)).is_err());
        assert!(Id::parse("a b").is_err());
        assert!(Id::parse("é").is_err());
        assert!(Id::parse("a/b").is_err());
    }
}
