//! Enums whose values travel as names: in JSON bodies, query strings, database columns and
//! export lines. `named!` writes each name once, and from that one list come serde's
//! names, the OpenAPI schema (`ToSchema`), `as_str`, `parse`, and the list an error shows
//! ("one of completed, needs_review, …"), so no handler keeps a list of strings of its own.

/// A name that is not one of an enum's; says which names there are.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("must be one of {expected} (got `{got}`)")]
pub struct Unknown {
    pub expected: String,
    pub got: String,
}

/// `a, b or c`: how a message lists the names an enum takes.
pub fn list(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// Declares an enum of named values (see the module's documentation). Used by the
/// service's crate too, which has serde and utoipa as dependencies of its own.
#[macro_export]
macro_rules! named {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(
            Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord,
            serde::Serialize, serde::Deserialize, utoipa::ToSchema,
        )]
        $vis enum $name {
            $( $(#[$vmeta])* #[serde(rename = $text)] #[schema(rename = $text)] $variant ),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            /// Every name, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$($text),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }

            pub fn parse(s: &str) -> Option<$name> {
                match s {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }

            /// `parse`, or the error that lists the names.
            pub fn parse_named(s: &str) -> Result<$name, $crate::names::Unknown> {
                Self::parse(s).ok_or_else(|| $crate::names::Unknown {
                    expected: $crate::names::list(Self::NAMES),
                    got: s.to_owned(),
                })
            }
        }

        /// Compared with a name, as rows and answers carry them.
        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

#[cfg(test)]
mod tests {
    named! {
        /// A test enum.
        pub enum Colour {
            Red = "red",
            DarkBlue = "dark_blue",
        }
    }

    #[test]
    fn one_list_of_names_serves_every_use() {
        assert_eq!(Colour::NAMES, ["red", "dark_blue"]);
        assert_eq!(Colour::ALL, [Colour::Red, Colour::DarkBlue]);
        assert_eq!(Colour::parse("dark_blue"), Some(Colour::DarkBlue));
        assert_eq!(Colour::DarkBlue.as_str(), "dark_blue");
        assert_eq!(
            serde_json::to_string(&Colour::DarkBlue).unwrap(),
            "\"dark_blue\""
        );
        assert_eq!(
            serde_json::from_str::<Colour>("\"red\"").unwrap(),
            Colour::Red
        );
        let e = Colour::parse_named("green").unwrap_err();
        assert_eq!(
            e.to_string(),
            "must be one of red or dark_blue (got `green`)"
        );
    }

    #[test]
    fn lists_read_as_prose() {
        assert_eq!(super::list(&["a"]), "a");
        assert_eq!(super::list(&["a", "b", "c"]), "a, b or c");
    }
}
