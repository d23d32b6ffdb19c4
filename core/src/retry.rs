//! How work that failed is tried again: Stripe events and notifications alike.

use crate::time::Secs;

/// Tries before a piece of work is given up (quarantined, or marked failed): with the
/// backoff below, about 22 hours.
pub const MAX_ATTEMPTS: i64 = 16;

/// Seconds before the next try after `attempts` tries: 10 s doubling, at most 4 hours.
pub fn backoff(attempts: i64) -> Secs {
    (10_i64 << attempts.clamp(1, 16).saturating_sub(1)).min(4 * 3600)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_cap() {
        assert_eq!(backoff(1), 10);
        assert_eq!(backoff(2), 20);
        assert_eq!(backoff(5), 160);
        assert_eq!(backoff(12), 4 * 3600);
        let total: Secs = (1..MAX_ATTEMPTS).map(backoff).sum();
        assert!((12 * 3600..24 * 3600).contains(&total), "{total}");
    }
}
