//! Text people write into the service (an org's name, a grant's note, a token's label, a
//! search): checked once at the edge. PostgreSQL cannot store NUL in text, and a control
//! character shown in a terminal or a CSV cell can act on it, so neither gets in.

/// What a piece of text may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Text {
    /// One line: no control character at all (a name, a label, a search).
    Line,
    /// Several lines: newlines and tabs, but no other control character (a note).
    Lines,
}

impl Text {
    /// `value` if it is at most `max` characters of this kind; the error says what is wrong
    /// (the caller names the field).
    pub fn check(self, value: &str, max: usize) -> Result<(), String> {
        let len = value.chars().count();
        if len > max {
            return Err(format!("must be at most {max} characters (got {len})"));
        }
        let allowed = |c: char| self == Text::Lines && matches!(c, '\n' | '\t');
        if let Some(c) = value.chars().find(|c| c.is_control() && !allowed(*c)) {
            return Err(format!(
                "may not contain control characters such as NUL or escapes (found U+{:04X})",
                c as u32
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn nul_escapes_and_length_are_refused_with_what_to_fix() {
        assert!(Text::Line.check("Acme Inc. — ümlaut", 200).is_ok());
        assert!(Text::Line
            .check("a\u{0}b", 200)
            .unwrap_err()
            .contains("U+0000"));
        assert!(Text::Line
            .check("\u{1b}[31mred", 200)
            .unwrap_err()
            .contains("U+001B"));
        assert!(Text::Line.check("a\u{9b}b", 200).is_err());
        assert!(Text::Line.check("two\nlines", 200).is_err());
        assert!(Text::Lines.check("two\nlines\twith a tab", 200).is_ok());
        assert!(Text::Lines.check("a\u{0}b", 200).is_err());
        assert!(Text::Line.check(&"é".repeat(200), 200).is_ok());
        assert!(Text::Line
            .check(&"é".repeat(201), 200)
            .unwrap_err()
            .contains("201"));
    }

    proptest! {
        #[test]
        fn accepted_text_holds_no_nul_and_no_control_character(s in "\\PC*|.*") {
            if Text::Line.check(&s, 1000).is_ok() {
                prop_assert!(!s.chars().any(char::is_control));
            }
            if Text::Lines.check(&s, 1000).is_ok() {
                prop_assert!(!s.contains('\0'), "NUL accepted");
            }
        }
    }
}
